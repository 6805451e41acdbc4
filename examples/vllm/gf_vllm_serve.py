#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs vLLM's OpenAI API server as one member of a primary/standby pair.

    gf_vllm_serve.py --lock URI --gms URI [--role loader|follower] --id ID
        [--listener NAME] [--probe-port N] ... -- <vLLM server arguments>

The vLLM server arguments are those of `vllm serve` / `python -m
vllm.entrypoints.openai.api_server` (the model first, or --model); this
adds --worker-cls gf_worker.GfWorker. The engine state machine runs in that
worker (see gf_worker.py); this process drives it through vLLM's
collective_rpc:

    start vLLM (the worker loads and commits the weights, or maps them)
    -> gf_standby: KV cache freed, weights unmapped
    -> gf_acquire: blocks until the lock is granted; memory gate, remap, KV
       cache allocated again; the lock's listening socket is passed here
    -> uvicorn serves on that socket -> gf_serve: Active.

A standby has no HTTP socket at all: clients connect to the lock's
listener (gf-lockd --listener NAME=URI), whose backlog keeps them during a
failover until the new holder accepts. Without --listener the server binds
vLLM's --host/--port after the grant.

The process tree dies as one: this process leads its process group; the
engine processes get SIGKILL when their parent dies (PR_SET_PDEATHSIG), this
process kills the group when the engine process exits, and the engine's
loss policy (lock or GMS lost) kills the group. A killed tree cannot remove
vLLM's /dev/shm files: each launcher lists its tree's files and, at its
start, removes those of trees that are gone (shm_files.py).
"""
import argparse
import asyncio
import json
import os
import secrets
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
CONFIG_ENV = "GF_VLLM_CONFIG"


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


def watch_engine_process(pid: int) -> None:
    """Kill the tree when a worker process (rank 0 holds the lock) exits (a SIGKILL of it or of vLLM's engine process, the loss policy, a
    crash): an API server without its engine must not keep the listening
    socket and accept connections it cannot serve."""
    fd = os.pidfd_open(pid)

    def wait() -> None:
        select.select([fd], [], [])
        die(f"the engine's worker process {pid} exited", 70)

    threading.Thread(target=wait, name="gf-engine-watch", daemon=True).start()


def parse_duration(text: str) -> float:
    import gpufailover as gf
    try:
        return gf.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_args(argv: "list[str]") -> "tuple[argparse.Namespace, list[str]]":
    if "--" not in argv:
        print("gf_vllm_serve.py: give the vLLM server arguments after --", file=sys.stderr)
        sys.exit(2)
    cut = argv.index("--")
    p = argparse.ArgumentParser(description="vLLM's API server as a member of a gpufailover primary/standby pair.")
    p.add_argument("--lock", required=True, help="lock server URI")
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
    p.add_argument("--init-timeout", type=parse_duration, default=600.0,
                   help="how long Init waits for the GMS and a follower for the loader's commit (fail-fast)")
    p.add_argument("--cpu-repack", action="store_true",
                   help="let vLLM's CPU path repack linear weights into private memory (not shared)")
    return p.parse_args(argv[:cut]), argv[cut + 1:]


def open_shm_list() -> "Optional[Any]":
    """Remove the /dev/shm files that killed vLLM trees left (shm_files.py),
    then start this tree's own list. Without a writable /dev/shm, neither."""
    import shm_files
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


def record_shm(shm_list: "Optional[Any]") -> None:
    if shm_list is None:
        return
    try:
        log("shm_listed", files=shm_list.record(os.getpgid(0)), list=shm_list.path)
    except OSError as e:
        log("shm_list_failed", error=json.dumps(str(e)))


