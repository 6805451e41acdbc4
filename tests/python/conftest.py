# SPDX-License-Identifier: Apache-2.0
"""Fixtures: real gf-lockd / gf-gmsd processes from the build tree, each in a
private directory, stopped and reaped after the test."""
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import pytest

BUILD = pathlib.Path(os.environ.get("GF_BUILD_ROOT", pathlib.Path(__file__).parents[2] / "build"))
SOURCE = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
sys.path.insert(0, str(BUILD / "bindings" / "python"))

import gpufailover as gf  # noqa: E402

LOCKD = BUILD / "examples" / "gf-lockd" / "gf-lockd"
GMSD = BUILD / "examples" / "gf-gmsd" / "gf-gmsd"
C_ENGINE = BUILD / "examples" / "c-engine" / "gf-c-engine"
PY_ENGINE = SOURCE / "examples" / "python-engine" / "engine.py"


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(BUILD / "bindings" / "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("GF_LOG", "info")
    return env


class Proc:
    def __init__(self, argv, log):
        self.argv = [str(a) for a in argv]
        self.log = log
        self.start()

    def start(self):
        self.out = open(self.log, "ab")
        self.p = subprocess.Popen(self.argv, stdout=self.out, stderr=subprocess.STDOUT, env=child_env(),
                                  start_new_session=True)

    def kill(self, sig=signal.SIGKILL):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.out.close()

    def text(self):
        return pathlib.Path(self.log).read_text(errors="replace")



class Deadline(Exception):
    pass


@pytest.fixture
def alarm():
    """Install a SIGALRM handler for the test and restore the old one after."""
    old = signal.getsignal(signal.SIGALRM)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def wait_for(pred, timeout=10.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except gf.GpuFailoverError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def load_one_tensor(device, gms):
    """An engine's load callback: one 1 MiB allocation under the name "w", committed."""
    gms.put_meta("w", gms.allocate(1 << 20, "w"), 0, b"x")
    gms.commit()


def held_lock(cluster):
    """A lock server, and a client holding its lock (the caller releases it)."""
    cluster.lockd()
    holder = gf.LockClient(cluster.lock_uri, "holder")
    holder.acquire(timeout=5)
    return holder


def waiter_queued(cluster, name):
    return any(w["id"] == name for w in gf.lock_status(cluster.lock_uri)["waiters"])


def sleeping_engine(cluster, name):
    """A lock held by another client, a GMS, and an engine of @name that loaded
    one tensor and sleeps, ready to queue: (holder, engine)."""
    holder = held_lock(cluster)
    cluster.gmsd()
    eng = gf.Engine(cluster.lock_uri, name, [cluster.gms_uri()], backend="host")
    eng.init_weights(load=load_one_tensor)
    eng.sleep()
    return holder, eng


class Cluster:
    """A lock server and GMS servers in one temp dir."""

    def __init__(self, tmp):
        self.dir = tmp
        self.procs = []
        self.lock_uri = f"unix://{tmp}/lock.sock"

    def spawn(self, name, argv):
        p = Proc(argv, f"{self.dir}/{name}.log")
        self.procs.append(p)
        return p

    def lockd(self, *extra):
        p = self.spawn("gf-lockd", [LOCKD, f"--listen={self.lock_uri}", f"--state-file={self.dir}/lock.state",
                                    "--reconnect-window=500ms", "--exit-wait-timeout=5s", *extra])
        wait_for(lambda: gf.lock_status(self.lock_uri, 0.2), what="gf-lockd")
        return p

    def gms_uri(self, n=0):
        return f"unix://{self.dir}/gms{n}.sock"

    def gmsd(self, n=0, *extra):
        p = self.spawn(f"gf-gmsd-{n}", [GMSD, f"--listen={self.gms_uri(n)}", "--device=0", "--backend=host", *extra])
        wait_for(lambda: gf.gms_status(self.gms_uri(n), 0.2), what="gf-gmsd")
        return p

    def stop(self):
        for p in reversed(self.procs):
            p.kill(signal.SIGTERM)


@pytest.fixture
def cluster():
    with tempfile.TemporaryDirectory(prefix="gf-py-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as d:
        c = Cluster(d)
        yield c
        c.stop()
