# SPDX-License-Identifier: Apache-2.0
"""gfctl against a real gf-lockd and gf-gmsd: help for every command, unknown
commands and options named as such (each command takes only its own options;
a missing value is not an unknown option), every URI scheme named, exit codes
of `gms wait-committed`, JSON escapes in `gms status`, `gpu list --json` and
the sidecars' error bodies, `--timeout 0` as a single try, and `lock acquire
-- CMD` never letting CMD (or what it started) outlive the lock, also when
gfctl is SIGKILLed."""
import json
import os
import sys
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import urllib.error
import urllib.request

import pytest

LOCKD = os.environ.get("GF_LOCKD")
GMSD = os.environ.get("GF_GMSD")
GFCTL = os.environ.get("GF_GFCTL")
pytestmark = pytest.mark.skipif(not (LOCKD and GFCTL), reason="GF_LOCKD and GF_GFCTL must point at the binaries")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from timing import scaled  # noqa: E402

HANG_GUARD = scaled(20.0)  # seconds: a bound against hangs, never a speed claim (GF_TEST_TIMEOUT_SCALE)
COMMANDS = {"lock": ["acquire", "status", "ping"], "gms": ["status", "ping", "wait-committed"]}


def gfctl(*args, timeout=HANG_GUARD):
    return subprocess.run([GFCTL, *args], capture_output=True, text=True, timeout=timeout)


def wait_for(pred, what):
    end = time.monotonic() + HANG_GUARD
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("group,cmd", [(g, c) for g, cs in COMMANDS.items() for c in cs])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_its_own_help(group, cmd, flag):
    for argv in ([group, cmd, flag], [group, cmd, f"--{group}", "unix:///x", flag]):
        r = gfctl(*argv)
        assert r.returncode == 0, r.stderr
        out = r.stdout
        assert out.startswith(f"usage: gfctl {group} {cmd} "), out
        assert "\noptions:\n" in out and f"--{group} URI" in out and "-h, --help" in out
        assert "exit codes: 0 ok, 1 failure, 2 usage" in out
        # Only this command: no other command's usage line.
        for other in COMMANDS[group]:
            if other != cmd:
                assert f"gfctl {group} {other} " not in out


@pytest.mark.parametrize("group", list(COMMANDS))
def test_group_help_lists_commands_with_descriptions_and_exit_codes(group):
    r = gfctl(group, "--help")
    assert r.returncode == 0
    assert r.stdout.startswith(f"usage: gfctl {group} COMMAND")
    for cmd in COMMANDS[group]:
        assert f"\n  {cmd} " in r.stdout
    assert "exit codes:" in r.stdout and "6 permission denied" in r.stdout
    top = gfctl("--help")
    assert all(f"{group} {c}" in top.stdout for c in COMMANDS[group])


def test_unknown_commands_and_options_are_named():
    r = gfctl("lock", "frobnicate", "--lock", "unix:///x")
    assert r.returncode == 2
    assert "unknown command 'frobnicate'" in r.stderr and "required" not in r.stderr
    r = gfctl("gms", "frobnicate")
    assert r.returncode == 2 and "unknown command 'frobnicate'" in r.stderr
    r = gfctl("frobnicate")
    assert r.returncode == 2 and "unknown command 'frobnicate'" in r.stderr
    r = gfctl("gms", "status", "--lock", "unix:///x")
    assert r.returncode == 2 and "'--lock'" in r.stderr and "gfctl gms status --help" in r.stderr
    r = gfctl("lock", "ping", "--lock", "unix:///x", "extra")
    assert r.returncode == 2 and "unexpected argument 'extra'" in r.stderr
    r = gfctl("lock", "acquire", "--lock", "unix:///x", "--id", "a", "--timeout", "soon")
    assert r.returncode == 2 and "--timeout" in r.stderr


@pytest.mark.parametrize("argv,opt", [
    (["gms", "snapshot", "--gms", "unix:///x", "--to", "d"], "--to"),     # demote's option
    (["gms", "demote", "--gms", "unix:///x", "--dir", "d"], "--dir"),     # snapshot's option
    (["gms", "ping", "--gms", "unix:///x", "--json"], "--json"),
    (["lock", "ping", "--lock", "unix:///x", "--id", "a"], "--id"),       # acquire's option
    (["lock", "status", "--lock", "unix:///x", "--epoch", "1"], "--epoch"),
    (["lock", "revoke", "--lock", "unix:///x", "--gpu", "g"], "--gpu"),
])
def test_each_command_takes_only_its_own_options(argv, opt):
    r = gfctl(*argv)
    assert r.returncode == 2, r.stderr
    assert f"unknown option '{opt}'" in r.stderr and f"gfctl {argv[0]} {argv[1]} --help" in r.stderr, r.stderr


