# SPDX-License-Identifier: Apache-2.0
"""Integration tests of the lock: real gf-lockd and gfctl processes, real
signals. Rows of the failure table of docs/design.md, decision 8, FIFO
handoff on SIGKILL, fork safety, hostile peers, uid allow list, TCP leases,
and a randomized history checked against the lock's invariants."""
import json
import os
import random
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pytest

LOCKD = os.environ.get("GF_LOCKD", "build/examples/gf-lockd/gf-lockd")
GFCTL = os.environ.get("GF_GFCTL", "build/examples/gfctl/gfctl")
HELPER = os.environ.get("GF_LOCK_HELPER", "build/tests/lock/lock-helper")

EXIT_TIMEOUT, EXIT_LOST, EXIT_UNREACHABLE, EXIT_PERMISSION = 3, 4, 5, 6


def wait_until(cond, timeout=5.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid):
    """True unless @pid is gone or a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Lockd:
    def __init__(self, tmp, *extra, tcp_port=None, secret=None):
        self.tmp = tmp
        self.sock = os.path.join(tmp, "lock.sock")
        self.uri = "unix://" + self.sock
        self.state = os.path.join(tmp, "state.json")
        self.args = ["--listen", self.uri, "--state-file", self.state] + list(extra)
        if tcp_port:
            self.args += ["--listen", f"tcp://127.0.0.1:{tcp_port}"]
        self.log = os.path.join(tmp, "lockd.log")
        self.proc = None

    def start(self):
        with open(self.log, "a") as lf:
            lf.write("--- start\n")
        start_len = os.path.getsize(self.log)
        self.proc = subprocess.Popen([LOCKD] + self.args, stderr=open(self.log, "a"))

        def ready():
            with open(self.log) as f:
                f.seek(start_len)
                return 'msg="ready"' in f.read()

        wait_until(lambda: ready() or self.proc.poll() is not None, 5, "gf-lockd ready")
        assert self.proc.poll() is None, open(self.log).read()
        return self

    def kill9(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)

    def logtext(self):
        return open(self.log).read()


def gfctl(*args, timeout=10):
    return subprocess.run([GFCTL] + list(args), capture_output=True, text=True, timeout=timeout)


def status(uri, *extra):
    r = gfctl("lock", "status", "--lock", uri, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


class Contender:
    """`gfctl lock acquire`, holding until killed."""

    def __init__(self, uri, ident, *extra, cmd=None):
        self.id = ident
        argv = [GFCTL, "lock", "acquire", "--lock", uri, "--id", ident] + list(extra)
        if cmd:
            argv += ["--"] + cmd
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.epoch = None
        self.granted_at = None

    def wait_granted(self, timeout=5.0):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return None
        line = self.proc.stdout.readline().decode()
        if not line:
            return None
        assert line.startswith(f"granted id={self.id} epoch="), line
        self.epoch = int(line.split("epoch=")[1])
        self.granted_at = time.monotonic()
        return self.epoch

    def signal(self, sig):
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self):
        self.signal(signal.SIGKILL)

    def cleanup(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


@pytest.fixture
def tmp():
    with tempfile.TemporaryDirectory(prefix="gf-lock-it-") as d:
        yield d


@pytest.fixture
def procs():
    lst = []
    yield lst
    for p in lst:
        if isinstance(p, Lockd):
            p.stop()
        else:
            p.cleanup()


def spawn(procs, *a, **kw):
    c = Contender(*a, **kw)
    procs.append(c)
    return c


def start_lockd(procs, tmp, *extra, **kw):
    d = Lockd(tmp, *extra, **kw).start()
    procs.append(d)
    return d


def wait_waiters(uri, n):
    wait_until(lambda: status(uri)["waiter_count"] == n, 5, f"{n} waiters")


def test_cli_basics(tmp, procs):
    assert gfctl("--version").returncode == 0
    assert subprocess.run([LOCKD, "--version"], capture_output=True).returncode == 0
    assert subprocess.run([LOCKD, "--help"], capture_output=True).returncode == 0
    assert subprocess.run([LOCKD], capture_output=True).returncode == 2
    assert subprocess.run([LOCKD, "--listen", "unix:///x", "--heartbeat", "1s", "--detect-timeout", "2s"],
                          capture_output=True).returncode == 2
    nowhere = "unix://" + os.path.join(tmp, "none.sock")
    assert gfctl("lock", "ping", "--lock", nowhere).returncode == EXIT_UNREACHABLE
    r = gfctl("lock", "acquire", "--lock", nowhere, "--id", "a", "--reconnect-timeout", "200ms")
    assert r.returncode == EXIT_UNREACHABLE, r.stderr
    d = start_lockd(procs, tmp)
    assert gfctl("lock", "ping", "--lock", d.uri).returncode == 0
    a = spawn(procs, d.uri, "a")
    assert a.wait_granted()
    r = gfctl("lock", "acquire", "--lock", d.uri, "--id", "b", "--timeout", "200ms")
    assert r.returncode == EXIT_TIMEOUT, r.stderr
    # flock(1)-like: run a command while holding, exit with its status.
    a.kill()
    r = gfctl("lock", "acquire", "--lock", d.uri, "--id", "c", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7 and r.stdout.startswith("granted id=c epoch=")
    text = gfctl("lock", "status", "--lock", d.uri)
    assert text.returncode == 0 and "holder" in text.stdout
    # A second server on the same state file refuses to start.
    other = subprocess.run([LOCKD, "--listen", "unix://" + os.path.join(tmp, "other.sock"),
                            "--state-file", d.state], capture_output=True, text=True, timeout=10)
    assert other.returncode == 1 and "in use" in other.stderr


def test_holder_sigkill_fifo(tmp, procs):
    d = start_lockd(procs, tmp)
    a = spawn(procs, d.uri, "a")
    e = a.wait_granted()
    assert e
    others = []
    for i, name in enumerate("bcd"):
        c = spawn(procs, d.uri, name)
        wait_waiters(d.uri, i + 1)
        others.append(c)
    assert [w["id"] for w in status(d.uri)["waiters"]] == ["b", "c", "d"]
    holder = a
    for c in others:
        holder.kill()
        assert c.wait_granted() == holder.epoch + 1
        assert not alive(holder.pid)
        for rest in others[others.index(c) + 1:]:
            assert rest.epoch is None
        holder = c
    assert "granted" in d.logtext() and "epoch=" in d.logtext()


def test_unix_stopped_holder_keeps_lock(tmp, procs):
    """Documented non-guarantee: on a unix socket a hung-but-alive holder
    keeps the lock; its liveness probe has to kill it."""
    d = start_lockd(procs, tmp)
    a = spawn(procs, d.uri, "a")
    ea = a.wait_granted()
    b = spawn(procs, d.uri, "b")
    wait_waiters(d.uri, 1)
    a.signal(signal.SIGSTOP)
    assert b.wait_granted(1.0) is None
    assert status(d.uri)["holder"] == "a"
    a.signal(signal.SIGCONT)
    a.kill()
    assert b.wait_granted() == ea + 1


def test_forked_command_does_not_keep_lock(tmp, procs):
    d = start_lockd(procs, tmp)
    a = spawn(procs, d.uri, "a", cmd=["sleep", "60"])
    assert a.wait_granted()
    b = spawn(procs, d.uri, "b")
    wait_waiters(d.uri, 1)
    a.kill()  # gfctl dies; its child `sleep` lives on in the same session
    assert b.wait_granted() == a.epoch + 1


def test_forked_child_holding_socket_does_not_keep_lock(tmp, procs):
    """A child that keeps the holder's socket open (fork without exec, fd
    dup'ed past the atfork handler): the server watches the holder's pidfd."""
    d = start_lockd(procs, tmp)
    h = subprocess.Popen([HELPER, d.uri, "a", "fork-keep"], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        assert h.stdout.readline().startswith("granted")
        child = int(h.stdout.readline().split("=")[1])
        b = spawn(procs, d.uri, "b")
        wait_waiters(d.uri, 1)
        h.kill()
        assert b.wait_granted()
        assert alive(child)
    finally:
        os.killpg(h.pid, signal.SIGKILL)
        h.wait()


def test_release_waits_for_process_exit(tmp, procs):
    d = start_lockd(procs, tmp)
    h = subprocess.Popen([HELPER, d.uri, "a", "linger", "800"], stdout=subprocess.PIPE, text=True)
    assert h.stdout.readline().startswith("granted")
    b = spawn(procs, d.uri, "b")
    wait_waiters(d.uri, 1)
    # The helper closed its socket right away but lives 800ms more.
    st = status(d.uri)
    assert st["holder"] is None and st["exit_wait"]
    assert b.wait_granted(0.3) is None
    assert b.wait_granted(5)
    assert not alive(h.pid)  # a zombie by now: it had exited before the grant
    h.wait()
    assert "waiting for its process to exit" in d.logtext()


def test_exit_wait_timeout(tmp, procs):
    d = start_lockd(procs, tmp, "--exit-wait-timeout", "300ms")
    h = subprocess.Popen([HELPER, d.uri, "a", "linger", "5000"], stdout=subprocess.PIPE, text=True)
    try:
        assert h.stdout.readline().startswith("granted")
        t0 = time.monotonic()
        b = spawn(procs, d.uri, "b")
        assert b.wait_granted(4)
        assert h.poll() is None and alive(h.pid)  # granted by the timeout, not by the exit
        assert time.monotonic() - t0 >= 0.2
        assert "exit-wait timeout" in d.logtext()
    finally:
        h.kill()
        h.wait()


def frame(body, length=None):
    return struct.pack("<HBBHHI", 0x4647, 1, 0, 0, 0, len(body) if length is None else length) + body


def closed_by_server(s, timeout=5.0):
    s.settimeout(timeout)
    try:
        while True:
            data = s.recv(4096)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_hostile_peers_cost_one_connection(tmp, procs):
    d = start_lockd(procs, tmp, "--handshake-timeout", "500ms")
    a = spawn(procs, d.uri, "a")
    assert a.wait_granted()

    def conn():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(d.sock)
        return s

    rnd = random.Random(7)
    for _ in range(20):
        s = conn()
        s.sendall(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 300))))
        assert closed_by_server(s)
        s.close()
    s = conn()  # oversized frame: refused from the header alone
    s.sendall(frame(b"", length=1 << 30))
    assert closed_by_server(s)
    s = conn()  # garbage body in a well-formed frame
    s.sendall(frame(b"\xff" * 40))
    assert closed_by_server(s)
    s = conn()  # half a header, then gone
    s.sendall(frame(b"abc")[:6])
    s.close()
    stall = conn()  # half a frame, then silence
    stall.sendall(frame(b"x" * 50)[:20])
    silent = conn()  # says nothing at all
    idle = [conn() for _ in range(20)]
    t0 = time.monotonic()
    assert closed_by_server(stall) and closed_by_server(silent)
    assert time.monotonic() - t0 < 4
    for s in idle:
        assert closed_by_server(s)
    # The server and the holder are unharmed.
    assert d.proc.poll() is None
    assert gfctl("lock", "ping", "--lock", d.uri).returncode == 0
    st = status(d.uri)
    assert st["holder"] == "a" and st["epoch"] == a.epoch
    assert a.proc.poll() is None


def test_uid_not_allowed_is_refused(tmp, procs):
    d = start_lockd(procs, tmp, "--allow-uid", str(os.getuid() + 1))
    r = gfctl("lock", "ping", "--lock", d.uri)
    assert r.returncode == EXIT_PERMISSION, r.stderr
    assert "not allowed" in r.stderr
    r = gfctl("lock", "acquire", "--lock", d.uri, "--id", "a", "--timeout", "2s")
    assert r.returncode == EXIT_PERMISSION
    d.stop()
    d2 = Lockd(tmp, "--allow-uid", str(os.getuid())).start()
    procs.append(d2)
    assert gfctl("lock", "ping", "--lock", d2.uri).returncode == 0


# ---- Decision 8: lock server crash recovery ----

RECONNECT = ["--reconnect-timeout", "4s"]


def test_d8_server_crash_holder_healthy(tmp, procs):
    d = start_lockd(procs, tmp, "--reconnect-window", "1500ms")
    a = spawn(procs, d.uri, "a", *RECONNECT)
    ea = a.wait_granted()
    b = spawn(procs, d.uri, "b", *RECONNECT)
    wait_waiters(d.uri, 1)
    d.kill9()
    d.start()
    wait_until(lambda: status(d.uri)["holder"] == "a", 3, "A reclaims")
    st = status(d.uri)
    assert st["epoch"] == ea and not st["reconnect_window"]
    wait_waiters(d.uri, 1)  # B reconnected and keeps waiting
    time.sleep(1.7)  # past the window: still A, no failover
    st = status(d.uri)
    assert st["holder"] == "a" and a.proc.poll() is None and b.epoch is None and b.proc.poll() is None
    a.kill()
    assert b.wait_granted() == ea + 1


def test_d8_server_crash_holder_dead(tmp, procs):
    d = start_lockd(procs, tmp, "--reconnect-window", "800ms")
    a = spawn(procs, d.uri, "a", *RECONNECT)
    ea = a.wait_granted()
    b = spawn(procs, d.uri, "b", *RECONNECT)
    wait_waiters(d.uri, 1)
    d.kill9()
    a.kill()
    a.proc.wait()
    t0 = time.monotonic()
    d.start()
    eb = b.wait_granted(5)
    assert eb and eb > ea
    assert time.monotonic() - t0 >= 0.7  # not before the window expired
    assert "presumed dead" in d.logtext()


def test_d8_holder_stopped_during_restart(tmp, procs):
    d = start_lockd(procs, tmp, "--reconnect-window", "800ms")
    a = spawn(procs, d.uri, "a", *RECONNECT)
    ea = a.wait_granted()
    b = spawn(procs, d.uri, "b", *RECONNECT)
    wait_waiters(d.uri, 1)
    a.signal(signal.SIGSTOP)
    d.kill9()
    d.start()
    eb = b.wait_granted(5)
    assert eb and eb > ea
    # A wakes up, finds the grant gone and reports the loss.
    a.signal(signal.SIGCONT)
    assert a.proc.wait(6) == EXIT_LOST
    assert "lost" in a.proc.stderr.read().decode()
    assert status(d.uri)["holder"] == "b"


def test_d8_both_crash(tmp, procs):
    d = start_lockd(procs, tmp, "--reconnect-window", "800ms")
    a = spawn(procs, d.uri, "a", *RECONNECT)
    ea = a.wait_granted()
    b = spawn(procs, d.uri, "b", *RECONNECT)
    wait_waiters(d.uri, 1)
    d.kill9()
    a.kill()
    b.kill()
    d.start()
    a2 = spawn(procs, d.uri, "a2", *RECONNECT)
    time.sleep(0.1)
    b2 = spawn(procs, d.uri, "b2", *RECONNECT)
    e = a2.wait_granted(5)
    assert e and e > ea
    assert b2.wait_granted(0.3) is None
    a2.kill()
    assert b2.wait_granted() == e + 1


# ---- TCP leases ----

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from other_uid import for_other_uid  # noqa: E402
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)


def tcp_lockd(procs, tmp):
    port = free_port()
    secret = os.path.join(tmp, "secret")
    with open(secret, "w") as f:
        f.write("s3cret\n")
    d = start_lockd(procs, tmp, "--secret-file", secret, "--heartbeat", "100ms", "--detect-timeout", "600ms",
                    tcp_port=port)
    return d, port, secret


def test_tcp_requires_secret(tmp, procs):
    d, port, secret = tcp_lockd(procs, tmp)
    uri = f"tcp://127.0.0.1:{port}"
    assert gfctl("lock", "ping", "--lock", uri).returncode == EXIT_PERMISSION
    wrong = os.path.join(tmp, "wrong")
    with open(wrong, "w") as f:
        f.write("nope")
    assert gfctl("lock", "ping", "--lock", uri, "--secret-file", wrong).returncode == EXIT_PERMISSION
    assert gfctl("lock", "ping", "--lock", uri, "--secret-file", secret).returncode == 0
    st = status(uri, "--secret-file", secret)
    assert st["holder"] is None


def test_tcp_stopped_holder_loses_lock(tmp, procs):
    d, port, secret = tcp_lockd(procs, tmp)
    uri = f"tcp://127.0.0.1:{port}"
    a = spawn(procs, uri, "a", "--secret-file", secret)
    ea = a.wait_granted()
    b = spawn(procs, uri, "b", "--secret-file", secret)
    wait_waiters(d.uri, 1)
    time.sleep(0.3)  # heartbeats flow: nothing happens
    assert status(d.uri)["holder"] == "a"
    a.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    eb = b.wait_granted(5)
    assert eb == ea + 1
    # T_detect (600ms) counts from the last heartbeat heard, up to one
    # heartbeat interval (100ms) before the stop.
    assert time.monotonic() - t0 >= 0.45
    a.signal(signal.SIGCONT)
    assert a.proc.wait(5) == EXIT_LOST


class FreezableProxy:
    """TCP forwarder whose traffic can be frozen in both directions: a
    network partition between one client and the server."""

    def __init__(self, port):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen()
        self.port = self.lsock.getsockname()[1]
        self.target = port
        self.frozen = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while not self.stop.is_set():
            c, _ = self.lsock.accept()
            s = socket.create_connection(("127.0.0.1", self.target))
            for x, y in ((c, s), (s, c)):
                threading.Thread(target=self.pump, args=(x, y), daemon=True).start()

    def pump(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.frozen.is_set():
                    time.sleep(0.01)
                dst.sendall(data)
        except OSError:
            pass


def test_tcp_partitioned_holder_fences_itself_before_regrant(tmp, procs):
    d, port, secret = tcp_lockd(procs, tmp)
    proxy = FreezableProxy(port)
    a = spawn(procs, f"tcp://127.0.0.1:{proxy.port}", "a", "--secret-file", secret)
    ea = a.wait_granted()
    b = spawn(procs, f"tcp://127.0.0.1:{port}", "b", "--secret-file", secret)
    wait_waiters(d.uri, 1)
    proxy.frozen.set()
    t0 = time.monotonic()
    assert a.proc.wait(5) == EXIT_LOST
    a_lost = time.monotonic()
    eb = b.wait_granted(5)
    assert eb == ea + 1
    # Lease order: A reported LOCK_LOST (T_fence) before B was granted (T_detect).
    assert a_lost < b.granted_at
    assert a_lost - t0 >= 0.15  # T_fence (300ms) since the last heartbeat heard
    assert "T_fence" in a.proc.stderr.read().decode()


# ---- randomized history ----

def test_randomized_history(tmp, procs):
    rnd = random.Random(int(os.environ.get("GF_LOCK_SEED", "12345")))
    d = start_lockd(procs, tmp, "--reconnect-window", "1500ms", "--exit-wait-timeout", "5s")
    n = [0]
    live = []

    def new():
        n[0] += 1
        c = Contender(d.uri, f"c{n[0]}", "--reconnect-timeout", "4s")
        c.stopped = False
        procs.append(c)
        live.append(c)

    for _ in range(4):
        new()
    sel = selectors.DefaultSelector()
    registered = set()
    grants = []  # (epoch, contender)
    holder = None
    deaths = {}
    end = time.monotonic() + 15
    restarts = 0

    def poll_lines(timeout):
        nonlocal holder
        for c in live:
            if c.pid not in registered and c.proc.poll() is None:
                sel.register(c.proc.stdout, selectors.EVENT_READ, c)
                registered.add(c.pid)
        ready = []
        for key, _ in sel.select(timeout):
            c = key.data
            line = c.proc.stdout.readline().decode()
            sel.unregister(c.proc.stdout)
            if line:
                ready.append((int(line.split("epoch=")[1]), c))
        # Lines that became readable together are ordered by their epochs;
        # one may be from a contender killed right after its grant.
        for epoch, c in sorted(ready, key=lambda x: x[0]):
            # Invariant checks at the moment the grant is seen.
            if grants:
                assert epoch > grants[-1][0], (epoch, grants[-1])
                prev = grants[-1][1]
                assert not alive(prev.pid), f"{c.id} granted while {prev.id} (pid {prev.pid}) still alive"
                # Holders here end only by being killed: no overlap.
                assert prev.id in deaths, f"{c.id} granted but {prev.id} was never killed"
            grants.append((epoch, c))
            holder = c

    while time.monotonic() < end:
        poll_lines(rnd.uniform(0.02, 0.2))
        action = rnd.random()
        if action < 0.35 and holder and holder.proc.poll() is None:
            holder.kill()
            holder.proc.wait()
            deaths[holder.id] = time.monotonic()
            live.remove(holder)
            new()
        elif action < 0.5:
            waiting = [c for c in live if c is not holder]
            if waiting:
                v = rnd.choice(waiting)
                v.kill()
                v.proc.wait()
                deaths[v.id] = time.monotonic()
                live.remove(v)
                new()
        elif action < 0.65 and live:
            # A short stop of anyone, holder included: nothing may change hands.
            v = rnd.choice(live)
            v.signal(signal.SIGSTOP)
            time.sleep(rnd.uniform(0.05, 0.3))
            v.signal(signal.SIGCONT)
        elif action < 0.72 and restarts < 4:
            restarts += 1
            d.kill9()
            time.sleep(rnd.uniform(0, 0.2))
            if rnd.random() < 0.3 and holder and holder.proc.poll() is None:
                holder.kill()  # both crash
                holder.proc.wait()
                deaths[holder.id] = time.monotonic()
                live.remove(holder)
                new()
            d.start()
    poll_lines(0.5)
    print(f"history: {len(grants)} grants, {restarts} server restarts, {n[0]} contenders")
    assert len(grants) >= 5, f"only {len(grants)} grants"
    epochs = [e for e, _ in grants]
    assert epochs == sorted(set(epochs))
    # Every contender alive at the end other than the holder never saw a loss.
    for c in live:
        assert c.proc.poll() is None, f"{c.id} exited with {c.proc.returncode}: {c.proc.stderr.read()}"


# ---- revocation (a holder that will not die) ----

def test_revoke(tmp, procs):
    d = start_lockd(procs, tmp)
    a = spawn(procs, d.uri, "a")
    e1 = a.wait_granted()
    b = spawn(procs, d.uri, "b")
    wait_waiters(d.uri, 1)
    # Only the current grant's epoch revokes anything.
    r = gfctl("lock", "revoke", "--lock", d.uri, "--epoch", str(e1 + 5))
    assert r.returncode == 1 and "is not the current grant" in r.stderr, r.stderr
    r = gfctl("lock", "revoke", "--lock", d.uri)
    assert r.returncode == 2 and "--epoch" in r.stderr
    r = gfctl("lock", "revoke", "--lock", d.uri, "--epoch", "-1")
    assert r.returncode == 2
    # A hung holder (stopped, its socket open) is revoked: b is granted at once,
    # with no exit wait, and a higher epoch.
    a.signal(signal.SIGSTOP)
    r = gfctl("lock", "revoke", "--lock", d.uri, "--epoch", str(e1))
    assert r.returncode == 0 and f"revoked epoch={e1}" in r.stdout, r.stderr
    e2 = b.wait_granted()
    assert e2 is not None and e2 > e1
    assert alive(a.pid)
    # When it wakes up it learns that it lost the lock, and never holds it again.
    a.signal(signal.SIGCONT)
    assert a.proc.wait(timeout=20) == EXIT_LOST
    assert status(d.uri)["holder"] == "b"
    # Revoking the old epoch again changes nothing.
    r = gfctl("lock", "revoke", "--lock", d.uri, "--epoch", str(e1))
    assert r.returncode == 1
    assert status(d.uri)["holder"] == "b"
    assert f'msg="revoked" id=a epoch={e1}' in d.logtext()


def test_revoke_needs_an_admin_uid(tmp, procs):
    if os.geteuid() != 0:
        pytest.skip("needs root to run gfctl as another uid")
    os.chmod(tmp, 0o755)
    d = start_lockd(procs, tmp, "--allow-uid", "0", "--allow-uid", "65534")
    os.chmod(d.sock, 0o666)  # the uid check under test is the server's, not the file's
    a = spawn(procs, d.uri, "a")
    e1 = a.wait_granted()
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", for_other_uid(GFCTL), "lock", "revoke",
                        "--lock", d.uri, "--epoch", str(e1)], capture_output=True, text=True, timeout=10)
    assert r.returncode == EXIT_PERMISSION, (r.returncode, r.stderr)
    assert "only root or the server's own uid may revoke" in r.stderr
    assert status(d.uri)["holder"] == "a"


def test_randomized_history_with_revocations(tmp, procs):
    """Holders are killed, stopped, and stopped-then-revoked at random. At any
    time at most one contender acts as holder: a new grant is seen only after
    the previous holder died or was revoked, a revoked holder exits with "lock
    lost" as soon as it runs again, and epochs strictly increase."""
    rnd = random.Random(int(os.environ.get("GF_LOCK_SEED", "4242")))
    d = start_lockd(procs, tmp, "--exit-wait-timeout", "5s")
    n = [0]
    live = []

    def new():
        n[0] += 1
        c = Contender(d.uri, f"r{n[0]}")
        procs.append(c)
        live.append(c)

    for _ in range(3):
        new()
    grants = []
    ended = {}  # contender id -> "killed" | "revoked"
    revoked = []
    sel = selectors.DefaultSelector()
    registered = set()
    holder = None

    def poll(timeout):
        nonlocal holder
        for c in live:
            if c.pid not in registered and c.proc.poll() is None:
                sel.register(c.proc.stdout, selectors.EVENT_READ, c)
                registered.add(c.pid)
        ready = []
        for key, _ in sel.select(timeout):
            c = key.data
            line = c.proc.stdout.readline().decode()
            sel.unregister(c.proc.stdout)
            if line:
                ready.append((int(line.split("epoch=")[1]), c))
        for epoch, c in sorted(ready, key=lambda x: x[0]):
            if grants:
                prev_epoch, prev = grants[-1]
                assert epoch > prev_epoch
                assert prev.id in ended, f"{c.id} granted epoch {epoch} while {prev.id} still held {prev_epoch}"
                if ended[prev.id] == "killed":
                    assert not alive(prev.pid)
            grants.append((epoch, c))
            holder = c

    end = time.monotonic() + 12
    while time.monotonic() < end:
        poll(rnd.uniform(0.02, 0.15))
        if not holder or holder.id in ended:
            continue
        r = rnd.random()
        if r < 0.4:
            holder.kill()
            holder.proc.wait()
            ended[holder.id] = "killed"
            live.remove(holder)
            new()
        elif r < 0.8:
            # Hung: stopped, then revoked by epoch; it stays stopped a while.
            h, epoch = holder, grants[-1][0]
            h.signal(signal.SIGSTOP)
            rr = gfctl("lock", "revoke", "--lock", d.uri, "--epoch", str(epoch))
            assert rr.returncode == 0, rr.stderr
            ended[h.id] = "revoked"
            revoked.append(h)
            live.remove(h)
            new()
        for h in list(revoked):
            if rnd.random() < 0.3:
                h.signal(signal.SIGCONT)
    poll(0.5)
    for h in revoked:
        h.signal(signal.SIGCONT)
        assert h.proc.wait(timeout=20) == EXIT_LOST, f"revoked {h.id} did not report the loss"
    print(f"history: {len(grants)} grants, {len(revoked)} revocations")
    assert len(grants) >= 5 and revoked, (len(grants), len(revoked))
    epochs = [e for e, _ in grants]
    assert epochs == sorted(set(epochs))


