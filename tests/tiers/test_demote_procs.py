# SPDX-License-Identifier: Apache-2.0
"""Demotion with real processes (docs/tiers.md, "Demotion"): gf-gmsd drops a
committed layout to WARM or COLD when asked (gfctl gms demote, admin only) or
under free-memory pressure, only after --min-resident, never when pinned or
while an engine holds the lock, never when the snapshot fails; the next reader
gets the same layout back from the tier without a loader."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_tiers_procs as tp  # noqa: E402  (the gf-gmsd, gfctl and engine helpers)

MIB = 1 << 20
MIN_RESIDENT = 1.0  # seconds; every test waits past it before a demotion may happen


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="gf-demote-")
    warm = tempfile.mkdtemp(prefix="gf-demote-warm-", dir="/dev/shm")
    yield d, os.path.join(warm, "w")
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(warm, ignore_errors=True)


def gmsd(d, *args, **kw):
    return tp.Gmsd(os.path.join(d, "g.sock"), "--min-resident", f"{int(MIN_RESIDENT * 1000)}ms", *args, **kw)


def demote(g, *args, check=False):
    return tp.gfctl("gms", "demote", "--gms", g.uri, *args, check=check)


def memfds(g):
    """The GMS process's memfds: on the host backend one per allocation it owns."""
    fdir = f"/proc/{g.p.pid}/fd"
    n = 0
    for f in os.listdir(fdir):
        try:
            n += os.readlink(os.path.join(fdir, f)).startswith("/memfd:")
        except OSError:
            pass
    return n


def past_min_resident(g):
    end = time.monotonic() + 60
    while tp.status(g)["resident_seconds"] < MIN_RESIDENT + 0.1:
        assert time.monotonic() < end
        time.sleep(0.05)


def wait_state(g, state, timeout=60):
    end = time.monotonic() + timeout
    while tp.status(g)["state"] != state:
        assert time.monotonic() < end, f"state never {state}: {tp.status(g)}"
        time.sleep(0.02)


