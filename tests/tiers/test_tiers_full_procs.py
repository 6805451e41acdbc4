# SPDX-License-Identifier: Apache-2.0
"""Tiers that fill up (docs/tiers.md, "When WARM is full"), with gf-gmsd and a
small tmpfs as WARM (mounted by the test when permitted, else skipped with the
reason): a commit whose snapshot does not fit beside WARM's older one evicts
that one first; one that does not fit at all spills to COLD alone (and the
stale WARM copy goes, so a restart restores the current layout from COLD); a
demotion with WARM full goes to COLD."""
import os
import shutil
import signal
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_demote_procs as dp  # noqa: E402
import test_tiers_procs as tp  # noqa: E402

MIB = 1 << 20


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="gf-tiers-full-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def snapshot_of(g):
    return tp.wait_phase(g, ("Checkpointed", "Failed"))


def test_full_warm_evicts_then_spills_to_cold(tmp):
    d = tmp
    cold = os.path.join(d, "cold")
    with tp.mounted_tmpfs(os.path.join(d, "small"), "size=40m", "a 40 MiB tmpfs as WARM") as mnt:
        warm = os.path.join(mnt, "warm")
        g = tp.Gmsd(os.path.join(d, "g.sock"), "--warm", warm, "--cold", cold)
        try:
            first = tp.load(g, seed=1, allocs=8)  # 32 MiB: WARM has room
            op = snapshot_of(g)
            assert op["phase"] == "Checkpointed" and "; " not in op["reason"], op
            # Another 32 MiB layout (more metadata: another layout hash) fits only without the first.
            second = tp.load(g, seed=2, allocs=8, meta=6)
            assert second["layout_hash"] != first["layout_hash"]
            op = snapshot_of(g)
            assert op["phase"] == "Checkpointed" and "evicted to make room" in op["reason"], op
            tiers = tp.status(g)["tiers"]
            assert tiers["warm"]["present"] and tiers["warm"]["generation"] == second["generation"], tiers
            assert tiers["cold"]["present"] and tiers["cold"]["generation"] == second["generation"], tiers
            assert 'msg="evicting the older snapshot"' in g.text()
            # 48 MiB cannot fit in WARM at all: COLD alone, and WARM's stale copy is gone.
            third = tp.load(g, seed=3, allocs=12)
            op = snapshot_of(g)
            assert op["phase"] == "Checkpointed" and "spilled to cold" in op["reason"], op
            assert cold in op["reason"] and warm not in op["reason"].split(";")[0], op
            tiers = tp.status(g)["tiers"]
            assert not tiers["warm"]["present"] and tiers["cold"]["generation"] == third["generation"], tiers
            assert not [n for n in os.listdir(mnt) if ".tmp-" in n]
            # A restart restores the current layout, from COLD.
            g.kill()
            g.stop()
            g = tp.Gmsd(os.path.join(d, "g.sock"), "--warm", warm, "--cold", cold)
            st = tp.status(g)
            assert st["state"] == "COMMITTED" and st["layout_hash"] == third["layout_hash"], st
            tp.reader_verifies(g, seed=3, allocs=12)
        finally:
            g.stop()


def test_demotion_with_warm_full_goes_to_cold(tmp):
    d = tmp
    cold = os.path.join(d, "cold")
    with tp.mounted_tmpfs(os.path.join(d, "small"), "size=16m", "a 16 MiB tmpfs as WARM") as mnt:
        warm = os.path.join(mnt, "warm")
        g = dp.gmsd(d, "--warm", warm, "--cold", cold)
        try:
            before = tp.load(g, seed=5, allocs=8)  # 32 MiB: never fits in WARM
            op = snapshot_of(g)
            assert op["phase"] == "Checkpointed" and "spilled to cold" in op["reason"], op
            assert tp.status(g)["tiers"]["cold"]["present"]
            dp.past_min_resident(g)
            r = dp.demote(g)
            assert r.returncode == 0 and "demoted to=cold" in r.stdout, r.stdout + r.stderr
            assert "event=demote phase=snapshot" not in g.text(), "COLD already held the layout"
            st = tp.status(g)
            assert st["state"] == "EMPTY" and st["resident_tier"] == "cold"
            assert "no room in warm: hot to cold" in st["last_demotion"]["detail"], st["last_demotion"]
            tp.reader_verifies(g, seed=5)
            assert tp.status(g)["layout_hash"] == before["layout_hash"]
        finally:
            g.stop()
