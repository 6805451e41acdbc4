# SPDX-License-Identifier: Apache-2.0
"""Engine(lock_secret=) against a real gf-lockd on tcp://127.0.0.1 that
requires a shared secret (--secret-file): the right secret is granted, a
wrong or missing one raises PermissionError from acquire(), and bad
arguments are refused at construction."""
import socket

import pytest

import gpufailover as gf
from conftest import LOCKD, wait_for

SECRET = b"py-engine-secret-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tcp_lock(cluster):
    secret_file = f"{cluster.dir}/lock.secret"
    with open(secret_file, "wb") as f:
        f.write(SECRET + b"\n")  # gf-lockd drops the trailing newline
    uri = f"tcp://127.0.0.1:{free_port()}"
    cluster.spawn("gf-lockd-tcp", [LOCKD, f"--listen={uri}", f"--state-file={cluster.dir}/tcp-lock.state",
                                   f"--secret-file={secret_file}", "--exit-wait-timeout=0s",
                                   "--reconnect-window=0s"])
    wait_for(lambda: gf.lock_ping(uri, 0.2, secret=SECRET) is None, what="gf-lockd on tcp")
    cluster.gmsd(0)
    return uri


def standby(cluster, uri, engine_id, role, **kw):
    eng = gf.Engine(uri, engine_id, [cluster.gms_uri()], backend="host", role=role, **kw)
    eng.init_weights(load=(lambda dev, g: g.commit()) if role == "loader" else None)
    eng.sleep()
    return eng


def test_engine_with_the_secret_is_granted_others_are_refused(cluster, tcp_lock):
    holder = standby(cluster, tcp_lock, "py-holder", "loader", lock_secret=SECRET)
    assert holder.acquire(10) > 0
    assert holder.state == "waking"
    st = gf.lock_status(tcp_lock, 5, secret=SECRET)
    assert st["holder"] == "py-holder"

    wrong = standby(cluster, tcp_lock, "py-wrong", "follower", lock_secret=b"not-the-secret")
    with pytest.raises(gf.PermissionError):
        wrong.acquire(10)
    assert wrong.state == "standby"
    missing = standby(cluster, tcp_lock, "py-missing", "follower")
    with pytest.raises(PermissionError, match="secret"):
        missing.acquire(10)
    assert missing.state == "standby"
    # The holder goes: the next with the secret (bytes-like works as bytes do) is granted.
    other = standby(cluster, tcp_lock, "py-other", "follower", lock_secret=bytearray(SECRET))
    holder.close()
    assert other.acquire(10) > 0
    assert gf.lock_status(tcp_lock, 5, secret=SECRET)["holder"] == "py-other"
    for e in (other, missing, wrong):
        e.close()


@pytest.mark.parametrize("value, exc, match", [
    ("a-str-secret", TypeError, "lock_secret must be bytes"),
    (42, TypeError, "lock_secret must be bytes"),
    (b"", ValueError, "lock_secret is empty"),
])
def test_bad_lock_secret(value, exc, match):
    with pytest.raises(exc, match=match):
        gf.Engine("tcp://127.0.0.1:1", "e", ["unix:///nonexistent/g"], backend="host", lock_secret=value)


def test_rank_engine_takes_no_secret():
    with pytest.raises(gf.StateError, match="holds no lock"):
        gf.Engine(None, "e", ["unix:///nonexistent/g"], backend="host", rank=1, lock_secret=SECRET)


def test_admin_calls_take_secret_none(cluster):
    """secret=None is "no secret", as the stubs say, on every call that takes
    one (a unix lock server needs none); a str is a TypeError, not encoded."""
    cluster.lockd()
    uri = cluster.lock_uri
    gf.lock_ping(uri, 2.0, secret=None)
    assert gf.lock_status(uri, 2.0, secret=None)["holder"] is None
    gf.LockClient(uri, "py-none", secret=None).close()
    with pytest.raises(gf.GpuFailoverError):
        gf.lock_evict(uri, "nobody", 2.0, secret=None)
    for call in (lambda: gf.lock_ping(uri, 2.0, secret="text"), lambda: gf.lock_status(uri, 2.0, secret=1),
                 lambda: gf.LockClient(uri, "py-str", secret="text")):
        with pytest.raises(TypeError, match="secret must be bytes or None"):
            call()
