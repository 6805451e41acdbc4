# SPDX-License-Identifier: Apache-2.0
"""gpufailover for vLLM: the sleep-mode backend ``gpufailover`` and the
``gf-vllm`` launcher (:mod:`gpufailover.vllm.serve`), which runs vLLM's
OpenAI API server as one member of a primary/standby pair with its worker
(:mod:`gpufailover.vllm.worker`).

The backend puts what is attached to sleep and wakes it: an :class:`Engine`
(the worker's: sleep is the engine's Init -> Standby, wake the lock's grant,
the memory gate, the private KV region backed and the weights remapped at
their addresses), or GMS clients (sleep unmaps the weights the GPU Memory
Service lends, which stay resident there; wake maps them again at the same
addresses). Every sleep and wake of a gf-vllm server goes through it:
vLLM's ``/sleep`` and ``/wake_up`` and the launcher's own steps alike.

vLLM finds it through the ``vllm.general_plugins`` entry point
(``gpufailover = "gpufailover.vllm:register"``), which registers the class
with ``SleepModeBackendFactory`` under the name ``gpufailover``; a model
config with ``sleep_mode_backend = "gpufailover"`` selects it.

This module imports without vLLM; :data:`GpuFailoverBackend` and
:func:`register` need it and raise ImportError naming the missing package.
:class:`Engine` and :class:`LockClient` are re-exported here.
"""
import json
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence, Tuple, Type, Union, cast

from .. import _gpufailover as _gf
from .._gpufailover import Engine, GMSClient, LockClient

if TYPE_CHECKING:
    from vllm.device_allocator.sleep_mode_backend import SleepModeBackend as _SleepModeBackend  # type: ignore[import-not-found, unused-ignore]

BACKEND_NAME = "gpufailover"
# vLLM's tags: weights live in the GMS; the KV cache is the engine's private memory.
TAGS = ("weights", "kv_cache")

# GpuFailoverBackend is public too, but resolved by name only (module
# __getattr__ below): listing it here would make `import *` import vLLM.
__all__ = ["BACKEND_NAME", "Engine", "LockClient", "TAGS", "attach", "attached", "attached_engine",
           "check_entry", "describe", "detach", "pack", "register"]

# The weight layout every gpufailover vLLM worker (CPU or GPU) writes and
# reads: one metadata entry per parameter name in vLLM's model, value = JSON
# {"dtype": "float32", "shape": [...], "stride": [...]} (dtype as torch names
# it, stride in elements), at the parameter's first element. A name that is
# another name of the same bytes (tied embeddings) adds "alias_of": the first
# name, at the same place; one the model writes after loading adds
# "private": true (each engine copies it). Allocations are the writer's business: one packed allocation on the
# host backend, one per tensor through the pluggable allocator on a GPU.
PARAM_ALIGN = 256


def pack(sizes: Iterable[int]) -> Tuple[list[int], int]:
    """Offsets of tensors of @sizes bytes packed in order, each PARAM_ALIGN-
    aligned, and the total size."""
    offsets, end = [], 0
    for n in sizes:
        off = (end + PARAM_ALIGN - 1) // PARAM_ALIGN * PARAM_ALIGN
        offsets.append(off)
        end = off + n
    return offsets, end


def describe(dtype: str, shape: Sequence[int], stride: Sequence[int], *, alias_of: Optional[str] = None,
             private: bool = False) -> bytes:
    """The metadata value of one parameter. ``alias_of``: the name this one
    is another name of (the same bytes: tied embeddings); ``private``: the
    model writes it after loading, so each engine works on a copy."""
    desc: dict[str, Any] = {"dtype": dtype, "shape": list(shape), "stride": list(stride)}
    if alias_of is not None:
        desc["alias_of"] = alias_of
    if private:
        desc["private"] = True
    return json.dumps(desc, separators=(",", ":")).encode()


