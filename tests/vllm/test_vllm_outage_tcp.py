# SPDX-License-Identifier: Apache-2.0
"""A vLLM pair on a gf-lockd across TCP (tcp://127.0.0.1:PORT, a shared
secret from --secret-file given to both members with --lock-secret-file),
and that gf-lockd gone for good (issue 39 item 3, "across TCP, the lease
behaviour as documented"; docs/design.md, decision 31):

- the holder reports the lock lost without its server once T_fence has
  passed since it last heard it, or its reconnect time if that is shorter,
  and its whole tree ends (the loss policy): run once with a holder's
  reconnect time shorter than T_fence and once with a longer one;
- the standby, a waiter that cannot reach the server, gives up after its
  reconnect time: its wake fails and its tree ends too.

A TCP grant carries no listening socket, so the members run without
--listener: each binds vLLM's own --port once granted (distinct ports).
Clients in a loop on the active's port count what they get; no process of
either tree may be left. The helpers are those of test_vllm_failover.py and
test_vllm_outage.py."""
import os
import re
import signal
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_vllm_failover as base  # noqa: E402
from test_vllm_failover import (BACKEND, KV_BYTES, LOCKD, PROMPTS, complete, free_port, live_in_group,  # noqa: E402
                                scaled, state, tail, wait_for, wait_state)
from test_vllm_outage import Clients  # noqa: E402

import gpufailover as gf  # noqa: E402

RECONNECT_S = 2.0  # the standby's --lock-reconnect-timeout (and the holder's in the first run)
# gf-lockd's lease: heartbeat 1 s, T_detect 6 s, so T_fence (told at the grant) 3 s.
T_FENCE_S = 3.0
SECRET = b"vllm-tcp-outage-secret-0123456789"


class TcpSite(base.Site):
    """A gf-lockd on tcp://127.0.0.1 that requires SECRET, one gf-gmsd."""

    def __init__(self, tmp):
        super().__init__(tmp)
        self.lock_uri = f"tcp://127.0.0.1:{free_port()}"
        self.secret_file = self.dir / "lock.secret"
        self.secret_file.write_bytes(SECRET + b"\n")
        self.secret_file.chmod(0o600)

    def start_daemons(self, gmsds=1, exit_wait_s=10):
        self.lockd = self.spawn("gf-lockd", [
            LOCKD, f"--listen={self.lock_uri}", f"--state-file={self.dir}/lock.state",
            f"--secret-file={self.secret_file}", "--reconnect-window=5s", "--heartbeat=1s", "--detect-timeout=6s"])
        self.daemons.append(self.lockd)
        for n in range(gmsds):
            self.gmsd(n)
        wait_for(lambda: self.status() is not None, 10, "gf-lockd on tcp")

    def status(self):
        try:
            return gf.lock_status(self.lock_uri, 0.5, secret=SECRET)
        except gf.GpuFailoverError:
            return None

    def tcp_server(self, name, role, model, port, reconnect_s):
        """One member, as base.Site.server() makes it but without --listener:
        it binds 127.0.0.1:@port once granted."""
        probe = free_port()
        p = self.spawn(name, [
            self.gf_vllm, "serve", model, "--served-model-name", "tiny", "--dtype", "float32",
            "--max-model-len", "256", "--kv-cache-memory-bytes", KV_BYTES, "--disable-log-stats",
            "--host", "127.0.0.1", "--port", port,
            "--lock", self.lock_uri, "--lock-secret-file", self.secret_file,
            "--lock-reconnect-timeout", f"{reconnect_s:g}s", "--gms", self.gms_uri(0), "--id", name,
            "--role", role, "--probe-port", probe, "--probe-address", "127.0.0.1", "--backend", BACKEND])
        p.probe, p.started, p.port = probe, time.monotonic(), port
        self.servers.append(p)
        return p


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return base.make_model(tmp_path_factory, "--tie")


@pytest.mark.parametrize("holder_reconnect_s", [RECONNECT_S, 5.0], ids=["reconnect-below-T_fence",
                                                                         "reconnect-above-T_fence"])
