# SPDX-License-Identifier: Apache-2.0
"""The library's safetensors reader against the reference `safetensors` package.

Files written by the package in every dtype it writes (scalars, zero-size
tensors, metadata) parse to exactly what the package reads back; crafted edge
cases are accepted or refused by both readers alike, except the two documented
places where the library is stricter; and a reference-written file loads into
the real gf-c-engine with its bytes and its __metadata__ in the GMS.
"""
import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import pytest

safetensors_rust = pytest.importorskip("safetensors._safetensors_rust")
gf = pytest.importorskip("gpufailover")

LOCKD = os.environ.get("GF_LOCKD")
GMSD = os.environ.get("GF_GMSD")
ENGINE = os.environ.get("GF_C_ENGINE")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from timing import scaled  # noqa: E402

HANG_GUARD = scaled(20.0)  # seconds: a bound against hangs, never a speed claim (GF_TEST_TIMEOUT_SCALE)

# The package's dtype names (framework spelling) and what the file says.
DTYPES = {
    "bool": ("BOOL", 8), "int8": ("I8", 8), "uint8": ("U8", 8), "int16": ("I16", 16),
    "uint16": ("U16", 16), "int32": ("I32", 32), "uint32": ("U32", 32), "int64": ("I64", 64),
    "uint64": ("U64", 64), "float16": ("F16", 16), "float32": ("F32", 32), "float64": ("F64", 64),
    "bfloat16": ("BF16", 16), "float8_e4m3fn": ("F8_E4M3", 8), "float8_e4m3fnuz": ("F8_E4M3FNUZ", 8),
    "float8_e5m2": ("F8_E5M2", 8), "float8_e5m2fnuz": ("F8_E5M2FNUZ", 8), "float8_e8m0fnu": ("F8_E8M0", 8),
    "float4_e2m1fn_x2": ("F4", 4), "complex64": ("C64", 64),
}
SHAPES = [[], [0], [3, 0, 2], [4], [2, 3, 4]]


def reference_file(tensors, metadata=None):
    """Serialize with the reference: tensors = {name: (framework dtype, shape, bytes)}."""
    keep, specs = [], {}
    for name, (dtype, shape, data) in tensors.items():
        buf = ctypes.create_string_buffer(data, len(data) or 1)
        keep.append(buf)
        # The package takes the storage shape for packed F4 (two values a byte).
        storage = list(shape[:-1]) + [shape[-1] // 2] if dtype == "float4_e2m1fn_x2" and shape else shape
        specs[name] = safetensors_rust.TensorSpec(dtype=dtype, shape=storage, data_ptr=ctypes.addressof(buf),
                                                  data_len=len(data))
    return bytes(safetensors_rust.serialize(specs, metadata))


def nbytes(shape, bits):
    count = 1
    for d in shape:
        count *= d
    return count * bits // 8


def reference_view(blob):
    """What the reference reads back: {name: (dtype, shape, bytes)}, metadata."""
    (hlen,) = struct.unpack("<Q", blob[:8])
    metadata = json.loads(blob[8:8 + hlen]).get("__metadata__")
    return {name: (t["dtype"], list(t["shape"]), bytes(t["data"]))
            for name, t in safetensors_rust.deserialize(blob)}, metadata


def ours(blob):
    base, metadata, entries = gf.safetensors_header(blob)
    return {name: (dtype, list(shape), blob[base + b:base + e]) for name, dtype, shape, b, e in entries}, metadata


def test_every_dtype_and_shape_written_by_the_reference():
    tensors = {}
    for i, (dtype, (_, bits)) in enumerate(DTYPES.items()):
        for j, shape in enumerate(SHAPES):
            if bits == 4 and shape and shape[-1] % 2:
                continue
            if bits == 4 and not shape:
                continue  # one F4 value is half a byte: not a file
            n = nbytes(shape, bits)
            tensors[f"t{i}.{j}"] = (dtype, shape, bytes((i * 31 + j * 7 + k) & 0xFF for k in range(n)))
    meta = {"format": "pt", "note": "written by the reference"}
    blob = reference_file(tensors, meta)
    ref, ref_meta = reference_view(blob)
    got, got_meta = ours(blob)
    assert got_meta == ref_meta == meta
    assert set(got) == set(ref) == set(tensors)
    for name, (dtype, shape, data) in ref.items():
        assert got[name] == (dtype, shape, data), name
    # The C reader reports data order: offsets strictly tile the data area.
    base, _, entries = gf.safetensors_header(blob)
    at = 0
    for _, _, _, b, e in entries:
        assert b == at
        at = e
    assert base + at == len(blob)


def image(header, data=b""):
    text = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(text)) + text + data


