# SPDX-License-Identifier: Apache-2.0
"""``gf-vllm``: vLLM's OpenAI API server as one member of a primary/standby pair.

    gf-vllm serve MODEL [vLLM server arguments] --lock URI --gms URI --id ID
        [--role loader|follower] [--listener NAME] [--probe-port N] ...

(``python -m gpufailover.vllm serve ...`` is the same.) The vLLM server
arguments are those of ``vllm serve`` (the model first, or --model); the
gf-vllm options may stand anywhere among them, and everything after ``--``
goes to vLLM as it is. This adds ``--worker-cls
gpufailover.vllm.worker.GfWorker``; the engine state machine runs in that
worker, behind vLLM's sleep-mode backend ``gpufailover``, and this process
drives it with vLLM's own sleep and wake:

    start vLLM (the worker loads and commits the weights, or maps them; the
       KV cache's tensors lie over the engine's reserved, unbacked region)
    -> sleep: Standby, the weights unmapped; uvicorn started with no socket
    -> wake_up: blocks until the lock is granted; memory gate, the KV region
       backed, remap; the lock's listening socket is passed here
    -> that socket added to the running uvicorn -> serve: Active.

A standby has no HTTP socket at all: clients connect to the lock's
listener (gf-lockd --listener NAME=URI), whose backlog keeps them during a
failover until the new holder accepts. Without --listener the server binds
vLLM's --host/--port after the grant.

The process tree dies as one: this process leads its process group; the
engine processes get SIGKILL when their parent dies (PR_SET_PDEATHSIG), this
process kills the group when a worker process exits, and the engine's
loss policy (lock or GMS lost) kills the group. A killed tree cannot remove
vLLM's /dev/shm files: each launcher lists its tree's files (every second
from its start until Active) and, at its start, removes those of trees that
are gone (:mod:`gpufailover.vllm.shm_files`).

While Active, a heartbeat crosses vLLM's RPC path every second (API server
-> engine core -> workers); missed for --hang-timeout, the worker's /live
turns 503 and the tree is killed. SIGTERM and a planned switchover drain
(:class:`HandOver`): stop accepting, finish what was accepted, end the tree.
Before vLLM starts, the lock and GMS URIs are checked (:func:`check_servers`).
"""
import argparse
import asyncio
import ctypes
import json
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
from typing import Any, Optional, Sequence, cast

from . import shm_files
from .worker import CONFIG_ENV, HANG_RED_BEFORE_KILL_S, PR_SET_PDEATHSIG

WORKER_CLS = "gpufailover.vllm.worker.GfWorker"
KV_SCHEDULER = "gpufailover.vllm.kv_scheduler.Scheduler"
PROG = "gf-vllm"
# Exit statuses of the launcher (docs/vllm.md, "Faults and what clients see").
EXIT_USAGE = 2  # argparse's: an option or URI that does not parse
EXIT_ENGINE_LOST = 70  # as the engine's loss policy: a worker exited, or the engine core or a worker hung
EXIT_UNAVAILABLE = 69  # the early checks: the lock server or the GMS does not answer
EXIT_SWITCHOVER = 75  # GF_ENGINE_EXIT_SWITCHOVER: drained after a planned switchover; restart as a standby
SHM_RECORD_S = 1.0  # how often the tree's /dev/shm files are listed until Active


def log(event: str, **kv: Any) -> None:
    fields = " ".join(f"{k}={v}" for k, v in kv.items())
    sys.stderr.write(f"mono_us={time.monotonic_ns() // 1000} prog=gf-vllm component=server pid={os.getpid()} "
                     f"event={event} {fields}\n")
    sys.stderr.flush()


def die(reason: str, status: int = 1) -> None:
    """Take the whole vLLM tree down (this process included)."""
    log("exit", status=status, reason=json.dumps(reason))
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(status)


_switchover_asked = threading.Event()  # SIGUSR1 before HandOver took over the signal


