# SPDX-License-Identifier: Apache-2.0
"""gf-c-engine against the real gf-lockd and gf-gmsd (host backend).

Real processes, real sockets, real HTTP: failover after SIGKILL of the
primary, the default loss policy on GMS loss, a hung wake flipping /live,
and the probe table as kubelet would see it. Binaries come from meson via
GF_LOCKD, GF_GMSD and GF_C_ENGINE.
"""
import json
import os
import sys
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

LOCKD = os.environ.get("GF_LOCKD")
GMSD = os.environ.get("GF_GMSD")
ENGINE = os.environ.get("GF_C_ENGINE")

pytestmark = pytest.mark.skipif(not (LOCKD and GMSD and ENGINE),
                                reason="GF_LOCKD, GF_GMSD and GF_C_ENGINE must point at the binaries")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from timing import scaled  # noqa: E402

HANG_GUARD = scaled(20.0)  # seconds: a bound against hangs, never a speed claim (GF_TEST_TIMEOUT_SCALE)


def wait_for(pred, what, timeout=HANG_GUARD):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Proc:
    def __init__(self, name, argv, tmp, env=None):
        self.name = name
        self.log_path = os.path.join(tmp, name + ".log")
        self.log = open(self.log_path, "wb")
        full_env = dict(os.environ)
        full_env.pop("GF_LOG", None)
        if env:
            full_env.update(env)
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def wait_log(self, pattern, timeout=HANG_GUARD):
        rx = re.compile(pattern)

        def find():
            m = rx.search(self.text())
            if m:
                return m
            if self.p.poll() is not None:
                # One last read: the line may have been written just before exit.
                m = rx.search(self.text())
                if m:
                    return m
                raise AssertionError(f"{self.name} exited ({self.p.returncode}) before /{pattern}/:\n"
                                     + self.text())
            return None
        return wait_for(find, f"{self.name}: /{pattern}/", timeout)

    def wait_exit(self, timeout=HANG_GUARD):
        return self.p.wait(timeout=timeout)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


@pytest.fixture
def world():
    tmp = tempfile.mkdtemp(prefix="gf-engine-it-")
    procs = []

    class World:
        dir = tmp
        lock_uri = f"unix://{tmp}/lock.sock"
        gms_uri = f"unix://{tmp}/gms0.sock"

        def start(self, name, argv, env=None):
            p = Proc(name, argv, tmp, env)
            procs.append(p)
            return p

        def lockd(self, *extra):
            p = self.start("lockd", [LOCKD, "--listen", self.lock_uri, "--state-file", f"{tmp}/lock.state", *extra])
            p.wait_log(r'msg="?ready')
            return p

        def gmsd(self, *extra):
            p = self.start("gmsd", [GMSD, "--listen", self.gms_uri, "--backend", "host", *extra])
            p.wait_log(r'msg="?ready')
            return p

        def engine(self, name, *extra, env=None, wait_ports=True):
            argv = [ENGINE, "--lock", self.lock_uri, "--gms", self.gms_uri, "--id", name,
                    "--port", "0", "--probe-port", "0", "--probe-address", "127.0.0.1",
                    "--kv-bytes", "4M", *extra]
            p = self.start(name, argv, env)
            if wait_ports:
                p.probe_port = int(p.wait_log(r"event=probe_listening port=(\d+)").group(1))
            return p

    yield World()
    for p in reversed(procs):
        p.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def http(port, path, method="GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def probes(p):
    return tuple(http(p.probe_port, path)[0] for path in ("/startup", "/live", "/ready"))


def state(p):
    return json.loads(http(p.probe_port, "/state")[1])["state"]


def serving_port(p):
    return int(p.wait_log(r"event=endpoint_listening port=(\d+)").group(1))


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r" (-?[\d.]+)$", text, re.M)
    return float(m.group(1)) if m else None


def promtool_check(text):
    """`promtool check metrics` on an exposition; its complaints, or "" when clean."""
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not found (Debian package prometheus; tests/setup.sh installs it)")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return "" if r.returncode == 0 else (r.stdout + r.stderr)


