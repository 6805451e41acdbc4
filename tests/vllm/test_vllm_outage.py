# SPDX-License-Identifier: Apache-2.0
"""Faults of the pair's servers under a vLLM pair on CPU (issue 39, items 3
and 6), with clients in a loop counting refused connections and failed
requests:

- gf-lockd (unix socket) down for 3x the members' lock reconnect time: the
  active keeps answering, the standby stays a standby, no connection is
  refused, and both reattach when gf-lockd returns (docs/design.md,
  decision 31);
- gf-gmsd with a WARM tier killed under the Active pair and restarted: it
  restores the weights and the standby serves the same tokens;
- gf-gmsd without a tier killed under an Active pair: the standby's wake
  gives up at once (the GMS said at connect it keeps no tier), well before
  its remap timeout, and the lock is free again.

Each member's tree is checked gone at the end. The helpers are those of
test_vllm_failover.py (Site, the model, the probes)."""
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time
import urllib.error

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_vllm_failover as base  # noqa: E402
from test_vllm_failover import (BACKEND, GMSD, LOCKD, PROMPTS, START_TIMEOUT, complete, live_in_group,  # noqa: E402
                                scaled, state, tail, wait_for, wait_state)

import gpufailover as gf  # noqa: E402

# The members' lock reconnect time: gf-lockd stays down for 3x as long.
RECONNECT_S = 2.0


class Site(base.Site):
    """test_vllm_failover's site, with gf-gmsd's tier options and a gf-lockd
    that can be killed and started again on the same state file."""

    def __init__(self, tmp, gmsd_extra=()):
        super().__init__(tmp)
        self.gmsd_extra = list(gmsd_extra)

    def lockd_argv(self):
        return [LOCKD, f"--listen={self.lock_uri}", f"--state-file={self.dir}/lock.state",
                "--reconnect-window=5s", "--exit-wait-timeout=10s", f"--listener=http=tcp://127.0.0.1:{self.port}"]

    def start_daemons(self, gmsds=1, exit_wait_s=10):
        self.lockd = self.spawn("gf-lockd", self.lockd_argv())
        self.daemons.append(self.lockd)
        for n in range(gmsds):
            self.gmsd(n)
        wait_for(lambda: self.ok(gf.lock_status, self.lock_uri), 10, "gf-lockd")

    def restart_lockd(self):
        self.lockd = self.spawn("gf-lockd-2", self.lockd_argv())
        self.daemons.append(self.lockd)
        wait_for(lambda: self.ok(gf.lock_status, self.lock_uri), 10, "gf-lockd back")

    def gmsd(self, n):
        p = self.spawn(f"gf-gmsd-{n}-{len(self.daemons)}", [GMSD, f"--listen={self.gms_uri(n)}", "--device=0",
                                                            f"--backend={BACKEND}", *self.gmsd_extra])
        self.daemons.append(p)
        wait_for(lambda: self.ok(gf.gms_status, self.gms_uri(n)), 30, "gf-gmsd")
        return p


class Clients:
    """@n clients, each sending the first prompt again and again on a new
    connection, counting what came back: answered (the reference tokens),
    refused (connection refused), failed (anything else: an error, a
    timeout, other tokens)."""

    def __init__(self, port, ref, n=2, timeout=None):
        self.port, self.ref, self.timeout = port, ref, timeout or scaled(60.0)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answered, self.refused, self.failed = 0, 0, []
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                out = complete(self.port, PROMPTS[0], timeout=self.timeout)
            except Exception as e:  # noqa: BLE001 - every outcome is counted
                out = e
            refused = isinstance(out, ConnectionRefusedError) or (
                isinstance(out, urllib.error.URLError) and isinstance(out.reason, ConnectionRefusedError))
            with self.lock:
                if out == self.ref:
                    self.answered += 1
                elif refused:
                    self.refused += 1
                    time.sleep(0.05)
                else:
                    self.failed.append((t0, time.monotonic(), repr(out)[:200]))

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(self.timeout + 30)
        return self

    def counts(self):
        with self.lock:
            return {"answered": self.answered, "refused": self.refused, "failed": len(self.failed)}


