# SPDX-License-Identifier: Apache-2.0
"""close() and release() from one thread while another is blocked in a call
on the same object: the blocked call ends cleanly (or close() raises), never
a use-after-free."""
import os
import threading
import time

import pytest

from conftest import gf, held_lock, sleeping_engine, wait_for
from conftest import waiter_queued as queued


def in_thread(fn):
    """Run fn in a thread; the result is ('ok', value) or ('err', exception)."""
    out = []

    def run():
        try:
            out.append(("ok", fn()))
        except BaseException as e:  # noqa: B036 - the test inspects it
            out.append(("err", e))

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_close_interrupts_a_blocked_lock_acquire(cluster):
    holder = held_lock(cluster)
    for round_ in range(3):  # repeated: the free must never race the waiting call
        waiter = gf.LockClient(cluster.lock_uri, "closed-under")
        t, out = in_thread(lambda: waiter.acquire(timeout=120))
        wait_for(lambda: queued(cluster, "closed-under"), what="the waiter to queue")
        waiter.close()
        t.join(60)
        assert not t.is_alive()
        kind, value = out[0]
        assert kind == "err" and isinstance(value, gf.InterruptedError), out
        assert "closed by another thread" in str(value)
        assert not waiter.held
        with pytest.raises(ValueError):
            waiter.acquire(timeout=1)  # closed
        wait_for(lambda: not queued(cluster, "closed-under"), what="the waiter to leave")
    assert gf.lock_status(cluster.lock_uri)["holder"] == "holder"
    holder.release()


def test_release_during_another_threads_acquire_raises(cluster):
    holder = held_lock(cluster)
    waiter = gf.LockClient(cluster.lock_uri, "released-under")
    t, out = in_thread(lambda: waiter.acquire(timeout=120))
    wait_for(lambda: queued(cluster, "released-under"), what="the waiter to queue")
    with pytest.raises(gf.StateError, match="another thread"):
        waiter.release()
    with pytest.raises(gf.StateError, match="another thread"):
        waiter.acquire(timeout=1)
    # The blocked acquire was left alone and is granted when the holder goes.
    holder.release()
    t.join(60)
    assert out and out[0][0] == "ok" and out[0][1].epoch > 0
    waiter.release()
    waiter.close()


def test_close_during_gms_remap_raises_then_works(cluster):
    # A WARM tier: a GMS that may come back restoring is waited for (without
    # one the remap gives up at once, docs/gms.md).
    os.makedirs(f"{cluster.dir}/warm")
    gmsd = cluster.gmsd(0, f"--warm={cluster.dir}/warm")
    mem = gf.Memory("host")
    w = gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=10)
    aid = w.allocate(1 << 20, "w")
    w.put_meta("w", aid, 0, b"x")
    w.commit()
    w.unmap()
    gmsd.kill()  # remap now retries until its timeout
    t, out = in_thread(lambda: w.remap(timeout=5))
    time.sleep(1.0)  # let the thread enter remap(): nothing outside shows it waiting
    closed_early = False
    try:
        w.close()
        closed_early = True
    except gf.StateError as e:
        assert "another thread" in str(e)
    t.join(60)
    assert not t.is_alive()
    if not closed_early:  # remap may not have started yet when close() ran
        assert out and out[0][0] == "err" and isinstance(out[0][1], (gf.TimeoutError, gf.UnreachableError)), out
        w.close()
    with pytest.raises(ValueError):
        w.remap(timeout=1)


def test_close_interrupts_a_blocked_engine_acquire(cluster):
    holder, eng = sleeping_engine(cluster, "engine-closed-under")
    t, out = in_thread(lambda: eng.acquire(timeout=120))
    wait_for(lambda: queued(cluster, "engine-closed-under"), what="the engine to queue")
    eng.close()
    t.join(60)
    assert not t.is_alive()
    assert out[0][0] == "err" and isinstance(out[0][1], gf.InterruptedError), out
    with pytest.raises(ValueError):
        eng.state
    holder.release()