def test_failover_after_sigkill(world):
    world.lockd()
    world.gmsd()
    weights = os.path.join(world.dir, "w.safetensors")
    w = world.start("writer", [ENGINE, "--write-weights", weights])
    assert w.wait_exit() == 0
    a = world.engine("engine-a", "--role", "loader", "--weights", weights)
    a_port = serving_port(a)
    assert probes(a) == (200, 200, 200)
    assert state(a) == "active"
    b = world.engine("engine-b", "--role", "follower")
    b.wait_log(r"event=lock_waiting")
    assert state(b) == "standby"
    assert probes(b) == (200, 200, 200)  # a healthy standby stays in service

    before = {}
    for seed in (0, 1, 12345):
        st, body = http(a_port, f"/infer?seed={seed}", method="POST" if seed == 1 else "GET")
        assert st == 200
        before[seed] = json.loads(body)
        assert before[seed]["engine"] == "engine-a"
        assert len(before[seed]["result"]) == 8
        assert re.fullmatch(r"[0-9a-f]{16}", before[seed]["checksum"])
    assert before[0]["checksum"] != before[1]["checksum"]
    epoch_a = before[0]["epoch"]
    assert http(a_port, "/infer?seed=-3")[0] == 400

    a.p.send_signal(signal.SIGKILL)
    a.wait_exit()
    b_port = serving_port(b)
    wait_for(lambda: state(b) == "active", "engine-b active")
    assert probes(b) == (200, 200, 200)
    for seed, old in before.items():
        st, body = http(b_port, f"/infer?seed={seed}")
        assert st == 200
        new = json.loads(body)
        assert new["engine"] == "engine-b"
        assert new["result"] == old["result"]
        assert new["checksum"] == old["checksum"]
        assert new["epoch"] > epoch_a  # fencing: the new grant has a higher epoch

    st, text = http(b.probe_port, "/metrics")
    assert st == 200
    assert metric(text, "gf_engine_failovers_total") == 1
    assert metric(text, 'gf_engine_state{state="active"}') == 1
    for phase in ("lock_wait", "remap", "private_alloc", "serve", "total"):
        v = metric(text, f'gf_engine_last_failover_seconds{{phase="{phase}"}}')
        assert v is not None and v >= 0, phase
    for phase in ("remap", "private_alloc", "serve", "total"):
        assert metric(text, f'gf_engine_failover_duration_seconds_count{{phase="{phase}"}}') == 1, phase
        assert metric(text, f'gf_engine_failover_duration_seconds_bucket{{phase="{phase}",le="+Inf"}}') == 1
    # The same breakdown, in the seconds a dashboard sums up.
    total = metric(text, 'gf_engine_last_failover_seconds{phase="total"}')
    assert metric(text, 'gf_engine_failover_duration_seconds_sum{phase="total"}') == total
    assert promtool_check(text) == ""
    log = b.text()
    for event in ("event=lock_granted epoch=", "event=weights_remapped us=", "event=kv_allocated us=",
                  "event=serving"):
        assert event in log, event


def test_wake_carries_the_grant_proof_to_a_fenced_gms(world):
    """gf-gmsd --lock: the engine's connects after its grant carry the grant's
    fence proof (the GMS logs the epoch and proof=1), and a takeover's too."""
    world.lockd()
    gmsd = world.gmsd("--lock", world.lock_uri)
    weights = os.path.join(world.dir, "w.safetensors")
    assert world.start("writer", [ENGINE, "--write-weights", weights]).wait_exit() == 0
    a = world.engine("engine-a", "--role", "loader", "--weights", weights)
    a_port = serving_port(a)
    epoch_a = json.loads(http(a_port, "/infer?seed=0")[1])["epoch"]
    gmsd.wait_log(rf"event=connect .* lock_epoch={epoch_a} proof=1")
    b = world.engine("engine-b", "--role", "follower")
    b.wait_log(r"event=lock_waiting")
    a.p.send_signal(signal.SIGKILL)
    a.wait_exit()
    b_port = serving_port(b)
    wait_for(lambda: state(b) == "active", "engine-b active")
    epoch_b = json.loads(http(b_port, "/infer?seed=0")[1])["epoch"]
    assert epoch_b > epoch_a
    gmsd.wait_log(rf"event=connect .* lock_epoch={epoch_b} proof=1")
    assert "event=rw_refused" not in gmsd.text()


def test_gms_loss_terminates_active_engine(world):
    world.lockd()
    gmsd = world.gmsd()
    a = world.engine("engine-a")
    serving_port(a)
    assert state(a) == "active"
    gmsd.p.send_signal(signal.SIGKILL)
    gmsd.wait_exit()
    # Default loss policy: SIGTERM to itself, clean shutdown, exit status 70.
    assert a.wait_exit() == 70
    log = a.text()
    assert "event=engine_lost" in log
    assert "err=GF_ERR_GMS_LOST" in log


