# SPDX-License-Identifier: Apache-2.0
"""The --metrics HTTP face of gf-lockd and gf-gmsd (examples/common/sidecar_http.c)
against floods and slow clients: connections over the limit, opened and
closed, must never wedge it (/metrics, /status, /ready answer again), one
source must not take every slot, and slow connections from the probes' own
address must not keep the probes out."""
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

LOCKD = os.environ.get("GF_LOCKD", "build/examples/gf-lockd/gf-lockd")
GMSD = os.environ.get("GF_GMSD", "build/examples/gf-gmsd/gf-gmsd")

CONN_LIMIT = 32   # sidecar_http.c HTTP_CONN_LIMIT
PER_IP_LIMIT = 8  # sidecar_http.c HTTP_PER_IP_LIMIT
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from timing import scaled  # noqa: E402

HANG_GUARD = scaled(30.0)  # seconds: a bound against hangs, never a speed claim (GF_TEST_TIMEOUT_SCALE)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)


def get(port, path, timeout=3.0):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def connect_from(src, port):
    """A TCP connection from source address @src (any 127.x.y.z is this host)."""
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(HANG_GUARD)
    s.connect(("127.0.0.1", port))
    return s


@pytest.fixture(params=["lock", "gms"])
def daemon(request):
    tmp = tempfile.mkdtemp(prefix="gf-sidecar-http-")
    port = free_port()
    if request.param == "lock":
        argv = [LOCKD, "--listen", f"unix://{tmp}/s.sock"]
        paths = ["/metrics", "/status", "/ready"]
    else:
        argv = [GMSD, "--listen", f"unix://{tmp}/s.sock", "--backend", "host"]
        paths = ["/metrics", "/status"]
    p = subprocess.Popen(argv + ["--metrics", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    end = time.monotonic() + HANG_GUARD
    while get(port, "/status", 0.5) != 200:
        assert p.poll() is None and time.monotonic() < end, "the daemon's HTTP never answered"
        time.sleep(0.05)
    yield port, paths
    p.terminate()
    p.wait(timeout=20)
    subprocess.run(["rm", "-rf", tmp])


def answers(port, paths):
    # /ready answers 503 without a holder: any HTTP answer is an answer.
    return {path: get(port, path) for path in paths}


def test_connections_over_the_limit_never_wedge_it(daemon):
    port, paths = daemon
    # Spread over sources so the total limit, not the per-source one, is met.
    for n in (CONN_LIMIT + 1, 2 * CONN_LIMIT, CONN_LIMIT + 1):
        conns = [connect_from(f"127.0.0.{2 + i % 8}", port) for i in range(n)]
        time.sleep(0.2)
        for s in conns:
            s.close()
        got = answers(port, paths)
        assert all(code is not None for code in got.values()), f"after {n} connections: {got}"


def closed_by_server(s):
    try:
        return s.recv(64) == b""
    except ConnectionResetError:
        return True


def test_one_source_cannot_take_every_slot(daemon):
    port, paths = daemon
    slow = [connect_from("127.0.0.2", port) for _ in range(PER_IP_LIMIT)]
    try:
        # One connection over the per-source limit is let in and answered;
        # the source's oldest, still unfinished, makes room for it.
        extra = connect_from("127.0.0.2", port)
        extra.sendall(b"GET /status HTTP/1.0\r\n\r\n")
        assert extra.recv(64).startswith(b"HTTP/1."), "the newest connection answered"
        extra.close()
        assert closed_by_server(slow[0])
        # A source holding every other slot (slow clients that send
        # nothing) leaves the others served.
        slow += [connect_from("127.0.0.2", port) for _ in range(CONN_LIMIT - PER_IP_LIMIT)]
        got = answers(port, paths)
        assert all(code is not None for code in got.values()), got
    finally:
        for s in slow:
            s.close()
    got = answers(port, paths)
    assert all(code is not None for code in got.values()), got


def test_slow_flood_from_the_probers_address(daemon):
    """Forty-five slow (half-sent) connections from 127.0.0.1, the address
    the probes and scrapes below come from: each still answered (once
    libmicrohttpd's own per-address limit refused them: connection reset)."""
    port, paths = daemon
    slow = []
    try:
        for _ in range(45):
            s = connect_from("127.0.0.1", port)
            s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        got = answers(port, paths)
        assert all(code is not None for code in got.values()), got
        assert closed_by_server(slow[0])
    finally:
        for s in slow:
            s.close()
