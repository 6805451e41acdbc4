# SPDX-License-Identifier: Apache-2.0
"""tests/bench/report.py as `bash tests/bench/report.sh` runs it, with the
slow sections left out: the vLLM row gets the bindings on its path, and a
section that fails loses no other row (it is named, the JSON is written,
the exit status is 1). The vLLM CPU build is stood in for by a fake venv
whose `python` checks what demo.py would need and writes its figures."""
import json
import os
import pathlib
import stat
import subprocess
import sys
import textwrap

SOURCE = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
BUILD = pathlib.Path(os.environ.get("GF_BUILD_ROOT", SOURCE / "build"))
REPORT = SOURCE / "tests" / "bench" / "report.py"


def fake_vllm_venv(tmp, fail=False):
    """A venv whose python imports gpufailover (as demo.py's workers do) and
    writes demo.py's --json figures; with fail, it exits 1 as a broken demo."""
    bindir = tmp / "venv" / "bin"
    bindir.mkdir(parents=True)
    py = bindir / "python"
    py.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        {"sys.exit('demo exploded')" if fail else ""}
        import gpufailover  # ModuleNotFoundError when the build's bindings are not on the path
        out = sys.argv[sys.argv.index("--json") + 1]
        json.dump({{"failover_first_token_us": 500000, "cold_first_token_us": 30000000}}, open(out, "w"))
        """))
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    return tmp / "venv"


def run(tmp, venv, *only):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["GF_VLLM_VENV"] = str(venv)
    out = tmp / "report.json"
    r = subprocess.run([sys.executable, REPORT, "--build", BUILD, "--out", out, "--standbys", "20", "--only", *only],
                       env=env, capture_output=True, text=True, timeout=600)
    return r, json.loads(out.read_text())


def test_vllm_row_finds_the_bindings(tmp_path):
    r, rep = run(tmp_path, fake_vllm_venv(tmp_path), "vllm")
    assert r.returncode == 0, r.stdout + r.stderr
    assert rep["failed"] == []
    (v,) = [x for x in rep["rows"] if x["benchmark"] == "vllm failover (CPU)"]
    assert v["ratio"] == round(500000 / 30000000, 3)


def test_a_failed_section_keeps_the_others(tmp_path):
    r, rep = run(tmp_path, fake_vllm_venv(tmp_path, fail=True), "pool", "vllm")
    assert r.returncode == 1, r.stdout + r.stderr
    assert [f["section"] for f in rep["failed"]] == ["vllm"]
    assert "demo exploded" in rep["failed"][0]["error"]
    assert any(x["benchmark"] == "pool registration" for x in rep["rows"]), rep["rows"]
    assert "FAILED: vllm" in r.stdout and "pool registration" in r.stdout


def test_no_vllm_build_is_a_skip(tmp_path):
    r, rep = run(tmp_path, tmp_path / "absent", "vllm")
    assert r.returncode == 0, r.stdout + r.stderr
    assert rep["failed"] == [] and rep["skipped"] and "setup-vllm-cpu.sh" in rep["skipped"][0]


def test_paired_sections_write_their_rows(tmp_path):
    """The sections whose rows show a paired ratio's spread (gms, snapshot) run
    end to end at a small size: each writes its rows and none fails."""
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, REPORT, "--build", BUILD, "--out", out, "--rounds", "1",
                        "--snapshot-mib", "16", "--snapshot-allocs", "4", "--only", "snapshot", "gms"],
                       capture_output=True, text=True, timeout=600)
    rep = json.loads(out.read_text())
    assert r.returncode == 0 and rep["failed"] == [], r.stdout + r.stderr
    names = {x["benchmark"] for x in rep["rows"]}
    assert {"gms restore WARM", "gms snapshot COLD", "gms wake (kept handles)"} <= names, names
    assert all("x [" in x["case"] for x in rep["rows"] if x["benchmark"].startswith("gms restore")), rep["rows"]
