# SPDX-License-Identifier: Apache-2.0
"""The vLLM worker of ``gf-vllm`` (``--worker-cls
gpufailover.vllm.worker.GfWorker``, set by the launcher): weights in the GPU
Memory Service, the KV cache in the engine's private region, and
libgpufailover's engine state machine behind vLLM's sleep and wake. One class
for vLLM's CPU and GPU workers; the launcher passes its configuration in
GF_VLLM_CONFIG (JSON).

- Init: ``gf.Engine.init_weights`` connects to the GMS with the configured
  role (loader: RW or RO, follower: RO only). Where RW is granted, vLLM's own
  loader reads the model files and the worker commits every parameter into
  the GMS (:func:`commit_cpu`, :func:`commit_gpu`: one metadata entry per
  parameter name, aliases recorded); elsewhere it builds the model with no
  weights and points each parameter at its read-only mapping
  (:func:`bind`), without reading the model files. The engine reserves its
  private region there, and vLLM's KV cache tensors are built over it: they
  have no memory behind them until the wake, and keep their addresses for
  the process's life.
- Sleep and wake go through the ``gpufailover`` sleep-mode backend
  (``gpufailover.vllm``), whether vLLM's ``/sleep`` and ``/wake_up`` or the
  launcher ask: sleep is the engine's Init -> Standby (weights unmapped),
  wake the lock's grant, the memory gate (the KV bytes free), the private
  region backed (retried on out-of-memory until the waking timeout) and the
  weights remapped at their addresses. Rank 0 then hands the lock's
  listening socket to the API server.
- Active, Dead: a lost lock or GMS kills the whole vLLM process group (the
  API server and every engine process), and so does a heartbeat of the API
  server (``gf_heartbeat``) missed for the hang timeout, after /live and
  /ready turned 503 (the engine's health hook). A planned switchover (the
  engine's step-down hook) asks the API server to drain and end the tree.

Tensors a model writes after loading stay private to each engine: the
parameters whose names match :data:`PRIVATE_PARAMS` (or ``--private-param``)
are committed like the others, but every engine works on its own copy (a
write through a read-only mapping is a fatal fault). Buffers are never
shared.

vLLM's CPU path repacks linear weights into private memory (oneDNN /
sgl-kernel, ``dispatch_cpu_unquantized_gemm``); then the weights used for
inference would be private copies. The worker turns that repack off: every
linear layer computes with ``torch.nn.functional.linear`` over the shared
weights (docs/vllm.md has the cost).

GPU-ONLY parts are marked: the writer's weights are allocated straight in
the GMS through the pluggable allocator, and readers bind cuda addresses.

This module imports without torch and vLLM; :data:`GfWorker` (built on
first access over the platform's vLLM worker) needs both.
"""
import contextlib
import ctypes
import importlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterable, Optional, Sequence, Tuple, cast

import gpufailover as gf
import gpufailover.vllm as gfv
from gpufailover import _gpufailover as _gf_ext
# The library's TimeoutError: gpufailover's __all__ leaves it out (import * must not shadow the builtin).
from gpufailover._gpufailover import TimeoutError as GfTimeoutError

CONFIG_ENV = "GF_VLLM_CONFIG"
PR_SET_PDEATHSIG = 1
EMPTY_LOAD_FORMAT = "gf_empty"
# A heartbeat missed for the hang timeout turns /live red; the tree is
# killed this much later, so a prober (or a supervisor) sees the 503 first.
HANG_RED_BEFORE_KILL_S = 1.0

# Parameters a model writes after loading (vLLM's fp8 KV-cache and
# activation scales are rewritten by process_weights_after_loading and
# on every load of new scales): each engine keeps its own copy.
PRIVATE_PARAMS: Tuple[str, ...] = (r"(^|\.)(k|v|q|prob)_scale$", r"(^|\.)input_scale$")

__all__ = ["CONFIG_ENV", "EMPTY_LOAD_FORMAT", "HANG_RED_BEFORE_KILL_S", "PRIVATE_PARAMS", "GfWorkerMixin", "bind",
           "commit_cpu", "commit_gpu", "is_private", "tensor_at"]

def log(event: str, **kv: Any) -> None:
    fields = " ".join(f"{k}={v}" for k, v in kv.items())
    sys.stderr.write(f"mono_us={time.monotonic_ns() // 1000} prog=gf-vllm component=worker pid={os.getpid()} "
                     f"event={event} {fields}\n")
    sys.stderr.flush()


