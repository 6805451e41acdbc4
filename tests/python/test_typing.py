# SPDX-License-Identifier: Apache-2.0
"""The stubs match the runtime (mypy's stubtest) with and without the optional
packages, the package passes mypy --strict on the oldest and newest Python it
claims, and the documented examples type-check under mypy --strict."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import BUILD, SOURCE

pytest.importorskip("mypy", reason="mypy is installed by tests/setup.sh")

PKG_ROOT = BUILD / "bindings" / "python"

# Names the documentation's snippets leave to the reader.
PRELUDE = '''\
from typing import Any
import numpy
import gpufailover as gf

def load_into(gms: gf.GMSClient) -> None: ...
def start_http_server() -> None: ...
def load_model_weights() -> Any: ...
def describe(p: Any) -> bytes:
    return repr(p).encode()
# The fault-reporter snippet continues from the engine of an earlier one.
eng: gf.Engine
'''


def mypy_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PKG_ROOT)
    env["MYPYPATH"] = str(PKG_ROOT)
    return env


def run(args, tmp_path):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=tmp_path,
                          env=mypy_env(), timeout=600)


# The oldest and newest Python the package claims to run on (pyproject.toml
# requires-python >= 3.9, classifiers up to 3.13). mypy 2 no longer targets
# 3.9, so 3.10 is the oldest it can check.
OLDEST, NEWEST = "3.10", "3.13"
OPTIONAL = ("torch", "vllm")


def bare_python(tmp_path):
    """A throwaway venv with mypy and its dependencies but without the
    optional packages (torch, vLLM): links to the project venv's copies, so
    nothing is downloaded."""
    from importlib import metadata

    venv = tmp_path / "bare"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    lib = tmp_path / "bare-lib"
    lib.mkdir()
    site = pathlib.Path(metadata.distribution("mypy").locate_file(""))
    todo, seen = ["mypy"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another Python (a marker): a missing one fails mypy below

        assert dist.metadata["Name"].lower() not in OPTIONAL
        for f in dist.files or []:
            top = f.parts[0]
            if top != ".." and not (lib / top).exists():
                (lib / top).symlink_to(site / top)
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    for so in site.glob("*__mypyc*.so"):  # mypyc's shared runtime, owned by no distribution's top-level name
        if not (lib / so.name).exists():
            (lib / so.name).symlink_to(so)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    pathlib.Path(purelib, "mypy-only.pth").write_text(str(lib) + "\n")
    python = str(venv / "bin" / "python")
    for name in OPTIONAL:
        found = subprocess.run([python, "-c", f"import importlib.util as u; print(u.find_spec({name!r}) is None)"],
                               capture_output=True, text=True, env=mypy_env())
        assert found.stdout.strip() == "True", f"{name} is visible in the bare venv"
    return python


@pytest.fixture(params=["with-optional", "without-optional"])
def python(request, tmp_path):
    if request.param == "with-optional":
        return sys.executable
    return bare_python(tmp_path)


def test_stubtest(python, tmp_path):
    """The stubs and the package's annotations match the runtime, whether or
    not torch and vLLM are installed; no allowlist."""
    out = subprocess.run([python, "-m", "mypy.stubtest", "gpufailover"], capture_output=True, text=True,
                         cwd=tmp_path, env=mypy_env(), timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_package(python, tmp_path):
    """mypy --strict -p gpufailover is clean: on the newest Python with the
    optional packages, on the oldest without them."""
    version = NEWEST if python == sys.executable else OLDEST
    out = subprocess.run([python, "-m", "mypy", "--strict", "--python-version", version, "--no-incremental",
                          "--cache-dir", str(tmp_path / "cache"), "-p", "gpufailover"],
                         capture_output=True, text=True, cwd=tmp_path, env=mypy_env(), timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr


def doc_snippets():
    text = (SOURCE / "docs" / "python.md").read_text()
    # Run or not (``` python excerpt, tests/docs/test_code_blocks.py), every one type-checks.
    return re.findall(r"```python(?: excerpt)?\n(.*?)```", text, flags=re.S)


def test_documented_examples_pass_mypy_strict(tmp_path):
    snippets = doc_snippets()
    assert len(snippets) >= 2
    # Each snippet in its own function so their names do not collide.
    body = PRELUDE
    for i, snippet in enumerate(snippets):
        body += f"\n\ndef example_{i}() -> None:\n" + "".join(f"    {line}\n" for line in snippet.splitlines())
    path = tmp_path / "doc_examples.py"
    path.write_text(body)
    # torch does not install here: its import is Any, everything else is checked.
    out = run(["mypy", "--strict", "--ignore-missing-imports", "--no-incremental",
               "--cache-dir", str(tmp_path / "cache"), str(path)], tmp_path)
    assert out.returncode == 0, body + out.stdout + out.stderr


def test_mypy_strict_rejects_a_wrong_call(tmp_path):
    """The check above can fail: a keyword for a positional-only parameter,
    which raises at run time, is a type error."""
    path = tmp_path / "wrong.py"
    path.write_text("import gpufailover as gf\ngf.parse_duration(text='2m')\n")
    out = run(["mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(path)], tmp_path)
    assert out.returncode != 0 and "parse_duration" in out.stdout, out.stdout
    with pytest.raises(TypeError):
        sys.path.insert(0, str(PKG_ROOT))
        import gpufailover as gf
        gf.parse_duration(text="2m")  # type: ignore[call-arg]
