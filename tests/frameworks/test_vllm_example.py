"""examples/vllm against the installed vLLM, without starting a server (the
real failover is tests/vllm): the worker class is the platform's vLLM worker;
its writer and reader halves on the host backend (every parameter committed
with its dtype, shape and stride; a reader's parameters pointed at the
read-only mappings; another model's layout refused before any parameter
changes); the launcher's arguments."""
import json
import subprocess
import sys

import pytest

from conftest import SOURCE, child_env, cluster, gf  # noqa: F401

EXAMPLE = SOURCE / "examples" / "vllm"
SERVE = EXAMPLE / "gf_vllm_serve.py"


def test_worker_is_a_vllm_worker():
    code = f"""
import sys; sys.path.insert(0, {str(EXAMPLE)!r})
import gf_worker
from vllm.platforms import current_platform
from vllm.v1.worker.gpu_worker import Worker
assert issubclass(gf_worker.GfWorker, Worker)
for step in ("gf_standby", "gf_acquire", "gf_serve", "load_model", "_maybe_get_memory_pool_context"):
    assert getattr(gf_worker.GfWorker, step) is not getattr(Worker, step, None), step
print("ok", gf_worker._Base.__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ok " in out.stdout


def test_launcher_arguments():
    def run(*args):
        return subprocess.run([sys.executable, SERVE, *args], capture_output=True, text=True, env=child_env(),
                              timeout=120)
    out = run("--lock", "unix:///nowhere", "--gms", "unix:///nowhere", "--id", "a")
    assert out.returncode == 2 and "give the vLLM server arguments after --" in out.stderr
    out = run("--lock", "unix:///nowhere", "--gms", "unix:///nowhere", "--id", "a", "--role", "boss", "--", "m")
    assert out.returncode == 2 and "--role" in out.stderr
    out = run("--lock", "unix:///nowhere", "--gms", "unix:///nowhere", "--id", "a", "--waking-timeout", "soon",
              "--", "m")
    assert out.returncode == 2 and "waking-timeout" in out.stderr


def load_worker_module():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import gf_worker
    finally:
        sys.path.remove(str(EXAMPLE))
    return gf_worker


def test_cpu_writer_commits_and_reader_binds_read_only(cluster):
    """The host-backend halves: commit_cpu copies every parameter into one
    GMS allocation and points the model at it; bind points another model's
    parameters at the read-only mapping (same bytes, no copy) and refuses a
    layout of another model before changing any parameter."""
    import torch
    gf_worker = load_worker_module()
    cluster.gmsd()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 3))
    want = {k: v.clone() for k, v in model.state_dict().items()}
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    assert gf_worker.commit_cpu(w, model) >= 1
    (alloc,) = w.allocations
    for name, p in model.named_parameters():
        assert alloc["addr"] <= p.data_ptr() < alloc["addr"] + alloc["size"], name
        assert torch.equal(p, want[name])
    r = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=10)
    r.map_all()
    meta = r.metadata
    assert set(meta) == set(want)
    assert json.loads(meta["0.weight"]["value"]) == {"dtype": "float32", "shape": [4, 8], "stride": [8, 1]}
    reader = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 3))
    gf_worker.bind(r, reader, "cpu")
    x = torch.randn(2, 8)
    assert torch.equal(reader(x), model(x))
    assert reader[0].weight.data_ptr() == meta["0.weight"]["addr"]

    other = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 5))
    before = [p.data_ptr() for p in other.parameters()]
    with pytest.raises(gf.StaleLayoutError, match=r"parameter 1.weight: .*\[3, 4\].*\[5, 4\]"):
        gf_worker.bind(r, other, "cpu")
    assert [p.data_ptr() for p in other.parameters()] == before  # nothing half-bound
    with pytest.raises(gf.StaleLayoutError, match="no parameter 0.0.weight"):
        gf_worker.bind(r, torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(8, 4))), "cpu")
    with pytest.raises(gf.StaleLayoutError, match="parameters this model lacks"):
        gf_worker.bind(r, torch.nn.Sequential(torch.nn.Linear(8, 4)), "cpu")
    del reader
    r.unmap()  # tensors bound by address are not exports: the engine can sleep


def test_gpu_writer_refuses_a_parameter_outside_the_gms(cluster):
    import torch
    gf_worker = load_worker_module()
    cluster.gmsd()
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    w.allocate(1 << 20, "weights")
    with pytest.raises(RuntimeError, match="was not allocated in the GMS"):
        gf_worker.commit_gpu(w, torch.nn.Linear(2, 2))
