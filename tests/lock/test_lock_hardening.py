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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, timeout=5.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def engine_state(probe):
    try:
        return json.loads(get(probe, "/state", 1)[1]).get("state", "").lower()
    except (OSError, ValueError, http.client.HTTPException):
        return None


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
    from test_lock_integration import Contender, tcp_lockd
    procs = []
    try:
        d, port, secret = tcp_lockd(procs, tmp)
        uri = f"tcp://127.0.0.1:{port}"
        pidfile = os.path.join(tmp, "cmd.pid")
        a = Contender(uri, "a", "--secret-file", secret, "--heartbeat", "100ms", "--fence", "300ms",
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
