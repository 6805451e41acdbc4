#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python twin of examples/c-engine: a small inference engine that fails
over through libgpufailover, computing with numpy directly over the weights
the GPU Memory Service lends (zero-copy).

It is interoperable with gf-c-engine: the same GMS layout (tensors packed in
order into allocations, 256-byte aligned, metadata key = tensor name, value =
JSON {dtype, shape, index, nbytes}), the same generated weights, the same
/infer computation and checksum, so a Python follower can take over from a C
loader and the other way round.
"""
import argparse
import json
import os
import signal
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np
import xxhash

import gpufailover as gf

TENSOR_ALIGN = 256
CHUNK_LIMIT = 256 << 20
META_FILE_KEY = "__metadata__"  # the weights file's __metadata__, as gf-c-engine stores it
META_VALUE_MAX = 1024  # the GMS's limit on one metadata value
# The dtypes gf-c-engine loads, so either engine can follow the other:
# safetensors name -> (numpy type or None where numpy has none, bytes per
# item). Tensors have 0 (a scalar) to MAX_DIMS dimensions.
DTYPES = {"F64": (np.float64, 8), "F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2),
          "F8_E4M3": (None, 1), "F8_E5M2": (None, 1), "F8_E8M0": (None, 1),
          "I64": (np.int64, 8), "I32": (np.int32, 4), "I16": (np.int16, 2), "I8": (np.int8, 1),
          "U64": (np.uint64, 8), "U32": (np.uint32, 4), "U16": (np.uint16, 2), "U8": (np.uint8, 1),
          "BOOL": (np.bool_, 1), "C64": (np.complex64, 8)}
MAX_DIMS = 16
M64 = (1 << 64) - 1


def log(event, **kv):
    """One line on stderr in the library's format (gf.log_event): the same
    clocks, levels and logfmt quoting as the daemons' lines."""
    gf.log_event("python-engine", event, **kv)


def splitmix_units(seed, count):
    """`count` floats uniform in [-1, 1), the sequence gf-c-engine's unit() draws."""
    i = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    top = (z >> np.uint64(40)).astype(np.int64) - (1 << 23)
    return top.astype(np.float32) / np.float32(1 << 23)


def generate_weights(layers=4, dim=256):
    """The deterministic weights gf-c-engine generates: [(name, dtype, shape, bytes)]."""
    per_layer = dim * dim + dim
    scale = np.float32(1.5) / np.sqrt(np.float32(dim))
    w = splitmix_units(0x5EED0F9A11011E5, per_layer * layers) * scale
    out = []
    for layer in range(layers):
        base = w[layer * per_layer:(layer + 1) * per_layer]
        out.append((f"layers.{layer}.weight", "F32", [dim, dim], base[:dim * dim].tobytes()))
        out.append((f"layers.{layer}.bias", "F32", [dim], base[dim * dim:].tobytes()))
    return out


