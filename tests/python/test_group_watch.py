# SPDX-License-Identifier: Apache-2.0
"""gpufailover._gpufailover._kill_group_on_exit: a watched process's exit
kills the watcher's whole process group from a C thread, even while the
interpreter's main thread holds the GIL and never lets it go (what a Python
thread waiting on the same pidfd could not do)."""
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import child_env, gf

# The group leader watches the target, starts a second member, then holds
# the GIL in a C loop that never releases it (a regex with catastrophic
# backtracking), so no Python thread of its could run.
GROUP = textwrap.dedent("""\
    import os, re, subprocess, sys
    from gpufailover import _gpufailover as g
    g._kill_group_on_exit(int(sys.argv[1]), "prog=test event=dead reason=target")
    member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(member.pid, flush=True)
    re.match(r"(a+)+$", "a" * 64 + "b")
    """)


def pidfd_exited(pid, timeout):
    fd = os.pidfd_open(pid)
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def test_exit_kills_the_group_without_the_gil():
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    group = subprocess.Popen([sys.executable, "-c", GROUP, str(target.pid)], start_new_session=True, env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = group.stdout.readline()
        assert first, group.stderr.read()
        member = int(first)
        time.sleep(0.2)  # the leader is inside the regex, holding the GIL
        assert group.poll() is None
        target.kill()
        target.wait()
        assert group.wait(timeout=60) == -signal.SIGKILL
        assert pidfd_exited(member, 60), "the group's other member outlived the watch"
        err = group.stderr.read()
        assert "event=dead reason=target" in err, err
        line = next(l for l in err.splitlines() if "event=dead" in l)
        assert line.startswith("mono_us=") and int(line.split()[0][8:]) <= time.monotonic_ns() // 1000
    finally:
        for p in (target, group):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL) if p is group else p.kill()
                p.wait()


def test_watches_off_leave_the_group_alive():
    """A process that ends its group itself (the launcher's drain) turns the
    watches off first: the watched exit then kills nothing."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    leader = textwrap.dedent("""\
        import sys, time
        from gpufailover import _gpufailover as g
        g._kill_group_on_exit(int(sys.argv[1]), "prog=test event=dead reason=target")
        g._group_watches_off()
        print("off", flush=True)
        sys.stdin.readline()
        """)
    group = subprocess.Popen([sys.executable, "-c", leader, str(target.pid)], start_new_session=True, env=child_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert group.stdout.readline() == "off\n", group.stderr.read()
        target.kill()
        target.wait()
        time.sleep(0.5)  # a watch still on would have killed the group by now (the test above: at once)
        assert group.poll() is None
        group.stdin.close()
        assert group.wait(timeout=60) == 0
        assert "event=dead" not in group.stderr.read()
    finally:
        for p in (target, group):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL) if p is group else p.kill()
                p.wait()


def test_a_gone_process_and_bad_arguments_are_errors():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    with pytest.raises(ProcessLookupError):
        gf._gpufailover._kill_group_on_exit(p.pid, "x")
    with pytest.raises(ValueError):
        gf._gpufailover._kill_group_on_exit(0, "x")
    with pytest.raises(ValueError):
        gf._gpufailover._kill_group_on_exit(os.getpid(), "two\nlines")
    with pytest.raises(ValueError):
        gf._gpufailover._kill_group_on_exit(os.getpid(), "x" * 1000)
    with pytest.raises(TypeError):
        gf._gpufailover._kill_group_on_exit("1", "x")
