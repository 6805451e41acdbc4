# SPDX-License-Identifier: Apache-2.0
"""The installed tree as a user gets it: `meson install --destdir`, then an
out-of-tree C program compiled and linked with nothing but pkg-config, against
the shared library and (`pkg-config --static ... libgpufailover-static`, as
README says) the static one; the installed programs run from the tree with
no LD_LIBRARY_PATH (their RUNPATH finds the library); libsystemd stays with
the daemons; the files the docs and manifests use are installed."""
import os
import shlex
import shutil
import subprocess
import tempfile

import pytest

MESON = os.environ.get("GF_MESON")
BUILD = os.environ.get("GF_BUILD_ROOT")
SOURCE = os.environ.get("GF_SOURCE_ROOT")
CC = os.environ.get("GF_CC", "cc")
PREFIX = os.environ.get("GF_PREFIX", "/usr/local")
LIBDIR = os.environ.get("GF_LIBDIR", "lib")
BINDIR = os.environ.get("GF_BINDIR", "bin")
TIMEOUT = 300  # seconds: a bound against hangs, never a speed claim

pytestmark = pytest.mark.skipif(not (MESON and BUILD and SOURCE), reason="run by meson (GF_MESON, GF_BUILD_ROOT)")


@pytest.fixture(scope="module")
def root():
    if not shutil.which("pkg-config"):
        pytest.skip("pkg-config not installed (tests/setup.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="gf-install-")
    dest = os.path.join(tmp, "root")
    r = subprocess.run([MESON, "install", "-C", BUILD, "--no-rebuild", "--destdir", dest],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    yield tmp, dest
    shutil.rmtree(tmp, ignore_errors=True)


def in_root(dest, *parts):
    return os.path.join(dest + PREFIX, *parts)


def pkg_config(dest, *args, package="libgpufailover"):
    env = dict(os.environ, PKG_CONFIG_SYSROOT_DIR=dest, PKG_CONFIG_PATH=in_root(dest, LIBDIR, "pkgconfig"))
    r = subprocess.run(["pkg-config", *args, package], capture_output=True, text=True, env=env,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return shlex.split(r.stdout)


def build_and_run(tmp, dest, name, flags):
    exe = os.path.join(tmp, name)
    src = os.path.join(SOURCE, "tests", "install", "consumer.c")
    r = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", src, "-o", exe, *flags], capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0, " ".join(flags) + "\n" + r.stderr
    env = dict(os.environ, LD_LIBRARY_PATH=in_root(dest, LIBDIR))
    r = subprocess.run([exe, os.path.join(tmp, "no-server.sock")], capture_output=True, text=True, env=env,
                       timeout=TIMEOUT)
    assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr
    return exe


def needed(path):
    r = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, timeout=TIMEOUT)
    return [l.split("[")[1].rstrip("]") for l in r.stdout.splitlines() if "(NEEDED)" in l]


def test_shared_consumer_with_pkg_config(root):
    tmp, dest = root
    flags = pkg_config(dest, "--cflags", "--libs")
    assert f"-I{in_root(dest, 'include')}" in flags
    exe = build_and_run(tmp, dest, "consumer-shared", flags)
    assert any(n.startswith("libgpufailover.so") for n in needed(exe))


def test_static_consumer_with_pkg_config_static(root):
    tmp, dest = root
    flags = pkg_config(dest, "--cflags", "--libs", "--static", package="libgpufailover-static")
    assert "-lsystemd" not in flags  # only the daemons use it; Debian has no static libsystemd
    assert flags.count("-lprotobuf-nanopb") == 1 and "-l:libgpufailover.a" in flags
    assert "-lgpufailover" not in flags  # with the .so next to the .a, the linker would take the .so
    exe = build_and_run(tmp, dest, "consumer-static", flags)
    assert not any(n.startswith("libgpufailover") for n in needed(exe))


PROGRAMS = ("gf-lockd", "gf-gmsd", "gf-supervise", "gfctl", "gf-c-engine")


def test_installed_programs_find_the_library_from_their_prefix(root):
    _, dest = root
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    for prog in PROGRAMS:
        path = in_root(dest, BINDIR, prog)
        r = subprocess.run([path, "--version"], capture_output=True, text=True, env=env, timeout=TIMEOUT)
        # 127: libgpufailover.so.0 not found (the destdir tree is where no ld.so looks).
        assert r.returncode == 0 and "0.1.0" in r.stdout + r.stderr, f"{prog}: {r.returncode} {r.stderr}"
        out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, timeout=TIMEOUT).stdout
        assert "(RUNPATH)" in out and "[$ORIGIN/" in out, prog


def test_libsystemd_only_in_the_daemons(root):
    _, dest = root
    lib = in_root(dest, LIBDIR, "libgpufailover.so")
    assert not any("libsystemd" in n for n in needed(lib))
    if shutil.which("pkg-config") and subprocess.run(["pkg-config", "--exists", "libsystemd"]).returncode == 0:
        for daemon in ("gf-lockd", "gf-gmsd"):
            assert any("libsystemd" in n for n in needed(in_root(dest, BINDIR, daemon))), daemon


def test_files_the_docs_and_manifests_use_are_installed(root):
    _, dest = root
    entry = in_root(dest, BINDIR, "gmsd-entrypoint.sh")  # the manifest runs it by name
    assert os.access(entry, os.X_OK)
    assert os.path.isfile(in_root(dest, "share", "doc", "libgpufailover", "COPYING"))
    assert os.path.isfile(in_root(dest, "share", "doc", "libgpufailover", "supervisor.md"))
    for unit in ("gf-lockd.service", "gf-gmsd@.service", "gf-supervise.service"):
        text = open(in_root(dest, "lib", "systemd", "system", unit)).read()
        assert f"ExecStart={PREFIX}/{BINDIR}/" in text
    for header in ("gpufailover.h", "gpufailover/safetensors.h", "gpufailover/lock.h"):
        assert os.path.isfile(in_root(dest, "include", header)), header
