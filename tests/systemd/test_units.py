# SPDX-License-Identifier: Apache-2.0
"""The systemd units shipped in examples/systemd, as installed (paths filled
in): systemd-analyze verify finds nothing to say about any of them, a restart
of one daemon cannot wipe the other's files in the shared RuntimeDirectory,
every ExecStart line starts a working daemon, and the three units with the
installed example supervise.json assemble: their ordering names units of the
set, and started as systemd starts them the supervisor's engines find the lock
and the GMS where the daemons listen and one of them serves."""
import configparser
import json
import os
import re
import socket
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import urllib.error
import urllib.request

import pytest

UNIT_DIR = os.environ.get("GF_UNIT_DIR")
BINDIR = os.environ.get("GF_UNIT_BINDIR")
SYSCONFDIR = os.environ.get("GF_UNIT_SYSCONFDIR")
EXAMPLE_CONFIG = os.environ.get("GF_SUPERVISE_JSON")
BINARIES = {"gf-lockd": os.environ.get("GF_LOCKD"), "gf-gmsd": os.environ.get("GF_GMSD"),
            "gf-supervise": os.environ.get("GF_SUPERVISE"), "gf-c-engine": os.environ.get("GF_C_ENGINE")}
GFCTL = os.environ.get("GF_GFCTL")
DAEMONS = ["gf-lockd.service", "gf-gmsd@.service"]
UNITS = DAEMONS + ["gf-supervise.service"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from timing import scaled  # noqa: E402

HANG_GUARD = scaled(20.0)  # seconds: a bound against hangs, never a speed claim (GF_TEST_TIMEOUT_SCALE)

pytestmark = pytest.mark.skipif(
    not (UNIT_DIR and BINDIR and SYSCONFDIR and EXAMPLE_CONFIG and all(BINARIES.values()) and GFCTL),
    reason="run by meson (GF_UNIT_DIR, GF_UNIT_BINDIR, GF_UNIT_SYSCONFDIR, GF_SUPERVISE_JSON, GF_LOCKD, GF_GMSD, "
           "GF_SUPERVISE, GF_C_ENGINE, GF_GFCTL)")


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
    stand-in bindir), as systemd-analyze checks that the commands exist, and
    at a stand-in sysconfdir holding the example config."""
    tmp = tempfile.mkdtemp(prefix="gf-units-")
    etc = os.path.join(tmp, "etc")
    os.makedirs(os.path.join(etc, "gpufailover"))
    shutil.copy(EXAMPLE_CONFIG, os.path.join(etc, "gpufailover", "supervise.json"))
    bindir = os.path.join(tmp, "bin")
    os.mkdir(bindir)
    for name, path in BINARIES.items():
        os.symlink(path, os.path.join(bindir, name))
    units = os.path.join(tmp, "units")
    os.mkdir(units)
    for name in UNITS:
        with open(os.path.join(units, name), "w") as f:
            f.write(unit_text(name).replace(BINDIR + "/", bindir + "/").replace(SYSCONFDIR + "/", etc + "/"))
    shutil.copy(os.path.join(units, "gf-gmsd@.service"), os.path.join(units, "gf-gmsd@0.service"))
    yield tmp, units
    shutil.rmtree(tmp, ignore_errors=True)


def test_systemd_analyze_verify_is_silent(staged):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze not installed (Debian package systemd; tests/setup.sh installs it)")
    _, units = staged
    r = subprocess.run([analyze, "verify", "--man=no", os.path.join(units, "gf-lockd.service"),
                        os.path.join(units, "gf-gmsd@0.service"), os.path.join(units, "gf-supervise.service")],
                       capture_output=True, text=True, timeout=HANG_GUARD)
    # verify exits 0 on some problems (an unparsable value is "ignored"): any word from it fails.
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stderr + r.stdout


def test_shared_runtime_directory_is_preserved_by_every_unit():
    dirs = {name: service(name).get("RuntimeDirectory", "").split() for name in DAEMONS}
    shared = set(dirs[DAEMONS[0]]) & set(dirs[DAEMONS[1]])
    assert shared == {"gf"}
    for name in DAEMONS:
        # Without it, restarting this unit deletes /run/gf: the lock state
        # file and the other daemon's sockets go with it.
        assert service(name).get("RuntimeDirectoryPreserve") == "yes", name
        assert service(name).get("Type") == "notify", name


def unit_section(name, section):
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str
    cp.read_string(unit_text(name))
    return cp[section]


def test_supervisor_orders_after_units_of_the_set():
    unit = unit_section("gf-supervise.service", "Unit")
    for key in ("After", "Wants"):
        for dep in unit[key].split():
            # gf-gmsd@0.service is an instance of the shipped template.
            template = re.sub(r"@[^.]+\.service$", "@.service", dep)
            assert dep in UNITS or template in UNITS, f"{key}={dep}: no such unit ships"
    assert "gf-gmsd@0.service" in unit["After"].split()
    docs = unit_section("gf-supervise.service", "Unit")["Documentation"]
    assert docs.startswith("file://") and docs.endswith("/supervisor.md")
    for name in DAEMONS:
        assert unit_section(name, "Unit")["Documentation"].startswith("file://")


def test_example_config_uses_the_sockets_the_units_listen_on():
    listens = set()
    for name in DAEMONS:
        line = service(name)["ExecStart"].replace("%i", "0")
        listens |= set(re.findall(r"--listen=(\S+)", line))
    cfg = json.load(open(EXAMPLE_CONFIG))
    used = {cfg["lock"]["uri"]}
    for e in cfg["engines"]:
        argv = e["argv"]
        used |= {argv[i + 1] for i, a in enumerate(argv) if a in ("--lock", "--gms")}
    assert used == listens, (used, listens)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def moved(line, run):
    """A unit's command line with /run/gf moved to @run (systemd's
    RuntimeDirectory), the instance %i = 0 and the --metrics port moved to
    a free one (a machine running the real units holds the real ports)."""
    line = line.replace("/run/gf", run).replace("%i", "0")
    return re.sub(r"--metrics=127\.0\.0\.1:\d+", lambda m: f"--metrics=127.0.0.1:{free_port()}", line)


def exec_lines(path, key, run):
    """The unit's KEY= command lines, moved()."""
    with open(path) as f:
        return [shlex.split(moved(l[len(key) + 1:], run)) for l in f if l.startswith(key + "=")]


