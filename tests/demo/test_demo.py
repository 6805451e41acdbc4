# SPDX-License-Identifier: Apache-2.0
"""The failover demo in short mode, with the example engines (C, Python, PyTorch): it must report
a failover with identical answers, exit 0, and leave no process behind; with
--gms-crash the GMS is killed instead and comes back from its WARM snapshot."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

BUILD = pathlib.Path(os.environ["GF_BUILD_ROOT"])
SOURCE = pathlib.Path(os.environ["GF_SOURCE_ROOT"])


def processes_mentioning(text):
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append((d.name, cmd))
    return found


@pytest.mark.parametrize("engine,weights,gms_crash", [("c", False, False), ("python", False, False), ("c", True, False),
                                                     ("torch", False, False), ("c", True, True)])
def test_demo_short(engine, weights, gms_crash, tmp_path):
    if engine == "torch" and importlib.util.find_spec("torch") is None:
        # An optional package: `bash tests/setup-frameworks.sh` installs it (tests/run-all.sh does).
        pytest.skip(f"torch is not importable by {sys.executable} (bash tests/setup-frameworks.sh installs it)")
    # The demo starts the Python engine as `python3`: the interpreter running
    # this test (which has numpy), even when its venv is not on PATH.
    env = dict(os.environ, PYTHONPATH=str(BUILD / "bindings" / "python"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    extra = []
    if weights:  # any safetensors file: here one written by the example engine
        path = tmp_path / "model.safetensors"
        subprocess.run([BUILD / "examples" / "c-engine" / "gf-c-engine", "--write-weights", path], check=True)
        extra = ["--weights", str(path)]
    if gms_crash:
        extra.append("--gms-crash")
    out = subprocess.run(
        [BUILD / "examples" / "demo" / "gf-failover-demo", "--short", "--engine", engine,
         "--lockd", BUILD / "examples" / "gf-lockd" / "gf-lockd",
         "--gmsd", BUILD / "examples" / "gf-gmsd" / "gf-gmsd",
         "--c-engine", BUILD / "examples" / "c-engine" / "gf-c-engine",
         "--python-engine", SOURCE / "examples" / "python-engine" / "engine.py",
         "--torch-engine", SOURCE / "examples" / "torch-engine" / "engine.py", *extra],
        capture_output=True, text=True, timeout=120, env=env)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "RESULT: OK" in out.stdout
    assert "all identical to before: yes" in out.stdout
    if gms_crash:
        assert "layout restored from WARM" in out.stdout and "(not logged)" not in out.stdout
        assert "weights reloaded from the model files: no" in out.stdout
    m = re.search(r"run dir: (\S+)\)", out.stdout)
    assert m
    rundir = m.group(1)
    assert not processes_mentioning(rundir), "the demo left processes behind"
    assert not pathlib.Path(rundir).exists()
