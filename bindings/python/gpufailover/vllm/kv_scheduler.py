# SPDX-License-Identifier: Apache-2.0
"""vLLM's scheduler for ``gf-vllm serve --kv-pool``: the launcher names this
class as vLLM's ``scheduler_cls``, so vLLM imports this module in its engine
core process before it makes the scheduler's BlockPool, and the prefix
cache's side of the KV pool (kv_pool.install) is in place there. Without
vLLM (a stub checker importing every module) ``Scheduler`` is None."""
import importlib
from typing import Any

from . import kv_pool


def _vllm_scheduler() -> Any:
    try:
        return importlib.import_module("vllm.v1.core.sched.scheduler").Scheduler
    except ImportError:
        return None


def _scheduler() -> Any:
    base = _vllm_scheduler()
    if base is None:
        return None
    kv_pool.install()
    return type("Scheduler", (base,), {"__module__": __name__,
                                       "__doc__": "vLLM's own scheduler; kv_pool.install() wrapped what it needs."})


# vLLM's own scheduler class, or None without vLLM. Made with type(), not a
# class statement: its base (and metaclass) exists only where vLLM is
# installed, and the static type checkers see no other.
Scheduler: Any = _scheduler()
