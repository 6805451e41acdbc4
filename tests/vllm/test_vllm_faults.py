# SPDX-License-Identifier: Apache-2.0
"""Faults of a vLLM pair on CPU (the setting of test_vllm_failover.py, whose
Site and helpers this uses), each with clients in a loop that count refused
connections and failed requests, and each checking that no process of the
member it hit is left:

- a URI of the wrong scheme or a lock server / GMS that does not answer:
  a clear error within seconds of the start, before vLLM starts;
- a tree killed while vLLM loads: the next launcher removes its /dev/shm
  files;
- SIGSTOP of the active's engine core, then of its API server: the worker's
  /live turns 503 once the heartbeat is missed for --hang-timeout, the tree
  is killed, and the standby serves;
- SIGTERM of the active and `gfctl switchover`, with clients in a loop (one
  of them streaming): the old active stops accepting, finishes what it
  accepted and exits (0, and 75 after a switchover); the standby serves;
  nothing refused, nothing failed.

The tests run in order, each handing its pair on to the next."""
import http.client
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

import test_vllm_failover as base
from test_vllm_failover import (PROMPTS, START_TIMEOUT, Hammer, complete, failover, live_in_group,  # noqa: F401
                                model, scaled, shm_files, site, state, tail, wait_for, wait_state, worker_event)

HANG_S = 8.0  # the pair's --hang-timeout here (the default, 30 s, would make each test slower)
GFCTL = base.BUILD / "examples" / "gfctl" / "gfctl"
OPTS = ("--hang-timeout", f"{HANG_S:g}s", "--drain-timeout", "60s")


SUPERVISE = base.BUILD / "examples" / "gf-supervise" / "gf-supervise"
SUPERVISED = []  # every Supervised member of the module, stopped before the site


@pytest.fixture(scope="module", autouse=True)
def stop_supervised(site):
    yield
    for m in SUPERVISED:
        m.stop()


def start(site, name, role, model):
    return site.server(name, role, model, extra=OPTS)


class Run:
    """One run of a supervised member's launcher, for the helpers that take a
    Site server: its pid, its name, the member's log (every run's), its probe."""

    def __init__(self, member, pid):
        self.member, self.pid, self.name, self.probe = member, pid, member.name, member.probe
        self.log, self.site, self.returncode = member.log, member.site, None

    def poll(self):
        if live_in_group(self.pid) and os.path.exists(f"/proc/{self.pid}"):
            return None
        e = self.member.engine()
        self.returncode = e["last_exit_status"] if e and e["last_exit_signal"] == 0 else -(e or {}).get(
            "last_exit_signal", 9)
        return self.returncode

    def wait(self, timeout=None):
        wait_for(lambda: self.poll() is not None, timeout or START_TIMEOUT, f"{self.name} (pid {self.pid}) to exit")
        return self.returncode

    def send_signal(self, sig):
        os.kill(self.pid, sig)


