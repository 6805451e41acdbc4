# SPDX-License-Identifier: Apache-2.0
"""The forking test runner (tests/common/runner.h): each test in its own
child, a leaked fd fails the test that leaked it, a crash or a hang fails only
that test (by name) and the others still run, and a skip() is a SKIP."""
import os
import pathlib
import subprocess
import sys

SAMPLE = os.environ["GF_RUNNER_SAMPLE"]


def run(**env):
    return subprocess.run([SAMPLE], capture_output=True, text=True, timeout=120, env=dict(os.environ, **env))


def test_forked_outcomes_are_reported_per_test():
    r = run(GF_TEST_TIMEOUT="1")
    lines = r.stdout.splitlines()
    assert lines[0] == "1..7"
    assert lines[1] == "ok 1 - test_clean"
    assert lines[2] == "not ok 2 - test_leaks_fd"
    assert lines[3].startswith("not ok 3 - test_crashes # Killed")
    assert lines[4] == "not ok 4 - test_hangs # timed out"
    # Any exit status but cmocka's own failure (1) is named.
    assert lines[5] == "not ok 5 - test_exits # exit status 3"
    assert lines[6] == "ok 6 - test_after_the_others"
    # A test that called skip() is a SKIP in the TAP stream, not a pass; its reason is in the log.
    assert lines[7] == "ok 7 - test_skips # SKIP (the reason is in the log)"
    assert r.returncode == 1
    assert "fd leak: test_leaks_fd: " in r.stderr
    assert "test_skips: nothing to run it on" in r.stderr
    assert "timeout: test_hangs still running after 1s" in r.stderr


def test_in_process_mode_still_checks_fds():
    # Without fork a crash would end the program, so only the first two run here.
    r = run(GF_TEST_NOFORK="1")
    lines = r.stdout.splitlines()
    assert lines[:3] == ["1..7", "ok 1 - test_clean", "not ok 2 - test_leaks_fd"]
    assert "fd leak: test_leaks_fd: " in r.stderr


def test_only_runs_the_named_tests():
    r = run(GF_TEST_ONLY="after_the")
    lines = r.stdout.splitlines()
    assert lines[0] == "1..7"
    assert lines[1] == "ok 1 - test_clean # SKIP not in GF_TEST_ONLY"
    assert lines[3] == "ok 3 - test_crashes # SKIP not in GF_TEST_ONLY"
    assert lines[6] == "ok 6 - test_after_the_others"
    assert r.returncode == 0


def test_skip_is_reported_in_process_too():
    r = run(GF_TEST_NOFORK="1", GF_TEST_ONLY="skips")
    lines = r.stdout.splitlines()
    assert lines[7] == "ok 7 - test_skips # SKIP (the reason is in the log)"
    assert r.returncode == 0


def test_process_init_runs_before_the_fds_are_counted():
    # A test that opens what its process keeps (a driver's device files) leaks...
    r = run(GF_SAMPLE_KEEP_FD="1", GF_TEST_ONLY="clean")
    assert r.stdout.splitlines()[1] == "not ok 1 - test_clean"
    # ...unless tu_process_init opened it in the test's process first.
    for mode in ({}, {"GF_TEST_NOFORK": "1"}):
        r = run(GF_SAMPLE_KEEP_FD="1", GF_SAMPLE_PROCESS_INIT="1", GF_TEST_ONLY="clean", **mode)
        assert r.stdout.splitlines()[1] == "ok 1 - test_clean", r.stderr
        assert r.returncode == 0


def test_every_c_test_program_uses_the_runner():
    tests = pathlib.Path(__file__).resolve().parents[1]
    direct = [str(p.relative_to(tests)) for p in sorted(tests.rglob("*.c"))
              if "cmocka_run_group_tests" in p.read_text(errors="replace")]
    assert not direct, "call tu_run_group_tests() (tests/common/runner.h) instead: " + ", ".join(direct)


if __name__ == "__main__":
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", __file__]))