def read_safetensors(path):
    """Tensors of a safetensors file in data order, [(name, dtype, shape, bytes)],
    and its __metadata__ (dict or None). The library's reader validates the
    file, the same one gf-c-engine uses."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        base, metadata, entries = gf.safetensors_header(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    body = memoryview(data)
    return [(name, dtype, list(shape), bytes(body[base + begin:base + end]))
            for name, dtype, shape, begin, end in entries], metadata


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, data in tensors:
            f.write(data)


def align(v):
    return (v + TENSOR_ALIGN - 1) & ~(TENSOR_ALIGN - 1)


def load_into(gms, tensors, file_metadata=None):
    """Pack tensors in order into as few allocations as fit, metadata as gf-c-engine writes it
    (the file's __metadata__ under META_FILE_KEY on the first allocation)."""
    first_alloc = None
    i = 0
    chunk = 0
    while i < len(tensors):
        size, j, last_off = 0, i, 0
        while j < len(tensors):
            off = align(size)
            if j > i and off + len(tensors[j][3]) > CHUNK_LIMIT:
                break
            last_off, size, j = off, off + len(tensors[j][3]), j + 1
        size = max(size, last_off + 1)
        aid = gms.allocate(size, f"weights.{chunk}")
        if first_alloc is None:
            first_alloc = aid
        off = 0
        with memoryview(gms.buffer(alloc_id=aid)) as mv:
            for k in range(i, j):
                name, dtype, shape, data = tensors[k]
                off = align(off)
                mv[off:off + len(data)] = data
                value = json.dumps({"dtype": dtype, "shape": shape, "index": k, "nbytes": len(data)},
                                   separators=(",", ":")).encode()
                gms.put_meta(name, aid, off, value)
                off += len(data)
        chunk += 1
        i = j
    if file_metadata is not None:
        value = json.dumps(file_metadata, separators=(",", ":"), sort_keys=True).encode()
        if len(value) > META_VALUE_MAX:
            log("metadata_skipped", bytes=len(value))
        else:
            if first_alloc is None:
                # No tensors: one small allocation carries it (GMS metadata is attached to one).
                first_alloc = gms.allocate(1, "metadata")
            gms.put_meta(META_FILE_KEY, first_alloc, 0, value)
    generation = gms.commit()
    log("weights_loaded", tensors=len(tensors), allocations=chunk, generation=generation)


class Model:
    """numpy views over the mapped weights, in tensor order. Holds buffer
    exports: drop it before the engine sleeps."""

    def __init__(self, gms):
        table = []
        for key, meta in gms.metadata.items():
            if key == META_FILE_KEY:
                continue
            v = json.loads(meta["value"])
            table.append((v["index"], key, v["dtype"], v["shape"], v["nbytes"]))
        table.sort()
        self.tensors = []
        for _, key, dtype, shape, nbytes in table:
            np_dtype = DTYPES.get(dtype, (None, 0))[0]
            if dtype == "F32" and nbytes:
                arr = np.asarray(gms.buffer(key, dtype="float32", shape=shape))
            else:
                arr = None  # carried, not computed with
            self.tensors.append((dtype, shape, arr))

    def infer(self, seed):
        length = 8
        for dtype, shape, arr in self.tensors:
            if dtype == "F32" and len(shape) == 2 and shape[1] > 0:
                length = shape[1]
                break
        x = splitmix_units((seed ^ 0x1F0E5EED) & M64, length)
        for i, (dtype, shape, w) in enumerate(self.tensors):
            if w is None or len(shape) != 2 or shape[1] != length or shape[0] == 0:
                continue
            rows = shape[0]
            acc = w.astype(np.float64) @ x.astype(np.float64)
            if i + 1 < len(self.tensors):
                bd, bs, b = self.tensors[i + 1]
                if b is not None and bd == "F32" and len(bs) == 1 and bs[0] == rows:
                    acc = b.astype(np.float64) + acc
            x = np.tanh(acc).astype(np.float32)
            length = rows
        return x


def parse_bytes(text):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    num = text.rstrip("KMG")
    if not num.isdigit() or text[len(num):] not in units:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 16M)")
    return int(num) * units[text[len(num):]]


# gfctl switchover: stepped down, drained, lock released (GF_ENGINE_EXIT_SWITCHOVER).
EXIT_SWITCHOVER = 75


def http_server(eng, port, listener, handler):
    """The inference HTTP server: on the lock's listener when one is named
    (connections that arrived during the failover wait in its backlog and are
    served now; only the holder has it, so a standby never accepts), else on
    127.0.0.1:port."""
    if not listener:
        return ThreadingHTTPServer(("127.0.0.1", port), handler)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = eng.listener(listener)
    server.server_address = server.socket.getsockname()
    return server


