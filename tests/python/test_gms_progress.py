# SPDX-License-Identifier: Apache-2.0
"""Waiting by progress from Python: GMSClient(by_progress=True) and a
follower's Engine(init_timeout=...) keep waiting while the GMS's writer makes
progress, and fail with TimeoutError saying whether no writer was connected or
the connected one stalled. Against a real gf-gmsd.

Only outcomes and error texts are asserted: the writer reports every 50 ms
against a 1 s timeout, and loads for three times that."""
import re
import signal
import threading
import time
import urllib.request

import pytest

import gpufailover as gf

WAIT = 1.0   # the reader's timeout while a writer loads
LOAD = 3.0   # how long the slow writer loads
STEP = 0.05  # its pace


class Reader(threading.Thread):
    """GMSClient(by_progress=True) on a thread of its own."""

    def __init__(self, uri, timeout):
        super().__init__(daemon=True)
        self.uri, self.timeout = uri, timeout
        self.client = self.error = None

    def run(self):
        try:
            self.client = gf.GMSClient(self.uri, gf.Memory("host"), mode="ro", timeout=self.timeout,
                                       by_progress=True)
        except gf.GpuFailoverError as e:
            self.error = e


def slow_load(w, seconds):
    """Allocate once, then report bytes written until @seconds have passed; returns the bytes."""
    aid = w.allocate(1 << 20, "weights")
    buf = w.buffer(alloc_id=aid)
    end = time.monotonic() + seconds
    done = 0
    while time.monotonic() < end:
        memoryview(buf)[done % (1 << 20)] = 0x5A
        done += 4096
        w.report_progress(done, 1 << 20)
        time.sleep(STEP)
    memoryview(buf)[0] = 0x5A
    del buf
    w.put_meta("w", aid, 0, b"v")
    return done


def metrics(gmsd):
    port = int(re.search(r'msg="metrics listening" address=\S+ port=(\d+)', gmsd.text()).group(1))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_reader_waits_while_the_writer_makes_progress(cluster):
    g = cluster.gmsd(0, "--metrics", "127.0.0.1:0")
    uri = cluster.gms_uri()
    assert "gf_gms_writer_connected 0\n" in metrics(g)
    w = gf.GMSClient(uri, gf.Memory("host"), mode="rw", timeout=5)
    r = Reader(uri, WAIT)
    r.start()
    deadline = time.monotonic() + 20
    while gf.gms_status(uri, 2)["waiters_by_progress"] != 1:
        assert time.monotonic() < deadline, "the reader never waited"
        time.sleep(0.01)
    slow_load(w, LOAD)
    st = gf.gms_status(uri, 2)
    assert st["writer_progress"]["progress_reports"] > 0
    assert st["writer_progress"]["total_bytes"] == 1 << 20
    assert st["no_writer_since_unix_ms"] is None
    text = metrics(g)
    assert "gf_gms_writer_connected 1\n" in text and "gf_gms_waiters_by_progress 1\n" in text
    assert "gf_gms_writer_idle_seconds " in text
    assert r.is_alive(), f"the reader gave up while the writer made progress: {r.error}"
    w.commit()
    r.join(20)
    assert r.error is None
    r.client.map_all()
    assert bytes(memoryview(r.client.buffer("w"))[:1]) == b"\x5a"
    r.client.close()
    w.close()


def test_no_writer_fails_after_the_timeout(cluster):
    cluster.gmsd()
    with pytest.raises(gf.TimeoutError, match="no writer connected for 0.3 s"):
        gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=0.3, by_progress=True)


def test_stalled_writer_fails_with_the_stall(cluster):
    cluster.gmsd()
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=5)
    w.allocate(4096)
    with pytest.raises(gf.TimeoutError, match="writer connected but made no progress for 0.3 s"):
        gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=0.3, by_progress=True)
    w.report_progress(1)  # the writer may go on
    w.commit()
    with pytest.raises(gf.StateError):
        w.report_progress(2)  # a reader now
    w.close()


def test_follower_init_waits_for_a_slow_loader(cluster):
    cluster.lockd()
    cluster.gmsd()
    uri = cluster.gms_uri()
    w = gf.GMSClient(uri, gf.Memory("host"), mode="rw", timeout=5)
    loader = threading.Thread(target=lambda: (slow_load(w, LOAD), w.commit()), daemon=True)
    loader.start()
    eng = gf.Engine(cluster.lock_uri, "follower", [uri], role="follower", backend="host", init_timeout=WAIT)
    eng.init_weights()
    loader.join(20)
    assert bytes(memoryview(eng.gms(0).buffer("w"))[:1]) == b"\x5a"
    w.close()


def test_follower_init_fails_without_a_loader(cluster):
    cluster.lockd()
    cluster.gmsd()
    eng = gf.Engine(cluster.lock_uri, "follower", [cluster.gms_uri()], role="follower", backend="host",
                    init_timeout=0.3)
    with pytest.raises(gf.TimeoutError, match="no writer connected for 0.3 s"):
        eng.init_weights()


class Deadline(Exception):
    pass


@pytest.fixture
def alarm():
    old = signal.getsignal(signal.SIGALRM)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def raise_deadline(signum, frame):
    raise Deadline()


def test_raising_handler_ends_a_wait_by_progress(cluster, alarm):
    """PEP 475: a wait that may last a whole load runs Python's signal handlers."""
    cluster.gmsd()
    signal.signal(signal.SIGALRM, raise_deadline)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    # Without it this waits the whole minute, then TimeoutError.
    with pytest.raises(Deadline):
        gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=60, by_progress=True)
    deadline = time.monotonic() + 20
    while gf.gms_status(cluster.gms_uri(), 2)["waiters"]:  # the request was withdrawn
        assert time.monotonic() < deadline, "the interrupted request still waits in the GMS"
        time.sleep(0.01)


def test_returning_handler_lets_a_wait_by_progress_go_on(cluster, alarm):
    cluster.gmsd()
    uri = cluster.gms_uri()
    ran = []
    signal.signal(signal.SIGALRM, lambda signum, frame: ran.append(signum))
    w = gf.GMSClient(uri, gf.Memory("host"), mode="rw", timeout=5)

    def load_after_the_handler():
        deadline = time.monotonic() + 20
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
        slow_load(w, 0.2)
        w.commit()

    loader = threading.Thread(target=load_after_the_handler, daemon=True)
    loader.start()
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    r = gf.GMSClient(uri, gf.Memory("host"), mode="ro", timeout=WAIT, by_progress=True)
    loader.join(20)
    assert ran and r.mode == "ro"
    r.close()
    w.close()


def test_raising_handler_ends_a_followers_init(cluster, alarm):
    cluster.lockd()
    cluster.gmsd()
    eng = gf.Engine(cluster.lock_uri, "follower", [cluster.gms_uri()], role="follower", backend="host",
                    init_timeout=60)
    signal.signal(signal.SIGALRM, raise_deadline)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    with pytest.raises(Deadline):
        eng.init_weights()
    assert eng.state_info()["state"] == "init"
    # Init may be tried again: a loader committed meanwhile, so it maps at once.
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=5)
    slow_load(w, 0)
    w.commit()
    eng.init_weights()
    assert bytes(memoryview(eng.gms(0).buffer("w"))[:1]) == b"\x5a"
    w.close()