def test_a_missing_value_is_not_an_unknown_option():
    for group, cmd, opt in [("gms", "status", "--timeout"), ("lock", "acquire", "--id"), ("gpu", "list", "--backend")]:
        uri = [f"--{group}", "unix:///x"] if group != "gpu" else []
        r = gfctl(group, cmd, *uri, opt)
        assert r.returncode == 2 and f"option '{opt}' needs a value" in r.stderr, r.stderr
        r = gfctl(group, cmd, *uri, "--frobnicate")
        assert r.returncode == 2 and "unknown option '--frobnicate'" in r.stderr, r.stderr
        assert "needs a value" not in r.stderr
    r = gfctl("gms", "status", "--gms", "unix:///x", "--json=yes")
    assert r.returncode == 2 and "option '--json' takes no value" in r.stderr, r.stderr
    r = gfctl("supervise", "status", "--url")
    assert r.returncode == 2 and "option '--url' needs a value" in r.stderr, r.stderr


def test_every_uri_scheme_is_named():
    for cmd in ["acquire", "status", "ping", "ready", "revoke", "switchover"]:
        out = gfctl("lock", cmd, "--help").stdout
        assert all(s in out for s in ("unix://", "tcp://", "etcd://", "etcds://")), out
    r = gfctl("lock", "ping", "--lock", "nfs://x/y")
    assert r.returncode == 2
    assert all(s in r.stderr for s in ("unknown scheme", "unix://", "tcp://", "etcd://", "etcds://")), r.stderr
    assert "unix://" in gfctl("gms", "status", "--help").stdout


@pytest.fixture
def gmsd():
    """A real gf-gmsd (host backend) whose WARM tier's path holds a quote, a
    backslash and a comma: the status names it."""
    if not GMSD:
        pytest.skip("GF_GMSD must point at gf-gmsd")
    tmp = tempfile.mkdtemp(prefix="gf-gfctl-")
    warm = os.path.join(tmp, 'wa"rm\\dir,x:{y}')
    os.mkdir(warm)
    uri = f"unix://{tmp}/gms.sock"
    log = open(os.path.join(tmp, "gmsd.log"), "wb")
    p = subprocess.Popen([GMSD, "--listen", uri, "--backend", "host", "--warm", warm], stdout=log,
                         stderr=subprocess.STDOUT)
    wait_for(lambda: gfctl("gms", "ping", "--gms", uri).returncode == 0, "gf-gmsd")
    yield uri, warm
    p.terminate()
    p.wait(timeout=HANG_GUARD)
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)


def test_wait_committed_tells_unreachable_from_timeout(gmsd):
    uri, _ = gmsd
    r = gfctl("gms", "wait-committed", "--gms", uri, "--timeout", "300ms")
    assert r.returncode == 3 and "GF_ERR_TIMEOUT" in r.stderr, r.stderr  # answers, nothing committed
    missing = uri.replace("gms.sock", "nothing-here.sock")
    r = gfctl("gms", "wait-committed", "--gms", missing, "--timeout", "300ms")
    assert r.returncode == 5 and "GF_ERR_UNREACHABLE" in r.stderr, r.stderr


def test_human_status_keeps_escapes(gmsd):
    uri, warm = gmsd
    st = json.loads(gfctl("gms", "status", "--gms", uri, "--json").stdout)
    assert st["tiers"]["warm"]["dir"] == warm
    r = gfctl("gms", "status", "--gms", uri)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    fields = dict(l.split(": ", 1) for l in lines if not l.startswith("  ") and ": " in l)
    assert fields["state"] == "EMPTY" and fields["backend"] == "host"
    assert json.loads(fields["tiers"])["warm"]["dir"] == warm
    # A list puts one JSON item a line under its key; each parses on its own.
    at = lines.index("events:")
    items = [json.loads(l[2:]) for l in lines[at + 1:] if l.startswith("  ")]
    assert items and all(set(i) == {"at_us", "what"} for i in items)
    assert set(fields) - {"events"} <= set(st)


