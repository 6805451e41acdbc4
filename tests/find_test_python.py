# SPDX-License-Identifier: Apache-2.0
"""Print the interpreter the pytest suites should run with, for meson at
configure time: the first of $VIRTUAL_ENV, the .venv next to the source
(tests/setup.sh makes it) and python3 from PATH that can import pytest.

Output, one item a line: path, "major.minor", and "numpy" if it imports
numpy too (the Python binding suites need it). Nothing when none has pytest."""
import os
import shutil
import subprocess
import sys


def candidates(source):
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        yield os.path.join(venv, "bin", "python")
    yield os.path.join(source, ".venv", "bin", "python")
    found = shutil.which("python3")
    if found:
        yield found
    yield sys.executable


def probe(python):
    code = ("import sys, pytest\n"
            "try:\n    import numpy\n    np = 'numpy'\nexcept ImportError:\n    np = ''\n"
            "print('%d.%d' % sys.version_info[:2]); print(np)")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.split("\n")[:2] if out.returncode == 0 else None


def main():
    seen = set()
    for python in candidates(sys.argv[1] if len(sys.argv) > 1 else "."):
        if python in seen or not os.access(python, os.X_OK):
            continue
        seen.add(python)
        found = probe(python)
        if found:
            print(python)
            print(found[0])
            print(found[1])
            return


main()