def test_tcp_lock_server_gone_lease_rules(model, holder_reconnect_s):
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="gf-vllm-tcp-", dir=shm) as d:
        site = TcpSite(d)
        try:
            site.start_daemons()
            a = site.tcp_server("vllm-a", "loader", model, free_port(), holder_reconnect_s)
            wait_state(a, "active")
            b = site.tcp_server("vllm-b", "follower", model, free_port(), RECONNECT_S)
            wait_state(b, "standby")
            wait_for(lambda: (site.status() or {}).get("waiters"), scaled(30.0), "vllm-b in line")
            st = site.status()
            assert st["holder"] == "vllm-a" and [w.get("id") for w in st["waiters"]] == ["vllm-b"], st
            # The secret is on no command line of either tree.
            for p in (a, b):
                for pid in live_in_group(p.pid):
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            assert SECRET not in f.read(), f"the secret on the command line of {pid}"
                    except FileNotFoundError:
                        pass
            ref = complete(a.port, PROMPTS[0])
            clients = Clients(a.port, ref, timeout=scaled(30.0))
            wait_for(lambda: clients.counts()["answered"] >= 1, scaled(120.0), "a first answer")

            site.lockd.send_signal(signal.SIGKILL)
            site.lockd.wait(10)
            t_kill = time.monotonic()
            before = clients.counts()
            # The holder: lock lost, its tree ended by the loss policy. The
            # standby: gives up after its reconnect time, its wake fails.
            ended = {}
            end = time.monotonic() + scaled(60.0)
            while len(ended) < 2 and time.monotonic() < end:
                for p in (a, b):
                    if p.name not in ended and p.poll() is not None:
                        ended[p.name] = time.monotonic()
                time.sleep(0.05)
            assert len(ended) == 2, (ended, tail(a), tail(b))
            t_a, t_b = ended["vllm-a"], ended["vllm-b"]
            wait_for(lambda: not live_in_group(a.pid), scaled(30.0), "every process of vllm-a to exit")
            wait_for(lambda: not live_in_group(b.pid), scaled(30.0), "every process of vllm-b to exit")
            counts = clients.finish().counts()
            log_a, log_b = a.log.read_text(errors="replace"), b.log.read_text(errors="replace")
            lost = re.search(r'reconnecting" id=vllm-a epoch=\d+ reason="[^"]*" reconnect_ms=(\d+)', log_a)
            print(f"\ngf-lockd (tcp://) killed under the pair, reconnect time of the holder {holder_reconnect_s:g} s, "
                  f"of the standby {RECONNECT_S:g} s, T_fence "
                  f"{T_FENCE_S:g} s: holder's reconnect budget {lost and lost.group(1)} ms, vllm-a gone "
                  f"{t_a - t_kill:.1f} s, vllm-b gone {t_b - t_kill:.1f} s after the kill; clients before the "
                  f"kill {before}, in all {counts} (failed: {clients.failed[:3]})")

            # The holder kept trying for min(reconnect time, T_fence since it
            # last heard the server), then reported the loss; the loss policy
            # ended its tree.
            assert lost, tail(a)
            assert int(lost.group(1)) <= min(holder_reconnect_s, T_FENCE_S) * 1000, lost.group(0)
            assert re.search(r"GF_ERR_LOCK_LOST|lock lost|LOCK_LOST", log_a, re.I), tail(a)
            assert re.search(r"event=dead reason=", log_a), tail(a)
            # The standby was never granted; it gave up once it could not
            # reach the server for its reconnect time (not before).
            assert "event=active" not in log_b, tail(b)
            assert re.search(r'event=exit status=1 reason="wake failed: .*not reachable for '
                             rf'{int(RECONNECT_S * 1000)}ms', log_b), tail(b)
            assert t_b - t_kill >= RECONNECT_S
            assert state(a) is None and state(b) is None
            assert before["answered"] >= 1 and counts["answered"] >= before["answered"]
        finally:
            site.stop()
            for p in site.servers:
                wait_for(lambda: not live_in_group(p.pid), 30, f"every process of {p.name} to exit")
