# SPDX-License-Identifier: Apache-2.0
"""gf-supervise with real processes: crash loops, terminal exits, the stable
period, SIGTERM ignored, a SIGSTOPped primary forced out so the standby takes
over, and bad configs refused with the key named. Binaries from meson:
GF_SUPERVISE, GF_LOCKD, GF_GMSD, GF_C_ENGINE."""
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request

import pytest

SUPERVISE = os.environ.get("GF_SUPERVISE")
LOCKD = os.environ.get("GF_LOCKD")
GMSD = os.environ.get("GF_GMSD")
ENGINE = os.environ.get("GF_C_ENGINE")
GFCTL = os.environ.get("GF_GFCTL")
HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = [sys.executable, os.path.join(HERE, "probe_engine.py")]

pytestmark = pytest.mark.skipif(not SUPERVISE, reason="GF_SUPERVISE must point at gf-supervise")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from timing import scaled  # noqa: E402

HANG_GUARD = scaled(30.0)  # seconds: a bound against hangs, never a speed claim (GF_TEST_TIMEOUT_SCALE)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)


def wait_for(pred, what, timeout=HANG_GUARD):
    """what: a string, or a function returning one (a report made only on
    failure, from the state at that moment)."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = pred()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


def assert_event_first(text):
    """Every line of the supervisor's own names its event first (its engines
    write to the same log in their own words)."""
    ours = [ln for ln in text.splitlines() if " component=supervise " in ln]
    assert ours, text
    for ln in ours:
        assert re.search(r" component=supervise event=[a-z][a-z0-9_]* ", ln + " "), ln


def pair_report(s, lock_uri, ports):
    """What a failed failover wait prints: each engine's endpoint, the lock
    server's view and the supervisor's log (the engines log there too)."""
    lines = []
    for name, port in ports.items():
        lines.append(f"{name} :{port}/infer -> {get(f'http://127.0.0.1:{port}/infer?seed=1', 0.5)}")
    if GFCTL:
        r = subprocess.run([GFCTL, "lock", "status", "--lock", lock_uri], capture_output=True, text=True, timeout=20)
        lines.append(f"gfctl lock status: {r.returncode} {r.stdout}{r.stderr}")
    lines.append(f"supervisor status: {json.dumps(s.status())}")
    return "\n" + "\n".join(lines) + "\nlog:\n" + s.text()


def get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


class Supervisor:
    def __init__(self, tmp, config):
        self.port = free_port()
        self.cfg = os.path.join(tmp, "supervise.json")
        with open(self.cfg, "w") as f:
            json.dump(config, f)
        self.log_path = os.path.join(tmp, "supervise.log")
        self.log = open(self.log_path, "wb")
        self.p = subprocess.Popen([SUPERVISE, "--config", self.cfg, "--http", f"127.0.0.1:{self.port}"],
                                  stdout=self.log, stderr=subprocess.STDOUT)

    def status(self):
        code, body = get(f"http://127.0.0.1:{self.port}/status")
        return json.loads(body) if code == 200 else None

    def engine(self, name):
        st = self.status()
        if not st:
            return None
        return next(e for e in st["engines"] if e["name"] == name)

    def wait_state(self, name, state, timeout=HANG_GUARD):
        return wait_for(lambda: (e := self.engine(name)) and e["state"] == state and e,
                        f"{name} {state}; log:\n{self.text()}", timeout)

    def metrics(self):
        return get(f"http://127.0.0.1:{self.port}/metrics")[1]

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                raise AssertionError("gf-supervise did not stop on SIGTERM:\n" + self.text())
        self.log.close()


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="gf-supervise-it-")
    yield d
    subprocess.run(["rm", "-rf", d])


@pytest.fixture
def sups():
    started = []
    yield started
    for s in started:
        s.stop()


FAST = {"admission": "5s", "warmup": "10s", "failure_grace": "1s", "retry_pause": "100ms",
        "retry_limit": 2, "term_grace": "1s", "revoke_grace": "2s", "stable": "1h"}


def fake(name, *args, port=None):
    port = port or free_port()
    return {"name": name, "argv": FAKE + [str(port), *args], "probe_url": f"http://127.0.0.1:{port}"}


def test_crash_loop_reaches_retry_limit(tmp, sups):
    s = Supervisor(tmp, {"periods": FAST, "engines": [fake("crasher", "--exit", "1")]})
    sups.append(s)
    e = s.wait_state("crasher", "failed")
    assert e["restarts"] == 2 and e["retries"] == 2 and e["retries_left"] == 0
    assert e["last_exit_status"] == 1 and e["last_exit_class"] == "retryable"
    assert "retry limit 2" in e["reason"]
    m = s.metrics()
    assert 'gf_supervisor_engine_state{engine="crasher",state="failed"} 1' in m
    assert 'gf_supervisor_engine_restarts_total{engine="crasher"} 2' in m
    if GFCTL:
        url = f"http://127.0.0.1:{s.port}"
        r = subprocess.run([GFCTL, "supervise", "status", "--url", url], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
        row = next(line for line in r.stdout.splitlines() if line.startswith("crasher"))
        assert "failed" in row and "status 1 (retryable)" in row and "retry limit 2" in row, r.stdout
        r = subprocess.run([GFCTL, "supervise", "status", "--url", url, "--json"], capture_output=True, text=True,
                           timeout=20)
        assert json.loads(r.stdout)["engines"][0]["state"] == "failed"
        r = subprocess.run([GFCTL, "supervise", "status", "--url", f"http://127.0.0.1:{free_port()}"],
                           capture_output=True, text=True, timeout=20)
        assert r.returncode == 5, r.stderr


def test_terminal_exit_is_not_retried(tmp, sups):
    s = Supervisor(tmp, {"periods": FAST, "terminal_exit_codes": [78],
                         "engines": [fake("badcfg", "--exit", "78")]})
    sups.append(s)
    e = s.wait_state("badcfg", "failed")
    assert e["restarts"] == 0 and e["last_exit_class"] == "terminal"


def test_evicted_exit_is_terminal_by_default(tmp, sups):
    # 73: the lock server evicted the standby from its pool; a restart would undo the eviction.
    s = Supervisor(tmp, {"periods": FAST, "engines": [fake("evicted", "--exit", "73")]})
    sups.append(s)
    e = s.wait_state("evicted", "failed")
    assert e["restarts"] == 0 and e["last_exit_class"] == "terminal"


def test_retry_counter_resets_after_stable_period(tmp, sups):
    counter = os.path.join(tmp, "runs")
    periods = dict(FAST, stable="1s", retry_limit=3)
    s = Supervisor(tmp, {"periods": periods, "engines": [fake("flaky", "--crash-runs", "2", counter)]})
    sups.append(s)
    e = s.wait_state("flaky", "running")
    # The count when it became healthy, from the log: the status may be read
    # only after the stable period (1 s) reset it on a busy machine.
    assert e["restarts"] == 2
    assert 'engine=flaky state=running from=warming reason="healthy" retries=2' in s.text() or \
        'engine=flaky state=running from=starting reason="healthy" retries=2' in s.text(), s.text()
    # Its starts, exits and state changes, the lines this run wrote.
    assert "event=engine_started engine=flaky " in s.text() and "event=engine_exited engine=flaky " in s.text()
    assert_event_first(s.text())
    e = wait_for(lambda: (x := s.engine("flaky")) and x["retries"] == 0 and x, "retries reset")
    assert e["state"] == "running" and e["restarts"] == 2 and e["retries_left"] == 3


def test_exit_75_without_a_switchover_meets_the_retry_limit(tmp, sups):
    """Status 75 (GF_ENGINE_EXIT_SWITCHOVER) alone is no switchover: a
    process that exits 75 with none asked of it is paused and counted like
    any failure, so it ends failed instead of restarting without a pause."""
    periods = dict(FAST, retry_limit=1, retry_pause="1s")
    s = Supervisor(tmp, {"periods": periods, "engines": [
        {"name": "seventy-five", "argv": ["sh", "-c", "exit 75"], "probe_url": f"http://127.0.0.1:{free_port()}"}]})
    sups.append(s)
    e = s.wait_state("seventy-five", "failed")
    assert e["restarts"] == 1 and e["retries"] == 1, e
    assert e["last_exit_status"] == 75 and e["last_exit_class"] == "retryable", e
    assert "retry limit 1" in e["reason"], e


def test_engine_gets_no_descriptor_of_the_supervisor(tmp, sups):
    """An engine starts with stdin, stdout and stderr only: none of the
    supervisor's sockets (libcurl's wake-up pair, probe connections, the
    HTTP listener) leak into it."""
    fds = os.path.join(tmp, "fds.json")
    s = Supervisor(tmp, {"periods": FAST, "engines": [fake("lister", "--fds", fds)]})
    sups.append(s)
    s.wait_state("lister", "running")
    # A second process is spawned after probes and the lock poll ran.
    os.kill(s.engine("lister")["pid"], signal.SIGKILL)
    os.unlink(fds)
    wait_for(lambda: (x := s.engine("lister")) and x["restarts"] == 1 and os.path.exists(fds), "a restart")
    with open(fds) as f:
        got = json.load(f)
    assert sorted(got, key=int) == ["0", "1", "2"], got


def test_sigterm_ignored_is_killed_after_the_grace(tmp, sups):
    s = Supervisor(tmp, {"periods": FAST, "engines": [fake("stubborn", "--ignore-term", "--live-fail")]})
    sups.append(s)
    s.wait_state("stubborn", "unhealthy")
    s.wait_state("stubborn", "terminating")
    e = wait_for(lambda: (x := s.engine("stubborn")) and x["last_exit_signal"] == signal.SIGKILL and x,
                 "SIGKILL after the term grace")
    assert e["retries"] >= 1
    assert "SIGKILL" in s.text()


def test_stop_terminates_children(tmp, sups):
    s = Supervisor(tmp, {"periods": FAST, "engines": [fake("a"), fake("b")]})
    s.wait_state("a", "running")
    s.wait_state("b", "running")
    pids = [s.engine(n)["pid"] for n in ("a", "b")]
    s.stop()
    assert s.p.returncode == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("config,key", [
    ({"engines": [dict(fake("x"), colour="red")]}, "engines[0].colour: unknown key"),
    ({"periods": {"retry_pause": "-5s"}, "engines": [fake("x")]}, "periods.retry_pause: must not be negative"),
    ({"periods": {"admission": "10m", "warmup": "1m"}, "engines": [fake("x")]}, "admission: must not exceed warmup"),
    ({"periods": {"warmup": "soon"}, "engines": [fake("x")]}, "periods.warmup: not a duration"),
    ({"engines": [{"name": "x", "argv": [], "probe_url": "http://127.0.0.1:1"}]}, "engines[0].argv"),
    ({"engines": [fake("x"), fake("x")]}, "engines[1].name"),
    ({"engines": [dict(fake("x"), lock_id="e")]}, "needs lock.uri"),
    ({"engines": []}, "engines"),
    ({"periods": {"retry_limit": -1}, "engines": [fake("x")]}, "retry_limit"),
])
def test_bad_config_names_the_key(tmp, config, key):
    path = os.path.join(tmp, "bad.json")
    with open(path, "w") as f:
        json.dump(config, f)
    r = subprocess.run([SUPERVISE, "--config", path, "--check-config"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 2, r.stderr
    assert key in r.stderr, r.stderr


def test_not_json_is_a_clear_error(tmp):
    path = os.path.join(tmp, "bad.json")
    with open(path, "w") as f:
        f.write("{ engines: ")
    r = subprocess.run([SUPERVISE, "--config", path, "--check-config"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 2 and "bad.json:1" in r.stderr, r.stderr


@contextlib.contextmanager
def supervised_pair(tmp, sups, periods):
    """gf-lockd and gf-gmsd (host backend) beside gf-supervise running two
    gf-c-engines on them; yields once one serves: a namespace with the
    supervisor (s), lock_uri, each engine's serving port (ports), primary,
    standby and the primary's first answer (first). The daemons stop after."""
    lock_uri, gms_uri = f"unix://{tmp}/lock.sock", f"unix://{tmp}/gms.sock"
    side = []
    try:
        for argv in ([LOCKD, "--listen", lock_uri, "--state-file", f"{tmp}/lock.state"],
                     [GMSD, "--listen", gms_uri, "--backend", "host"]):
            side.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(lambda: os.path.exists(f"{tmp}/lock.sock") and os.path.exists(f"{tmp}/gms.sock"), "sockets")
        engines, ports = [], {}
        for name in ("engine-a", "engine-b"):
            probe, serve = free_port(), free_port()
            ports[name] = serve
            engines.append({"name": name, "lock_id": name, "probe_url": f"http://127.0.0.1:{probe}",
                            "argv": [ENGINE, "--lock", lock_uri, "--gms", gms_uri, "--id", name,
                                     "--port", str(serve), "--probe-port", str(probe),
                                     "--probe-address", "127.0.0.1", "--kv-bytes", "4M"]})
        s = Supervisor(tmp, {"periods": periods, "lock": {"uri": lock_uri}, "engines": engines})
        sups.append(s)
        s.wait_state("engine-a", "running")
        s.wait_state("engine-b", "running")

        def active():
            for name, port in ports.items():
                code, body = get(f"http://127.0.0.1:{port}/infer?seed=1", timeout=0.5)
                if code == 200:
                    return name, json.loads(body)
            return None
        primary, first = wait_for(active, "an active engine")
        standby = "engine-b" if primary == "engine-a" else "engine-a"

        def standby_serving():
            """The standby's first answer (waits for it; the failure says why not)."""
            code, body = wait_for(lambda: (r := get(f"http://127.0.0.1:{ports[standby]}/infer?seed=1", 0.5))[0]
                                  == 200 and r, lambda: "standby serving" + pair_report(s, lock_uri, ports))
            return json.loads(body)
        yield types.SimpleNamespace(s=s, lock_uri=lock_uri, ports=ports, primary=primary, standby=standby,
                                    first=first, standby_serving=standby_serving)
    finally:
        for p in side:
            p.terminate()
            p.wait(timeout=10)


