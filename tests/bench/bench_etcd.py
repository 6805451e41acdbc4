#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Lock hand-off on etcd: `gfctl lock acquire --lock etcd://...` against
`etcdctl lock` (etcd's own Go implementation of the same recipe), same etcd
member, same TTL, same run, measured the same way (the holder is told to
release or is SIGKILLed; the waiter's "acquired" line is timed). Also the
memory (RSS) and the TCP connections to etcd of one waiting process.
Prints a table and one JSON line; asserts no speed."""
import argparse
import json
import os
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)


def wait_until(cond, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=2) as r:
        return json.loads(r.read())


def b64(s):
    import base64
    return base64.b64encode(s.encode()).decode()


def keys_under(port, prefix):
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    r = post(port, "/v3/kv/range", {"key": b64(prefix), "range_end": b64(end), "count_only": True})
    return int(r.get("count", 0))


class Contender:
    def __init__(self, argv, env):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def wait_line(self, timeout):
        if not self.sel.select(timeout):
            raise RuntimeError("contender never acquired")
        line = self.proc.stdout.readline()
        t = time.monotonic()
        if not line:
            raise RuntimeError(f"contender exited with {self.proc.wait()}")
        return t

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def connections_to(pid, port):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                parts = line.split()
                if int(parts[2].split(":")[1], 16) == port and parts[9] in inodes:
                    n += 1
    return n


def run_kind(kind, argv_for, port, prefix, trials, kill_trials, env):
    """Clean hand-offs, then hand-offs after SIGKILL of the holder."""
    out = {"clean": [], "kill": [], "rss": [], "conns": []}
    holder = Contender(argv_for("h0"), env)
    holder.wait_line(20)
    for i in range(trials + kill_trials):
        w = Contender(argv_for(f"w{i}"), env)
        wait_until(lambda: keys_under(port, prefix) == 2, 20, "waiter queued")
        time.sleep(0.05)
        if i < 5:
            out["rss"].append(rss_bytes(w.proc.pid))
            out["conns"].append(connections_to(w.proc.pid, port))
        clean = i < trials
        t0 = time.monotonic()
        if clean:
            holder.proc.send_signal(signal.SIGINT if kind == "etcdctl" else signal.SIGTERM)
        else:
            holder.proc.send_signal(signal.SIGKILL)
        t1 = w.wait_line(30)
        out["clean" if clean else "kill"].append((t1 - t0) * 1e6)
        holder.stop()
        holder = w
    holder.stop()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gfctl", required=True)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--kill-trials", type=int, default=3)
    ap.add_argument("--ttl", type=int, default=2)
    a = ap.parse_args()
    etcd, etcdctl = shutil.which("etcd"), shutil.which("etcdctl")
    if not etcd or not etcdctl:
        print("bench-etcd: etcd-server/etcd-client not installed; skipped")
        return 0
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["ETCDCTL_API"] = "3"
    tmp = tempfile.mkdtemp(prefix="gf-bench-etcd-")
    cport, pport = free_port(), free_port()
    member = subprocess.Popen([etcd, "--name", "b", "--data-dir", os.path.join(tmp, "data"),
                               "--listen-client-urls", f"http://127.0.0.1:{cport}",
                               "--advertise-client-urls", f"http://127.0.0.1:{cport}",
                               "--listen-peer-urls", f"http://127.0.0.1:{pport}",
                               "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
                               "--initial-cluster", f"b=http://127.0.0.1:{pport}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def healthy():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{cport}/health", timeout=1) as r:
                    return json.loads(r.read()).get("health") == "true"
            except OSError:
                return False

        wait_until(healthy, 30, "etcd healthy")
        res = {}
        ours_uri = f"etcd://127.0.0.1:{cport}/gf-bench/ours?ttl={a.ttl}"
        res["gf"] = run_kind("gf", lambda ident: [a.gfctl, "lock", "acquire", "--lock", ours_uri, "--id", ident],
                             cport, "/gf-bench/ours/", a.trials, a.kill_trials, env)
        res["etcdctl"] = run_kind("etcdctl", lambda ident: [etcdctl, f"--endpoints=127.0.0.1:{cport}", "lock",
                                                            f"--ttl={a.ttl}", "/gf-bench/theirs"],
                                  cport, "/gf-bench/theirs/", a.trials, a.kill_trials, env)
    finally:
        member.kill()
        member.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    def med(k, case):
        return statistics.median(res[k][case])

    out = {"bench": "etcd", "ttl_s": a.ttl, "trials": a.trials, "kill_trials": a.kill_trials,
           "clean_median_us": round(med("gf", "clean")), "etcdctl_clean_median_us": round(med("etcdctl", "clean")),
           "kill_median_us": round(med("gf", "kill")), "etcdctl_kill_median_us": round(med("etcdctl", "kill")),
           "waiter_rss_bytes": round(statistics.median(res["gf"]["rss"])),
           "etcdctl_waiter_rss_bytes": round(statistics.median(res["etcdctl"]["rss"])),
           "waiter_connections": max(res["gf"]["conns"]), "etcdctl_waiter_connections": max(res["etcdctl"]["conns"])}
    out["clean_ratio"] = round(out["clean_median_us"] / out["etcdctl_clean_median_us"], 2)
    out["kill_ratio"] = round(out["kill_median_us"] / out["etcdctl_kill_median_us"], 2)
    print(f"etcd lock hand-off, ttl {a.ttl}s, one member on loopback; {a.trials} clean, {a.kill_trials} after SIGKILL")
    print(f"  clean  : gfctl {out['clean_median_us'] / 1000:.1f} ms, etcdctl lock {out['etcdctl_clean_median_us'] / 1000:.1f} ms"
          f" (ratio {out['clean_ratio']:.2f}x)")
    print(f"  killed : gfctl {out['kill_median_us'] / 1000:.0f} ms, etcdctl lock {out['etcdctl_kill_median_us'] / 1000:.0f} ms"
          f" (ratio {out['kill_ratio']:.2f}x)")
    print(f"  waiter : gfctl RSS {out['waiter_rss_bytes'] / 1024:.0f} KiB, {out['waiter_connections']} connections;"
          f" etcdctl RSS {out['etcdctl_waiter_rss_bytes'] / 1024:.0f} KiB, {out['etcdctl_waiter_connections']} connections")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
