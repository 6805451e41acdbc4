# SPDX-License-Identifier: Apache-2.0
"""Every rank fenced (issue 37): a holder registers its other processes
(gf_lock_add_pid(), pidfds over the unix socket) and the lock passes on only
once every one of them has exited. Real gf-lockd, gfctl and lock-helper
processes."""
import array
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_lock_integration import HELPER, alive, gfctl, spawn, start_lockd, status, wait_until  # noqa: E402,F401
from test_lock_integration import procs, tmp  # noqa: E402,F401  (fixtures)
from test_lock_hardening import _field, _frame, _read_frame  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402

# How long the rank outlives its holder. Long enough that a grant on the
# holder's exit alone would be seen; the machine may be slow, so the checks
# below wait for conditions, never for this time to pass.
RANK_LINGER_MS = 2000


class Holder:
    def __init__(self, uri, ident, when, linger_ms=RANK_LINGER_MS):
        self.proc = subprocess.Popen([HELPER, uri, ident, "rank", str(linger_ms), when],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith(f"granted id={ident}"), line
        line = self.proc.stdout.readline()
        assert line.startswith("rank="), line
        self.rank = int(line.split("=")[1])

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def cleanup(self):
        if self.proc.poll() is None:
            self.kill()
        try:
            os.kill(self.rank, signal.SIGKILL)
        except ProcessLookupError:
            pass


def scrape(port):
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


@pytest.mark.parametrize("when", ["before", "after"])
def test_slow_rank_holds_the_grant_back(tmp, procs, when):
    """The holder dies; its registered rank lives on for a while: the waiter is
    granted only once the rank has exited, and then at once. Registered before
    the acquire (sent with the connection) or after the grant (sent then)."""
    port = free_port()
    d = start_lockd(procs, tmp, "--exit-wait-timeout", "60s", "--metrics", f"127.0.0.1:{port}")
    h = Holder(d.uri, "a", when)
    try:
        wait_until(lambda: status(d.uri)["holder_pids"] == 1, 5, "the rank registered")
        st = status(d.uri)
        assert st["holder_info"]["pids"] == 1
        metrics = scrape(port)
        assert "gf_lock_holder_pids 1\n" in metrics, metrics
        assert 'gf_lock_engine_pids{id="a",role="holder"} 1\n' in metrics, metrics
        b = spawn(procs, d.uri, "b")
        wait_until(lambda: status(d.uri)["waiter_count"] == 1, 5, "b waiting")
        h.kill()
        # The holder is gone, its rank is not: the exit wait shows the rank.
        st = wait_until(lambda: (lambda s: s if s["holder"] is None else None)(status(d.uri)), 5, "holder gone")
        if alive(h.rank):
            assert st["exit_wait"] and st["exit_wait_processes"] == 1 and st["exit_wait_pids"] == [h.rank], st
            # A rendering is reused for a second: ask until it is a newer one (or the rank is gone).
            wait_until(lambda: "gf_lock_exit_wait_processes 1\n" in scrape(port) or not alive(h.rank), 5,
                       "the exit wait in /metrics")
        epoch = None
        while epoch is None:
            rank_alive = alive(h.rank)
            epoch = b.wait_granted(0.05)
            if epoch is not None:
                # Granted: the rank had exited before (it was dead when we last looked, or is now).
                assert not alive(h.rank)
                break
            if not rank_alive:
                # The rank is gone: the grant follows without the exit-wait timeout.
                epoch = b.wait_granted(10)
                assert epoch is not None, d.logtext()
        log = d.logtext()
        assert "holder disconnected; waiting for its" in log and f"pids={h.rank}" in log, log
        assert "exit-wait timeout" not in d.logtext()
    finally:
        h.cleanup()


def test_holder_exit_with_its_socket_kept_still_waits_for_the_rank(tmp, procs):
    """The holder's process exits while a forked child keeps its socket open:
    the lock is released on the exit, and still waits for the registered rank."""
    d = start_lockd(procs, tmp, "--exit-wait-timeout", "60s")
    p = subprocess.Popen([HELPER, d.uri, "a", "rank", str(RANK_LINGER_MS), "after", "fork-keep"],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("granted id=a")
    rank = int(p.stdout.readline().split("=")[1])
    child = int(p.stdout.readline().split("=")[1])
    try:
        b = spawn(procs, d.uri, "b")
        wait_until(lambda: status(d.uri)["waiter_count"] == 1, 5, "b waiting")
        p.kill()
        p.wait()
        assert alive(child)  # the socket stays open
        epoch = None
        while epoch is None:
            rank_alive = alive(rank)
            epoch = b.wait_granted(0.05)
            if epoch is not None:
                assert not alive(rank)
            elif not rank_alive:
                epoch = b.wait_granted(10)
                assert epoch is not None, d.logtext()
        assert "holder's process exited while its socket is still open" in d.logtext()
    finally:
        for pid in (rank, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_rank_that_exited_first_delays_nothing(tmp, procs):
    """A rank that exited before its holder leaves nothing to wait for."""
    d = start_lockd(procs, tmp, "--exit-wait-timeout", "60s")
    h = Holder(d.uri, "a", "before", linger_ms=0)
    try:
        b = spawn(procs, d.uri, "b")
        wait_until(lambda: status(d.uri)["waiter_count"] == 1, 5, "b waiting")
        os.kill(h.rank, signal.SIGKILL)
        wait_until(lambda: not alive(h.rank), 5, "rank gone")
        t0 = time.monotonic()
        h.kill()
        assert b.wait_granted(30) is not None
        assert time.monotonic() - t0 < 30
        assert "exit-wait timeout" not in d.logtext()
    finally:
        h.cleanup()


def test_explicit_release_waits_for_no_rank(tmp, procs):
    """gfctl's explicit release hands over at once; a registered rank does
    not matter then (the holder vouched for it). Revoke waits for none either."""
    d = start_lockd(procs, tmp, "--exit-wait-timeout", "60s")
    h = Holder(d.uri, "a", "after", linger_ms=60000)
    try:
        b = spawn(procs, d.uri, "b")
        wait_until(lambda: status(d.uri)["waiter_count"] == 1, 5, "b waiting")
        epoch = status(d.uri)["epoch"]
        assert gfctl("lock", "revoke", "--lock", d.uri, "--epoch", str(epoch)).returncode == 0
        assert b.wait_granted(10) is not None
        assert alive(h.rank)
    finally:
        h.cleanup()


def test_add_pid_errors():
    """Bad pids get clear errors at the call, before anything is sent."""
    r = subprocess.run([HELPER, "unix:///nonexistent/lock.sock", "a", "add-pid-errors"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=", 1) for line in r.stdout.split())
    assert got == {"zero": "GF_ERR_INVALID_ARG", "negative": "GF_ERR_INVALID_ARG", "dead": "GF_ERR_NOT_FOUND",
                   "self": "0", "again": "0", "toomany": "GF_ERR_TOO_BIG", "after_exit": "0",
                   "tcp": "GF_ERR_NOT_SUPPORTED", "etcd": "GF_ERR_NOT_SUPPORTED"}, r.stdout


def _hello(s, name):
    hello = _field(1, 1) + _field(2, 1) + _field(3, name.encode())
    s.sendall(_frame(_field(1, 1) + _field(10, hello)))
    assert _read_frame(s) is not None  # Welcome


def _add_pids(s, fds, count):
    # Msg{seq=2, lock_add_pids{count}} with @fds attached
    body = _field(1, 2) + _field(56, _field(1, count))
    s.sendmsg([_frame(body, nfds=len(fds))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def test_more_than_64_processes_is_dropped(tmp, procs):
    """The client library never registers more than 64 live processes: a
    peer that does is answered GF_ERR_TOO_BIG and closed, its pidfds with it."""
    d = start_lockd(procs, tmp)
    kids = [subprocess.Popen(["sleep", "600"]) for _ in range(65)]
    fds = [os.pidfd_open(k.pid) for k in kids]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(d.sock)
        _hello(s, "x")
        for i in range(0, 64, 16):
            _add_pids(s, fds[i:i + 16], 16)
        _add_pids(s, fds[64:], 1)
        body = _read_frame(s)
        assert body is not None and body[2] == (14 << 3 | 2), body  # Msg.error
        assert b"more than 64" in body, body
        assert _read_frame(s) is None  # closed
        assert gfctl("lock", "ping", "--lock", d.uri).returncode == 0
    finally:
        s.close()
        for f in fds:
            os.close(f)
        for k in kids:
            k.kill()
            k.wait()


@pytest.mark.parametrize("case", ["not-a-pidfd", "count-mismatch"])
def test_hostile_add_pids_is_dropped(tmp, procs, case):
    """A peer that sends something else than pidfds, or not the count it
    says, gets a protocol error and is closed; the server goes on serving."""
    d = start_lockd(procs, tmp)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(d.sock)
    _hello(s, "x")
    r, w = os.pipe()
    pidfd = os.pidfd_open(os.getpid())
    try:
        if case == "not-a-pidfd":
            _add_pids(s, [pidfd, r], 2)
        else:
            _add_pids(s, [pidfd], 2)
        body = _read_frame(s)
        assert body is not None and body[2] == (14 << 3 | 2), body  # Msg.error
        assert b"pidfd" in body, body
        assert _read_frame(s) is None  # closed
        # The fds went with it.
        if case == "not-a-pidfd":
            os.close(r)
            r = -1
            with pytest.raises(BrokenPipeError):
                os.write(w, b"x")
        assert gfctl("lock", "ping", "--lock", d.uri).returncode == 0
    finally:
        s.close()
        os.close(pidfd)
        os.close(w)
        if r >= 0:
            os.close(r)


def test_waiter_shows_its_registered_ranks(tmp, procs):
    """A standby registers its ranks while waiting: status shows them per waiter."""
    d = start_lockd(procs, tmp)
    a = spawn(procs, d.uri, "a")
    assert a.wait_granted(5)
    h = subprocess.Popen([HELPER, d.uri, "b", "rank", "0", "before"], stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: status(d.uri)["waiter_count"] == 1, 5, "b waiting")
        wait_until(lambda: status(d.uri)["waiters"][0]["pids"] == 1, 5, "b's rank registered")
    finally:
        h.kill()
        h.wait()