@pytest.mark.skipif(not (LOCKD and GMSD and ENGINE), reason="needs gf-lockd, gf-gmsd, gf-c-engine")
def test_sigstopped_primary_is_forced_out(tmp, sups):
    with supervised_pair(tmp, sups, dict(FAST, retry_pause="5s", retry_limit=3)) as p:
        s, primary = p.s, p.primary
        os.kill(s.engine(primary)["pid"], signal.SIGSTOP)
        s.wait_state(primary, "unhealthy")
        # The stopped primary is killed, the standby takes over with a higher epoch.
        e = wait_for(lambda: (x := s.engine(primary)) and x["last_exit_signal"] == signal.SIGKILL and x,
                     "primary killed")
        assert e["retries"] == 1
        after = p.standby_serving()
        assert after["epoch"] > p.first["epoch"]
        assert after["checksum"] == p.first["checksum"]


@pytest.mark.skipif(not (LOCKD and GMSD and ENGINE and GFCTL), reason="needs gf-lockd, gf-gmsd, gf-c-engine, gfctl")
def test_switchover_restarts_the_primary_without_a_retry(tmp, sups):
    """gfctl switchover: the primary steps down and exits 75; the supervisor
    saw it hold the grant and the grant handed over, so the exit is planned:
    restarted at once, no retry counted, and the standby serves."""
    with supervised_pair(tmp, sups, dict(FAST, retry_pause="30s")) as p:
        s, primary = p.s, p.primary
        wait_for(lambda: s.engine(primary)["lock_epoch"] == p.first["epoch"], "the supervisor sees the grant")
        r = subprocess.run([GFCTL, "switchover", "--lock", p.lock_uri], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
        e = wait_for(lambda: (x := s.engine(primary)) and x["restarts"] == 1 and x, "the primary restarted")
        assert e["last_exit_status"] == 75 and e["last_exit_class"] == "planned", e
        assert e["retries"] == 0 and e["state"] != "paused", e
        assert p.standby_serving()["epoch"] > p.first["epoch"]


def test_shipped_example_config_is_valid():
    path = os.path.join(HERE, "..", "..", "examples", "gf-supervise", "supervise.json")
    r = subprocess.run([SUPERVISE, "--config", path, "--check-config"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert "deprecated" not in r.stderr, r.stderr


def test_old_forceful_grace_key_is_accepted_with_a_warning(tmp):
    """forceful_grace was renamed revoke_grace (it never timed AppWrapper's
    ForcefulDeletionGracePeriod, which is term_grace): still accepted, with
    a warning naming both; giving both is refused."""
    path = os.path.join(tmp, "old.json")
    for periods, rc in (({"forceful_grace": "2m"}, 0), ({"forceful_grace": "2m", "revoke_grace": "1m"}, 2)):
        with open(path, "w") as f:
            json.dump({"periods": periods, "engines": [fake("x")]}, f)
        r = subprocess.run([SUPERVISE, "--config", path, "--check-config"], capture_output=True, text=True,
                           timeout=20)
        assert r.returncode == rc, r.stderr
        if rc == 0:
            assert "periods.forceful_grace is deprecated" in r.stderr and "term_grace" in r.stderr, r.stderr
        else:
            assert "give only revoke_grace" in r.stderr, r.stderr


def test_exit_waits_the_failure_grace_and_a_failed_engine_is_held(tmp, sups):
    """AppWrapper's timings with real processes. FailureGracePeriod: an
    engine that exits is Unhealthy (its exit shown, no retry counted) for
    failure_grace before the reset. DeletionOnFailureGracePeriod: an engine
    failing with no retry left is held, still running, for
    deletion_on_failure_grace, then terminated and Failed."""
    periods = dict(FAST, failure_grace="2s", retry_limit=0, deletion_on_failure_grace="3s")
    s = Supervisor(tmp, {"periods": dict(periods, retry_limit=1), "engines": [fake("crasher", "--exit", "1")]})
    sups.append(s)
    e = s.wait_state("crasher", "unhealthy")
    assert e["pid"] == 0 and e["retries"] == 0 and e["last_exit_status"] == 1, e
    assert "failure grace before the reset" in e["reason"], e
    e = wait_for(lambda: (x := s.engine("crasher")) and x["retries"] == 1 and x, "the reset after the grace")
    assert e["state"] in ("paused", "starting", "warming", "unhealthy"), e
    s.stop()

    s = Supervisor(tmp, {"periods": periods, "engines": [fake("wedged", "--live-fail")]})
    sups.append(s)
    e = s.wait_state("wedged", "held")
    pid = e["pid"]
    assert pid > 0 and e["last_exit_status"] == -1 and "held for debugging" in e["reason"], e
    os.kill(pid, 0)  # still there for an operator to inspect
    assert 'gf_supervisor_engine_state{engine="wedged",state="held"} 1' in s.metrics()
    e = s.wait_state("wedged", "failed")
    assert e["pid"] == 0 and e["restarts"] == 0, e
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "state=terminating from=held" in s.text()



@pytest.mark.skipif(not (LOCKD and GFCTL), reason="needs gf-lockd and gfctl")
def test_grant_that_outlives_its_engine_is_revoked_and_fenced(tmp, sups):
    """The engine's lock holder is a process of its own that survives the
    engine (started in a session of its own, out of the group the
    supervisor kills, as a process stuck in the driver survives SIGKILL):
    after the revoke grace the supervisor revokes exactly the epoch it saw
    that process hold, the standby is granted a higher one, and the old
    holder learns it lost the lock."""
    lock_uri = f"unix://{tmp}/lock.sock"
    lockd = subprocess.Popen([LOCKD, "--listen", lock_uri], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    standby = None
    out = os.path.join(tmp, "holder.out")
    try:
        wait_for(lambda: os.path.exists(f"{tmp}/lock.sock"), "lock socket")
        holder = ["sh", "-c", f"{GFCTL} lock acquire --lock {lock_uri} --id primary; echo exit=$?"]
        engine = dict(fake("primary", "--live-fail", "--detached", json.dumps(holder), out), lock_id="primary")
        s = Supervisor(tmp, {"periods": dict(FAST, retry_pause="30s"), "lock": {"uri": lock_uri},
                             "engines": [engine]})
        sups.append(s)
        first = wait_for(lambda: os.path.exists(out) and open(out).readline(), "the grant")
        assert first.startswith("granted id=primary epoch="), first
        epoch1 = int(first.split("epoch=")[1])
        standby = subprocess.Popen([GFCTL, "lock", "acquire", "--lock", lock_uri, "--id", "standby"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Killed for failing /live; the grant survives it until the revocation.
        e = wait_for(lambda: (x := s.engine("primary")) and x["revoked_epoch"] == epoch1 and x,
                     "revocation\n" + s.text())
        assert e["state"] == "paused" and e["retries"] == 1
        line = standby.stdout.readline()
        assert line.startswith("granted id=standby epoch="), line
        assert int(line.split("epoch=")[1]) > epoch1
        # The revoked holder is told: it exits with "lock lost" (4).
        wait_for(lambda: "exit=4" in open(out).read(), "the holder told")
        assert 'gf_supervisor_engine_revocations_total{engine="primary"} 1' in s.metrics()
        r = subprocess.run([GFCTL, "lock", "status", "--lock", lock_uri, "--json"], capture_output=True,
                           text=True, timeout=20)
        assert json.loads(r.stdout)["holder"] == "standby"
        assert f"revoked\" id=primary epoch={epoch1}" in lockd_text(lockd)
    finally:
        if standby and standby.poll() is None:
            standby.terminate()
            standby.wait(timeout=10)
        if os.path.exists(out + ".pid"):
            try:
                os.killpg(int(open(out + ".pid").read()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        lockd.terminate()
        lockd.wait(timeout=10)


@pytest.mark.skipif(not (LOCKD and GFCTL), reason="needs gf-lockd and gfctl")
def test_healthy_engine_whose_child_holds_the_lock_is_not_revoked(tmp, sups):
    """An engine started through "sh -c" whose lock holder is a child of the
    spawned shell: an earlier exit of the engine must not get the current,
    healthy process's grant revoked after the revoke grace."""
    lock_uri = f"unix://{tmp}/lock.sock"
    lockd = subprocess.Popen([LOCKD, "--listen", lock_uri], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.exists(f"{tmp}/lock.sock"), "lock socket")
        port, counter, out = free_port(), os.path.join(tmp, "runs"), os.path.join(tmp, "holder.out")
        script = (f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}; '
                  f'[ "$n" -ge 1 ] || exit 1; '
                  f'{GFCTL} lock acquire --lock {lock_uri} --id primary > {out} 2>&1 & '
                  f'{" ".join(FAKE)} {port}; wait')
        engine = {"name": "primary", "lock_id": "primary", "argv": ["sh", "-c", script],
                  "probe_url": f"http://127.0.0.1:{port}"}
        s = Supervisor(tmp, {"periods": FAST, "lock": {"uri": lock_uri}, "engines": [engine]})
        sups.append(s)
        s.wait_state("primary", "running")
        first = wait_for(lambda: os.path.exists(out) and open(out).readline(), "the grant")
        epoch = int(first.split("epoch=")[1])
        # The earlier exit's look at the lock comes revoke_grace (2 s) after it: wait past it.
        time.sleep(4)
        e = s.engine("primary")
        assert e["revoked_epoch"] == 0 and e["state"] == "running" and e["pid"] > 0, e
        assert 'gf_supervisor_engine_revocations_total{engine="primary"} 0' in s.metrics()
        r = subprocess.run([GFCTL, "lock", "status", "--lock", lock_uri, "--json"], capture_output=True,
                           text=True, timeout=20)
        st = json.loads(r.stdout)
        assert st["holder"] == "primary" and st["epoch"] == epoch, st
        assert "lost" not in open(out).read()
        # The supervisor knows the grant as the engine's own, through the shell's child.
        assert s.engine("primary")["lock_epoch"] == epoch
    finally:
        lockd.terminate()
        lockd.wait(timeout=10)


def test_slow_lock_server_delays_no_other_engine(tmp, sups):
    """The supervisor's questions to the lock server run off the loop: while
    it waits on a lock server that never answers (the poll of which grant
    each engine holds), another engine's crash loop goes on being restarted.
    (A revocation is asked only for a grant proven before, so a lock server
    that never answered is never asked to revoke.)"""
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(f"{tmp}/mute.sock")
    mute.listen(16)  # accepts into its backlog, never answers a handshake
    try:
        # A short failure grace: an exit waits it before its reset (AppWrapper's FailureGracePeriod).
        periods = dict(FAST, retry_limit=1000, failure_grace="100ms")
        primary = dict(fake("primary"), lock_id="primary")
        # The poll waits its whole timeout on the mute server: long, so the
        # restarts are awaited as a condition while it is still pending,
        # never counted in a window of fixed length.
        poll_timeout = int(scaled(60))
        s = Supervisor(tmp, {"periods": periods, "lock": {"uri": f"unix://{tmp}/mute.sock"},
                             "probe": {"interval": "1s", "timeout": f"{poll_timeout}s"},
                             "engines": [primary, fake("other", "--exit", "1")]})
        sups.append(s)
        wait_for(lambda: s.text().count("event=engine_started engine=other ") >= 3,
                 lambda: "three starts of the other engine\n" + s.text(), timeout=poll_timeout)
        log = s.text()
        before = log[:log.index("event=lock_poll_failed")] if "event=lock_poll_failed" in log else log
        assert before.count("event=engine_started engine=other ") >= 3, log
        assert "revoke" not in log, log
        assert_event_first(log)
    finally:
        mute.close()


def lockd_text(p):
    p.terminate()
    try:
        _, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    return err.decode(errors="replace")


def test_spawn_failure_storm_backs_off_and_ends_failed(tmp, sups):
    """A program that cannot be spawned, retry_pause 0 and a high
    retry_limit: each failed spawn waits a backoff (100 ms, doubling to 5 s),
    so the supervisor neither spins nor recurses (it once died by SIGSEGV
    after about 58,000 failures in a row), and with a small limit the
    engine ends Failed."""
    def nope(name):
        return {"name": name, "argv": [os.path.join(tmp, "no-such-program")],
                "probe_url": f"http://127.0.0.1:{free_port()}"}

    s = Supervisor(tmp, {"periods": dict(FAST, retry_pause="0ms", retry_limit=100000), "engines": [nope("storm")]})
    sups.append(s)
    t0 = time.monotonic()
    wait_for(lambda: (e := s.engine("storm")) and e["retries"] >= 4, lambda: "4 retries\n" + s.text())
    elapsed = time.monotonic() - t0
    e = s.engine("storm")
    assert s.p.poll() is None, s.text()
    # An upper bound (a busy machine only makes it fewer): the retries the
    # backoff allows in the time that passed.
    allowed, pause, spent = 1, 0.1, 0.0
    while spent + pause <= elapsed:
        spent += pause
        pause = min(pause * 2, 5.0)
        allowed += 1
    assert e["retries"] <= allowed, (e, elapsed)
    assert e["state"] == "paused" and "spawn failed" in e["reason"], e
    s.stop()

    s = Supervisor(tmp, {"periods": dict(FAST, retry_pause="0ms", retry_limit=3), "engines": [nope("few")]})
    sups.append(s)
    e = s.wait_state("few", "failed")
    assert e["retries"] == 3 and "retry limit 3" in e["reason"] and "spawn failed" in e["reason"], e
    assert s.p.poll() is None, s.text()