def tie_to_server(server_pid: int) -> None:
    """Take the vLLM tree down when the API server (the launcher) or
    vLLM's engine process dies: vLLM 0.32 leaves its engine and worker
    processes running when the API server is killed. The worker dies with its
    parent, the engine process (PR_SET_PDEATHSIG), and kills the process group
    when the API server exits (a pidfd: the server is its grandparent). That
    watch is a C thread: a Python thread would first wait for the GIL, which
    vLLM's message-queue polling keeps busy, while the lock's holder (this
    process) lives on."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    reason = json.dumps(f"the API server (pid {server_pid}) exited")
    try:
        _gf_ext._kill_group_on_exit(server_pid, f"prog=gf-vllm component=worker pid={os.getpid()} event=dead "
                                                f"reason={reason}")
    except ProcessLookupError:
        kill_process_group("the API server exited while vLLM started")
    if os.getppid() != parent:
        kill_process_group("the API server exited while vLLM started")


def kill_process_group(reason: str) -> None:
    """The loss policy of a vLLM engine: the whole tree goes (API server,
    engine core, workers), so the lock passes on and no half of the engine
    keeps serving or holding memory."""
    log("dead", reason=json.dumps(reason))
    os.killpg(os.getpgid(0), signal.SIGKILL)


def no_cpu_repack() -> None:
    """Keep CPU linear layers on the shared weights (no private repacked copy)."""
    import torch  # type: ignore[import-not-found, unused-ignore]
    import vllm.model_executor.layers.utils as layer_utils  # type: ignore[import-not-found, unused-ignore]

    def plain_linear(layer: Any, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    layer_utils.dispatch_cpu_unquantized_gemm = plain_linear


def register_empty_loader() -> None:
    """A load format that builds the model without reading or initialising
    any weight: the reader's parameters are pointed at the GMS right after."""
    from vllm.model_executor.model_loader import register_model_loader  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader  # type: ignore[import-not-found, unused-ignore]

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        pass

    # Made with type(), not a class statement in this function: a class
    # statement here would read as a module attribute to type checkers.
    register_model_loader(EMPTY_LOAD_FORMAT)(
        type("EmptyModelLoader", (DummyModelLoader,), {"__module__": __name__, "load_weights": load_weights}))


@contextlib.contextmanager
def progress_reports(gms: gf.GMSClient) -> Any:
    """While vLLM's default loader reads the checkpoint, report the bytes
    read so far to the GMS with every tensor: a follower waiting for this
    loader's commit (by progress) then keeps waiting while the load goes on,
    and gives up only when no writer is there or it stalls. Reported from
    the loading path itself, so a hung load reports nothing."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader as _Loader  # type: ignore[import-not-found, unused-ignore]
    loader_class: Any = _Loader
    real = loader_class.get_all_weights

    def get_all_weights(loader: Any, *args: Any, **kwargs: Any) -> Any:
        done = 0
        for name, t in real(loader, *args, **kwargs):
            done += t.numel() * t.element_size()
            gms.report_progress(done)
            yield name, t

    loader_class.get_all_weights = get_all_weights
    try:
        yield
    finally:
        loader_class.get_all_weights = real


def tensor_at(addr: int, dtype: Any, shape: Sequence[int], stride: Sequence[int], device: str) -> Any:
    """A tensor over memory at @addr that is not a GMS export (a buffer export
    would keep unmap() from running while the engine sleeps; remap brings the
    memory back at the same address). Nothing is read or written: the
    memory may be unbacked until the wake."""
    import torch  # type: ignore[import-not-found, unused-ignore]
    itemsize = torch.empty((), dtype=dtype).element_size()
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    nbytes = max(extent, 1) * itemsize
    if device == "cpu":
        raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)
        return raw.view(dtype).as_strided(list(shape), list(stride))
    # GPU-ONLY: a cuda array by address; bfloat16 has no typestr, so 16-bit integers are reinterpreted.
    as_int = {torch.bfloat16: torch.int16}.get(dtype, dtype)
    typestr = {torch.float16: "<f2", torch.float32: "<f4", torch.int8: "|i1", torch.uint8: "|u1",
               torch.int16: "<i2", torch.int32: "<i4", torch.int64: "<i8"}.get(as_int)
    if typestr is None:
        raise NotImplementedError(f"parameter dtype {dtype} has no __cuda_array_interface__ typestr")

    array = type("_DeviceArray", (), {"__cuda_array_interface__": {
        "data": (addr, True), "shape": tuple(shape), "typestr": typestr,
        "strides": tuple(s * itemsize for s in stride), "version": 3}})()
    return torch.as_tensor(array, device="cuda").view(dtype)


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def is_private(name: str, patterns: Iterable[str] = PRIVATE_PARAMS) -> bool:
    """Whether parameter @name is one the model writes after loading (each
    engine keeps a copy of its own)."""
    return any(re.search(p, name) for p in patterns)


def _storage_key(p: Any) -> Tuple[int, str, Tuple[int, ...], Tuple[int, ...]]:
    # Two names are one tensor when they view the same bytes the same way
    # (tied embeddings: one Parameter under two module paths).
    return (p.data_ptr(), str(p.dtype), tuple(p.shape), tuple(p.stride()))


def _named(model: Any) -> "list[tuple[str, Any]]":
    return list(model.named_parameters(remove_duplicate=False))


def _owners(named: "list[tuple[str, Any]]") -> "tuple[list[tuple[str, Any]], dict[str, str]]":
    """The parameters with their first name, and every other name -> that first name."""
    first: "dict[Tuple[int, str, Tuple[int, ...], Tuple[int, ...]], str]" = {}
    unique: "list[tuple[str, Any]]" = []
    alias: "dict[str, str]" = {}
    for name, p in named:
        key = _storage_key(p)
        if key in first:
            alias[name] = first[key]
        else:
            first[key] = name
            unique.append((name, p))
    return unique, alias


def commit_cpu(gms: gf.GMSClient, model: Any, private: Iterable[str] = PRIVATE_PARAMS) -> int:
    """Writer, host backend: copy every parameter into one GMS allocation,
    describe it (an alias: the same bytes under its other name, with
    ``alias_of``), commit, and point the shared parameters at the GMS copy;
    private ones keep the memory vLLM loaded them into."""
    patterns = tuple(private)
    unique, alias = _owners(_named(model))
    offsets, total = gfv.pack([p.numel() * p.element_size() for _, p in unique])
    aid = gms.allocate(max(total, 1), "weights.0")
    base = next(a["addr"] for a in gms.allocations if a["id"] == aid)
    where: "dict[str, tuple[int, list[int]]]" = {}
    for (name, p), off in zip(unique, offsets):
        src = p.data.contiguous()
        stride = list(src.stride())
        tensor_at(base + off, p.dtype, list(src.shape), stride, "cpu").copy_(src)
        gms.put_meta(name, aid, off, gfv.describe(dtype_name(p.dtype), list(src.shape), stride,
                                                  private=is_private(name, patterns)))
        where[name] = (off, stride)
    named = dict(_named(model))
    for name, owner in alias.items():
        p = named[name]
        gms.put_meta(name, aid, where[owner][0], gfv.describe(dtype_name(p.dtype), list(p.shape), where[owner][1],
                                                              alias_of=owner, private=is_private(name, patterns)))
    generation = gms.commit()
    for (name, p), off in zip(unique, offsets):
        if not is_private(name, patterns):
            p.data = tensor_at(base + off, p.dtype, list(p.shape), where[name][1], "cpu")
    return generation


def commit_gpu(gms: gf.GMSClient, model: Any, private: Iterable[str] = PRIVATE_PARAMS) -> int:
    """Writer, GPU-ONLY: the parameters were allocated in the GMS by the
    pluggable allocator (weights_pool); record where each lies (aliases with
    ``alias_of``) and commit. Private parameters are then moved to memory of
    this engine's own."""
    patterns = tuple(private)
    allocs = gms.allocations
    unique, alias = _owners(_named(model))
    for name, p in _named(model):
        ptr = p.data_ptr()
        alloc = next((a for a in allocs if a["addr"] <= ptr < a["addr"] + a["size"]), None)
        if alloc is None:
            raise RuntimeError(f"parameter {name} was not allocated in the GMS")
        gms.put_meta(name, alloc["id"], ptr - alloc["addr"],
                     gfv.describe(dtype_name(p.dtype), list(p.shape), list(p.stride()), alias_of=alias.get(name),
                                  private=is_private(name, patterns)))
    generation = gms.commit()
    for name, p in unique:
        if is_private(name, patterns):
            p.data = p.data.clone()
    return generation


