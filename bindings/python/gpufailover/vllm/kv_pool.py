# SPDX-License-Identifier: Apache-2.0
"""vLLM's prefix cache over the GMS's KV pool (``gf-vllm serve --kv-pool``;
docs/vllm.md, "The KV pool").

The holder's KV tensors lie over the pool's memory (its engine maps it at
the wake), and the pool's directory is kept true to vLLM's prefix cache.
vLLM decides what is cached in its scheduler (``BlockPool``, in the
engine-core process) and writes the blocks in the worker's forward pass (in
the worker process, which holds the pool's GMS connection). So:

- the scheduler notes which blocks a ``schedule()`` cached and which cached
  blocks it let go of (evicted for reuse, or the cache reset);
- the engine core has the worker drop the let-go blocks from the directory
  before it hands the step to the worker (one ``gf_kv_publish`` call, so
  before the forward pass writes them again), and publish the newly cached
  ones once the step is done (their content is then written): a holder
  killed during a forward pass leaves the blocks it was writing out of the
  directory. (With vLLM's batch queue, asynchronous scheduling, which is off
  on CPU, a block is published once the step that returns it is done);
- at the wake the worker maps the pool and reads the directory it adopted;
  the engine core asks for it (``gf_kv_directory``) right after the wake
  and puts those blocks into its ``BlockPool`` as cached prefixes, at the
  tail of the free queue (evicted last).

What is published for a block is vLLM's own key, ``BlockHashWithGroupId``
(the block hash chained over its prefix, and the KV cache group), with the
block's token count: the directory means something only to a holder whose
hashes come out the same, which the layout hash (``layout_hash()``) makes
sure of: it covers the cache's shape and vLLM's hash seed.

vLLM imports kv_scheduler.py, the scheduler class the launcher names, in
its engine core process: that installs the engine core's side there.
"""
import hashlib
import json
import os
import sys
import time
import weakref
from typing import Any, List, Optional, Tuple

__all__ = ["install", "layout_hash", "adopt", "Recorder"]

_pools: "List[weakref.ReferenceType[Any]]" = []
_recorder: "Optional[Recorder]" = None
_installed = False


def log(event: str, **kv: Any) -> None:
    fields = " ".join(f"{k}={v}" for k, v in kv.items())
    sys.stderr.write(f"mono_us={time.monotonic_ns() // 1000} prog=gf-vllm component=engine-core pid={os.getpid()} "
                     f"event={event} {fields}\n")
    sys.stderr.flush()


class Recorder:
    """The engine core's side: what the scheduler cached and let go of."""

    def __init__(self) -> None:
        self.add: "List[Tuple[int, bytes]]" = []  # cached by steps not done yet
        self.drop: "List[int]" = []
        self.clear = False

    def cached(self, block_id: int, key: bytes, num_tokens: int) -> None:
        self.add.append((block_id, key + int(num_tokens).to_bytes(4, "big")))

    def dropped(self, block_id: int) -> None:
        self.drop.append(block_id)
        self.add = [a for a in self.add if a[0] != block_id]

    def reset(self) -> None:
        self.clear, self.drop, self.add = True, [], []

    def take_drops(self) -> "Optional[Tuple[List[int], bool]]":
        if not (self.drop or self.clear):
            return None
        ops = (self.drop, self.clear)
        self.drop, self.clear = [], False
        return ops

    def take_adds(self) -> "List[Tuple[int, bytes]]":
        adds, self.add = self.add, []
        return adds


