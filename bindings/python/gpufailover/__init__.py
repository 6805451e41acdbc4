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

>>> eng = gf.Engine("unix:///run/gf/lock.sock", "engine-b", ["unix:///run/gf/gms0.sock"],
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
    InterruptedError,
    LockClient,
    LockLostError,
    Mapping,
    Memory,
    NotFoundError,
    NotSupportedError,
    OutOfMemoryError,
    PermissionError,
    ProtocolError,
    StaleLayoutError,
    StateError,
    TimeoutError,
    UnreachableError,
    __version__,
    gms_status,
    lock_status,
    parse_duration,
    strerror,
)

__all__ = [
    "Engine",
    "GMSClient",
    "GMSLostError",
    "GpuFailoverError",
    "Grant",
    "InterruptedError",
    "LockClient",
    "LockLostError",
    "Mapping",
    "Memory",
    "NotFoundError",
    "NotSupportedError",
    "OutOfMemoryError",
    "PermissionError",
    "ProtocolError",
    "StaleLayoutError",
    "StateError",
    "TimeoutError",
    "UnreachableError",
    "__version__",
    "gms_status",
    "lock_status",
    "parse_duration",
    "strerror",
]
