# SPDX-License-Identifier: Apache-2.0
"""Residency tiers with real processes (docs/tiers.md): gf-gmsd keeping WARM and
COLD snapshots, SIGKILLed mid-snapshot and mid-restore, restarted from WARM
while a sleeping engine waits to remap the same layout, refusing a flipped
byte, a truncated file and another version (staying EMPTY for the loader),
gfctl gms snapshot|restore|tiers, and a full disk (a small tmpfs mounted when
permitted, else skipped with the reason)."""
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

GMSD = os.environ.get("GF_GMSD", "build/examples/gf-gmsd/gf-gmsd")
ENGINE = os.environ.get("GF_GMS_ENGINE", "build/tests/gms/gms-engine")
GFCTL = os.environ.get("GF_GFCTL", "build/examples/gfctl/gfctl")
MIB = 1 << 20


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="gf-tiers-")
    # WARM lives on a tmpfs like in production; one per test.
    warm = tempfile.mkdtemp(prefix="gf-tiers-warm-", dir="/dev/shm")
    yield d, warm
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(warm, ignore_errors=True)


class Gmsd:
    def __init__(self, sock, *args, wait_ready=True, env=None):
        self.sock = sock
        self.uri = "unix://" + sock
        self.log = tempfile.NamedTemporaryFile(prefix="gf-gmsd-", suffix=".log", delete=False)
        self.p = subprocess.Popen([GMSD, "--listen", self.uri, "--backend", "host", *args],
                                  stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        if wait_ready:
            self.wait_log('msg="ready"', 60)

    def text(self):
        with open(self.log.name) as f:
            return f.read()

    def wait_log(self, what, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if what in self.text():
                return
            if self.p.poll() is not None:
                raise AssertionError(f"gf-gmsd exited {self.p.returncode}:\n{self.text()}")
            time.sleep(0.02)
        raise AssertionError(f"no {what!r} in time:\n{self.text()}")

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            self.p.wait(30)
        os.unlink(self.log.name)


def gfctl(*args, check=True, timeout=120):
    r = subprocess.run([GFCTL, *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"gfctl {' '.join(args)}: {r.returncode}\n{r.stdout}{r.stderr}")
    return r


def status(g):
    return json.loads(gfctl("gms", "status", "--gms", g.uri, "--json").stdout)


def wait_phase(g, phases, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        op = status(g)["operation"]
        if op and op["phase"] in phases:
            return op
        time.sleep(0.02)
    raise AssertionError(f"operation not in {phases}: {status(g)['operation']}")


def engine(g, mode, *args):
    """Run gms-engine to completion (it reads one line where it pauses)."""
    r = subprocess.run([ENGINE, g.uri, mode, "--backend", "host", "--timeout", "20000", *args], input="\n",
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout


def load(g, seed, allocs=8, size=4 * MIB, meta=5):
    rc, out = engine(g, "rw", "--allocs", str(allocs), "--size", str(size), "--meta", str(meta), "--seed", str(seed))
    assert rc == 0 and "committed" in out and f"verified allocs={allocs}" in out, out
    return status(g)


def reader_verifies(g, seed, allocs=8):
    rc, out = engine(g, "ro", "--seed", str(seed))
    assert rc == 0 and f"verified allocs={allocs}" in out, out


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_crash_and_restore_from_warm(tmp):
    d, warm = tmp
    cold = os.path.join(d, "cold")
    g = Gmsd(os.path.join(d, "g.sock"), "--warm", warm, "--cold", cold)
    try:
        before = load(g, seed=7)
        op = wait_phase(g, ("Checkpointed", "Failed"))
        assert op["phase"] == "Checkpointed", op
        t = gfctl("gms", "tiers", "--gms", g.uri, "--json")
        tiers = json.loads(t.stdout)["tiers"]
        assert tiers["warm"]["present"] and tiers["cold"]["present"]
        assert tiers["warm"]["bytes"] == before["allocation_bytes"]
        human = gfctl("gms", "tiers", "--gms", g.uri).stdout
        assert "warm: dir=" in human and "present=yes" in human and "phase=Checkpointed" in human
        g.kill()
    finally:
        g.stop()
    g2 = Gmsd(os.path.join(d, "g.sock"), "--warm", warm, "--cold", cold)
    try:
        after = status(g2)
        assert after["state"] == "COMMITTED"
        assert after["layout_hash"] == before["layout_hash"] and after["generation"] == before["generation"]
        assert after["operation"]["kind"] == "restore" and after["operation"]["phase"] == "Restored"
        assert warm in after["operation"]["reason"]
        assert "tier=warm" in g2.text()
        reader_verifies(g2, seed=7)
    finally:
        g2.stop()


def test_sleeping_engine_remaps_after_gms_crash(tmp):
    """Decision 6 becomes wait, remap, serve: the engine sleeps through a GMS crash and a WARM restore."""
    d, warm = tmp
    sock = os.path.join(d, "g.sock")
    g = Gmsd(sock, "--warm", warm)
    e = None
    try:
        load(g, seed=11)
        wait_phase(g, ("Checkpointed",))
        e = subprocess.Popen([ENGINE, g.uri, "ro", "--backend", "host", "--seed", "11", "--sleep",
                              "--remap-timeout", "30000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = ""
        while "asleep" not in line:
            line = e.stdout.readline()
            assert line, "engine ended before sleeping"
        g.kill()
        g.stop()
        g = Gmsd(sock, "--warm", warm)
        e.stdin.write("\n")
        e.stdin.flush()
        out, _ = e.communicate(timeout=60)
        assert e.returncode == 0 and "awake" in out and "verified allocs=8" in out, out
    finally:
        if e and e.poll() is None:
            e.kill()
        g.stop()


def snapshot_to(d, name, seed):
    """A snapshot directory written by a real gf-gmsd on demand (gfctl gms snapshot --dir)."""
    g = Gmsd(os.path.join(d, name + ".sock"))
    try:
        st = load(g, seed=seed)
        out = os.path.join(d, name)
        r = gfctl("gms", "snapshot", "--gms", g.uri, "--dir", out)
        assert "Checkpointed" in r.stdout
        return out, st
    finally:
        g.stop()


@pytest.mark.parametrize("damage", ["flipped_byte", "truncated", "other_version"])
def test_refused_snapshot_leaves_gms_empty(tmp, damage):
    d, _ = tmp
    snap, _ = snapshot_to(d, "snap", seed=3)
    data = os.path.join(snap, "data.bin")
    if damage == "flipped_byte":
        flip_byte(data, os.path.getsize(data) // 3)
        words = "checksum mismatch"
    elif damage == "truncated":
        os.truncate(data, os.path.getsize(data) - 4096)
        words = "truncated"
    else:
        man = os.path.join(snap, "manifest.json")
        with open(man) as f:
            text = f.read()
        with open(man, "w") as f:
            f.write(text.replace('"version": 1', '"version": 2'))
        words = "format version 2"
    g = Gmsd(os.path.join(d, "g.sock"), "--restore", snap)
    try:
        assert "restore refused" in g.text() and words in g.text()
        st = status(g)
        assert st["state"] == "EMPTY" and st["allocation_count"] == 0
        assert st["operation"]["phase"] == "Failed" and words in st["operation"]["reason"]
        # The loader path still works.
        load(g, seed=4)
        reader_verifies(g, seed=4)
        # A restore into a GMS that is not EMPTY is refused.
        r = gfctl("gms", "restore", "--gms", g.uri, "--dir", snap, check=False)
        assert r.returncode != 0 and "not EMPTY" in r.stderr
    finally:
        g.stop()


def test_restore_on_demand(tmp):
    d, _ = tmp
    snap, st = snapshot_to(d, "snap", seed=5)
    g = Gmsd(os.path.join(d, "g.sock"))
    try:
        assert status(g)["state"] == "EMPTY"
        r = gfctl("gms", "restore", "--gms", g.uri, "--dir", snap)
        assert "Restored" in r.stdout
        after = status(g)
        assert after["state"] == "COMMITTED" and after["layout_hash"] == st["layout_hash"]
        reader_verifies(g, seed=5)
        r = gfctl("gms", "snapshot", "--gms", g.uri, check=False)
        assert r.returncode != 0 and "no --warm/--cold tier kept" in r.stderr
    finally:
        g.stop()


def test_event_lines_quote_a_path_with_a_space(tmp):
    """The GMS's events (its tiers' included) are made where their values are
    known: a tier path with a space and a quote reads back whole."""
    d, warm = tmp
    odd = os.path.join(warm, 'warm "tier" a')
    os.mkdir(odd)
    g = Gmsd(os.path.join(d, "g.sock"), "--warm", odd)
    try:
        load(g, seed=3)
        assert wait_phase(g, ("Checkpointed", "Failed"))["phase"] == "Checkpointed"
        lines = [ln for ln in g.text().splitlines() if "event=snapshot phase=Pending" in ln]
        assert lines, g.text()
        pairs = dict(kv.split("=", 1) for kv in shlex.split(lines[0]))
        assert pairs["event"] == "snapshot" and pairs["dir"] == odd, lines[0]
    finally:
        g.stop()


def test_sigkill_mid_snapshot_keeps_old_snapshot(tmp):
    d, _ = tmp
    cold = os.path.join(d, "cold")
    sock = os.path.join(d, "g.sock")
    g = Gmsd(sock, "--cold", cold)
    try:
        first = load(g, seed=1, allocs=2, size=MIB)
        wait_phase(g, ("Checkpointed",))
        # A larger layout replaces it; its snapshot is killed while being written (or, on a fast
        # machine, just after: either way what is on disk must be whole).
        second = load(g, seed=2, allocs=16, size=16 * MIB)
        wait_phase(g, ("Pending", "Checkpointing", "Checkpointed"), timeout=60)
        g.kill()
    finally:
        g.stop()
    leftovers = [n for n in os.listdir(d) if ".tmp-" in n]
    g = Gmsd(sock, "--restore", cold)
    try:
        st = status(g)
        assert st["state"] == "COMMITTED", g.text()
        assert st["layout_hash"] in (first["layout_hash"], second["layout_hash"])
        if st["layout_hash"] == first["layout_hash"]:
            reader_verifies(g, seed=1, allocs=2)
        else:
            reader_verifies(g, seed=2, allocs=16)
    finally:
        g.stop()
    # The next writer removes what the killed one left.
    g = Gmsd(sock, "--cold", cold)
    try:
        load(g, seed=9, allocs=2, size=MIB)
        wait_phase(g, ("Checkpointed",))
        assert not [n for n in os.listdir(d) if ".tmp-" in n], (leftovers, os.listdir(d))
    finally:
        g.stop()


def test_sigkill_mid_restore_then_clean_restart(tmp):
    d, warm = tmp
    sock = os.path.join(d, "g.sock")
    g = Gmsd(sock, "--warm", warm)
    try:
        before = load(g, seed=6, allocs=16, size=16 * MIB)
        wait_phase(g, ("Checkpointed",))
    finally:
        g.kill()
        g.stop()
    # Killed while restoring (before "ready"): nothing was ever served.
    g = Gmsd(sock, "--warm", warm, wait_ready=False)
    try:
        g.wait_log("phase=Restoring", 30)
        g.kill()
        assert 'msg="ready"' not in g.text() or "phase=Restored" in g.text()
    finally:
        g.stop()
    g = Gmsd(sock, "--warm", warm)
    try:
        st = status(g)
        assert st["state"] == "COMMITTED" and st["layout_hash"] == before["layout_hash"]
        reader_verifies(g, seed=6, allocs=16)
    finally:
        g.stop()


@contextlib.contextmanager
def mounted_tmpfs(path, options, why):
    """A tmpfs mounted at @path for the block (root only: skipped, saying why, otherwise)."""
    os.mkdir(path)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "gf-test", path], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount {why} (needs root with CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", path], check=False)


def test_disk_full_keeps_previous_snapshot(tmp):
    d, _ = tmp
    with mounted_tmpfs(os.path.join(d, "small"), "size=24m", "a small tmpfs") as mnt:
        cold = os.path.join(mnt, "cold")
        g = Gmsd(os.path.join(d, "g.sock"), "--cold", cold)
        try:
            first = load(g, seed=1, allocs=2, size=4 * MIB)
            assert wait_phase(g, ("Checkpointed", "Failed"))["phase"] == "Checkpointed"
            load(g, seed=2, allocs=8, size=4 * MIB)
            op = wait_phase(g, ("Checkpointed", "Failed"))
            assert op["phase"] == "Failed" and "no space left" in op["reason"], op
            tiers = status(g)["tiers"]
            assert tiers["cold"]["present"] and tiers["cold"]["generation"] == first["generation"]
            assert not [n for n in os.listdir(mnt) if ".tmp-" in n]
        finally:
            g.stop()


LOCKD = os.environ.get("GF_LOCKD", "build/examples/gf-lockd/gf-lockd")
C_ENGINE = os.environ.get("GF_C_ENGINE", "build/examples/c-engine/gf-c-engine")


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ports import free_port  # noqa: E402  (below the ephemeral range: see there)
from other_uid import for_other_uid  # noqa: E402


def write_safetensors(path, total_bytes, tensors):
    """U8 tensors of pseudo-random bytes (no two chunks alike), total_bytes in all."""
    each = total_bytes // tensors
    header, off = {}, 0
    for i in range(tensors):
        n = each + (i % 7) * 4099  # odd sizes: tensors do not end on alignment boundaries
        header[f"layer.{i:03d}.weight"] = {"dtype": "U8", "shape": [n], "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        left, k = off, 0
        while left:
            chunk = block[k % 977:] + block[:k % 977]  # rotate so repeated blocks still differ
            f.write(chunk[:min(left, len(chunk))])
            left -= min(left, len(chunk))
            k += 1
    return header, 8 + len(text)


def test_loader_and_restore_agree_byte_for_byte(tmp):
    """The safetensors loader's bytes, the WARM snapshot and a restored GMS are the same bytes.
    GF_TIERS_BIG_MIB sets the size (default 96 MiB; e.g. 3072 for a multi-GiB run by hand)."""
    d, warm = tmp
    mib = int(os.environ.get("GF_TIERS_BIG_MIB", "96"))
    model = os.path.join(d, "model.safetensors")
    header, data_start = write_safetensors(model, mib * MIB, tensors=24)
    lock_uri = "unix://" + os.path.join(d, "lock.sock")
    lockd = subprocess.Popen([LOCKD, "--listen", lock_uri, "--state-file", os.path.join(d, "lock.state")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    g = Gmsd(os.path.join(d, "g.sock"), "--warm", warm)
    eng = None
    try:
        eng = subprocess.Popen([C_ENGINE, "--lock", lock_uri, "--gms", g.uri, "--role", "loader", "--id", "loader",
                                "--port", str(free_port()), "--probe-port", str(free_port()), "--backend", "host",
                                "--weights", model],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_phase(g, ("Checkpointed", "Failed"), timeout=600)["phase"] == "Checkpointed", g.text()
        with open(os.path.join(warm, "manifest.json")) as f:
            man = json.load(f)
        allocs = {a["id"]: a for a in man["allocations"]}
        metas = {m["key"]: m for m in man["metadata"]}
        assert set(metas) == set(header)
        # Every tensor of the file is at its metadata's place in the snapshot.
        with open(model, "rb") as src, open(os.path.join(warm, "data.bin"), "rb") as snap:
            for name, t in header.items():
                a, b = t["data_offsets"]
                src.seek(data_start + a)
                m = metas[name]
                snap.seek(allocs[m["alloc_id"]]["offset"] + m["offset"])
                assert src.read(b - a) == snap.read(b - a), name
        before = status(g)
    finally:
        if eng:
            eng.kill()
            eng.wait(30)
        g.kill()
        g.stop()
    # A restored GMS holds the same bytes: snapshot it again and compare the whole data file.
    g = Gmsd(os.path.join(d, "g.sock"), "--warm", warm)
    try:
        after = status(g)
        assert after["layout_hash"] == before["layout_hash"] and after["state"] == "COMMITTED"
        again = os.path.join(d, "again")
        gfctl("gms", "snapshot", "--gms", g.uri, "--dir", again, timeout=600)
        with open(os.path.join(warm, "data.bin"), "rb") as x, open(os.path.join(again, "data.bin"), "rb") as y:
            while True:
                bx, by = x.read(1 << 24), y.read(1 << 24)
                assert bx == by
                if not bx:
                    break
    finally:
        g.stop()
        lockd.terminate()
        lockd.wait(30)


def http_get(port, path):
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_endpoint_reports_tiers(tmp):
    """gf-gmsd --metrics: the lock state, the layout and each tier's presence,
    size, age and the last operation's phase, in Prometheus text that
    promtool accepts; /status is the status JSON."""
    import re
    d, warm = tmp
    g = Gmsd(os.path.join(d, "g.sock"), "--warm", warm, "--metrics", "127.0.0.1:0")
    try:
        port = int(re.search(r'msg="metrics listening" address=\S+ port=(\d+)', g.text()).group(1))
        code, text = http_get(port, "/metrics")
        assert code == 200
        assert 'gf_gms_state{state="EMPTY"} 1' in text, text
        assert 'gf_gms_tier_present{tier="warm"} 0' in text
        load(g, 3)
        wait_phase(g, ["Checkpointed"])
        code, text = http_get(port, "/metrics")
        assert 'gf_gms_state{state="COMMITTED"} 1' in text, text
        assert "gf_gms_allocations 8\n" in text
        assert 'gf_gms_tier_present{tier="warm"} 1' in text
        size = int(re.search(r'gf_gms_tier_bytes\{tier="warm"\} (\d+)', text).group(1))
        assert size >= 8 * 4 * MIB
        assert 'gf_gms_operation_phase{operation="snapshot",phase="Checkpointed"} 1' in text
        assert "gf_gms_tier_age_seconds" in text
        promtool = shutil.which("promtool")
        if promtool:
            r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
        code, body = http_get(port, "/status")
        st = json.loads(body)
        assert code == 200 and st["state"] == "COMMITTED" and st["tiers"]["warm"]["present"]
        assert http_get(port, "/ready")[0] == 404
    finally:
        g.stop()


def test_metrics_bad_address_is_a_usage_error(tmp):
    d, _ = tmp
    r = subprocess.run([GMSD, "--listen", "unix://" + os.path.join(d, "g.sock"), "--backend", "host",
                        "--metrics", "localhost"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--metrics: expected ADDR:PORT" in r.stderr, r.stderr


def gfctl_as_nobody(*args, timeout=120):
    return subprocess.run([for_other_uid(GFCTL), *args], capture_output=True, text=True, timeout=timeout, user=65534,
                          group=65534)


def test_non_admin_names_only_the_kept_tiers(tmp):
    """An allowed non-admin uid may not point the GMS (root here) at a
    directory of its choice: no snapshot into a root-only directory, no
    restore of another tenant's root-only snapshot into an EMPTY GMS. The
    kept tiers stay its to ask for."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run gfctl as another uid")
    d, warm = tmp
    os.chmod(d, 0o755)
    private = os.path.join(d, "private")
    os.mkdir(private, 0o700)
    allow = ("--allow-uid", "0", "--allow-uid", "65534")
    g = Gmsd(os.path.join(d, "g.sock"), "--warm", warm, *allow)
    e = None
    try:
        os.chmod(g.sock, 0o777)
        st = load(g, seed=21)
        wait_phase(g, ("Checkpointed",))
        r = gfctl_as_nobody("gms", "snapshot", "--gms", g.uri, "--dir", os.path.join(private, "snap"))
        assert r.returncode != 0 and "only root or the server's own uid" in r.stderr, r.stdout + r.stderr
        assert not os.listdir(private)
        r = gfctl_as_nobody("gms", "snapshot", "--gms", g.uri, "--dir", warm)
        assert r.returncode == 0 and "Checkpointed" in r.stdout, r.stdout + r.stderr
        # Root's own snapshot in its private directory; another GMS, EMPTY.
        gfctl("gms", "snapshot", "--gms", g.uri, "--dir", os.path.join(private, "snap"))
        e = Gmsd(os.path.join(d, "e.sock"), *allow)
        os.chmod(e.sock, 0o777)
        r = gfctl_as_nobody("gms", "restore", "--gms", e.uri, "--dir", os.path.join(private, "snap"))
        assert r.returncode != 0 and "only root or the server's own uid" in r.stderr, r.stdout + r.stderr
        assert status(e)["state"] == "EMPTY"
        assert "event=restore_refused" in json.dumps(status(e))
        # Root may.
        gfctl("gms", "restore", "--gms", e.uri, "--dir", os.path.join(private, "snap"))
        assert status(e)["layout_hash"] == st["layout_hash"]
    finally:
        if e:
            e.stop()
        g.stop()


def test_symlinked_manifest_is_refused_without_quoting_it(tmp):
    """A snapshot directory whose manifest.json is a symlink (here to
    /etc/shadow) is refused by name; nothing of the target shows in the error."""
    d, _ = tmp
    evil = os.path.join(d, "evil")
    os.mkdir(evil)
    os.symlink("/etc/shadow" if os.path.exists("/etc/shadow") else "/etc/passwd", os.path.join(evil, "manifest.json"))
    open(os.path.join(evil, "data.bin"), "wb").close()
    g = Gmsd(os.path.join(d, "g.sock"))
    try:
        r = gfctl("gms", "restore", "--gms", g.uri, "--dir", evil, check=False)
        assert r.returncode != 0 and "manifest.json" in r.stderr, r.stderr
        assert "root" not in r.stderr and "near" not in r.stderr, r.stderr
        assert status(g)["state"] == "EMPTY"
    finally:
        g.stop()


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.mark.parametrize("which", ["manifest.json", "data.bin"])
def test_fifo_in_a_snapshot_is_refused_and_the_gms_keeps_serving(tmp, which):
    """A FIFO named manifest.json (or data.bin) is refused as not a regular
    file; opening it never blocks the GMS, which keeps answering everyone."""
    d, _ = tmp
    snap, _ = snapshot_to(d, "snap", seed=23)
    os.unlink(os.path.join(snap, which))
    os.mkfifo(os.path.join(snap, which))
    g = Gmsd(os.path.join(d, "g.sock"))
    try:
        r = gfctl("gms", "restore", "--gms", g.uri, "--dir", snap, "--timeout", "10s", check=False, timeout=60)
        assert r.returncode != 0 and "not a regular file" in r.stderr, r.stdout + r.stderr
        assert status(g)["state"] == "EMPTY"
        load(g, seed=24)
    finally:
        g.stop()


def test_sparse_manifest_is_refused_without_being_read(tmp):
    """A sparse 1 GiB manifest.json (under the size bound) is refused at its
    first byte: the GMS never reads it whole into memory."""
    d, _ = tmp
    snap, _ = snapshot_to(d, "snap", seed=25)
    man = os.path.join(snap, "manifest.json")
    os.unlink(man)
    with open(man, "wb") as f:
        f.truncate(1 << 30)
    g = Gmsd(os.path.join(d, "g.sock"))
    try:
        r = gfctl("gms", "restore", "--gms", g.uri, "--dir", snap, "--timeout", "60s", check=False)
        assert r.returncode != 0 and "not JSON: line 1" in r.stderr, r.stdout + r.stderr
        assert vm_hwm_kib(g.p.pid) < 256 * 1024, "the manifest was read into memory"
        assert status(g)["state"] == "EMPTY"
    finally:
        g.stop()


class OpenGate:
    """Holds every open of one file until allowed (fanotify FAN_OPEN_PERM; root only).
    With tids=True an event names the opening thread, not its process."""
    FAN_CLASS_CONTENT, FAN_CLOEXEC, FAN_MARK_ADD, FAN_OPEN_PERM, FAN_ALLOW = 0x4, 0x1, 0x1, 0x10000, 0x1
    FAN_REPORT_TID = 0x100

    def __init__(self, path, tids=False):
        import ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int,
                                            ctypes.c_char_p]
        flags = self.FAN_CLASS_CONTENT | self.FAN_CLOEXEC | (self.FAN_REPORT_TID if tids else 0)
        self.fd = self.libc.fanotify_init(flags, os.O_RDONLY)
        if self.fd < 0:
            pytest.skip(f"fanotify unavailable: {os.strerror(ctypes.get_errno())}")
        if self.libc.fanotify_mark(self.fd, self.FAN_MARK_ADD, self.FAN_OPEN_PERM, -100, path.encode()) < 0:
            os.close(self.fd)
            pytest.skip(f"fanotify permission events unavailable: {os.strerror(ctypes.get_errno())}")

    def wait_open(self, timeout=60):
        """The next open of the file, held: (pid or tid, event fd)."""
        import select
        import struct
        assert select.select([self.fd], [], [], timeout)[0], "nobody opened the file"
        buf = os.read(self.fd, 4096)
        _, _, _, _, _, fd, pid = struct.unpack_from("IBBHQii", buf)
        return pid, fd

    def allow(self, fd):
        import struct
        os.write(self.fd, struct.pack("iI", fd, self.FAN_ALLOW))
        os.close(fd)

    def close(self):
        os.close(self.fd)  # any open still held is allowed


def test_client_restore_runs_off_the_loop(tmp):
    """A restore a client asks for runs on the tier worker: while it waits
    on data.bin (held open here), the GMS answers everyone else."""
    if os.geteuid() != 0:
        pytest.skip("needs root for fanotify")
    d, _ = tmp
    snap, st = snapshot_to(d, "snap", seed=27)
    g = Gmsd(os.path.join(d, "g.sock"))
    gate = OpenGate(os.path.join(snap, "data.bin"))
    r = None
    try:
        r = subprocess.Popen([GFCTL, "gms", "restore", "--gms", g.uri, "--dir", snap], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        pid, fd = gate.wait_open()
        assert pid == g.p.pid
        now = status(g)
        assert now["state"] == "EMPTY" and now["operation"]["phase"] == "Restoring", now
        gate.allow(fd)
        out, err = r.communicate(timeout=120)
        assert r.returncode == 0 and "Restored" in out, out + err
        assert status(g)["layout_hash"] == st["layout_hash"]
    finally:
        gate.close()
        if r and r.poll() is None:
            r.kill()
            r.wait()
        g.stop()
