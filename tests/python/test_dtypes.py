# SPDX-License-Identifier: Apache-2.0
"""Scalars and every dtype the C engine loads: GMSClient.buffer() takes 0-d
shapes, and a Python engine follows a C loader of such a checkpoint (and the
other way round)."""
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import PY_ENGINE, child_env, gf, wait_for
from test_failover import get, start_engine, state

MiB = 1 << 20


def test_buffer_zero_dimensions(cluster):
    cluster.gmsd()
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=5)
    aid = w.allocate(MiB, "w")
    scalar = w.buffer(alloc_id=aid, offset=8, dtype="float32", shape=[])
    assert scalar.nbytes == 4
    with memoryview(scalar) as mv:
        assert mv.ndim == 0 and mv.shape == () and mv.nbytes == 4
        mv.cast("B")[:] = struct.pack("<f", 2.5)
    w.put_meta("s", aid, 8, b"")
    w.commit()
    r = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=5)
    r.map_all()
    arr = np.from_dlpack(r.buffer("s", dtype="float32", shape=()))
    assert arr.shape == () and float(arr) == 2.5
    deep = r.buffer("s", dtype="float32", shape=[1] * 16)
    assert np.from_dlpack(deep).shape == (1,) * 16
    with pytest.raises(ValueError, match="at most 16"):
        r.buffer("s", dtype="float32", shape=[1] * 17)
    del arr
    r.close()
    w.close()


# Extra tensors after the generated weights (which /infer computes with):
# every dtype gf-c-engine loads, scalars, zero-size and 16-dimensional ones.
EXTRAS = [("scalar.f32", "F32", [], 4), ("scalar.u64", "U64", [], 8), ("u16", "U16", [3], 2),
          ("u32", "U32", [2, 1], 4), ("u64", "U64", [2], 8), ("c64", "C64", [2], 8),
          ("f8.e4m3", "F8_E4M3", [4], 1), ("f8.e5m2", "F8_E5M2", [1, 1, 1], 1), ("f8.e8m0", "F8_E8M0", [0], 1),
          ("bf16", "BF16", [2], 2), ("i16", "I16", [], 2), ("bool", "BOOL", [3], 1), ("f64", "F64", [1], 8),
          ("deep", "F32", [1] * 16, 4)]


def checkpoint(path):
    subprocess.run([sys.executable, str(PY_ENGINE), "--write-weights", str(path)], check=True, env=child_env())
    data = path.read_bytes()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    body = bytearray(data[8 + hlen:])
    for i, (name, dtype, shape, size) in enumerate(EXTRAS):
        n = size * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + n]}
        body += bytes((i + k) & 0xFF for k in range(n))
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)
    return path


@pytest.mark.parametrize("loader,follower", [("c", "python"), ("python", "c")])
def test_failover_with_every_dtype_and_scalars(cluster, tmp_path, loader, follower):
    weights = checkpoint(tmp_path / "all-dtypes.safetensors")
    cluster.lockd()
    cluster.gmsd()
    a = start_engine(cluster, loader, "engine-a", "loader", f"--weights={weights}")
    wait_for(lambda: state(a.probe) == "active", 60, "the loader active")
    b = start_engine(cluster, follower, "engine-b", "follower")
    wait_for(lambda: state(b.probe) == "standby", 60, "the follower standby")
    before = get(a.port, "/infer?seed=7")
    reader = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=10)
    reader.map_all()
    keys = reader.metadata.keys()
    assert all(name in keys for name, *_ in EXTRAS), sorted(keys)
    reader.close()
    a.kill()
    wait_for(lambda: state(b.probe) == "active", 60, "the follower active")
    after = get(b.port, "/infer?seed=7")
    assert after["checksum"] == before["checksum"]
    assert "Traceback" not in b.text()