async def run(a: argparse.Namespace, vllm_argv: "list[str]", shm_list: "Optional[Any]") -> None:
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-compatible server"))
    args = parser.parse_args(vllm_argv)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    args.worker_cls = "gf_worker.GfWorker"

    fd_socket = f"\0gf-vllm-{os.getpid()}-{secrets.token_hex(8)}"
    receiver = socket.socket(socket.AF_UNIX)
    receiver.bind(fd_socket)
    receiver.listen(1)

    t_start = time.monotonic()
    async with build_async_engine_client(args) as client:
        log("engine_started", startup_s=round(time.monotonic() - t_start, 3))
        # The HTTP app is built before the grant: a wake then only starts
        # serving it (building it takes seconds).
        app = await build_http_app(client, args)
        standby = await client.collective_rpc("gf_standby")
        for rank in standby:  # the lock's holder (rank 0) and every other rank
            watch_engine_process(int(rank["pid"]))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, record_shm, shm_list)  # a scan of /proc: off the loop
        log("standby", ranks=len(standby), kv_released_bytes=sum(int(r["kv_released_bytes"]) for r in standby))

        def receive() -> Optional[socket.socket]:
            if not a.listener:
                return None
            conn, _ = receiver.accept()
            with conn:
                _, fds, _, _ = socket.recv_fds(conn, 1, 1)
            return socket.socket(fileno=fds[0])

        got = loop.run_in_executor(None, receive)
        try:
            woke = await client.collective_rpc("gf_acquire", args=(fd_socket,))
        except Exception as e:
            die(f"wake failed: {e}", 1)
        if len(woke) > 1:
            try:
                await client.collective_rpc("gf_wake_ranks", args=(woke[0]["granted_mono"],))
            except Exception as e:
                die(f"wake failed on a rank: {e}", 1)
        sock = await got
        receiver.close()
        await client.reset_prefix_cache()
        if sock is None:
            from vllm.entrypoints.launchers.launcher import create_server_socket
            sock = create_server_socket((args.host or "", args.port), reuse_port=False)
        addr = sock.getsockname()
        where = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        log("awake", epoch=woke[0]["epoch"], wake_ms=round(woke[0]["wake_s"] * 1000, 1))
        # vLLM's serve_http returns only when the server stops: serve in a
        # task, and enter Active once /health answers on the socket.
        serving = asyncio.create_task(serve(app, sock, args))
        await wait_healthy(sock, serving)
        served = await client.collective_rpc("gf_serve")
        log("active", epoch=woke[0]["epoch"], address=where,
            **{k: v for k, v in served[0]["metrics"].items() if k.endswith("_us")})
        await loop.run_in_executor(None, record_shm, shm_list)
        shutdown = await serving
    try:
        await shutdown
    finally:
        sock.close()


async def build_http_app(client: Any, args: argparse.Namespace) -> Any:
    """vLLM's build_and_serve() up to serving: the FastAPI app and its state."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    tasks = await client.get_supported_tasks()
    app = build_app(args, tasks, client.model_config)
    await init_app_state(client, app.state, args, tasks)
    return app


async def serve(app: Any, sock: socket.socket, args: argparse.Namespace) -> Any:
    """The rest of vLLM's build_and_serve(): uvicorn on @sock (returns when it stops)."""
    import vllm.envs as envs
    from vllm.entrypoints.launchers.launcher import serve_http
    from vllm.entrypoints.launchers.utils.server_utils import get_uvicorn_log_config

    kwargs: "dict[str, Any]" = {}
    log_config = get_uvicorn_log_config(args)
    if log_config is not None:
        kwargs["log_config"] = log_config
    return await serve_http(
        app, sock=sock, enable_ssl_refresh=args.enable_ssl_refresh, host=args.host, port=args.port,
        log_level=args.uvicorn_log_level, access_log=not args.disable_uvicorn_access_log,
        timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE, ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile, ssl_ca_certs=args.ssl_ca_certs, ssl_cert_reqs=args.ssl_cert_reqs,
        ssl_ciphers=args.ssl_ciphers, h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
        h11_max_header_count=args.h11_max_header_count, **kwargs)


async def wait_healthy(sock: socket.socket, serving: "asyncio.Task[Any]") -> None:
    addr = sock.getsockname()
    while not serving.done():
        try:
            if isinstance(addr, tuple):
                reader, writer = await asyncio.open_connection(addr[0], addr[1])
            else:
                reader, writer = await asyncio.open_unix_connection(addr)
            writer.write(b"GET /health HTTP/1.0\r\nHost: gf\r\n\r\n")
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        except OSError:
            pass
        await asyncio.sleep(0.01)
    await serving  # it ended before serving: its exception


def main(argv: "Optional[list[str]]" = None) -> int:
    a, vllm_argv = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        os.setpgid(0, 0)  # lead a process group: the tree dies together
    except PermissionError:
        pass  # already a session leader (started with setsid)
    sys.path.insert(0, str(HERE))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    os.environ[CONFIG_ENV] = json.dumps({
        "lock": a.lock, "gms": a.gms, "id": a.id, "role": a.role, "backend": a.backend, "listener": a.listener,
        "probe_port": a.probe_port, "probe_address": a.probe_address, "waking_timeout": a.waking_timeout,
        "remap_timeout": a.remap_timeout, "init_timeout": a.init_timeout, "cpu_repack": a.cpu_repack,
        "server_pid": os.getpid()})
    # Until uvicorn installs its handlers, SIGTERM ends the whole tree.
    signal.signal(signal.SIGTERM, lambda *_: die("SIGTERM", 0))
    shm_list = open_shm_list()
    import uvloop
    try:
        uvloop.run(run(a, vllm_argv, shm_list))
    except Exception as e:  # an engine that failed to start: nothing of it may stay
        die(f"{type(e).__name__}: {e}", 1)
    die("server stopped", 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
