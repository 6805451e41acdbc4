# SPDX-License-Identifier: Apache-2.0
"""A lost GPU context fails over without killing anything: two engines on the
cuda backend (the test driver; tests/engine/cuda_engine.c), the context of
one is lost at run time (FAKECUDA_LOSE_CONTEXT names a file; once it exists
every driver call that needs a context fails with a sticky error). Its next
probe finds the loss, /live and /ready fail, the engine is Dead (cause
device_lost) and its loss policy runs: the default ends the process, which
lets go of the lock, and the standby takes over and serves the same weights."""
import os
import signal
import time
import urllib.error
import urllib.request

import pytest

from conftest import BUILD, GMSD, gf, wait_for
from test_failover import free_port

FAKE = BUILD / "tests" / "fakecuda" / "libcuda.so.1"
ENGINE = BUILD / "tests" / "engine" / "cuda-engine"

pytestmark = pytest.mark.skipif(not ENGINE.exists(), reason="built without the cuda backend (no test driver)")


def probe(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def serving(p):
    """The engine's "serving epoch=E checksum=X" line as (E, X), else None."""
    for line in p.text().splitlines():
        if line.startswith("serving "):
            kv = dict(f.split("=", 1) for f in line.split()[1:])
            return int(kv["epoch"]), kv["checksum"]
    return None


def start_engine(cluster, name, role, lose=None):
    port = free_port()
    env = {"FAKECUDA_LOSE_CONTEXT": str(lose)} if lose else {}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        p = cluster.spawn(name, [ENGINE, cluster.lock_uri, cluster.gms_uri(), role, name, str(port)])
    finally:
        os.environ.clear()
        os.environ.update(old)
    p.probe = port
    return p


@pytest.fixture
def world(cluster, tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("FAKECUDA_") or k == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(k)
    monkeypatch.setenv("GF_LIBCUDA", str(FAKE))
    monkeypatch.setenv("FAKECUDA_STATE_DIR", str(tmp_path))
    cluster.lockd()
    cluster.gmsd_proc = cluster.spawn("gf-gmsd-0", [GMSD, f"--listen={cluster.gms_uri()}", "--device=0",
                                                    "--backend=cuda"])
    wait_for(lambda: gf.gms_status(cluster.gms_uri(), 0.2), 10, "gf-gmsd")
    return cluster


def holder(cluster):
    st = gf.lock_status(cluster.lock_uri, 1.0)
    return st.get("holder", {}).get("engine_id") if isinstance(st.get("holder"), dict) else st.get("holder")


def test_lost_context_hands_over_to_the_standby(world, tmp_path):
    trigger = tmp_path / "lose-a"
    a = start_engine(world, "engine-a", "loader", lose=trigger)
    wait_for(lambda: serving(a), 30, "engine-a serving")
    b = start_engine(world, "engine-b", "follower")
    wait_for(lambda: probe(b.probe, "/ready") == 200, 30, "engine-b standby")
    assert serving(b) is None
    assert probe(a.probe, "/live") == 200

    trigger.touch()  # engine-a's context is lost; nothing is killed
    assert probe(a.probe, "/live") == 503
    # The default loss policy ends engine-a (SIGTERM); the lock goes to engine-b.
    a.p.wait(timeout=30)
    text = a.text()
    assert "event=device_lost" in text and "cause=device_lost" in text, text
    wait_for(lambda: serving(b), 30, "engine-b serving")
    (ea, sa), (eb, sb) = serving(a), serving(b)
    assert eb > ea
    assert sb == sa  # the same weights, from the GMS
    assert probe(b.probe, "/live") == 200
    assert world.gmsd_proc.p.poll() is None


def test_lost_context_standby_stops_claiming_ready(world, tmp_path):
    a = start_engine(world, "engine-a", "loader")
    wait_for(lambda: serving(a), 30, "engine-a serving")
    trigger = tmp_path / "lose-b"
    b = start_engine(world, "engine-b", "follower", lose=trigger)
    wait_for(lambda: probe(b.probe, "/ready") == 200, 30, "engine-b standby")
    trigger.touch()
    assert probe(b.probe, "/ready") == 503
    b.p.wait(timeout=30)
    assert "cause=device_lost" in b.text()
    # The holder is untouched and still alive.
    time.sleep(0.2)
    assert a.p.poll() is None
    assert probe(a.probe, "/live") == 200
    a.kill(signal.SIGTERM)
