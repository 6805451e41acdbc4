# SPDX-License-Identifier: Apache-2.0
"""The Python surface at parity with gfctl and the C engine's setters, and a
star import that shadows no builtin; against a real gf-lockd and gf-gmsd."""
import builtins
import pathlib
import re
import subprocess
import threading

import pytest

from conftest import BUILD, SOURCE, gf, wait_for

EVICTED = -22

# gfctl GROUP COMMAND -> what Python calls for it.
PYTHON_FOR = {
    "lock acquire": "LockClient.acquire", "lock status": "lock_status", "lock ping": "lock_ping",
    "lock ready": "ready_for", "lock revoke": "lock_revoke", "lock evict": "lock_evict",
    "lock switchover": "lock_switchover", "gms status": "gms_status", "gms ping": "gms_ping",
    "gms wait-committed": "gms_wait_committed", "gms snapshot": "gms_snapshot", "gms restore": "gms_restore",
    "gms tiers": "gms_tiers", "gms demote": "gms_demote", "gpu list": "device_list",
}


def test_every_gfctl_command_has_a_python_call():
    out = subprocess.run([BUILD / "examples" / "gfctl" / "gfctl", "--help"], capture_output=True, text=True,
                         timeout=30).stdout
    commands = set(re.findall(r"^  ((?:lock|gms|gpu) [a-z-]+)", out, re.M))
    assert {"lock ping", "lock evict", "gms ping", "gms wait-committed", "gms demote"} <= commands, out
    missing = sorted(commands - PYTHON_FOR.keys())
    assert not missing, f"gfctl commands without a Python call in this table: {missing}"
    for cmd in commands:
        obj = gf
        for part in PYTHON_FOR[cmd].split("."):
            obj = getattr(obj, part)
        assert callable(obj), cmd


def engine_setters():
    header = (SOURCE / "include" / "gpufailover" / "engine.h").read_text()
    return set(re.findall(r"gf_engine_set_([a-z_]+)\(", header))


# C setter -> the Python way to set it (an Engine keyword or attribute).
ENGINE_PYTHON = {
    "lock": "lock", "role": "role", "backend": "backend", "waking_timeout": "waking_timeout",
    "remap_timeout": "remap_timeout", "lock_reconnect_timeout": "lock_reconnect_timeout",
    "init_timeout": "init_timeout", "private_bytes": "private_bytes", "wake_priority": "wake_priority",
    "settle_deferred": "settle_deferred", "startup_deadline": "startup_deadline", "memory_need": "memory_need",
    "gpus": "gpus", "asleep_bytes": "asleep_bytes", "pinned": "pinned", "model": "model",
    "probe_address": "probe_address", "health_fn": "health", "loss_fn": "on_loss", "loss_grace": "loss_grace",
    "step_down_fn": "on_step_down", "rank": "rank", "first_device": "first_device", "kv_pool": "kv_pool",
    "kv_layout": "set_kv_layout", "lock_secret": "lock_secret",
}


def test_every_engine_setter_has_a_python_face():
    missing = sorted(engine_setters() - ENGINE_PYTHON.keys())
    assert not missing, f"C engine setters without a Python counterpart in this table: {missing}"
    doc = gf.Engine.__doc__
    for setter, name in ENGINE_PYTHON.items():
        assert name in doc or hasattr(gf.Engine, name), f"gf_engine_set_{setter}: Engine has no {name}"


def test_star_import_shadows_no_builtin():
    ns = {}
    exec("from gpufailover import *", ns)
    shadowed = sorted(n for n in ns if n != "__builtins__" and hasattr(builtins, n))
    assert shadowed == [], shadowed
    for name in gf.__all__:
        assert hasattr(gf, name), name
    # still reachable by name, and ours still derive from the builtins where they did
    assert issubclass(gf.TimeoutError, builtins.TimeoutError)
    assert issubclass(gf.PermissionError, builtins.PermissionError)
    assert gf.InterruptedError is not builtins.InterruptedError


def test_lock_ping_and_evict(cluster):
    with pytest.raises(gf.UnreachableError):
        gf.lock_ping(cluster.lock_uri, timeout=1)
    cluster.lockd()
    assert gf.lock_ping(cluster.lock_uri) is None
    holder = gf.LockClient(cluster.lock_uri, "holder")
    holder.acquire(timeout=5)
    standby = gf.LockClient(cluster.lock_uri, "standby")
    errors = []

    def wait():
        try:
            standby.acquire(timeout=30)
        except gf.GpuFailoverError as e:
            errors.append(e)

    t = threading.Thread(target=wait)
    t.start()
    wait_for(lambda: any(w["id"] == "standby" for w in gf.lock_status(cluster.lock_uri)["waiters"]),
             what="the standby to queue")
    with pytest.raises(gf.StateError):
        gf.lock_evict(cluster.lock_uri, "nobody")
    with pytest.raises(ValueError):
        gf.lock_evict(cluster.lock_uri, "bad id with spaces")
    gf.lock_evict(cluster.lock_uri, "standby")
    t.join(30)
    assert not t.is_alive() and errors and errors[0].code == EVICTED
    holder.close()
    standby.close()


def test_gms_ping_wait_committed_and_demote(cluster):
    cluster.gmsd()
    uri = cluster.gms_uri()
    rtt = gf.gms_ping(uri)
    assert isinstance(rtt, float) and 0 < rtt < 60
    with pytest.raises(gf.TimeoutError):
        gf.gms_wait_committed(uri, timeout=0.3)
    with pytest.raises(gf.StateError):
        gf.gms_demote(uri)  # nothing committed
    with pytest.raises(ValueError):
        gf.gms_demote(uri, to="hot")
    mem = gf.Memory("host")
    w = gf.GMSClient(uri, mem, mode="rw", timeout=10)
    w.allocate(1 << 20, "weights")
    gen = w.commit()
    assert gf.gms_wait_committed(uri, timeout=10) == gen
    with pytest.raises(ValueError, match="WARM"):
        gf.gms_demote(uri, to="warm")  # this GMS keeps no WARM tier
    w.close()
    with pytest.raises(gf.UnreachableError):
        gf.gms_ping(f"unix://{cluster.dir}/none.sock", timeout=1)


def test_engine_keywords_reach_the_engine(cluster):
    cluster.lockd()
    cluster.gmsd()
    eng = gf.Engine(cluster.lock_uri, "kw", [cluster.gms_uri()], backend="host", lock_reconnect_timeout=3,
                    loss_grace=2.5, startup_deadline=120, wake_priority=0, settle_deferred=True)
    assert "gf_engine_startup_deadline_seconds 120" in eng.metrics_text()
    assert eng.settle() is None  # nothing deferred yet: a no-op
    eng.close()
    for kw, exc in (({"wake_priority": 100}, ValueError), ({"loss_grace": None}, ValueError),
                    ({"loss_grace": -1}, ValueError), ({"startup_deadline": "1s"}, TypeError),
                    ({"settle_deferred": "yes"}, TypeError)):
        with pytest.raises(exc):
            gf.Engine(cluster.lock_uri, "kw2", [cluster.gms_uri()], backend="host", **kw)
