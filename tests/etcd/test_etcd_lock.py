# SPDX-License-Identifier: Apache-2.0
"""The lock on etcd against real etcd members (Debian's etcd-server) that the
tests start on loopback ports in temporary directories: FIFO, clean hand-off,
holder SIGKILL and SIGSTOP, leader SIGKILL, quorum loss, restart from the
data dir, endpoint failover, status/ping, and a randomized history."""
import json
import os
import random
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

GFCTL = os.environ.get("GF_GFCTL", "build/examples/gfctl/gfctl")
HELPER = os.environ.get("GF_ETCD_HELPER", "build/tests/etcd/etcd-helper")
ETCD = shutil.which("etcd") or "/usr/bin/etcd"

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd-server not installed")

# libcurl honours proxy variables; the members are on loopback.
for _v in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
    os.environ.pop(_v, None)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)


def wait_until(cond, timeout=10.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def post(port, path, body, timeout=2.0):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Member:
    def __init__(self, tmp, name):
        self.name = name
        self.cport, self.pport = free_port(), free_port()
        self.dir = os.path.join(tmp, name)
        self.log = os.path.join(tmp, name + ".log")
        self.proc = None
        self.cluster = None
        self.tls = None  # (ca, cert, key): HTTPS with client certificates

    def start(self):
        args = [ETCD, "--name", self.name, "--data-dir", self.dir,
                "--listen-client-urls", f"http://127.0.0.1:{self.cport}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.cport}",
                "--listen-peer-urls", f"http://127.0.0.1:{self.pport}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.pport}",
                "--initial-cluster", self.cluster, "--initial-cluster-state", "new",
                "--heartbeat-interval", "50", "--election-timeout", "500"]
        if self.tls:
            ca, cert, key = self.tls
            args = [a.replace(f"http://127.0.0.1:{self.cport}", f"https://127.0.0.1:{self.cport}") for a in args]
            args += ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(self.log, "a"),
                                     start_new_session=True)
        return self

    def healthy(self):
        ctx, scheme = None, "http"
        if self.tls:
            import ssl
            ctx = ssl.create_default_context(cafile=self.tls[0])
            ctx.load_cert_chain(self.tls[1], self.tls[2])
            scheme = "https"
        try:
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.cport}/health", timeout=1, context=ctx) as r:
                return json.loads(r.read()).get("health") == "true"
        except OSError:
            return False

    def is_leader(self):
        try:
            st = post(self.cport, "/v3/maintenance/status", {}, timeout=1)
            return st.get("leader") == st["header"]["member_id"]
        except (OSError, KeyError, ValueError):
            return False

    def signal(self, sig):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.proc.wait()


class Cluster:
    def __init__(self, tmp, n):
        self.members = [Member(tmp, f"m{i}") for i in range(n)]
        spec = ",".join(f"{m.name}=http://127.0.0.1:{m.pport}" for m in self.members)
        for m in self.members:
            m.cluster = spec

    def start(self):
        for m in self.members:
            m.start()
        wait_until(lambda: all(m.healthy() for m in self.members), 30, "etcd members healthy")
        return self

    def uri(self, name, ttl, order=None):
        ms = order or self.members
        return "etcd://" + ",".join(f"127.0.0.1:{m.cport}" for m in ms) + f"/gf-test/{name}?ttl={ttl}"

    def leader(self):
        return wait_until(lambda: next((m for m in self.members if m.is_leader()), None), 15, "a leader")

    def stop(self):
        for m in self.members:
            if m.proc and m.proc.poll() is None:
                m.signal(signal.SIGCONT)
            m.kill9()


