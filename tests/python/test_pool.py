# SPDX-License-Identifier: Apache-2.0
"""The C engine/lock API's standby pool, readiness, revoke, switchover and
device list, from Python, against a real gf-lockd and gf-gmsd."""
import signal
import socket
import threading

import pytest

from conftest import Deadline, gf, load_one_tensor, wait_for

GPU_A = "GPU-12345678-1234-1234-1234-123456789abc"
GPU_B = "GPU-abcdef01-2345-6789-abcd-ef0123456789"
EVICTED = -22


def waiters(cluster):
    return {w["id"]: w for w in gf.lock_status(cluster.lock_uri)["waiters"]}


def test_lock_client_declares_its_resources(cluster):
    cluster.lockd("--max-standby-per-gpu=1")
    holder = gf.LockClient(cluster.lock_uri, "holder")
    holder.set_resources([GPU_A], wake_bytes=4 << 30, asleep_bytes=1 << 30)
    holder.set_model("llama-8b")
    grant = holder.acquire(timeout=5)
    info = gf.lock_status(cluster.lock_uri)["holder_info"]
    assert (info["gpus"], info["wake_bytes"], info["asleep_bytes"], info["model"]) == (
        [GPU_A], 4 << 30, 1 << 30, "llama-8b")

    assert gf.ready_for(cluster.lock_uri, [GPU_A], "llama-8b")["ready"] is True
    assert gf.ready_for(cluster.lock_uri)["epoch"] == grant.epoch
    assert gf.ready_for(cluster.lock_uri, [GPU_B])["ready"] is False
    assert gf.ready_for(cluster.lock_uri, model="other")["ready"] is False

    # The budget is one standby per GPU: a pinned standby is kept, the unpinned newcomer is evicted.
    pinned = gf.LockClient(cluster.lock_uri, "pinned")
    pinned.set_resources([GPU_A], asleep_bytes=1)
    pinned.set_pinned(True)
    result = []
    t = threading.Thread(target=lambda: result.append(pinned.acquire(timeout=30)))
    t.start()
    wait_for(lambda: "pinned" in waiters(cluster), what="the pinned standby to queue")
    assert waiters(cluster)["pinned"]["pinned"] is True
    newcomer = gf.LockClient(cluster.lock_uri, "newcomer")
    newcomer.set_resources([GPU_A])
    with pytest.raises(gf.GpuFailoverError) as e:
        newcomer.acquire(timeout=5)
    assert e.value.code == EVICTED
    holder.release()
    t.join(30)
    assert result and result[0].epoch > grant.epoch
    for c in (holder, pinned, newcomer):
        c.close()


def test_engine_declares_its_pool_entry(cluster):
    cluster.lockd()
    cluster.gmsd()
    eng = gf.Engine(cluster.lock_uri, "engine-pool", [cluster.gms_uri()], backend="host", gpus=[GPU_A, GPU_B],
                    memory_need=0, asleep_bytes=123, pinned=True, model="llama-8b")
    eng.init_weights(load=load_one_tensor)
    eng.sleep()
    epoch = eng.acquire(timeout=10)
    info = gf.lock_status(cluster.lock_uri)["holder_info"]
    assert (info["gpus"], info["asleep_bytes"], info["pinned"], info["model"]) == (
        [GPU_A, GPU_B], 123, True, "llama-8b")
    # Granted but not serving yet: the relay says so (docs/lock.md, readiness).
    answer = gf.ready_for(cluster.lock_uri, [GPU_B], "llama-8b")
    assert answer["ready"] is False and answer["holder"] == "engine-pool" and answer["epoch"] == epoch
    eng.wake_up()
    eng.serve()
    answer = gf.ready_for(cluster.lock_uri, [GPU_B], "llama-8b")
    assert answer["ready"] is True and answer["holder"] == "engine-pool" and answer["epoch"] == epoch
    eng.close()


def test_switchover_asks_the_holder_and_revoke_drops_it(cluster):
    cluster.lockd()
    a = gf.LockClient(cluster.lock_uri, "a")
    asked = []
    stepped = threading.Event()

    def on_step_down(epoch):
        asked.append(epoch)
        stepped.set()

    a.on_step_down = on_step_down
    ga = a.acquire(timeout=5)
    a.start_watch()
    with pytest.raises(gf.StateError):
        gf.lock_switchover(cluster.lock_uri)  # no waiter would take over
    b = gf.LockClient(cluster.lock_uri, "b")
    got = []
    t = threading.Thread(target=lambda: got.append(b.acquire(timeout=30)))
    t.start()
    wait_for(lambda: "b" in waiters(cluster), what="b to queue")
    with pytest.raises(gf.StateError):
        gf.lock_switchover(cluster.lock_uri, ga.epoch + 1)
    gf.lock_switchover(cluster.lock_uri, ga.epoch)
    assert stepped.wait(10) and asked == [ga.epoch]
    a.stop_watch()
    a.release()
    t.join(30)
    gb = got[0]
    assert gb.epoch > ga.epoch

    c = gf.LockClient(cluster.lock_uri, "c")
    got.clear()
    t = threading.Thread(target=lambda: got.append(c.acquire(timeout=30)))
    t.start()
    wait_for(lambda: "c" in waiters(cluster), what="c to queue")
    with pytest.raises(gf.StateError):
        gf.lock_revoke(cluster.lock_uri, ga.epoch)  # not the current grant
    gf.lock_revoke(cluster.lock_uri, gb.epoch)
    t.join(30)
    assert got[0].epoch > gb.epoch
    assert gf.lock_status(cluster.lock_uri)["holder"] == "c"
    for x in (a, b, c):
        x.close()


