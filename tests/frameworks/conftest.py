# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the framework tests: the real sidecars of the build tree (the
same Cluster as tests/python), and the installed torch and vllm packages."""
import importlib.util
import json
import os
import pathlib
import sys
import urllib.request

_spec = importlib.util.spec_from_file_location(
    "gf_python_conftest", pathlib.Path(__file__).resolve().parents[1] / "python" / "conftest.py")
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

BUILD, SOURCE, C_ENGINE, PY_ENGINE = _base.BUILD, _base.SOURCE, _base.C_ENGINE, _base.PY_ENGINE
TORCH_ENGINE = SOURCE / "examples" / "torch-engine" / "engine.py"
gf, wait_for, child_env = _base.gf, _base.wait_for, _base.child_env
cluster = _base.cluster


def load_torch_engine():
    """examples/torch-engine/engine.py as a module (its model code, in-process)."""
    spec = importlib.util.spec_from_file_location("gf_torch_engine", TORCH_ENGINE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)
from probe import engine_state  # noqa: E402,F401  (the tests import it from here)


def get(port, path, timeout=2.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return json.loads(r.read())


def start_engine(cluster, kind, name, role, *extra):
    port, probe = free_port(), free_port()
    exe = {"python": [sys.executable, PY_ENGINE], "torch": [sys.executable, TORCH_ENGINE], "c": [C_ENGINE]}[kind]
    p = cluster.spawn(name, exe + ["--lock", cluster.lock_uri, "--gms", cluster.gms_uri(), "--role", role,
                                   "--id", name, "--port", str(port), "--probe-port", str(probe),
                                   "--probe-address", "127.0.0.1", "--backend", "host", *extra])
    p.port, p.probe = port, probe
    return p