def engine_state(p):
    import json
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{p.probe}/state", timeout=2) as r:
        return json.loads(r.read())


def holder_and_waiters():
    def get(uri):
        s = gf.lock_status(uri)
        return s.get("holder"), [w.get("id") for w in s.get("waiters", [])]
    return get


def tier(status, name):
    """A tier's (or the tier operation's) entry of a GMS status."""
    return status.get(name) if name in status else (status.get("tiers") or {}).get(name)


def trees_gone(site):
    for p in site.servers:
        wait_for(lambda: not live_in_group(p.pid), 30, f"every process of {p.name} to exit")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return base.make_model(tmp_path_factory, "--tie")


@pytest.fixture(scope="module")
def warm_site(model):
    """gf-gmsd keeps a WARM tier; both members with the short lock reconnect time."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="gf-vllm-outage-", dir=shm) as d:
        warm = pathlib.Path(d) / "warm"
        warm.mkdir()
        site = Site(d, gmsd_extra=[f"--warm={warm}"])
        try:
            site.start_daemons()
            extra = ["--lock-reconnect-timeout", f"{RECONNECT_S:g}s"]
            a = site.server("vllm-a", "loader", model, extra=extra)
            wait_state(a, "active")
            b = site.server("vllm-b", "follower", model, extra=extra)
            wait_state(b, "standby")
            refs = {p: complete(site.port, p) for p in PROMPTS}
            yield {"site": site, "a": a, "b": b, "refs": refs}
        finally:
            site.stop()
            trees_gone(site)


def test_lock_server_outage_is_not_an_outage(warm_site):
    site, a, b, refs = warm_site["site"], warm_site["a"], warm_site["b"], warm_site["refs"]
    get = holder_and_waiters()
    # vllm-b reports standby before its acquire has queued it at the lock.
    wait_for(lambda: get(site.lock_uri) == ("vllm-a", ["vllm-b"]), scaled(30.0), "vllm-b queued behind vllm-a")
    epoch = gf.lock_status(site.lock_uri)["epoch"]
    clients = Clients(site.port, refs[PROMPTS[0]])
    wait_for(lambda: clients.counts()["answered"] >= 1, 120, "a first answer")
    site.lockd.send_signal(signal.SIGKILL)
    site.lockd.wait(10)
    t_down = time.monotonic()
    # Down for 3x the reconnect time: past it both members hold on.
    seen_unreachable = False
    while time.monotonic() - t_down < 3 * RECONNECT_S:
        assert a.poll() is None and b.poll() is None, f"a member exited:\n{tail(a)}\n{tail(b)}"
        assert state(a) == "active" and state(b) == "standby", (state(a), state(b))
        if time.monotonic() - t_down > RECONNECT_S + 0.5:
            s = engine_state(a)
            assert s["lock_server"] == "unreachable" and s["lock_server_unreachable_ms"] > RECONNECT_S * 1000, s
            seen_unreachable = True
        time.sleep(0.2)
    assert seen_unreachable
    during = clients.counts()
    site.restart_lockd()
    # Both reattach: the holder with its grant (and its listener handed
    # back), the standby in line again.
    wait_for(lambda: get(site.lock_uri) == ("vllm-a", ["vllm-b"]), scaled(30.0), "both members to reattach")
    wait_for(lambda: engine_state(a)["lock_server"] == "connected", scaled(10.0), "vllm-a connected")
    wait_for(lambda: engine_state(b)["lock_server"] == "connected", scaled(10.0), "vllm-b connected")
    status = gf.lock_status(site.lock_uri)
    assert not status.get("listeners_pending") and status["epoch"] == epoch, status
    time.sleep(1.0)  # answers after the return too
    counts = clients.finish().counts()
    print(f"\ngf-lockd down {3 * RECONNECT_S:g} s (reconnect time {RECONNECT_S:g} s): during the outage "
          f"{during}, in all {counts}")
    assert counts["refused"] == 0 and counts["failed"] == 0, (counts, clients.failed[:5])
    assert counts["answered"] > during["answered"] > 0, (during, counts)
    assert state(a) == "active" and state(b) == "standby"


def test_gms_with_a_warm_tier_restores_for_the_standby(warm_site):
    """gf-gmsd killed under the Active pair and started again (as its
    supervisor would): it restores from WARM, the active has died of its
    GMS's loss, the standby wakes onto the restored weights and answers the
    same tokens."""
    site, a, b, refs = warm_site["site"], warm_site["a"], warm_site["b"], warm_site["refs"]
    uri = site.gms_uri(0)
    wait_for(lambda: (tier(gf.gms_status(uri, 2), "warm") or {}).get("present"), scaled(60.0), "the WARM snapshot")
    gmsd = [p for p in site.daemons if p.name.startswith("gf-gmsd-0")][-1]
    clients = Clients(site.port, refs[PROMPTS[0]], timeout=scaled(120.0))
    wait_for(lambda: clients.counts()["answered"] >= 1, 120, "a first answer")
    t_kill = time.monotonic()
    gmsd.send_signal(signal.SIGKILL)
    gmsd.wait(10)
    site.gmsd(0)
    a.wait(scaled(60.0))
    wait_state(b, "active", scaled(120.0))
    first = time.monotonic() - t_kill
    for p in PROMPTS:
        assert complete(site.port, p) == refs[p], f"{p!r}: another answer after the restore"
    counts = clients.finish().counts()
    print(f"\ngf-gmsd (WARM) killed and restarted under the pair: the standby active {first:.1f} s after "
          f"the kill; clients {counts} (failed: {clients.failed[:3]})")
    assert counts["refused"] == 0, counts
    op = tier(gf.gms_status(uri, 2), "operation") or {}
    assert op.get("kind") == "restore" and op.get("phase") == "Restored", op
    wait_for(lambda: not live_in_group(a.pid), 30, "every process of vllm-a to exit")


def test_gms_without_a_tier_dies_standby_gives_up_at_once(model):
    """gf-gmsd without a tier killed under an Active pair: the active dies of
    its GMS's loss, the standby is granted, and its wake gives up at once
    (the GMS said it keeps no tier) instead of retrying for its remap
    timeout: its tree ends and the lock is free again, well before the
    remap timeout."""
    remap_s = scaled(60.0)
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="gf-vllm-notier-", dir=shm) as d:
        site = Site(d)
        try:
            site.start_daemons()
            extra = ["--remap-timeout", f"{remap_s:g}s"]
            a = site.server("vllm-a", "loader", model, extra=extra)
            wait_state(a, "active")
            b = site.server("vllm-b", "follower", model, extra=extra)
            wait_state(b, "standby")
            ref = complete(site.port, PROMPTS[0])
            clients = Clients(site.port, ref, timeout=scaled(30.0))
            wait_for(lambda: clients.counts()["answered"] >= 1, 120, "a first answer")
            gmsd = [p for p in site.daemons if p.name.startswith("gf-gmsd-0")][-1]
            t_kill = time.monotonic()
            gmsd.send_signal(signal.SIGKILL)
            gmsd.wait(10)
            a.wait(scaled(60.0))
            t_a = time.monotonic()
            b.wait(remap_s)
            t_b = time.monotonic()
            wait_for(lambda: gf.lock_status(site.lock_uri).get("holder") is None, scaled(30.0), "the lock free")
            t_free = time.monotonic()
            counts = clients.finish().counts()
            print(f"\ngf-gmsd (no tier) killed under the pair: active gone {t_a - t_kill:.1f} s, standby gone "
                  f"{t_b - t_kill:.1f} s, lock free {t_free - t_kill:.1f} s after the kill (remap timeout "
                  f"{remap_s:g} s); clients {counts}")
            log = b.log.read_text(errors="replace")
            assert "no residency tier" in log, tail(b)
            assert "event=granted" in log or "wake" in log
            # Well before the remap timeout: it did not wait for it.
            assert t_free - t_a < remap_s / 2, (t_a - t_kill, t_free - t_kill)
            assert counts["refused"] == 0, counts
        finally:
            site.stop()
            trees_gone(site)