def wait_resident(g, tier, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = tp.status(g)
        if st["resident_tier"] == tier:
            return st
        time.sleep(0.05)
    raise AssertionError(f"resident_tier never {tier}: {tp.status(g)}\n{g.text()}")


def metrics(g):
    port = int(re.search(r'msg="metrics listening" address=\S+ port=(\d+)', g.text()).group(1))
    code, text = tp.http_get(port, "/metrics")
    assert code == 200
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    return text


def test_demote_frees_and_reader_gets_same_layout_back(tmp):
    d, warm = tmp
    cold = os.path.join(d, "cold")
    g = gmsd(d, "--warm", warm, "--cold", cold, "--metrics", "127.0.0.1:0")
    try:
        before = tp.load(g, seed=21)
        assert tp.wait_phase(g, ("Checkpointed", "Failed"))["phase"] == "Checkpointed"
        # Checkpointed is published by gf-gmsd's loop as it ends the job and
        # lets go of the layout: the snapshot no longer holds it (not RO).
        assert tp.status(g)["state"] == "COMMITTED"
        assert before["resident_tier"] == "hot" and before["last_demotion"] is None
        assert memfds(g) >= 8
        # Hysteresis: refused before min_resident, with the figures.
        r = demote(g)
        assert r.returncode == 1 and "min_resident not reached" in r.stderr, r.stderr
        assert tp.status(g)["state"] == "COMMITTED"
        past_min_resident(g)
        r = demote(g)
        assert r.returncode == 0 and "demoted to=warm state=EMPTY" in r.stdout, r.stdout + r.stderr
        st = tp.status(g)
        assert st["state"] == "EMPTY" and st["allocation_count"] == 0 and st["allocation_bytes"] == 0
        assert st["resident_tier"] == "warm" and st["demotions"] == 1
        last = st["last_demotion"]
        assert (last["from"], last["to"], last["reason"]) == ("hot", "warm", "request"), last
        assert last["generation"] == before["generation"] and last["bytes"] == before["allocation_bytes"]
        assert memfds(g) == 0, "the GMS still holds allocations after the demotion"
        assert "event=demoted from=hot to=warm reason=request" in g.text()
        human = tp.gfctl("gms", "tiers", "--gms", g.uri).stdout
        assert "resident_tier=warm" in human and "last_demotion: from=hot to=warm reason=request" in human
        tj = json.loads(tp.gfctl("gms", "tiers", "--gms", g.uri, "--json").stdout)
        assert tj["resident_tier"] == "warm" and tj["last_demotion"]["to"] == "warm" and not tj["pinned"]
        text = metrics(g)
        assert 'gf_gms_resident_tier{tier="warm"} 1' in text and 'gf_gms_resident_tier{tier="hot"} 0' in text
        assert "gf_gms_allocations 0\n" in text and "gf_gms_demotions_total 1\n" in text
        assert "gf_gms_min_resident_seconds 1.000\n" in text and "gf_gms_pinned 0\n" in text
        assert re.search(r'gf_gms_last_demotion_timestamp_seconds\{from="hot",to="warm",reason="request"\} \d', text)
        # A reader connects: the GMS restores the same layout from WARM, no loader.
        tp.reader_verifies(g, seed=21)
        after = tp.status(g)
        assert after["state"] == "COMMITTED" and after["layout_hash"] == before["layout_hash"]
        assert after["generation"] == before["generation"] and after["resident_tier"] == "hot"
        assert "event=promoted from=warm to=hot" in g.text()
        # Back HOT, the hysteresis starts again.
        r = demote(g)
        assert r.returncode == 1 and "min_resident not reached" in r.stderr
    finally:
        g.stop()


def test_promotion_runs_off_the_loop(tmp):
    """The restore a reader's connect starts after a demotion is a job on the
    tier worker: while it waits on the tier's data.bin (held open here), the
    GMS answers everyone else; once allowed, the waiting reader is granted
    the same layout."""
    if os.geteuid() != 0:
        pytest.skip("needs root for fanotify")
    d, warm = tmp
    g = gmsd(d, "--warm", warm)
    gate, e = None, None
    try:
        before = tp.load(g, seed=31)
        assert tp.wait_phase(g, ("Checkpointed", "Failed"))["phase"] == "Checkpointed"
        wait_state(g, "COMMITTED")
        past_min_resident(g)
        r = demote(g)
        assert r.returncode == 0, r.stdout + r.stderr
        gate = tp.OpenGate(os.path.join(warm, "data.bin"), tids=True)
        e = subprocess.Popen([tp.ENGINE, g.uri, "ro", "--backend", "host", "--timeout", "60000", "--seed", "31"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        # The loop (gf-gmsd's main thread) may look at the tier first (its
        # manifest and data.bin's size); the restore reads data.bin on
        # another thread of the same process: that open is held.
        while True:
            tid, fd = gate.wait_open()
            if tid != g.p.pid:
                break
            gate.allow(fd)
        assert os.path.exists(f"/proc/{g.p.pid}/task/{tid}"), "data.bin was opened by another process"
        now = tp.status(g)
        assert now["state"] == "EMPTY" and now["operation"]["phase"] == "Restoring", now
        assert e.poll() is None, "the reader did not wait for the restore"
        gate.allow(fd)
        out, _ = e.communicate(input="\n", timeout=120)
        assert e.returncode == 0 and "verified allocs=8" in out, out
        after = tp.status(g)
        assert after["layout_hash"] == before["layout_hash"] and after["resident_tier"] == "hot"
        assert "event=promoted from=warm to=hot" in g.text()
    finally:
        if gate:
            gate.close()
        if e and e.poll() is None:
            e.kill()
            e.wait()
        g.stop()


def reader(g, seed, word, *flags):
    """A reader engine on @g (gms-engine ro), once it has printed @word ("asleep", "holding")."""
    e = subprocess.Popen([tp.ENGINE, g.uri, "ro", "--backend", "host", "--seed", str(seed), *flags],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = ""
    while word not in line:
        line = e.stdout.readline()
        assert line, f"engine ended before {word}"
    return e


def test_sleeping_engine_wakes_after_demotion(tmp):
    """A parked reader holds no lock: the layout may go, and its wake brings it back (wait, remap, serve)."""
    d, warm = tmp
    g = gmsd(d, "--warm", warm)
    e = None
    try:
        before = tp.load(g, seed=31)
        tp.wait_phase(g, ("Checkpointed",))
        e = reader(g, 31, "asleep", "--sleep", "--remap-timeout", "30000")
        past_min_resident(g)
        r = demote(g)
        assert r.returncode == 0, r.stderr
        assert tp.status(g)["state"] == "EMPTY" and memfds(g) == 0
        e.stdin.write("\n")
        e.stdin.flush()
        out, _ = e.communicate(timeout=60)
        assert e.returncode == 0 and "awake" in out and "verified allocs=8" in out, out
        assert tp.status(g)["layout_hash"] == before["layout_hash"]
    finally:
        if e and e.poll() is None:
            e.kill()
        g.stop()


def test_refused_while_a_reader_holds_the_lock(tmp):
    d, warm = tmp
    g = gmsd(d, "--warm", warm)
    e = None
    try:
        tp.load(g, seed=41)
        tp.wait_phase(g, ("Checkpointed",))
        e = reader(g, 41, "holding", "--hold")
        past_min_resident(g)
        r = demote(g)
        assert r.returncode == 1 and "holds the RO or RW lock (1 readers" in r.stderr, r.stderr
        st = tp.status(g)
        assert st["state"] == "RO" and st["allocation_count"] == 8 and st["resident_tier"] == "hot"
        e.stdin.close()
        e.wait(30)
        end = time.monotonic() + 30
        while tp.status(g)["readers"]:
            assert time.monotonic() < end
            time.sleep(0.05)
        assert demote(g).returncode == 0
    finally:
        if e and e.poll() is None:
            e.kill()
        g.stop()


def test_refused_when_pinned(tmp):
    d, warm = tmp
    g = gmsd(d, "--warm", warm, "--pin")
    try:
        tp.load(g, seed=51)
        tp.wait_phase(g, ("Checkpointed",))
        past_min_resident(g)
        r = demote(g)
        assert r.returncode == 1 and "pinned" in r.stderr, r.stderr
        st = tp.status(g)
        assert st["state"] == "COMMITTED" and st["pinned"] and st["demotions"] == 0
        assert "residency: resident_tier=hot" in tp.gfctl("gms", "tiers", "--gms", g.uri).stdout
        assert "pinned=yes" in tp.gfctl("gms", "tiers", "--gms", g.uri).stdout
    finally:
        g.stop()


def test_demote_writes_the_missing_snapshot_and_to_cold(tmp):
    """A tier that lacks the layout gets it written first (phases as any snapshot); --to picks the tier."""
    d, warm = tmp
    cold = os.path.join(d, "cold")
    g = gmsd(d, "--warm", warm, "--cold", cold)
    try:
        before = tp.load(g, seed=61)
        tp.wait_phase(g, ("Checkpointed",))
        shutil.rmtree(cold)
        past_min_resident(g)
        r = demote(g, "--to", "cold")
        assert r.returncode == 0 and "demoted to=cold" in r.stdout, r.stderr
        st = tp.status(g)
        assert st["state"] == "EMPTY" and st["resident_tier"] == "cold"
        assert st["operation"]["kind"] == "snapshot" and st["operation"]["phase"] == "Checkpointed"
        assert cold in st["operation"]["reason"] and "event=demote phase=snapshot to=cold" in g.text()
        # The reader's restore comes from the tier it was demoted to.
        tp.reader_verifies(g, seed=61)
        assert tp.status(g)["layout_hash"] == before["layout_hash"]
        assert "event=promoted from=cold to=hot" in g.text()
    finally:
        g.stop()
    # Asking for a tier that is not kept, or an unknown one, is a clear error.
    g = gmsd(d, "--cold", cold)
    try:
        tp.load(g, seed=62)
        tp.wait_phase(g, ("Checkpointed",))
        past_min_resident(g)
        r = demote(g, "--to", "warm")
        assert r.returncode == 2 and "no WARM tier kept (gf-gmsd --warm) (GF_ERR_INVALID_ARG)" in r.stderr, r.stderr
        r = demote(g, "--to", "lukewarm")
        assert r.returncode == 2 and "--to must be warm or cold" in r.stderr
        assert demote(g).returncode == 0 and tp.status(g)["resident_tier"] == "cold"
    finally:
        g.stop()


def test_failed_snapshot_keeps_the_layout(tmp):
    d, _ = tmp
    with tp.mounted_tmpfs(os.path.join(d, "ro"), "size=64m,ro", "a read-only tmpfs") as mnt:
        g = gmsd(d, "--cold", os.path.join(mnt, "cold"))
        try:
            tp.load(g, seed=71)
            assert tp.wait_phase(g, ("Checkpointed", "Failed"))["phase"] == "Failed"
            past_min_resident(g)
            r = demote(g)
            assert r.returncode == 1 and "failed, staying hot" in r.stderr and "Read-only" in r.stderr, r.stderr
            st = tp.status(g)
            assert st["state"] == "COMMITTED" and st["allocation_count"] == 8 and st["resident_tier"] == "hot"
            assert st["operation"]["phase"] == "Failed" and st["demotions"] == 0
            tp.reader_verifies(g, seed=71)
        finally:
            g.stop()


def test_automatic_pressure_demotes_once_no_reader_holds(tmp):
    """--demote-below-free larger than any memory: always pressure, so the layout goes as soon as it may."""
    d, warm = tmp
    g = gmsd(d, "--warm", warm, "--demote-below-free", "1024T")
    e = None
    try:
        before = tp.load(g, seed=81)
        tp.wait_phase(g, ("Checkpointed",))
        e = reader(g, 81, "holding", "--hold")
        past_min_resident(g)
        time.sleep(2.5)  # several free-memory checks while the reader holds the lock
        st = tp.status(g)
        assert st["state"] == "RO" and st["resident_tier"] == "hot" and st["demotions"] == 0, st
        assert st["demote_below_free_bytes"] == 1 << 50
        e.stdin.close()
        e.wait(30)
        st = wait_resident(g, "warm")
        assert st["state"] == "EMPTY" and st["allocation_count"] == 0 and memfds(g) == 0
        assert st["last_demotion"]["reason"] == "free_memory" and "free memory" in st["last_demotion"]["detail"]
        # A waking reader gets it back; min_resident holds it HOT again for a while.
        tp.reader_verifies(g, seed=81)
        assert tp.status(g)["layout_hash"] == before["layout_hash"]
        wait_resident(g, "warm")
        assert tp.status(g)["demotions"] == 2
    finally:
        if e and e.poll() is None:
            e.kill()
        g.stop()


def test_demote_needs_an_admin_uid(tmp):
    if os.geteuid() != 0:
        pytest.skip("needs root to run gfctl as another uid")
    d, warm = tmp
    os.chmod(d, 0o755)
    g = gmsd(d, "--warm", warm, "--allow-uid", "0", "--allow-uid", "65534")
    try:
        tp.load(g, seed=91)
        tp.wait_phase(g, ("Checkpointed",))
        os.chmod(g.sock, 0o777)
        past_min_resident(g)
        gfctl = tp.for_other_uid(tp.GFCTL)
        r = subprocess.run([gfctl, "gms", "demote", "--gms", g.uri], capture_output=True, text=True, timeout=60,
                           user=65534, group=65534)
        assert r.returncode == 6 and "only root or the server's own uid" in r.stderr, r.stdout + r.stderr
        # The same uid may read the status: it is an allowed client, just not an admin.
        r = subprocess.run([gfctl, "gms", "status", "--gms", g.uri, "--json"], capture_output=True, text=True,
                           timeout=60, user=65534, group=65534)
        assert r.returncode == 0 and json.loads(r.stdout)["state"] == "COMMITTED"
        assert demote(g).returncode == 0
    finally:
        g.stop()


@pytest.mark.parametrize("args,words", [
    (["--demote-below-free", "8G"], "needs a tier to demote to"),
    (["--warm", "/dev/shm/x", "--demote-below-free", "0"], "expected a positive size"),
    (["--warm", "/dev/shm/x", "--demote-below-free", "8Q"], "expected a positive size"),
    (["--warm", "/dev/shm/x", "--demote-below-free", "1G", "--pin"], "contradict"),
    (["--min-resident", "soon"], "--min-resident"),
])
def test_bad_flags_are_usage_errors(tmp, args, words):
    d, _ = tmp
    r = subprocess.run([tp.GMSD, "--listen", "unix://" + os.path.join(d, "g.sock"), "--backend", "host", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and words in r.stderr, r.stderr