def bind(gms: gf.GMSClient, model: Any, device: str, private: Iterable[str] = PRIVATE_PARAMS) -> None:
    """Reader: point every parameter at its GMS mapping (zero-copy,
    read-only); a private parameter gets a copy of its own. Checks the whole
    layout first, so a layout of another model changes no parameter."""
    patterns = tuple(private)
    meta = gms.metadata
    named = _named(model)
    entries = [gfv.check_entry(meta, name, dtype_name(p.dtype), list(p.shape)) for name, p in named]
    unknown = sorted(set(meta) - {name for name, _ in named})
    if unknown:
        raise gf.StaleLayoutError(f"the GMS layout has parameters this model lacks ({', '.join(unknown[:3])}): "
                                  "another model was loaded")
    _, alias = _owners(named)
    at = {name: addr for (name, _), (addr, _) in zip(named, entries)}
    for name, owner in alias.items():
        if at[name] != at[owner]:
            raise gf.StaleLayoutError(f"this model ties {name} to {owner}, the GMS holds them apart: "
                                      "another model was loaded")
    for (name, p), (addr, stride) in zip(named, entries):
        if name in alias:
            continue  # the same Parameter as its owner: bound once
        t = tensor_at(addr, p.dtype, list(p.shape), stride, device)
        p.data = t.clone() if is_private(name, patterns) else t  # the dummy storage is freed here


class _CuLocation(ctypes.Structure):
    type: int
    id: int
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _CuAllocProp(ctypes.Structure):
    type: int
    requestedHandleTypes: int
    location: _CuLocation
    win32HandleMetaData: Optional[int]
    compressionType: int
    gpuDirectRDMACapable: int
    usage: int
    reserved: Any
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _CuLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class _CuAccessDesc(ctypes.Structure):
    location: _CuLocation
    flags: int
    _fields_ = [("location", _CuLocation), ("flags", ctypes.c_int)]


