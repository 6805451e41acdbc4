# SPDX-License-Identifier: Apache-2.0
"""`gfctl gpu list` and gf-gmsd --device over the test driver (real
processes): indices and UUIDs after CUDA_VISIBLE_DEVICES, memory figures,
and clear errors for bad UUIDs, out-of-range indices and a missing driver."""
import json
import os
import pathlib
import subprocess

import pytest

BUILD = pathlib.Path(os.environ["GF_BUILD_ROOT"])
GFCTL = BUILD / "examples" / "gfctl" / "gfctl"
GMSD = BUILD / "examples" / "gf-gmsd" / "gf-gmsd"
FAKE = BUILD / "tests" / "fakecuda" / "libcuda.so.1"


def uuid(n):
    return "GPU-fa4ec0da-0000-4000-8000-%012x" % n


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("FAKECUDA_", "CUDA_VISIBLE"))}
    e.update(GF_LIBCUDA=str(FAKE), FAKECUDA_STATE_DIR=str(tmp_path), FAKECUDA_DEVICES="4",
             FAKECUDA_TOTAL_MEM="1073741824,2147483648,3221225472,4294967296")
    return e


def gpu_list(env, *extra):
    return subprocess.run([GFCTL, "gpu", "list", *extra], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("cvd,want", [
    (None, [0, 1, 2, 3]),
    ("3,1", [3, 1]),
    (uuid(2) + ",0", [2, 0]),
    ("1,9,2", [1]),
    ("2,2", [2]),
])
def test_list_json(env, cvd, want):
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    r = gpu_list(env, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "cuda"
    got = doc["devices"]
    assert [d["index"] for d in got] == list(range(len(want)))
    assert [d["uuid"] for d in got] == [uuid(p) for p in want]
    assert [d["name"] for d in got] == ["Fake GPU %d" % p for p in want]
    assert [d["total_bytes"] for d in got] == [(p + 1) << 30 for p in want]
    assert all(d["free_bytes"] == d["total_bytes"] and d["mig"] is False for d in got)


def test_list_table(env):
    env["CUDA_VISIBLE_DEVICES"] = "1"
    r = gpu_list(env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["INDEX", "UUID", "NAME", "TOTAL_BYTES", "FREE_BYTES"]
    assert lines[1].split()[:2] == ["0", uuid(1)]
    assert len(lines) == 2


def test_list_errors(env):
    env["CUDA_VISIBLE_DEVICES"] = ""
    r = gpu_list(env)
    assert r.returncode == 1 and "no CUDA device" in r.stderr
    env["GF_LIBCUDA"] = "/nonexistent/libcuda.so.1"
    r = gpu_list(env)
    assert r.returncode == 1 and "no CUDA driver" in r.stderr
    r = gpu_list(env, "--backend", "tpu")
    assert r.returncode == 2 and "--backend must be cuda or host" in r.stderr
    r = subprocess.run([GFCTL, "gpu"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage: gfctl gpu COMMAND" in r.stderr and "list" in r.stderr


@pytest.mark.parametrize("device,message", [
    ("GPU-0bad", "no cuda device has uuid GPU-0bad"),
    ("7", "device 7: no such cuda device (2 visible"),
    (uuid(0), "no cuda device has uuid " + uuid(0)),  # exists, but not visible
])
def test_gmsd_device_errors(env, tmp_path, device, message):
    env["CUDA_VISIBLE_DEVICES"] = "3,1"
    r = subprocess.run([GMSD, "--listen", "unix:" + str(tmp_path / "gms.sock"), "--backend", "cuda",
                        "--device", device], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--device" in r.stderr and message in r.stderr, r.stderr
