# SPDX-License-Identifier: Apache-2.0
"""free_port(): a TCP port for a server a test starts later.

Not one from bind(port 0): the kernel hands those out of its ephemeral range,
the same range every outgoing connection takes its source port from. A test
that picks one and gives it to an engine that binds it only when it becomes
active, seconds later, can find it taken by a client's connection (or its
TIME_WAIT) by then, and the engine fails with "address in use". The ports
here come from below the ephemeral range, where no connect() ever lands, are
checked free on every address, and each process starts at its own offset so
parallel test processes do not hand out the same one.
"""
import os
import random
import socket

_LOW = 20000


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_HIGH = max(_LOW + 1000, min(_ephemeral_low(), 65536))
_next = _LOW + random.Random(os.getpid() ^ os.getppid() << 16).randrange(_HIGH - _LOW)


def _bindable(port):
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1")):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr, port))
            except OSError:
                return False
    return True


def free_port():
    """A port below the ephemeral range, free now; never the same twice in
    one process."""
    global _next
    for _ in range(_HIGH - _LOW):
        port = _next
        _next = _LOW if _next + 1 >= _HIGH else _next + 1
        if _bindable(port):
            return port
    raise RuntimeError(f"no free TCP port in {_LOW}..{_HIGH - 1}")