def test_devices_by_uuid():
    devices = gf.device_list("host")
    assert devices and devices[0]["index"] == 0 and devices[0]["uuid"].startswith("HOST-")
    assert devices[0]["total_bytes"] > 0 and devices[0]["mig"] is False
    uuid = devices[0]["uuid"]
    assert gf.device_find_by_uuid(uuid, "host") == 0
    assert gf.device_find_by_uuid(uuid[:12], backend="host") == 0
    with pytest.raises(gf.NotFoundError):
        gf.device_find_by_uuid("HOST-ffffffff-0000", "host")


def test_a_signal_handler_runs_and_ends_a_one_shot_wait(tmp_path, alarm):
    """A server that accepts nothing: the one-shot query waits for its
    handshake. Handlers run while it waits (the first ones return), and the
    one that raises ends the wait; without that the call would end with
    TimeoutError after 5 s and the handler would run once."""
    path = tmp_path / "mute.sock"
    mute = socket.socket(socket.AF_UNIX)
    mute.bind(str(path))
    mute.listen(8)
    uri = f"unix://{path}"
    calls = []

    def handler(signum, frame):
        calls.append(signum)
        if len(calls) == 3:
            raise Deadline()

    signal.signal(signal.SIGALRM, handler)
    for call in (lambda: gf.ready_for(uri, timeout=5), lambda: gf.lock_revoke(uri, 7, 5),
                 lambda: gf.lock_switchover(uri, timeout=5), lambda: gf.lock_status(uri, 5),
                 lambda: gf.gms_status(uri, 5)):
        calls.clear()
        signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
        with pytest.raises(Deadline):
            call()
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert len(calls) == 3
    mute.close()


HOSTILE = [
    (lambda: gf.lock_revoke("unix:///x", -1), OverflowError),
    (lambda: gf.lock_revoke("unix:///x", 1 << 64), OverflowError),
    (lambda: gf.lock_revoke("unix:///x", "1"), TypeError),
    (lambda: gf.lock_revoke("unix:///x", 1.0), TypeError),
    (lambda: gf.lock_revoke("unix:///x", 0), ValueError),
    (lambda: gf.lock_revoke("unix:///x", 1, -1), ValueError),
    (lambda: gf.lock_revoke("unix:///x", 1, float("nan")), ValueError),
    (lambda: gf.lock_switchover("unix:///x", -5), OverflowError),
    (lambda: gf.lock_switchover("unix:///x", timeout="1"), TypeError),
    (lambda: gf.lock_switchover("unix:///x", secret="pw"), TypeError),
    (lambda: gf.ready_for("unix:///x", GPU_A), TypeError),
    (lambda: gf.ready_for("unix:///x", [GPU_A.encode()]), TypeError),
    (lambda: gf.ready_for("unix:///x", [GPU_A] * 9), ValueError),
    (lambda: gf.ready_for("unix:///x", ["GPU-\0"]), ValueError),
    (lambda: gf.ready_for("unix:///x", 5), TypeError),
    (lambda: gf.ready_for("unix:///x", model=7), TypeError),
    (lambda: gf.ready_for("unix:///x", ["GPU-nothex"], timeout=1), ValueError),
    (lambda: gf.device_list("gpu"), ValueError),
    (lambda: gf.device_list(0), TypeError),
    (lambda: gf.device_find_by_uuid(None), TypeError),
    (lambda: gf.LockClient("unix:///x", "e").set_resources(GPU_A), TypeError),
    (lambda: gf.LockClient("unix:///x", "e").set_resources([GPU_A], -1), OverflowError),
    (lambda: gf.LockClient("unix:///x", "e").set_resources([GPU_A], 0, 1 << 64), OverflowError),
    (lambda: gf.LockClient("unix:///x", "e").set_resources([GPU_A, GPU_A]), ValueError),
    (lambda: gf.LockClient("unix:///x", "e").set_resources(["GPU-1"]), ValueError),
    (lambda: gf.LockClient("unix:///x", "e").set_pinned(1), TypeError),
    (lambda: gf.LockClient("unix:///x", "e").set_model(3), TypeError),
    (lambda: gf.LockClient("unix:///x", "e").set_model("has space"), ValueError),
    (lambda: setattr(gf.LockClient("unix:///x", "e"), "on_step_down", 3), TypeError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", gpus=GPU_A), TypeError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", gpus=["GPU-x"]), ValueError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", gpus=[GPU_A] * 9), ValueError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", asleep_bytes=-1), OverflowError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", memory_need=1 << 64), OverflowError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", memory_need="1"), TypeError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", pinned="yes"), TypeError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", model="a=b"), ValueError),
    (lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", model=b"m"), TypeError),
]


@pytest.mark.parametrize("call,exc", HOSTILE)
def test_hostile_arguments_get_a_clear_error(call, exc):
    with pytest.raises(exc) as e:
        call()
    assert str(e.value)


@pytest.mark.parametrize("epoch,exc", [(-1, OverflowError), (1 << 64, OverflowError), ("1", TypeError),
                                       (0, ValueError)])
def test_grant_with_a_hostile_epoch_is_refused(cluster, epoch, exc):
    cluster.gmsd()
    grant = gf.Grant(epoch, bytes(32), 0.0, False)
    with pytest.raises(exc):
        gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=5, grant=grant)
