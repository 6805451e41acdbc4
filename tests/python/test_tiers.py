# SPDX-License-Identifier: Apache-2.0
"""gms_snapshot(), gms_restore() and gms_tiers() against real gf-gmsd processes
(host backend): a round trip into a fresh GMS keeps the layout hash and every
byte, refused snapshots leave the GMS EMPTY, errors map to the exception
classes, and signal handlers run while a call waits (PEP 475)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import GMSD, Deadline, child_env, gf, wait_for

MiB = 1 << 20



def gmsd(cluster, n, *extra):
    """A gf-gmsd like cluster.gmsd(n), with extra flags (--warm, --cold)."""
    p = cluster.spawn(f"gf-gmsd-{n}", [GMSD, f"--listen={cluster.gms_uri(n)}", "--device=0", "--backend=host",
                                       *extra])
    wait_for(lambda: gf.gms_status(cluster.gms_uri(n), 0.2), timeout=60, what="gf-gmsd")
    return p


def load(uri, seed=1):
    """Commit a layout of three allocations filled with seeded random bytes;
    return {alloc_id: bytes}."""
    rng = np.random.default_rng(seed)
    w = gf.GMSClient(uri, gf.Memory("host"), mode="rw", timeout=10)
    content = {}
    for i, size in enumerate((2 * MiB, 4 * MiB, 2 * MiB)):
        aid = w.allocate(size, f"weights.{i}")
        data = rng.integers(0, 256, size, dtype=np.uint8)
        with memoryview(w.buffer(alloc_id=aid)) as mv:
            mv[:] = data.tobytes()
        content[aid] = data.tobytes()
        w.put_meta(f"layer.{i}.weight", aid, 64 * i, json.dumps({"index": i}).encode())
    w.commit()
    w.close()
    return content


def read_back(uri):
    """A reader's view of the committed layout: (layout, allocations, metadata, {id: bytes})."""
    r = gf.GMSClient(uri, gf.Memory("host"), mode="ro", timeout=10)
    r.map_all()
    allocs = [{k: a[k] for k in ("id", "size", "tag")} for a in r.allocations]
    data = {}
    for a in allocs:
        with memoryview(r.buffer(alloc_id=a["id"])) as mv:
            data[a["id"]] = mv.tobytes()
    meta = {k: (v["alloc_id"], v["offset"], v["value"]) for k, v in r.metadata.items()}
    out = (r.layout, allocs, meta, data)
    r.close()
    return out


def snapshot_of_a_layout(cluster, tmp_path, name="snap"):
    gmsd(cluster, 0)
    content = load(cluster.gms_uri(0))
    snap = tmp_path / name
    gf.gms_snapshot(cluster.gms_uri(0), snap, timeout=60)
    return content, snap


def test_round_trip_into_a_fresh_gms(cluster, tmp_path):
    content, snap = snapshot_of_a_layout(cluster, tmp_path)
    assert sorted(os.listdir(snap)) == ["data.bin", "manifest.json"]
    src = gf.gms_status(cluster.gms_uri(0))
    assert gf.gms_tiers(cluster.gms_uri(0))["tiers"] == {"warm": None, "cold": None}
    op = gf.gms_tiers(cluster.gms_uri(0))["operation"]
    assert op["kind"] == "snapshot" and op["phase"] == "Checkpointed", op
    assert op["bytes"] == src["allocation_bytes"] == 8 * MiB
    before = read_back(cluster.gms_uri(0))
    assert before[3] == content

    gmsd(cluster, 1)
    assert gf.gms_status(cluster.gms_uri(1))["state"] == "EMPTY"
    gf.gms_restore(cluster.gms_uri(1), str(snap), timeout=60)  # a str works as well as a Path
    dst = gf.gms_status(cluster.gms_uri(1))
    assert dst["state"] == "COMMITTED"
    assert dst["layout_hash"] == src["layout_hash"] and dst["generation"] == src["generation"]
    after = read_back(cluster.gms_uri(1))
    assert after == before  # same layout hash and generation, tables, metadata and bytes
    op = gf.gms_tiers(cluster.gms_uri(1))["operation"]
    assert op["kind"] == "restore" and op["phase"] == "Restored", op


