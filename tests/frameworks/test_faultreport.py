# SPDX-License-Identifier: Apache-2.0
"""The fault reporter: a write to a read-only GMS weight (torch ignores the
DLPack read-only flag) kills the process with the usual SIGSEGV, and the line
before it names the allocation and the metadata key. Each write happens in a
child process."""
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import child_env, cluster, gf  # noqa: F401

SETUP = """
import ctypes, sys
import gpufailover as gf
uri, mode = sys.argv[1], sys.argv[2]
gms = gf.GMSClient(uri, gf.Memory("host"), mode="ro", timeout=10)
gms.map_all()
if mode != "none":
    gf.install_fault_reporter(gms)
print("mapped", flush=True)
"""


def load_weights(cluster):
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    a0 = w.allocate(1 << 20, "weights.0")
    a1 = w.allocate(1 << 20, "weights.1")
    w.put_meta("embed.weight", a0, 0, b'{"dtype":"F32","shape":[16,16]}')
    w.put_meta("blocks.0.attn.qkv.weight", a0, 4096, b'{"dtype":"F32","shape":[48,16]}')
    w.put_meta("lm_head.weight", a1, 256, b'{"dtype":"F32","shape":[16,16]}')
    w.commit()
    return w


def run_child(cluster, body, mode="install"):
    code = SETUP + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, cluster.gms_uri(), mode], capture_output=True, text=True,
                          timeout=120, env=child_env())


def reporter_lines(err):
    return [line for line in err.splitlines() if line.startswith("gpufailover: SIG")]


def test_torch_write_to_readonly_weight_names_the_key(cluster):
    cluster.gmsd()
    w = load_weights(cluster)
    out = run_child(cluster, """
        import torch
        t = torch.from_dlpack(gms.buffer("blocks.0.attn.qkv.weight", dtype="float32", shape=[48, 16]))
        t[0, 0] = 5
        print("survived", flush=True)
    """)
    assert out.returncode == -signal.SIGSEGV, out.stderr
    assert "mapped" in out.stdout and "survived" not in out.stdout
    lines = reporter_lines(out.stderr)
    assert len(lines) == 1, out.stderr
    alloc = w.metadata["blocks.0.attn.qkv.weight"]["alloc_id"]
    assert "write to read-only GMS mapping" in lines[0]
    assert f'allocation {alloc} tag "weights.0" offset 0x1000' in lines[0]
    assert 'key "blocks.0.attn.qkv.weight" +0x0' in lines[0]


def test_write_inside_a_tensor_names_the_tensor_and_offset(cluster):
    cluster.gmsd()
    w = load_weights(cluster)
    out = run_child(cluster, """
        addr = gms.metadata["lm_head.weight"]["addr"]
        ctypes.memset(addr + 100, 1, 1)
    """)
    assert out.returncode == -signal.SIGSEGV, out.stderr
    (line,) = reporter_lines(out.stderr)
    alloc = w.metadata["lm_head.weight"]["alloc_id"]
    assert f'allocation {alloc} tag "weights.1" offset 0x{256 + 100:x}' in line
    assert 'key "lm_head.weight" +0x64' in line


def test_without_the_reporter_the_crash_is_bare(cluster):
    cluster.gmsd()
    load_weights(cluster)
    out = run_child(cluster, """
        addr = gms.metadata["lm_head.weight"]["addr"]
        ctypes.memset(addr, 1, 1)
    """, mode="none")
    assert out.returncode == -signal.SIGSEGV
    assert not reporter_lines(out.stderr)


def test_faults_elsewhere_pass_through_and_reads_work(cluster):
    cluster.gmsd()
    load_weights(cluster)
    out = run_child(cluster, """
        addr = gms.metadata["embed.weight"]["addr"]
        print("read", ctypes.string_at(addr, 4) == bytes(4), flush=True)
        ctypes.memset(8, 1, 1)
    """)
    assert "read True" in out.stdout
    assert out.returncode == -signal.SIGSEGV
    assert not reporter_lines(out.stderr), out.stderr


def test_removed_reporter_restores_the_previous_handler(cluster):
    cluster.gmsd()
    load_weights(cluster)
    out = run_child(cluster, """
        gf.remove_fault_reporter(gms)
        ctypes.memset(gms.metadata["embed.weight"]["addr"], 1, 1)
    """)
    assert out.returncode == -signal.SIGSEGV
    assert not reporter_lines(out.stderr), out.stderr


def test_bad_arguments_are_clear_errors(cluster):
    cluster.gmsd()
    with pytest.raises(TypeError, match="GMSClient"):
        gf.install_fault_reporter("unix:///nowhere")
    with pytest.raises(TypeError, match="GMSClient or None"):
        gf.remove_fault_reporter(42)
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    with pytest.raises(gf.StateError, match="mapped nothing"):
        gf.install_fault_reporter(w)
    gf.remove_fault_reporter()  # nothing installed: a no-op
    w.close()
    with pytest.raises(ValueError, match="closed"):
        gf.install_fault_reporter(w)


def test_numpy_honours_the_read_only_flag(cluster):
    import numpy as np
    cluster.gmsd()
    load_weights(cluster)
    r = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=10)
    r.map_all()
    for arr in (np.from_dlpack(r.buffer("lm_head.weight", dtype="float32", shape=[16, 16])),
                np.asarray(r.buffer("lm_head.weight", dtype="float32", shape=[16, 16]))):
        assert not arr.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            arr[0, 0] = 5
        del arr
    r.close()
