#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Container entry point that makes a `vllm serve` a member of a
primary/standby pair.

    gf_vllm_supervisor.py --lock unix:///run/gf/lock.sock --id vllm-a --port 8000 -- \\
        vllm serve MODEL --port 8000 --enable-sleep-mode --worker-cls gf_worker.GfWorker

This process holds the lock (the connection is the lock) and is the parent
of vLLM: if vLLM dies, this process exits at once and the lock passes to the
standby; if this process dies, the kernel kills vLLM (PR_SET_PDEATHSIG).
Every member goes the same way: start vLLM (the worker maps or loads the
weights in the GMS, see gf_worker.py), wait until it is healthy, put it to
sleep (POST /sleep: the gpufailover backend unmaps the weights), wait for
the lock, wake it (POST /wake_up: remap at the same addresses), then report
ready by creating --ready-file (point the readiness probe at it, or at vLLM's
/health and /is_sleeping). A lost lock ends vLLM and this process (the
platform restarts the container as the next standby).

vLLM's /sleep and /wake_up exist with VLLM_SERVER_DEV_MODE=1, which this
supervisor sets for its child; keep that port private to the pod.

GPU-ONLY: vLLM itself needs a GPU; the supervisor runs anywhere.
"""
import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import gpufailover as gf

PR_SET_PDEATHSIG = 1


def log(event, **kv):
    fields = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in kv.items())
    sys.stderr.write(f"mono_us={time.monotonic_ns() // 1000} prog=gf-vllm-supervisor event={event} {fields}\n")
    sys.stderr.flush()


def die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(127)


def call(base, method, path, timeout):
    req = urllib.request.Request(base + path, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        return r.status, (json.loads(body) if body else None)


def wait_healthy(base, child, deadline):
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"vLLM exited with status {child.returncode} before it was healthy")
        try:
            if call(base, "GET", "/health", 2)[0] == 200:
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise TimeoutError("vLLM did not become healthy in time")


def main(argv=None):
    p = argparse.ArgumentParser(description="Run `vllm serve` as a member of a gpufailover primary/standby pair.")
    p.add_argument("--lock", required=True, help="lock server URI")
    p.add_argument("--id", required=True, help="this engine's id at the lock server")
    p.add_argument("--port", type=int, required=True, help="vLLM's HTTP port (as given to vllm serve)")
    p.add_argument("--startup-timeout", type=gf.parse_duration, default=1800.0,
                   help="how long vLLM may take to become healthy (default 30m)")
    p.add_argument("--call-timeout", type=gf.parse_duration, default=300.0,
                   help="how long /sleep and /wake_up may take (default 5m)")
    p.add_argument("--ready-file", help="created once this engine serves, removed on exit")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- vllm serve MODEL ...")
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("give the vLLM command after --")
    if not (1 <= a.port <= 65535):
        p.error("--port must be 1..65535")
    base = f"http://127.0.0.1:{a.port}"

    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    child = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)
    log("vllm_started", pid=child.pid)

    def end(status):
        if a.ready_file:
            try:
                os.unlink(a.ready_file)
            except FileNotFoundError:
                pass
        if child.poll() is None:
            child.kill()
        os._exit(status)

    def watch_child():
        # The lock must not outlive the engine: leave as soon as vLLM exits.
        code = child.wait()
        log("vllm_exited", status=code)
        end(1 if code == 0 else min(abs(code), 255) or 1)

    threading.Thread(target=watch_child, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))

    lock = gf.LockClient(a.lock, a.id)
    try:
        wait_healthy(base, child, time.monotonic() + a.startup_timeout)
        call(base, "POST", "/sleep?level=1", a.call_timeout)
        if not call(base, "GET", "/is_sleeping", a.call_timeout)[1].get("is_sleeping"):
            raise RuntimeError("vLLM says it is not sleeping after /sleep")
        log("standby")
        grant = lock.acquire()
        log("granted", epoch=grant.epoch)

        def lost(code, detail):
            log("lock_lost", code=code, detail=detail)
            end(1)

        lock.on_lost = lost
        lock.start_watch()
        status, body = call(base, "POST", "/wake_up", a.call_timeout)
        if status != 200 or (body or {}).get("status") != "awake":
            raise RuntimeError(f"vLLM did not wake: {body}")
        if a.ready_file:
            open(a.ready_file, "w").close()
        log("active", epoch=grant.epoch)
    except (gf.GpuFailoverError, OSError, RuntimeError, TimeoutError, urllib.error.URLError) as e:
        log("failed", error=type(e).__name__, detail=str(e))
        end(1)
    threading.Event().wait()


if __name__ == "__main__":
    sys.exit(main())