def test_snapshot_over_a_snapshot_replaces_it(cluster, tmp_path):
    _, snap = snapshot_of_a_layout(cluster, tmp_path)
    first = json.loads((snap / "manifest.json").read_text())
    w = gf.GMSClient(cluster.gms_uri(0), gf.Memory("host"), mode="rw", timeout=10)
    w.put_meta("only", w.allocate(2 * MiB, "other"), 0, b"x")
    w.commit()
    w.close()
    gf.gms_snapshot(cluster.gms_uri(0), snap)
    second = json.loads((snap / "manifest.json").read_text())
    assert second["layout_hash"] == gf.gms_status(cluster.gms_uri(0))["layout_hash"] != first["layout_hash"]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def flipped(snap):
    flip_byte(snap / "data.bin", 3 * MiB + 17)
    return "checksum mismatch"


def truncated(snap):
    os.truncate(snap / "data.bin", 5 * MiB)
    return "truncated"


def other_version(snap):
    m = json.loads((snap / "manifest.json").read_text())
    m["version"] = 99
    (snap / "manifest.json").write_text(json.dumps(m))
    return "version"


@pytest.mark.parametrize("corrupt", [flipped, truncated, other_version])
def test_corrupt_snapshot_is_refused_and_the_gms_stays_empty(cluster, tmp_path, corrupt):
    _, snap = snapshot_of_a_layout(cluster, tmp_path)
    why = corrupt(snap)
    gmsd(cluster, 1)
    with pytest.raises(gf.ProtocolError, match=why) as ei:
        gf.gms_restore(cluster.gms_uri(1), snap)
    assert ei.value.name in ("GF_ERR_PROTOCOL", "GF_ERR_VERSION")
    st = gf.gms_status(cluster.gms_uri(1))
    assert st["state"] == "EMPTY" and st["allocation_count"] == 0
    assert gf.gms_tiers(cluster.gms_uri(1))["operation"]["phase"] == "Failed"
    # The loader path still works on it.
    content = load(cluster.gms_uri(1), seed=2)
    assert read_back(cluster.gms_uri(1))[3] == content


def test_state_errors(cluster, tmp_path):
    gmsd(cluster, 0)
    with pytest.raises(gf.StateError, match="no committed layout") as ei:
        gf.gms_snapshot(cluster.gms_uri(0), tmp_path / "snap")
    assert ei.value.name == "GF_ERR_STATE"
    assert not (tmp_path / "snap").exists()
    with pytest.raises(gf.NotFoundError):
        gf.gms_restore(cluster.gms_uri(0), tmp_path / "nothing-here")
    load(cluster.gms_uri(0))
    gf.gms_snapshot(cluster.gms_uri(0), tmp_path / "snap")
    with pytest.raises(gf.StateError, match="not EMPTY"):
        gf.gms_restore(cluster.gms_uri(0), tmp_path / "snap")
    # Neither a directory nor a kept tier: nowhere to write or read.
    with pytest.raises(ValueError, match="no directory given"):
        gf.gms_snapshot(cluster.gms_uri(0))
    with pytest.raises(ValueError, match="no directory given"):
        gf.gms_snapshot(cluster.gms_uri(0), "")