@contextlib.contextmanager
def _cuda_scratch(addr: int, size: int, device: int) -> Any:
    """GPU-ONLY, not run here (no GPU): while vLLM's Init runs forward
    passes over the KV cache (CUDA graph capture), one granule of device
    memory mapped again and again over the private region's whole reserved
    range, so those passes touch valid memory and the graphs record the
    region's addresses; unmapped and freed before the engine sleeps. The
    standby's Init thus holds one granule (2 MiB), not a KV cache."""
    cu = ctypes.CDLL("libcuda.so.1")
    prop = _CuAllocProp(type=1, location=_CuLocation(type=1, id=device))  # pinned, on the device

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise gf.GpuFailoverError(f"{what} failed (CUresult {rc}) for the KV region's Init scratch")

    gran = ctypes.c_size_t()
    check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "cuMemGetAllocationGranularity")
    handle = ctypes.c_ulonglong()
    check(cu.cuMemCreate(ctypes.byref(handle), gran, ctypes.byref(prop), ctypes.c_ulonglong(0)), "cuMemCreate")
    mapped = 0
    try:
        for off in range(0, size, gran.value):
            check(cu.cuMemMap(ctypes.c_ulonglong(addr + off), gran, ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0)),
                  "cuMemMap")
            mapped = off + gran.value
        desc = _CuAccessDesc(location=_CuLocation(type=1, id=device), flags=3)  # read-write
        check(cu.cuMemSetAccess(ctypes.c_ulonglong(addr), ctypes.c_size_t(mapped), ctypes.byref(desc),
                                ctypes.c_size_t(1)), "cuMemSetAccess")
        yield
        import torch  # type: ignore[import-not-found, unused-ignore]
        torch.cuda.synchronize()
    finally:
        if mapped:
            cu.cuMemUnmap(ctypes.c_ulonglong(addr), ctypes.c_size_t(mapped))
        cu.cuMemRelease(handle)


class _ZerosAt:
    """Stands for the ``torch`` module inside vLLM's KV allocation
    (vllm.v1.worker.utils.allocate_kv_cache, which makes one int8 backing
    with ``torch.zeros``): that backing becomes a tensor over @addr, which
    is neither touched nor zeroed (a region is zero-filled when backed)."""

    def __init__(self, real: Any, addr: int, size: int, device: str) -> None:
        self._real, self._addr, self._size, self._device = real, addr, size, device
        self.made: Optional[int] = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def zeros(self, n: int, *, dtype: Any, device: Any) -> Any:
        if self.made is not None or dtype != self._real.int8 or not isinstance(n, int):
            raise RuntimeError("vLLM allocated its KV cache in a way gpufailover does not know "
                               f"(a second backing, or zeros({n!r}, dtype={dtype})): this vLLM version is not supported")
        if n > self._size:
            raise gf.OutOfMemoryError(f"vLLM's KV cache needs {n} bytes, the engine's private region has "
                                      f"{self._size} (--kv-cache-memory-bytes sizes both)")
        self.made = n
        return tensor_at(self._addr, self._real.int8, [n], [1], self._device)


