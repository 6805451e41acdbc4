# SPDX-License-Identifier: Apache-2.0
"""Hardening of the etcd lock against other etcd writers and bad luck (issue
28), against real etcd members the tests start: a holder whose key is deleted
or whose lease is revoked reports the loss at once; a stopped gfctl's command
ends before the lease can pass on; nested lock names do not block each other;
a lease-less key planted in a lock's prefix is reported."""
import base64
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from test_etcd_lock import (ETCD, Proc, cluster, env, epoch_of, field, gfctl, gfctl_acquire, helper,  # noqa: E402,F401
                            post, status, wait_until, wait_waiters)

import pytest  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd-server not installed")


def b64(s):
    return base64.b64encode(s.encode()).decode()


def keys(c, prefix):
    """{key: kv} under @prefix, as etcd holds them."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    out = post(c.members[0].cport, "/v3/kv/range", {"key": b64(prefix), "range_end": b64(end)})
    return {base64.b64decode(kv["key"]).decode(): kv for kv in out.get("kvs", [])}


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def lines_until_lost(p, timeout):
    out = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ln = p.line(max(0.01, end - time.monotonic()))
        if ln is None:
            break
        out.append(ln)
        if ln.startswith("lost"):
            break
    return out


@pytest.mark.parametrize("how", ["delete", "revoke"])
def test_holder_notices_its_key_gone_at_once(env, how):
    """Issue 28.8: the holder's key deleted by another etcd writer, or its
    lease revoked: the holder reports the loss because its key is gone (not
    at the next keepalive, not never) and stops acting."""
    c = cluster(env, 1)
    uri = c.uri("gone", 30)  # keepalives every 5 s: far from "at once"
    a = helper(env, uri, "a", "hold")
    ea = epoch_of(a, 10)
    assert a.wait_line("act", 5)
    b = helper(env, uri, "b", "hold")
    wait_waiters(uri, 1)
    (key, kv), = [(k, v) for k, v in keys(c, "/gf-test/gone/").items() if int(v["create_revision"]) == ea]
    if how == "delete":
        post(c.members[0].cport, "/v3/kv/deleterange", {"key": b64(key)})
    else:
        post(c.members[0].cport, "/v3/lease/revoke", {"ID": str(int(kv["lease"]))})
    eb = epoch_of(b, 10)
    assert eb > ea
    got = lines_until_lost(a, 4)
    assert got and got[-1].startswith("lost"), got
    assert "key was deleted" in got[-1], got[-1]
    lost_t = int(field(got[-1], "t"))
    time.sleep(0.5)
    later = []
    while (ln := a.line(0.05)) is not None:
        later.append(ln)
    assert not [ln for ln in later if ln.startswith("act") and int(field(ln, "t")) > lost_t + 100000], later
    assert status(uri)["holder"] == "b"


def test_stopped_gfctl_guard_ends_command(env):
    """Issue 28.9: `gfctl lock acquire -- CMD` on an etcd lease, gfctl stopped:
    the guard ends CMD's group before the lease can pass on."""
    c = cluster(env, 1)
    uri = c.uri("guard", 2)
    pidfile = os.path.join(env["tmp"], "cmd.pid")
    a = gfctl_acquire(env, uri, "a", "--heartbeat", "300ms", "--fence", "1s", "--", "sh", "-c",
                      f"echo $$ > {pidfile}; exec sleep 1000")
    epoch_of(a, 10)
    cmd_pid = int(wait_until(lambda: os.path.exists(pidfile) and open(pidfile).read().strip(), 5, "CMD"))
    b = gfctl_acquire(env, uri, "b")
    wait_waiters(uri, 1)
    assert alive(cmd_pid)
    a.signal(signal.SIGSTOP)
    epoch_of(b, 10)
    assert not alive(cmd_pid), "CMD still ran when the next holder was granted"
    a.signal(signal.SIGCONT)
    assert a.proc.wait(10) == 4