def test_kept_tiers_when_no_dir_is_given(cluster, tmp_path):
    warm0, warm1 = tmp_path / "warm0", tmp_path / "warm1"
    gmsd(cluster, 0, f"--warm={warm0}")
    tiers = gf.gms_tiers(cluster.gms_uri(0))
    assert set(tiers) == {"tiers", "operation"}
    assert tiers["tiers"]["warm"]["present"] is False and tiers["operation"] is None
    assert tiers["tiers"]["cold"] is None  # not kept
    content = load(cluster.gms_uri(0))
    # Every commit is snapshotted to the kept tiers; wait for that one, then ask for another.
    wait_for(lambda: (gf.gms_tiers(cluster.gms_uri(0))["operation"] or {}).get("phase") == "Checkpointed",
             timeout=60, what="the commit's snapshot")
    gf.gms_snapshot(cluster.gms_uri(0), None)
    tiers = gf.gms_tiers(cluster.gms_uri(0))["tiers"]
    assert tiers["warm"]["present"] and tiers["warm"]["bytes"] == 8 * MiB
    assert tiers["warm"]["dir"] == str(warm0)

    # A GMS whose tier is empty at start waits EMPTY; a snapshot written
    # there later is its best tier for gms_restore(uri).
    gmsd(cluster, 1, f"--warm={warm1}")
    assert gf.gms_status(cluster.gms_uri(1))["state"] == "EMPTY"
    gf.gms_snapshot(cluster.gms_uri(0), warm1)
    gf.gms_restore(cluster.gms_uri(1))
    assert gf.gms_status(cluster.gms_uri(1))["layout_hash"] == gf.gms_status(cluster.gms_uri(0))["layout_hash"]
    assert read_back(cluster.gms_uri(1))[3] == content


class BytesPath:
    def __fspath__(self):
        return b"/tmp/snap"


@pytest.mark.parametrize("call", [gf.gms_snapshot, gf.gms_restore])
def test_bad_arguments(cluster, call):
    uri = "unix:///nonexistent/gms.sock"  # never reached: the arguments are refused first
    with pytest.raises(TypeError):
        call(None)
    with pytest.raises(TypeError):
        call(b"unix:///x")
    with pytest.raises(ValueError, match="null"):
        call("unix:///x\0y")
    with pytest.raises(TypeError):
        call(uri, 5)
    with pytest.raises(TypeError):
        call(uri, b"/tmp/snap")
    with pytest.raises(TypeError, match="path of bytes"):
        call(uri, BytesPath())
    with pytest.raises(ValueError, match="null"):
        call(uri, "/tmp/a\0b")
    with pytest.raises(TypeError):
        call(uri, None, "60")
    with pytest.raises(TypeError):
        call(uri, None, True)
    for bad in (-1, -0.001, float("nan"), float("inf"), None):
        with pytest.raises(ValueError):
            call(uri, None, bad)
    with pytest.raises(TypeError):
        call(uri, None, 1, 2)
    with pytest.raises(TypeError):
        call(uri, directory="/tmp")
    gmsd(cluster, 0)
    with pytest.raises(ValueError, match="longer than"):
        call(cluster.gms_uri(0), "/" + "d" * 300, timeout=5)
    with pytest.raises(gf.UnreachableError):
        call(uri, "/tmp/snap", timeout=5)
    with pytest.raises(TypeError):
        gf.gms_tiers(cluster.gms_uri(0), "5")


# ---- PEP 475: a stopped GMS does not answer, so the call waits -------------

def stopped_gms(cluster, tmp_path, committed=False):
    """GMS 0 with a committed layout and a snapshot of it, and GMS 1 EMPTY;
    one of them (the committed one, or the EMPTY one) is stopped (SIGSTOP),
    so a request to it waits for an answer until SIGCONT."""
    _, snap = snapshot_of_a_layout(cluster, tmp_path)
    p = gmsd(cluster, 1)
    if committed:
        p = cluster.procs[0]
    p.p.send_signal(signal.SIGSTOP)
    return p, snap


def cont(p):
    p.p.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("snapshot", [False, True])