# Ports other software on a node commonly holds: Prometheus (9090), its
# exporters (the 9100-9999 range, node_exporter's 9100 first), web servers and
# inference servers (80, 443, 8000, 8080), the kubelet (10250).
COMMON_PORTS = {80, 443, 8000, 8080, 10250} | set(range(9090, 10000))


def test_every_daemon_serves_metrics_on_a_port_nothing_common_uses():
    seen = {}
    for name, flag in (("gf-lockd.service", "--metrics="), ("gf-gmsd@.service", "--metrics="),
                       ("gf-supervise.service", "--http ")):
        (line,) = [l for l in unit_text(name).splitlines() if l.startswith("ExecStart=")]
        m = re.search(re.escape(flag) + r"127\.0\.0\.1:(\d+)(%i)?", line)
        assert m, f"{name}: no {flag.strip()} on 127.0.0.1 in {line}"
        for i in range(10 if m.group(2) else 1):
            port = int(m.group(1) + (str(i) if m.group(2) else ""))
            assert port not in COMMON_PORTS, f"{name}: {port} is a port other software commonly uses"
            assert port not in seen, f"{name} and {seen.get(port)} both use {port}"
            seen[port] = name


def test_the_set_starts_as_systemd_starts_it(staged):
    """gf-lockd, gf-gmsd@0 and gf-supervise with the installed example config
    (only /run/gf and the engines' ports moved): READY=1 from the supervisor,
    one engine holds the lock and serves with weights from the GMS."""
    tmp, units = staged
    run = os.path.join(tmp, "run")
    os.mkdir(run)
    cfg_path = os.path.join(tmp, "etc", "gpufailover", "supervise.json")
    cfg = open(cfg_path).read().replace("/run/gf", run)
    ports = {}
    for old in sorted(set(re.findall(r'"(80[89]\d)"', cfg))):
        ports[old] = str(free_port())
        cfg = cfg.replace(f'"{old}"', f'"{ports[old]}"').replace(f":{old}", f":{ports[old]}")
    open(cfg_path, "w").write(cfg)
    http_port = free_port()
    env = dict(os.environ, PATH=os.path.join(tmp, "bin") + os.pathsep + os.environ.get("PATH", ""))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(os.path.join(tmp, "notify"))
    notify.settimeout(HANG_GUARD)
    procs = []
    try:
        for name in ("gf-lockd.service", "gf-gmsd@0.service"):
            (argv,) = exec_lines(os.path.join(units, name), "ExecStart", run)
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        wait_ok([GFCTL, "lock", "ping", "--lock", f"unix://{run}/lock.sock"])
        wait_ok([GFCTL, "gms", "ping", "--gms", f"unix://{run}/gms-0.sock"])
        sup = os.path.join(units, "gf-supervise.service")
        for argv in exec_lines(sup, "ExecStartPre", run):
            r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=HANG_GUARD)
            assert r.returncode == 0, r.stderr
        (argv,) = exec_lines(sup, "ExecStart", run)
        argv = [a.replace("127.0.0.1:7462", f"127.0.0.1:{http_port}") for a in argv]
        log = open(os.path.join(tmp, "supervise.log"), "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                             env=dict(env, NOTIFY_SOCKET=os.path.join(tmp, "notify")))
        procs.append(p)
        assert b"READY=1" in notify.recv(4096)

        def serving():
            st = subprocess.run([GFCTL, "lock", "status", "--lock", f"unix://{run}/lock.sock", "--json"],
                                capture_output=True, text=True, timeout=HANG_GUARD)
            holder = json.loads(st.stdout).get("holder") if st.returncode == 0 else None
            if holder not in ("engine-a", "engine-b"):
                return None
            probe = ports["8081" if holder == "engine-a" else "8091"]
            return http_get(f"http://127.0.0.1:{probe}/ready")[0] == 200 and holder

        end = time.monotonic() + 3 * HANG_GUARD
        while not serving():
            assert p.poll() is None and time.monotonic() < end, open(os.path.join(tmp, "supervise.log")).read()
            time.sleep(0.1)
        st = json.loads(http_get(f"http://127.0.0.1:{http_port}/status")[1])
        assert {e["name"] for e in st["engines"]} == {"engine-a", "engine-b"}
        p.terminate()
        assert p.wait(timeout=3 * HANG_GUARD) == 0
    finally:
        for q in reversed(procs):
            if q.poll() is None:
                q.terminate()
                try:
                    q.wait(timeout=HANG_GUARD)
                except subprocess.TimeoutExpired:
                    q.kill()
                    q.wait()
        notify.close()


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
        argv = shlex.split(moved(line[len("ExecStart="):], run))
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ok(probe)
            assert p.poll() is None
        finally:
            p.terminate()
            assert p.wait(timeout=HANG_GUARD) == 0