def end_tree(reason: str, status: int) -> None:
    """End the tree after a drain with exit status @status: every other
    process of the group first (SIGKILL: the lock passes once all of them
    are gone), then this one, so a supervisor sees @status, not SIGKILL."""
    from gpufailover import _gpufailover
    _gpufailover._group_watches_off()  # the exits below are this process's doing, not a fault
    log("exit", status=status, reason=json.dumps(reason))
    me, group = os.getpid(), os.getpgid(0)
    end = time.monotonic() + 10.0
    while time.monotonic() < end:
        others = [pid for pid in shm_files.group_members(group) if pid != me]
        if not others:
            break
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    os._exit(status)


def watch_engine_process(pid: int) -> None:
    """Kill the tree when a worker process (rank 0 holds the lock) exits (a SIGKILL of it or of vLLM's engine process, the loss policy, a
    crash): an API server without its engine must not keep the listening
    socket and accept connections it cannot serve. A C thread watches (no
    wait for the GIL, which the serving event loop holds); end_tree() turns
    the watches off before it kills the tree's other processes itself."""
    from gpufailover import _gpufailover
    reason = json.dumps(f"the engine's worker process {pid} exited")
    try:
        _gpufailover._kill_group_on_exit(pid, f"prog=gf-vllm component=server pid={os.getpid()} event=exit "
                                              f"status={EXIT_ENGINE_LOST} reason={reason}")
    except ProcessLookupError:
        die(f"the engine's worker process {pid} exited", EXIT_ENGINE_LOST)


def children_die_with_this_process() -> None:
    """vLLM's engine process (forked from here) gets SIGKILL the moment this
    process's main thread dies (PR_SET_PDEATHSIG), and its worker with it (the
    worker's own), so a SIGKILL of this process takes the tree down at once:
    the watch of this process's pid (tie_to_server) fires only once it has
    freed all its memory, and the engine and worker would start freeing
    theirs only then. Only children forked by the main thread: the signal
    follows the forking thread, and another thread may end first."""
    launcher = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)
    forked_by_main = [False]

    def before() -> None:
        forked_by_main[0] = threading.current_thread() is threading.main_thread()

    def in_child() -> None:
        if forked_by_main[0] and libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0 \
                and os.getppid() != launcher:
            os.kill(os.getpid(), signal.SIGKILL)  # the launcher died before the prctl

    os.register_at_fork(before=before, after_in_child=in_child)


