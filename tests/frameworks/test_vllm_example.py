"""gpufailover.vllm's launcher and worker against the installed vLLM, without
starting a server (the real failover is tests/vllm): the worker class is the
platform's vLLM worker with vLLM's sleep and wake going to the backend; its
writer and reader halves on the host backend (every parameter name committed
with its dtype, shape and stride, aliases recorded, private parameters
copied; a reader's parameters pointed at the read-only mappings; another
model's layout refused before any parameter changes); the launcher's
arguments."""
import json
import subprocess
import sys

import pytest

from conftest import child_env, cluster, gf  # noqa: F401


def test_worker_is_a_vllm_worker():
    code = """
import gpufailover.vllm.worker as w
from vllm.v1.worker.gpu_worker import Worker
assert issubclass(w.GfWorker, Worker)
assert w.GfWorker.__module__ == "gpufailover.vllm.worker" and w.GfWorker.__qualname__ == "GfWorker"
for step in ("sleep", "wake_up", "discard", "gf_info", "gf_serve", "load_model", "initialize_from_config",
             "_maybe_get_memory_pool_context"):
    assert getattr(w.GfWorker, step) is getattr(w.GfWorkerMixin, step), step
from vllm.utils.import_utils import resolve_obj_by_qualname
assert resolve_obj_by_qualname("gpufailover.vllm.worker.GfWorker") is w.GfWorker
print("ok", w.GfWorker.__mro__[2].__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ok " in out.stdout


def run_launcher(*args):
    return subprocess.run([sys.executable, "-m", "gpufailover.vllm", *args], capture_output=True, text=True,
                          env=child_env(), timeout=120)


def test_launcher_arguments():
    need = ("--lock", "unix:///nowhere", "--gms", "unix:///nowhere", "--id", "a")
    out = run_launcher("--lock", "x")
    assert out.returncode == 2 and "the command is `gf-vllm serve MODEL" in out.stderr
    out = run_launcher("serve", *need)
    assert out.returncode == 2 and "give the model and vLLM's server arguments" in out.stderr
    out = run_launcher("serve", "m", "--role", "boss", *need)
    assert out.returncode == 2 and "--role" in out.stderr
    out = run_launcher("serve", "m", *need, "--waking-timeout", "soon")
    assert out.returncode == 2 and "waking-timeout" in out.stderr
    out = run_launcher("serve", "m", *need, "--private-param", "(")
    assert out.returncode == 2 and "--private-param '('" in out.stderr
    out = run_launcher("serve", "m", "--max-model-len", "256")
    assert out.returncode == 2 and "--lock" in out.stderr
    out = run_launcher("serve", "--help")
    assert out.returncode == 0 and "gf-vllm serve MODEL [vLLM server arguments]" in out.stdout


def test_launcher_splits_its_options_from_vllms():
    from gpufailover.vllm import serve
    ours, rest = serve.parse_args(["serve", "/m", "--dtype", "float32", "--lock", "unix:///l", "--max-model-len",
                                   "256", "--gms", "unix:///g", "--id", "a", "--role", "follower",
                                   "--no-keep-handles", "--private-param", "scale$", "--", "--port", "9"])
    assert (ours.lock, ours.gms, ours.id, ours.role) == ("unix:///l", "unix:///g", "a", "follower")
    assert ours.keep_handles is False and ours.private_param == ["scale$"]
    assert rest == ["/m", "--dtype", "float32", "--max-model-len", "256", "--port", "9"]


def load_worker_module():
    import gpufailover.vllm.worker as gf_worker
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


def test_aliases_are_recorded_once_and_private_parameters_copied(cluster):
    """Tied weights (one Parameter under two names) are stored once, the
    second name an alias at the same place; a parameter named as private is
    committed but each engine keeps a copy of its own: the writer keeps
    vLLM's, the reader gets a writable copy outside the GMS mapping."""
    import torch
    gf_worker = load_worker_module()
    cluster.gmsd()

    def tied():
        torch.manual_seed(0)
        m = torch.nn.Module()
        m.embed = torch.nn.Embedding(16, 8)
        m.head = torch.nn.Linear(8, 16, bias=False)
        m.head.weight = m.embed.weight                     # tied: one Parameter, two names
        m.attn = torch.nn.Module()
        m.attn.k_scale = torch.nn.Parameter(torch.tensor([2.0]))  # written after load by fp8 models
        return m

    model = tied()
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    gf_worker.commit_cpu(w, model)
    (alloc,) = w.allocations
    in_gms = lambda t: alloc["addr"] <= t.data_ptr() < alloc["addr"] + alloc["size"]  # noqa: E731
    assert in_gms(model.embed.weight) and model.head.weight is model.embed.weight
    assert not in_gms(model.attn.k_scale)                 # the writer keeps its own
    r = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=10)
    r.map_all()
    meta = r.metadata
    assert set(meta) == {"embed.weight", "head.weight", "attn.k_scale"}
    assert meta["head.weight"]["addr"] == meta["embed.weight"]["addr"]
    assert json.loads(meta["head.weight"]["value"])["alias_of"] == "embed.weight"
    assert "alias_of" not in json.loads(meta["embed.weight"]["value"])
    assert json.loads(meta["attn.k_scale"]["value"])["private"] is True
    # 16x8 float32 once, the scale after it: no second copy of the tied weight.
    assert meta["attn.k_scale"]["addr"] - meta["embed.weight"]["addr"] == 512

    reader = tied()
    gf_worker.bind(r, reader, "cpu")
    assert reader.head.weight is reader.embed.weight and reader.embed.weight.data_ptr() == meta["embed.weight"]["addr"]
    k = reader.attn.k_scale
    assert not (meta["embed.weight"]["addr"] <= k.data_ptr() < meta["embed.weight"]["addr"] + alloc["size"])
    assert k.item() == 2.0
    with torch.no_grad():
        k.mul_(3)                                          # private: a write is the reader's own
    assert k.item() == 6.0 and model.attn.k_scale.item() == 2.0

    # A model that ties two names refuses a layout that holds them apart.
    cluster.gmsd(1)
    untied = tied()
    untied.head.weight = torch.nn.Parameter(untied.embed.weight.detach().clone())
    w1 = gf.GMSClient(cluster.gms_uri(1), gf.Memory("host"), mode="rw", timeout=10)
    gf_worker.commit_cpu(w1, untied)
    r1 = gf.GMSClient(cluster.gms_uri(1), gf.Memory("host"), mode="ro", timeout=10)
    r1.map_all()
    victim = tied()
    before = [p.data_ptr() for p in victim.parameters()]
    with pytest.raises(gf.StaleLayoutError, match="ties head.weight to embed.weight, the GMS holds them apart"):
        gf_worker.bind(r1, victim, "cpu")
    assert [p.data_ptr() for p in victim.parameters()] == before  # nothing half-bound
    split = torch.nn.Module()
    split.embed, split.head = tied().embed, torch.nn.Linear(8, 16, bias=False)
    split.attn = tied().attn
    gf_worker.bind(r, split, "cpu")                          # untied model over the tied layout: both names bound
    assert split.head.weight.data_ptr() == split.embed.weight.data_ptr() == meta["embed.weight"]["addr"]
    del reader, split, k
    r.unmap()


def test_gpu_writer_refuses_a_parameter_outside_the_gms(cluster):
    import torch
    gf_worker = load_worker_module()
    cluster.gmsd()
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    w.allocate(1 << 20, "weights")
    with pytest.raises(RuntimeError, match="was not allocated in the GMS"):
        gf_worker.commit_gpu(w, torch.nn.Linear(2, 2))
