# SPDX-License-Identifier: Apache-2.0
"""A vLLM worker (``--worker-cls gf_worker.GfWorker``) whose weights live in
the GPU Memory Service and which runs libgpufailover's engine state machine.
One class for vLLM's CPU and GPU workers; it is started by
``gf_vllm_serve.py``, which passes its configuration in GF_VLLM_CONFIG (JSON).

- Init: ``gf.Engine.init_weights`` connects to the GMS with the configured
  role (loader: RW or RO, follower: RO only). Where RW is granted, vLLM's own
  loader reads the model files and the worker commits every parameter into
  the GMS (one metadata entry per parameter: dtype, shape, stride; the
  format is gpufailover.vllm's); elsewhere it builds the model with dummy
  weights and points each parameter at its read-only mapping, without
  reading the model files. A layout of another model: StaleLayoutError.
- Standby (``gf_standby``): the KV cache's memory is freed (its tensors kept,
  empty) and the weights unmapped (they stay in the GMS).
- Waking (``gf_acquire``): the lock's grant, the memory gate (the KV bytes
  free), remap at the same addresses, the KV cache allocated again, the
  lock's listening socket handed to the API server; all within the waking
  timeout, else the engine is Dead.
- Active (``gf_serve``), Dead: a lost lock or GMS kills the whole vLLM
  process group (the API server and every engine process).

vLLM's CPU path repacks linear weights into private memory (oneDNN /
sgl-kernel, ``dispatch_cpu_unquantized_gemm``); then the weights used for
inference would be private copies. The worker turns that repack off: every
linear layer computes with ``torch.nn.functional.linear`` over the shared
weights (docs/vllm.md has the cost).

GPU-ONLY parts are marked: the writer's weights are allocated straight in
the GMS through the pluggable allocator, and readers bind cuda addresses.
"""
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional

import torch
from vllm.platforms import current_platform

import gpufailover as gf
import gpufailover.vllm as gfv

CONFIG_ENV = "GF_VLLM_CONFIG"
PR_SET_PDEATHSIG = 1

if current_platform.is_cpu():
    from vllm.v1.worker.cpu_worker import CPUWorker as _Base
else:
    from vllm.v1.worker.gpu_worker import Worker as _Base


def log(event: str, **kv: Any) -> None:
    fields = " ".join(f"{k}={v}" for k, v in kv.items())
    sys.stderr.write(f"mono_us={time.monotonic_ns() // 1000} prog=gf-vllm component=worker pid={os.getpid()} "
                     f"event={event} {fields}\n")
    sys.stderr.flush()


def tie_to_server(server_pid: int) -> None:
    """Take the vLLM tree down when the API server (gf_vllm_serve.py) or
    vLLM's engine process dies: vLLM 0.32 leaves its engine and worker
    processes running when the API server is killed. The worker dies with its
    parent, the engine process (PR_SET_PDEATHSIG), and kills the process group
    when the API server exits (a pidfd: the server is its grandparent)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    try:
        fd = os.pidfd_open(server_pid)
    except ProcessLookupError:
        fd = -1
    if fd < 0 or os.getppid() != parent:
        kill_process_group("the API server exited while vLLM started")

    def wait() -> None:
        select.select([fd], [], [])
        kill_process_group(f"the API server (pid {server_pid}) exited")

    threading.Thread(target=wait, name="gf-server-watch", daemon=True).start()


def kill_process_group(reason: str) -> None:
    """The loss policy of a vLLM engine: the whole tree goes (API server,
    engine core, workers), so the lock passes on and no half of the engine
    keeps serving or holding memory."""
    log("dead", reason=json.dumps(reason))
    os.killpg(os.getpgid(0), signal.SIGKILL)


def no_cpu_repack() -> None:
    """Keep CPU linear layers on the shared weights (no private repacked copy)."""
    import vllm.model_executor.layers.utils as layer_utils

    def plain_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    layer_utils.dispatch_cpu_unquantized_gemm = plain_linear


EMPTY_LOAD_FORMAT = "gf_empty"


def register_empty_loader() -> None:
    """A load format that builds the model without reading or initialising
    any weight: the reader's parameters are pointed at the GMS right after."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader(EMPTY_LOAD_FORMAT)
    class EmptyModelLoader(DummyModelLoader):  # type: ignore[misc]
        def load_weights(self, model: torch.nn.Module, model_config: Any) -> None:
            pass