def parse_duration(text: str) -> float:
    import gpufailover as gf
    try:
        return gf.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} serve", allow_abbrev=False,
        usage=f"{PROG} serve MODEL [vLLM server arguments] --lock URI --gms URI --id ID [options]",
        description="vLLM's OpenAI API server as a member of a gpufailover primary/standby pair. Every argument "
                    "that is not one of these (and all after --) goes to vLLM's server.")
    p.add_argument("--lock", required=True, help="lock server URI")
    p.add_argument("--lock-secret-file", metavar="PATH", default=None,
                   help="the shared secret a tcp:// lock server requires, read as gf-lockd --secret-file reads it "
                        "(trailing newline dropped); read once here and handed to the worker's engine")
    p.add_argument("--gms", required=True, help="GMS URI; {rank} is replaced by the worker's local rank")
    p.add_argument("--id", required=True, help="engine id (unique per member)")
    p.add_argument("--role", choices=["loader", "follower"], default="loader",
                   help="loader: may load and commit the weights; follower: only maps committed ones")
    p.add_argument("--backend", choices=["auto", "host", "cuda"], default="auto")
    p.add_argument("--listener", metavar="NAME", help="serve from the lock's listening socket NAME")
    p.add_argument("--probe-port", type=int, default=None, help="the engine's /live /ready /metrics /state")
    p.add_argument("--probe-address", default=None)
    p.add_argument("--waking-timeout", type=parse_duration, default=120.0)
    p.add_argument("--remap-timeout", type=parse_duration, default=30.0)
    p.add_argument("--lock-reconnect-timeout", type=parse_duration, default=None,
                   help="how long the lock client reconnects after losing its server (default 12s); past it a "
                        "unix:// member holds on and keeps trying, a tcp:// one reports the lock lost "
                        "(docs/lock.md)")
    p.add_argument("--init-timeout", type=parse_duration, default=600.0,
                   help="how long Init waits for the GMS and a follower for the loader's commit (fail-fast)")
    p.add_argument("--keep-handles", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the GMS handles while asleep (a wake maps without fd passing); --no-keep-handles "
                        "releases them at sleep, so a standby pins none of the GMS's memory")
    p.add_argument("--private-param", action="append", default=[], metavar="REGEX",
                   help="parameters (by name) the model writes after loading: each engine keeps its own copy "
                        "(added to the built-in list of fp8 scales)")
    p.add_argument("--kv-pool", action="store_true",
                   help="keep the KV cache in the GMS's KV pool (a GMS fenced by --lock): the standby's wake maps "
                        "the previous holder's cache and starts with its prefix cache (one rank only)")
    p.add_argument("--cpu-repack", action="store_true",
                   help="let vLLM's CPU path repack linear weights into private memory (not shared)")
    p.add_argument("--hang-timeout", type=parse_duration, default=30.0,
                   help="while Active, a heartbeat goes from the API server through the engine core to every "
                        "worker each second; missed for this long on either side, /live and /ready turn 503 and "
                        "the tree is killed (a model step longer than this reads as a hang); 0: off")
    p.add_argument("--drain-timeout", type=parse_duration, default=30.0,
                   help="SIGTERM or a planned switchover: stop accepting, let the accepted requests finish "
                        "(streams too) for at most this long, then end the tree")
    p.add_argument("--check-timeout", type=parse_duration, default=10.0,
                   help="before vLLM starts, wait at most this long for the lock server and the GMS to answer "
                        "(exit status 69 if not); 0: no check")
    return p


