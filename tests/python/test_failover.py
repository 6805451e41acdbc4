# SPDX-License-Identifier: Apache-2.0
"""Failover between real engine processes: Python→Python and C↔Python."""
import json
import os
import sys
import urllib.request

import pytest

from conftest import C_ENGINE, PY_ENGINE, gf, wait_for


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)
from probe import engine_state as state  # noqa: E402


def get(port, path, timeout=1.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return json.loads(r.read())


def start_engine(cluster, kind, name, role, *extra):
    port, probe = free_port(), free_port()
    exe = [sys.executable, PY_ENGINE] if kind == "python" else [C_ENGINE]
    p = cluster.spawn(name, exe + ["--lock", cluster.lock_uri, "--gms", cluster.gms_uri(), "--role", role,
                                   "--id", name, "--port", str(port), "--probe-port", str(probe),
                                   "--probe-address", "127.0.0.1", "--backend", "host", *extra])
    p.port, p.probe = port, probe
    return p


@pytest.mark.parametrize("first,second", [("python", "python"), ("c", "python"), ("python", "c")])
def test_failover(cluster, first, second):
    cluster.lockd()
    cluster.gmsd()
    a = start_engine(cluster, first, "engine-a", "loader")
    wait_for(lambda: state(a.probe) == "active", 30, "engine-a active")
    b = start_engine(cluster, second, "engine-b", "follower")
    wait_for(lambda: state(b.probe) == "standby", 30, "engine-b standby")
    before = {s: get(a.port, f"/infer?seed={s}") for s in range(4)}
    assert all(r["engine"] == "engine-a" for r in before.values())

    a.kill()  # SIGKILL
    wait_for(lambda: state(b.probe) == "active", 30, "engine-b active")
    after = {s: get(b.port, f"/infer?seed={s}") for s in range(4)}
    for s in range(4):
        assert after[s]["engine"] == "engine-b"
        assert after[s]["epoch"] > before[s]["epoch"]
        assert after[s]["checksum"] == before[s]["checksum"], f"seed {s}: {first} vs {second} differ"
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{b.probe}/metrics", timeout=2).read().decode()
    failovers = [l for l in metrics.splitlines() if l.startswith("gf_engine_failovers_total")]
    assert failovers and float(failovers[0].split()[-1]) == 1
