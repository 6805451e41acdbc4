# SPDX-License-Identifier: Apache-2.0
"""The stubs match the runtime (mypy's stubtest) and the documented examples
type-check under mypy --strict."""
import os
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


def test_stubtest(tmp_path):
    out = run(["mypy.stubtest", "gpufailover._gpufailover", "--allowlist",
               str(SOURCE / "tests" / "python" / "stubtest-allowlist.txt"), "--ignore-unused-allowlist"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def doc_snippets():
    text = (SOURCE / "docs" / "python.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


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