def test_nested_lock_names_are_separate_locks(env):
    """Issue 28.13: locks named x and x/sub (keys under x/ and x/sub/) neither
    block each other nor show up in each other's status."""
    c = cluster(env, 1)
    outer, inner = c.uri("x", 5), c.uri("x/sub", 5)
    a = helper(env, inner, "inner-holder", "hold")
    epoch_of(a, 10)
    b = helper(env, outer, "outer-holder", "once")
    ln = b.wait_line("", 10)
    assert ln and ln.startswith("granted id=outer-holder"), ln
    a2 = helper(env, outer, "outer-holder2", "hold")
    epoch_of(a2, 10)
    st = status(outer)
    assert st["holder"] == "outer-holder2" and st["waiter_count"] == 0, st
    st = status(inner)
    assert st["holder"] == "inner-holder" and st["waiter_count"] == 0, st
    # Held both ways round: the inner lock is not behind the outer one either.
    b2 = helper(env, inner, "inner-2", "once")
    ln = b2.wait_line("", 10)
    assert ln and ln.startswith("error GF_ERR_TIMEOUT"), ln


def test_lease_less_key_is_reported(env):
    """Issue 28.13: a key without a lease planted in a lock's prefix by another
    etcd writer would hold the lock for ever: the waiter says so, naming the
    key and how to remove it, and is granted once it is deleted."""
    c = cluster(env, 1)
    uri = c.uri("planted", 5)
    key = "/gf-test/planted/deadbeef"
    post(c.members[0].cport, "/v3/kv/put", {"key": b64(key), "value": b64("squatter")})
    r = gfctl("lock", "acquire", "--lock", uri, "--id", "a", "--timeout", "3s")
    assert r.returncode == 3, r.stderr
    assert "without a lease" in r.stderr and key in r.stderr and "etcdctl del" in r.stderr, r.stderr
    a = gfctl_acquire(env, uri, "a")
    wait_until(lambda: status(uri)["waiter_count"] == 1, 10, "a waiting behind the planted key")
    post(c.members[0].cport, "/v3/kv/deleterange", {"key": b64(key)})
    epoch_of(a, 10)


def test_password_file_path_percent_encoded(env):
    """Issue 30.6: the URI's parameters are percent-decoded (libcurl's URL
    API), so a password-file= path holding '&', '=' or '%' can be written."""
    import shutil
    import subprocess
    import urllib.parse
    c = cluster(env, 1)
    ep = f"127.0.0.1:{c.members[0].cport}"
    ctl = [shutil.which("etcdctl") or "etcdctl", f"--endpoints={ep}"]
    envv = dict(os.environ, ETCDCTL_API="3")
    for args in (["user", "add", "root:s3cret", "--interactive=false"], ["auth", "enable"]):
        r = subprocess.run(ctl + args, capture_output=True, text=True, env=envv, timeout=20)
        assert r.returncode == 0, r.stderr
    d = os.path.join(env["tmp"], "a&b=c%d")
    os.mkdir(d)
    pw = os.path.join(d, "pw&x=1%25")
    with open(pw, "w") as f:
        f.write("s3cret\n")
    uri = c.uri("auth", 3) + "&user=root&password-file=" + urllib.parse.quote(pw, safe="/")
    a = gfctl_acquire(env, uri, "a")
    assert epoch_of(a, 10) > 0
    # Undecodable or NUL-bearing parameters are refused with the reason.
    for bad in ("&user=ro%00ot", "&password-file=%zz"):
        r = gfctl("lock", "ping", "--lock", c.uri("auth", 3) + bad, "--timeout", "1s")
        assert r.returncode != 0 and "etcd" in r.stderr, (bad, r.stderr)


@pytest.mark.parametrize("ident", ["a", "ab", "abc", "a+b/c~d:e.f-g_h"])
def test_ids_round_trip_through_base64(env, ident):
    """Issue 30.6: keys and values travel base64-encoded (OpenSSL's codec):
    ids of every padding length and with '+', '/' come back as written."""
    c = cluster(env, 1)
    uri = c.uri("b64", 3)
    a = gfctl_acquire(env, uri, ident)
    epoch_of(a, 10)
    assert status(uri)["holder"] == ident