def test_gms_loss_terminates_active_engine_under_load(world):
    """The same, round after round, with CPU-bound processes beside it and
    the signal thread lingering after each stop request
    (GF_ENGINE_TEST_SIGNAL_LAG_MS): exit 70 every time. A SIGTERM handled
    late once met an engine main had already freed (SIGSEGV, -11), and the
    signal thread read main's stack after main returned."""
    world.lockd()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        for n in range(5):  # bounded: a few rounds, each ends by itself
            world.gms_uri = f"unix://{world.dir}/gms-round{n}.sock"
            gmsd = world.gmsd()
            a = world.engine(f"engine-r{n}", env={"GF_ENGINE_TEST_SIGNAL_LAG_MS": "50"})
            serving_port(a)
            gmsd.p.send_signal(signal.SIGKILL)
            gmsd.wait_exit()
            status = a.wait_exit()
            log = a.text()
            assert status == 70, f"round {n}: exit {status}\n{log}"
            assert "Sanitizer" not in log, log
    finally:
        for b in burners:
            b.kill()
            b.wait()


def test_hung_wake_fails_live_after_waking_timeout(world):
    world.lockd()
    world.gmsd()
    a = world.engine("engine-a", "--waking-timeout", "1s",
                     env={"GF_ENGINE_TEST_HANG_WAKE_MS": "60000"})
    a.wait_log(r"event=test_hang_wake")
    assert state(a) == "waking"
    t0 = time.monotonic()
    wait_for(lambda: http(a.probe_port, "/live")[0] == 503, "/live 503 after the waking timeout")
    assert time.monotonic() - t0 < HANG_GUARD
    # Only liveness fails: startup passed, readiness is not what kills the container.
    assert probes(a) == (200, 503, 200)
    assert state(a) == "waking"
    a.p.send_signal(signal.SIGTERM)
    assert a.wait_exit() == 0


def test_probes_in_init_and_clean_stop(world):
    world.lockd()
    world.gmsd()
    # A follower with no loader waits in Init for a commit that never comes.
    b = world.engine("engine-b", "--role", "follower")
    time.sleep(0.2)
    assert state(b) == "init"
    assert probes(b) == (503, 503, 503)
    assert http(b.probe_port, "/nope")[0] == 404
    b.p.send_signal(signal.SIGTERM)
    assert b.wait_exit() == 0


def test_standby_stops_cleanly_on_sigterm(world):
    world.lockd()
    world.gmsd()
    a = world.engine("engine-a")
    serving_port(a)
    b = world.engine("engine-b", "--role", "follower")
    b.wait_log(r"event=lock_waiting")
    # A standby's exposition (nothing measured yet) is as clean as an active one's.
    st, text = http(b.probe_port, "/metrics")
    assert st == 200
    assert metric(text, 'gf_engine_state{state="standby"}') == 1
    assert metric(text, 'gf_engine_failover_duration_seconds_count{phase="total"}') == 0
    assert promtool_check(text) == ""
    b.p.send_signal(signal.SIGTERM)
    assert b.wait_exit() == 0
    a.p.send_signal(signal.SIGTERM)
    assert a.wait_exit() == 0


def test_bad_input(world):
    bad = os.path.join(world.dir, "bad.safetensors")
    with open(bad, "wb") as f:
        f.write((1000).to_bytes(8, "little") + b'{"a": ')
    p = world.start("bad", [ENGINE, "--lock", "unix:///nonexistent", "--gms", "unix:///nonexistent",
                            "--weights", bad])
    assert p.wait_exit() == 1
    assert "truncated" in p.text()
    for argv, code in (([], 2), (["--role", "leader"], 2), (["--port", "99999"], 2),
                       (["--waking-timeout", "soon"], 2), (["--kv-bytes", "12Q"], 2),
                       (["--backend", "cuda"], 2), (["--help"], 0), (["--version"], 0)):
        p = world.start("args", [ENGINE, *argv])
        assert p.wait_exit() == code, (argv, p.text())


def test_lock_loss_terminates_active_engine(world):
    lockd = world.lockd()
    world.gmsd()
    a = world.engine("engine-a", "--lock-reconnect-timeout", "500ms")
    serving_port(a)
    lockd.p.send_signal(signal.SIGKILL)
    lockd.wait_exit()
    # Back without a reconnect window: the reclaim is refused, the lock is
    # lost for good. (Merely gone, a unix server leaves the holder holding
    # on: docs/design.md, decision 31.)
    world.lockd("--reconnect-window", "0")
    assert a.wait_exit() == 70
    log = a.text()
    assert "event=engine_lost" in log
    assert "err=GF_ERR_LOCK_LOST" in log


