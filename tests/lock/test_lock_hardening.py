# SPDX-License-Identifier: Apache-2.0
"""Hardening of the lock against bad luck and hostile allowed peers, with real
gf-lockd, gf-gmsd, gf-c-engine and gfctl processes: a server restart under an
engine serving from the carried listener, a revoked holder that resumes, a
stopped gfctl guard, and the bounds docs/lock.md promises."""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_lock_integration import GFCTL, LOCKD, Lockd, alive, gfctl, status, wait_until  # noqa: E402

GMSD = os.environ.get("GF_GMSD", "build/examples/gf-gmsd/gf-gmsd")
C_ENGINE = os.environ.get("GF_C_ENGINE", "build/examples/c-engine/gf-c-engine")


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)
from other_uid import for_other_uid  # noqa: E402
from probe import engine_state  # noqa: E402


def get(port, path, timeout=5.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


@pytest.fixture
def tmp():
    with tempfile.TemporaryDirectory(prefix="gf-lock-hard-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK)
                                     else None) as d:
        yield d


class Stack:
    """gf-lockd carrying an HTTP listener, gf-gmsd, and C engines serving from it."""

    def __init__(self, tmp, *lockd_args):
        self.tmp = tmp
        self.serve_port = free_port()
        self.lockd = Lockd(tmp, f"--listener=http=tcp://127.0.0.1:{self.serve_port}", "--exit-wait-timeout=5s",
                           *lockd_args)
        self.gms_uri = f"unix://{tmp}/gms.sock"
        self.procs = []

    def spawn(self, name, argv):
        log = open(os.path.join(self.tmp, f"{name}.log"), "ab")
        p = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def start(self):
        self.lockd.start()
        self.spawn("gmsd", [GMSD, f"--listen={self.gms_uri}", "--device=0", "--backend=host"])
        wait_until(lambda: os.path.exists(f"{self.tmp}/gms.sock"), 20, "gf-gmsd")
        return self

    def engine(self, name, role, *extra):
        probe = free_port()
        p = self.spawn(name, [C_ENGINE, "--lock", self.lockd.uri, "--gms", self.gms_uri, "--role", role, "--id", name,
                              "--listener", "http", "--probe-port", probe, "--probe-address", "127.0.0.1",
                              "--backend", "host", *extra])
        return p, probe

    def log(self, name):
        return open(os.path.join(self.tmp, f"{name}.log")).read()

    def stop(self):
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.lockd.stop()


@pytest.fixture
def stack(tmp):
    stacks = []

    def make(*lockd_args):
        s = Stack(tmp, *lockd_args).start()
        stacks.append(s)
        return s

    yield make
    for s in stacks:
        s.stop()


def test_restart_keeps_the_engines_listener_non_blocking(stack):
    """Issue 28.1: gf-lockd restarted under an Active engine serving from the
    carried listener adopts the handed-back socket without changing its
    flags; single requests at low traffic are still answered."""
    s = stack()
    a, probe = s.engine("a", "loader")
    wait_until(lambda: engine_state(probe) == "active", 60, "engine Active")
    assert get(s.serve_port, "/infer?seed=1")[0] == 200
    s.lockd.kill9()
    s.lockd.start()
    wait_until(lambda: status(s.lockd.uri)["listeners_pending"] == 0 and status(s.lockd.uri)["holder"] == "a", 15,
               "the engine's reclaim handing the listener back")
    assert 'listener handed back by the holder' in s.lockd.logtext()
    for seed in range(3):
        time.sleep(1)
        code, body = get(s.serve_port, f"/infer?seed={seed}", timeout=10)
        assert code == 200 and json.loads(body)["engine"] == "a"
    assert a.poll() is None and engine_state(probe) == "active"


def test_resumed_revoked_holder_does_not_answer(stack):
    """Issue 28.12: an Active engine stopped, revoked, and resumed after the
    next holder serves from the carried listener never answers again: it sees
    the server's hang-up before accepting, and its loss path stops its
    listener duplicate accepting first thing."""
    s = stack()
    a, pa = s.engine("a", "loader")
    wait_until(lambda: engine_state(pa) == "active", 60, "a Active")
    b, pb = s.engine("b", "follower")
    wait_until(lambda: engine_state(pb) == "standby", 60, "b Standby")
    epoch = status(s.lockd.uri)["epoch"]
    os.killpg(a.pid, signal.SIGSTOP)
    r = gfctl("lock", "revoke", "--lock", s.lockd.uri, "--epoch", str(epoch))
    assert r.returncode == 0, r.stderr
    wait_until(lambda: engine_state(pb) == "active", 30, "b Active")
    # Connections queue in the backlog both engines could accept from.
    socks = []
    for _ in range(32):
        c = socket.create_connection(("127.0.0.1", s.serve_port), timeout=10)
        c.sendall(b"GET /infer?seed=1 HTTP/1.0\r\n\r\n")
        socks.append(c)
    os.killpg(a.pid, signal.SIGCONT)
    answers = []
    for c in socks:
        data = b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
        c.close()
        answers.append(json.loads(data.split(b"\r\n\r\n", 1)[1])["engine"])
    for _ in range(50):
        code, body = get(s.serve_port, "/infer?seed=2", timeout=10)
        answers.append(json.loads(body)["engine"])
    assert set(answers) == {"b"}, answers
    assert a.wait(30) == 70, s.log("a")


def test_stopped_gfctl_guard_ends_command_before_next_grant(tmp):
    """Issue 28.9: `gfctl lock acquire -- CMD` on a tcp:// lease with gfctl
    stopped: the guard, not hearing from gfctl for half of T_fence, kills
    CMD's group before the server can grant the next holder."""
    from test_lock_integration import Contender, free_port
    procs = []
    try:
        port = free_port()
        secret = os.path.join(tmp, "secret")
        with open(secret, "w") as f:
            f.write("s3cret\n")
        procs.append(Lockd(tmp, "--secret-file", secret, "--heartbeat", "200ms", "--detect-timeout", "2s",
                           tcp_port=port).start())
        uri = f"tcp://127.0.0.1:{port}"
        pidfile = os.path.join(tmp, "cmd.pid")
        # The guard's window is half of T_fence (1 s): 0.5 s, well inside T_detect (2 s).
        a = Contender(uri, "a", "--secret-file", secret, "--heartbeat", "200ms", "--fence", "1s",
                      cmd=["sh", "-c", f"echo $$ > {pidfile}; exec sleep 1000"])
        procs.append(a)
        assert a.wait_granted()
        cmd_pid = int(wait_until(lambda: os.path.exists(pidfile) and open(pidfile).read().strip(), 5, "CMD"))
        b = Contender(uri, "b", "--secret-file", secret)
        procs.append(b)
        time.sleep(0.5)
        assert alive(cmd_pid)
        a.signal(signal.SIGSTOP)
        assert b.wait_granted(10)
        assert not alive(cmd_pid), "CMD still ran when the next holder was granted"
        a.signal(signal.SIGCONT)
        assert a.proc.wait(5) == 4
    finally:
        for p in procs:
            if isinstance(p, Lockd):
                p.stop()
            else:
                p.signal(signal.SIGCONT)
                p.cleanup()


def test_pool_asleep_bytes_sum_saturates(tmp):
    """Issue 28.13: the per-GPU sum of declared asleep bytes saturates at
    2^64-1 instead of wrapping (two standbys declaring 2^63 each read 0)."""
    from test_lock_pool import GPU, Pool
    pool = Pool(tmp)
    try:
        pool.engine("holder")
        wait_until(lambda: pool.granted("holder"), 10, "holder granted")
        for name in ("s1", "s2"):
            pool.engine(name, "--asleep-bytes", str(2 ** 63))
            wait_until(lambda n=name: pool.waiting(n), 10, f"{name} waiting")
        code, text = get(pool.port, "/metrics")
        assert code == 200
        line = f'gf_lock_pool_gpu_asleep_bytes{{uuid="{GPU}"}} '
        assert line + str(2 ** 64 - 1) in text.decode().splitlines(), text
    finally:
        pool.close()


def test_silent_unauthenticated_connections_do_not_starve_pings(tmp):
    """Issue 28.14(b): a client without the secret holding many silent TCP
    connections (from 127.0.0.2) cannot use up gf-lockd's fds (a limit of
    128 here): beyond 32 still in the handshake its connections are closed at
    accept, and pings with the right secret (from 127.0.0.1) are answered."""
    import resource
    from test_lock_integration import free_port
    port = free_port()
    secret = os.path.join(tmp, "secret")
    with open(secret, "w") as f:
        f.write("s3cret\n")

    def low_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    log = os.path.join(tmp, "lockd.log")
    d = subprocess.Popen([LOCKD, "--listen", f"unix://{tmp}/lock.sock", "--listen", f"tcp://127.0.0.1:{port}",
                          "--secret-file", secret, "--handshake-timeout", "20s"], stderr=open(log, "w"),
                         preexec_fn=low_fd_limit)
    silent = []
    try:
        wait_until(lambda: 'msg="ready"' in open(log).read(), 10, "gf-lockd ready")
        for _ in range(200):
            c = socket.socket()
            c.bind(("127.0.0.2", 0))
            c.setblocking(False)
            try:
                c.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            silent.append(c)
        time.sleep(1)
        uri = f"tcp://127.0.0.1:{port}"
        for _ in range(3):
            r = gfctl("lock", "ping", "--lock", uri, "--secret-file", secret, "--timeout", "5s")
            assert r.returncode == 0, r.stderr
        st = status(f"unix://{tmp}/lock.sock")
        assert st["connections"] <= 40 and st["refused_auth_rate"] >= 150, st
        text = open(log).read()
        assert text.count("too many connections in the handshake") == 1, text
    finally:
        for c in silent:
            c.close()
        d.terminate()
        d.wait(10)


def _frame(body, nfds=0):
    import struct
    return struct.pack("<HBBHHI", 0x4647, 1, 0, nfds, 0, len(body)) + body


def _read_frame(s):
    import struct
    head = b""
    while len(head) < 12:
        chunk = s.recv(12 - len(head))
        if not chunk:
            return None
        head += chunk
    n = struct.unpack("<HBBHHI", head)[5]
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return body


def test_fd_on_a_message_that_takes_none_is_a_protocol_error(tmp):
    """docs/protocol.md: an fd sent with a lock message that takes none is
    closed and answered with a protocol error, and the connection closed."""
    import array
    d = Lockd(tmp).start()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(d.sock)
        # Msg{seq=1, hello{version=1, component=LOCK, peer_id="x"}}
        s.sendall(_frame(b"\x08\x01\x52\x07\x08\x01\x10\x01\x1a\x01x"))
        assert _read_frame(s) is not None  # Welcome
        # Msg{seq=2, lock_status_request{}} with one fd attached
        r, w = os.pipe()
        s.sendmsg([_frame(b"\x08\x02\xba\x01\x00", nfds=1)],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
        os.close(r)
        body = _read_frame(s)
        assert body is not None and body[2] == (14 << 3 | 2), body  # Msg.error
        assert b"file descriptors" in body, body
        assert _read_frame(s) is None  # closed
        # The fd went with it: the pipe's last reader is gone.
        with pytest.raises(BrokenPipeError):
            os.write(w, b"x")
        os.close(w)
        assert gfctl("lock", "ping", "--lock", d.uri).returncode == 0
    finally:
        d.stop()


def _varint(v):
    v &= (1 << 64) - 1
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def _field(num, payload):
    if isinstance(payload, int):
        return _varint(num << 3) + _varint(payload)
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _standby(sock_path, name, gpus):
    """A raw standby: Hello, then LockAcquire declaring @gpus, waiting for ever."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    hello = _field(1, 1) + _field(2, 1) + _field(3, name.encode())
    s.sendall(_frame(_field(1, 1) + _field(10, hello)))
    acq = _field(1, name.encode()) + _field(2, -1) + b"".join(_field(20, g.encode()) for g in gpus)
    s.sendall(_frame(_field(1, 2) + _field(20, acq)))
    return s


def test_metrics_scrapes_do_not_hold_up_the_lock_loop(tmp):
    """Issue 28.6: with 1,000 standbys declaring 8 GPUs each (8,000 per-GPU
    series), eight scrapers asking /metrics again and again do not hold up the
    lock's loop: pings keep being answered well within 1 s (a bound against
    hangs, 20 times the loop's 50 ms promise). One rendering serves every
    scrape for a second, and it sorts the (GPU, engine) pairs once."""
    import resource
    import threading
    from test_lock_pool import Pool
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2200:
        pytest.skip(f"needs 2,200 fds, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 4096, hard))
    pool = Pool(tmp)
    socks = []
    try:
        sock_path = pool.uri[len("unix://"):]
        holder = _standby(sock_path, "holder", [])
        socks.append(holder)
        for i in range(1000):
            socks.append(_standby(sock_path, f"s{i}", [f"GPU-{i:08x}-0000-4000-8000-{g:012x}" for g in range(8)]))
        wait_until(lambda: pool.status()["waiter_count"] == 1000, 60, "1,000 standbys")
        code, first = get(pool.port, "/metrics", timeout=30)
        code2, second = get(pool.port, "/metrics", timeout=30)
        assert code == code2 == 200 and first == second  # reused within the second
        assert first.decode().count("gf_lock_pool_gpu_standbys{") == 8000
        stop = threading.Event()

        def scrape():
            while not stop.is_set():
                try:
                    get(pool.port, "/metrics", timeout=30)
                except OSError:
                    pass

        scrapers = [threading.Thread(target=scrape, daemon=True) for _ in range(8)]
        for t in scrapers:
            t.start()
        try:
            for _ in range(10):
                r = gfctl("lock", "ping", "--lock", pool.uri, "--timeout", "1s")
                assert r.returncode == 0, r.stderr
                time.sleep(0.2)
        finally:
            stop.set()
            for t in scrapers:
                t.join(60)
    finally:
        for s in socks:
            s.close()
        pool.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _as_nobody(argv, **kw):
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", for_other_uid(argv[0])] + list(argv[1:])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run gfctl as another uid")
def test_non_admin_cannot_pin_or_borrow_recency(tmp):
    """Issue 28.10: an allowed non-admin uid (65534) can neither pin a standby
    (refused, exit 6) nor register under a recently Active engine's id to take
    its place in the LRU order: it counts as never Active and is the one
    evicted, not root's older standby."""
    from test_lock_pool import GPU, Pool, rejoiner
    os.chmod(tmp, 0o755)
    pool = Pool(tmp, "--max-standby-per-gpu", "1", "--allow-uid", "0", "--allow-uid", "65534")
    os.chmod(pool.uri[len("unix://"):], 0o666)  # the uid check under test is the server's, not the file's
    try:
        r = subprocess.run(_as_nobody([GFCTL, "lock", "acquire", "--lock", pool.uri, "--id", "pinner", "--gpu", GPU,
                                       "--pin", "--timeout", "2s"]), capture_output=True, text=True, timeout=30)
        assert r.returncode == 6 and "pin" in r.stderr, (r.returncode, r.stderr)

        def plain(name):
            p = subprocess.Popen([GFCTL, "lock", "acquire", "--lock", pool.uri, "--id", name],
                                 stdout=open(os.path.join(tmp, name + ".out"), "w"), stderr=subprocess.STDOUT)
            pool.procs.append(p)
            return p
        a = rejoiner(pool, "a")  # root's engine a was Active first,
        assert a.stdout.readline().startswith("granted id=a")
        b = plain("b")  # then b
        wait_until(lambda: pool.waiting("b"), 10, "b waiting")
        holder = plain("holder")
        wait_until(lambda: pool.waiting("holder"), 10, "holder waiting")
        a.release()  # a waits again, a standby on the GPU
        wait_until(lambda: pool.granted("b") and pool.waiting("a"), 10, "b granted, a standby")
        b.terminate()
        assert b.wait(30) == 0
        wait_until(lambda: pool.granted("holder"), 10, "holder granted")
        spoof = subprocess.run(_as_nobody([GFCTL, "lock", "acquire", "--lock", pool.uri, "--id", "b", "--gpu", GPU]),
                               capture_output=True, text=True, timeout=30)
        assert spoof.returncode == 73, (spoof.returncode, spoof.stderr)
        assert pool.waiting("a")
        assert holder.poll() is None
    finally:
        pool.close()