def check_entry(metadata: Mapping[str, Mapping[str, Any]], name: str, dtype: str,
                shape: Sequence[int]) -> Tuple[int, list[int]]:
    """The address and stride of parameter @name in a committed layout
    (``GMSClient.metadata``), checked against the dtype and shape the model
    needs: StaleLayoutError when the layout lacks it or holds another one."""
    entry = metadata.get(name)
    if entry is None:
        raise _gf.StaleLayoutError(f"the GMS layout has no parameter {name}: another model was loaded")
    try:
        desc = json.loads(entry["value"])
        have = (str(desc["dtype"]), [int(n) for n in desc["shape"]])
        stride = [int(n) for n in desc["stride"]]
    except (ValueError, KeyError, TypeError) as e:
        raise _gf.StaleLayoutError(f"parameter {name}: the GMS entry is not a gpufailover vLLM layout ({e})") from None
    if have != (dtype, list(shape)) or len(stride) != len(shape):
        raise _gf.StaleLayoutError(f"parameter {name}: the GMS holds {have[0]} {have[1]}, the model needs "
                                   f"{dtype} {list(shape)}: another model was loaded")
    return int(entry["addr"]), stride


_Hook = Optional[Callable[[], object]]


class _Attachment:
    def __init__(self, engine: Optional[Engine], clients: list[GMSClient], remap_timeout: float,
                 kv_release: _Hook, kv_restore: _Hook, gate: _Hook,
                 on_grant: Optional[Callable[[int], object]]) -> None:
        self.engine = engine
        self.on_grant = on_grant
        self.clients = clients
        self.remap_timeout = remap_timeout
        self.kv_release = kv_release
        self.kv_restore = kv_restore
        self.gate = gate
        # Per-resource state (no double release, no half-done wake).
        self.weights_mapped = True
        self.kv_held = True


_lock = threading.Lock()
_attachment: Optional[_Attachment] = None


