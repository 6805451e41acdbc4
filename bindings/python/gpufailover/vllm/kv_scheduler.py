# SPDX-License-Identifier: Apache-2.0
"""vLLM's scheduler for ``gf-vllm serve --kv-pool``: the launcher names this
class as vLLM's ``scheduler_cls``, so vLLM imports this module in its engine
core process before it makes the scheduler's BlockPool, and the prefix
cache's side of the KV pool (kv_pool.install) is in place there. Without
vLLM (a stub checker importing every module) the class is an empty one."""
import importlib
from typing import Any

from . import kv_pool


def _vllm_scheduler() -> Any:
    try:
        return importlib.import_module("vllm.v1.core.sched.scheduler").Scheduler
    except ImportError:
        return None


_BASE: Any = _vllm_scheduler()
if _BASE is not None:
    kv_pool.install()


class Scheduler(_BASE if _BASE is not None else object):  # type: ignore[misc]
    """vLLM's own scheduler; kv_pool.install() wrapped what it needs."""