def read_lock_secret(path: str) -> bytes:
    """--lock-secret-file as gf-lockd reads its --secret-file: the first 4096
    bytes, trailing newlines (and CRs) dropped. A file that cannot be read
    or holds nothing ends the launcher with EXIT_USAGE, naming the option."""
    try:
        with open(path, "rb") as f:
            secret = f.read(4096).rstrip(b"\r\n")
    except OSError as e:
        print(f"{PROG}: --lock-secret-file {path}: {e.strerror or e}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if not secret:
        print(f"{PROG}: --lock-secret-file {path}: empty secret", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    return secret


def parse_args(argv: Sequence[str]) -> "tuple[argparse.Namespace, list[str]]":
    """``serve`` and the gf-vllm options; the rest in order, for vLLM."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        _parser().print_help()
        sys.exit(0 if argv else 2)
    if argv[0] != "serve":
        print(f"{PROG}: unknown command {argv[0]!r}: the command is `{PROG} serve MODEL [vLLM arguments] "
              "--lock URI --gms URI --id ID`", file=sys.stderr)
        sys.exit(2)
    rest = argv[1:]
    tail: "list[str]" = []
    if "--" in rest:
        cut = rest.index("--")
        rest, tail = rest[:cut], rest[cut + 1:]
    ours, vllm_argv = _parser().parse_known_args(rest)
    for pattern in ours.private_param:
        try:
            re.compile(pattern)
        except re.error as e:
            _parser().error(f"--private-param {pattern!r}: {e}")
    vllm_argv += tail
    if not vllm_argv:
        _parser().error("give the model and vLLM's server arguments")
    ours.lock_secret = read_lock_secret(ours.lock_secret_file) if ours.lock_secret_file else None
    return ours, vllm_argv


# vLLM's options that spread one engine's ranks over several nodes or
# engines: a node then runs fewer local ranks than tensor x pipeline.
_NOT_ONE_NODE = ("--nnodes", "--node-rank", "--headless", "--data-parallel-size", "-dp",
                 "--data-parallel-size-local", "--data-parallel-rank", "--data-parallel-start-rank")


def local_ranks(vllm_argv: Sequence[str]) -> int:
    """How many local ranks (one GMS each) vLLM's arguments ask of this
    node: tensor x pipeline parallel size on one node; 1 when the ranks
    may span nodes or data-parallel engines, or a size does not parse
    (vLLM's own parser says what is wrong with it later)."""
    sizes = {"tp": 1, "pp": 1}
    names = {"--tensor-parallel-size": "tp", "-tp": "tp", "--pipeline-parallel-size": "pp", "-pp": "pp"}
    args = list(vllm_argv)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in _NOT_ONE_NODE:
            return 1
        if name in names:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            try:
                sizes[names[name]] = int(value)
            except ValueError:
                return 1
    n = sizes["tp"] * sizes["pp"]
    return n if 1 <= n <= 1024 else 1


def check_servers(a: argparse.Namespace, vllm_argv: Sequence[str] = ()) -> None:
    """Before vLLM starts (a minute or more): the lock and GMS URIs parse,
    and each server answers a ping within --check-timeout: the lock
    server, then the GMS of every local rank (local_ranks() of the vLLM
    arguments; one when --gms has no {rank}). A URI that does not parse
    exits EXIT_USAGE at once, a server that does not answer
    EXIT_UNAVAILABLE, a lock server that refuses this member (a tcp://
    one without --lock-secret-file or with another secret, a unix:// one
    not allowing this uid) EXIT_USAGE; either way no engine starts and no
    standby shows healthy probes."""
    import gpufailover as gf
    # The library's TimeoutError: gpufailover's __all__ leaves it out (import * must not shadow the builtin).
    from gpufailover._gpufailover import TimeoutError as GfTimeoutError
    ranks = local_ranks(vllm_argv) if "{rank}" in a.gms else 1
    gms = [a.gms.replace("{rank}", str(r)) for r in range(ranks)]
    end = time.monotonic() + a.check_timeout
    lock_secret = a.lock_secret

    def lock_ping(uri: str, timeout: float) -> None:
        gf.lock_ping(uri, timeout, secret=lock_secret)

    for what, option, uri, ping in [("lock server", "--lock", a.lock, lock_ping)] + [
            ("GMS", "--gms", u, gf.gms_ping) for u in gms]:
        while True:
            try:
                ping(uri, max(0.2, min(2.0, end - time.monotonic())))
                break
            except gf.PermissionError as e:
                log("check_failed", what=json.dumps(what), uri=json.dumps(uri), error=json.dumps(str(e)))
                if what == "GMS":
                    break  # it answered: the GMS's own access rules are the engine's to meet
                hint = (f"check --lock-secret-file {a.lock_secret_file}" if lock_secret
                        else "a tcp:// lock server needs --lock-secret-file")
                print(f"{PROG}: --lock {uri}: the lock server refuses this member: {e} ({hint})",
                      file=sys.stderr)
                sys.exit(EXIT_USAGE)
            except ValueError as e:
                log("check_failed", what=json.dumps(what), uri=json.dumps(uri), error=json.dumps(str(e)))
                print(f"{PROG}: {option} {uri!r} is not a usable URI: {e}", file=sys.stderr)
                sys.exit(EXIT_USAGE)
            except gf.ProtocolError as e:
                log("check_failed", what=json.dumps(what), uri=json.dumps(uri), error=json.dumps(str(e)))
                print(f"{PROG}: {option} {uri}: what answers there is not a {what}: {e}", file=sys.stderr)
                sys.exit(EXIT_UNAVAILABLE)
            except (gf.UnreachableError, GfTimeoutError) as e:
                if time.monotonic() >= end:
                    log("check_failed", what=json.dumps(what), uri=json.dumps(uri), error=json.dumps(str(e)))
                    print(f"{PROG}: {option} {uri}: the {what} does not answer ({e}); waited "
                          f"{a.check_timeout:g} s (--check-timeout)", file=sys.stderr)
                    sys.exit(EXIT_UNAVAILABLE)
                time.sleep(0.2)
            except gf.GpuFailoverError:
                break  # it answered, with another refusal: reachable
    log("checked", lock=json.dumps(a.lock), gms=json.dumps(",".join(gms)))


def open_shm_list() -> "Optional[shm_files.FileList]":
    """Remove the /dev/shm files that killed vLLM trees left (shm_files),
    then start this tree's own list. Without a writable /dev/shm, neither."""
    if not os.access(shm_files.SHM_DIR, os.W_OK):
        return None
    try:
        removed, nbytes = shm_files.sweep()
        if removed:
            log("shm_swept", files=removed, bytes=nbytes)
        return shm_files.FileList()
    except OSError as e:
        log("shm_list_failed", error=json.dumps(str(e)))
        return None


_shm_lock = threading.Lock()  # the recording thread and run() write one list
_shm_startup_done = threading.Event()


def record_shm(shm_list: "Optional[shm_files.FileList]", quiet: bool = False) -> None:
    if shm_list is None:
        return
    try:
        with _shm_lock:
            before = len(shm_list.files)
            n = shm_list.record(os.getpgid(0))
        if not quiet or n != before:
            log("shm_listed", files=n, list=shm_list.path)
    except OSError as e:
        log("shm_list_failed", error=json.dumps(str(e)))


def record_shm_while_starting(shm_list: "Optional[shm_files.FileList]") -> None:
    """List the tree's /dev/shm files every SHM_RECORD_S from the launch on,
    until Active: a tree killed while vLLM loads (a crash, an out-of-memory
    kill, a kill during a slow load) has made most of its files by then, and
    the next launcher removes what is listed."""
    if shm_list is None:
        return

    def run() -> None:
        while not _shm_startup_done.wait(SHM_RECORD_S):
            record_shm(shm_list, quiet=True)

    threading.Thread(target=run, name="gf-shm-record", daemon=True).start()


class HandOver:
    """SIGTERM and a planned switchover (the worker's step-down hook sends
    this process SIGUSR1) while Active: stop accepting, finish what was
    accepted within the drain timeout, then end the tree. The lock passes
    on only when every process of the tree is gone, so the standby never
    wakes next to a KV cache of this one (docs/vllm.md, Decision "hand-over
    order")."""

    def __init__(self, server: Any, sock: socket.socket, drain_timeout: float) -> None:
        self.server, self.sock, self.drain_timeout = server, sock, drain_timeout
        self.task: "Optional[asyncio.Task[None]]" = None
        self.beat: "Optional[asyncio.Task[None]]" = None
        loop = asyncio.get_running_loop()
        # Replaces vLLM's own SIGTERM handler (its drain keeps the socket and
        # answers what arrives with HTTP 500).
        loop.add_signal_handler(signal.SIGTERM, self.start, "SIGTERM", 0)
        loop.add_signal_handler(signal.SIGUSR1, self.start, "switchover", EXIT_SWITCHOVER)
        if _switchover_asked.is_set():
            self.start("switchover", EXIT_SWITCHOVER)

    def start(self, reason: str, status: int) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.drain(reason, status))

    async def drain(self, reason: str, status: int) -> None:
        state = self.server.server_state
        t0 = time.monotonic()
        end = t0 + self.drain_timeout
        # Stop accepting on this process's copy of the listening socket; the
        # socket itself (the lock server's) keeps its backlog, so new
        # clients wait there for the next holder and none is refused.
        for s in list(getattr(self.server, "servers", [])):
            s.close()
        self.sock.close()
        log("draining", reason=reason, connections=len(state.connections), requests=len(state.tasks),
            drain_timeout_s=self.drain_timeout)

        def busy() -> bool:
            # A request in flight, or a connection accepted whose request is
            # not read yet (no cycle): closing it would fail that request.
            return bool(state.tasks) or any(getattr(c, "cycle", True) is None for c in state.connections)

        while busy() and time.monotonic() < end:
            await asyncio.sleep(0.02)
        left = len(state.tasks)
        # Idle keep-alive connections are closed between requests (HTTP
        # allows it), the others once their response is out; a closed
        # connection leaves the set once its last bytes are written.
        for c in list(state.connections):
            c.shutdown()
        while state.connections and time.monotonic() < end + 1.0:
            await asyncio.sleep(0.02)
        if self.beat is not None:
            self.beat.cancel()
        log("drained", reason=reason, drain_s=round(time.monotonic() - t0, 3), unfinished=left,
            connections=len(state.connections))
        end_tree(reason, status)


async def heartbeat(client: Any, hang_timeout: float) -> None:
    """While Active: a heartbeat through vLLM's own RPC path (API server ->
    engine core -> every worker). A beat unanswered for @hang_timeout
    (engine core or a worker stopped, deadlocked or spinning) kills the tree
    here; the workers turn /live red when the beats stop coming and kill it
    HANG_RED_BEFORE_KILL_S later (GfWorkerMixin._watch_heartbeat)."""
    interval = min(1.0, hang_timeout / 4)
    while True:
        t0 = time.monotonic()
        try:
            # The workers' /live turns red at @hang_timeout: let it show first.
            await asyncio.wait_for(client.collective_rpc("gf_heartbeat"), hang_timeout + HANG_RED_BEFORE_KILL_S)
        except asyncio.TimeoutError:
            die(f"hung: the engine core did not answer a heartbeat in {hang_timeout:g} s (--hang-timeout)",
                EXIT_ENGINE_LOST)
        except Exception as e:  # noqa: BLE001 - an engine that cannot answer: the tree goes
            die(f"heartbeat failed: {type(e).__name__}: {e}", EXIT_ENGINE_LOST)
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - t0)))