class Supervised:
    """A member run by a gf-supervise of its own (one engine), with the
    Site's arguments; its output goes to its own log."""

    def __init__(self, site, name, role, model):
        self.site, self.name, self.probe = site, name, base.free_port()
        self.log = site.dir / f"{name}.log"
        argv = [str(site.gf_vllm), "serve", model, "--served-model-name", "tiny", "--dtype", "float32",
                "--max-model-len", "256", "--kv-cache-memory-bytes", str(base.KV_BYTES), "--disable-log-stats",
                "--lock", site.lock_uri, "--gms", site.gms_uri(0), "--id", name, "--role", role,
                "--listener", "http", "--probe-port", str(self.probe), "--probe-address", "127.0.0.1",
                "--backend", base.BACKEND, *OPTS]
        self.port = base.free_port()
        cfg = site.dir / f"supervise-{name}.json"
        cfg.write_text(json.dumps({
            "periods": {"admission": "10m", "warmup": "10m", "failure_grace": "2s", "retry_pause": "1s",
                        "term_grace": "5s"},
            "lock": {"uri": site.lock_uri},
            "probe": {"interval": "500ms", "timeout": "1s"},
            "engines": [{"name": name, "lock_id": name, "probe_url": f"http://127.0.0.1:{self.probe}",
                         "argv": ["sh", "-c", f'exec "$@" >>{self.log} 2>&1', "sh", *argv]}]}))
        self.sup = site.spawn(f"gf-supervise-{name}", [SUPERVISE, "--config", cfg, "--http",
                                                        f"127.0.0.1:{self.port}"])
        SUPERVISED.append(self)

    def stop(self):
        """The supervisor stops its member (SIGTERM), then whatever is left of it goes."""
        e = self.engine()
        self.sup.send_signal(signal.SIGTERM)
        try:
            self.sup.wait(scaled(60))
        except subprocess.TimeoutExpired:
            self.sup.kill()
            self.sup.wait()
        if e and e["pid"] > 0:
            try:
                os.killpg(e["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass

    def engine(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=2) as r:
                return json.loads(r.read())["engines"][0]
        except (OSError, ValueError, IndexError):
            return None

    def run(self, after_pid=0, timeout=START_TIMEOUT):
        """The current run (a new one, when @after_pid names the last)."""
        got = []

        def started():
            e = self.engine()
            if e and e["pid"] > 0 and e["pid"] != after_pid and os.path.exists(f"/proc/{e['pid']}"):
                got.append(Run(self, e["pid"]))
                return True
            return False

        wait_for(started, timeout, f"a run of {self.name} under gf-supervise")
        return got[0]


def stream(port, prompt, timeout=120.0):
    """A streamed completion: its token texts, once the stream ended with [DONE]."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise AssertionError(f"HTTP {r.status}: {r.read()[:200]!r}")
        text = []
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                return "".join(text)
            text.append(json.loads(line[6:])["choices"][0]["text"])
        raise AssertionError("the stream ended without [DONE]")
    finally:
        conn.close()


class Streamer(Hammer):
    """Hammer's loop with streamed completions."""

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                out = stream(self.port, PROMPTS[0])
            except Exception as e:  # noqa: BLE001 - every outcome is recorded and judged
                out = e
            self.results.append((t0, time.monotonic(), out))


def refused(out):
    if isinstance(out, urllib.error.URLError) and not isinstance(out, urllib.error.HTTPError):
        out = out.reason
    return isinstance(out, ConnectionRefusedError)


def group_gone(p, timeout=30):
    wait_for(lambda: not live_in_group(p.pid), timeout, f"every process of {p.name} to exit")


class Live:
    """Polls a member's /live every 50 ms and keeps the statuses seen (None:
    no answer)."""

    def __init__(self, p):
        self.p, self.seen, self.stop = p, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.wait(0.05):
            try:
                code = base.probe_status(self.p, "/live")
            except OSError:
                code = None
            self.seen.append((time.monotonic(), code))

    def finish(self):
        self.stop.set()
        self.thread.join(10)
        return self.seen


@pytest.fixture(scope="module")
def pair(site, model):
    """The first loader is killed while vLLM loads (its files are listed
    then); the next one removes them at its start, loads, and serves; a
    follower is the standby."""
    a0 = start(site, "vllm-a0", "loader", model)
    lists = []

    def listed():
        lists[:] = [f for f in os.listdir(shm_files.SHM_DIR)
                    if f.startswith(f"{shm_files.LIST_PREFIX}{a0.pid}-") and f.endswith(shm_files.LIST_SUFFIX)]
        if not lists:
            return False
        try:
            with open(os.path.join(shm_files.SHM_DIR, lists[0])) as f:
                return bool(json.load(f)["files"])
        except (OSError, ValueError, KeyError):
            return False

    wait_for(lambda: listed() or a0.poll() is not None, START_TIMEOUT, "vllm-a0's first listed /dev/shm files")
    assert a0.poll() is None, tail(a0)
    os.killpg(a0.pid, signal.SIGKILL)
    a0.wait()
    group_gone(a0)
    with open(os.path.join(shm_files.SHM_DIR, lists[0])) as f:
        files = json.load(f)["files"]
    leaked = [n for n in files if os.path.exists(os.path.join(shm_files.SHM_DIR, n))]
    loading = "event=standby" not in a0.log.read_text(errors="replace")
    a = start(site, "vllm-a", "loader", model)
    wait_state(a, "active")
    b = start(site, "vllm-b", "follower", model)
    wait_state(b, "standby")
    refs = {p: complete(site.port, p) for p in PROMPTS}
    return {"active": a, "standby": b, "refs": refs, "n": 0, "loading": loading, "leaked": leaked,
            "left": [n for n in leaked if os.path.exists(os.path.join(shm_files.SHM_DIR, n))]}


def next_standby(site, model, pair, victim, supervised=False):
    """After a failover: the standby is the active one, a new follower the
    standby (under gf-supervise when @supervised); a supervised victim is
    restarted by its supervisor as the standby."""
    pair["n"] += 1
    pair["active"] = pair["standby"]
    if isinstance(victim, Run):
        pair["standby"] = victim.member.run(after_pid=victim.pid)
    elif supervised:
        pair["standby"] = Supervised(site, f"vllm-s{pair['n']}", "follower", model).run()
    else:
        pair["standby"] = start(site, f"vllm-{victim.name[5]}{pair['n']}", "follower", model)
    wait_state(pair["standby"], "standby")


def test_bad_uri_fails_within_seconds(site):
    """Mistakes found before vLLM starts: a wrong scheme at once (exit 2), a
    lock server or GMS that does not answer after --check-timeout (exit
    69); a clear message, and no probe that ever answered healthy."""
    gms = site.gms_uri(2)
    cases = [(["--lock", "bogus://x", "--gms", gms], 2, "--lock 'bogus://x' is not a usable URI"),
             (["--lock", f"unix://{site.dir}/nowhere.sock", "--gms", gms, "--check-timeout", "2s"], 69,
              "the lock server does not answer"),
             (["--lock", site.lock_uri, "--gms", f"unix://{site.dir}/nowhere.sock", "--check-timeout", "2s"], 69,
              "the GMS does not answer")]
    for argv, status, message in cases:
        t0 = time.monotonic()
        r = subprocess.run([str(site.gf_vllm), "serve", "/nonexistent/model", *argv, "--id", "bad",
                            "--probe-port", str(base.free_port())], env=base.env(), capture_output=True,
                           text=True, timeout=scaled(60))
        took = time.monotonic() - t0
        assert r.returncode == status and message in r.stderr, (argv, r.returncode, r.stderr[-2000:])
        # Python's start and the imports, plus the check's own wait: not vLLM's start.
        assert took < scaled(30), f"{argv}: {took:.1f} s"
        print(f"\n{argv[1]} / {argv[3]}: exit {r.returncode} after {took:.2f} s")


def test_tree_killed_during_load_leaves_no_files(pair):
    """vllm-a0 was killed while vLLM loaded (before standby): it left the
    files its list named; the next start (vllm-a) removed them."""
    assert pair["loading"], "vllm-a0 reached standby before the kill: not a kill during the load"
    assert pair["leaked"], "the killed tree left no listed file: nothing was proven"
    assert not pair["left"], f"files of the killed tree left after the next start: {pair['left']}"
    a = pair["active"]
    assert "event=shm_swept" in a.log.read_text(errors="replace"), tail(a)
    print(f"\n{len(pair['leaked'])} files of the tree killed during its load removed by the next start")


def hang(site, model, pair, what, supervised_next=False):
    victim, standby = pair["active"], pair["standby"]
    worker = int(worker_event(victim, "kv_range")["pid"])
    with open(f"/proc/{worker}/stat") as f:
        core = int(f.read().rsplit(")", 1)[1].split()[1])  # the worker's parent: vLLM's engine core
    target = {"engine core": core, "API server": victim.pid}[what]
    assert target != worker
    live = Live(victim)
    t_stop = [0.0]

    def stop():
        t_stop[0] = time.monotonic()
        os.kill(target, signal.SIGSTOP)

    failover(site, victim, standby, pair["refs"], stop)
    seen = live.finish()
    gone = victim.returncode
    red = [t for t, code in seen if t > t_stop[0] and code == 503]
    log = victim.log.read_text(errors="replace")
    assert "event=hung" in log or 'reason="hung:' in log, tail(victim)
    # /live answered 503 after the hang timeout and before the tree went
    # (when the probe's own process was not the stopped one).
    assert red, f"/live never 503 after the {what} stopped: {seen[-20:]}"
    assert red[0] - t_stop[0] >= HANG_S - 1.5, red[0] - t_stop[0]  # the last beat came up to 1 s before the stop
    sv = " (under gf-supervise)" if isinstance(victim, Run) else ""
    print(f"\n{what} stopped{sv}: /live 503 after {red[0] - t_stop[0]:.2f} s (--hang-timeout {HANG_S:g} s); "
          f"launcher exit {gone}")
    next_standby(site, model, pair, victim, supervised_next)
    if sv:
        e = victim.member.engine()
        assert e["restarts"] >= 1, e
        print(f"gf-supervise restarted it as the standby: {e['state']}, restarts {e['restarts']}, "
              f"last exit {e['last_exit_class']}")


def test_sigstop_engine_core_fails_over(site, model, pair):
    """Without a supervisor; the next standby runs under gf-supervise."""
    hang(site, model, pair, "engine core", supervised_next=True)


def hand_over(site, model, pair, how):
    """Clients in a loop (three plain, one streaming) while the active is
    asked to go: nothing refused, nothing failed, every answer the same."""
    victim, standby, refs = pair["active"], pair["standby"], pair["refs"]
    clients = [Hammer(site.port) for _ in range(3)] + [Streamer(site.port)]
    ref_text = refs[PROMPTS[0]][1]
    wait_for(lambda: all(c.results for c in clients), 120, "a first answer to every client")
    t0 = time.monotonic()
    how(victim)
    status = victim.wait(scaled(120))
    wait_state(standby, "active", scaled(120))
    wait_for(lambda: all(len([r for r in c.results if r[0] > t0]) >= 2 for c in clients), scaled(120),
             "answers from the new active")
    results = [r for c in clients for r in c.finish()]
    group_gone(victim)
    bad = [r for r in results if isinstance(r[2], Exception)]
    n_refused = sum(1 for r in bad if refused(r[2]))
    assert not bad, f"{len(bad)} requests failed ({n_refused} refused): {[repr(r[2])[:200] for r in bad[:5]]}"
    wrong = [r for r in results if r[2] not in (refs[PROMPTS[0]], ref_text)]
    assert not wrong, wrong[:3]
    log = victim.log.read_text(errors="replace")
    drained = [line for line in log.splitlines() if " event=drained " in line]
    assert drained, tail(victim)
    after = [r for r in results if r[0] > t0]
    gap = max((t1 - t0_) for t0_, t1, _ in after)
    print(f"\n{victim.name} -> {standby.name}: exit {status}; {len(results)} requests, {len(after)} after the "
          f"signal, 0 refused, 0 failed; longest request after it {gap:.2f} s; {drained[0].split(' event=')[1]}")
    return status


def test_sigterm_hands_over_without_a_failed_request(site, model, pair):
    victim = pair["active"]
    status = hand_over(site, model, pair, lambda p: p.send_signal(signal.SIGTERM))
    assert status == 0, tail(victim)
    next_standby(site, model, pair, victim)


def test_sigstop_api_server_fails_over_under_supervise(site, model, pair):
    """The active runs under gf-supervise (SIGTERM made it the active):
    the member's own watchdog ends the stopped tree, and the supervisor
    restarts it as the standby."""
    assert isinstance(pair["active"], Run)
    hang(site, model, pair, "API server")


def test_switchover_hands_over_without_a_failed_request(site, model, pair):
    victim = pair["active"]

    def switchover(p):
        r = subprocess.run([GFCTL, "switchover", "--lock", site.lock_uri], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr

    status = hand_over(site, model, pair, switchover)
    assert status == 75, tail(victim)
    assert "event=step_down_asked" in victim.log.read_text(errors="replace")
