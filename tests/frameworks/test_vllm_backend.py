# SPDX-License-Identifier: Apache-2.0
"""gpufailover.vllm against the installed vLLM: its plugin loader finds our
entry point in the built wheel, its factory resolves "gpufailover" to our
class, and suspend/resume/discard/state run against a real gf-gmsd (host
backend)."""
import gc
import signal
import subprocess
import sys
import types

import numpy as np
import pytest

from conftest import BUILD, SOURCE, child_env, cluster, gf, wait_for  # noqa: F401

import gpufailover.vllm as gfv  # noqa: E402
from vllm.device_allocator.sleep_mode_backend import SleepModeBackend, SleepModeBackendFactory  # noqa: E402


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    """The project's wheel unpacked into a directory (its real dist-info, entry points included)."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(SOURCE)], check=True, cwd=tmp)
    (wheel,) = (tmp / "dist").glob("gpufailover-*.whl")
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True)
    return site


def test_vllm_plugin_loader_discovers_the_entry_point(wheel_site):
    code = """
import gpufailover, gpufailover.vllm, vllm.plugins
from vllm.device_allocator.sleep_mode_backend import SleepModeBackend, SleepModeBackendFactory as F
assert gpufailover.__file__.startswith(%r), gpufailover.__file__
found = vllm.plugins.load_plugins_by_group(vllm.plugins.DEFAULT_PLUGINS_GROUP)
print("plugins", sorted(found))
vllm.plugins.load_general_plugins()
cls = F.get_backend_class("gpufailover")
print("class", cls.__module__, cls.__name__, issubclass(cls, SleepModeBackend), cls is gpufailover.vllm.GpuFailoverBackend)
""" % str(wheel_site)
    env = child_env()
    env["PYTHONPATH"] = str(wheel_site)
    env.pop("VLLM_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         cwd=wheel_site)
    assert out.returncode == 0, out.stderr
    assert "'gpufailover'" in out.stdout.split("plugins", 1)[1].splitlines()[0]
    assert "class gpufailover.vllm GpuFailoverBackend True True" in out.stdout


def test_the_wheel_ships_the_gf_vllm_console_script(wheel_site):
    """The wheel carries the launcher, its worker and the /dev/shm list, and
    pip installs the `gf-vllm` console script from it; the script runs."""
    for name in ("__init__.py", "__main__.py", "serve.py", "worker.py", "shm_files.py"):
        assert (wheel_site / "gpufailover" / "vllm" / name).is_file(), name
    (entry_points,) = wheel_site.glob("gpufailover-*.dist-info/entry_points.txt")
    assert "gf-vllm = gpufailover.vllm.serve:main" in entry_points.read_text()
    script = wheel_site / "bin" / "gf-vllm"
    env = child_env()
    env["PYTHONPATH"] = str(wheel_site)
    out = subprocess.run([script, "serve", "--help"], capture_output=True, text=True, env=env, timeout=120,
                         cwd=wheel_site)
    assert out.returncode == 0, out.stderr
    assert "gf-vllm serve MODEL [vLLM server arguments] --lock URI --gms URI --id ID" in out.stdout
    out = subprocess.run([script, "serve", "/m", "--lock", "unix:///x"], capture_output=True, text=True, env=env,
                         timeout=120, cwd=wheel_site)
    assert out.returncode == 2 and "--gms" in out.stderr


def test_factory_resolves_our_class_and_capabilities_are_truthful():
    gfv.register()
    gfv.register()  # vLLM may load plugins more than once per process
    cls = SleepModeBackendFactory.get_backend_class("gpufailover")
    assert cls is gfv.GpuFailoverBackend and issubclass(cls, SleepModeBackend)
    # The factory reads only model_config.sleep_mode_backend (a full ModelConfig needs a model).
    backend = SleepModeBackendFactory.create_backend(types.SimpleNamespace(sleep_mode_backend="gpufailover"))
    assert isinstance(backend, cls) and backend.state() == "RUNNING"
    assert cls.is_supported() is True
    assert cls.preserves_communicators() is True
    assert cls.preserves_compiled_artifacts() is True
    assert cls.preserves_graphs_with_communicators() is False
    assert cls.supports_durable_storage() is False
    with pytest.raises(ValueError, match="Unsupported sleep-mode backend"):
        SleepModeBackendFactory.get_backend_class("gpufailoverx")


def maps_perms(addr):
    """Permissions of the mapping holding addr in this process, or None."""
    for line in open("/proc/self/maps"):
        span, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= addr < hi:
            return perms[:3]
    return None


class Weights:
    def __init__(self, cluster, seed=1):
        self.cluster = cluster
        w = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
        a = w.allocate(1 << 20, "weights.0")
        self.data = np.random.default_rng(seed).integers(0, 255, 4096, dtype=np.uint8).tobytes()
        with memoryview(w.buffer(alloc_id=a)) as mv:
            mv[:4096] = self.data
        w.put_meta("model.embed.weight", a, 0, b'{"dtype":"U8","shape":[4096]}')
        w.commit()
        w.close()
        self.reader = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="ro", timeout=10)
        self.reader.map_all()
        self.calls = []
        gfv.attach(self.reader, remap_timeout=5, kv_release=lambda: self.calls.append("release"),
                   kv_restore=lambda: self.calls.append("restore"))

    def addr(self):
        return self.reader.allocations[0]["addr"]

    def content(self):
        with memoryview(self.reader.buffer("model.embed.weight", size=4096)) as mv:
            return bytes(mv)


@pytest.fixture
def backend():
    gfv.register()
    b = SleepModeBackendFactory.create_backend(types.SimpleNamespace(sleep_mode_backend="gpufailover"))
    yield b
    gfv.detach()


def test_suspend_unmaps_resume_remaps_at_the_same_addresses(cluster, backend):
    cluster.gmsd()
    w = Weights(cluster)
    addr = w.addr()
    assert w.content() == w.data and maps_perms(addr) == "r--"
    readers = gf.gms_status(cluster.gms_uri())["readers"]
    backend.suspend(level=1)
    assert backend.state() == "SUSPENDED"
    assert w.reader.mode is None                      # disconnected: no longer a reader of the GMS
    assert maps_perms(addr) == "---"                  # still reserved, no longer accessible
    assert gf.gms_status(cluster.gms_uri())["readers"] == readers - 1
    assert w.calls == ["release"]
    backend.suspend(level=2)                          # nothing released twice
    assert w.calls == ["release"]
    backend.resume()
    assert backend.state() == "RUNNING"
    assert w.addr() == addr and maps_perms(addr) == "r--"
    assert w.content() == w.data
    assert w.calls == ["release", "restore"]


def test_state_is_resuming_while_a_resume_runs(cluster, backend):
    cluster.gmsd()
    w = Weights(cluster)
    seen = []
    gfv.attach(w.reader, remap_timeout=5, kv_release=lambda: seen.append(("release", backend.state())),
               kv_restore=lambda: seen.append(("restore", backend.state(), maps_perms(w.addr()))))
    assert backend.state() == "RUNNING"
    backend.suspend()
    backend.resume()
    # Weights are mapped before the KV memory is made, inside RESUMING.
    assert seen == [("release", "RUNNING"), ("restore", "RESUMING", "r--")]
    assert backend.state() == "RUNNING"


def test_resume_by_tag_and_discard(cluster, backend):
    cluster.gmsd()
    w = Weights(cluster)
    backend.suspend()
    backend.resume(["kv_cache"])
    assert backend.state() == "SUSPENDED" and maps_perms(w.addr()) == "---"
    backend.resume(["weights"])
    assert backend.state() == "RUNNING" and maps_perms(w.addr()) == "r--"
    assert w.calls == ["release", "restore"]
    backend.discard(("kv_cache",))
    assert backend.state() == "SUSPENDED" and w.calls[-1] == "release" and maps_perms(w.addr()) == "r--"
    backend.resume(None)
    assert backend.state() == "RUNNING"
    with pytest.raises(ValueError, match="unknown sleep-mode tag"):
        backend.resume(["cudagraph"])
    with pytest.raises(ValueError, match="level must be 1 or 2"):
        backend.suspend(3)
    assert backend.state() == "RUNNING"


def test_stale_layout_is_a_clear_exception(cluster, backend):
    cluster.gmsd()
    w = Weights(cluster)
    backend.suspend()
    # Another layout is committed while this engine sleeps.
    other = gf.GMSClient(cluster.gms_uri(), gf.Memory("host"), mode="rw", timeout=10)
    a = other.allocate(2 << 20, "weights.0")
    other.put_meta("other.weight", a, 0, b"{}")
    other.commit()
    other.close()
    with pytest.raises(gf.StaleLayoutError):
        backend.resume()
    assert backend.state() == "SUSPENDED" and maps_perms(w.addr()) == "---"
    assert w.calls == ["release"]                     # all or nothing: no KV made for a failed wake


def test_fresh_gms_times_out_instead_of_hanging(cluster, backend):
    g = cluster.gmsd()
    w = Weights(cluster)
    gfv.attach(w.reader, remap_timeout=0.5)
    backend.suspend()
    g.kill(signal.SIGKILL)
    cluster.gmsd()                                    # restarted, empty: no weights will come
    with pytest.raises(gf.TimeoutError) as e:
        backend.resume()
    assert isinstance(e.value, TimeoutError)
    assert backend.state() == "SUSPENDED"


def test_live_tensor_refuses_suspend_and_nothing_changes(cluster, backend):
    cluster.gmsd()
    w = Weights(cluster)
    view = np.from_dlpack(w.reader.buffer("model.embed.weight", size=4096))
    with pytest.raises(BufferError):
        backend.suspend()
    assert backend.state() == "RUNNING" and maps_perms(w.addr()) == "r--" and w.calls == []
    del view
    gc.collect()
    backend.suspend()
    assert backend.state() == "SUSPENDED"


def test_unattached_and_bad_attach_are_clear_errors(backend):
    gfv.detach()
    with pytest.raises(gf.StateError, match="attach"):
        backend.suspend()
    assert backend.state() == "RUNNING"
    with pytest.raises(TypeError, match="GMSClient"):
        gfv.attach("unix:///run/gf/gms0.sock")
    with pytest.raises(TypeError, match="GMSClient"):
        gfv.attach([])


def test_importable_without_vllm():
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named " + repr(name))
sys.meta_path.insert(0, Block())
import gpufailover.vllm as v
print("imported", v.BACKEND_NAME)
for f in (lambda: v.GpuFailoverBackend, v.register):
    try:
        f()
    except ImportError as e:
        print("error:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "imported gpufailover" in out.stdout
    assert out.stdout.count("error: gpufailover.vllm needs vLLM") == 2


def test_an_attached_engine_sleeps_and_wakes_through_the_backend(cluster, backend):
    """With a gf.Engine attached, suspend is the engine's Init -> Standby and
    resume its grant and wake: the lock, on_grant, the private (KV) region
    backed at the address Init reserved. An engine that woke does not sleep
    again."""
    cluster.lockd()
    cluster.gmsd()

    def load(device, gms):
        a = gms.allocate(1 << 20, "weights.0")
        gms.put_meta("model.embed.weight", a, 0, b"{}")
        gms.commit()

    with pytest.raises(TypeError):
        gf.Engine(cluster.lock_uri, "e1", [cluster.gms_uri()], backend="host", keep_handles="no")
    eng = gf.Engine(cluster.lock_uri, "e1", [cluster.gms_uri()], backend="host", private_bytes=4 << 20,
                    keep_handles=False)
    try:
        eng.init_weights(load=load)
        kv_addr, kv_size = eng.private_memory(0)
        assert kv_size >= 4 << 20 and maps_perms(kv_addr) == "---"   # reserved, no memory behind it
        grants = []
        gfv.attach(eng, on_grant=lambda epoch: grants.append((epoch, eng.state)))
        assert gfv.attached_engine() is eng and gfv.attached() == [eng.gms(0)]
        backend.suspend(1)
        assert eng.state == "standby" and backend.state() == "SUSPENDED" and grants == []
        backend.suspend(2)                                            # already asleep: nothing to do
        assert eng.state == "standby"
        backend.resume()
        assert grants == [(eng.epoch, "waking")] and eng.epoch > 0
        assert eng.state == "waking" and backend.state() == "RUNNING"
        assert eng.private_memory(0) == (kv_addr, kv_size) and maps_perms(kv_addr) == "rw-"
        eng.serve()
        with pytest.raises(gf.StateError, match="only an engine in Init goes to Standby"):
            backend.suspend(1)
        assert eng.state == "active" and maps_perms(kv_addr) == "rw-"
    finally:
        gfv.detach()
        eng.close()