async def run(a: argparse.Namespace, vllm_argv: "list[str]", fd_socket: str,
              shm_list: "Optional[shm_files.FileList]") -> None:
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client  # type: ignore[import-not-found, unused-ignore]
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args  # type: ignore[import-not-found, unused-ignore]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found, unused-ignore]

    parser_class: Any = FlexibleArgumentParser
    parser = make_arg_parser(parser_class(description="vLLM OpenAI-compatible server"))
    args = parser.parse_args(vllm_argv)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    args.worker_cls = WORKER_CLS
    if a.kv_pool:
        # The prefix cache's side of the pool (kv_pool.py) goes into vLLM's
        # engine core process with the scheduler class it imports there.
        if getattr(args, "scheduler_cls", None) not in (None, KV_SCHEDULER):
            die(f"--kv-pool brings its own scheduler class; --scheduler-cls {args.scheduler_cls} cannot go with it", 2)
        args.scheduler_cls = KV_SCHEDULER

    children_die_with_this_process()
    receiver = socket.socket(socket.AF_UNIX)
    receiver.bind(fd_socket)
    receiver.listen(1)

    t_start = time.monotonic()
    async with build_async_engine_client(args) as client:
        log("engine_started", startup_s=round(time.monotonic() - t_start, 3))
        # The HTTP app is built before the grant: a wake then only starts
        # serving it (building it takes seconds).
        app = await build_http_app(client, args)
        # vLLM's own sleep: every rank's worker goes to Standby through the
        # gpufailover sleep-mode backend (vLLM's /sleep takes the same path).
        await client.sleep(1)
        ranks = await client.collective_rpc("gf_info")
        for rank in ranks:  # the lock's holder (rank 0) and every other rank
            watch_engine_process(int(rank["pid"]))
        # The lock passes on only once every rank's process is gone.
        await client.collective_rpc("gf_register_ranks", args=([int(r["pid"]) for r in ranks],))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, record_shm, shm_list)  # a scan of /proc: off the loop
        log("standby", ranks=len(ranks), kv_bytes=sum(int(r["kv_bytes"]) for r in ranks))

        def receive() -> Optional[socket.socket]:
            if not a.listener:
                return None
            conn, _ = receiver.accept()
            with conn:
                _, fds, _, _ = socket.recv_fds(conn, 1, 1)
            return socket.socket(fileno=fds[0])

        got = loop.run_in_executor(None, receive)
        # vLLM's own wake: the backend's resume blocks in rank 0 until the
        # lock is granted, then every rank wakes (rank 0 passes the lock's
        # listening socket here). Asked first, so that this standby is in
        # the lock's queue while uvicorn starts.
        wake = asyncio.ensure_future(client.wake_up())
        # uvicorn starts now, with no socket (the app's lifespan, its state):
        # the wake then only adds the listening socket to the running server.
        http = DeferredHttp(loop)
        serving = asyncio.create_task(serve(app, args, http))
        await http.wait(http.started, serving)
        # vLLM's serve_http put in its SIGTERM handler (a shutdown of the
        # engine client): until Active (HandOver), SIGTERM ends the tree.
        loop.add_signal_handler(signal.SIGTERM, die, "SIGTERM", 0)
        log("http_ready")
        try:
            await wake
        except Exception as e:
            die(f"wake failed: {e}", 1)
        sock = await got
        receiver.close()
        if sock is None:
            from vllm.entrypoints.launchers.launcher import create_server_socket  # type: ignore[import-not-found, unused-ignore]
            sock = create_server_socket((args.host or "", args.port), reuse_port=False)
        addr = sock.getsockname()
        where = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        # Serving once the socket is in the event loop: no request of our
        # own queued behind the clients' in the listener's backlog.
        http.listening.set_result(sock)
        await http.wait(http.serving, serving)
        log("serving", address=where)
        hand_over = HandOver(app.state.server, sock, a.drain_timeout)
        served = await client.collective_rpc("gf_serve")
        log("active", epoch=served[0]["epoch"], address=where,
            **{k: v for k, v in served[0]["metrics"].items() if k.endswith("_us")})
        if a.hang_timeout > 0:
            hand_over.beat = asyncio.create_task(heartbeat(client, a.hang_timeout))
        _shm_startup_done.set()
        await loop.run_in_executor(None, record_shm, shm_list)
        shutdown = await serving
    try:
        await shutdown
    finally:
        sock.close()


