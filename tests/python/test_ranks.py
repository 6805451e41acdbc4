# SPDX-License-Identifier: Apache-2.0
"""Every rank fenced (issue 37) from Python: LockClient.add_pid and
Engine.add_holder_pid hold the next grant back until each registered process
has exited; a rank engine (Engine(None, ..., rank=N)) wakes with its holder's
epoch, with the private region, the memory gate and the GMS watch of rank 0."""
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from conftest import child_env, gf, wait_for

HOLDER = textwrap.dedent("""
    import sys, time
    import gpufailover as gf
    lock = gf.LockClient(sys.argv[1], "a")
    lock.add_pid(int(sys.argv[2]))
    g = lock.acquire(timeout=10)
    print("granted", g.epoch, flush=True)
    time.sleep(600)
""")


def test_lock_add_pid_errors(cluster):
    cluster.lockd()
    lock = gf.LockClient(cluster.lock_uri, "x")
    with pytest.raises(ValueError):
        lock.add_pid(0)
    with pytest.raises(ValueError):
        lock.add_pid(-3)
    with pytest.raises(TypeError):
        lock.add_pid("12")
    with pytest.raises(TypeError):
        lock.add_pid(True)  # not pid 1
    with pytest.raises(OverflowError):
        lock.add_pid(1 << 40)
    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(gf.NotFoundError):
        lock.add_pid(p.pid)
    lock.add_pid(os.getpid())  # its own process: always waited for, nothing to add
    lock.close()
    tcp = gf.LockClient("tcp://127.0.0.1:1", "x")
    with pytest.raises(gf.NotSupportedError):
        tcp.add_pid(os.getpid())
    tcp.close()


def test_registered_rank_holds_the_grant_back(cluster):
    """A holder process registers a rank and dies; the waiter here is granted
    only after the rank (killed by the test when it chooses) has exited."""
    cluster.lockd()
    rank = subprocess.Popen(["sleep", "600"])
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, cluster.lock_uri, str(rank.pid)],
                              stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert holder.stdout.readline().startswith("granted")
        assert gf.lock_status(cluster.lock_uri)["holder_pids"] == 1
        b = gf.LockClient(cluster.lock_uri, "b")
        got = []
        t = threading.Thread(target=lambda: got.append(b.acquire(timeout=60)))
        t.start()
        wait_for(lambda: gf.lock_status(cluster.lock_uri)["waiter_count"] == 1, what="b waiting")
        holder.kill()
        holder.wait()
        wait_for(lambda: gf.lock_status(cluster.lock_uri)["exit_wait_processes"] == 1, what="the exit wait")
        st = gf.lock_status(cluster.lock_uri)
        assert st["holder"] is None and st["exit_wait"] and st["exit_wait_pids"] == [rank.pid]
        # The holder is gone and the rank lives: no grant (the exit-wait timeout is 5 s).
        t.join(1.0)
        assert not got
        rank.kill()
        rank.wait()
        t.join(30)
        assert got and got[0].epoch > 0
        b.close()
    finally:
        for p in (holder, rank):
            if p.poll() is None:
                p.kill()
                p.wait()


def _load(device, gms):
    aid = gms.allocate(1 << 20, "w")
    gms.put_meta("w", aid, 0, b"x")
    gms.commit()


def test_engine_arguments():
    with pytest.raises(ValueError):
        gf.Engine(None, "e", ["unix:///nonexistent/g"], backend="host")  # lock=None needs a rank
    with pytest.raises(ValueError):
        gf.Engine("unix:///nonexistent/l", "e", ["unix:///nonexistent/g"], backend="host", rank=1)
    with pytest.raises(ValueError):
        gf.Engine(None, "e", ["unix:///nonexistent/g"], backend="host", rank=-1)
    with pytest.raises(ValueError):
        gf.Engine(None, "bad id", ["unix:///nonexistent/g"], backend="host", rank=1)
    with pytest.raises(ValueError):
        gf.Engine(None, "e", ["unix:///nonexistent/g"], backend="host", rank=1, first_device=-1)
    tcp = gf.Engine("tcp://127.0.0.1:1", "e", ["unix:///nonexistent/g"], backend="host")
    with pytest.raises(gf.NotSupportedError):
        tcp.add_holder_pid(os.getpid())
    tcp.close()


def test_first_device_is_the_backends_device(cluster):
    """first_device names the device of the engine's first GMS: the host
    backend has only device 0, so 1 fails init_weights with NotFoundError
    and 0 (the default, as given) maps. The cuda case, device N of a rank N,
    is tests/engine/test_engine.c's test_first_device on the test driver."""
    cluster.lockd()
    cluster.gmsd()
    e0 = gf.Engine(cluster.lock_uri, "eng", [cluster.gms_uri()], backend="host")
    e0.init_weights(load=_load)
    bad = gf.Engine(None, "eng", [cluster.gms_uri()], backend="host", role="follower", rank=1, first_device=1)
    with pytest.raises(gf.NotFoundError):
        bad.init_weights()
    bad.close()
    ok = gf.Engine(None, "eng", [cluster.gms_uri()], backend="host", role="follower", rank=1, first_device=0)
    ok.init_weights()
    ok.sleep()
    assert ok.state == "standby"
    ok.close()
    e0.close()