def test_wake_against_fresh_gms_fails(world):
    """Decision 6: a GMS that restarted while the standby slept has no commit;
    the remap times out and the wake is fatal, not a hang."""
    world.lockd()
    gmsd = world.gmsd()
    a = world.engine("engine-a")
    serving_port(a)
    b = world.engine("engine-b", "--role", "follower", "--remap-timeout", "500ms")
    b.wait_log(r"event=lock_waiting")
    a.p.send_signal(signal.SIGSTOP)  # A cannot notice the GMS going away
    gmsd.p.send_signal(signal.SIGKILL)
    gmsd.wait_exit()
    world.gmsd()
    a.p.send_signal(signal.SIGKILL)
    a.wait_exit()
    assert b.wait_exit() == 1
    log = b.text()
    assert "event=wake_failed" in log
    assert "GF_ERR_TIMEOUT" in log
    assert "event=endpoint_listening" not in log


def test_startup_deadline_ends_stuck_engine(world):
    """Seed 001 #444: a follower whose loader never commits is not waited on
    forever; at its startup deadline it is Dead and exits 70."""
    world.lockd()
    world.gmsd()
    b = world.engine("engine-b", "--role", "follower", "--startup-deadline", "1s")
    b.wait_log(r"event=probe_listening")
    assert b.wait_exit() == 70
    log = b.text()
    assert "event=startup_deadline" in log
    assert "cause=startup_deadline" in log
    assert "err=GF_ERR_TIMEOUT" in log


def test_follower_init_timeout_ends_wait_for_a_loader_that_never_comes(world):
    """The follower's fail-fast bound on waiting for a commit: with no loader
    it does not wait in Init for ever (the default is 30 min, here 1 s), it
    exits non-zero with an error naming the GMS and saying no writer came."""
    world.lockd()
    world.gmsd()
    b = world.engine("engine-b", "--role", "follower", "--init-timeout", "1s")
    assert b.wait_exit() != 0
    log = b.text()
    assert "event=init_timeout" in log and "reason=no_writer" in log
    assert "no committed layout" in log and "no writer connected for 1.0 s" in log
    assert world.gms_uri in log


def test_memory_gate_refuses_a_wake_that_would_not_fit(world):
    """The standby is granted the lock on a machine without room for its KV
    memory: it waits at the gate for the waking timeout, then is Dead with the
    reason and exits, without allocating anything."""
    world.lockd()
    world.gmsd()
    a = world.engine("engine-a")
    serving_port(a)
    b = world.engine("engine-b", "--role", "follower", "--waking-timeout", "1s",
                     env={"GF_MEM_HOST_AVAILABLE": "4096"})
    b.wait_log(r"event=lock_waiting")
    a.p.send_signal(signal.SIGKILL)
    a.wait_exit()
    b.wait_log(r"event=memory_gate_waiting")
    assert b.wait_exit() == 1
    log = b.text()
    assert re.search(r"event=memory_gate_closed .*device 0 has 4096 free bytes, the wake needs 4194304", log)
    assert "cause=memory_gate" in log
    assert "event=weights_remapped" not in log
    assert "event=endpoint_listening" not in log


def alive(pid):
    """Is @pid a live process (not a zombie)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ranks_world(world):
    """gf-lockd and two gf-gmsd (one per rank); the engines' extra arguments."""
    world.lockd()
    world.gmsd()
    gms1 = f"unix://{world.dir}/gms1.sock"
    p = world.start("gmsd1", [GMSD, "--listen", gms1, "--backend", "host"])
    p.wait_log(r'msg="?ready')
    return ["--ranks", "2", "--gms", gms1]


def rank_pid(p, rank):
    return int(p.wait_log(rf"event=rank_started rank={rank} pid=(\d+)").group(1))


def test_ranks_one_rank_dies_the_engine_ends_and_the_lock_passes(world):
    """--ranks 2: one process per rank, one lock holder. When rank 1 dies,
    the whole engine ends (exit 70, rank 0 too), so the lock passes to the
    standby, whose ranks both serve the same weights."""
    extra = ranks_world(world)
    a = world.engine("engine-a", "--role", "loader", *extra)
    a_port = serving_port(a)
    a1 = rank_pid(a, 1)
    b = world.engine("engine-b", "--role", "follower", *extra)
    b.wait_log(r"event=lock_waiting")
    b1 = rank_pid(b, 1)
    assert "event=ranks_asleep ranks=2" in b.text()
    st, body = http(a_port, "/infer?seed=7")
    assert st == 200
    before = json.loads(body)
    assert len(before["ranks"]) == 1 and re.fullmatch(r"[0-9a-f]{16}", before["ranks"][0])

    os.kill(a1, signal.SIGKILL)
    assert a.wait_exit() == 70
    log = a.text()
    assert "event=rank_lost rank=1" in log
    assert not alive(a1)
    b_port = serving_port(b)
    wait_for(lambda: state(b) == "active", "engine-b active")
    st, body = http(b_port, "/infer?seed=7")
    assert st == 200
    after = json.loads(body)
    assert after["engine"] == "engine-b" and after["epoch"] > before["epoch"]
    assert after["checksum"] == before["checksum"]
    assert after["ranks"] == before["ranks"]  # rank 1 of engine-b woke on the same weights
    assert alive(b1)