async def build_http_app(client: Any, args: argparse.Namespace) -> Any:
    """vLLM's build_and_serve() up to serving: the FastAPI app and its state."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state  # type: ignore[import-not-found, unused-ignore]
    from vllm.entrypoints.launchers.app import build_app  # type: ignore[import-not-found, unused-ignore]

    tasks = await client.get_supported_tasks()
    app = build_app(args, tasks, client.model_config)
    await init_app_state(client, app.state, args, tasks)
    return app


class _DeferredStartup:
    """The startup() of DeferredHttp's server class, ahead of vLLM's uvicorn
    server in its bases: the lifespan without a socket, then the listening
    socket DeferredHttp is given."""
    _gf_http: "DeferredHttp"

    async def startup(self, sockets: Any = None) -> None:
        me: Any = self
        http = self._gf_http
        await cast(Any, super()).startup(sockets=[])  # the lifespan only: no socket, no bind
        if me.should_exit or not me.started:
            return
        http.started.set()
        sock = await http.listening
        config = me.config

        def protocol(_loop: Any = None) -> Any:  # uvicorn's own, as its startup() makes it
            return config.http_protocol_class(config=config, server_state=me.server_state,
                                              app_state=me.lifespan.state, _loop=_loop)

        server = await asyncio.get_running_loop().create_server(protocol, sock=sock, ssl=config.ssl,
                                                                backlog=config.backlog)
        me.servers.append(server)
        http.serving.set()


class DeferredHttp:
    """uvicorn started before the grant: ``started`` once the app's lifespan
    has run (no socket yet); the listening socket set in ``listening`` is then
    added to the running server; ``serving`` once the event loop accepts on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.started = asyncio.Event()
        self.serving = asyncio.Event()
        self.listening: "asyncio.Future[socket.socket]" = loop.create_future()

    def server_class(self, base: type) -> type:
        """vLLM's uvicorn server class, starting as above (made here: its
        base is vLLM's, imported only where vLLM runs)."""
        return type("GfDeferredServer", (_DeferredStartup, base), {"_gf_http": self})

    @staticmethod
    async def wait(event: asyncio.Event, serving: "asyncio.Task[Any]") -> None:
        """Until @event, or the HTTP server ended first (its exception)."""
        waiter = asyncio.ensure_future(event.wait())
        await asyncio.wait({waiter, serving}, return_when=asyncio.FIRST_COMPLETED)
        if not event.is_set():
            waiter.cancel()
            await serving
            raise RuntimeError("the HTTP server stopped before it served")


