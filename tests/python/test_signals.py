# SPDX-License-Identifier: Apache-2.0
"""PEP 475 in the blocking calls: Python signal handlers run while a call
waits with the GIL released; a handler that raises ends the call with its
exception, one that returns lets the wait go on with the time that remains."""
import signal
import threading
import time

import pytest

from conftest import Deadline, gf, held_lock, sleeping_engine, wait_for, waiter_queued


def test_raising_handler_ends_lock_acquire(cluster, alarm):
    holder = held_lock(cluster)

    def raise_deadline(signum, frame):
        raise Deadline()

    signal.signal(signal.SIGALRM, raise_deadline)
    waiter = gf.LockClient(cluster.lock_uri, "alarmed")
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    # Without PEP 475 handling this waits the whole minute (then TimeoutError).
    with pytest.raises(Deadline):
        waiter.acquire(timeout=60)
    assert not waiter.held
    wait_for(lambda: not waiter_queued(cluster, "alarmed"), what="the waiter to leave the queue")
    assert gf.lock_status(cluster.lock_uri)["holder"] == "holder"
    waiter.close()
    holder.release()


def test_returning_handler_lets_acquire_continue(cluster, alarm):
    holder = held_lock(cluster)
    ran = []
    release_at = []

    def note(signum, frame):
        ran.append(time.monotonic())

    signal.signal(signal.SIGALRM, note)
    waiter = gf.LockClient(cluster.lock_uri, "patient")

    def release_later():
        wait_for(lambda: ran, timeout=60, what="the handler to run")
        wait_for(lambda: waiter_queued(cluster, "patient"), timeout=60, what="the waiter to queue again")
        release_at.append(time.monotonic())
        holder.release()

    t = threading.Thread(target=release_later)
    t.start()
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    grant = waiter.acquire(timeout=120)
    t.join()
    assert grant.epoch > 0 and waiter.held
    # The handler ran while acquire() was still blocked (before the holder let go).
    assert len(ran) == 1 and ran[0] < release_at[0]
    waiter.release()


def test_returning_handler_keeps_the_remaining_timeout(cluster, alarm):
    holder = held_lock(cluster)
    ran = []
    signal.signal(signal.SIGALRM, lambda s, f: ran.append(1))
    waiter = gf.LockClient(cluster.lock_uri, "timed")
    signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)  # a handler every 200 ms
    t0 = time.monotonic()
    with pytest.raises(gf.TimeoutError):
        waiter.acquire(timeout=1.5)
    elapsed = time.monotonic() - t0
    signal.setitimer(signal.ITIMER_REAL, 0)
    assert ran  # the handler ran during the wait
    # Each wake continues with what remains instead of starting over, so the
    # call ends after about its timeout (the upper bound is only a hang check).
    assert 1.4 <= elapsed < 60
    waiter.close()
    holder.release()


def test_raising_handler_ends_engine_acquire(cluster, alarm):
    holder, eng = sleeping_engine(cluster, "engine-alarmed")

    def raise_deadline(signum, frame):
        raise Deadline()

    signal.signal(signal.SIGALRM, raise_deadline)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    with pytest.raises(Deadline):
        eng.acquire(timeout=60)
    assert eng.state == "standby"
    # The engine can still take the lock afterwards.
    holder.release()
    assert eng.acquire(timeout=30) > 0
    eng.close()


def test_handlers_in_other_threads_are_not_hooked(cluster):
    """Only the main thread runs Python handlers; a wait elsewhere is left alone."""
    holder = held_lock(cluster)
    waiter = gf.LockClient(cluster.lock_uri, "threaded")
    out = []
    t = threading.Thread(target=lambda: out.append(waiter.acquire(timeout=60)))
    t.start()
    wait_for(lambda: waiter_queued(cluster, "threaded"), what="the waiter to queue")
    holder.release()
    t.join(60)
    assert out and out[0].epoch > 0
    waiter.release()


def sleeping_reader_of_a_fresh_gms(cluster):
    """A reader that slept while its GMS restarted: remap() waits for a commit
    that does not come."""
    gmsd = cluster.gmsd()
    mem = gf.Memory("host")
    w = gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=5)
    w.put_meta("a", w.allocate(1 << 20), 0, b"1")
    w.commit()
    r = gf.GMSClient(cluster.gms_uri(), mem, mode="ro", timeout=5)
    r.map_all()
    r.unmap()
    w.close()
    gmsd.kill()
    cluster.procs.remove(gmsd)
    cluster.gmsd()
    return r


def test_raising_handler_ends_gms_remap(cluster, alarm):
    r = sleeping_reader_of_a_fresh_gms(cluster)

    def raise_deadline(signum, frame):
        raise Deadline()

    signal.signal(signal.SIGALRM, raise_deadline)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    with pytest.raises(Deadline):
        r.remap(timeout=60)
    assert r.mode is None
    r.close()


def test_returning_handler_lets_remap_time_out_on_time(cluster, alarm):
    r = sleeping_reader_of_a_fresh_gms(cluster)
    ran = []
    signal.signal(signal.SIGALRM, lambda s, f: ran.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
    t0 = time.monotonic()
    with pytest.raises(gf.TimeoutError):
        r.remap(timeout=1.0)
    elapsed = time.monotonic() - t0
    signal.setitimer(signal.ITIMER_REAL, 0)
    assert ran
    assert 0.9 <= elapsed < 60  # the whole timeout, once (the upper bound is only a hang check)
    r.close()


@pytest.mark.parametrize("then_raise", [False, True])
def test_handler_that_closes_the_waiting_client(cluster, alarm, then_raise):
    """A SIGTERM-style cleanup handler closes the client it interrupted: no
    hang (close() waiting for the very call it runs inside), no use after free."""
    holder = held_lock(cluster)
    waiter = gf.LockClient(cluster.lock_uri, "closed-by-handler")

    def cleanup(signum, frame):
        waiter.close()
        if then_raise:
            raise Deadline()

    signal.signal(signal.SIGALRM, cleanup)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    with pytest.raises(Deadline if then_raise else gf.InterruptedError) as ei:
        waiter.acquire(timeout=60)
    if not then_raise:
        assert "closed by a signal handler" in str(ei.value)
    with pytest.raises(ValueError):
        waiter.acquire(timeout=1)  # closed
    wait_for(lambda: not waiter_queued(cluster, "closed-by-handler"), what="the waiter to leave")
    holder.release()


def test_handler_that_closes_the_waiting_engine(cluster, alarm):
    holder, eng = sleeping_engine(cluster, "engine-closed-by-handler")
    signal.signal(signal.SIGALRM, lambda s, f: eng.close())
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    with pytest.raises(gf.InterruptedError, match="closed by a signal handler"):
        eng.acquire(timeout=60)
    with pytest.raises(ValueError):
        eng.state
    holder.release()
