# SPDX-License-Identifier: Apache-2.0
"""The vLLM failover demo as `bash examples/demo/run.sh --engine vllm` runs
it (docs/vllm.md; a row of tests/bench/report.sh): examples/vllm/demo.py
with vLLM's CPU interpreter and the build's bindings on its path, and
nothing else. It serves the same tokens before the kill, after the
failover and from a cold start, and writes the figures the report reads."""
import json
import os
import pathlib
import re
import subprocess
import sys

SOURCE = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
BUILD = pathlib.Path(os.environ.get("GF_BUILD_ROOT", SOURCE / "build"))


def test_run_sh_starts_the_demo_this_way():
    text = (SOURCE / "examples" / "demo" / "run.sh").read_text()
    assert re.search(r'export PYTHONPATH="\$build/bindings/python', text)
    assert re.search(r'exec "\$vllm_venv/bin/python" "\$here/examples/vllm/demo\.py"', text)


def test_vllm_demo(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(BUILD / "bindings" / "python")
    out = tmp_path / "vllm.json"
    r = subprocess.run([sys.executable, SOURCE / "examples" / "vllm" / "demo.py", "--json", out,
                        "--lockd", BUILD / "examples" / "gf-lockd" / "gf-lockd",
                        "--gmsd", BUILD / "examples" / "gf-gmsd" / "gf-gmsd"],
                       env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert figures["same_tokens"] is True
    assert 0 < figures["failover_first_token_us"] < figures["cold_first_token_us"]
    assert "first token of the same prompt" in r.stdout