def test_gpu_list_json_is_jansson_json():
    r = gfctl("gpu", "list", "--backend", "host", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["backend"] == "host" and out["devices"]
    d = out["devices"][0]
    assert set(d) == {"index", "uuid", "name", "total_bytes", "free_bytes", "mig"}
    assert isinstance(d["total_bytes"], int) and d["mig"] is False


def test_sidecar_error_body_escapes_quotes_and_backslashes():
    tmp = tempfile.mkdtemp(prefix="gf-gfctl-")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    uri = f"unix://{tmp}/lock.sock"
    p = subprocess.Popen([LOCKD, "--listen", uri, "--state-file", f"{tmp}/lock.state", "--metrics",
                          f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: gfctl("lock", "ping", "--lock", uri).returncode == 0, "gf-lockd")

        def get(query):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready?{query}", timeout=HANG_GUARD) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        # The library's detail quotes the GPU it was given: a '"' and a '\\' in it.
        code, body = get("gpu=GPU-a%22b%5Cc")
        assert code == 400 and body.endswith("\n"), body
        assert json.loads(body)["error"].startswith('ready: GPU "GPU-a"b\\c" is not a UUID'), body
        code, body = get("gpu=GPU-%ff%0a")  # not UTF-8, and a newline: still one valid JSON object
        assert code == 400 and "\n" not in body.rstrip("\n") and isinstance(json.loads(body)["error"], str), body
    finally:
        p.terminate()
        p.wait(timeout=HANG_GUARD)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def lockd():
    tmp = tempfile.mkdtemp(prefix="gf-gfctl-")
    log = open(os.path.join(tmp, "lockd.log"), "wb")
    uri = f"unix://{tmp}/lock.sock"
    p = subprocess.Popen([LOCKD, "--listen", uri, "--state-file", f"{tmp}/lock.state"], stdout=log,
                         stderr=subprocess.STDOUT)
    wait_for(lambda: gfctl("lock", "ping", "--lock", uri).returncode == 0, "gf-lockd")
    started = []

    class D:
        dir = tmp

        def __init__(self):
            self.uri = uri

        def spawn(self, ident, *cmd, timeout=None):
            argv = [GFCTL, "lock", "acquire", "--lock", uri, "--id", ident]
            if timeout is not None:
                argv += ["--timeout", timeout]
            if cmd:
                argv += ["--", *cmd]
            h = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
            started.append(h)
            return h

    yield D()
    for h in started:
        if h.poll() is None:
            h.kill()
        h.wait()
    p.terminate()
    p.wait(timeout=HANG_GUARD)
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)


def test_timeout_zero_tries_once(lockd):
    r = gfctl("lock", "acquire", "--lock", lockd.uri, "--id", "once", "--timeout", "0", "--", "true")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("granted id=once epoch=")
    holder = lockd.spawn("holder")
    assert holder.stdout.readline().startswith("granted")
    t0 = time.monotonic()
    r = gfctl("lock", "acquire", "--lock", lockd.uri, "--id", "late", "--timeout", "0")
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "granted" not in r.stdout
    assert time.monotonic() - t0 < HANG_GUARD


def dead(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_command_dies_with_gfctl_even_on_sigkill(lockd):
    pids = os.path.join(lockd.dir, "pids")
    script = f"sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; exec sleep 300"
    a = lockd.spawn("a", "sh", "-c", script)
    assert a.stdout.readline().startswith("granted")
    wait_for(lambda: os.path.exists(pids) and len(open(pids).read().split()) == 2, "CMD to start")
    cmd_pids = [int(x) for x in open(pids).read().split()]
    assert not any(dead(p) for p in cmd_pids)
    b = lockd.spawn("b")
    wait_for(lambda: '"waiter_count":1' in gfctl("lock", "status", "--lock", lockd.uri, "--json").stdout,
             "b to wait")
    a.send_signal(signal.SIGKILL)
    assert b.stdout.readline().startswith("granted id=b")
    # CMD and the job it started in the background are gone with gfctl.
    wait_for(lambda: all(dead(p) for p in cmd_pids), "CMD and its background job to die")


def test_signals_reach_command_and_leftovers_go_before_release(lockd):
    pids = os.path.join(lockd.dir, "pids")
    script = (f"trap 'exit 9' TERM; sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; "
              "while :; do sleep 0.05; done")
    a = lockd.spawn("a", "sh", "-c", script)
    assert a.stdout.readline().startswith("granted")
    wait_for(lambda: os.path.exists(pids) and len(open(pids).read().split()) == 2, "CMD to start")
    bg, shell = (int(x) for x in open(pids).read().split())
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=HANG_GUARD) == 9  # CMD's own handler ran and chose the status
    wait_for(lambda: dead(bg) and dead(shell), "the background job to be killed")
    st = gfctl("lock", "status", "--lock", lockd.uri, "--json")
    assert '"holder":null' in st.stdout.replace(" ", "")