F32x1 = '{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}'
EDGE_CASES = {
    "empty": image("{}"),
    "padded": image('{"a":%s}   ' % (F32x1 % (0, 4)), b"\0" * 4),
    "leading space": image(' {"a":%s}' % (F32x1 % (0, 4)), b"\0" * 4),
    "extra key ignored": image('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":[1]}}', b"\0"),
    "null metadata": image('{"__metadata__":null}'),
    "metadata only": image('{"__metadata__":{"k":"v"}}'),
    "hole": image('{"a":%s}' % (F32x1 % (4, 8)), b"\0" * 8),
    "uncovered tail": image('{"a":%s}' % (F32x1 % (0, 4)), b"\0" * 8),
    "short data": image('{"a":%s}' % (F32x1 % (0, 4)), b"\0" * 2),
    "plain overlap": image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":%s}' % (F32x1 % (4, 8)),
                           b"\0" * 8),
    "overlap behind a zero-size tensor": image(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},"b":%s}' % (F32x1 % (4, 8)), b"\0" * 8),
    "zero-size tensors at one offset": image(
        '{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"I8","shape":[2,0],'
        '"data_offsets":[0,0]},"c":%s}' % (F32x1 % (0, 4)), b"\0" * 4),
    "size mismatch": image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', b"\0" * 4),
    "begin after end": image('{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}', b"\0" * 4),
    "unknown dtype": image('{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}', b"\0" * 16),
    "F4 half byte": image('{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', b"\0" * 2),
    "F6 whole bytes": image('{"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}', b"\0" * 3),
    "integer metadata": image('{"__metadata__":{"k":1}}'),
    "list metadata": image('{"__metadata__":["k"]}'),
    "negative shape": image('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', b"\0" * 4),
    "float shape": image('{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', b"\0" * 4),
    "missing offsets": image('{"a":{"dtype":"F32","shape":[1]}}', b"\0" * 4),
    "three offsets": image('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}', b"\0" * 4),
    "not an object": image("[1,2]"),
    "trailing garbage": image('{"a":%s}x' % (F32x1 % (0, 4)), b"\0" * 4),
    "NUL padding": image("{}\0\0"),
    "bad UTF-8": image(b'{"\xff":' + (F32x1 % (0, 4)).encode() + b"}", b"\0" * 4),
    "header past the end": struct.pack("<Q", 64) + b"{}",
    "no length": b"\x02\0\0",
}
# Where the library is stricter than the reference (documented in docs/engine.md).
STRICTER = {
    "duplicate key": image('{"a":%s,"a":%s}' % (F32x1 % (0, 4), F32x1 % (0, 4)), b"\0" * 4),
    "empty name": image('{"":%s}' % (F32x1 % (0, 4)), b"\0" * 4),
}


def reference_accepts(blob):
    try:
        safetensors_rust.deserialize(blob)
        return True
    except Exception:  # the package raises SafetensorError and friends
        return False


def we_accept(blob):
    try:
        gf.safetensors_header(blob)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_cases_agree_with_the_reference(name):
    blob = EDGE_CASES[name]
    assert we_accept(blob) == reference_accepts(blob), name


