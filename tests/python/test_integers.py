# SPDX-License-Identifier: Apache-2.0
"""Integer arguments are never wrapped: outside their C range they raise
OverflowError (2**64 used to become 0, 2**64 + 5 became 5)."""
import pytest

from conftest import gf

MiB = 1 << 20
HUGE = [1 << 64, (1 << 64) + 5, 1 << 100, -1]


@pytest.fixture
def writer(cluster):
    cluster.gmsd()
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=5)
    aid = w.allocate(2 * MiB, "weights")
    yield w, aid
    w.close()


@pytest.mark.parametrize("value", HUGE)
def test_put_meta_offset_and_alloc_id(writer, value):
    w, aid = writer
    with pytest.raises(OverflowError):
        w.put_meta("k", aid, value, b"")
    with pytest.raises(OverflowError):
        w.put_meta("k", value, 0, b"")
    # Nothing half-recorded: the key is free for a valid entry.
    w.put_meta("k", aid, 0, b"v")
    assert w.metadata["k"]["offset"] == 0


@pytest.mark.parametrize("value", HUGE)
def test_buffer_offset_and_alloc_id(writer, value):
    w, aid = writer
    with pytest.raises(OverflowError):
        w.buffer(alloc_id=aid, offset=value)
    with pytest.raises(OverflowError):
        w.buffer(alloc_id=value)


def test_buffer_offset_cannot_wrap_into_range(writer):
    w, aid = writer
    addr = next(a["addr"] for a in w.allocations if a["id"] == aid)
    # base + offset would wrap around 2**64 to a small address: refused.
    with pytest.raises(ValueError, match="beyond the end"):
        w.buffer(alloc_id=aid, offset=(1 << 64) - addr + 4096)
    with pytest.raises(ValueError, match="beyond the end"):
        w.buffer(alloc_id=aid, offset=2 * MiB)
    assert w.buffer(alloc_id=aid, offset=2 * MiB - 1).nbytes == 1


@pytest.mark.parametrize("value", HUGE)
def test_engine_private_bytes(value):
    with pytest.raises(OverflowError):
        gf.Engine("unix:///nonexistent/l", "e", ["unix:///nonexistent/g"], backend="host", private_bytes=value)


@pytest.mark.parametrize("call", [
    lambda: gf.strerror(1 << 40),
    lambda: gf.strerror(1 << 64),
    lambda: gf.Memory("host", device=1 << 64),
    lambda: gf.Memory("host", device=1 << 31),
    lambda: gf.Engine("unix:///l", "e", ["unix:///g"], backend="host", probe_port=1 << 64),
])
def test_other_integer_arguments(call):
    with pytest.raises(OverflowError):
        call()


@pytest.mark.parametrize("value", [1 << 63, 1 << 64])
def test_allocate_and_buffer_sizes(writer, value):
    w, aid = writer
    with pytest.raises(OverflowError):
        w.allocate(value)
    with pytest.raises(OverflowError):
        w.buffer(alloc_id=aid, size=value)


def test_index_protocol_is_accepted(writer):
    import numpy as np
    w, aid = writer
    w.put_meta("np", np.uint64(aid), np.int64(8), b"")
    assert w.metadata["np"]["offset"] == 8
    with pytest.raises(TypeError):
        w.put_meta("f", aid, 1.5, b"")


def test_engine_probe_port_none_or_a_port():
    eng = gf.Engine("unix:///nonexistent/l", "e", ["unix:///nonexistent/g"], backend="host", probe_port=None)
    assert eng.probe_port is None  # no probe server
    eng.close()
    for bad in (-1, 65536):
        with pytest.raises(ValueError, match="0..65535"):
            gf.Engine("unix:///nonexistent/l", "e", ["unix:///nonexistent/g"], backend="host", probe_port=bad)
    with pytest.raises(TypeError):
        gf.Engine("unix:///nonexistent/l", "e", ["unix:///nonexistent/g"], backend="host", probe_port="8081")
