# SPDX-License-Identifier: Apache-2.0
"""The wheel: build it from the repository, install it into a fresh virtual
environment, import it and run a smoke test there."""
import os
import pathlib
import subprocess
import sys
import venv

import pytest

from conftest import SOURCE


@pytest.mark.skipif(os.environ.get("GF_SKIP_WHEEL") == "1", reason="GF_SKIP_WHEEL=1")
def test_wheel_builds_installs_and_imports(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist), str(SOURCE)], check=True, cwd=tmp_path)
    wheels = list(dist.glob("gpufailover-*.whl"))
    assert len(wheels) == 1
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheels[0])], check=True)
    smoke = (
        "import gpufailover as gf, pathlib;"
        "assert gf.parse_duration('2m') == 120.0;"
        "m = gf.Memory('host'); assert m.backend == 'host';"
        "pkg = pathlib.Path(gf.__file__).parent;"
        "assert (pkg / 'py.typed').exists() and (pkg / '_gpufailover.pyi').exists();"
        "print('ok', gf.__version__)"
    )
    # Run outside the source tree so the installed package is the one imported.
    out = subprocess.run([py, "-c", smoke], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": os.environ["PATH"]})
    assert out.stdout.startswith("ok ")
