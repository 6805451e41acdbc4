# SPDX-License-Identifier: Apache-2.0
"""tests/bench/bench_vllm.py (report.py's `vllm` section) on vLLM's CPU
build, one failover of each kind: every step of the timeline is there for
both kills, in order, each after the kill; the floor, the cold start and the
memory figures are there. No speed is judged."""
import json
import os
import pathlib
import subprocess
import sys

SOURCE = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
BUILD = pathlib.Path(os.environ.get("GF_BUILD_ROOT", SOURCE / "build"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from timing import scaled  # noqa: E402

STEPS = ["exit_seen", "granted", "remapped", "kv_ready", "serving", "first_token"]


def test_timeline_has_every_step_in_order(tmp_path):
    out = tmp_path / "vllm.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BUILD / "bindings" / "python"), env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, SOURCE / "tests" / "bench" / "bench_vllm.py", "--runs", "1", "--json", out,
                        "--lockd", BUILD / "examples" / "gf-lockd" / "gf-lockd",
                        "--gmsd", BUILD / "examples" / "gf-gmsd" / "gf-gmsd"],
                       capture_output=True, text=True, env=env, timeout=scaled(1500))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    v = json.loads(out.read_text())
    assert v["steps"] == STEPS
    assert v["same_tokens"] is True
    assert sorted(x["kind"] for x in v["runs"]) == ["api_server", "tree"]
    for run in v["runs"] + [{"kind": k, "steps_ms": m} for k, m in v["median_ms"].items()]:
        values = [run["steps_ms"][s] for s in STEPS]
        assert values[0] > 0, run
        assert values == sorted(values), run  # exit seen <= grant <= ... <= first token
    for run in v["runs"]:
        assert 0 < run["tree_gone_ms"] < run["steps_ms"]["first_token"] + 60000, run
    assert v["floor_ms"]["tree_exit"] > 0 and v["floor_ms"]["warm_first_token"] > 0
    # each figure is rounded to 0.01 ms on its own, so the sum of the rounded parts may be 0.01 off the total
    assert abs(v["floor_ms"]["total"] - (v["floor_ms"]["tree_exit"] + v["floor_ms"]["warm_first_token"])) <= 0.011
    assert v["cold_start_first_token_ms"] > 0
    for kind in ("api_server", "tree"):
        assert v["ratio_to_floor"][kind] > 0 and v["cold_over_failover"][kind] > 0
    for tree in ("active", "standby"):
        assert v["memory"][tree]["rss_bytes"] > 0 and v["memory"][tree]["pss_bytes"] > 0
    assert "vLLM failover timeline" in r.stdout and "floor:" in r.stdout
