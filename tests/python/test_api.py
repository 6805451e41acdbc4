# SPDX-License-Identifier: Apache-2.0
"""The Python API end to end against real gf-lockd and gf-gmsd processes."""
import builtins
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import BUILD, Proc, child_env, gf, wait_for

MiB = 1 << 20


def test_acquire_epoch_and_fifo(cluster):
    cluster.lockd()
    a = gf.LockClient(cluster.lock_uri, "engine-a")
    grant = a.acquire(timeout=5)
    assert isinstance(grant, gf.Grant) and grant.epoch > 0 and len(grant.session_token) == 32
    assert a.held and a.epoch == grant.epoch
    b = gf.LockClient(cluster.lock_uri, "engine-b")
    with pytest.raises(gf.TimeoutError) as ei:
        b.acquire(timeout=0.2)
    assert isinstance(ei.value, builtins.TimeoutError)
    assert ei.value.name == "GF_ERR_TIMEOUT"
    status = gf.lock_status(cluster.lock_uri)
    assert status["holder"] == "engine-a"
    # A clean release hands over at once (a mere close waits for the
    # holder's process to exit, and this process lives on).
    a.release()
    assert not a.held
    b.prepare_watch()  # the watcher thread, parked, before the wait
    threads = len(os.listdir("/proc/self/task"))
    g2 = b.acquire(timeout=5)
    assert g2.epoch > grant.epoch
    b.start_watch()  # wakes it: no thread is created now
    assert len(os.listdir("/proc/self/task")) == threads
    b.stop_watch()
    b.close()


def test_gil_released_while_acquire_blocks(cluster):
    cluster.lockd()
    holder = gf.LockClient(cluster.lock_uri, "holder")
    holder.acquire(timeout=5)
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    waiter = gf.LockClient(cluster.lock_uri, "waiter")
    with pytest.raises(gf.TimeoutError):
        waiter.acquire(timeout=0.5)
    stop.set()
    t.join()
    assert len(ticks) > 50  # the other thread ran while acquire blocked
    holder.close()
    waiter.close()


def test_ctrl_c_during_acquire(cluster, tmp_path):
    cluster.lockd()
    holder = gf.LockClient(cluster.lock_uri, "holder")
    holder.acquire(timeout=5)
    script = tmp_path / "waiter.py"
    script.write_text(f"""
import sys, time, gpufailover as gf
l = gf.LockClient({cluster.lock_uri!r}, "ctrl-c-waiter")
print("waiting", flush=True)
try:
    l.acquire()
except KeyboardInterrupt:
    print("interrupted held=%s" % l.held, flush=True)
    sys.exit(42)
""")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=child_env())
    assert p.stdout.readline().strip() == "waiting"
    wait_for(lambda: any(w["id"] == "ctrl-c-waiter" for w in gf.lock_status(cluster.lock_uri)["waiters"]),
             what="the waiter to queue")
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=10)
    assert p.returncode == 42, out
    assert "interrupted held=False" in out
    assert time.monotonic() - t0 < 5
    # Nothing half-held: the waiter left the queue.
    wait_for(lambda: not gf.lock_status(cluster.lock_uri)["waiters"], what="the waiter to leave")
    holder.release()


def test_gms_write_commit_read_zero_copy(cluster):
    cluster.gmsd()
    mem = gf.Memory("host")
    w = gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=5)
    assert w.mode == "rw"
    aid = w.allocate(2 * MiB, "weights")
    buf = w.buffer(alloc_id=aid, dtype="float32", shape=[4, 4])
    assert not buf.readonly
    arr = np.frombuffer(buf, dtype=np.float32).reshape(4, 4)
    arr[:] = np.arange(16, dtype=np.float32).reshape(4, 4)
    w.put_meta("layer.0", aid, 0, b'{"dtype":"F32"}')
    del arr
    gen = w.commit()
    assert gen >= 1 and w.mode == "ro"

    r = gf.GMSClient(cluster.gms_uri(), mem, mode="ro", timeout=5)
    r.map_all()
    assert r.metadata["layer.0"]["value"] == b'{"dtype":"F32"}'
    view = r.buffer("layer.0", dtype="float32", shape=[4, 4])
    assert view.readonly
    ra = np.from_dlpack(view)
    assert ra.shape == (4, 4) and not ra.flags.writeable
    np.testing.assert_array_equal(ra, np.arange(16, dtype=np.float32).reshape(4, 4))
    # Zero copy: the array's memory is the mapping itself.
    assert ra.__array_interface__["data"][0] == view.addr
    # A write through the writer's mapping shows in the reader's: same physical memory.
    assert r.layout == w.layout
    del ra
    w.close()
    r.close()


