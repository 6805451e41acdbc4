#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A PyTorch inference engine that fails over through libgpufailover.

The model is a real torch.nn module: a few pre-norm transformer blocks
(causal multi-head attention and an MLP). Its parameters are zero-copy views
of the GPU Memory Service's mappings (torch.from_dlpack over the weights the
GMS lends): the engine checks that every parameter's data_ptr lies inside a
GMS allocation and refuses to serve otherwise.

It packs weights into the GMS exactly as examples/python-engine and
gf-c-engine do (tensors in order, 256-byte aligned, metadata key = tensor
name, value = JSON {dtype, shape, index, nbytes}), so a torch standby can
take over weights that a C or Python loader put there, as long as they are
this model's tensors (write them with --write-weights, load them with any
engine's --weights). /infer has the Python engine's interface; the answer is
this model's forward pass.
"""
import argparse
import gc
import importlib.util
import json
import os
import pathlib
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

import numpy as np
import xxhash

try:
    import torch
except ImportError as e:
    sys.exit(f"torch-engine needs PyTorch ({e}): bash tests/setup-frameworks.sh installs it")

import gpufailover as gf


def _python_engine():
    """The Python engine's weight file and GMS layout code, shared so that all
    example engines pack the GMS the same way."""
    path = pathlib.Path(__file__).resolve().parents[1] / "python-engine" / "engine.py"
    spec = importlib.util.spec_from_file_location("gf_python_engine", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pyeng = _python_engine()
log = pyeng.log
HEADS = 4
SEQ = 8
WEIGHT_SEED = 0x70C4E16E


def generate_weights(layers=2, dim=64):
    """Deterministic weights of the transformer: [(name, "F32", shape, bytes)] in model order."""
    shapes = []
    for i in range(layers):
        p = f"blocks.{i}."
        shapes += [(p + "ln1.weight", [dim]), (p + "ln1.bias", [dim]),
                   (p + "attn.qkv.weight", [3 * dim, dim]), (p + "attn.qkv.bias", [3 * dim]),
                   (p + "attn.proj.weight", [dim, dim]), (p + "attn.proj.bias", [dim]),
                   (p + "ln2.weight", [dim]), (p + "ln2.bias", [dim]),
                   (p + "mlp.fc1.weight", [4 * dim, dim]), (p + "mlp.fc1.bias", [4 * dim]),
                   (p + "mlp.fc2.weight", [dim, 4 * dim]), (p + "mlp.fc2.bias", [dim])]
    shapes += [("ln_f.weight", [dim]), ("ln_f.bias", [dim])]
    total = sum(int(np.prod(s)) for _, s in shapes)
    units = pyeng.splitmix_units(WEIGHT_SEED, total)
    out, at = [], 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        u = units[at:at + n].reshape(shape)
        at += n
        if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "ln_f.weight":
            w = np.float32(1.0) + np.float32(0.1) * u
        elif name.endswith(".bias"):
            w = np.float32(0.02) * u
        else:
            w = u * (np.float32(1.0) / np.sqrt(np.float32(shape[1])))
        out.append((name, "F32", shape, w.astype(np.float32).tobytes()))
    return out


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.Module()
        self.attn.qkv = torch.nn.Linear(dim, 3 * dim)
        self.attn.proj = torch.nn.Linear(dim, dim)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential()
        self.mlp.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.mlp.act = torch.nn.GELU()
        self.mlp.fc2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        seq, dim = x.shape
        q, k, v = self.attn.qkv(self.ln1(x)).split(dim, dim=-1)
        heads = lambda t: t.view(seq, HEADS, dim // HEADS).transpose(0, 1)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        scores = q @ k.transpose(-2, -1) / float(dim // HEADS) ** 0.5
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()
        att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        x = x + self.attn.proj((att @ v).transpose(0, 1).reshape(seq, dim))
        return x + self.mlp(self.ln2(x))


class TinyTransformer(torch.nn.Module):
    def __init__(self, layers, dim):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(dim)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x)


def model_from_gms(gms):
    """The transformer with every parameter a zero-copy, read-only-mapped view of
    ``gms``'s weights. Raises ValueError when the GMS does not hold this model."""
    meta = gms.metadata
    if "ln_f.weight" not in meta:
        raise ValueError("the GMS does not hold the torch engine's model (no ln_f.weight); "
                         "load weights written by --write-weights")
    dim = json.loads(meta["ln_f.weight"]["value"])["shape"][0]
    layers = len({k.split(".")[1] for k in meta if k.startswith("blocks.")})
    if dim <= 0 or dim % HEADS or layers == 0:
        raise ValueError(f"unusable model in the GMS: dim={dim} layers={layers}")
    with torch.device("meta"):
        model = TinyTransformer(layers, dim)
    views = {}
    for name, p in model.state_dict().items():
        if name not in meta:
            raise ValueError(f"the GMS has no tensor {name!r}")
        v = json.loads(meta[name]["value"])
        if v["dtype"] != "F32" or list(v["shape"]) != list(p.shape):
            raise ValueError(f"tensor {name!r}: GMS has {v['dtype']} {v['shape']}, the model needs F32 "
                             f"{list(p.shape)}")
        views[name] = torch.from_dlpack(gms.buffer(name, dtype="float32", shape=v["shape"]))
    model.load_state_dict(views, strict=True, assign=True)
    model.requires_grad_(False)
    check_zero_copy(model, gms)
    return model.eval()


def check_zero_copy(model, gms):
    """Every parameter must lie inside one GMS allocation (no copy was made)."""
    spans = [(a["addr"], a["addr"] + a["size"]) for a in gms.allocations]
    for name, p in model.named_parameters():
        start, end = p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()
        if not any(lo <= start and end <= hi for lo, hi in spans):
            raise ValueError(f"parameter {name} at {start:#x} is not inside a GMS mapping")


