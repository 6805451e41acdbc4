# SPDX-License-Identifier: Apache-2.0
"""Every fenced block in README.md and docs/*.md is either run here as written
or marked for what it is, and the marks are checked:

- ```text: output, diagrams, timelines: nothing to run.
- ```LANG excerpt: a piece of a larger program or a command for a real
  machine (paths under /run/gf, systemctl, a GPU, placeholders such as
  GPU-5e1c...): not run; docs/api.md's declarations are excerpts of the
  headers (tests/docs/test_api_doc.py checks those).
- ```json / ```toml without the mark: must parse, and where the project has
  a reader for it (a supervisor config, a lock state file), that reader must
  accept it.
- ```sh / ```python without the mark: run as written, in a temp directory,
  with the build's programs on PATH and its Python package importable; they
  must exit 0 (a line may say what exit it expects with `|| true`).

A block with no language, or a language this test does not know, fails:
say what it is. Commands too long to run here (the benchmark report, the
vLLM demo) are named in COVERED_ELSEWHERE with the test that runs them."""
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import tomllib

import pytest

SOURCE = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
BUILD = pathlib.Path(os.environ.get("GF_BUILD_ROOT", SOURCE / "build"))
DOCS = [SOURCE / "README.md"] + sorted((SOURCE / "docs").glob("*.md"))
KNOWN = {"text", "sh", "python", "c", "json", "toml", "yaml"}
FENCE = re.compile(r"^(\s*)```(.*)$")


def blocks():
    """(path, line, language, marks, body) of every fenced block."""
    out = []
    for path in DOCS:
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            info = m.group(2).split()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            assert j < len(lines), f"{path.name}:{i + 1}: unterminated code block"
            body = "\n".join(l[len(m.group(1)):] if l.startswith(m.group(1)) else l for l in lines[i + 1:j])
            out.append((path, i + 1, info[0] if info else "", info[1:], body))
            i = j + 1
    return out


ALL = blocks()


def where(b):
    return f"{b[0].relative_to(SOURCE)}:{b[1]}"


def test_every_block_says_what_it_is():
    bad = [f"{where(b)}: ```{b[2]} {' '.join(b[3])}".rstrip() for b in ALL
           if b[2] not in KNOWN or any(m != "excerpt" for m in b[3]) or (b[2] == "text" and b[3])]
    assert not bad, ("blocks without a known language (text, sh, python, c, json, toml, yaml) or with an unknown "
                     "mark (only `excerpt`):\n" + "\n".join(bad))


def is_readme_commands(b):
    """README's first block: the two commands (set up and run the demo; set
    up and run every test), which CI itself runs (.ci/run), not this test."""
    return b[0].name == "README.md" and b is next(x for x in ALL if x[0].name == "README.md")


def test_readme_commands_are_what_ci_runs():
    first = next(b for b in ALL if b[0].name == "README.md")
    assert first[1] <= 5 and first[2] == "sh", "README.md must start with its two commands in a ```sh block"
    cmds = [l.split("#")[0].strip() for l in first[4].splitlines() if l.strip()]
    assert cmds == ["bash tests/setup.sh && bash examples/demo/run.sh",
                    "bash tests/setup.sh && bash tests/run-all.sh"], cmds
    ci = (SOURCE / ".ci" / "run").read_text()
    assert re.search(r"^bash tests/setup\.sh$", ci, re.M) and re.search(r"^bash tests/run-all\.sh$", ci, re.M), ci
    for script in ("tests/setup.sh", "examples/demo/run.sh", "tests/run-all.sh"):
        assert (SOURCE / script).is_file(), script


def runnable(lang):
    return [pytest.param(b, id=where(b)) for b in ALL if b[2] == lang and not b[3] and not is_readme_commands(b)]


def program_path():
    dirs = [BUILD / "examples" / d for d in ("gfctl", "gf-lockd", "gf-gmsd", "gf-supervise", "c-engine")]
    return os.pathsep.join([str(d) for d in dirs] + [os.environ.get("PATH", "")])