def test_gms_fence_takes_the_lock_grant(cluster):
    """gf-gmsd --lock: committed weights are replaced only by a writer whose
    GMSClient carries the current holder's Grant; the public epoch with any
    other token, or no grant, is refused and the weights stay."""
    cluster.lockd()
    cluster.gmsd(0, f"--lock={cluster.lock_uri}")
    mem = gf.Memory("host")

    def load(byte, grant=None):
        w = gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=5, grant=grant)
        aid = w.allocate(MiB, "weights")
        view = w.buffer(alloc_id=aid)
        np.frombuffer(view, dtype=np.uint8)[:] = byte
        del view
        w.put_meta("w", aid, 0, b"")
        w.commit()
        w.close()

    def first_byte():
        r = gf.GMSClient(cluster.gms_uri(), mem, mode="ro", timeout=5)
        r.map_all()
        view = r.buffer("w")
        b = np.frombuffer(view, dtype=np.uint8)[0]
        del view
        r.close()
        return int(b)

    load(1)  # the first load: nothing committed yet, no grant needed
    lock = gf.LockClient(cluster.lock_uri, "a")
    grant = lock.acquire(timeout=5)
    with pytest.raises(gf.PermissionError):
        load(2)
    with pytest.raises(gf.PermissionError):
        load(2, grant._replace(session_token=bytes(32)))
    with pytest.raises(TypeError):
        gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=5, grant=7)
    assert first_byte() == 1
    load(3, grant)
    assert first_byte() == 3
    assert gf.gms_status(cluster.gms_uri())["fence_refusals"] == 2
    lock.close()


def test_sleep_wake_keeps_addresses(cluster):
    cluster.gmsd()
    mem = gf.Memory("host")
    w = gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=5)
    aid = w.allocate(MiB)
    with memoryview(w.buffer(alloc_id=aid)) as mv:
        mv[:5] = b"hello"
    w.put_meta("t", aid, 0, b"")
    w.commit()
    r = gf.GMSClient(cluster.gms_uri(), mem, mode="ro", timeout=5)
    r.map_all()
    before = [a["addr"] for a in r.allocations]
    v = r.buffer("t", size=5)
    with pytest.raises(BufferError):
        with memoryview(v):
            r.unmap()  # refused while a view is alive
    del v
    r.unmap()
    assert r.mode is None
    with pytest.raises(gf.StateError):
        r.buffer("t")
    r.remap(timeout=5)
    assert [a["addr"] for a in r.allocations] == before
    assert bytes(memoryview(r.buffer("t", size=5))) == b"hello"
    # Handles released at every sleep: the same wake, the fds come again.
    with pytest.raises(TypeError):
        r.set_keep_handles(0)
    r.set_keep_handles(False)
    r.unmap()
    r.remap(timeout=5)
    assert [a["addr"] for a in r.allocations] == before
    assert bytes(memoryview(r.buffer("t", size=5))) == b"hello"
    r.set_keep_handles(True)
    w.close()
    r.close()


def test_remap_timeout_and_stale_layout(cluster):
    gmsd = cluster.gmsd()
    mem = gf.Memory("host")
    w = gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=5)
    w.put_meta("a", w.allocate(MiB), 0, b"1")
    w.commit()
    r = gf.GMSClient(cluster.gms_uri(), mem, mode="ro", timeout=5)
    r.map_all()
    r.unmap()
    w.close()
    # The GMS dies while the reader sleeps (Decision 6): a fresh one has no commit.
    gmsd.kill()
    cluster.procs.remove(gmsd)
    cluster.gmsd()
    with pytest.raises(gf.TimeoutError):
        r.remap(timeout=0.3)
    # Someone commits a different layout: the sleeper must not map it.
    w2 = gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=5)
    w2.put_meta("b", w2.allocate(2 * MiB), 0, b"2")
    w2.commit()
    with pytest.raises(gf.StaleLayoutError):
        r.remap(timeout=5)
    assert r.mode is None  # nothing stays mapped after a failed remap
    w2.close()
    r.close()


