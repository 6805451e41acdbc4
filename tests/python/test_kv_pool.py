# SPDX-License-Identifier: Apache-2.0
"""An engine whose private (KV) memory is the GMS's KV pool (kv_pool=True):
the next holder's wake maps the memory the previous holder wrote, at its own
reserved address, with nothing created or zeroed; the pool's directory of
finished blocks goes over to it for the same layout and not for another."""
import ctypes

import pytest

from conftest import gf
from conftest import load_one_tensor as load

SIZE = 4 << 20
BLOCK = 64 << 10
LAYOUT = bytes(range(16))


def engine(cluster, name, role, layout=LAYOUT, kv_pool=True):
    eng = gf.Engine(cluster.lock_uri, name, [cluster.gms_uri()], role=role, backend="host", private_bytes=SIZE,
                    memory_need=0, kv_pool=kv_pool)
    eng.init_weights(load=load if role == "loader" else None)
    eng.set_kv_layout(BLOCK, layout)
    eng.sleep()
    return eng


def mapping_of(addr):
    """The /proc/self/maps line of the mapping at addr."""
    with open("/proc/self/maps") as f:
        for line in f:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= addr < end:
                return line.strip()
    return ""


@pytest.fixture
def fenced(cluster):
    cluster.lockd()
    cluster.gmsd(0, f"--lock={cluster.lock_uri}")
    return cluster


def test_wake_maps_the_previous_holders_pool(fenced):
    a = engine(fenced, "kv-a", "loader")
    b = engine(fenced, "kv-b", "follower")
    ea = a.acquire(timeout=10)
    a.wake_up()
    a.serve()
    info = a.kv_pool_info(0)
    assert info["created"] and info["start"] == "first" and info["blocks"] == 0
    addr_a, size = a.private_memory(0)
    assert size == SIZE
    ctypes.memset(addr_a, 0x5A, BLOCK)                  # block 0: finished and published
    ctypes.memset(addr_a + BLOCK, 0x6B, BLOCK // 2)     # block 1: being written, not published
    a.gms(0).kv_publish(ea, add=[(0, b"prefix-0")])
    inode_a = mapping_of(addr_a).split()[4]
    with pytest.raises(gf.PermissionError):
        a.gms(0).kv_publish(ea + 1, add=[(2, b"x")])
    a.close()  # the holder goes: its mapping with it, the pool stays

    eb = b.acquire(timeout=10)
    b.wake_up()
    b.serve()
    info = b.kv_pool_info(0)
    assert info == {"size": SIZE, "previous_epoch": ea, "blocks": 1, "created": False, "start": "adopted"}
    addr_b, _ = b.private_memory(0)
    # The same memory, not created again: the content is a's, with no zeroing.
    assert ctypes.string_at(addr_b, 4) == b"\x5a" * 4
    assert ctypes.string_at(addr_b + BLOCK, 2) == b"\x6b" * 2
    # Mapped from the GMS's memfd (the same file a mapped), shared: no new
    # memory of the cache's size.
    m = mapping_of(addr_b)
    assert "memfd:gf-mem" in m and m.split()[1][3] == "s" and m.split()[4] == inode_a, (m, inode_a)
    epoch, blocks = b.gms(0).kv_directory()
    assert epoch == eb and blocks == [(0, b"prefix-0")]
    st = gf.gms_status(fenced.gms_uri())["kv_pool"]
    assert st["mapped"] and st["epoch"] == eb and st["blocks"] == 1 and st["size"] == SIZE
    b.close()


def test_another_layout_starts_empty(fenced):
    a = engine(fenced, "kv-a", "loader")
    b = engine(fenced, "kv-b", "follower", layout=bytes(16))
    ea = a.acquire(timeout=10)
    a.wake_up()
    a.serve()
    a.gms(0).kv_publish(ea, add=[(0, b"h0"), (3, b"h3")])
    a.close()
    b.acquire(timeout=10)
    b.wake_up()
    b.serve()
    info = b.kv_pool_info(0)
    assert info["start"] == "layout" and info["blocks"] == 0
    assert b.gms(0).kv_directory()[1] == []
    b.close()


def test_without_the_pool_the_wake_creates_its_memory(fenced):
    a = engine(fenced, "kv-a", "loader", kv_pool=False)
    a.acquire(timeout=10)
    a.wake_up()
    a.serve()
    with pytest.raises(gf.StateError):
        a.kv_pool_info(0)
    assert gf.gms_status(fenced.gms_uri())["kv_pool"] is None
    a.close()


def test_an_unfenced_gms_fails_the_wake(cluster):
    cluster.lockd()
    cluster.gmsd()
    a = engine(cluster, "kv-a", "loader")
    a.acquire(timeout=10)
    with pytest.raises(gf.NotSupportedError):
        a.wake_up()
    assert a.state == "dead"
    a.close()
