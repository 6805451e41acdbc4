# SPDX-License-Identifier: Apache-2.0
"""Memory a sleeper still pins (docs/gms.md): when gf-gmsd drops a layout it
closes the sleeping readers' sessions and each sleeper's watcher thread lets go
of its handles. A stopped sleeper cannot: the GMS must report the bytes it still
holds, by pid (status JSON, gfctl, /metrics, the demote's answer), refuse a
restore that the pinned memory leaves no room for, and see the figure drop to 0
once the sleeper resumes or dies."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tiers"))
import test_demote_procs as dp  # noqa: E402  (tests/tiers: gf-gmsd with --min-resident, demote, reader, metrics)
import test_tiers_procs as tp  # noqa: E402

MIB = 1 << 20
LAYOUT = 8 * 4 * MIB  # tp.load(): 8 allocations of 4 MiB


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="gf-pinned-")
    warm = tempfile.mkdtemp(prefix="gf-pinned-warm-", dir="/dev/shm")
    yield d, os.path.join(warm, "w")
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(warm, ignore_errors=True)


def stopped_sleeper(g, seed):
    e = dp.reader(g, seed, "asleep", "--sleep", "--remap-timeout", "30000")
    os.kill(e.pid, signal.SIGSTOP)
    return e


def wait_pinned(g, want, timeout=30):
    end = time.monotonic() + timeout
    while True:
        st = tp.status(g)
        if st["pinned_bytes"] == want:
            return st
        assert time.monotonic() < end, f"pinned_bytes never {want}: {st['pinned_bytes']} {st['pinned_by']}\n{g.text()}"
        time.sleep(0.05)


def end(e):
    if e and e.poll() is None:
        os.kill(e.pid, signal.SIGCONT)
        e.kill()
        e.wait(30)


def test_stopped_sleeper_pins_a_demoted_layout(tmp):
    d, warm = tmp
    g = dp.gmsd(d, "--warm", warm, "--metrics", "127.0.0.1:0")
    e = None
    try:
        before = tp.load(g, seed=101)
        tp.wait_phase(g, ("Checkpointed",))
        assert before["pinned_bytes"] == 0 and before["pinned_by"] == [] and before["pinned_exact"]
        e = stopped_sleeper(g, 101)
        dp.past_min_resident(g)
        # The demote's answer says what the drop could not free, and who holds it.
        r = dp.demote(g)
        assert r.returncode == 0 and f"state=EMPTY pinned_bytes={LAYOUT}" in r.stdout, r.stdout + r.stderr
        assert f"pinned_by: pid={e.pid} " in r.stdout and f"bytes={LAYOUT} generation={before['generation']}" in r.stdout
        st = tp.status(g)
        assert st["allocation_bytes"] == 0 and dp.memfds(g) == 0, "the GMS itself holds nothing"
        assert st["pinned_bytes"] == LAYOUT, st
        (p,) = st["pinned_by"]
        assert (p["pid"], p["bytes"], p["allocations"], p["reason"]) == (e.pid, LAYOUT, 8, "demotion"), p
        assert p["generation"] == before["generation"] and p["peer"]
        human = tp.gfctl("gms", "status", "--gms", g.uri).stdout
        assert f"pinned_bytes: {LAYOUT}" in human and f"\"pid\":{e.pid}," in human, human
        text = dp.metrics(g)
        assert f"gf_gms_pinned_bytes {LAYOUT}\n" in text and "gf_gms_pinned_exact 1\n" in text
        assert re.search(rf'gf_gms_pinned_by_bytes\{{pid="{e.pid}",peer="[^"]+",generation="\d+"\}} {LAYOUT}\n', text)
        assert f"event=still_pinned pid={e.pid}" in g.text()
        # Resumed, its watcher lets go: nothing pinned any more.
        os.kill(e.pid, signal.SIGCONT)
        st = wait_pinned(g, 0)
        assert st["pinned_by"] == [] and f"event=pin_released pid={e.pid}" in g.text()
        assert "gf_gms_pinned_bytes 0\n" in dp.metrics(g)
        # And it wakes on the same layout, restored from WARM.
        e.stdin.write("\n")
        e.stdin.flush()
        out, _ = e.communicate(timeout=60)
        assert e.returncode == 0 and "verified allocs=8" in out, out
        assert tp.status(g)["layout_hash"] == before["layout_hash"]
    finally:
        end(e)
        g.stop()


def test_killed_sleeper_frees_a_layout_a_new_load_dropped(tmp):
    d, _ = tmp
    g = dp.gmsd(d)
    e = None
    try:
        first = tp.load(g, seed=111)
        e = stopped_sleeper(g, 111)
        tp.load(g, seed=112)  # RW on a committed layout nobody holds: the old one is dropped
        st = tp.status(g)
        assert st["generation"] == first["generation"] + 1 and st["allocation_bytes"] == LAYOUT
        assert st["pinned_bytes"] == LAYOUT, st
        (p,) = st["pinned_by"]
        assert (p["pid"], p["reason"], p["generation"]) == (e.pid, "new_load", first["generation"]), p
        e.kill()  # SIGKILL works on a stopped process: the kernel drops its fds and mappings
        e.wait(30)
        assert wait_pinned(g, 0)["pinned_by"] == []
    finally:
        end(e)
        g.stop()


def test_restore_counts_pinned_memory(tmp, monkeypatch):
    """With less free memory than the snapshot needs while a stopped sleeper pins the old copy, a restore
    is refused before allocating, naming the holder; once it let go the restore goes ahead."""
    d, warm = tmp
    monkeypatch.setenv("GF_MEM_HOST_AVAILABLE", str(LAYOUT // 2))  # gf-gmsd's view of free memory
    g = dp.gmsd(d, "--warm", warm)
    monkeypatch.delenv("GF_MEM_HOST_AVAILABLE")
    e = None
    try:
        before = tp.load(g, seed=121)
        tp.wait_phase(g, ("Checkpointed",))
        e = stopped_sleeper(g, 121)
        dp.past_min_resident(g)
        assert dp.demote(g).returncode == 0
        r = tp.gfctl("gms", "restore", "--gms", g.uri, check=False)
        assert r.returncode != 0 and "GF_ERR_OUT_OF_MEMORY" in r.stderr, r.stdout + r.stderr
        assert f"{LAYOUT} bytes of a dropped layout are still pinned" in r.stderr and f"pid {e.pid} " in r.stderr
        assert tp.status(g)["state"] == "EMPTY"
        os.kill(e.pid, signal.SIGCONT)
        wait_pinned(g, 0)
        tp.gfctl("gms", "restore", "--gms", g.uri)
        st = tp.status(g)
        assert st["state"] == "COMMITTED" and st["layout_hash"] == before["layout_hash"]
    finally:
        end(e)
        g.stop()


def test_cuda_counts_a_sleeper_that_has_not_run(tmp):
    """On the cuda backend (the test driver) the driver does not say who holds an import: a released sleeper
    none of whose threads has run since the drop is counted (a lower bound); one that ran is not."""
    libcuda = os.environ.get("GF_LIBCUDA")
    if not libcuda:
        pytest.skip("built without the cuda backend: no test driver (tests/fakecuda)")
    d, _ = tmp
    state = tempfile.mkdtemp(prefix="gf-pinned-fakecuda-", dir="/dev/shm")
    env = dict(os.environ, FAKECUDA_STATE_DIR=state)
    g = tp.Gmsd(os.path.join(d, "g.sock"), "--backend", "cuda", env=env)
    sleepers = []
    try:
        r = subprocess.run([tp.ENGINE, g.uri, "rw", "--backend", "cuda", "--timeout", "20000", "--allocs", "8",
                            "--size", str(4 * MIB), "--seed", "131"], input="\n", capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0 and "committed" in r.stdout, r.stdout + r.stderr
        first = tp.status(g)
        for _ in range(2):
            e = subprocess.Popen([tp.ENGINE, g.uri, "ro", "--backend", "cuda", "--seed", "131", "--sleep",
                                  "--remap-timeout", "30000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=env)
            line = ""
            while "asleep" not in line:
                line = e.stdout.readline()
                assert line, "engine ended before asleep"
            sleepers.append(e)
        stopped, running = sleepers
        os.kill(stopped.pid, signal.SIGSTOP)
        r = subprocess.run([tp.ENGINE, g.uri, "rw", "--backend", "cuda", "--timeout", "20000", "--allocs", "8",
                            "--size", str(4 * MIB), "--seed", "132", "--meta", "6"], input="\n",
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0 and "committed" in r.stdout, r.stdout + r.stderr
        st = wait_pinned(g, LAYOUT)
        assert not st["pinned_exact"]
        (p,) = st["pinned_by"]
        assert (p["pid"], p["reason"], p["generation"]) == (stopped.pid, "new_load", first["generation"]), p
        human = tp.gfctl("gms", "status", "--gms", g.uri).stdout
        assert "pinned_exact: false" in human and f"\"pid\":{stopped.pid}," in human, human
        os.kill(stopped.pid, signal.SIGCONT)
        assert wait_pinned(g, 0)["pinned_by"] == []
    finally:
        for e in sleepers:
            end(e)
        g.stop()
        shutil.rmtree(state, ignore_errors=True)
