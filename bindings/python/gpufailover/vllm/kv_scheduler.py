# SPDX-License-Identifier: Apache-2.0
"""vLLM's scheduler for ``gf-vllm serve --kv-pool``: the launcher names this
class as vLLM's ``scheduler_cls``, so vLLM imports this module in its engine
core process before it makes the scheduler's BlockPool, and the prefix
cache's side of the KV pool (kv_pool.install) is in place there."""
from vllm.v1.core.sched.scheduler import Scheduler as _VllmScheduler  # type: ignore[import-not-found, unused-ignore]

from . import kv_pool

kv_pool.install()


class Scheduler(_VllmScheduler):  # type: ignore[misc, unused-ignore]
    """vLLM's own scheduler; kv_pool.install() wrapped what it needs."""
