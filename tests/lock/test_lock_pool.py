# SPDX-License-Identifier: Apache-2.0
"""The standby pool with real processes: gf-lockd with a per-GPU budget,
gfctl and gf-c-engine standbys evicted least recently Active first (reason,
exit code 73, log line), the holder and a pinned engine kept, min_standby_age
respected, the readiness relay (gfctl lock ready, HTTP /ready), status JSON
and /metrics, bad UUIDs refused. Binaries from meson: GF_LOCKD, GF_GFCTL,
GF_GMSD, GF_C_ENGINE."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

LOCKD = os.environ.get("GF_LOCKD", "build/examples/gf-lockd/gf-lockd")
GFCTL = os.environ.get("GF_GFCTL", "build/examples/gfctl/gfctl")
GMSD = os.environ.get("GF_GMSD")
HELPER = os.environ.get("GF_LOCK_HELPER")
ENGINE = os.environ.get("GF_C_ENGINE")

GPU = "GPU-0a1b2c3d-0000-4000-8000-00000000000a"
OTHER = "GPU-0a1b2c3d-0000-4000-8000-00000000000b"
EXIT_EVICTED = 73
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from timing import scaled  # noqa: E402
from other_uid import for_other_uid  # noqa: E402

HANG_GUARD = scaled(30.0)  # seconds: a bound against hangs, never a speed claim (GF_TEST_TIMEOUT_SCALE)


def wait_until(cond, what, timeout=HANG_GUARD):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)


class Pool:
    """A gf-lockd with a metrics listener, and the gfctl holders/standbys around it."""

    def __init__(self, tmp, *extra):
        self.tmp = tmp
        self.uri = f"unix://{tmp}/lock.sock"
        self.log = os.path.join(tmp, "lockd.log")
        self.proc = subprocess.Popen([LOCKD, "--listen", self.uri, "--metrics", "127.0.0.1:0"] + list(extra),
                                     stderr=open(self.log, "w"))
        self.port = int(wait_until(lambda: re.search(r'metrics listening.* port=(\d+)', self.logtext()),
                                   "gf-lockd metrics port").group(1))
        wait_until(lambda: 'msg="ready"' in self.logtext(), "gf-lockd ready")
        self.procs = []

    def logtext(self):
        with open(self.log) as f:
            return f.read()

    def status(self):
        r = subprocess.run([GFCTL, "lock", "status", "--lock", self.uri, "--json"], capture_output=True, text=True,
                           timeout=HANG_GUARD)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def engine(self, name, *flags):
        """A gfctl holder/standby declaring GPU and @flags; its stdout/stderr go to files."""
        out = open(os.path.join(self.tmp, name + ".out"), "w")
        err = open(os.path.join(self.tmp, name + ".err"), "w")
        p = subprocess.Popen([GFCTL, "lock", "acquire", "--lock", self.uri, "--id", name, "--gpu", GPU] + list(flags),
                             stdout=out, stderr=err)
        p.name = name
        self.procs.append(p)
        return p

    def stderr_of(self, name):
        with open(os.path.join(self.tmp, name + ".err")) as f:
            return f.read()

    def granted(self, name):
        with open(os.path.join(self.tmp, name + ".out")) as f:
            return "granted" in f.read()

    def waiting(self, name):
        return any(w["id"] == name for w in self.status()["waiters"])

    def hold_once(self, name):
        """@name holds the lock and releases it: its last time Active is now."""
        p = self.engine(name)
        wait_until(lambda: self.granted(name), f"{name} granted")
        p.terminate()
        assert p.wait(HANG_GUARD) == 0

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.proc.terminate()
        self.proc.wait(HANG_GUARD)


@pytest.fixture
def tmp():
    with tempfile.TemporaryDirectory(prefix="gf-pool-") as d:
        yield d


def rejoiner(pool, name):
    """lock-helper on GPU: it holds; release(): it lets go and waits again
    as a standby, the same process (its time Active is its own)."""
    p = subprocess.Popen([HELPER, pool.uri, name, "rejoin", GPU], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    p.name = name
    pool.procs.append(p)

    def release():
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "waiting"
    p.release = release
    return p


@pytest.mark.skipif(not HELPER, reason="GF_LOCK_HELPER must point at lock-helper")
def test_budget_evicts_least_recently_active(tmp):
    pool = Pool(tmp, "--max-standby-per-gpu", "2")
    try:
        # History: b, then c were Active, in that order, and each waits again
        # as a standby; d holds.
        # Started one after the other: processes started together may reach
        # the server in any order.
        b = rejoiner(pool, "b")
        assert b.stdout.readline().startswith("granted id=b")
        c = rejoiner(pool, "c")
        wait_until(lambda: pool.waiting("c"), "c waiting")
        d = rejoiner(pool, "d")
        wait_until(lambda: pool.waiting("d"), "d waiting")
        b.release()
        assert c.stdout.readline().startswith("granted id=c")
        c.release()
        assert d.stdout.readline().startswith("granted id=d")
        wait_until(lambda: pool.waiting("b") and pool.waiting("c"), "b and c waiting again")
        # The pinned p (never Active) makes three standbys on a budget of 2:
        # b, Active before c, goes; the pinned p stays.
        p = pool.engine("p", "--pin", "--wake-bytes", "1G", "--asleep-bytes", "256M")
        assert b.wait(HANG_GUARD) == EXIT_EVICTED
        assert "acquire rc=GF_ERR_EVICTED" in b.stdout.read()
        # A newcomer never Active is the least recent of all.
        e = pool.engine("e")
        assert e.wait(HANG_GUARD) == EXIT_EVICTED
        assert "evicted from the standby pool" in pool.stderr_of("e") and "GF_ERR_EVICTED" in pool.stderr_of("e")
        for proc in (c, d, p):
            assert proc.poll() is None, proc.name
        log = pool.logtext()
        for name in ("b", "e"):
            assert re.search(rf'msg="evicted" id={name} .*gpu={GPU} .*budget=2', log), log
        assert not re.search(r'msg="evicted" id=(c|d|p) ', log), log

        st = pool.status()
        assert st["holder"] == "d" and st["holder_info"]["gpus"] == [GPU]
        assert [w["id"] for w in st["waiters"]] == ["c", "p"]
        byid = {w["id"]: w for w in st["waiters"]}
        assert byid["c"]["last_active_us"] > 0 and byid["p"]["last_active_us"] == 0
        assert byid["p"]["pinned"] and not byid["c"]["pinned"]
        assert byid["p"]["wake_bytes"] == 1 << 30 and byid["p"]["asleep_bytes"] == 256 << 20
        pg = st["pool"]
        assert pg["max_standby_per_gpu"] == 2 and pg["evicted"] == 2
        g = pg["gpus"][0]
        assert g["uuid"] == GPU and g["standbys"] == 2 and g["active"]
        assert g["asleep_bytes"] == 256 << 20 and g["wake_bytes_max"] == 1 << 30
        assert g["lru"] == ["p", "c"]  # least recently Active first

        code, text = get(f"http://127.0.0.1:{pool.port}/metrics")
        assert code == 200
        assert "gf_lock_pool_evicted_total 2\n" in text
        assert f'gf_lock_pool_gpu_standbys{{uuid="{GPU}"}} 2\n' in text
        assert f'gf_lock_pool_gpu_active{{uuid="{GPU}"}} 1\n' in text
        assert 'gf_lock_engine_pinned{id="p",role="standby"} 1\n' in text
        last = dict(re.findall(r'gf_lock_engine_last_active_seconds\{id="(\w+)",role="\w+"\} ([0-9.]+)', text))
        assert float(last["p"]) == 0 and 0 < float(last["c"]) <= float(last["d"])
    finally:
        pool.close()


@pytest.mark.skipif(not HELPER, reason="GF_LOCK_HELPER must point at lock-helper")
def test_fresh_newcomer_is_least_recent(tmp):
    """A newcomer never Active, on a GPU full of engines Active before, is the one evicted."""
    pool = Pool(tmp, "--max-standby-per-gpu", "1")
    try:
        x = rejoiner(pool, "x")
        assert x.stdout.readline().startswith("granted id=x")
        pool.procs.append(subprocess.Popen([GFCTL, "lock", "acquire", "--lock", pool.uri, "--id", "h"],
                                           stdout=open(os.path.join(tmp, "h.out"), "w"), stderr=subprocess.STDOUT))
        wait_until(lambda: pool.waiting("h"), "h waiting")
        x.release()
        wait_until(lambda: pool.granted("h") and pool.waiting("x"), "h granted, x waiting again")
        y = pool.engine("y")
        assert y.wait(HANG_GUARD) == EXIT_EVICTED
        assert "was over its budget of 1 standbys when y registered" in pool.stderr_of("y")
        assert x.poll() is None and [w["id"] for w in pool.status()["waiters"]] == ["x"]
    finally:
        pool.close()


@pytest.mark.skipif(not HELPER, reason="GF_LOCK_HELPER must point at lock-helper")
def test_recency_belongs_to_the_process_that_earned_it(tmp):
    """A newcomer under the id of a dead engine that was Active more
    recently does not inherit its place: recency belongs to the process that
    was Active (the same uid and transport are not enough), so the standby
    that really was Active stays and the newcomer is evicted."""
    pool = Pool(tmp, "--max-standby-per-gpu", "1")
    try:
        def plain(name):
            # Waits without declaring a GPU: outside the budget.
            out = open(os.path.join(tmp, name + ".out"), "w")
            p = subprocess.Popen([GFCTL, "lock", "acquire", "--lock", pool.uri, "--id", name], stdout=out,
                                 stderr=subprocess.STDOUT)
            p.name = name
            pool.procs.append(p)
            return p
        # s holds; x, then h queue behind it.
        s = subprocess.Popen([HELPER, pool.uri, "s", "rejoin", GPU], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        s.name = "s"
        pool.procs.append(s)
        assert s.stdout.readline().startswith("granted id=s"), "s granted"
        x = plain("x")
        wait_until(lambda: pool.waiting("x"), "x waiting")
        plain("h")
        wait_until(lambda: pool.waiting("h"), "h waiting")
        # s releases (x is Active after it) and waits again as a standby on the GPU.
        s.stdin.write("\n")
        s.stdin.flush()
        assert s.stdout.readline().strip() == "waiting"
        wait_until(lambda: pool.granted("x"), "x granted")
        wait_until(lambda: pool.waiting("s"), "s waiting again")
        # x, the most recently Active, is gone; h holds.
        x.terminate()
        assert x.wait(HANG_GUARD) == 0
        wait_until(lambda: pool.granted("h"), "h granted")
        byid = {w["id"]: w for w in pool.status()["waiters"]}
        assert byid["s"]["last_active_us"] > 0
        # A new process registers under x's id, on the full GPU.
        spoof = pool.engine("x")
        assert spoof.wait(HANG_GUARD) == EXIT_EVICTED, pool.logtext()
        assert s.poll() is None
        assert [w["id"] for w in pool.status()["waiters"]] == ["s"]
        assert re.search(r'msg="evicted" id=x .*last_active_us=0 ', pool.logtext()), pool.logtext()
    finally:
        pool.close()


def test_min_standby_age_protects_young_standbys(tmp):
    pool = Pool(tmp, "--max-standby-per-gpu", "1", "--min-standby-age", "3s")
    try:
        a = pool.engine("a")
        wait_until(lambda: pool.granted("a"), "a granted")
        s1 = pool.engine("s1")
        wait_until(lambda: pool.waiting("s1"), "s1 waiting")
        t1 = time.monotonic()
        s2 = pool.engine("s2")
        wait_until(lambda: pool.waiting("s2"), "s2 waiting")
        young = time.monotonic() - t1 < 3.0
        st = pool.status()
        if young:
            # Both younger than 3s when s2 registered: nothing evictable, over budget, said so.
            assert s1.poll() is None and s2.poll() is None
            assert st["pool"]["over_budget"] == 1 and st["pool"]["evicted"] == 0
            assert "nothing evictable" in pool.logtext()
        time.sleep(3.2)
        s3 = pool.engine("s3")
        # s1 and s2 are old enough now; s3 is not: it stays over the two that waited longest.
        assert s1.wait(HANG_GUARD) == EXIT_EVICTED
        assert s2.wait(HANG_GUARD) == EXIT_EVICTED
        wait_until(lambda: pool.waiting("s3"), "s3 waiting")
        assert s3.poll() is None and a.poll() is None
    finally:
        pool.close()


def test_readiness_relay(tmp):
    pool = Pool(tmp)
    try:
        def ready(*args):
            return subprocess.run([GFCTL, "lock", "ready", "--lock", pool.uri] + list(args), capture_output=True,
                                  text=True, timeout=HANG_GUARD)

        r = ready("--gpu", GPU)
        assert r.returncode == 1 and json.loads(r.stdout)["ready"] is False and json.loads(r.stdout)["holder"] is None
        assert get(f"http://127.0.0.1:{pool.port}/ready?gpu={GPU}")[0] == 503
        pool.engine("h", "--gpu", OTHER, "--model", "llama-3")
        wait_until(lambda: pool.granted("h"), "h granted")
        r = ready("--gpu", GPU.upper().replace("GPU-0A", "GPU-0a"), "--gpu", OTHER, "--model", "llama-3")  # hex case is free
        assert r.returncode == 0, r.stdout + r.stderr
        ans = json.loads(r.stdout)
        assert ans["ready"] and ans["holder"] == "h" and ans["epoch"] > 0 and ans["holder_model"] == "llama-3"
        # gfctl never reports serving: ready from its grant, as before, and says it does not know.
        assert ans["serving"] == "unknown" and pool.status()["holder_serving"] == "unknown"
        assert ready().returncode == 0  # any GPU, any model
        assert ready("--model", "qwen").returncode == 1
        assert ready("--gpu", "GPU-0a1b2c3d-0000-4000-8000-0000000000ff").returncode == 1
        code, body = get(f"http://127.0.0.1:{pool.port}/ready?gpu={GPU}&gpu={OTHER}&model=llama-3")
        assert code == 200 and json.loads(body)["holder"] == "h"
        assert get(f"http://127.0.0.1:{pool.port}/ready?model=qwen")[0] == 503
        code, body = get(f"http://127.0.0.1:{pool.port}/ready?gpu=GPU-nope")
        assert code == 400 and "not a UUID" in json.loads(body)["error"]
        assert get(f"http://127.0.0.1:{pool.port}/nothing")[0] == 404
    finally:
        pool.close()


class Gms:
    """A gf-gmsd (host backend) and gf-c-engines around a Pool."""

    def __init__(self, pool):
        self.pool, self.tmp = pool, pool.tmp
        self.uri = f"unix://{self.tmp}/gms.sock"
        self.proc = subprocess.Popen([GMSD, "--listen", self.uri, "--backend", "host"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.engines = []
        wait_until(lambda: os.path.exists(f"{self.tmp}/gms.sock"), "gms socket")

    def engine(self, name, env=None, gpu=GPU):
        err = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen([ENGINE, "--lock", self.pool.uri, "--gms", self.uri, "--id", name]
                             + (["--gpu", gpu] if gpu else [])
                             + ["--port", str(free_port()), "--probe-port", "-1", "--kv-bytes", "1M",
                                "--model", "tiny"], stdout=subprocess.DEVNULL, stderr=err,
                             env=dict(os.environ, **(env or {})))
        self.engines.append(p)
        return p

    def log(self, name):
        with open(os.path.join(self.tmp, name + ".log")) as f:
            return f.read()

    def close(self):
        for p in self.engines:
            if p.poll() is None:
                p.terminate()
            p.wait(HANG_GUARD)
        self.proc.terminate()
        self.proc.wait(HANG_GUARD)


@pytest.mark.skipif(not (GMSD and ENGINE), reason="needs gf-gmsd and gf-c-engine")
def test_readiness_waits_until_the_holder_serves(tmp):
    """Issue 29.8: granted is not serving. An engine whose wake hangs holds the
    lock, but the relay (gfctl lock ready, /ready) says not ready until it
    enters Active; the next engine, whose wake completes, is ready."""
    pool = Pool(tmp)
    gms = Gms(pool)
    try:
        def ready():
            r = subprocess.run([GFCTL, "lock", "ready", "--lock", pool.uri, "--gpu", GPU, "--model", "tiny"],
                               capture_output=True, text=True, timeout=HANG_GUARD)
            return r.returncode, json.loads(r.stdout) if r.stdout else r.stderr
        hung = gms.engine("hung", env={"GF_ENGINE_TEST_HANG_WAKE_MS": "60000"})
        wait_until(lambda: "event=test_hang_wake" in gms.log("hung"), "hung engine waking")
        assert pool.status()["holder"] == "hung"
        code, ans = ready()
        assert code == 1 and ans["ready"] is False and ans["holder"] == "hung" and ans["serving"] == "no", ans
        assert get(f"http://127.0.0.1:{pool.port}/ready?gpu={GPU}&model=tiny")[0] == 503
        assert pool.status()["holder_serving"] == "no"
        good = gms.engine("good")
        wait_until(lambda: pool.waiting("good"), "good in standby")
        hung.terminate()
        assert hung.wait(HANG_GUARD) == 0
        wait_until(lambda: ready()[0] == 0, "the next engine ready")
        code, ans = ready()
        assert ans["holder"] == "good" and ans["serving"] == "yes", ans
        code, body = get(f"http://127.0.0.1:{pool.port}/ready?gpu={GPU}&model=tiny")
        assert code == 200 and json.loads(body)["serving"] == "yes"
        assert "event=serving" in gms.log("good") and good.poll() is None
    finally:
        gms.close()
        pool.close()


@pytest.mark.skipif(not (GMSD and ENGINE), reason="needs gf-gmsd and gf-c-engine")
def test_budget_on_the_host_backend_says_what_it_skips(tmp):
    """Issue 29.8: the budget counts GPUs by UUID; engines on the host backend
    declare none unless given --gpu, so they are outside it. The server says so
    (once) instead of leaving the budget silently inert; with --gpu they count."""
    pool = Pool(tmp, "--max-standby-per-gpu", "1")
    gms = Gms(pool)
    try:
        pool.engine("holder")
        wait_until(lambda: pool.granted("holder"), "holder granted")
        gms.engine("bare-1", gpu=None)
        gms.engine("bare-2", gpu=None)
        wait_until(lambda: pool.waiting("bare-1") and pool.waiting("bare-2"), "two standbys without GPUs")
        assert pool.status()["pool"]["evicted"] == 0
        line = "a standby declared no GPU: the standby budget does not apply to it"
        wait_until(lambda: line in pool.logtext(), "the server's warning")
        assert pool.logtext().count(line) == 1
        first = gms.engine("gpu-1")
        wait_until(lambda: pool.waiting("gpu-1"), "gpu-1 in standby")
        gms.engine("gpu-2")
        assert first.wait(HANG_GUARD) == EXIT_EVICTED
        assert pool.waiting("bare-1") and pool.waiting("bare-2")
    finally:
        gms.close()
        pool.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run gfctl as another uid")
def test_admin_evicts_a_named_standby(tmp):
    """Issue 29.8: gfctl lock evict --id ID (gf_lock_evict) ends that standby's
    acquire with GF_ERR_EVICTED (exit 73) like a budget eviction; an allowed
    non-admin uid is refused (exit 6) and evicts nothing; the holder and
    unknown ids are not standbys (exit 1)."""
    os.chmod(tmp, 0o755)
    pool = Pool(tmp, "--allow-uid", "0", "--allow-uid", "65534")
    os.chmod(pool.uri[len("unix://"):], 0o666)  # the uid check under test is the server's, not the file's
    try:
        def evict(name, uid=None):
            argv = [GFCTL, "lock", "evict", "--lock", pool.uri, "--id", name]
            if uid is not None:
                argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", for_other_uid(argv[0])] + argv[1:]
            return subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD)
        pool.engine("holder")
        wait_until(lambda: pool.granted("holder"), "holder granted")
        victim = pool.engine("victim", "--pin")
        other = pool.engine("other")
        wait_until(lambda: pool.waiting("victim") and pool.waiting("other"), "two standbys")
        r = evict("victim", uid=65534)
        assert r.returncode == 6 and "GF_ERR_PERMISSION" in r.stderr, (r.returncode, r.stderr)
        assert pool.waiting("victim") and pool.status()["pool"]["evicted"] == 0
        r = evict("victim")
        assert r.returncode == 0 and r.stdout.strip() == "evicted id=victim", (r.returncode, r.stdout, r.stderr)
        assert victim.wait(HANG_GUARD) == EXIT_EVICTED
        assert "evicted from the standby pool by an admin" in pool.stderr_of("victim")
        assert 'msg="evicted" id=victim' in pool.logtext()
        st = pool.status()
        assert st["pool"]["evicted"] == 1 and [w["id"] for w in st["waiters"]] == ["other"]
        r = evict("victim")
        assert r.returncode == 1 and "no standby" in r.stderr, (r.returncode, r.stderr)
        r = evict("holder")
        assert r.returncode == 1 and "revoke" in r.stderr, (r.returncode, r.stderr)
        assert other.poll() is None and st["holder"] == "holder"
    finally:
        pool.close()


@pytest.mark.parametrize("bad", ["0", "GPU-", "GPU-0a1b2c3d-0000-4000-8000-00000000000", "gpu-0a1b2c3d-0000-4000-8000-00000000000a",
                                 "GPU-0a1b2c3d-0000-4000-8000-00000000000z", GPU + " "])
def test_bad_uuids_refused(tmp, bad):
    pool = Pool(tmp)
    try:
        r = subprocess.run([GFCTL, "lock", "acquire", "--lock", pool.uri, "--id", "x", "--gpu", bad, "--timeout", "0"],
                           capture_output=True, text=True, timeout=HANG_GUARD)
        assert r.returncode == 2 and "is not a UUID" in r.stderr, r.stderr
        r = subprocess.run([GFCTL, "lock", "ready", "--lock", pool.uri, "--gpu", bad], capture_output=True, text=True,
                           timeout=HANG_GUARD)
        assert r.returncode == 2 and "is not a UUID" in r.stderr, r.stderr
        assert pool.status()["connections"] == 1  # nothing registered; only the status query itself
    finally:
        pool.close()


def test_lockd_flags_checked(tmp):
    for args, what in ((["--max-standby-per-gpu", "-1"], "--max-standby-per-gpu"),
                       (["--max-standby-per-gpu", "two"], "--max-standby-per-gpu"),
                       (["--min-standby-age", "soon"], "--min-standby-age"),
                       (["--metrics", "localhost"], "--metrics"),
                       (["--metrics", "nohost:80"], "--metrics")):
        r = subprocess.run([LOCKD, "--listen", f"unix://{tmp}/x.sock"] + args, capture_output=True, text=True,
                           timeout=HANG_GUARD)
        assert r.returncode == 2 and what in r.stderr, (args, r.stderr)


@pytest.mark.skipif(not (GMSD and ENGINE), reason="needs gf-gmsd and gf-c-engine")
def test_engine_evicted_exits_73(tmp):
    """A real engine (gf-c-engine) evicted while in Standby: exit 73, its log says why."""
    pool = Pool(tmp, "--max-standby-per-gpu", "1")
    gms_uri = f"unix://{tmp}/gms.sock"
    gmsd = subprocess.Popen([GMSD, "--listen", gms_uri, "--backend", "host"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    engines = []
    try:
        wait_until(lambda: os.path.exists(f"{tmp}/gms.sock"), "gms socket")
        pool.engine("holder")
        wait_until(lambda: pool.granted("holder"), "holder granted")

        def engine(name):
            err = open(os.path.join(tmp, name + ".log"), "w")
            p = subprocess.Popen([ENGINE, "--lock", pool.uri, "--gms", gms_uri, "--id", name, "--gpu", GPU,
                                  "--port", str(free_port()), "--probe-port", "-1", "--kv-bytes", "1M",
                                  "--model", "tiny"], stdout=subprocess.DEVNULL, stderr=err)
            engines.append(p)
            return p
        first = engine("eng-1")
        wait_until(lambda: pool.waiting("eng-1"), "eng-1 in standby")
        second = engine("eng-2")
        # Neither was ever Active: the one waiting longest goes.
        assert first.wait(HANG_GUARD) == EXIT_EVICTED
        with open(os.path.join(tmp, "eng-1.log")) as f:
            log = f.read()
        assert "event=evicted status=73" in log and "evicted from the standby pool" in log, log
        assert "cause=evicted" in log, log
        wait_until(lambda: pool.waiting("eng-2"), "eng-2 in standby")
        assert second.poll() is None
        w = [x for x in pool.status()["waiters"] if x["id"] == "eng-2"][0]
        assert w["gpus"] == [GPU] and w["model"] == "tiny" and w["wake_bytes"] == 1 << 20
    finally:
        for p in engines:
            if p.poll() is None:
                p.terminate()
            p.wait(HANG_GUARD)
        gmsd.terminate()
        gmsd.wait(HANG_GUARD)
        pool.close()