def tensor_at(addr: int, dtype: torch.dtype, shape: "list[int]", stride: "list[int]", device: str) -> torch.Tensor:
    """A tensor over memory at @addr that is not a GMS export (a buffer export
    would keep unmap() from running while the engine sleeps; remap brings the
    memory back at the same address)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    nbytes = max(extent, 1) * itemsize
    if device == "cpu":
        raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)
        return raw.view(dtype).as_strided(shape, stride)
    # GPU-ONLY: a cuda array by address; bfloat16 has no typestr, so 16-bit integers are reinterpreted.
    as_int = {torch.bfloat16: torch.int16}.get(dtype, dtype)
    typestr = {torch.float16: "<f2", torch.float32: "<f4", torch.int8: "|i1", torch.uint8: "|u1",
               torch.int16: "<i2", torch.int32: "<i4", torch.int64: "<i8"}.get(as_int)
    if typestr is None:
        raise NotImplementedError(f"parameter dtype {dtype} has no __cuda_array_interface__ typestr")

    class _DeviceArray:
        __cuda_array_interface__ = {"data": (addr, True), "shape": tuple(shape), "typestr": typestr,
                                    "strides": tuple(s * itemsize for s in stride), "version": 3}

    return torch.as_tensor(_DeviceArray(), device="cuda").view(dtype)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def commit_cpu(gms: gf.GMSClient, model: torch.nn.Module) -> int:
    """Writer, host backend: copy every parameter into one GMS allocation,
    describe it, commit, and point the parameter at the GMS copy."""
    params = list(model.named_parameters())
    offsets, total = gfv.pack([p.numel() * p.element_size() for _, p in params])
    aid = gms.allocate(max(total, 1), "weights.0")
    base = next(a["addr"] for a in gms.allocations if a["id"] == aid)
    for (name, p), off in zip(params, offsets):
        src = p.data.contiguous()
        dst = tensor_at(base + off, p.dtype, list(src.shape), list(src.stride()), "cpu")
        dst.copy_(src)
        gms.put_meta(name, aid, off, gfv.describe(dtype_name(p.dtype), list(src.shape), list(src.stride())))
    generation = gms.commit()
    for (name, p), off in zip(params, offsets):
        p.data = tensor_at(base + off, p.dtype, list(p.shape), list(p.data.contiguous().stride()), "cpu")
    return generation


def commit_gpu(gms: gf.GMSClient, model: torch.nn.Module) -> int:
    """Writer, GPU-ONLY: the parameters were allocated in the GMS by the
    pluggable allocator (weights_pool); record where each lies and commit."""
    allocs = gms.allocations
    for name, p in model.named_parameters():
        ptr = p.data_ptr()
        alloc = next((a for a in allocs if a["addr"] <= ptr < a["addr"] + a["size"]), None)
        if alloc is None:
            raise RuntimeError(f"parameter {name} was not allocated in the GMS")
        gms.put_meta(name, alloc["id"], ptr - alloc["addr"],
                     gfv.describe(dtype_name(p.dtype), list(p.shape), list(p.stride())))
    return gms.commit()


def bind(gms: gf.GMSClient, model: torch.nn.Module, device: str) -> None:
    """Reader: point every parameter at its GMS mapping (zero-copy,
    read-only). Checks the whole layout first, so a layout of another model
    changes no parameter."""
    meta = gms.metadata
    params = list(model.named_parameters())
    entries = [gfv.check_entry(meta, name, dtype_name(p.dtype), list(p.shape)) for name, p in params]
    unknown = sorted(set(meta) - {name for name, _ in params})
    if unknown:
        raise gf.StaleLayoutError(f"the GMS layout has parameters this model lacks ({', '.join(unknown[:3])}): "
                                  "another model was loaded")
    for (_, p), (addr, stride) in zip(params, entries):
        p.data = tensor_at(addr, p.dtype, list(p.shape), stride, device)  # the dummy storage is freed here


class GfWorker(_Base):  # type: ignore[misc, valid-type]
    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        self._gf = json.loads(os.environ[CONFIG_ENV])
        tie_to_server(int(self._gf["server_pid"]))
        # vLLM 0.32 has the model-config field but no command-line flag for it.
        vllm_config.model_config.sleep_mode_backend = gfv.BACKEND_NAME
        super().__init__(vllm_config, *args, **kwargs)
        self._gf_device = "cpu" if current_platform.is_cpu() else "cuda"
        if self._gf_device == "cpu" and not self._gf.get("cpu_repack", False):
            no_cpu_repack()
        self._gf_engine: Optional[gf.Engine] = None  # rank 0
        self._gf_rank_gms: Optional[gf.GMSClient] = None  # ranks 1..N-1
        self._gf_writing: Optional[gf.GMSClient] = None  # the writer's client while vLLM loads
        self._gf_kv: "list[tuple[Any, int]]" = []
        self._gf_granted_at = 0.0

    # --- Init ------------------------------------------------------------
    def _maybe_get_memory_pool_context(self, tag: str) -> Any:
        # GPU-ONLY: the writer's weights are allocated in the GMS; nothing goes
        # to vLLM's CuMem allocator.
        if tag == "weights" and self._gf_writing is not None and self._gf_device == "cuda":
            stack = contextlib.ExitStack()
            pool = torch.cuda.MemPool(gf.torch_allocator().allocator())
            stack.enter_context(gf.torch_pool(self._gf_writing))
            stack.enter_context(torch.cuda.use_mem_pool(pool))
            return stack
        return contextlib.nullcontext()

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        c = self._gf
        uri = c["gms"].replace("{rank}", str(self.local_rank))
        base_load = super().load_model
        loaded: "list[int]" = []

        def load(device: int, gms: gf.GMSClient) -> None:
            t0 = time.monotonic()
            self._gf_writing = gms
            try:
                base_load(load_dummy_weights=load_dummy_weights)
            finally:
                self._gf_writing = None
            model = self.model_runner.get_model()
            generation = commit_cpu(gms, model) if self._gf_device == "cpu" else commit_gpu(gms, model)
            loaded.append(generation)
            log("weights_committed", rank=self.rank, generation=generation, load_s=round(time.monotonic() - t0, 3))

        t0 = time.monotonic()
        if self.rank == 0:
            gms = self._init_engine(uri, load)
        else:
            gms = self._init_rank(uri, load)
        if not loaded:
            register_empty_loader()
            load_config = self.vllm_config.load_config
            load_format, load_config.load_format = load_config.load_format, EMPTY_LOAD_FORMAT
            try:
                base_load(load_dummy_weights=False)
            finally:
                load_config.load_format = load_format
            try:
                bind(gms, self.model_runner.get_model(), self._gf_device)
            except gf.StaleLayoutError as e:
                if self._gf_engine is not None:
                    self._gf_engine.mark_dead(str(e))
                log("stale_layout", rank=self.rank, msg=json.dumps(str(e)))
                raise
            log("weights_mapped", rank=self.rank, bind_s=round(time.monotonic() - t0, 3))

    def _init_engine(self, uri: str, load: Callable[[int, gf.GMSClient], None]) -> gf.GMSClient:
        """Rank 0: the engine (lock, probes, loss policy) over this rank's GMS."""
        c = self._gf
        need = self.cache_config.kv_cache_memory_bytes or 0
        eng = gf.Engine(c["lock"], c["id"], [uri], role=c["role"], backend=c["backend"],
                        waking_timeout=c["waking_timeout"], remap_timeout=c["remap_timeout"],
                        init_timeout=c["init_timeout"], memory_need=need, probe_port=c.get("probe_port"),
                        probe_address=c.get("probe_address"))
        eng.on_loss = lambda code, detail: kill_process_group(f"{gf.strerror(code)}: {detail}")
        server_pid = int(c["server_pid"])
        eng.health = lambda: os.path.exists(f"/proc/{server_pid}")  # /live and /ready while Active
        self._gf_engine = eng
        eng.init_weights(load=load)
        return eng.gms(0)

    def _init_rank(self, uri: str, load: Callable[[int, gf.GMSClient], None]) -> gf.GMSClient:
        """Ranks 1..N-1 (tensor parallelism): one GMS client for this rank's
        device, with the engine's role: the loader's ranks RW or RO, the
        follower's RO only (Decision 5). Every rank commits its own GMS; the
        lock and the probes are rank 0's. A rank's death takes the engine
        down: vLLM's engine process ends with it, and with that rank 0."""
        c = self._gf
        dev = {"device": self.local_rank} if self._gf_device == "cuda" else {}
        mem = gf.Memory(c["backend"], **dev)
        mode = "rw_or_ro" if c["role"] == "loader" else "ro"
        gms = gf.GMSClient(uri, mem, mode=mode, timeout=c["init_timeout"])
        if gms.mode == "rw":
            load(self.local_rank, gms)
        else:
            gms.map_all()
        self._gf_rank_gms = gms
        return gms

    # --- KV cache: released while asleep, re-created at wake ---------------
    def _kv_storages(self) -> "Iterator[Any]":
        seen: "set[int]" = set()
        for t in self.model_runner.kv_caches:
            for x in (t if isinstance(t, (list, tuple)) else [t]):
                st = x.untyped_storage()
                key = st._cdata  # the storage itself (views share it)
                if key not in seen:
                    seen.add(key)
                    yield st

    def _release_kv(self) -> int:
        if not self._gf_kv:
            # The tensors (and every view vLLM bound to its layers) stay; only
            # their storage is emptied, so re-creating it rebinds them all.
            self._gf_kv = [(st, st.nbytes()) for st in self._kv_storages()]
            for st, _ in self._gf_kv:
                st.resize_(0)
            if self._gf_device == "cuda":
                torch.cuda.empty_cache()  # GPU-ONLY
        return sum(n for _, n in self._gf_kv)

    def _restore_kv(self) -> int:
        total = 0
        for st, n in self._gf_kv:
            st.resize_(n)
            torch.empty(0, dtype=torch.uint8, device=st.device).set_(st).zero_()
            total += n
        self._gf_kv = []
        return total

    # --- the states, driven by gf_vllm_serve.py through collective_rpc -----
    def gf_standby(self) -> "dict[str, Any]":
        freed = self._release_kv()
        if self._gf_engine is not None:
            self._gf_engine.sleep()
        elif self._gf_rank_gms is not None:
            self._gf_rank_gms.unmap()
        else:
            raise gf.StateError("the gpufailover worker is not initialised (load_model has not run)")
        log("standby", rank=self.rank, kv_released_bytes=freed, role=self._gf["role"])
        return {"pid": os.getpid(), "rank": self.rank, "kv_released_bytes": freed}

    def gf_acquire(self, fd_socket: str) -> "dict[str, Any]":
        if self.rank != 0:
            return {}  # the lock is rank 0's; the other ranks wake in gf_wake_ranks
        eng = self._engine()
        epoch = eng.acquire()
        granted = time.monotonic()
        self._gf_granted_at = granted
        log("granted", epoch=epoch)
        try:
            eng.wake_up()
            remapped = time.monotonic()
            kv = self._restore_kv()
            self._check_waking("rank 0")
            if self._gf.get("listener"):
                with eng.listener(self._gf["listener"]) as lsock, socket.socket(socket.AF_UNIX) as s:
                    s.connect(fd_socket)
                    socket.send_fds(s, [b"L"], [lsock.fileno()])
        except BaseException as e:
            if eng.state != "dead":
                eng.mark_dead(f"wake failed: {e}")
            log("wake_failed", error=type(e).__name__, msg=json.dumps(str(e)))
            raise
        done = time.monotonic()
        log("awake", rank=0, epoch=epoch, remap_ms=round((remapped - granted) * 1000, 1),
            kv_ms=round((done - remapped) * 1000, 1), kv_bytes=kv)
        return {"epoch": epoch, "granted_mono": granted, "remap_s": remapped - granted, "wake_s": done - granted}

    def gf_wake_ranks(self, granted_mono: float) -> "dict[str, Any]":
        """After rank 0's grant: ranks 1..N-1 remap their GMS (same
        addresses) and re-create their KV cache, within the waking timeout
        counted from the grant."""
        if self.rank == 0 or self._gf_rank_gms is None:
            return {}
        self._gf_granted_at = granted_mono
        t0 = time.monotonic()
        try:
            self._gf_rank_gms.remap(float(self._gf["remap_timeout"]))
            kv = self._restore_kv()
            self._check_waking(f"rank {self.rank}")
        except BaseException as e:
            log("wake_failed", rank=self.rank, error=type(e).__name__, msg=json.dumps(str(e)))
            raise
        log("awake", rank=self.rank, wake_ms=round((time.monotonic() - t0) * 1000, 1), kv_bytes=kv)
        return {"rank": self.rank}

    def _check_waking(self, who: str) -> None:
        waking_timeout = float(self._gf["waking_timeout"])
        if time.monotonic() - self._gf_granted_at > waking_timeout:
            raise gf.TimeoutError(f"{who}: waking took longer than the waking timeout ({waking_timeout:g} s)")

    def gf_serve(self) -> "dict[str, Any]":
        if self.rank != 0:
            return {}
        eng = self._engine()
        eng.serve()
        log("active", epoch=eng.epoch)
        return {"state": eng.state, "metrics": {k: v for k, v in eng.metrics.items() if isinstance(v, (int, float))}}

    def _engine(self) -> gf.Engine:
        if self._gf_engine is None:
            raise gf.StateError("the gpufailover engine is not initialised (load_model has not run)")
        return self._gf_engine
