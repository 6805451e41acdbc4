# SPDX-License-Identifier: Apache-2.0
"""vLLM's prefix cache over the GMS's KV pool (``gf-vllm serve --kv-pool``;
docs/vllm.md, "The KV pool").

The holder's KV tensors lie over the pool's memory (the engine maps it at
the wake), and this module keeps the pool's directory true to vLLM's prefix
cache, from the scheduler's side (vLLM's ``BlockPool``, in the engine-core
process, which with one rank is the worker's own):

- a block vLLM caches in ``schedule()`` is written by that step's forward
  pass: it is published only once that step's output came back
  (``update_from_output``), so a holder killed during the forward pass
  leaves it out of the directory;
- a cached block that leaves the prefix cache (evicted for reuse, or the
  cache reset) leaves the directory before ``schedule()`` returns, so before
  the forward pass writes it again;
- at the wake the new holder puts the blocks of the directory it adopted
  into its ``BlockPool`` as cached prefixes, at the tail of the free queue
  (evicted last), and publishes from then on.

What is published for a block is vLLM's own key, ``BlockHashWithGroupId``
(the block hash chained over its prefix, and the KV cache group), with the
block's token count: the directory is meaningful only to a holder whose
hashes come out the same, which the layout hash (``layout_hash()``) makes
sure of: it covers the cache's shape and vLLM's hash seed.
"""
import hashlib
import json
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["install", "layout_hash", "adopt", "Publisher"]

_pools: "List[weakref.ReferenceType[Any]]" = []
_publisher: "Optional[Publisher]" = None
_installed = False


class Publisher:
    """The holder's side of the directory: what this process's BlockPools
    cached and dropped, sent to the GMS at the points the module docstring
    names. ``send(add, remove, clear)`` is one kv_publish on the holder's GMS
    connection (it raises on a refusal: the caller's loss)."""

    def __init__(self, send: "Callable[[List[Tuple[int, bytes]], List[int], bool], None]"):
        self.send = send
        self.step_adds: "List[Tuple[int, bytes]]" = []
        self.removed: "List[int]" = []
        self.clear = False
        self.pending: "Dict[int, List[Tuple[int, bytes]]]" = {}  # id(scheduler output) -> its blocks

    def cached(self, block_id: int, key: bytes, num_tokens: int) -> None:
        self.step_adds.append((block_id, key + int(num_tokens).to_bytes(4, "big")))

    def dropped(self, block_id: int) -> None:
        self.removed.append(block_id)
        self.step_adds = [a for a in self.step_adds if a[0] != block_id]
        # A block cached by a step whose output has not come back yet and
        # dropped meanwhile (async scheduling) must not enter the directory.
        for adds in self.pending.values():
            adds[:] = [a for a in adds if a[0] != block_id]

    def reset(self) -> None:
        self.clear = True
        self.removed.clear()
        self.step_adds.clear()
        for adds in self.pending.values():
            adds.clear()

    def scheduled(self, output: Any) -> None:
        """End of schedule(): the drops go out now, before the forward pass
        writes those blocks again; the step's new blocks wait for its output."""
        if self.removed or self.clear:
            self.send([], self.removed, self.clear)
            self.removed, self.clear = [], False
        if self.step_adds:
            self.pending[id(output)] = self.step_adds
            self.step_adds = []

    def finished(self, output: Any) -> None:
        """A step's output came back: its forward pass wrote its blocks."""
        adds = self.pending.pop(id(output), None)
        if adds:
            self.send(adds, [], False)


def install() -> None:
    """Wrap the BlockPool and Scheduler methods this needs, once per
    process. A wrapper does nothing until adopt() made this process the
    pool's holder (a standby never publishes)."""
    global _installed
    if _installed:
        return
    from vllm.v1.core import block_pool as bp  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.core.sched import scheduler as sch  # type: ignore[import-not-found, unused-ignore]

    pool_cls: Any = bp.BlockPool
    sched_cls: Any = sch.Scheduler
    init, cache_full, remove, reset = (pool_cls.__init__, pool_cls.cache_full_blocks,
                                       pool_cls._remove_cached_block_hashes, pool_cls.reset_prefix_cache)
    schedule, update = sched_cls.schedule, sched_cls.update_from_output

    def pool_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        _pools.append(weakref.ref(self))

    def cache_full_blocks(self: Any, request: Any, blocks: Any, num_cached_blocks: int, num_full_blocks: int,
                          *a: Any, **k: Any) -> None:
        cache_full(self, request, blocks, num_cached_blocks, num_full_blocks, *a, **k)
        p = _publisher
        if p is None:
            return
        for blk in blocks[num_cached_blocks:num_full_blocks]:
            if not blk.is_null and blk.block_hash is not None and blk.block_hash_num_tokens is not None:
                p.cached(blk.block_id, bytes(blk.block_hash), blk.block_hash_num_tokens)

    def remove_cached_block_hashes(self: Any, block: Any) -> Any:
        removed = remove(self, block)
        if removed and _publisher is not None:
            _publisher.dropped(block.block_id)
        return removed

    def reset_prefix_cache(self: Any) -> bool:
        done = bool(reset(self))
        if done and _publisher is not None:
            _publisher.reset()
        return done

    def schedule_(self: Any, *a: Any, **k: Any) -> Any:
        out = schedule(self, *a, **k)
        if _publisher is not None:
            _publisher.scheduled(out)
        return out

    def update_from_output(self: Any, scheduler_output: Any, *a: Any, **k: Any) -> Any:
        r = update(self, scheduler_output, *a, **k)
        if _publisher is not None:
            _publisher.finished(scheduler_output)
        return r

    pool_cls.__init__ = pool_init
    pool_cls.cache_full_blocks = cache_full_blocks
    pool_cls._remove_cached_block_hashes = remove_cached_block_hashes
    pool_cls.reset_prefix_cache = reset_prefix_cache
    sched_cls.schedule = schedule_
    sched_cls.update_from_output = update_from_output
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


def adopt(directory: "List[Tuple[int, bytes]]", send: "Callable[[List[Tuple[int, bytes]], List[int], bool], None]") \
        -> int:
    """The new holder, awake: put the adopted blocks into this process's
    BlockPools as cached prefixes and publish from now on. Returns the
    number of blocks put in."""
    global _publisher
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
            key, num_tokens = value[:-4], int.from_bytes(value[-4:], "big")
            pool._insert_block_hash(key, blk, num_tokens=num_tokens)
            # Evicted last: new requests take the blocks nobody cached first.
            pool.free_block_queue.remove(blk)
            pool.free_block_queue.append(blk)
            n += 1
    _publisher = Publisher(send)
    return n
