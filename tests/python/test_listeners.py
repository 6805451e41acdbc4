# SPDX-License-Identifier: Apache-2.0
"""Listeners carried by the lock, end to end: gf-lockd --listener, the
Python LockClient.listeners(), gfctl passing them to a command the way
systemd does, and gf-lockd taking its listener from socket activation."""
import os
import socket
import subprocess
import sys

import pytest

from conftest import BUILD, LOCKD, child_env, gf, wait_for

GFCTL = BUILD / "examples" / "gfctl" / "gfctl"


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)


def status(uri):
    return gf.lock_status(uri, 5.0)


def test_lock_client_listeners_serve_the_backlog(cluster):
    port = free_port()
    cluster.lockd(f"--listener=http=tcp://127.0.0.1:{port}")
    st = status(cluster.lock_uri)
    assert st["listeners"] == [f"http=tcp://127.0.0.1:{port}"] and st["listeners_pending"] == 0
    # Nobody holds the lock: the connection is not refused, it waits.
    early = socket.create_connection(("127.0.0.1", port), timeout=5)
    with gf.LockClient(cluster.lock_uri, "py-a") as a:
        with pytest.raises(gf.StateError):
            a.listeners()
        a.acquire(5)
        ls = a.listeners()
        assert list(ls) == ["http"]
        srv = ls["http"]
        assert isinstance(srv, socket.socket)
        assert srv.getsockname()[1] == port
        srv.settimeout(5)
        conn, _ = srv.accept()
        conn.sendall(b"a")
        conn.close()
        assert early.recv(1) == b"a"
        srv.close()
        # Each call gives new duplicates: closing ours left the grant's intact.
        again = a.listeners()["http"]
        assert again.getsockname()[1] == port
        again.close()
    early.close()


def test_tcp_lock_has_no_listeners():
    c = gf.LockClient("tcp://127.0.0.1:9", "py-tcp")
    with pytest.raises(gf.NotSupportedError, match="unix"):
        c.listeners()
    c.close()


SERVE_ONE = r"""
import os, socket, sys
assert os.environ["LISTEN_PID"] == str(os.getpid()), os.environ.get("LISTEN_PID")
n = int(os.environ["LISTEN_FDS"])
names = os.environ["LISTEN_FDNAMES"].split(":")
print("fds", n, "names", ",".join(names), flush=True)
s = socket.socket(fileno=3 + names.index("http"))
c, _ = s.accept()
c.sendall(b"served-by-cmd")
c.close()
"""


def test_gfctl_passes_listeners_like_systemd(cluster):
    port = free_port()
    cluster.lockd(f"--listener=http=tcp://127.0.0.1:{port}",
                  f"--listener=admin=unix://{cluster.dir}/admin.sock")
    early = socket.create_connection(("127.0.0.1", port), timeout=5)
    out = subprocess.run([str(GFCTL), "lock", "acquire", "--lock", cluster.lock_uri, "--id", "cmd", "--",
                          sys.executable, "-c", SERVE_ONE], capture_output=True, text=True, timeout=60,
                         env=child_env())
    assert out.returncode == 0, out.stderr
    assert "fds 2 names http,admin" in out.stdout
    early.settimeout(5)
    assert early.recv(64) == b"served-by-cmd"
    early.close()


def test_gfctl_without_listeners_clears_the_environment(cluster):
    cluster.lockd()
    env = child_env()
    env.update(LISTEN_FDS="1", LISTEN_FDNAMES="stale", LISTEN_PID="1")
    out = subprocess.run([str(GFCTL), "lock", "acquire", "--lock", cluster.lock_uri, "--id", "cmd", "--",
                          sys.executable, "-c", "import os; print(os.environ.get('LISTEN_FDS'))"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("None")


@pytest.mark.parametrize("arg,needle", [
    ("noequals", "NAME=URI"),
    ("=tcp://127.0.0.1:1", "NAME=URI"),
    ("a:b=tcp://127.0.0.1:1", "letters"),
    ("http=ftp://x", "http"),
])
def test_lockd_refuses_bad_listener(cluster, arg, needle):
    r = subprocess.run([str(LOCKD), f"--listen={cluster.lock_uri}", f"--listener={arg}"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2
    assert needle in r.stderr


def test_lockd_refuses_busy_listener_without_holder(cluster):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([str(LOCKD), f"--listen={cluster.lock_uri}", f"--listener=http=tcp://127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "listener 'http'" in r.stderr


ACTIVATE = r"""
import os, sys
os.dup2(int(sys.argv[1]), 3)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="http")
os.execv(sys.argv[2], sys.argv[2:])
"""


def test_lockd_takes_listener_from_socket_activation(cluster):
    """Under systemd the socket outlives gf-lockd: a restarted server gets the
    same socket back, with whatever waits in its backlog."""
    act = socket.socket()
    act.bind(("127.0.0.1", 0))
    act.listen()
    port = act.getsockname()[1]
    argv = [sys.executable, "-c", ACTIVATE, str(act.fileno()), str(LOCKD), f"--listen={cluster.lock_uri}",
            "--listener=http=tcp://127.0.0.1:1"]
    for round_ in range(2):
        log = open(f"{cluster.dir}/activated-{round_}.log", "wb")
        p = subprocess.Popen(argv, pass_fds=(act.fileno(),), stderr=log, env=child_env())
        wait_for(lambda: gf.lock_status(cluster.lock_uri, 0.2), what="activated gf-lockd")
        st = status(cluster.lock_uri)
        assert st["listeners"] == ["http=fd:3"], st
        early = socket.create_connection(("127.0.0.1", port), timeout=5)
        with gf.LockClient(cluster.lock_uri, f"act-{round_}") as c:
            c.acquire(5)
            srv = c.listeners()["http"]
            assert srv.getsockname()[1] == port
            srv.settimeout(5)
            conn, _ = srv.accept()
            conn.sendall(b"x")
            conn.close()
            srv.close()
        assert early.recv(1) == b"x"
        early.close()
        p.terminate()
        p.wait(10)
        log.close()
    act.close()