def parse_duration(text):
    try:
        return gf.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None):
    p = argparse.ArgumentParser(description="A small inference engine in Python that fails over through libgpufailover.")
    p.add_argument("--lock", help="lock server URI")
    p.add_argument("--gms", action="append", default=[], help="GMS URI of the next device (repeatable)")
    p.add_argument("--role", choices=["loader", "follower"], default="loader")
    p.add_argument("--id", default=f"python-engine-{os.getpid()}")
    p.add_argument("--weights", help="safetensors file (loader); default: generated weights")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--listener", metavar="NAME",
                   help="serve from the listening socket the lock carries under NAME (gf-lockd --listener "
                        "NAME=URI) instead of --port: no connection is refused during a failover")
    p.add_argument("--probe-port", type=int, default=8081)
    p.add_argument("--probe-address", default="0.0.0.0")
    p.add_argument("--backend", choices=["auto", "host", "cuda"], default="host")
    p.add_argument("--waking-timeout", type=parse_duration, default=120.0)
    p.add_argument("--remap-timeout", type=parse_duration, default=30.0)
    p.add_argument("--init-timeout", type=parse_duration, default=None,
                   help="how long Init waits for each GMS (default: loader forever, follower 30m)")
    p.add_argument("--kv-bytes", type=parse_bytes, default=16 << 20)
    p.add_argument("--write-weights", metavar="FILE", help="write the generated weights and exit")
    p.add_argument("--version", action="version", version=f"python-engine (libgpufailover) {gf.__version__}")
    a = p.parse_args(argv)
    if a.write_weights:
        write_safetensors(a.write_weights, generate_weights())
        return 0
    if not a.lock or not a.gms:
        p.error("--lock and at least one --gms are required")
    if not (0 <= a.port <= 65535):
        p.error("--port must be 0..65535")
    try:
        tensors, file_metadata = read_safetensors(a.weights) if a.weights else (generate_weights(), None)
    except (OSError, ValueError) as e:
        log("load_failed", msg=json.dumps(str(e)))
        return 1

    # Until it serves, a signal simply ends the engine (a standby has nothing
    # to clean up, and Ctrl-C interrupts the blocking acquire()).
    stop = threading.Event()
    stepping_down = threading.Event()
    # Requests being served, for the drain of a planned switchover.
    inflight = [0]
    idle = threading.Condition()

    eng = gf.Engine(a.lock, a.id, a.gms, role=a.role, backend=a.backend, waking_timeout=a.waking_timeout,
                    remap_timeout=a.remap_timeout, private_bytes=a.kv_bytes,
                    probe_port=a.probe_port, probe_address=a.probe_address,
                    # omitted: the library's default for the role (a follower 30 min, a loader forever)
                    **({} if a.init_timeout is None else {"init_timeout": a.init_timeout}))
    state = {"model": None}
    try:
        eng.init_weights(load=lambda device, gms: load_into(gms, tensors, file_metadata))
        # Check the weights once while mapped, then let go of the views.
        Model(eng.gms(0))
        eng.sleep()
        epoch = eng.acquire()
        eng.wake_up()
        state["model"] = Model(eng.gms(0))

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def finish(self):
                try:
                    super().finish()
                finally:
                    with idle:
                        inflight[0] -= 1
                        idle.notify_all()

            def do_GET(self):
                url = urlparse(self.path)
                if url.path != "/infer":
                    return self.reply(404, {"error": "not found; use /infer?seed=N"})
                q = parse_qs(url.query).get("seed", ["0"])[0]
                if not q.isdigit():
                    return self.reply(400, {"error": "seed must be a non-negative integer"})
                out = state["model"].infer(int(q))
                self.reply(200, {"result": [float(v) for v in out[:8]],
                                 "checksum": xxhash.xxh64(out.tobytes(), seed=0).hexdigest(),
                                 "epoch": eng.epoch, "engine": a.id, "seed": int(q), "dim": int(out.size)})

            do_POST = do_GET

            def reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def serve_endpoint():
            server = http_server(eng, a.port, a.listener, Handler)
            accept = server.process_request

            def counted(request, client_address):
                # Counted in the accepting thread, so a drain never misses one.
                with idle:
                    inflight[0] += 1
                accept(request, client_address)

            server.process_request = counted
            state["server"] = server
            threading.Thread(target=server.serve_forever, daemon=True).start()
            log("endpoint_listening", port=server.server_address[1], epoch=epoch)

        def on_step_down():
            stepping_down.set()
            stop.set()

        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        eng.on_step_down = on_step_down
        eng.serve(serve=serve_endpoint)
        log("active", epoch=epoch, **{k: v for k, v in eng.metrics.items() if k.endswith("_us")})
        stop.wait()
        if stepping_down.is_set():
            # Planned switchover: stop accepting (the lock's listener keeps new
            # connections for the next holder), drain, release, exit 75.
            t0 = time.monotonic()
            state["server"].shutdown()
            with idle:
                idle.wait_for(lambda: inflight[0] == 0, timeout=30)
            eng.step_down()
            log("stepped_down", drain_ms=round((time.monotonic() - t0) * 1000, 1))
            log("exit", status=EXIT_SWITCHOVER)
            return EXIT_SWITCHOVER
        log("exit", status=0)
        return 0
    except gf.GpuFailoverError as e:
        log("step_failed", error=e.name, msg=json.dumps(str(e)))
        return 1
    finally:
        state["model"] = None


if __name__ == "__main__":
    sys.exit(main())
