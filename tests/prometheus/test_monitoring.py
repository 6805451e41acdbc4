# SPDX-License-Identifier: Apache-2.0
"""examples/prometheus: the rule file passes `promtool check rules`, and
every metric the rules and the Grafana dashboard use is one the code
exports (read from the sources: the `# TYPE` lines and the lock server's
metric tables), checked against a real gf-lockd's /metrics too."""
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest
import yaml

SOURCE = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
BUILD = pathlib.Path(os.environ.get("GF_BUILD_ROOT", SOURCE / "build"))
RULES = SOURCE / "examples" / "prometheus" / "gpufailover-rules.yaml"
DASHBOARD = SOURCE / "examples" / "prometheus" / "gpufailover-dashboard.json"
METRIC = re.compile(r"\bgf_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def exported():
    """Metric names the C sources write: `# TYPE name` in a literal, or a
    name passed to the lock server's metric() or listed in its tables."""
    names = set()
    for path in list((SOURCE / "lib").rglob("*.c")) + list((SOURCE / "examples").rglob("*.c")):
        text = path.read_text()
        names |= set(re.findall(r"# TYPE (gf_[a-z0-9_]+) ", text))
        names |= set(re.findall(r'metric\(f, "(gf_[a-z0-9_]+)"', text))
        names |= set(re.findall(r'\{ "(gf_[a-z0-9_]+)", "', text))
    return names


def used_in(exprs):
    out = set()
    for e in exprs:
        for name in METRIC.findall(e):
            for suffix in HISTOGRAM_SUFFIXES:
                if name.endswith(suffix):
                    name = name[: -len(suffix)]
            out.add(name)
    return out


def rule_exprs():
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs():
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in d["annotations"]["list"] if "expr" in a]
    exprs += [v["query"] for v in d["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_promtool_accepts_the_rules():
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("no promtool (Debian: prometheus, which tests/setup.sh installs)")
    r = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_rules_cover_what_operators_page_on():
    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    for want in ("StandbyMissing", "Happened", "WakingTooLong", "LockLost", "PinnedMemory"):
        assert any(want in n for n in names), f"no rule for {want}: {sorted(names)}"


@pytest.mark.parametrize("what,exprs", [("rules", rule_exprs), ("dashboard", dashboard_exprs)])
def test_every_metric_used_is_exported(what, exprs):
    have = exported()
    assert len(have) > 40, f"the source scan found only {sorted(have)}"
    used = used_in(exprs())
    assert used, f"the {what} use no gf_ metric"
    assert used <= have, f"the {what} use metrics no code exports: {sorted(used - have)}"


def test_dashboard_is_a_grafana_dashboard_with_a_timeline():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 30
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    assert any(p["type"] == "state-timeline" and "gf_engine_state" in p["targets"][0]["expr"] for p in d["panels"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_source_scan_matches_a_real_lock_server():
    """What gf-lockd really serves is in the scanned set (so the scan reads
    the code, not only its comments)."""
    lockd = BUILD / "examples" / "gf-lockd" / "gf-lockd"
    if not lockd.exists():
        pytest.skip(f"{lockd} not built")
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.Popen([str(lockd), f"--listen=unix://{d}/lock.sock", f"--state-file={d}/lock.state",
                              f"--metrics=127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60  # generous: a busy machine starts it late
            while True:
                try:
                    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "gf-lockd --metrics never answered"
                    assert p.poll() is None, "gf-lockd exited"
                    time.sleep(0.05)
        finally:
            p.terminate()
            p.wait(timeout=30)
    served = set(re.findall(r"^# TYPE (gf_[a-z0-9_]+) ", text, re.M))
    assert {"gf_lock_held", "gf_lock_waiters", "gf_lock_epoch"} <= served
    assert served <= exported(), sorted(served - exported())
