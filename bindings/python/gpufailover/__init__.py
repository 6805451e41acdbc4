# SPDX-License-Identifier: Apache-2.0
"""libgpufailover for Python engines.

Keep an inference engine serving through crashes: a hot standby shares the
weights that a GPU Memory Service owns and waits on a lock server where the
connection is the lock.

>>> import gpufailover as gf
>>> lock = gf.LockClient("unix:///run/gf/lock.sock", "engine-a")
>>> grant = lock.acquire()          # blocks; Ctrl-C works
>>> grant.epoch                     # fencing epoch, strictly increasing

An engine drives the whole shadow loop with gf.Engine:

>>> eng = gf.Engine("unix:///run/gf/lock.sock", "engine-b", ["unix:///run/gf/gms-0.sock"],
...                 role="follower", probe_port=8081)
>>> eng.init_weights(); eng.sleep(); eng.acquire(); eng.wake_up(); eng.serve(start_http)

Everything here is a thin layer over the C library (no ctypes, no cffi).
"""
from ._gpufailover import (
    Engine,
    GMSClient,
    GMSLostError,
    GpuFailoverError,
    Grant,
    InterruptedError as InterruptedError,
    LockClient,
    LockLostError,
    Mapping,
    Memory,
    NotFoundError,
    NotSupportedError,
    OutOfMemoryError,
    PermissionError as PermissionError,
    ProtocolError,
    StaleLayoutError,
    StateError,
    TimeoutError as TimeoutError,
    UnreachableError,
    __version__,
    device_find_by_uuid,
    device_list,
    gms_demote,
    gms_ping,
    gms_restore,
    gms_snapshot,
    gms_status,
    gms_wait_committed,
    install_fault_reporter,
    lock_evict,
    lock_ping,
    lock_revoke,
    lock_status,
    lock_switchover,
    parse_duration,
    ready_for,
    remove_fault_reporter,
    safetensors_header,
    strerror,
)
from . import _gpufailover
from typing import Any, Optional, Union
import atexit
import importlib
import logging
import os
import sys
import time


def gms_tiers(uri: str, timeout: float = 5.0) -> dict[str, Any]:
    """The residency-tier part of ``gms_status(uri, timeout)``: ``{"tiers": ..., "operation": ...}``.

    ``tiers`` maps ``"warm"`` and ``"cold"`` to their directory, presence, size
    and age, or to ``None`` for a tier the GMS does not keep (gms_status() leaves
    those out); ``operation`` is the current or last snapshot or restore with its
    phase and reason (``None`` before the first). Errors as gms_status().
    """
    status = gms_status(uri, timeout)
    tiers: dict[str, Any] = {"warm": None, "cold": None}
    tiers.update(status["tiers"])
    return {"tiers": tiers, "operation": status["operation"]}


def torch_allocator_path() -> str:
    """Path of the shared object exporting gf_torch_malloc / gf_torch_free."""
    path: str = _gpufailover.__file__
    return path


def torch_allocator() -> Any:
    """A torch.cuda.memory.CUDAPluggableAllocator over GMS memory (needs PyTorch with CUDA).

    Use it for a torch.cuda.MemPool and allocate inside ``torch_pool(writer)``::

        pool = torch.cuda.MemPool(gf.torch_allocator().allocator())
        with gf.torch_pool(writer), torch.cuda.use_mem_pool(pool):
            model = load_model()          # weight tensors land in GMS allocations
        writer.commit()
    """
    # PyTorch is optional: imported by name so the type checker needs no torch installed.
    torch = importlib.import_module("torch")
    return torch.cuda.memory.CUDAPluggableAllocator(torch_allocator_path(), "gf_torch_malloc", "gf_torch_free")


# The library's levels are syslog priorities.
_TO_LOGGING = {3: logging.ERROR, 4: logging.WARNING, 6: logging.INFO, 7: logging.DEBUG}
_atexit_registered = False


def _gf_level(level: int) -> int:
    return 7 if level <= logging.DEBUG else 6 if level <= logging.INFO else 4 if level <= logging.WARNING else 3


