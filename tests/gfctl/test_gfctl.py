# SPDX-License-Identifier: Apache-2.0
"""gfctl against a real gf-lockd: help for every command, unknown commands and
options named as such, `--timeout 0` as a single try, and `lock acquire -- CMD`
never letting CMD (or what it started) outlive the lock, also when gfctl is
SIGKILLed."""
import os
import signal
import subprocess
import tempfile
import time

import pytest

LOCKD = os.environ.get("GF_LOCKD")
GFCTL = os.environ.get("GF_GFCTL")
pytestmark = pytest.mark.skipif(not (LOCKD and GFCTL), reason="GF_LOCKD and GF_GFCTL must point at the binaries")

HANG_GUARD = 20.0  # seconds: a bound against hangs, never a speed claim
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