@pytest.mark.parametrize("name", sorted(STRICTER))
def test_stricter_than_the_reference(name):
    blob = STRICTER[name]
    assert reference_accepts(blob)
    with pytest.raises(ValueError, match="duplicate|empty name"):
        gf.safetensors_header(blob)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match='"b" starts at 4: it overlaps'):
        gf.safetensors_header(EDGE_CASES["overlap behind a zero-size tensor"])
    with pytest.raises(ValueError, match="hole of 4 bytes"):
        gf.safetensors_header(EDGE_CASES["hole"])
    with pytest.raises(ValueError, match='value of "k" is not a string'):
        gf.safetensors_header(EDGE_CASES["integer metadata"])
    with pytest.raises(TypeError):
        gf.safetensors_header("text is not bytes")


def wait_log(path, needle, proc):
    end = time.monotonic() + HANG_GUARD
    while time.monotonic() < end:
        with open(path, "rb") as f:
            text = f.read().decode(errors="replace")
        if needle in text:
            return text
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no {needle!r} in {path}:\n{text}")


@pytest.mark.skipif(not (LOCKD and GMSD and ENGINE), reason="GF_LOCKD, GF_GMSD and GF_C_ENGINE must be set")
@pytest.mark.parametrize("with_tensors", [True, False], ids=["tensors", "metadata-only"])
def test_c_engine_loads_a_reference_file_with_its_metadata(with_tensors):
    """The file's tensors and its __metadata__ reach the GMS; a file with
    metadata and no tensors still brings its metadata (on one small
    allocation)."""
    tmp = tempfile.mkdtemp(prefix="gf-st-ref-")
    tensors = {"layers.0.weight": ("float32", [4, 4], bytes(range(64))),
               "scale": ("bfloat16", [], b"\x80\x3f"),
               "empty": ("float16", [0, 8], b""),
               "q": ("float8_e4m3fnuz", [5], b"\x01\x02\x03\x04\x05"),
               "packed": ("float4_e2m1fn_x2", [2, 4], b"\x12\x34\x56\x78")}
    meta = {"format": "pt", "source": "reference"}
    if not with_tensors:
        tensors = {}
    path = os.path.join(tmp, "w.safetensors")
    with open(path, "wb") as f:
        f.write(reference_file(tensors, meta))
    lock_uri, gms_uri = f"unix://{tmp}/lock.sock", f"unix://{tmp}/gms0.sock"
    procs = []

    def start(name, argv):
        log = os.path.join(tmp, name + ".log")
        p = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        procs.append(p)
        return p, log

    try:
        p, log = start("lockd", [LOCKD, "--listen", lock_uri, "--state-file", f"{tmp}/lock.state"])
        wait_log(log, "ready", p)
        p, log = start("gmsd", [GMSD, "--listen", gms_uri, "--backend", "host"])
        wait_log(log, "ready", p)
        p, log = start("engine", [ENGINE, "--lock", lock_uri, "--gms", gms_uri, "--weights", path,
                                  "--port", "0", "--probe-port", "-1", "--kv-bytes", "1M"])
        wait_log(log, "event=weights_ready", p)
        mem = gf.Memory("host")
        gms = gf.GMSClient(gms_uri, mem, "ro", timeout=HANG_GUARD)
        try:
            gms.map_all()
            md = gms.metadata
            assert json.loads(md["__metadata__"]["value"]) == meta
            for name, (dtype, shape, data) in tensors.items():
                v = json.loads(md[name]["value"])
                assert v["dtype"] == DTYPES[dtype][0]
                assert v["shape"] == shape
                assert v["nbytes"] == len(data)
            if with_tensors:
                got = bytes(memoryview(gms.buffer("layers.0.weight")).cast("B")[:64])
                assert got == tensors["layers.0.weight"][2]
            else:
                assert set(md) == {"__metadata__"}
        finally:
            gms.close()
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=HANG_GUARD)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