def test_ranks_die_with_rank_zero(world):
    """SIGKILL of rank 0 (the lock holder): no rank outlives it, and the
    standby takes over."""
    extra = ranks_world(world)
    a = world.engine("engine-a", "--role", "loader", *extra)
    serving_port(a)
    a1 = rank_pid(a, 1)
    b = world.engine("engine-b", "--role", "follower", *extra)
    b.wait_log(r"event=lock_waiting")
    a.p.send_signal(signal.SIGKILL)
    a.wait_exit()
    wait_for(lambda: not alive(a1), "rank 1 of engine-a gone")
    serving_port(b)
    wait_for(lambda: state(b) == "active", "engine-b active")


def test_ranks_are_rank_engines_registered_with_the_lock(world):
    """Each rank is a rank engine (its GMS watched once serving) whose pid
    rank 0 registered with the lock: a GMS lost under rank 1 ends rank 1 by
    its loss policy, and with it the whole engine."""
    world.lockd()
    world.gmsd()
    gms1 = f"unix://{world.dir}/gms1.sock"
    g1 = world.start("gmsd1", [GMSD, "--listen", gms1, "--backend", "host"])
    g1.wait_log(r'msg="?ready')
    a = world.engine("engine-a", "--role", "loader", "--ranks", "2", "--gms", gms1)
    serving_port(a)
    a1 = rank_pid(a, 1)
    st = json.loads(http(a.probe_port, "/state")[1])
    assert st["state"] == "active" and st["rank"] == 0 and st["holder_pids"] == 1
    g1.p.send_signal(signal.SIGKILL)
    g1.wait_exit()
    assert a.wait_exit() == 70
    log = a.text()
    # Rank 1's own loss policy (SIGTERM to itself), then the engine's.
    assert "err=GF_ERR_GMS_LOST" in log, log
    assert "event=rank_lost rank=1 msg=\"rank 1 was killed by signal 15" in log, log
    assert not alive(a1)


def test_ranks_bad_usage(world):
    for extra in (["--ranks", "2"], ["--ranks", "0"], ["--ranks", "x"]):
        p = world.start("bad", [ENGINE, "--lock", world.lock_uri, "--gms", world.gms_uri, *extra])
        assert p.wait_exit() == 2
        assert "--ranks" in p.text()


def test_lock_secret_file_over_tcp(world):
    """--lock-secret-file: the engine is granted by a tcp:// gf-lockd that
    requires the secret; a wrong one fails the acquire with
    GF_ERR_PERMISSION; a missing or empty file stops it at start (exit 2)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"tcp://127.0.0.1:{port}"
    secret = os.path.join(world.dir, "lock.secret")
    with open(secret, "w") as f:
        f.write("c-engine-tcp-secret-0123456789\n")
    wrong = os.path.join(world.dir, "wrong.secret")
    with open(wrong, "w") as f:
        f.write("not-the-secret\n")
    empty = os.path.join(world.dir, "empty.secret")
    with open(empty, "w") as f:
        f.write("\n")
    lockd = world.start("lockd-tcp", [LOCKD, "--listen", uri, "--state-file", f"{world.dir}/tcp.state",
                                      "--secret-file", secret])
    lockd.wait_log(r'msg="?ready')
    world.gmsd()
    a = world.engine("engine-a", "--lock", uri, "--lock-secret-file", secret)
    serving_port(a)
    assert state(a) == "active"
    b = world.engine("engine-b", "--lock", uri, "--lock-secret-file", wrong, "--role", "follower")
    assert b.wait_exit() == 1
    assert re.search(r"event=failed state=standby err=GF_ERR_PERMISSION", b.text()), b.text()
    for name, path, what in (("missing", os.path.join(world.dir, "none"), "No such file"),
                             ("empty", empty, "empty secret")):
        p = world.start(name, [ENGINE, "--lock", uri, "--gms", world.gms_uri, "--lock-secret-file", path])
        assert p.wait_exit() == 2
        assert f"--lock-secret-file {path}: {what}" in p.text(), p.text()
    assert state(a) == "active"