def log_to_logging(logger: Union[str, logging.Logger, None] = "gpufailover", level: int = logging.INFO) -> None:
    """Send the library's log lines to the ``logging`` module.

    Each line becomes a record of the logger ``<logger>.<component>`` (``lock``,
    ``gms``, ``engine`` ...) at the matching level, its message the line's
    ``key=value`` text, ``created`` the time it was logged, and the extra
    attributes ``gf_component`` and ``gf_mono_us`` (CLOCK_MONOTONIC, comparable
    across processes). Lines less severe than ``level`` are dropped in the
    library. The lines of library threads are queued and handed to
    ``logging`` on the main thread at its next chance (never under a library
    lock); ``logger=None`` removes the bridge (back to ``GF_LOG``).
    """
    global _atexit_registered
    if logger is None:
        _gpufailover._set_log_sink(None)
        return
    base = logging.getLogger(logger) if isinstance(logger, str) else logger

    def sink(gf_level: int, component: str, msg: str, mono_us: int, wall_us: int, dropped: int) -> None:
        if dropped:
            base.warning("event=log_lines_dropped count=%d", dropped)
        log = base.getChild(component)
        lvl = _TO_LOGGING.get(gf_level, logging.DEBUG)
        if not log.isEnabledFor(lvl):
            return
        record = log.makeRecord(log.name, lvl, "", 0, msg, (), None,
                                extra={"gf_component": component, "gf_mono_us": mono_us})
        record.created = wall_us / 1e6
        record.msecs = (wall_us // 1000) % 1000
        log.handle(record)

    _gpufailover._set_log_sink(sink, _gf_level(level))
    if not _atexit_registered:
        atexit.register(_gpufailover._set_log_sink, None)
        _atexit_registered = True


def logfmt_value(value: object) -> str:
    """``value`` as a logfmt value: bare when it can be, else in double
    quotes with ``"``, ``\\`` and line breaks escaped."""
    text = str(value)
    if text and not any(c <= " " or c in '"=\\' or c == "\x7f" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace(
        "\r", "\\r").replace("\t", "\\t") + '"'


_LEVEL_NAMES = {"error": 3, "warn": 4, "info": 6, "debug": 7}
_journal: Optional[bool] = None


def _stderr_is_journal() -> bool:
    global _journal
    if _journal is None:
        try:
            dev, ino = (int(x) for x in os.environ.get("JOURNAL_STREAM", "").split(":"))
            st = os.fstat(sys.stderr.fileno())
            _journal = (st.st_dev, st.st_ino) == (dev, ino)
        except (ValueError, OSError, AttributeError):
            _journal = False
    return _journal


def log_event(prog: str, event: str, level: str = "info", **fields: object) -> None:
    """Write one line to stderr in the format of the library and its daemons:
    ``ts= mono_us= prog= level= component= event=`` and ``fields`` as
    logfmt pairs, values quoted and escaped where they need it (and the
    journald priority in front when stderr is the journal's stream)."""
    if level not in _LEVEL_NAMES:
        raise ValueError(f"level must be one of {', '.join(_LEVEL_NAMES)}, not {level!r}")
    wall = time.time()
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall * 1000) % 1000:03d}Z"
    pairs = " ".join(f"{k}={logfmt_value(v)}" for k, v in fields.items())
    prefix = f"<{_LEVEL_NAMES[level]}>" if _stderr_is_journal() else ""
    sys.stderr.write(f"{prefix}ts={ts} mono_us={time.monotonic_ns() // 1000} prog={logfmt_value(prog)} "
                     f"level={level} component={logfmt_value(prog)} event={logfmt_value(event)}"
                     f"{' ' + pairs if pairs else ''}\n")
    sys.stderr.flush()


class torch_pool:
    """Context manager: allocations through gf_torch_malloc go to ``writer``'s GMS."""

    def __init__(self, writer: GMSClient) -> None:
        self.writer = writer

    def __enter__(self) -> GMSClient:
        _gpufailover._torch_pool_begin(self.writer)
        return self.writer

    def __exit__(self, *exc: object) -> None:
        _gpufailover._torch_pool_end()

# TimeoutError, PermissionError and InterruptedError are left out: `from
# gpufailover import *` would shadow the builtins of the same names (ours
# derive from the first two, so `except TimeoutError` still catches ours, but
# not the other way round). Reach them as gf.TimeoutError and so on (their
# imports above re-export them by name, as a type checker requires).
__all__ = [
    "Engine",
    "GMSClient",
    "GMSLostError",
    "GpuFailoverError",
    "Grant",
    "LockClient",
    "LockLostError",
    "Mapping",
    "Memory",
    "NotFoundError",
    "NotSupportedError",
    "OutOfMemoryError",
    "ProtocolError",
    "StaleLayoutError",
    "StateError",
    "UnreachableError",
    "__version__",
    "device_find_by_uuid",
    "device_list",
    "gms_demote",
    "gms_ping",
    "gms_restore",
    "gms_snapshot",
    "gms_status",
    "gms_tiers",
    "gms_wait_committed",
    "install_fault_reporter",
    "lock_evict",
    "lock_ping",
    "lock_revoke",
    "lock_status",
    "lock_switchover",
    "log_event",
    "log_to_logging",
    "logfmt_value",
    "parse_duration",
    "ready_for",
    "remove_fault_reporter",
    "safetensors_header",
    "strerror",
    "torch_allocator",
    "torch_allocator_path",
    "torch_pool",
]