async def serve(app: Any, args: argparse.Namespace, http: DeferredHttp) -> Any:
    """The rest of vLLM's build_and_serve(): uvicorn, started as @http says
    (returns when it stops)."""
    import vllm.envs as envs  # type: ignore[import-not-found, unused-ignore]
    from vllm.entrypoints.launchers import launcher  # type: ignore[import-not-found, unused-ignore]
    from vllm.entrypoints.launchers.utils.server_utils import get_uvicorn_log_config  # type: ignore[import-not-found, unused-ignore]

    kwargs: "dict[str, Any]" = {}
    log_config = get_uvicorn_log_config(args)
    if log_config is not None:
        kwargs["log_config"] = log_config
    # serve_http makes its server from this module attribute; the one server
    # of this process starts without a socket.
    setattr(launcher, "NoSignalServer", http.server_class(launcher.NoSignalServer))
    return await launcher.serve_http(
        app, sock=None, enable_ssl_refresh=args.enable_ssl_refresh, host=args.host, port=args.port,
        log_level=args.uvicorn_log_level, access_log=not args.disable_uvicorn_access_log,
        timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE, ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile, ssl_ca_certs=args.ssl_ca_certs, ssl_cert_reqs=args.ssl_cert_reqs,
        ssl_ciphers=args.ssl_ciphers, h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
        h11_max_header_count=args.h11_max_header_count, **kwargs)