def test_gms_lost_is_reported(cluster):
    gmsd = cluster.gmsd()
    mem = gf.Memory("host")
    w = gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=5)
    w.allocate(MiB)
    lost = threading.Event()
    w.on_lost = lambda code, detail: lost.set()
    w.start_watch()
    gmsd.kill()
    cluster.procs.remove(gmsd)
    assert lost.wait(5)
    w.close()


@pytest.mark.parametrize("call,exc", [
    (lambda: gf.LockClient(1, "x"), TypeError),
    (lambda: gf.LockClient("unix:///x", "x").acquire(timeout="soon"), TypeError),
    (lambda: gf.LockClient("unix:///x", "x").acquire(timeout=-1), ValueError),
    (lambda: gf.LockClient("unix:///x", "x").acquire(timeout=float("nan")), ValueError),
    (lambda: gf.LockClient("http://x", "x"), ValueError),
    (lambda: gf.Memory("tpu"), ValueError),
    (lambda: gf.Memory(3), TypeError),
    (lambda: gf.Memory("host", device=-1), ValueError),
    (lambda: gf.GMSClient("unix:///x", object()), TypeError),
    (lambda: gf.GMSClient("unix:///x", gf.Memory("host"), mode="rwx"), ValueError),
    (lambda: gf.parse_duration("10 parsecs"), ValueError),
    (lambda: gf.parse_duration(10), TypeError),
    (lambda: gf.Engine("unix:///l", "e", []), ValueError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], role="boss"), ValueError),
    (lambda: gf.Engine("unix:///l", "e", [1]), TypeError),
])
def test_bad_arguments_raise_not_crash(call, exc):
    with pytest.raises(exc):
        call()


def test_unreachable_server():
    l = gf.LockClient("unix:///nonexistent/lock.sock", "x", reconnect_timeout=0.2)
    with pytest.raises(gf.GpuFailoverError):
        l.acquire(timeout=0.5)
    with pytest.raises(gf.UnreachableError) as ei:
        gf.lock_status("unix:///nonexistent/lock.sock", 0.2)
    assert isinstance(ei.value, ConnectionError)


def test_torch_pluggable_allocator_entry_points(cluster):
    """Calls gf_torch_malloc/free through the shared object by name, as
    torch.cuda.memory.CUDAPluggableAllocator does."""
    import ctypes

    so = ctypes.CDLL(gf.torch_allocator_path())
    so.gf_torch_malloc.restype = ctypes.c_void_p
    so.gf_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    so.gf_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    assert so.gf_torch_malloc(4096, 0, None) is None  # outside a pool: refused
    cluster.gmsd()
    mem = gf.Memory("host")
    w = gf.GMSClient(cluster.gms_uri(), mem, mode="rw", timeout=5)
    with gf.torch_pool(w):
        with pytest.raises(gf.StateError):
            gf._gpufailover._torch_pool_begin(w)  # one pool at a time
        ptr = so.gf_torch_malloc(3 * MiB, 0, None)
    assert ptr
    allocs = w.allocations
    assert len(allocs) == 1 and allocs[0]["addr"] == ptr and allocs[0]["size"] >= 3 * MiB
    ctypes.memmove(ptr, b"torch", 5)  # the pointer is mapped read-write
    so.gf_torch_free(ptr, 3 * MiB, 0, None)
    w.put_meta("t", allocs[0]["id"], 0, b"")
    w.commit()
    r = gf.GMSClient(cluster.gms_uri(), mem, mode="ro", timeout=5)
    r.map_all()
    assert bytes(memoryview(r.buffer("t", size=5))) == b"torch"
    assert so.gf_torch_malloc(4096, 0, None) is None  # the pool ended
    r.close()
    w.close()
