# SPDX-License-Identifier: Apache-2.0
"""LockClient through a gf-lockd outage on a unix socket (docs/design.md,
decision 31): past its reconnect time the holder holds on, `unreachable`
says for how long, and the waiter keeps its place; both reattach when the
server returns on the same state file."""
import threading

from conftest import gf, wait_for

RECONNECT_S = 0.3


def test_holder_and_waiter_hold_on_through_an_outage(cluster):
    lockd = cluster.lockd()
    a = gf.LockClient(cluster.lock_uri, "a", reconnect_timeout=RECONNECT_S)
    lost = []
    a.on_lost = lambda code, detail: lost.append(detail)
    grant = a.acquire(timeout=5)
    a.start_watch()
    assert a.unreachable == 0.0
    b = gf.LockClient(cluster.lock_uri, "b", reconnect_timeout=RECONNECT_S)
    got = []
    t = threading.Thread(target=lambda: got.append(b.acquire(timeout=None)), daemon=True)
    t.start()
    wait_for(lambda: [w["id"] for w in gf.lock_status(cluster.lock_uri)["waiters"]] == ["b"], what="b waiting")
    lockd.kill()
    wait_for(lambda: a.unreachable > 3 * RECONNECT_S, what="a unreachable for 3x its reconnect time")
    assert a.held and a.epoch == grant.epoch and not lost
    assert t.is_alive() and b.unreachable > 3 * RECONNECT_S
    cluster.lockd()
    wait_for(lambda: gf.lock_status(cluster.lock_uri)["holder"] == "a" and a.unreachable == 0.0, what="a back")
    wait_for(lambda: [w["id"] for w in gf.lock_status(cluster.lock_uri)["waiters"]] == ["b"] and b.unreachable == 0.0,
             what="b back in line")
    assert a.held and a.epoch == grant.epoch and not lost
    a.release()
    t.join(10)
    assert got and got[0].epoch > grant.epoch
    b.release()