def env():
    e = dict(os.environ)
    e["PATH"] = program_path()
    e["PYTHONPATH"] = str(BUILD / "bindings" / "python") + os.pathsep + e.get("PYTHONPATH", "")
    return e


@pytest.mark.parametrize("block", runnable("sh"))
def test_shell_blocks_run(block):
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(["bash", "-c", block[4]], cwd=d, env=env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{where(block)} exited {r.returncode}:\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize("block", runnable("python"))
def test_python_blocks_run(block):
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-c", block[4]], cwd=d, env=env(), capture_output=True, text=True,
                           timeout=60)
    assert r.returncode == 0, f"{where(block)} exited {r.returncode}:\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize("block", runnable("toml"))
def test_toml_blocks_parse(block):
    tomllib.loads(block[4])


@pytest.mark.parametrize("block", runnable("json"))
def test_json_blocks_parse_and_their_reader_accepts_them(block):
    doc = json.loads(block[4])
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "doc.json"
        if isinstance(doc, dict) and "engines" in doc:
            # A supervisor config: gf-supervise's own check. Files it names
            # (the TCP secret) are the operator's; give it one where it says.
            secret = doc.get("lock", {}).get("secret_file")
            if secret:
                doc["lock"]["secret_file"] = str(pathlib.Path(d) / "secret")
                (pathlib.Path(d) / "secret").write_text("s3cret\n")
            path.write_text(json.dumps(doc))
            r = subprocess.run(["gf-supervise", "--config", str(path), "--check-config"], env=env(),
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, f"{where(block)}: gf-supervise --check-config: {r.stdout}{r.stderr}"
        elif isinstance(doc, dict) and {"version", "holder", "epoch"} <= doc.keys():
            # A lock state file: gf-lockd starts from it and keeps its epoch.
            path.write_text(block[4])
            sock = f"unix://{d}/lock.sock"
            p = subprocess.Popen(["gf-lockd", "--listen", sock, "--state-file", str(path),
                                  "--reconnect-window=200ms"], env=env(), stderr=subprocess.PIPE, text=True)
            try:
                end = time.monotonic() + 20
                st = None
                while time.monotonic() < end and p.poll() is None:
                    r = subprocess.run(["gfctl", "lock", "status", "--lock", sock, "--json"], env=env(),
                                       capture_output=True, text=True, timeout=10)
                    if r.returncode == 0:
                        st = json.loads(r.stdout)
                        break
                    time.sleep(0.05)
                assert st is not None, f"{where(block)}: gf-lockd did not start from it"
                assert st["epoch"] >= doc["epoch"], st
            finally:
                p.terminate()
                p.wait(10)


# Commands README and docs/ present that take too long to run here (a
# benchmark of many minutes; real vLLM servers), with the test of the suite
# that runs each (the report on its quick sections, with a stand-in vLLM
# row; the vLLM demo in full, in the vllm suite).
COVERED_ELSEWHERE = {
    "bash tests/bench/report.sh": "tests/bench/test_report.py",
    "examples/demo/run.sh --engine vllm": "tests/vllm/test_vllm_demo.py",
}


def test_long_commands_are_run_by_a_test_of_the_suite():
    docs = "\n".join(p.read_text() for p in DOCS)
    meson = "\n".join(p.read_text() for p in (SOURCE / "tests").rglob("meson.build"))
    for cmd, test in COVERED_ELSEWHERE.items():
        assert cmd in docs, f"{cmd!r} is no longer documented: drop it here"
        assert (SOURCE / test).is_file(), test
        assert pathlib.Path(test).name in meson, f"{test} is not registered in a meson.build"
        # In a block, it must be marked so that test_shell_blocks_run leaves it to that test.
        for b in ALL:
            if b[2] == "sh" and cmd in b[4] and not is_readme_commands(b):
                assert "excerpt" in b[3], f"{where(b)}: {cmd!r} runs in {test}; mark the block excerpt"
