# SPDX-License-Identifier: Apache-2.0
"""The systemd units shipped in examples/systemd, as installed (bindir filled
in): systemd-analyze verify finds nothing to say, a restart of one unit cannot
wipe the other's files in the shared RuntimeDirectory, and every ExecStart
line starts a working daemon."""
import configparser
import os
import shlex
import shutil
import subprocess
import tempfile
import time

import pytest

UNIT_DIR = os.environ.get("GF_UNIT_DIR")
BINDIR = os.environ.get("GF_UNIT_BINDIR")
BINARIES = {"gf-lockd": os.environ.get("GF_LOCKD"), "gf-gmsd": os.environ.get("GF_GMSD")}
GFCTL = os.environ.get("GF_GFCTL")
UNITS = ["gf-lockd.service", "gf-gmsd@.service"]
HANG_GUARD = 20.0  # seconds: a bound against hangs, never a speed claim

pytestmark = pytest.mark.skipif(not (UNIT_DIR and BINDIR and all(BINARIES.values()) and GFCTL),
                                reason="run by meson (GF_UNIT_DIR, GF_UNIT_BINDIR, GF_LOCKD, GF_GMSD, GF_GFCTL)")


def unit_text(name):
    with open(os.path.join(UNIT_DIR, name)) as f:
        return f.read()


def service(name):
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str
    cp.read_string(unit_text(name))
    return cp["Service"]


@pytest.fixture
def staged():
    """The units with ExecStart pointing at the built binaries (linked into a
    stand-in bindir), as systemd-analyze checks that the commands exist."""
    tmp = tempfile.mkdtemp(prefix="gf-units-")
    bindir = os.path.join(tmp, "bin")
    os.mkdir(bindir)
    for name, path in BINARIES.items():
        os.symlink(path, os.path.join(bindir, name))
    units = os.path.join(tmp, "units")
    os.mkdir(units)
    for name in UNITS:
        with open(os.path.join(units, name), "w") as f:
            f.write(unit_text(name).replace(BINDIR + "/", bindir + "/"))
    shutil.copy(os.path.join(units, "gf-gmsd@.service"), os.path.join(units, "gf-gmsd@0.service"))
    yield tmp, units
    shutil.rmtree(tmp, ignore_errors=True)


def test_systemd_analyze_verify_is_silent(staged):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze not installed (Debian package systemd; tests/setup.sh installs it)")
    _, units = staged
    r = subprocess.run([analyze, "verify", "--man=no", os.path.join(units, "gf-lockd.service"),
                        os.path.join(units, "gf-gmsd@0.service")], capture_output=True, text=True,
                       timeout=HANG_GUARD)
    # verify exits 0 on some problems (an unparsable value is "ignored"): any word from it fails.
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stderr + r.stdout


def test_shared_runtime_directory_is_preserved_by_every_unit():
    dirs = {name: service(name).get("RuntimeDirectory", "").split() for name in UNITS}
    shared = set(dirs[UNITS[0]]) & set(dirs[UNITS[1]])
    assert shared == {"gf"}
    for name in UNITS:
        # Without it, restarting this unit deletes /run/gf: the lock state
        # file and the other daemon's sockets go with it.
        assert service(name).get("RuntimeDirectoryPreserve") == "yes", name
        assert service(name).get("Type") == "notify", name


def wait_ok(argv):
    end = time.monotonic() + HANG_GUARD
    while time.monotonic() < end:
        if subprocess.run(argv, capture_output=True, timeout=HANG_GUARD).returncode == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"{argv} never succeeded")


def test_every_exec_start_runs(staged):
    tmp, units = staged
    run = os.path.join(tmp, "run")
    os.mkdir(run)
    probes = {"gf-lockd.service": [GFCTL, "lock", "ping", "--lock", f"unix://{run}/lock.sock"],
              "gf-gmsd@0.service": [GFCTL, "gms", "ping", "--gms", f"unix://{run}/gms-0.sock"]}
    for name, probe in probes.items():
        with open(os.path.join(units, name)) as f:
            line = next(l for l in f if l.startswith("ExecStart="))
        argv = shlex.split(line[len("ExecStart="):].replace("/run/gf", run).replace("%i", "0"))
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ok(probe)
            assert p.poll() is None
        finally:
            p.terminate()
            assert p.wait(timeout=HANG_GUARD) == 0