class Proc:
    """A contender: `gfctl lock acquire` or the test helper."""

    def __init__(self, argv):
        # Unbuffered: the selector must see every line that has not been read.
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                     bufsize=0)
        self.pid = self.proc.pid
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def line(self, timeout):
        if not self.sel.select(timeout):
            return None
        return self.proc.stdout.readline().decode() or None

    def wait_line(self, prefix, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ln = self.line(max(0.01, end - time.monotonic()))
            if ln is None and self.proc.poll() is not None:
                break
            if ln and ln.startswith(prefix):
                return ln
        return None

    def signal(self, sig):
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def cleanup(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


def field(line, name):
    for tok in line.split():
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    raise AssertionError(f"no {name} in {line!r}")


@pytest.fixture
def env():
    tmp = tempfile.mkdtemp(prefix="gf-etcd-it-")
    state = {"tmp": tmp, "clusters": [], "procs": []}
    yield state
    for p in state["procs"]:
        p.cleanup()
    for c in state["clusters"]:
        c.stop()
    shutil.rmtree(tmp)


def cluster(env, n):
    c = Cluster(env["tmp"], n)
    env["clusters"].append(c)
    return c.start()


def gfctl_acquire(env, uri, ident, *extra):
    p = Proc([GFCTL, "lock", "acquire", "--lock", uri, "--id", ident] + list(extra))
    env["procs"].append(p)
    return p


def helper(env, uri, ident, *args):
    p = Proc([HELPER, uri, ident] + list(args))
    env["procs"].append(p)
    return p


def gfctl(*args, timeout=15):
    return subprocess.run([GFCTL] + list(args), capture_output=True, text=True, timeout=timeout)


def status(uri):
    r = gfctl("lock", "status", "--lock", uri, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def stories(env):
    """What each contender said on stderr (they are stopped first, so the read
    cannot block), for a failure's message."""
    out = []
    for p in env["procs"]:
        p.cleanup()
        err = p.proc.stderr.read().decode(errors="replace")
        out.append(f"--- {' '.join(p.proc.args[1:])} (exit {p.proc.returncode}):\n{err[-6000:]}")
    return "\n".join(out)


def member_log(m):
    with open(m.log, errors="replace") as f:
        return "\n--- etcd log (tail):\n" + "".join(f.readlines()[-40:])


def epoch_of(p, timeout):
    ln = p.wait_line("granted", timeout)
    assert ln, f"not granted; stderr: {p.proc.stderr.read().decode() if p.proc.poll() is not None else ''}"
    return int(field(ln, "epoch"))


def wait_waiters(uri, n):
    wait_until(lambda: status(uri)["waiter_count"] == n, 10, f"{n} waiters")


# ---- single member ----

def test_uri_errors():
    for bad in ["etcd://", "etcd:///x", "etcd://127.0.0.1/x", "etcd://127.0.0.1:2379", "etcd://127.0.0.1:0/x",
                "etcd://127.0.0.1:2379/x?ttl=0", "etcd://127.0.0.1:2379/x?bogus=1",
                "etcd://127.0.0.1:2379/x?cacert=/etc/hosts", "etcd://a:1,,b:2/x"]:
        r = gfctl("lock", "status", "--lock", bad, "--timeout", "1s")
        assert r.returncode != 0 and "etcd" in r.stderr, (bad, r.stderr)


def test_ping_status_unreachable(env):
    port = free_port()
    r = gfctl("lock", "ping", "--lock", f"etcd://127.0.0.1:{port}/x", "--timeout", "1s")
    assert r.returncode != 0 and "UNREACHABLE" in r.stderr, r.stderr


def test_fifo_clean_handoff_status(env):
    c = cluster(env, 1)
    uri = c.uri("fifo", 3)
    assert gfctl("lock", "ping", "--lock", uri).returncode == 0
    assert status(uri)["holder"] is None
    a = gfctl_acquire(env, uri, "a")
    ea = epoch_of(a, 10)
    ws = []
    for i, name in enumerate(["b", "c", "d"]):
        ws.append(gfctl_acquire(env, uri, name))
        wait_waiters(uri, i + 1)
    st = status(uri)
    assert st["holder"] == "a" and st["epoch"] == ea
    assert [w["id"] for w in st["waiters"]] == ["b", "c", "d"]
    prev, holder = ea, a
    for w in ws:
        holder.signal(signal.SIGTERM)  # clean release: the lease is revoked
        t0 = time.monotonic()
        e = epoch_of(w, 5)
        # Far below the 3 s TTL: the release woke the next waiter.
        assert time.monotonic() - t0 < 2.0
        assert e > prev
        assert status(uri)["holder"] == w.proc.args[6]
        holder.proc.wait(5)
        assert holder.proc.returncode == 0
        prev, holder = e, w
    holder.signal(signal.SIGTERM)
    holder.proc.wait(5)
    wait_until(lambda: status(uri)["holder"] is None, 5, "lock free")


def test_holder_sigkill_next_after_ttl(env):
    c = cluster(env, 1)
    uri = c.uri("kill", 2)
    a = gfctl_acquire(env, uri, "a")
    ea = epoch_of(a, 10)
    b = gfctl_acquire(env, uri, "b")
    wait_waiters(uri, 1)
    a.signal(signal.SIGKILL)
    t0 = time.monotonic()
    eb = epoch_of(b, 10)
    waited = time.monotonic() - t0
    # The lease (2 s) runs out: not before TTL minus one keepalive interval.
    assert waited >= 2.0 - 0.4, waited
    assert eb > ea


def test_stopped_holder_past_ttl_loses_and_never_acts(env):
    c = cluster(env, 1)
    uri = c.uri("stop", 2)
    a = helper(env, uri, "a", "hold")
    ea = epoch_of(a, 10)
    assert a.wait_line("act", 5)
    b = gfctl_acquire(env, uri, "b")
    wait_waiters(uri, 1)
    a.signal(signal.SIGSTOP)
    t_stop = time.monotonic()
    eb = epoch_of(b, 10)
    assert eb > ea
    assert time.monotonic() - t_stop >= 1.5
    time.sleep(0.3)
    a.signal(signal.SIGCONT)
    lines = []
    while True:
        ln = a.line(2.0)
        if ln is None:
            break
        lines.append(ln)
    # Lines written before the stop may still be in the pipe: only those
    # timed after the stop count.
    after = [ln for ln in lines if int(field(ln, "t")) / 1e6 > t_stop + 0.05]
    assert any(ln.startswith("lost") for ln in after), lines
    assert not any(ln.startswith("act") for ln in after), after
    assert status(uri)["holder"] == "b"


def test_restart_from_data_dir_epochs_increase(env):
    c = cluster(env, 1)
    uri = c.uri("restart", 2)
    a = gfctl_acquire(env, uri, "a")
    ea = epoch_of(a, 10)
    a.signal(signal.SIGTERM)
    a.proc.wait(5)
    m = c.members[0]
    m.kill9()
    m.start()
    wait_until(m.healthy, 30, "member back")
    b = gfctl_acquire(env, uri, "b")
    eb = epoch_of(b, 15)
    assert eb > ea


def test_waiter_survives_member_restart(env):
    c = cluster(env, 1)
    uri = c.uri("wrestart", 3)
    a = gfctl_acquire(env, uri, "a", "--reconnect-timeout", "20s")
    epoch_of(a, 10)
    b = gfctl_acquire(env, uri, "b", "--reconnect-timeout", "20s")
    wait_waiters(uri, 1)
    m = c.members[0]
    m.kill9()
    time.sleep(0.5)
    m.start()
    wait_until(m.healthy, 30, "member back")
    # The holder may have lost (an outage past T_fence) and the waiter reached
    # the head of the line before its own keepalive got through again; it
    # must stay in line, not give up (test_first_in_line_confirms_its_lease).
    # Allowed: the clients' reconnect window (20 s) plus the TTL.
    try:
        wait_until(lambda: status(uri)["holder"] in ("a", "b"), 25, "a holder again")
    except AssertionError as ex:
        raise AssertionError(f"{ex}; status {status(uri)}\n" + stories(env) + member_log(m)) from None


class KeepaliveCutter:
    """A loopback TCP relay to one member that, while cut(), drops every
    connection that carries a lease keepalive: a client behind it can still
    queue, read and watch, but cannot renew its lease."""

    MARK = b"POST /v3/lease/keepalive "

    def __init__(self, port):
        self.target = port
        self.ls = socket.create_server(("127.0.0.1", 0))
        self.port = self.ls.getsockname()[1]
        self.blocking = threading.Event()
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, on):
        (self.blocking.set if on else self.blocking.clear)()

    def _accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(c,), daemon=True).start()

    def _relay(self, c):
        try:
            u = socket.create_connection(("127.0.0.1", self.target), timeout=2)
        except OSError:
            c.close()
            return
        u.settimeout(None)
        sel = selectors.DefaultSelector()
        sel.register(c, selectors.EVENT_READ, u)
        sel.register(u, selectors.EVENT_READ, c)
        tail = b""
        try:
            while True:
                for key, _ in sel.select(0.2):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    if key.fileobj is c:
                        seen = tail + data
                        tail = seen[-len(self.MARK):]
                        if self.blocking.is_set() and self.MARK in seen:
                            self.dropped += 1
                            return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            c.close()
            u.close()

    def close(self):
        self.ls.close()


def test_first_in_line_confirms_its_lease(env):
    """A waiter whose keepalives have not got through for longer than T_fence
    reaches the head of the line: it renews its lease before taking the lock,
    and while it cannot, it stays in line (within its reconnect window)
    instead of turning the grant down."""
    c = cluster(env, 1)
    m = c.members[0]
    uri = c.uri("confirm", 6)
    cutter = KeepaliveCutter(m.cport)
    try:
        a = gfctl_acquire(env, uri, "a")
        ea = epoch_of(a, 10)
        b_uri = f"etcd://127.0.0.1:{cutter.port}/gf-test/confirm?ttl=6"
        b = gfctl_acquire(env, b_uri, "b", "--heartbeat", "500ms", "--fence", "2s", "--reconnect-timeout", "20s")
        wait_waiters(uri, 1)
        cutter.cut(True)
        # Past b's T_fence (2 s) with no keepalive answered, well within its
        # lease (6 s from the last one that was).
        time.sleep(2.5)
        assert cutter.dropped > 0
        a.signal(signal.SIGTERM)
        a.proc.wait(5)
        # b is first in line now but cannot confirm its lease: not granted, and
        # still waiting (before the fix it exited 5: "granted but no
        # keepalive answered within T_fence").
        assert b.wait_line("granted", 1.0) is None
        assert b.proc.poll() is None, stories(env)
        assert status(uri)["holder"] == "b"  # its key is the oldest; it has not acted
        cutter.cut(False)
        eb = epoch_of(b, 5)
        assert eb > ea
        # Granted with its fence ahead of it: it keeps the lock.
        time.sleep(3)
        assert b.proc.poll() is None, stories(env)
        assert status(uri)["holder"] == "b"
    finally:
        cutter.close()


def test_guard_window_at_the_smallest_ttl(env):
    """`gfctl lock acquire -- CMD` at ttl=1 (the smallest accepted; T_fence
    500 ms): gfctl, partitioned from etcd and then stopped just before it
    could see the loss, has CMD killed by its guard half a T_fence after its
    last beat, before the lease runs out and the next holder starts. The
    guard once waited half of --fence's default (1.5 s) whatever the lease,
    and CMD went on acting after the next grant."""
    c = cluster(env, 1)
    cutter = KeepaliveCutter(c.members[0].cport)
    act, started = os.path.join(env["tmp"], "a.act"), os.path.join(env["tmp"], "b.start")
    writer = ("import sys, time\n"
              "while True:\n"
              "    with open(sys.argv[1], 'a') as f:\n"
              "        f.write(f'{time.monotonic()}\\n')\n"
              "    time.sleep(0.005)\n")
    try:
        a = gfctl_acquire(env, f"etcd://127.0.0.1:{cutter.port}/gf-test/guard?ttl=1", "a", "--",
                          sys.executable, "-c", writer, act)
        ea = epoch_of(a, 10)
        b_uri = c.uri("guard", 1)
        b = gfctl_acquire(env, b_uri, "b", "--", sys.executable, "-c",
                          "import sys, time; open(sys.argv[1], 'w').write(str(time.monotonic()))", started)
        wait_waiters(b_uri, 1)
        wait_until(lambda: os.path.exists(act), 10, "a's command acting")
        cutter.cut(True)
        time.sleep(0.25)  # keepalives fail; T_fence (500 ms from the last answered) has not passed
        a.signal(signal.SIGSTOP)
        eb = epoch_of(b, 10)
        assert eb > ea
        wait_until(lambda: os.path.exists(started) and os.path.getsize(started) > 0, 10, "b's command started")
        with open(started) as f:
            t_b = float(f.read())
        with open(act) as f:
            last_a = float(f.read().split()[-1])
        assert last_a < t_b, f"a's command acted {last_a - t_b:.3f} s after b's started\n{stories(env)}"
        a.signal(signal.SIGCONT)
        a.proc.wait(10)
        err = a.proc.stderr.read().decode()
        assert "guard window 250 ms (half of T_fence 500 ms)" in err, err
    finally:
        cutter.close()


def test_short_fence_warned_at_start(env):
    """The lease rule, T_fence >= 5 x the cluster's election timeout, is
    checked where it can be: against etcd's default election timeout (1 s),
    which a client cannot ask the cluster about. ttl=2 (T_fence 1 s) is
    warned about once, at the start; the default ttl=10 (T_fence 5 s) is not."""
    c = cluster(env, 1)
    for ttl, warned in ((2, True), (10, False)):
        r = subprocess.run([GFCTL, "lock", "acquire", "--lock", c.uri(f"rule{ttl}", ttl), "--id", "a", "--", "true"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        said = "T_fence is below 5 x etcd's default election timeout (1000 ms)" in r.stderr
        assert said == warned, (ttl, r.stderr)
        if warned:
            assert "fence_ms=1000 max_election_timeout_ms=200" in r.stderr, r.stderr
            assert r.stderr.count("T_fence is below") == 1, r.stderr


class RevokeCutter(KeepaliveCutter):
    """Drops lease revocations on their way to etcd: the releasing holder
    gets no answer."""
    MARK = b"POST /v3/lease/revoke "


def test_unanswered_revoke_is_not_confirmed(env):
    """A release whose lease revoke gets no answer says "not confirmed", not
    "failed": etcd may have applied it. Here it did not, so the next holder
    comes when the lease expires."""
    c = cluster(env, 1)
    cutter = RevokeCutter(c.members[0].cport)
    cutter.cut(True)
    try:
        uri = c.uri("revoke", 2)
        b = gfctl_acquire(env, uri, "b")
        epoch_of(b, 10)
        a = gfctl_acquire(env, f"etcd://127.0.0.1:{cutter.port}/gf-test/revoke?ttl=2", "a")
        wait_waiters(uri, 1)
        b.signal(signal.SIGTERM)
        epoch_of(a, 10)
        a.signal(signal.SIGTERM)
        a.proc.wait(20)
        err = a.proc.stderr.read().decode()
        assert cutter.dropped > 0
        assert "etcd lease revoke not confirmed" in err, err
        assert "revoke failed" not in err, err
    finally:
        cutter.close()


# ---- three members ----

def test_cluster_leader_sigkill_keeps_lock(env):
    c = cluster(env, 3)
    leader = c.leader()
    order = [leader] + [m for m in c.members if m is not leader]
    # The holder talks to the leader first, so it also has to move.
    uri = c.uri("leader", 6, order)
    a = helper(env, uri, "a", "hold")
    ea = epoch_of(a, 15)
    b = gfctl_acquire(env, c.uri("leader", 6, order[::-1]), "b")
    wait_until(lambda: status(c.uri("leader", 6, order[1:]))["waiter_count"] == 1, 10, "b waiting")
    leader.kill9()
    t0 = time.monotonic()
    # Longer than the TTL: the lease must have been renewed through the others.
    while time.monotonic() - t0 < 8:
        ln = a.line(0.5)
        assert ln is None or not ln.startswith("lost"), ln
    assert b.line(0) is None
    st = status(c.uri("leader", 6, order[1:]))
    assert st["holder"] == "a" and st["epoch"] == ea


def test_cluster_stopped_member_endpoint_failover(env):
    c = cluster(env, 3)
    m0, m1, m2 = c.members
    uri = c.uri("failover", 6, [m0, m1, m2])
    a = helper(env, uri, "a", "hold")
    ea = epoch_of(a, 15)
    b = gfctl_acquire(env, c.uri("failover", 6, [m1, m2, m0]), "b")
    wait_until(lambda: status(c.uri("failover", 6, [m1, m2]))["waiter_count"] == 1, 10, "b waiting")
    # m0 stops answering (its sockets stay open): the holder's requests to it
    # time out and it moves on, renewing through m1/m2 for longer than the TTL.
    m0.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 8:
        ln = a.line(0.5)
        assert ln is None or not ln.startswith("lost"), ln
    assert b.line(0) is None
    st = status(c.uri("failover", 6, [m1, m2]))
    assert st["holder"] == "a" and st["epoch"] == ea
    # Killed, the holder's lease (kept alive through m1/m2) runs out and b,
    # waiting through m1, gets the lock.
    a.signal(signal.SIGKILL)
    m0.signal(signal.SIGCONT)
    assert epoch_of(b, 15) > ea


def test_cluster_quorum_lost_reports_within_fence(env):
    c = cluster(env, 3)
    uri = c.uri("quorum", 6)
    a = helper(env, uri, "a", "hold")
    epoch_of(a, 15)
    assert a.wait_line("act", 5)
    t0 = time.monotonic()
    c.members[1].signal(signal.SIGSTOP)
    c.members[2].signal(signal.SIGSTOP)
    ln = a.wait_line("lost", 15)
    assert ln, "no loss reported"
    dt = int(field(ln, "t")) / 1e6 - t0
    # Default T_fence is TTL/2 = 3 s from the last answered keepalive (sent at
    # most TTL/6 = 1 s before the stop); the lease cannot expire before
    # TTL - 1 s = 5 s after the stop.
    assert dt < 5.0, dt
    assert dt > 1.5, dt
    assert "T_fence" in ln
    # Quorum back: the lost holder, still running, does not renew its lease
    # again, so a new contender gets the lock once that lease has run out.
    c.members[1].signal(signal.SIGCONT)
    c.members[2].signal(signal.SIGCONT)
    b = gfctl_acquire(env, uri, "b", "--reconnect-timeout", "30s")
    eb = epoch_of(b, 6 + 15)
    assert a.proc.poll() is None
    assert eb > 0 and status(uri)["holder"] == "b"


def test_cluster_fifo_and_kill(env):
    c = cluster(env, 3)
    uris = [c.uri("cfifo", 3, c.members[i:] + c.members[:i]) for i in range(3)]
    a = gfctl_acquire(env, uris[0], "a")
    ea = epoch_of(a, 15)
    b = gfctl_acquire(env, uris[1], "b")
    wait_waiters(uris[0], 1)
    d = gfctl_acquire(env, uris[2], "d")
    wait_waiters(uris[0], 2)
    a.signal(signal.SIGTERM)
    eb = epoch_of(b, 5)
    assert eb > ea
    b.signal(signal.SIGKILL)
    t0 = time.monotonic()
    ed = epoch_of(d, 10)
    assert ed > eb and time.monotonic() - t0 >= 3.0 - 0.6


# ---- randomized history ----

def test_randomized_history(env):
    rnd = random.Random(int(os.environ.get("GF_LOCK_SEED", "4242")))
    c = cluster(env, 1)
    uri = c.uri("history", 2)
    target = int(os.environ.get("GF_ETCD_HISTORY_GRANTS", "500"))
    live = []
    n = [0]
    grants, ends = {}, {}
    killed_at = {}

    def new():
        n[0] += 1
        p = helper(env, uri, f"h{n[0]}", "loop", "100000", "8")
        p.id = f"h{n[0]}"
        p.cur = None
        live.append(p)

    for _ in range(4):
        new()
    sel = selectors.DefaultSelector()
    for p in live:
        sel.register(p.proc.stdout, selectors.EVENT_READ, p)
    kills = 0
    deadline = time.monotonic() + 150
    while len(grants) < target and time.monotonic() < deadline:
        for key, _ in sel.select(0.2):
            p = key.data
            ln = p.proc.stdout.readline().decode()
            if not ln:
                sel.unregister(p.proc.stdout)
                continue
            e, t = int(field(ln, "epoch")), int(field(ln, "t")) / 1e6
            if ln.startswith("granted"):
                assert e not in grants, f"epoch {e} granted twice"
                grants[e] = (t, p.id)
                p.cur = e
            elif ln.startswith("end"):
                ends[e] = t
                p.cur = None
        r = rnd.random()
        if r < 0.004 and kills < 6:
            v = rnd.choice(live)
            v.signal(signal.SIGKILL)
            v.proc.wait()
            kills += 1
            if v.cur is not None:
                killed_at[v.cur] = time.monotonic()
            live.remove(v)
            new()
            sel.register(live[-1].proc.stdout, selectors.EVENT_READ, live[-1])
        elif r < 0.01:
            v = rnd.choice(live)
            v.signal(signal.SIGSTOP)
            time.sleep(rnd.uniform(0.01, 0.2))
            v.signal(signal.SIGCONT)
    for p in live:
        assert p.proc.poll() is None, p.proc.stderr.read().decode()
    print(f"history: {len(grants)} grants, {kills} kills, {n[0]} contenders")
    assert len(grants) >= target, len(grants)
    order = sorted(grants)
    # Grants come in epoch order, and every window [grant, end] closes before
    # the next one opens (a killed holder's window closes at the kill).
    for prev, cur in zip(order, order[1:]):
        t_prev, id_prev = grants[prev]
        t_cur, id_cur = grants[cur]
        assert t_cur > t_prev, (prev, cur)
        end = ends.get(prev, killed_at.get(prev))
        if end is None:
            continue  # the last lines of a killed helper may be lost with it
        assert end < t_cur, f"epoch {prev} ({id_prev}) held until {end} but {cur} ({id_cur}) granted at {t_cur}"


# ---- authentication and errors ----

def test_auth_password_from_file(env):
    c = cluster(env, 1)
    ep = f"127.0.0.1:{c.members[0].cport}"
    ctl = [shutil.which("etcdctl") or "etcdctl", f"--endpoints={ep}"]
    envv = dict(os.environ, ETCDCTL_API="3")
    for args in (["user", "add", "root:s3cret", "--interactive=false"], ["auth", "enable"]):
        r = subprocess.run(ctl + args, capture_output=True, text=True, env=envv, timeout=20)
        assert r.returncode == 0, r.stderr
    pw = os.path.join(env["tmp"], "pw")
    with open(pw, "w") as f:
        f.write("s3cret\n")
    bad = os.path.join(env["tmp"], "bad")
    with open(bad, "w") as f:
        f.write("wrong\n")
    uri = c.uri("auth", 3) + "&user=root&password-file=" + pw
    # Without a password, with a wrong one: refused, never granted.
    r = gfctl("lock", "acquire", "--lock", c.uri("auth", 3), "--id", "x", "--timeout", "3s")
    assert r.returncode != 0 and "granted" not in r.stdout, r.stdout
    r = gfctl("lock", "acquire", "--lock", c.uri("auth", 3) + "&user=root", "--id", "x", "--timeout", "3s",
              "--secret-file", bad)
    assert r.returncode == 6 and "PERMISSION" in r.stderr, r.stderr
    a = gfctl_acquire(env, uri, "a")
    ea = epoch_of(a, 10)
    # The password also comes from gfctl's --secret-file (never from argv).
    b = gfctl_acquire(env, c.uri("auth", 3) + "&user=root", "b", "--secret-file", pw)
    wait_until(lambda: json.loads(gfctl("lock", "status", "--lock", uri, "--json").stdout)["waiter_count"] == 1,
               10, "b waiting")
    a.signal(signal.SIGTERM)
    assert epoch_of(b, 5) > ea


def test_acquire_unreachable(env):
    r = gfctl("lock", "acquire", "--lock", f"etcd://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/x", "--id", "a",
              "--reconnect-timeout", "1s", "--timeout", "20s")
    assert r.returncode == 5 and "UNREACHABLE" in r.stderr, (r.returncode, r.stderr)


def make_certs(d):
    def ossl(*a):
        subprocess.run(["openssl"] + list(a), check=True, capture_output=True, timeout=60)

    p = lambda n: os.path.join(d, n)
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", p("ca.key"), "-out", p("ca.crt"), "-days", "2",
         "-subj", "/CN=gf-test-ca")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        with open(p(name + ".ext"), "w") as f:
            f.write(ext + "\n")
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", p(name + ".key"), "-out", p(name + ".csr"),
             "-subj", "/CN=" + name)
        ossl("x509", "-req", "-in", p(name + ".csr"), "-CA", p("ca.crt"), "-CAkey", p("ca.key"), "-CAcreateserial",
             "-out", p(name + ".crt"), "-days", "2", "-extfile", p(name + ".ext"))
    return p


@pytest.mark.skipif(not shutil.which("openssl"), reason="openssl not installed")
def test_tls_client_certificates(env):
    p = make_certs(env["tmp"])
    c = Cluster(env["tmp"], 1)
    c.members[0].tls = (p("ca.crt"), p("server.crt"), p("server.key"))
    env["clusters"].append(c)
    c.start()
    base = f"etcds://127.0.0.1:{c.members[0].cport}/gf-test/tls?ttl=3&cacert={p('ca.crt')}"
    uri = base + f"&cert={p('client.crt')}&key={p('client.key')}"
    # No client certificate: the member refuses the handshake.
    r = gfctl("lock", "acquire", "--lock", base, "--id", "x", "--timeout", "3s", "--reconnect-timeout", "2s")
    assert r.returncode != 0 and "granted" not in r.stdout
    # Plain HTTP to a TLS member does not get through either.
    r = gfctl("lock", "ping", "--lock", f"etcd://127.0.0.1:{c.members[0].cport}/gf-test/tls", "--timeout", "2s")
    assert r.returncode != 0
    assert gfctl("lock", "ping", "--lock", uri).returncode == 0
    a = gfctl_acquire(env, uri, "a")
    ea = epoch_of(a, 10)
    b = gfctl_acquire(env, uri, "b")
    wait_waiters(uri, 1)
    a.signal(signal.SIGTERM)
    assert epoch_of(b, 5) > ea


def test_python_bindings_unchanged(env):
    pydir = os.environ.get("GF_PYTHON_DIR", "build/bindings/python")
    if not os.path.isdir(os.path.join(pydir, "gpufailover")):
        pytest.skip("python bindings not built")
    c = cluster(env, 1)
    uri = c.uri("py", 3)
    code = f"""
import sys
sys.path.insert(0, {pydir!r})
import gpufailover as gf
a = gf.LockClient({uri!r}, "pa")
g = a.acquire(timeout=10)
assert a.held and a.epoch == g.epoch > 0
b = gf.LockClient({uri!r}, "pb")
try:
    b.acquire(timeout=0.3)
    raise SystemExit("pb granted while pa holds")
except gf.TimeoutError:
    pass
assert gf.lock_status({uri!r})["holder"] == "pa"
a.release()
assert not a.held
g2 = b.acquire(timeout=5)
assert g2.epoch > g.epoch, (g2.epoch, g.epoch)
print("ok", g.epoch, g2.epoch)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr


def test_command_inherits_no_socket(env):
    c = cluster(env, 1)
    r = gfctl("lock", "acquire", "--lock", c.uri("exec", 2), "--id", "a", "--", "sh", "-c", "ls -l /proc/$$/fd")
    assert r.returncode == 0, r.stderr
    assert "granted" in r.stdout and "socket:" not in r.stdout, r.stdout


def test_timeout_zero_tries_once(env):
    c = cluster(env, 1)
    uri = c.uri("once", 3)
    r = subprocess.run([HELPER, uri, "a", "once"], capture_output=True, text=True, timeout=30)
    assert r.stdout.startswith("granted"), r.stdout + r.stderr
    h = gfctl_acquire(env, uri, "h")
    epoch_of(h, 10)
    t0 = time.monotonic()
    r = subprocess.run([HELPER, uri, "b", "once"], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "error GF_ERR_TIMEOUT", r.stdout + r.stderr
    assert time.monotonic() - t0 < 5
    # The single try left the line: nobody waits behind the holder.
    wait_until(lambda: status(uri)["waiter_count"] == 0, 5, "no waiter left")


def test_typed_query_checks_the_fence_proof(env):
    """The typed holder query on etcd: holder and epoch as fields, and the
    grant's fence proof (derived from its lease) checked; a forged one is not."""
    c = cluster(env, 1)
    uri = c.uri("proof", 5)
    r = subprocess.run([HELPER, uri, "a", "proof"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    epoch = int(re.search(r"epoch=(\d+)", lines[0]).group(1))
    assert lines[1] == f"holder a epoch {epoch} pid 0 proof 1", r.stdout
    assert lines[2] == f"holder a epoch {epoch} pid 0 proof 0", r.stdout