def test_rank_engine_wakes_with_rank_0(cluster):
    """Rank 0 holds the lock and registers rank 1's process; rank 1 wakes with
    rank 0's epoch: its KV region stays at its Init address, and a lost GMS
    goes to its loss hook."""
    cluster.lockd()
    cluster.gmsd()
    losses = []
    e0 = gf.Engine(cluster.lock_uri, "eng", [cluster.gms_uri()], backend="host", private_bytes=1 << 20)
    e1 = gf.Engine(None, "eng", [cluster.gms_uri()], backend="host", role="follower", private_bytes=1 << 20,
                   rank=1)
    e0.on_loss = lambda code, detail: None
    e1.on_loss = lambda code, detail: losses.append(code)
    other = subprocess.Popen(["sleep", "600"])  # stands for rank 1's own process
    try:
        e0.add_holder_pid(other.pid)
        with pytest.raises(gf.StateError):
            e1.add_holder_pid(other.pid)  # a rank holds no lock
        e0.init_weights(load=_load)
        e1.init_weights()
        addr, size = e1.private_memory()
        e0.sleep()
        e1.sleep()
        with pytest.raises(gf.StateError):
            e1.acquire(timeout=1)
        with pytest.raises(ValueError):
            e1.wake_as_rank(0)
        assert e1.state == "standby"
        epoch = e0.acquire(timeout=10)
        assert gf.lock_status(cluster.lock_uri)["holder_pids"] == 1
        e1.wake_as_rank(epoch)
        assert e1.state == "waking"
        e1.wake_up()
        e1.serve()
        e0.wake_up()
        e0.serve()
        assert e1.state == "active" and e1.epoch == epoch
        assert e1.private_memory() == (addr, size)
        info = e1.state_info()
        assert info["rank"] == 1 and info["id"] == "eng"
        assert e0.state_info()["holder_pids"] == 1
        cluster.procs[-1].kill()  # the GMS
        wait_for(lambda: e1.state == "dead", what="rank 1 dead")
        wait_for(lambda: losses, what="rank 1's loss hook")
        assert losses[0] == -6  # GF_ERR_GMS_LOST
    finally:
        other.kill()
        other.wait()
        e1.close()
        e0.close()


def test_rank_memory_gate(cluster, monkeypatch):
    """A rank's wake waits at its memory gate; closed for the waking timeout, it is Dead."""
    cluster.lockd()
    cluster.gmsd()
    e0 = gf.Engine(cluster.lock_uri, "eng", [cluster.gms_uri()], backend="host")
    e1 = gf.Engine(None, "eng", [cluster.gms_uri()], backend="host", role="follower", private_bytes=1 << 20,
                   rank=3, waking_timeout=0.3)
    try:
        e0.init_weights(load=_load)
        e1.init_weights()
        e1.sleep()
        monkeypatch.setenv("GF_MEM_HOST_AVAILABLE", "4096")  # the host backend's free memory, for tests
        with pytest.raises(gf.OutOfMemoryError):
            e1.wake_as_rank(9)
        assert e1.state == "dead" and e1.state_info()["dead_cause"] == "memory_gate"
    finally:
        e1.close()
        e0.close()


WATCHING_HOLDER = textwrap.dedent("""
    import sys, time
    import gpufailover as gf
    lock = gf.LockClient(sys.argv[1], "a", reconnect_timeout=30)
    lock.add_pid(int(sys.argv[2]))
    g = lock.acquire(timeout=10)
    lock.start_watch()
    print("granted", g.epoch, flush=True)
    time.sleep(600)
""")


def test_reclaim_registers_the_ranks_again(cluster):
    """The registrations are not in the state file: after a lock-server
    restart the holder's reclaim sends them again, and they still fence."""
    server = cluster.lockd("--reconnect-window=20s")
    rank = subprocess.Popen(["sleep", "600"])
    holder = subprocess.Popen([sys.executable, "-c", WATCHING_HOLDER, cluster.lock_uri, str(rank.pid)],
                              stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert holder.stdout.readline().startswith("granted")
        server.kill()
        cluster.lockd("--reconnect-window=20s")
        wait_for(lambda: gf.lock_status(cluster.lock_uri)["holder"] == "a", 30, what="the reclaim")
        assert gf.lock_status(cluster.lock_uri)["holder_pids"] == 1
        b = gf.LockClient(cluster.lock_uri, "b")
        got = []
        t = threading.Thread(target=lambda: got.append(b.acquire(timeout=60)))
        t.start()
        wait_for(lambda: gf.lock_status(cluster.lock_uri)["waiter_count"] == 1, what="b waiting")
        holder.kill()
        holder.wait()
        wait_for(lambda: gf.lock_status(cluster.lock_uri)["exit_wait_processes"] == 1, what="the exit wait")
        t.join(1.0)
        assert not got
        rank.kill()
        rank.wait()
        t.join(30)
        assert got
        b.close()
    finally:
        for p in (holder, rank):
            if p.poll() is None:
                p.kill()
                p.wait()