# ---- boundaries ----

def test_epochs_stop_at_int64_max(tmp, procs):
    """An epoch past INT64_MAX would be stored negative and read back as a
    corrupt file (epochs then restart from the wall clock): the last epoch is
    INT64_MAX, after it a waiter is refused at once, and the file stays valid."""
    top = (1 << 63) - 1
    d = Lockd(tmp)
    with open(d.state, "w") as f:
        json.dump({"version": 1, "holder": None, "epoch": top - 1, "session_token": None}, f)
    d.start()
    procs.append(d)
    a = spawn(procs, d.uri, "a")
    assert a.wait_granted() == top
    a.kill()
    a.proc.wait()
    r = gfctl("lock", "acquire", "--lock", d.uri, "--id", "b", "--timeout", "5s", "--", "true")
    assert r.returncode not in (0, EXIT_TIMEOUT), r
    assert "INT64_MAX" in r.stderr
    assert status(d.uri)["epoch"] == top
    d.stop()
    d.start()  # the state file still reads back
    assert status(d.uri)["epoch"] == top
    assert "corrupt" not in d.logtext()


def state_file(d):
    with open(d.state) as f:
        return json.load(f)


def test_d8_state_file_cleared_on_release(tmp, procs):
    """The state file names the holder while it holds, and no holder once it
    is gone (a release or its death, no waiter), keeping the epoch; a server
    restarted on that file has no holder to wait for in its reconnect window,
    grants at once and never reuses the epoch."""
    d = start_lockd(procs, tmp, "--reconnect-window=30s")
    a = spawn(procs, d.uri, "a")
    e = a.wait_granted()
    st = state_file(d)
    assert st["holder"] == "a" and st["epoch"] == e
    a.kill()
    wait_until(lambda: state_file(d)["holder"] is None, 5, "the holder cleared from the state file")
    assert state_file(d)["epoch"] == e
    # A clean release (gfctl's CMD ends) clears it too.
    b = spawn(procs, d.uri, "b", cmd=["true"])
    assert b.wait_granted() == e + 1
    b.proc.wait(10)
    wait_until(lambda: state_file(d)["holder"] is None, 5, "the holder cleared after a release")
    assert state_file(d)["epoch"] == e + 1
    d.kill9()
    d.start()
    # No holder on record: no reconnect window to sit out (30 s here).
    c = spawn(procs, d.uri, "c")
    assert c.wait_granted(timeout=5) > e + 1