def attach(target: Union[Engine, GMSClient, Sequence[GMSClient]], *, remap_timeout: float = 30.0,
           kv_release: _Hook = None, kv_restore: _Hook = None, gate: _Hook = None,
           on_grant: Optional[Callable[[int], object]] = None) -> None:
    """Give this process's sleep-mode backend what it puts to sleep and wakes.

    ``target``: an :class:`Engine` after ``init_weights()`` (the engine's
    state machine then runs every sleep and wake: suspend is the engine's
    ``sleep()``, resume its ``acquire()`` and ``wake_up()``, so a wake holds
    the lock), or a :class:`GMSClient` (or a list, one per device) whose
    weights are mapped now (sleep unmaps, wake remaps; tensor-parallel
    ranks >= 1 and engines that take no lock).
    ``remap_timeout``: seconds a client wake waits for the GMS (finite: a
    fresh GMS without weights must fail the wake, not hang it); an engine
    has its own.
    ``kv_release()``: called before the weights are unmapped (the engine's
    KV memory goes with its sleep: the hook drops what Init used in its
    place). ``kv_restore()``: called once the weights are back (with an
    engine, its private region is backed by then). ``gate()``: called before
    a client wake maps anything; it blocks until this process may wake
    (tensor-parallel ranks >= 1: until rank 0 holds the lock).
    Replaces an earlier attachment.
    """
    engine: Optional[Engine] = None
    clients: list[Any]
    if isinstance(target, Engine):
        engine = target
        clients = []
    else:
        clients = list(target) if isinstance(target, (list, tuple)) else [target]
        if not clients or not all(isinstance(c, GMSClient) for c in clients):
            raise TypeError("attach() needs an Engine, a GMSClient or a non-empty list of GMSClients")
    if not isinstance(remap_timeout, (int, float)) or isinstance(remap_timeout, bool) or not (
            0 < remap_timeout < float("inf")):
        raise ValueError("remap_timeout must be a finite number of seconds > 0")
    for name, fn in (("kv_release", kv_release), ("kv_restore", kv_restore), ("gate", gate),
                     ("on_grant", on_grant)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable or None")
    a = _Attachment(engine, clients, float(remap_timeout), kv_release, kv_restore, gate, on_grant)
    if engine is not None:
        # An engine in Init has its weights mapped and Init's KV stand-in;
        # from Standby on it holds neither until its wake.
        a.weights_mapped = a.kv_held = engine.state in ("init", "waking", "active")
    global _attachment
    with _lock:
        _attachment = a


def detach() -> None:
    """Forget the attachment (the backend then refuses to sleep or wake)."""
    global _attachment
    with _lock:
        _attachment = None


def attached() -> list[GMSClient]:
    """The attached GMS clients (an engine's, one per device), or an empty list."""
    with _lock:
        a = _attachment
    if a is None:
        return []
    if a.engine is not None:
        return [a.engine.gms(i) for i in range(len(_engine_devices(a.engine)))]
    return list(a.clients)


def attached_engine() -> Optional[Engine]:
    """The attached engine, or None."""
    with _lock:
        return _attachment.engine if _attachment else None


def _engine_devices(engine: Engine) -> list[int]:
    devices: list[int] = []
    while True:
        try:
            engine.gms(len(devices))
        except (IndexError, ValueError, _gf.GpuFailoverError):
            return devices
        devices.append(len(devices))


def _tags(tags: Optional[Iterable[str]]) -> Tuple[str, ...]:
    chosen = TAGS if tags is None else tuple(tags)
    unknown = [t for t in chosen if t not in TAGS]
    if unknown:
        raise ValueError(f"unknown sleep-mode tag(s) {unknown}: the gpufailover backend knows {list(TAGS)}")
    return chosen


def _current() -> _Attachment:
    with _lock:
        a = _attachment
    if a is None:
        raise _gf.StateError("the gpufailover sleep-mode backend has nothing attached: call "
                             "gpufailover.vllm.attach(engine or gms) in the worker after loading the weights")
    return a


def _unmap(a: _Attachment) -> None:
    if a.weights_mapped:
        done: list[GMSClient] = []
        try:
            for c in a.clients:
                c.unmap()
                done.append(c)
        except BaseException:
            # All or nothing: map again what this call unmapped.
            for c in done:
                c.remap(a.remap_timeout)
            raise
        a.weights_mapped = False


def _remap(a: _Attachment) -> None:
    if not a.weights_mapped:
        done: list[GMSClient] = []
        try:
            for c in a.clients:
                c.remap(a.remap_timeout)
                done.append(c)
        except BaseException:
            for c in done:
                c.unmap()
            raise
        a.weights_mapped = True


def _release_kv(a: _Attachment) -> None:
    if a.kv_held:
        if a.kv_release is not None:
            a.kv_release()
        a.kv_held = False


def _restore_kv(a: _Attachment) -> None:
    if not a.kv_held:
        if a.kv_restore is not None:
            a.kv_restore()
        a.kv_held = True


def _engine_sleep(a: _Attachment) -> None:
    """Init -> Standby. An engine sleeps once: after its wake it serves
    until its process ends, and the standby takes over."""
    eng = a.engine
    assert eng is not None
    state = eng.state
    if state == "standby":
        return
    if state != "init":
        raise _gf.StateError(f"the gpufailover engine is {state}: only an engine in Init goes to Standby (an engine "
                             "that woke serves until its process ends; the standby takes over)")
    _release_kv(a)
    eng.sleep()
    a.weights_mapped = False


def _is_rank_engine(eng: Engine) -> bool:
    return int(eng.state_info().get("rank", 0)) >= 1


def _engine_wake(a: _Attachment) -> None:
    """Standby -> Waking: the lock's grant, the memory gate, the private
    (KV) region backed and the weights remapped at their addresses, all by
    the engine (all-or-nothing; a failed wake leaves it Dead)."""
    eng = a.engine
    assert eng is not None
    state = eng.state
    if state == "standby" and _is_rank_engine(eng):
        # A rank >= 1 holds no lock: it wakes with rank 0's grant.
        if a.gate is None:
            raise _gf.StateError("a rank engine wakes with rank 0's epoch: attach it with gate=")
        epoch = int(cast(Any, a.gate()))
        eng.wake_as_rank(epoch)
        state = eng.state
    elif state == "standby":
        epoch = eng.acquire()
        state = eng.state
        if a.on_grant is not None and state == "waking":
            try:
                a.on_grant(epoch)
            except BaseException as e:
                eng.mark_dead(f"wake failed: {e}")
                raise
    if state == "waking" and not a.weights_mapped:
        eng.wake_up()
        a.weights_mapped = True
    elif state not in ("waking", "active"):
        raise _gf.StateError(f"the gpufailover engine is {state}: it wakes only from Standby")
    _restore_kv(a)


# The backend's methods, gathered into a class by _make_backend_class() once
# vLLM's base class is there. They are module functions, not a class body in
# that function, because type checkers list a class made in a function as a
# symbol of the module, which it is not at run time.

def _suspend(self: Any, level: int = 1) -> None:
    # Both levels keep the weights resident in the GMS: there is
    # nothing to copy out (level 1) or to reload (level 2).
    if level not in (1, 2):
        raise ValueError(f"sleep level must be 1 or 2, not {level!r}")
    a = _current()
    if a.engine is not None:
        _engine_sleep(a)
    else:
        _unmap(a)
        _release_kv(a)
    self._state = "SUSPENDED"


def _resume(self: Any, tags: Optional[Iterable[str]] = None) -> None:
    chosen = _tags(tags)
    a = _current()
    before, remapped = self._state, False
    self._state = "RESUMING"
    try:
        if a.engine is not None:
            # One grant wakes both: an engine holding the lock serves
            # with its weights and its KV cache.
            _engine_wake(a)
        else:
            if a.gate is not None and not a.weights_mapped:
                a.gate()
            if "weights" in chosen and not a.weights_mapped:
                _remap(a)
                remapped = True
            if "kv_cache" in chosen:
                _restore_kv(a)
    except BaseException:
        if remapped:
            _unmap(a)
        self._state = before
        raise
    self._state = "RUNNING" if a.weights_mapped and a.kv_held else "SUSPENDED"


def _discard(self: Any, tags: Iterable[str]) -> None:
    chosen = _tags(tags)
    a = _current()
    if a.engine is not None:
        _engine_sleep(a)  # an engine lets go of weights and KV together
    else:
        # Weights cannot be lost: the GMS keeps them; discarding only unmaps.
        if "weights" in chosen:
            _unmap(a)
        if "kv_cache" in chosen:
            _release_kv(a)
    self._state = "SUSPENDED"


# What vLLM asks of a backend class, and why each answer holds here.
_CAPABILITIES = {
    # The library is linked into the extension; the host and cuda backends
    # are chosen when the GMS clients are made.
    "is_supported": True,
    # Sleep touches only GMS weights and private memory, never NCCL.
    "preserves_communicators": True,
    # The process lives on and the weights come back at the same addresses.
    "preserves_compiled_artifacts": True,
    # Graphs keep their KV addresses (the engine's private region stays
    # where Init reserved it), but the wake puts new physical memory under
    # them, which leaves NCCL's registrations of the old memory stale.
    "preserves_graphs_with_communicators": False,
    # The GMS keeps weights across process restarts on the node, but nothing
    # here persists suspended state to disk or object storage.
    "supports_durable_storage": False,
}


def _answer(value: bool) -> Any:
    return classmethod(lambda cls: value)


def _make_backend_class() -> "Type[_SleepModeBackend]":
    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackend as _Base  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        raise ImportError(f"gpufailover.vllm needs vLLM with sleep-mode backends (vllm>=0.32): {e}") from e
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": "GpuFailoverBackend",
        "__doc__": "Sleep unmaps the GMS weights and frees the private memory; wake remaps at the same addresses "
                   "(fail-fast: StaleLayoutError when the GMS holds other weights, TimeoutError when it has none "
                   "in time) and re-creates the private memory. All-or-nothing: a failed call leaves the state it "
                   "found.",
        "suspend": _suspend,
        "resume": _resume,
        "discard": _discard,
    }
    namespace.update({name: _answer(value) for name, value in _CAPABILITIES.items()})
    cls: "Type[_SleepModeBackend]" = type("GpuFailoverBackend", (_Base,), namespace)
    return cls


_backend_class: "Optional[Type[_SleepModeBackend]]" = None


def __getattr__(name: str) -> Any:
    # vLLM's factory resolves the class with getattr(module, "GpuFailoverBackend"),
    # so the vLLM import happens only then.
    global _backend_class
    if name == "GpuFailoverBackend":
        if _backend_class is None:
            _backend_class = _make_backend_class()
        return _backend_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register the backend as
    ``gpufailover``. Runs in every vLLM process, possibly more than once."""
    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        raise ImportError(f"gpufailover.vllm needs vLLM with sleep-mode backends (vllm>=0.32): {e}") from e
    try:
        SleepModeBackendFactory.register_backend(BACKEND_NAME, __name__, "GpuFailoverBackend")
    except ValueError:
        pass  # registered by an earlier call in this process
