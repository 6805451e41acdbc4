#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The vLLM failover as a user times it, step by step, against its floor and
a cold start measured in the same run (vLLM's CPU build, the tiny model of
examples/vllm; tests/bench/report.py's `vllm` section runs it).

One lock server with a listener and one GMS; a loader serves, a follower
stands by. Each run SIGKILLs the active server, the API server alone or
the whole process tree (the kinds alternate), asks the same prompt through
the lock's listener and reads the steps from the logs (every line carries
mono_us, the same clock as here):

  exit_seen    the lock server saw the holder's process exit (the worker)
  granted      the standby's engine got the lock
  remapped     its KV region backed and its weights remapped
  kv_ready     its worker handed vLLM the KV cache and the listening socket
  serving      its uvicorn (started before the grant) accepts on the socket
  first_token  the client's first streamed token

A new follower then stands by for the next run. The floor: (a) SIGKILL of
a whole tree -> the last of its processes exited (pidfds, the whole-tree
runs), plus (b) the time to first token of a warm server for the same
prompt. Also the resident memory of the standby tree against the active
one, and a cold start (a fresh lock server and an empty GMS, process start
to first token). Prints a table; --json writes the figures. Nothing here
judges a speed."""
import argparse
import json
import os
import pathlib
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

SOURCE = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SOURCE / "examples" / "vllm"))
import demo  # noqa: E402  (the demo's lock server, GMS and servers: the same setup)

STEPS = ("exit_seen", "granted", "remapped", "kv_ready", "serving", "first_token")
KINDS = ("api_server", "tree")
WARM_SAMPLES = 3
LINE = re.compile(r"mono_us=(\d+) .*?event=(\w+)")


def log_events(path: pathlib.Path) -> "list[tuple[int, str, str]]":
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = LINE.search(line)
        if m:
            out.append((int(m.group(1)), m.group(2), line))
    return out


def first_after(evs: "list[tuple[int, str, str]]", event: str, t_us: int, needle: str = "") -> "int | None":
    return next((t for t, e, line in evs if e == event and t >= t_us and needle in line), None)


def group_pids(pgid: int) -> "list[int]":
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = pathlib.Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                pids.append(int(d))
    return pids


def tree_memory(pgid: int) -> "dict[str, int]":
    """Resident and proportional set size of a process group, summed (PSS
    splits the weights both trees map from the GMS between them)."""
    rss = pss = 0
    for pid in group_pids(pgid):
        try:
            for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return {"rss_bytes": rss, "pss_bytes": pss}


class ExitWatch:
    """pidfds of every process of a group, opened before the kill; ``last``
    is when the last of them exited (time.monotonic())."""

    def __init__(self, pgid: int) -> None:
        self.fds = []
        for pid in group_pids(pgid):
            try:
                self.fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                pass
        self.last = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        left = list(self.fds)
        while left:
            ready, _, _ = select.select(left, [], [])
            self.last = time.monotonic()
            left = [fd for fd in left if fd not in ready]

    def wait(self, timeout: float) -> float:
        self.thread.join(timeout)
        for fd in self.fds:
            os.close(fd)
        if self.thread.is_alive():
            raise RuntimeError(f"the killed tree's processes were still there {timeout:g} s after the kill")
        return self.last


def wait_log(p: Any, events: "list[str]", timeout: float = 600) -> None:
    """Until server @p's log has every one of @events (a standby is ready
    for a failover once its engine waits for the lock and its uvicorn has
    started, not when its probe first says standby)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        have = {e for _, e, _ in log_events(p.log)}
        if have.issuperset(events):
            return
        if p.poll() is not None:
            raise RuntimeError(f"{p.name} exited ({p.returncode}); see {p.log}")
        time.sleep(0.05)
    raise RuntimeError(f"{p.name}: no {', '.join(events)} in its log after {timeout:g} s; see {p.log}")


def warm_first_token(port: int) -> "list[float]":
    out = []
    for _ in range(WARM_SAMPLES):
        t0 = time.monotonic()
        t, _ = demo.first_token(port)
        out.append((t - t0) * 1000)
    return out