def model_input(seed, dim):
    """The input for a seed: SEQ x dim floats from the engines' splitmix sequence."""
    units = pyeng.splitmix_units((seed ^ 0x1F0E5EED) & pyeng.M64, SEQ * dim)
    return torch.from_numpy(units.reshape(SEQ, dim))


def infer(model, seed):
    dim = model.ln_f.weight.shape[0]
    with torch.inference_mode():
        return model(model_input(seed, dim)).contiguous().numpy()


def answer(out, **extra):
    return {"result": [float(v) for v in out.reshape(-1)[:8]],
            "checksum": xxhash.xxh64(out.tobytes(), seed=0).hexdigest(), "dim": int(out.size), **extra}


def release(state):
    """Drop the model so the DLPack exports die before the engine unmaps."""
    state["model"] = None
    gc.collect()


def main(argv=None):
    p = argparse.ArgumentParser(description="A PyTorch inference engine that fails over through libgpufailover.")
    p.add_argument("--lock", help="lock server URI")
    p.add_argument("--gms", action="append", default=[], help="GMS URI (one device)")
    p.add_argument("--role", choices=["loader", "follower"], default="loader")
    p.add_argument("--id", default=f"torch-engine-{os.getpid()}")
    p.add_argument("--weights", help="safetensors file of this model (loader); default: generated weights")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--listener", metavar="NAME",
                   help="serve from the listening socket the lock carries under NAME (gf-lockd --listener "
                        "NAME=URI) instead of --port: no connection is refused during a failover")
    p.add_argument("--probe-port", type=int, default=8081)
    p.add_argument("--probe-address", default="0.0.0.0")
    p.add_argument("--backend", choices=["auto", "host", "cuda"], default="host",
                   help="GMS memory backend; this engine computes on the CPU, so only host works")
    p.add_argument("--waking-timeout", type=pyeng.parse_duration, default=120.0)
    p.add_argument("--remap-timeout", type=pyeng.parse_duration, default=30.0)
    p.add_argument("--init-timeout", type=pyeng.parse_duration, default=None,
                   help="how long Init waits for each GMS (default: loader forever, follower 30m)")
    p.add_argument("--kv-bytes", type=pyeng.parse_bytes, default=16 << 20)
    p.add_argument("--no-fault-reporter", action="store_true",
                   help="do not install the handler that names the weight behind a SIGSEGV")
    p.add_argument("--write-weights", metavar="FILE", help="write the generated weights and exit")
    p.add_argument("--version", action="version", version=f"torch-engine (libgpufailover) {gf.__version__}")
    a = p.parse_args(argv)
    if a.write_weights:
        pyeng.write_safetensors(a.write_weights, generate_weights())
        return 0
    if not a.lock or len(a.gms) != 1:
        p.error("--lock and exactly one --gms are required")
    if not (0 <= a.port <= 65535):
        p.error("--port must be 0..65535")
    if a.backend != "host":
        # The forward pass runs on the CPU over host mappings.
        p.error("the torch engine computes on the CPU: --backend host")
    try:
        tensors = pyeng.read_safetensors(a.weights)[0] if a.weights else generate_weights()
    except (OSError, ValueError) as e:
        log("load_failed", msg=json.dumps(str(e)))
        return 1
    # One thread: the same operation order on every engine of a pair, and a
    # fair share of a machine the standby shares.
    torch.set_num_threads(1)

    stop = threading.Event()
    eng = gf.Engine(a.lock, a.id, a.gms, role=a.role, backend=a.backend, waking_timeout=a.waking_timeout,
                    remap_timeout=a.remap_timeout, private_bytes=a.kv_bytes,
                    probe_port=a.probe_port, probe_address=a.probe_address,
                    # omitted: the library's default for the role (a follower 30 min, a loader forever)
                    **({} if a.init_timeout is None else {"init_timeout": a.init_timeout}))
    state = {"model": None}
    try:
        eng.init_weights(load=lambda device, gms: pyeng.load_into(gms, tensors))
        # Build the model once while mapped: a layout this model cannot use
        # fails here, before the engine waits as a standby.
        state["model"] = model_from_gms(eng.gms(0))
        release(state)
        eng.sleep()
        epoch = eng.acquire()
        eng.wake_up()
        gms = eng.gms(0)
        state["model"] = model_from_gms(gms)
        if not a.no_fault_reporter:
            gf.install_fault_reporter(gms)
        log("model_ready", parameters=sum(1 for _ in state["model"].parameters()), zero_copy="yes",
            torch=torch.__version__)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urlparse(self.path)
                if url.path != "/infer":
                    return self.reply(404, {"error": "not found; use /infer?seed=N"})
                q = parse_qs(url.query).get("seed", ["0"])[0]
                if not q.isdigit():
                    return self.reply(400, {"error": "seed must be a non-negative integer"})
                out = infer(state["model"], int(q))
                self.reply(200, answer(out, epoch=eng.epoch, engine=a.id, seed=int(q)))

            do_POST = do_GET

            def reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def serve_endpoint():
            server = pyeng.http_server(eng, a.port, a.listener, Handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            log("endpoint_listening", port=server.server_address[1], epoch=epoch)

        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        eng.serve(serve=serve_endpoint)
        log("active", epoch=epoch, **{k: v for k, v in eng.metrics.items() if k.endswith("_us")})
        stop.wait()
        log("exit", status=0)
        return 0
    except (gf.GpuFailoverError, ValueError) as e:
        log("step_failed", error=getattr(e, "name", type(e).__name__), msg=json.dumps(str(e)))
        return 1
    finally:
        release(state)


if __name__ == "__main__":
    sys.exit(main())