def main(argv: "Optional[Sequence[str]]" = None) -> int:
    """The ``gf-vllm`` console script."""
    a, vllm_argv = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        os.setpgid(0, 0)  # lead a process group: the tree dies together
    except PermissionError:
        pass  # already a session leader (started with setsid)
    token = secrets.token_hex(8)
    fd_socket = f"\0gf-vllm-{os.getpid()}-{token}"
    os.environ[CONFIG_ENV] = json.dumps({
        "lock": a.lock, "gms": a.gms, "id": a.id, "role": a.role, "backend": a.backend, "listener": a.listener,
        "probe_port": a.probe_port, "probe_address": a.probe_address, "waking_timeout": a.waking_timeout,
        "remap_timeout": a.remap_timeout, "init_timeout": a.init_timeout, "cpu_repack": a.cpu_repack,
        "keep_handles": a.keep_handles, "private_params": a.private_param, "server_pid": os.getpid(),
        "lock_reconnect_timeout": a.lock_reconnect_timeout, "kv_pool": a.kv_pool,
        # Hex: JSON has no bytes. The tree's environment, never a command line.
        "lock_secret": a.lock_secret.hex() if a.lock_secret else None,
        "token": token, "fd_socket": fd_socket, "hang_timeout": a.hang_timeout})
    # Until Active (HandOver drains from there), SIGTERM ends the whole tree:
    # it serves nothing yet.
    signal.signal(signal.SIGTERM, lambda *_: die("SIGTERM", 0))
    # The worker's step-down hook (a planned switchover) sends SIGUSR1: kept
    # until Active, where HandOver drains.
    signal.signal(signal.SIGUSR1, lambda *_: _switchover_asked.set())
    if a.check_timeout > 0:
        check_servers(a, vllm_argv)
    shm_list = open_shm_list()
    record_shm_while_starting(shm_list)
    import uvloop  # type: ignore[import-not-found, unused-ignore]
    try:
        uvloop.run(run(a, vllm_argv, fd_socket, shm_list))
    except Exception as e:  # an engine that failed to start: nothing of it may stay
        die(f"{type(e).__name__}: {e}", 1)
    die("server stopped", 0)
    return 0