class GfWorkerMixin:
    """The gpufailover half of :data:`GfWorker` (which puts it before the
    platform's vLLM worker class)."""

    # What the vLLM worker base class provides.
    vllm_config: Any
    model_config: Any
    cache_config: Any
    parallel_config: Any
    model_runner: Any
    rank: int
    local_rank: int

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        self._gf: dict[str, Any] = json.loads(os.environ[CONFIG_ENV])
        tie_to_server(int(self._gf["server_pid"]))
        # vLLM 0.32 has the model-config field but no command-line flag for it.
        vllm_config.model_config.sleep_mode_backend = gfv.BACKEND_NAME
        cast(Any, super()).__init__(vllm_config, *args, **kwargs)
        from vllm.platforms import current_platform  # type: ignore[import-not-found, unused-ignore]
        self._gf_device = "cpu" if current_platform.is_cpu() else "cuda"
        if self._gf_device == "cpu" and not self._gf.get("cpu_repack", False):
            no_cpu_repack()
        self._gf_private: Tuple[str, ...] = PRIVATE_PARAMS + tuple(self._gf.get("private_params", []))
        self._gf_engine: Optional[gf.Engine] = None  # rank 0's (the lock's holder), or a rank engine
        self._gf_writing: Optional[gf.GMSClient] = None  # the writer's client while vLLM loads
        self._gf_kv_range: Optional[Tuple[int, int]] = None  # where the KV cache lives
        self._gf_kv_bytes = 0
        self._gf_granted_at = 0.0
        self._gf_rank_listener: Optional[socket.socket] = None
        self._gf_backend: Any = None
        self._gf_beat: Optional[float] = None  # the last heartbeat (monotonic), once Active

    # --- Init ------------------------------------------------------------
    def _maybe_get_memory_pool_context(self, tag: str) -> Any:
        # GPU-ONLY: the writer's weights are allocated in the GMS; nothing goes
        # to vLLM's CuMem allocator.
        if tag == "weights" and self._gf_writing is not None and self._gf_device == "cuda":
            import torch  # type: ignore[import-not-found, unused-ignore]
            stack = contextlib.ExitStack()
            pool = torch.cuda.MemPool(gf.torch_allocator().allocator())  # type: ignore[attr-defined, unused-ignore]
            stack.enter_context(gf.torch_pool(self._gf_writing))
            stack.enter_context(torch.cuda.use_mem_pool(pool))
            return stack
        return contextlib.nullcontext()

    def _kv_budget(self) -> int:
        """The KV bytes this engine reserves, wakes with and gates on: vLLM's
        --kv-cache-memory-bytes, else (CPU) the memory vLLM's CPU worker
        sizes its KV cache within (VLLM_CPU_KVCACHE_SPACE or its share of
        the node); vLLM's own sizing comes after the load, and the region's
        address is fixed before it."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit:
            return int(explicit)
        requested = getattr(self, "requested_cpu_memory", None)
        if self._gf_device == "cpu" and requested:
            return int(requested)
        raise ValueError("gf-vllm on a GPU needs --kv-cache-memory-bytes: the KV cache's address range is "
                         "reserved before vLLM could profile the memory")

    def _kv_need(self) -> int:
        """The memory gate: the KV bytes vLLM will use. Explicit: those; CPU
        sizing: vLLM's own formula (its budget less what the worker holds),
        taken now, before the load, so an upper bound of the cache. With
        the KV pool none: the wake maps memory that exists."""
        if self._gf.get("kv_pool"):
            return 0
        if self.cache_config.kv_cache_memory_bytes:
            return self._gf_kv_bytes
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return max(0, self._gf_kv_bytes - rss)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        c = self._gf
        uri = c["gms"].replace("{rank}", str(self.local_rank))
        base_load = cast(Any, super()).load_model
        loaded: "list[int]" = []

        def load(device: int, gms: gf.GMSClient) -> None:
            t0 = time.monotonic()
            self._gf_writing = gms
            try:
                with progress_reports(gms):
                    base_load(load_dummy_weights=load_dummy_weights)
            finally:
                self._gf_writing = None
            model = self.model_runner.get_model()
            generation = (commit_cpu(gms, model, self._gf_private) if self._gf_device == "cpu"
                          else commit_gpu(gms, model, self._gf_private))
            loaded.append(generation)
            log("weights_committed", rank=self.rank, generation=generation, load_s=round(time.monotonic() - t0, 3))

        t0 = time.monotonic()
        self._gf_kv_bytes = self._kv_budget()
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
                bind(gms, self.model_runner.get_model(), self._gf_device, self._gf_private)
            except gf.StaleLayoutError as e:
                if self._gf_engine is not None:
                    self._gf_engine.mark_dead(str(e))
                log("stale_layout", rank=self.rank, msg=json.dumps(str(e)))
                raise
            log("weights_mapped", rank=self.rank, bind_s=round(time.monotonic() - t0, 3))
        self._attach_backend()

    def _init_engine(self, uri: str, load: Callable[[int, gf.GMSClient], None]) -> gf.GMSClient:
        """Rank 0: the engine (lock, probes, loss policy, private region)
        over this rank's GMS."""
        c = self._gf
        eng = gf.Engine(c["lock"], c["id"], [uri], role=c["role"], backend=c["backend"],
                        waking_timeout=c["waking_timeout"], remap_timeout=c["remap_timeout"],
                        init_timeout=c["init_timeout"], private_bytes=self._gf_kv_bytes,
                        memory_need=self._kv_need(),
                        probe_port=c.get("probe_port"), probe_address=c.get("probe_address"),
                        keep_handles=bool(c.get("keep_handles", True)), first_device=self._first_device(),
                        lock_reconnect_timeout=c.get("lock_reconnect_timeout"), kv_pool=self._kv_pool(),
                        lock_secret=bytes.fromhex(c["lock_secret"]) if c.get("lock_secret") else None)
        eng.on_loss = lambda code, detail: kill_process_group(f"{gf.strerror(code)}: {detail}")
        server_pid = int(c["server_pid"])
        # /live and /ready while Active: the API server is there and its heartbeat comes through.
        eng.health = lambda: os.path.exists(f"/proc/{server_pid}") and not self._beat_late()
        eng.on_step_down = self._step_down_asked
        self._gf_engine = eng
        eng.init_weights(load=load)
        self._gf_kv_range = eng.private_memory(0)
        return eng.gms(0)

    def _init_rank(self, uri: str, load: Callable[[int, gf.GMSClient], None]) -> gf.GMSClient:
        """Ranks 1..N-1 (tensor parallelism): a rank engine (no lock of its
        own; rank 0's grant wakes it) over this rank's GMS, with the
        engine's role: the loader's ranks RW or RO, the follower's RO only
        (Decision 5). Every rank commits its own GMS, reserves its own KV
        region and has the memory gate, the out-of-memory retry and, once
        awake, a watch on its GMS connection. A rank's death takes the engine
        down: vLLM's engine process ends with it, and with that rank 0; the
        lock waits for this process too (rank 0 registers it)."""
        c = self._gf
        # Rank 0 tells this rank when the lock is granted (see _grant_ranks).
        self._gf_rank_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._gf_rank_listener.bind(self._rank_socket(self.rank))
        self._gf_rank_listener.listen(1)
        eng = gf.Engine(None, c["id"], [uri], rank=self.rank, role=c["role"], backend=c["backend"],
                        waking_timeout=c["waking_timeout"], remap_timeout=c["remap_timeout"],
                        init_timeout=c["init_timeout"], private_bytes=self._gf_kv_bytes,
                        memory_need=self._kv_need(), keep_handles=bool(c.get("keep_handles", True)),
                        first_device=self._first_device())
        eng.on_loss = lambda code, detail: kill_process_group(f"rank {self.rank}: {gf.strerror(code)}: {detail}")
        self._gf_engine = eng
        eng.init_weights(load=load)
        self._gf_kv_range = eng.private_memory(0)
        return eng.gms(0)

    def _kv_pool(self) -> bool:
        """--kv-pool: the KV cache is the GMS's KV pool (kv_pool.py). One
        rank only: every rank's cache would have to survive together."""
        if not self._gf.get("kv_pool"):
            return False
        if int(self.parallel_config.world_size) != 1:
            raise ValueError("--kv-pool needs one rank (tensor and pipeline parallel size 1)")
        return True

    def _first_device(self) -> int:
        """The device of this rank's one GMS: on CUDA rank N works on device
        N (vLLM's local rank), and the engine numbers its devices from
        there; the host backend has only device 0."""
        return self.local_rank if self._gf_device == "cuda" else 0

    def _rank_socket(self, rank: int) -> str:
        return f"\0gf-vllm-{self._gf['server_pid']}-{self._gf['token']}-rank{rank}"

    # --- KV cache: vLLM's tensors over the private region -----------------
    def initialize_from_config(self, kv_cache_config: Any) -> None:
        kv_range = self._gf_kv_range
        if kv_range is None:  # no engine (load_model has not run)
            cast(Any, super()).initialize_from_config(kv_cache_config)
            return
        # vLLM's allocate_kv_cache looks torch up in its module's namespace.
        vllm_utils: Any = importlib.import_module("vllm.v1.worker.utils")
        real = vllm_utils.torch
        at = _ZerosAt(real, kv_range[0], kv_range[1], self._gf_device)
        vllm_utils.torch = at
        try:
            cast(Any, super()).initialize_from_config(kv_cache_config)
        finally:
            vllm_utils.torch = real
        ptrs = sorted(set(self.kv_data_ptrs()))
        log("kv_range", rank=self.rank, addr=hex(kv_range[0]), bytes=kv_range[1], used=at.made or 0,
            tensors=len(ptrs))
        if self._gf.get("kv_pool") and self._gf_engine is not None:
            from . import kv_pool
            blocks = max(1, int(getattr(kv_cache_config, "num_blocks", 1)))
            self._gf_engine.set_kv_layout(max(1, kv_range[1] // blocks),
                                          kv_pool.layout_hash(kv_cache_config, kv_range[1]))

    def compile_or_warm_up_model(self) -> Any:
        kv_range = self._gf_kv_range
        if self._gf_device != "cuda" or kv_range is None:
            return cast(Any, super()).compile_or_warm_up_model()
        # GPU-ONLY: vLLM captures CUDA graphs here, running the model over the
        # KV cache, whose region has no memory until the wake.
        with _cuda_scratch(kv_range[0], kv_range[1], self.local_rank):
            return cast(Any, super()).compile_or_warm_up_model()

    def kv_data_ptrs(self) -> "list[int]":
        """The data pointers of vLLM's KV cache tensors (what compiled code
        and CUDA graphs hold)."""
        out: "list[int]" = []
        for t in self.model_runner.kv_caches:
            for x in (t if isinstance(t, (list, tuple)) else [t]):
                out.append(int(x.data_ptr()))
        return out

    # --- sleep and wake: vLLM's entry points, through the backend ---------
    def _attach_backend(self) -> None:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory  # type: ignore[import-not-found, unused-ignore]
        gfv.register()
        eng = self._engine()
        if self.rank == 0:
            gfv.attach(eng, on_grant=self._grant_ranks)
        else:
            gfv.attach(eng, gate=self._wait_for_grant, kv_restore=self._rank_awake)
        self._gf_backend = SleepModeBackendFactory.create_backend(self.vllm_config.model_config)
        # vLLM's GPU worker makes its backend lazily through the same factory.
        if hasattr(self, "_sleep_mode_backend"):
            setattr(self, "_sleep_mode_backend", self._gf_backend)

    def sleep(self, level: int = 1) -> None:
        self._gf_backend.suspend(level)
        log("standby", rank=self.rank, kv_bytes=self._gf_kv_bytes, role=self._gf["role"])

    def wake_up(self, tags: Optional[Sequence[str]] = None) -> None:
        self._gf_backend.resume(list(tags) if tags is not None else None)
        if self._gf_engine is not None and self.rank == 0:
            self._after_wake(self._gf_engine)

    def discard(self, tags: Sequence[str]) -> None:
        self._gf_backend.discard(tuple(tags))

    def _grant_ranks(self, epoch: int) -> None:
        """Rank 0, at the grant: let every other rank wake (they wait in
        _wait_for_grant) and remap alongside this one."""
        self._gf_granted_at = time.monotonic()
        log("granted", epoch=epoch)
        msg = json.dumps({"epoch": epoch, "granted_mono": self._gf_granted_at}).encode()
        for rank in range(1, int(self.parallel_config.world_size)):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(self._rank_socket(rank))
                s.sendall(msg)

    def _wait_for_grant(self) -> int:
        """Ranks >= 1: block until rank 0 holds the lock (no rank maps or
        backs anything for a standby); rank 0's epoch."""
        assert self._gf_rank_listener is not None
        conn, _ = self._gf_rank_listener.accept()
        with conn:
            got = json.loads(conn.recv(4096))
        self._gf_granted_at = float(got["granted_mono"])
        return int(got["epoch"])

    def _rank_awake(self) -> None:
        self._check_waking(f"rank {self.rank}")
        self._zero_kv()
        log("awake", rank=self.rank, wake_ms=round((time.monotonic() - self._gf_granted_at) * 1000, 1),
            kv_addr=hex(self.kv_data_ptrs()[0]) if self.kv_data_ptrs() else 0)

    def _after_wake(self, eng: gf.Engine) -> None:
        """Rank 0, awake: hand the lock's listening socket to the API server."""
        try:
            self._check_waking("rank 0")
            if self._gf.get("listener"):
                with eng.listener(self._gf["listener"]) as lsock, socket.socket(socket.AF_UNIX) as s:
                    s.connect(self._gf["fd_socket"])
                    socket.send_fds(s, [b"L"], [lsock.fileno()])
        except BaseException as e:
            if eng.state != "dead":
                eng.mark_dead(f"wake failed: {e}")
            log("wake_failed", error=type(e).__name__, msg=json.dumps(str(e)))
            raise
        adopted = self._adopt_kv_pool(eng) if self._gf.get("kv_pool") else None
        if adopted is None or adopted["created"]:
            self._zero_kv()  # the pool's content is the cache: zeroed only when new
        m = eng.metrics
        ptrs = self.kv_data_ptrs()
        log("awake", rank=0, epoch=eng.epoch, remap_ms=round(m.get("remap_us", 0) / 1000, 1),
            kv_ms=round(m.get("private_alloc_us", 0) / 1000, 1), kv_bytes=self._gf_kv_bytes,
            kv_addr=hex(ptrs[0]) if ptrs else 0)

    def _adopt_kv_pool(self, eng: gf.Engine) -> "dict[str, Any]":
        """The new holder's scheduler starts with the blocks of the pool's
        directory as cached prefixes, when the GMS let it adopt them."""
        info = eng.kv_pool_info(0)
        gms = eng.gms(0)
        epoch = eng.epoch
        _, directory = gms.kv_directory() if info["start"] == "adopted" else (0, [])
        self._gf_kv_adopted = directory
        self._gf_kv_send = lambda add, remove, clear: gms.kv_publish(epoch, add=add, remove=remove, clear=clear)
        log("kv_pool", rank=0, epoch=epoch, start=info["start"], previous_epoch=info["previous_epoch"],
            cached=len(directory), created=int(info["created"]))
        return info

    def gf_kv_directory(self) -> "list[Any]":
        """The engine core, right after the wake (kv_pool.install): the
        directory this holder adopted, for its scheduler's prefix cache."""
        return list(getattr(self, "_gf_kv_adopted", []))

    def gf_kv_publish(self, add: "list[Any]", drop: "list[int]", clear: bool) -> None:
        """The engine core (kv_pool.install): blocks into or out of the
        pool's directory, fenced by this holder's epoch."""
        send = getattr(self, "_gf_kv_send", None)
        if send is not None:
            send([(int(i), bytes(h)) for i, h in add], [int(i) for i in drop], bool(clear))

    def _zero_kv(self) -> None:
        if self._gf_device == "cuda" and self._gf_kv_range is not None:
            # GPU-ONLY: device memory is not zero-filled when created (host
            # pages are); vLLM's KV cache starts zeroed. "cuda" is this
            # rank's device (vLLM made it current).
            import torch  # type: ignore[import-not-found, unused-ignore]
            tensor_at(self._gf_kv_range[0], torch.int8, [self._gf_kv_range[1]], [1], "cuda").zero_()
            torch.cuda.synchronize()

    def _check_waking(self, who: str) -> None:
        waking_timeout = float(self._gf["waking_timeout"])
        if time.monotonic() - self._gf_granted_at > waking_timeout:
            raise GfTimeoutError(f"{who}: waking took longer than the waking timeout ({waking_timeout:g} s)")

    # --- the launcher's other steps (collective_rpc) ------------------------
    def gf_info(self) -> "dict[str, Any]":
        """This rank's pid, state and KV addresses, for the launcher."""
        eng = self._gf_engine
        info: "dict[str, Any]" = {"pid": os.getpid(), "rank": self.rank, "kv_bytes": self._gf_kv_bytes,
                                  "kv_ptrs": self.kv_data_ptrs()}
        if eng is not None:
            m = eng.metrics
            info.update(state=eng.state, epoch=eng.epoch, remap_us=m.get("remap_us", -1),
                        kv_us=m.get("private_alloc_us", -1))
        return info

    def gf_register_ranks(self, pids: Sequence[int]) -> "dict[str, Any]":
        """Rank 0: the lock grants the next holder only once every rank's
        process is gone, not only this one (the lock server holds pidfds of
        them). A lock across hosts (tcp://, etcd://) cannot: said in the log."""
        if self.rank != 0:
            return {}
        eng = self._engine()
        registered: "list[int]" = []
        for pid in pids:
            if pid == os.getpid():
                continue
            try:
                eng.add_holder_pid(int(pid))
            except gf.NotSupportedError as e:
                log("ranks_not_fenced", pids=",".join(str(p) for p in pids), msg=json.dumps(str(e)))
                break
            registered.append(int(pid))
        log("ranks_registered", rank=0, pids=",".join(str(p) for p in registered) or "none")
        return {"registered": registered}

    def gf_serve(self) -> "dict[str, Any]":
        eng = self._engine()
        eng.serve()
        self._watch_heartbeat()
        if self.rank != 0:
            return {}
        log("active", epoch=eng.epoch)
        return {"state": eng.state, "epoch": eng.epoch,
                "metrics": {k: v for k, v in eng.metrics.items() if isinstance(v, (int, float))}}

    # --- Active: the API server's heartbeat, a planned switchover ----------
    def gf_heartbeat(self) -> "dict[str, Any]":
        """The API server's heartbeat (every second while Active): it came
        through vLLM's RPC path, so the API server and the engine core run."""
        self._gf_beat = time.monotonic()
        return {}

    def _hang_timeout(self) -> float:
        return float(self._gf.get("hang_timeout", 0) or 0)

    def _beat_late(self) -> bool:
        beat, limit = self._gf_beat, self._hang_timeout()
        return beat is not None and limit > 0 and time.monotonic() - beat > limit

    def _watch_heartbeat(self) -> None:
        """From Active on: no heartbeat for the hang timeout (the API server
        or the engine core stopped, deadlocked or spinning) turns /live and
        /ready 503 (the health hook) and, HANG_RED_BEFORE_KILL_S later, kills
        the tree, so the lock passes on with or without a supervisor."""
        limit = self._hang_timeout()
        if limit <= 0 or self._gf_beat is not None:
            return
        self._gf_beat = time.monotonic()
        step = min(0.1, limit / 8)

        def watch() -> None:
            while True:
                time.sleep(step)
                late = time.monotonic() - cast(float, self._gf_beat)
                if late > limit + HANG_RED_BEFORE_KILL_S:
                    log("hung", rank=self.rank, since_beat_s=round(late, 3), hang_timeout_s=limit)
                    kill_process_group(f"no heartbeat from the API server for {late:.1f} s (--hang-timeout {limit:g} s)")
                    return

        threading.Thread(target=watch, name="gf-hang-watch", daemon=True).start()

    def _step_down_asked(self) -> None:
        """The engine's step-down hook (a planned switchover, on the lock's
        watcher thread): the API server drains and ends the tree, and the
        lock passes on when every rank's process is gone."""
        log("step_down_asked", rank=self.rank)
        os.kill(int(self._gf["server_pid"]), signal.SIGUSR1)

    def _engine(self) -> gf.Engine:
        if self._gf_engine is None:
            raise gf.StateError("the gpufailover engine is not initialised (load_model has not run)")
        return self._gf_engine


def _make_worker_class() -> type:
    from vllm.platforms import current_platform  # type: ignore[import-not-found, unused-ignore]
    base: type
    if current_platform.is_cpu():
        from vllm.v1.worker.cpu_worker import CPUWorker as base  # type: ignore[import-not-found, unused-ignore, no-redef]
    else:
        from vllm.v1.worker.gpu_worker import Worker as base  # type: ignore[import-not-found, unused-ignore, no-redef]
    return type("GfWorker", (GfWorkerMixin, base), {"__module__": __name__, "__qualname__": "GfWorker",
                                                   "__doc__": GfWorkerMixin.__doc__})


_worker_class: Optional[type] = None


def __getattr__(name: str) -> Any:
    # vLLM resolves --worker-cls by importing this module and getattr():
    # only then are torch and vLLM imported.
    global _worker_class
    if name == "GfWorker":
        if _worker_class is None:
            _worker_class = _make_worker_class()
        return _worker_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

