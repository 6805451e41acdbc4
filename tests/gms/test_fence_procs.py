# SPDX-License-Identifier: Apache-2.0
"""gf-gmsd --lock with real processes: a stray RW request (no grant) while a
layout is committed and read is refused when it arrives, so it never queues
behind the readers and keeps a waking standby out (docs/gms.md)."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tiers"))
import test_tiers_procs as tp  # noqa: E402  (tests/tiers: the gf-gmsd, gfctl and engine helpers)

LOCKD = os.environ.get("GF_LOCKD", "build/examples/gf-lockd/gf-lockd")


def test_stray_writer_is_refused_on_arrival(tmp_path):
    lock_uri = f"unix://{tmp_path}/lock.sock"
    lockd = subprocess.Popen([LOCKD, "--listen", lock_uri], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    g = primary = None
    try:
        end = time.monotonic() + 30
        while not os.path.exists(f"{tmp_path}/lock.sock"):
            assert time.monotonic() < end and lockd.poll() is None, "gf-lockd did not start"
            time.sleep(0.02)
        g = tp.Gmsd(str(tmp_path / "g.sock"), "--lock", lock_uri)
        tp.load(g, seed=31)
        # The active engine reads the committed weights and keeps them.
        primary = subprocess.Popen([tp.ENGINE, g.uri, "ro", "--backend", "host", "--timeout", "20000", "--seed",
                                    "31", "--hold"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert primary.stdout.readline().startswith("granted=RO")
        # A stray writer with a long timeout: refused at once, not queued for 20 s.
        rc, out = tp.engine(g, "rw")
        assert rc != 0 and "error=GF_ERR_PERMISSION" in out, out
        # The standby maps beside the primary.
        tp.reader_verifies(g, seed=31)
        st = tp.status(g)
        assert st["fence_refusals"] == 1 and st["waiters"] == 0, st
    finally:
        if primary and primary.poll() is None:
            primary.kill()
            primary.wait()
        if g:
            g.stop()
        lockd.terminate()
        lockd.wait(timeout=10)