def install() -> None:
    """Wrap the BlockPool, executor and EngineCore methods the engine
    core's side needs, once per process. Nothing is recorded until adopt()
    ran: a standby's scheduler publishes nothing."""
    global _installed
    if _installed:
        return
    from vllm.v1.core import block_pool as bp  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.engine import core  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.executor import abstract, multiproc_executor, uniproc_executor  # type: ignore[import-not-found, unused-ignore]

    pool_cls: Any = bp.BlockPool
    core_cls: Any = core.EngineCore
    init, cache_full, remove, reset = (pool_cls.__init__, pool_cls.cache_full_blocks,
                                       pool_cls._remove_cached_block_hashes, pool_cls.reset_prefix_cache)
    wake_up, step = core_cls.wake_up, core_cls.step
    step_bq: Any = getattr(core_cls, "step_with_batch_queue", None)

    def pool_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        _pools.append(weakref.ref(self))

    def cache_full_blocks(self: Any, request: Any, blocks: Any, num_cached_blocks: int, num_full_blocks: int,
                          *a: Any, **k: Any) -> None:
        cache_full(self, request, blocks, num_cached_blocks, num_full_blocks, *a, **k)
        r = _recorder
        if r is None:
            return
        for blk in blocks[num_cached_blocks:num_full_blocks]:
            if not blk.is_null and blk.block_hash is not None and blk.block_hash_num_tokens is not None:
                r.cached(blk.block_id, bytes(blk.block_hash), blk.block_hash_num_tokens)

    def remove_cached_block_hashes(self: Any, block: Any) -> Any:
        removed = remove(self, block)
        if removed and _recorder is not None:
            _recorder.dropped(block.block_id)
        return removed

    def reset_prefix_cache(self: Any, *a: Any, **k: Any) -> bool:
        done = bool(reset(self, *a, **k))
        if done and _recorder is not None:
            _recorder.reset()
        return done

    def wrap_execute(execute: Any) -> Any:
        def execute_model(self: Any, *a: Any, **k: Any) -> Any:
            drops = _recorder.take_drops() if _recorder is not None else None
            if drops is not None:  # before the forward pass writes them again
                self.collective_rpc("gf_kv_publish", args=([], drops[0], drops[1]))
            return execute(self, *a, **k)
        return execute_model

    def flush(engine: Any) -> None:
        adds = _recorder.take_adds() if _recorder is not None else None
        if adds:  # the step is done: its forward pass wrote them
            engine.model_executor.collective_rpc("gf_kv_publish", args=(adds, [], False))

    def step_(self: Any, *a: Any, **k: Any) -> Any:
        out = step(self, *a, **k)
        flush(self)
        return out

    def step_with_batch_queue(self: Any, *a: Any, **k: Any) -> Any:
        out = step_bq(self, *a, **k)
        flush(self)
        return out

    def core_wake_up(self: Any, *a: Any, **k: Any) -> Any:
        r = wake_up(self, *a, **k)
        if not self.model_executor.is_sleeping:
            got = self.model_executor.collective_rpc("gf_kv_directory")
            directory = got[0] if got and got[0] else []
            log("kv_pool_adopted", directory=len(directory), cached=adopt(directory))
        return r

    pool_cls.__init__ = pool_init
    pool_cls.cache_full_blocks = cache_full_blocks
    pool_cls._remove_cached_block_hashes = remove_cached_block_hashes
    pool_cls.reset_prefix_cache = reset_prefix_cache
    executors: "Tuple[Any, ...]" = (abstract.Executor, multiproc_executor.MultiprocExecutor,
                                    uniproc_executor.UniProcExecutor)
    for cls in executors:
        if "execute_model" in vars(cls):
            cls.execute_model = wrap_execute(vars(cls)["execute_model"])
    core_cls.step = step_
    if step_bq is not None:
        core_cls.step_with_batch_queue = step_with_batch_queue
    core_cls.wake_up = core_wake_up
    _installed = True


def layout_hash(kv_cache_config: Any, kv_bytes: int) -> bytes:
    """16 bytes naming everything a block's content and key depend on: the
    cache's shape (vLLM's KV cache config), its size, and vLLM's hash seed
    and algorithm (two members with other seeds hash the same prefix
    differently, so their directories must not be shared)."""
    from vllm.v1.core import kv_cache_utils as ku  # type: ignore[import-not-found, unused-ignore]

    seed = getattr(ku, "NONE_HASH", b"")
    shape = repr(kv_cache_config).encode()
    text = json.dumps({"kv_bytes": int(kv_bytes), "shape": hashlib.sha256(shape).hexdigest(),
                       "none_hash": bytes(seed).hex() if isinstance(seed, (bytes, bytearray)) else repr(seed)})
    return hashlib.sha256(text.encode()).digest()[:16]


def adopt(directory: "List[Tuple[int, bytes]]") -> int:
    """The engine core of the new holder, awake: put the adopted blocks into
    this process's BlockPools as cached prefixes and record from now on.
    Returns the number of blocks put in."""
    global _recorder
    n = 0
    for ref in _pools:
        pool = ref()
        if pool is None or not getattr(pool, "enable_caching", False):
            continue
        for index, value in directory:
            if index <= 0 or index >= len(pool.blocks) or len(value) <= 4:
                continue
            blk = pool.blocks[index]
            if blk.is_null or blk.ref_cnt != 0 or blk.block_hash is not None:
                continue
            key, num_tokens = bytes(value[:-4]), int.from_bytes(value[-4:], "big")
            pool._insert_block_hash(key, blk, num_tokens=num_tokens)
            # Evicted last: new requests take the blocks nobody cached first.
            pool.free_block_queue.remove(blk)
            pool.free_block_queue.append(blk)
            n += 1
    _recorder = Recorder()
    return n
