# SPDX-License-Identifier: Apache-2.0
"""examples/torch-engine against the installed torch and real sidecars:
parameters are zero-copy views of GMS mappings, the forward pass over them is
bit-identical to the same model over plain tensors, and the answers stay
identical across a failover (torch -> torch, and a C-engine loader -> torch
standby)."""
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import TORCH_ENGINE, child_env, cluster, engine_state, get, gf, load_torch_engine, start_engine, \
    wait_for  # noqa: F401

te = load_torch_engine()
SEEDS = [0, 1, 7, 12345]


def reference_answers(tensors):
    """The model over ordinary torch tensors (no GMS): the answers every engine must give."""
    layers = len({n.split(".")[1] for n, *_ in tensors if n.startswith("blocks.")})
    dim = next(s[0] for n, _, s, _ in tensors if n == "ln_f.weight")
    model = te.TinyTransformer(layers, dim)
    model.load_state_dict({n: torch.from_numpy(np.frombuffer(b, dtype=np.float32).reshape(s).copy())
                           for n, _, s, b in tensors})
    model.eval()
    return {seed: te.answer(te.infer(model, seed))["checksum"] for seed in SEEDS}


def test_parameters_are_zero_copy_views_of_the_gms(cluster):
    cluster.gmsd()
    tensors = te.generate_weights()
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    te.pyeng.load_into(w, tensors)
    r = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=10)
    r.map_all()
    model = te.model_from_gms(r)
    params = dict(model.named_parameters())
    assert len(params) == len(tensors)
    meta = r.metadata
    spans = [(a["addr"], a["addr"] + a["size"]) for a in r.allocations]
    for name, p in params.items():
        assert p.device.type == "cpu" and p.dtype == torch.float32 and not p.requires_grad
        # Exactly where the GMS says this tensor is, inside a mapping of the reader.
        assert p.data_ptr() == meta[name]["addr"], name
        assert any(lo <= p.data_ptr() and p.data_ptr() + p.numel() * 4 <= hi for lo, hi in spans), name
    # Bit-identical to the same module over plain tensors.
    ref = reference_answers(tensors)
    assert {s: te.answer(te.infer(model, s))["checksum"] for s in SEEDS} == ref
    # The views keep the mappings exported: sleep is refused until they are gone.
    with pytest.raises(BufferError):
        r.unmap()
    del model, params, p
    import gc
    gc.collect()
    r.unmap()


def test_a_layout_of_another_model_is_refused_clearly(cluster):
    cluster.gmsd()
    w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    te.pyeng.load_into(w, te.pyeng.generate_weights())  # the C/Python engines' MLP
    with pytest.raises(ValueError, match="does not hold the torch engine's model"):
        te.model_from_gms(w)
    bad = [(n, d, [s[0] // 2] + s[1:] if n == "blocks.0.mlp.fc1.weight" else s,
            b[:len(b) // 2] if n == "blocks.0.mlp.fc1.weight" else b) for n, d, s, b in te.generate_weights()]
    cluster2_uri = cluster.gms_uri(1)
    cluster.gmsd(1)
    w2 = gf.GMSClient(cluster2_uri, gf.Memory("host"), mode="rw", timeout=10)
    te.pyeng.load_into(w2, bad)
    with pytest.raises(ValueError, match="blocks.0.mlp.fc1.weight"):
        te.model_from_gms(w2)


def answers(port):
    out = {}
    for seed in SEEDS:
        body = get(port, f"/infer?seed={seed}")
        assert body["dim"] == 8 * 64 and len(body["result"]) == 8
        out[seed] = body["checksum"]
    return out


def failover(cluster, first, first_args, expect):
    cluster.lockd()
    cluster.gmsd()
    a = start_engine(cluster, first, "engine-a", "loader", *first_args)
    wait_for(lambda: engine_state(a.probe) == "active", timeout=90, what="engine-a active")
    b = start_engine(cluster, "torch", "engine-b", "follower")
    wait_for(lambda: engine_state(b.probe) == "standby", timeout=90, what="engine-b standby")
    if first == "torch":
        assert answers(a.port) == expect
    a.kill(signal.SIGKILL)
    wait_for(lambda: engine_state(b.probe) == "active", timeout=90, what="engine-b active")
    after = answers(b.port)
    assert after == expect, "the torch standby's answers differ after the failover"
    assert "model_ready" in b.text() and "zero_copy=yes" in b.text()
    return b


def test_failover_torch_to_torch_answers_identically(cluster):
    failover(cluster, "torch", [], reference_answers(te.generate_weights()))


def test_c_engine_loader_to_torch_standby(cluster, tmp_path):
    path = tmp_path / "transformer.safetensors"
    subprocess.run([sys.executable, TORCH_ENGINE, "--write-weights", path], check=True, env=child_env())
    tensors, _ = te.pyeng.read_safetensors(path)
    b = failover(cluster, "c", ["--weights", str(path)], reference_answers(tensors))
    # The C engine packed the GMS; the torch standby used it as it was.
    assert "weights_loaded" not in b.text()


def test_torch_standby_refuses_weights_of_another_model(cluster):
    cluster.lockd()
    cluster.gmsd()
    a = start_engine(cluster, "c", "engine-a", "loader")
    wait_for(lambda: engine_state(a.probe) == "active", timeout=90, what="engine-a active")
    b = start_engine(cluster, "torch", "engine-b", "follower")
    assert b.p.wait(timeout=120) == 1
    assert "step_failed" in b.text() and "does not hold the torch engine's model" in b.text()


def test_bad_arguments(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, TORCH_ENGINE, *map(str, args)], capture_output=True, text=True, env=child_env(),
                              timeout=120)
    out = run("--lock", "unix:///nowhere")
    assert out.returncode == 2 and "exactly one --gms" in out.stderr
    out = run("--lock", "unix:///nowhere", "--gms", "unix:///nowhere", "--backend", "cuda")
    assert out.returncode == 2 and "--backend host" in out.stderr
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01")
    out = run("--lock", "unix:///nowhere", "--gms", "unix:///nowhere", "--weights", bad)
    assert out.returncode == 1 and "too short" in out.stderr
