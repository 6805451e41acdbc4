# SPDX-License-Identifier: Apache-2.0
"""A vLLM GPU worker whose weights live in the GPU Memory Service.

Use with ``vllm serve MODEL --enable-sleep-mode --worker-cls gf_worker.GfWorker``
(this directory on PYTHONPATH, gpufailover installed so its
``vllm.general_plugins`` entry point registers the ``gpufailover`` sleep-mode
backend). GF_GMS_URI names the GMS of the worker's GPU; ``{rank}`` in it is
replaced by the worker's local rank (one gf-gmsd per GPU).

- The first worker to reach an empty GMS is its writer: vLLM's own loader
  runs inside ``gf.torch_pool`` with a ``torch.cuda.MemPool`` over
  gpufailover's pluggable allocator, so every weight tensor lands in a GMS
  allocation; the worker records each parameter's place as metadata and
  commits.
- Every later worker (the standby, or a restarted primary) finds a committed
  layout: it builds the model with dummy weights, then points each parameter
  at the GMS mapping (zero-copy, read-only) and frees the dummies.
- Either way it attaches its GMS client to gpufailover.vllm, so /sleep
  unmaps the weights (kept in the GMS) and /wake_up remaps them at the same
  addresses within GF_REMAP_TIMEOUT seconds.

The KV cache stays in PyTorch's own allocator and is kept while asleep: the
standby needs its KV budget ready on wake (size both engines with
--gpu-memory-utilization so the weights count once).

GPU-ONLY: everything below runs on a CUDA GPU only (cuda backend, pluggable
allocator, cuda tensors). On a machine without a GPU only the import works.
"""
import contextlib
import json
import os

import torch
from vllm.v1.worker.gpu_worker import Worker

import gpufailover as gf
import gpufailover.vllm as gfv


def _gms_uri(rank):
    uri = os.environ.get("GF_GMS_URI")
    if not uri:
        raise RuntimeError("GF_GMS_URI is not set (e.g. unix:///run/gf/gms{rank}.sock)")
    return uri.replace("{rank}", str(rank))


def _describe(p):
    return json.dumps({"dtype": str(p.dtype).removeprefix("torch."), "shape": list(p.shape),
                       "stride": list(p.stride())}, separators=(",", ":")).encode()


def publish(gms, model):
    """Record where each parameter lies in the GMS (writer), then commit."""
    allocs = gms.allocations
    for name, p in model.named_parameters():
        ptr = p.data_ptr()
        alloc = next((a for a in allocs if a["addr"] <= ptr < a["addr"] + a["size"]), None)
        if alloc is None:
            raise RuntimeError(f"parameter {name} was not allocated in the GMS")
        gms.put_meta(name, alloc["id"], ptr - alloc["addr"], _describe(p))
    return gms.commit()


class _DeviceArray:
    """A cuda array by address (__cuda_array_interface__), so the tensor over it
    is not a DLPack export: the backend may unmap under it while the engine
    sleeps, and remap brings the memory back at the same address."""

    def __init__(self, addr, dtype, shape, stride):
        itemsize = torch.empty((), dtype=dtype, device="meta").element_size()
        typestr = {torch.float16: "<f2", torch.float32: "<f4", torch.int8: "|i1", torch.uint8: "|u1",
                   torch.int16: "<i2", torch.int32: "<i4", torch.int64: "<i8"}.get(dtype)
        if typestr is None:
            raise NotImplementedError(f"parameter dtype {dtype} has no __cuda_array_interface__ typestr")
        self.__cuda_array_interface__ = {"data": (addr, True), "shape": tuple(shape), "typestr": typestr,
                                         "strides": tuple(st * itemsize for st in stride), "version": 3}


def bind(gms, model):
    """Point every parameter at its GMS mapping (reader): zero-copy, read-only."""
    meta = gms.metadata
    for name, p in model.named_parameters():
        if name not in meta:
            raise gf.StaleLayoutError(f"the GMS layout has no parameter {name}: another model was loaded")
        desc = json.loads(meta[name]["value"])
        if desc["shape"] != list(p.shape) or desc["dtype"] != str(p.dtype).removeprefix("torch."):
            raise gf.StaleLayoutError(f"parameter {name}: the GMS holds {desc}, the model needs "
                                      f"{str(p.dtype)} {list(p.shape)}")
        addr = meta[name]["addr"]
        if p.dtype == torch.bfloat16:
            # No typestr for bfloat16: reinterpret 16-bit integers.
            raw = torch.as_tensor(_DeviceArray(addr, torch.int16, p.shape, desc["stride"]), device="cuda")
            view = raw.view(torch.bfloat16)
        else:
            view = torch.as_tensor(_DeviceArray(addr, p.dtype, p.shape, desc["stride"]), device="cuda")
        p.data = view  # the dummy storage is freed here


class GfWorker(Worker):
    def __init__(self, vllm_config, *args, **kwargs):
        # vLLM 0.32 has the model-config field but no command-line flag for it.
        vllm_config.model_config.sleep_mode_backend = gfv.BACKEND_NAME
        super().__init__(vllm_config, *args, **kwargs)
        self._gf_mem = None
        self._gf_gms = None
        self._gf_writer = False

    def _maybe_get_memory_pool_context(self, tag):
        # Weights go to the GMS (writer) or are bound to it after loading
        # (reader); nothing goes to vLLM's CuMem allocator.
        if tag == "weights" and self._gf_writer:
            pool = torch.cuda.MemPool(gf.torch_allocator().allocator())
            stack = contextlib.ExitStack()
            stack.enter_context(gf.torch_pool(self._gf_gms))
            stack.enter_context(torch.cuda.use_mem_pool(pool))
            return stack
        return contextlib.nullcontext()

    def load_model(self, *, load_dummy_weights=False):
        self._gf_mem = gf.Memory("cuda", device=self.local_rank)
        timeout = float(os.environ.get("GF_GMS_CONNECT_TIMEOUT", "600"))
        self._gf_gms = gf.GMSClient(_gms_uri(self.local_rank), self._gf_mem, mode="rw_or_ro", timeout=timeout)
        self._gf_writer = self._gf_gms.mode == "rw"
        if self._gf_writer:
            super().load_model(load_dummy_weights=load_dummy_weights)
            publish(self._gf_gms, self.model_runner.get_model())
            self._gf_writer = False  # committed: now a reader like the others
        else:
            self._gf_gms.map_all()
            super().load_model(load_dummy_weights=True)
            bind(self._gf_gms, self.model_runner.get_model())
        gfv.attach(self._gf_gms, remap_timeout=float(os.environ.get("GF_REMAP_TIMEOUT", "30")))
