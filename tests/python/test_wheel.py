# SPDX-License-Identifier: Apache-2.0
"""The wheel: build it from the repository, repair it into a manylinux wheel
that carries its shared libraries (auditwheel), install it into a fresh
virtual environment, import it and run a smoke test there; its license
metadata and COPYING travel with it. And `pip install .` as README says it,
with the suites' interpreter (the project's .venv, torch and vLLM installed
in it by tests/setup-frameworks.sh)."""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import venv
import zipfile

import pytest

from conftest import BUILD, SOURCE

SOURCE_BUILD_PKG = BUILD / "bindings" / "python"

# What a Linux system always has (the manylinux policy's libraries, which
# auditwheel leaves out; libz comes in with libcurl, the etcd lock's HTTP
# client); anything else the extension needs must come from inside the wheel.
SYSTEM_LIBS = re.compile(r"^(linux-vdso|ld-linux[-\w]*|libc|libm|libdl|libpthread|librt|libresolv|libz|libgcc_s)\.so")
NOT_REQUIRED = ("libjansson.so", "libmicrohttpd.so", "libcrypto.so", "libgnutls.so")


def readme_env():
    """The environment of someone who activated the venv: no PYTHONPATH from the test run."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["VIRTUAL_ENV"] = sys.prefix
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


@pytest.mark.skipif(os.environ.get("GF_SKIP_WHEEL") == "1", reason="GF_SKIP_WHEEL=1")
def test_pip_install_in_the_projects_venv(tmp_path):
    # pip's isolated build (the default) runs meson, and meson runs the nanopb
    # generator, under a sitecustomize that hides this venv's site-packages;
    # a .pth file there that inserts into sys.path (vLLM's dependencies have
    # one) used to take the system's protobuf with it. --target keeps the
    # shared venv as it is; the build is the one `pip install .` does.
    target = tmp_path / "target"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        "--target", str(target), str(SOURCE)], cwd=tmp_path, env=readme_env(),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = subprocess.run([sys.executable, "-c", "import gpufailover as gf; print(gf.__file__, gf.parse_duration('2m'))"],
                         cwd=tmp_path, env=dict(readme_env(), PYTHONPATH=str(target)),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    path, value = out.stdout.split()
    assert pathlib.Path(path).is_relative_to(target) and value == "120.0"


def build_and_repair(tmp_path):
    dist = tmp_path / "dist"
    # docs/python.md's recipe, as written (an isolated build, like `pip install .`).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(dist), str(SOURCE)], check=True, cwd=tmp_path, env=readme_env())
    wheels = list(dist.glob("gpufailover-*.whl"))
    assert len(wheels) == 1
    fixed = tmp_path / "fixed"
    subprocess.run([sys.executable, "-m", "auditwheel", "repair", "-w", str(fixed), str(wheels[0])],
                   check=True, cwd=tmp_path, capture_output=True)
    repaired = list(fixed.glob("gpufailover-*.whl"))
    assert len(repaired) == 1
    return wheels[0], repaired[0]


@pytest.mark.skipif(os.environ.get("GF_SKIP_WHEEL") == "1", reason="GF_SKIP_WHEEL=1")
def test_wheel_builds_installs_and_imports(tmp_path):
    pytest.importorskip("auditwheel", reason="auditwheel is installed by tests/setup.sh")
    plain, wheel = build_and_repair(tmp_path)
    assert re.search(r"-manylinux_2_\d+_x86_64\.whl$", wheel.name), wheel.name

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read("gpufailover-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta
    assert "License-File: COPYING" in meta
    copying = [n for n in names if n.endswith(".dist-info/licenses/COPYING")]
    assert copying
    with zipfile.ZipFile(wheel) as z:
        assert z.read(copying[0]) == (SOURCE / "COPYING").read_bytes()

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    smoke = (
        "import gpufailover as gf, pathlib;"
        "assert gf.parse_duration('2m') == 120.0;"
        "m = gf.Memory('host'); assert m.backend == 'host';"
        "pkg = pathlib.Path(gf.__file__).parent;"
        "assert (pkg / 'py.typed').exists() and (pkg / '_gpufailover.pyi').exists();"
        "print('ok', gf._gpufailover.__file__)"
    )
    # Run outside the source tree, with a bare environment, so the installed
    # package and nothing from the build is what gets imported.
    out = subprocess.run([py, "-c", smoke], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": os.environ["PATH"]})
    assert out.stdout.startswith("ok ")
    ext = pathlib.Path(out.stdout.split()[1])
    libs = ext.parent.parent / "gpufailover.libs"

    # The extension names none of the system's jansson, microhttpd, crypto.
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                        subprocess.run(["readelf", "-d", str(ext)], check=True, capture_output=True,
                                       text=True).stdout)
    assert needed
    assert not [n for n in needed if n.startswith(NOT_REQUIRED)], needed
    # Every library it loads, directly or through the bundled ones, resolves
    # inside the wheel or to the C library itself: the import works where
    # libjansson, libmicrohttpd and libcrypto are not installed.
    ldd = subprocess.run(["ldd", str(ext)], check=True, capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"]}).stdout
    for line in ldd.splitlines():
        name = os.path.basename(line.split()[0])
        if SYSTEM_LIBS.match(name):
            continue
        m = re.search(r"=> (\S+)", line)
        assert m and pathlib.Path(os.path.realpath(m.group(1))).parent == libs.resolve(), line
    assert any(p.name.startswith("libjansson") for p in libs.iterdir())

    # Where namespaces are allowed, hide the system's copies (bind /dev/null
    # over them) and import for real: the installed wheel works, the build
    # tree's extension (linked against the system's libraries) does not.
    hide = sorted({os.path.realpath(f"/usr/lib/x86_64-linux-gnu/{n}")
                   for n in ("libjansson.so.4", "libmicrohttpd.so.12", "libcrypto.so.3")
                   if os.path.exists(f"/usr/lib/x86_64-linux-gnu/{n}")})
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if hide and probe.returncode == 0:
        mounts = " && ".join(f"mount --bind /dev/null {h}" for h in hide)
        bare = {"PATH": os.environ["PATH"]}
        ok = subprocess.run(["unshare", "-rm", "sh", "-c", f'{mounts} && exec "$0" -c "$1"', str(py),
                             "import gpufailover as gf; print(gf.parse_duration('1s'))"],
                            capture_output=True, text=True, cwd=tmp_path, env=bare)
        assert ok.returncode == 0 and ok.stdout.strip() == "1.0", ok.stderr
        tree = subprocess.run(["unshare", "-rm", "sh", "-c", f'{mounts} && exec "$0" -c "$1"', sys.executable,
                               "import gpufailover"], capture_output=True, text=True, cwd=tmp_path,
                              env=dict(bare, PYTHONPATH=str(SOURCE_BUILD_PKG)))
        assert tree.returncode != 0 and "ImportError" in tree.stderr, tree.stderr

    # The plain wheel, before repair, is what needed the system's libraries.
    with zipfile.ZipFile(plain) as z:
        assert not [n for n in z.namelist() if n.startswith("gpufailover.libs/")]
    shutil.rmtree(env_dir)
