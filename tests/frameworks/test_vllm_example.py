# SPDX-License-Identifier: Apache-2.0
"""examples/vllm without a GPU: the worker class imports against the installed
vLLM and is a vLLM Worker, its publish step and layout checks work on the host
backend; the supervisor leaves without the lock when its vLLM child dies, and
rejects bad arguments. (vLLM's serving path itself needs a GPU and is not run
here.)"""
import subprocess
import sys

import pytest

from conftest import SOURCE, child_env, cluster, gf, wait_for  # noqa: F401

EXAMPLE = SOURCE / "examples" / "vllm"
SUPERVISOR = EXAMPLE / "gf_vllm_supervisor.py"


def run(args, timeout=120, **kw):
    return subprocess.run([sys.executable, SUPERVISOR, *map(str, args)], capture_output=True, text=True,
                          env=child_env(), timeout=timeout, **kw)


def test_worker_is_a_vllm_worker():
    code = f"""
import sys; sys.path.insert(0, {str(EXAMPLE)!r})
import gf_worker
from vllm.v1.worker.gpu_worker import Worker
import gpufailover.vllm as gfv
assert issubclass(gf_worker.GfWorker, Worker)
assert gf_worker.GfWorker._maybe_get_memory_pool_context is not Worker._maybe_get_memory_pool_context
print("ok", gfv.BACKEND_NAME)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ok gpufailover" in out.stdout


def test_supervisor_arguments():
    out = run(["--lock", "unix:///nowhere", "--id", "a", "--port", "8000"])
    assert out.returncode == 2 and "give the vLLM command after --" in out.stderr
    out = run(["--lock", "unix:///nowhere", "--id", "a", "--port", "0", "--", "true"])
    assert out.returncode == 2 and "--port must be 1..65535" in out.stderr
    out = run(["--lock", "unix:///nowhere", "--id", "a", "--port", "8000", "--startup-timeout", "soon", "--", "true"])
    assert out.returncode == 2 and "startup-timeout" in out.stderr


def test_supervisor_leaves_when_vllm_dies_and_the_lock_stays_free(cluster, tmp_path):
    cluster.lockd()
    ready = tmp_path / "ready"
    out = run(["--lock", cluster.lock_uri, "--id", "vllm-a", "--port", "1", "--ready-file", ready, "--",
               sys.executable, "-c", "import sys; sys.exit(3)"])
    assert out.returncode == 3, out.stderr
    assert "event=vllm_exited status=3" in out.stderr
    assert "event=granted" not in out.stderr and not ready.exists()
    assert gf.lock_status(cluster.lock_uri)["holder"] in (None, "", {})


def load_worker_module():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import gf_worker
    finally:
        sys.path.remove(str(EXAMPLE))
    return gf_worker


def test_worker_publishes_each_parameter_and_refuses_another_model(cluster):
    """The writer half of gf_worker (parameters already in GMS memory -> one
    metadata entry each, then commit) and the reader's layout checks, on the
    host backend; binding parameters by address needs a GPU."""
    import json

    import torch
    gf_worker = load_worker_module()
    cluster.gmsd()
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    a = w.allocate(1 << 20, "weights")
    with torch.device("meta"):
        model = torch.nn.Linear(8, 4)
    views = {"weight": torch.from_dlpack(w.buffer(alloc_id=a, offset=0, dtype="float32", shape=[4, 8])),
             "bias": torch.from_dlpack(w.buffer(alloc_id=a, offset=4096, dtype="float32", shape=[4]))}
    model.load_state_dict(views, assign=True)
    assert gf_worker.publish(w, model) >= 1
    r = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=10)
    r.map_all()
    meta = r.metadata
    assert set(meta) == {"weight", "bias"}
    assert meta["weight"]["offset"] == 0 and meta["bias"]["offset"] == 4096
    assert json.loads(meta["weight"]["value"]) == {"dtype": "float32", "shape": [4, 8], "stride": [8, 1]}
    with pytest.raises(gf.StaleLayoutError, match=r"parameter weight: .*\[5, 8\]"):
        gf_worker.bind(r, torch.nn.Linear(8, 5))
    with pytest.raises(gf.StaleLayoutError, match="no parameter 0.weight"):
        gf_worker.bind(r, torch.nn.Sequential(torch.nn.Linear(8, 4)))
    # A parameter outside the GMS cannot be published.
    w2_uri = cluster.gms_uri(1)
    cluster.gmsd(1)
    w2 = gf.GMSClient(w2_uri, gf.Memory("host"), mode="rw", timeout=10)
    w2.allocate(1 << 20, "weights")
    with pytest.raises(RuntimeError, match="was not allocated in the GMS"):
        gf_worker.publish(w2, torch.nn.Linear(2, 2))