def median_steps(runs: "list[dict[str, Any]]") -> "dict[str, float]":
    return {s: round(statistics.median(r["steps_ms"][s] for r in runs), 2) for s in STEPS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lockd", required=True)
    ap.add_argument("--gmsd", required=True)
    ap.add_argument("--runs", type=int, default=5, help="failovers of each kind (API server, whole tree)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the logs (printed path)")
    ap.add_argument("--ready-events", default="lock_waiting,http_ready",
                    help="the log events that make a standby ready (comma-separated)")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gf-vllm-bench-",
                                        dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    run = demo.Run(a, tmp)
    try:
        model = str(tmp / "tiny")
        subprocess.run([sys.executable, demo.HERE / "make_tiny_model.py", model], check=True, capture_output=True)
        lock, gms, port = run.site("pair")
        lockd_log = run.procs[0].log
        active = run.server("vllm-0", "loader", lock, gms, model)
        demo.wait_state(active, "active")
        standby = run.server("vllm-1", "follower", lock, gms, model)
        demo.wait_state(standby, "standby")
        wait_log(standby, a.ready_events.split(","))
        _, ref = demo.first_token(port)
        memory = {"active": tree_memory(active.pid), "standby": tree_memory(standby.pid)}
        warm = warm_first_token(port)
        runs: "list[dict[str, Any]]" = []
        tree_gone: "list[float]" = []
        n = 2
        for i in range(2 * a.runs):
            kind = KINDS[i % 2]
            watch = ExitWatch(active.pid)
            t_kill = time.monotonic()
            if kind == "tree":
                os.killpg(active.pid, signal.SIGKILL)
            else:
                os.kill(active.pid, signal.SIGKILL)
            t_first, ids = demo.first_token(port)
            gone_ms = (watch.wait(60) - t_kill) * 1000
            active.wait()
            k_us = int(t_kill * 1e6)
            lockd, srv = log_events(lockd_log), log_events(standby.log)
            released = next((line for t, e, line in lockd if e == "released" and t >= k_us), "")
            seen_at = re.search(r"seen_mono_us=(\d+)", released)  # the exit, before the log line
            at = {"exit_seen": int(seen_at.group(1)) if seen_at else first_after(lockd, "released", k_us),
                  "granted": first_after(srv, "lock_granted", k_us),
                  "remapped": first_after(srv, "weights_remapped", k_us),
                  "kv_ready": first_after(srv, "awake", k_us, "component=worker"),
                  # A launcher without the "serving" line (before uvicorn started ahead
                  # of the grant) serves from its "active" one.
                  "serving": (first_after(srv, "serving", k_us, "component=server")
                              or first_after(srv, "active", k_us, "component=server"))}
            missing = [k for k, v in at.items() if v is None]
            if missing:
                raise RuntimeError(f"run {i} ({kind}): no {', '.join(missing)} in the logs ({tmp})")
            steps = {k: round((v - k_us) / 1000, 2) for k, v in at.items() if v is not None}
            steps["first_token"] = round((t_first - t_kill) * 1000, 2)
            seen = first_after(log_events(active.log), "dead", k_us, "component=worker")
            runs.append({"kind": kind, "steps_ms": steps, "tree_gone_ms": round(gone_ms, 2),
                         "worker_saw_exit_ms": round((seen - k_us) / 1000, 2) if seen else None,
                         "same_tokens": ids == ref})
            if kind == "tree":
                tree_gone.append(gone_ms)
            print(f"bench-vllm: run {i + 1}/{2 * a.runs} ({kind}): " +
                  " ".join(f"{k}={v:.1f}" for k, v in steps.items()) + f" tree_gone={gone_ms:.1f} ms",
                  file=sys.stderr, flush=True)
            active, standby = standby, None
            warm += warm_first_token(port)
            if i + 1 < 2 * a.runs:
                standby = run.server(f"vllm-{n}", "follower", lock, gms, model)
                n += 1
                demo.wait_state(standby, "standby")
                wait_log(standby, a.ready_events.split(","))

        t0 = time.monotonic()
        lock2, gms2, port2 = run.site("cold")
        run.server("vllm-cold", "loader", lock2, gms2, model)
        t_cold, cold_ids = demo.first_token(port2)
        cold_ms = (t_cold - t0) * 1000

        floor_exit = statistics.median(tree_gone)
        floor_ttft = statistics.median(warm)
        floor = floor_exit + floor_ttft
        out: "dict[str, Any]" = {
            "runs_per_kind": a.runs, "steps": list(STEPS), "runs": runs,
            "median_ms": {k: median_steps([r for r in runs if r["kind"] == k]) for k in KINDS},
            "floor_ms": {"tree_exit": round(floor_exit, 2), "warm_first_token": round(floor_ttft, 2),
                         "total": round(floor, 2)},
            "cold_start_first_token_ms": round(cold_ms, 1), "memory": memory,
            "same_tokens": all(r["same_tokens"] for r in runs) and cold_ids == ref,
            "load_average": list(os.getloadavg()), "cpus": os.cpu_count()}
        out["ratio_to_floor"] = {k: round(out["median_ms"][k]["first_token"] / floor, 2) for k in KINDS}
        out["cold_over_failover"] = {k: round(cold_ms / out["median_ms"][k]["first_token"], 1) for k in KINDS}
        # demo.py's figures, which report.py's first vLLM row reads.
        out["failover_first_token_us"] = int(out["median_ms"]["api_server"]["first_token"] * 1000)
        out["cold_first_token_us"] = int(cold_ms * 1000)
        print_table(out)
        if a.json:
            pathlib.Path(a.json).write_text(json.dumps(out, indent=1))
        return 0 if out["same_tokens"] else 1
    finally:
        run.stop()
        if a.keep:
            print(f"bench-vllm: logs in {tmp}", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", str(tmp)], check=False)


def print_table(out: "dict[str, Any]") -> None:
    med = out["median_ms"]
    print(f"\nvLLM failover timeline, ms after the SIGKILL (medians of {out['runs_per_kind']} runs each; "
          f"{out['cpus']} CPUs, load average {out['load_average'][0]:.1f}):")
    print(f"  {'step':<14}{'API server killed':>18}{'whole tree killed':>18}")
    for s in STEPS:
        print(f"  {s:<14}{med['api_server'][s]:>18.1f}{med['tree'][s]:>18.1f}")
    f = out["floor_ms"]
    print(f"  floor: tree exit {f['tree_exit']:.1f} + warm first token {f['warm_first_token']:.1f} = {f['total']:.1f} ms; "
          f"failover / floor: {out['ratio_to_floor']['api_server']:.2f}x (API server), "
          f"{out['ratio_to_floor']['tree']:.2f}x (tree)")
    print(f"  cold start -> first token {out['cold_start_first_token_ms'] / 1000:.1f} s: "
          f"{out['cold_over_failover']['api_server']:.0f}x / {out['cold_over_failover']['tree']:.0f}x the failover")
    m = out["memory"]
    print(f"  resident memory: standby {m['standby']['rss_bytes'] / 2**20:.0f} MiB "
          f"(PSS {m['standby']['pss_bytes'] / 2**20:.0f}), active {m['active']['rss_bytes'] / 2**20:.0f} MiB "
          f"(PSS {m['active']['pss_bytes'] / 2**20:.0f})")


if __name__ == "__main__":
    sys.exit(main())