def test_raising_handler_ends_the_wait(cluster, tmp_path, alarm, snapshot):
    p, snap = stopped_gms(cluster, tmp_path, committed=snapshot)
    try:
        def raise_deadline(signum, frame):
            raise Deadline()

        signal.signal(signal.SIGALRM, raise_deadline)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        # Without PEP 475 handling this waits the whole minute (then TimeoutError).
        with pytest.raises(Deadline):
            if snapshot:
                gf.gms_snapshot(cluster.gms_uri(0), tmp_path / "other", timeout=60)
            else:
                gf.gms_restore(cluster.gms_uri(1), snap, timeout=60)
        assert time.monotonic() - t0 < 30  # a hang check, not a speed test
    finally:
        cont(p)
    # The request was sent: the GMS carries on with it once it runs again.
    if snapshot:
        wait_for(lambda: (tmp_path / "other" / "manifest.json").exists(), timeout=60,
                 what="the GMS to write the snapshot")
        first, second = (json.loads((d / "manifest.json").read_text()) for d in (snap, tmp_path / "other"))
        for m in (first, second):
            del m["created_unix_ms"]
        assert first == second  # the same layout, checksums included
    else:
        wait_for(lambda: gf.gms_status(cluster.gms_uri(1))["state"] == "COMMITTED", timeout=60,
                 what="the GMS to finish the restore")
        assert read_back(cluster.gms_uri(1)) == read_back(cluster.gms_uri(0))


def test_returning_handler_lets_the_call_finish(cluster, tmp_path, alarm):
    p, snap = stopped_gms(cluster, tmp_path)
    ran = []
    resumed = []
    signal.signal(signal.SIGALRM, lambda s, f: ran.append(time.monotonic()))

    def resume_later():
        try:
            wait_for(lambda: ran, timeout=60, what="the handler to run")
        finally:
            resumed.append(time.monotonic())
            cont(p)

    t = threading.Thread(target=resume_later)
    t.start()
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        gf.gms_restore(cluster.gms_uri(1), snap, timeout=120)
    finally:
        t.join()
    # The handler ran while the call was still waiting (before the GMS ran again).
    assert len(ran) == 1 and ran[0] < resumed[0]
    assert gf.gms_status(cluster.gms_uri(1))["state"] == "COMMITTED"


def test_returning_handler_keeps_the_remaining_timeout(cluster, tmp_path, alarm):
    p, snap = stopped_gms(cluster, tmp_path)
    ran = []
    signal.signal(signal.SIGALRM, lambda s, f: ran.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
    t0 = time.monotonic()
    try:
        with pytest.raises(gf.TimeoutError) as ei:
            gf.gms_restore(cluster.gms_uri(1), snap, timeout=1.0)
        elapsed = time.monotonic() - t0
        signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        cont(p)
    assert ei.value.name == "GF_ERR_TIMEOUT"
    assert ran
    # The whole timeout, once (the upper bound is only a hang check).
    assert 0.9 <= elapsed < 60


def test_gil_released_on_another_thread(cluster, tmp_path):
    p, snap = stopped_gms(cluster, tmp_path)
    out = []

    def call():
        try:
            gf.gms_restore(cluster.gms_uri(1), snap, timeout=1.0)
        except gf.TimeoutError as e:
            out.append(e)

    ticks = 0
    t = threading.Thread(target=call)
    try:
        t.start()
        while t.is_alive():
            ticks += 1
            time.sleep(0.001)
        t.join()
    finally:
        cont(p)
    assert len(out) == 1
    assert ticks > 50  # this thread ran while the other waited


def test_exit_while_the_request_is_pending(cluster, tmp_path):
    """A handler ended the wait and the interpreter exits while the request
    still waits for the GMS: a clean exit, no hang and no crash."""
    p, snap = stopped_gms(cluster, tmp_path)
    script = tmp_path / "exit.py"
    script.write_text(f"""
import signal, sys, gpufailover as gf
def stop(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGALRM, stop)
signal.setitimer(signal.ITIMER_REAL, 0.3)
try:
    gf.gms_restore({cluster.gms_uri(1)!r}, {str(snap)!r}, timeout=600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(7)
""")
    try:
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=child_env(),
                           timeout=120)
    finally:
        cont(p)
    assert r.returncode == 7 and "interrupted" in r.stdout, r.stdout + r.stderr
