/* SPDX-License-Identifier: Apache-2.0 */
/* The module: functions, the registration lists and multi-phase init. */
#include "common.h"
#include "../_safetensors.h"

/* module functions */

static PyObject *py_parse_duration(PyObject *self, PyObject *arg)
{
	if (!PyUnicode_Check(arg))
		return PyErr_Format(PyExc_TypeError, "duration must be str, not %.100s", Py_TYPE(arg)->tp_name);
	const char *s = PyUnicode_AsUTF8(arg);
	if (!s)
		return NULL;
	uint64_t ms;
	int rc = gf_parse_duration_ms(s, &ms);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return PyFloat_FromDouble((double)ms / 1000.0);
}

static PyObject *py_strerror(PyObject *self, PyObject *arg)
{
	long code = PyLong_AsLong(arg);
	if (code == -1 && PyErr_Occurred())
		return NULL;
	if (code < INT_MIN || code > INT_MAX)
		return PyErr_Format(PyExc_OverflowError, "error code %ld out of range", code);
	return PyUnicode_FromString(gf_strerror((int)code));
}

/* The PyTorch pluggable allocator: route gf_torch_malloc to a GMS writer. */

static PyObject *py_torch_pool_begin(PyObject *self, PyObject *arg)
{
	if (!PyObject_TypeCheck(arg, &gfpy_GMSType))
		return PyErr_Format(PyExc_TypeError, "torch pool needs a GMSClient, not %.100s", Py_TYPE(arg)->tp_name);
	GMSObject *g = (GMSObject *)arg;
	if (gfpy_gms_ready(g) < 0)
		return NULL;
	int rc = gf_torch_pool_begin(g->gms);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *py_torch_pool_end(PyObject *self, PyObject *unused)
{
	int rc = gf_torch_pool_end();
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

/* The registration lists: a new module function or type is one line here. */
static const struct {
	PyTypeObject *type;
	const char *name;
} module_types[] = {
	{ &gfpy_MemoryType, "Memory" }, { &gfpy_LockType, "LockClient" }, { &gfpy_GMSType, "GMSClient" },
	{ &gfpy_MappingType, "Mapping" }, { &gfpy_EngineType, "Engine" },
};

static PyMethodDef module_methods[] = {
	{ "parse_duration", py_parse_duration, METH_O, "parse_duration($module, text, /)\n--\n\n"
	  "parse_duration('250ms') -> seconds (float)" },
	{ "strerror", py_strerror, METH_O, "strerror($module, code, /)\n--\n\n"
	  "strerror(code) -> text" },
	{ "lock_status", (PyCFunction)(void (*)(void))gfpy_lock_status, METH_VARARGS | METH_KEYWORDS,
	  "lock_status($module, uri, timeout=5.0, *, secret=None)\n--\n\n"
	  "lock_status(uri, timeout=5.0, *, secret=None) -> dict\n\nThe lock server's status document (holder,\n"
	  "epoch, waiters, ...). Signal handlers run while it waits." },
	{ "ready_for", (PyCFunction)(void (*)(void))gfpy_ready_for, METH_VARARGS | METH_KEYWORDS,
	  "ready_for($module, uri, gpus=None, model=None, timeout=5.0, *, secret=None)\n--\n\n"
	  "Readiness relay: is an engine Active (the lock's holder) for every GPU UUID in gpus\n"
	  "(None or []: any) and for model (None or '': any)? Returns the answer as a dict\n"
	  "{'ready', 'holder', 'epoch', 'holder_model', 'gpus', 'model'}; the holder may still be\n"
	  "waking (its own /ready probe says when it serves). Raises ValueError for more than 8\n"
	  "GPUs, ValueError for a malformed UUID or model, UnreachableError,\n"
	  "TimeoutError, PermissionError." },
	{ "lock_revoke", (PyCFunction)(void (*)(void))gfpy_lock_revoke, METH_VARARGS | METH_KEYWORDS,
	  "lock_revoke($module, uri, epoch, timeout=5.0, *, secret=None)\n--\n\n"
	  "Admin request: revoke the grant of epoch (the current holder's): the server drops that\n"
	  "holder without waiting for its process to exit and grants the next waiter. Allowed for\n"
	  "the server's admin uids (unix) or with the shared secret (tcp). Raises StateError when\n"
	  "epoch is not the current grant, PermissionError, UnreachableError, TimeoutError." },
	{ "lock_switchover", (PyCFunction)(void (*)(void))gfpy_lock_switchover, METH_VARARGS | METH_KEYWORDS,
	  "lock_switchover($module, uri, epoch=0, timeout=5.0, *, secret=None)\n--\n\n"
	  "Admin request: planned switchover. The holder (the grant of epoch; 0: whoever holds the\n"
	  "lock) is asked to step down (Engine.on_step_down), drains and releases; the first waiter\n"
	  "is granted. Returns once the holder was asked. Raises StateError when nobody holds the\n"
	  "lock, epoch is not the current grant or no waiter would take over; PermissionError,\n"
	  "UnreachableError, TimeoutError." },
	{ "device_list", (PyCFunction)(void (*)(void))gfpy_device_list, METH_VARARGS | METH_KEYWORDS,
	  "device_list($module, backend='auto')\n--\n\n"
	  "The devices the backend sees, in index order: a list of dicts {'index', 'uuid', 'name',\n"
	  "'total_bytes', 'free_bytes', 'mig'} (cuda applies CUDA_VISIBLE_DEVICES). Releases the GIL\n"
	  "(reading free memory blocks in the driver)." },
	{ "device_find_by_uuid", (PyCFunction)(void (*)(void))gfpy_device_find_by_uuid, METH_VARARGS | METH_KEYWORDS,
	  "device_find_by_uuid($module, uuid, backend='auto')\n--\n\n"
	  "The index (for Memory(device=...)) of the device with this UUID, with or without its\n"
	  "'GPU-'/'MIG-' prefix, or a unique prefix of it. Raises NotFoundError when none matches,\n"
	  "ValueError when the prefix is ambiguous." },
	{ "gms_status", (PyCFunction)(void (*)(void))gfpy_gms_status, METH_VARARGS | METH_KEYWORDS,
	  "gms_status($module, uri, timeout=5.0)\n--\n\n"
	  "gms_status(uri, timeout=5.0) -> dict" },
	{ "gms_snapshot", (PyCFunction)(void (*)(void))gfpy_gms_snapshot, METH_VARARGS | METH_KEYWORDS,
	  "gms_snapshot($module, uri, dir=None, timeout=60.0)\n--\n\n"
	  "Snapshot the GMS's committed layout to dir (on the GMS's host; None or '': its kept tiers)." },
	{ "gms_restore", (PyCFunction)(void (*)(void))gfpy_gms_restore, METH_VARARGS | METH_KEYWORDS,
	  "gms_restore($module, uri, dir=None, timeout=60.0)\n--\n\n"
	  "Restore an EMPTY GMS from the snapshot in dir (None or '': its best kept tier)." },
	{ "lock_ping", (PyCFunction)(void (*)(void))gfpy_lock_ping, METH_VARARGS | METH_KEYWORDS,
	  "lock_ping($module, uri, timeout=5.0, *, secret=None)\n--\n\n"
	  "Check that the lock server answers a handshake within timeout (gfctl lock ping). Returns\n"
	  "None; raises UnreachableError, TimeoutError, PermissionError, ProtocolError." },
	{ "lock_evict", (PyCFunction)(void (*)(void))gfpy_lock_evict, METH_VARARGS | METH_KEYWORDS,
	  "lock_evict($module, uri, engine_id, timeout=5.0, *, secret=None)\n--\n\n"
	  "Admin request: evict the standby engine_id from the lock's pool (gfctl lock evict); it\n"
	  "sees its acquire fail as evicted. Allowed for the server's admin uids (unix) or with the\n"
	  "shared secret (tcp). Raises StateError (no waiter has that id), NotSupportedError (etcd),\n"
	  "PermissionError, UnreachableError, TimeoutError; ValueError for a malformed id." },
	{ "gms_ping", (PyCFunction)(void (*)(void))gfpy_gms_ping, METH_VARARGS | METH_KEYWORDS,
	  "gms_ping($module, uri, timeout=5.0)\n--\n\n"
	  "Round trip to the GMS (handshake and status; gfctl gms ping): the seconds it took.\n"
	  "Raises UnreachableError, TimeoutError, PermissionError, ProtocolError." },
	{ "gms_wait_committed", (PyCFunction)(void (*)(void))gfpy_gms_wait_committed, METH_VARARGS | METH_KEYWORDS,
	  "gms_wait_committed($module, uri, timeout=None)\n--\n\n"
	  "Wait until the GMS holds a committed layout, retrying while it is unreachable (gfctl gms\n"
	  "wait-committed; None: no limit): the committed generation. Takes no lock. Raises\n"
	  "TimeoutError (it answered, nothing committed in time), UnreachableError (still\n"
	  "unreachable at the end), PermissionError, ProtocolError." },
	{ "gms_demote", (PyCFunction)(void (*)(void))gfpy_gms_demote, METH_VARARGS | METH_KEYWORDS,
	  "gms_demote($module, uri, to=None, timeout=60.0)\n--\n\n"
	  "Admin request: ask the GMS to demote its committed layout to the tier to ('warm', 'cold';\n"
	  "None: the policy's choice; gfctl gms demote). Returns once the layout was dropped.\n"
	  "Raises PermissionError (not an admin uid), StateError (refused, or a client holds the\n"
	  "lock: the detail says which), ValueError (that tier is not kept), GpuFailoverError (the\n"
	  "snapshot failed: the layout stays), TimeoutError, UnreachableError." },
	{ "_set_log_sink", gfpy_set_log_sink, METH_VARARGS,
	  "_set_log_sink($module, sink, level=-1, /)\n--\n\n"
	  "Send the library's log lines to sink(level, component, msg, mono_us, wall_us, dropped),\n"
	  "called on the main thread; None removes it. Use gpufailover.log_to_logging()." },
	{ "_drain_log", gfpy_drain_log, METH_NOARGS, "_drain_log($module, /)\n--\n\n"
	  "Deliver the queued log lines now (they are otherwise delivered at the next chance)." },
	{ "_torch_pool_begin", py_torch_pool_begin, METH_O, "_torch_pool_begin($module, writer, /)\n--\n\n"
	  "route gf_torch_malloc to this GMS writer" },
	{ "_torch_pool_end", py_torch_pool_end, METH_NOARGS, "_torch_pool_end($module, /)\n--\n\n"
	  "end the torch pool" },
	{ "_kill_group_on_exit", gfpy_kill_group_on_exit, METH_VARARGS,
	  "_kill_group_on_exit($module, pid, line, /)\n--\n\n"
	  "When process pid exits, write \"mono_us=N line\" to stderr and SIGKILL this process's group,\n"
	  "from a thread that never takes the GIL. Lasts for the process's life. ProcessLookupError:\n"
	  "pid is gone already; OSError: no pidfd (before Linux 5.3) or no thread." },
	{ "_group_watches_off", gfpy_group_watches_off, METH_NOARGS,
	  "_group_watches_off($module, /)\n--\n\n"
	  "From now on no _kill_group_on_exit() watch kills the group: the process ends it itself." },
	{ "install_fault_reporter", gfpy_install_fault_reporter, METH_O, "install_fault_reporter($module, gms, /)\n--\n\n"
	  "On a SIGSEGV/SIGBUS inside gms's mappings, log the allocation and metadata\n"
	  "key to stderr, then die with the usual signal. Call again after the first map to refresh." },
	{ "remove_fault_reporter", gfpy_remove_fault_reporter, METH_VARARGS,
	  "remove_fault_reporter($module, gms=None, /)\n--\n\n"
	  "Forget gms's mappings (None: all); the last removal restores the handlers." },
	{ NULL },
};

static int module_exec(PyObject *m)
{
	if (gfpy_errors_add(m) < 0 || gfpy_lock_add_grant(m) < 0 || gfpy_safetensors_add(m) < 0)
		return -1;
	PyObject *threading = PyImport_ImportModule("threading");
	if (!threading)
		return -1;
	PyObject *mt = PyObject_CallMethod(threading, "main_thread", NULL);
	PyObject *ident = mt ? PyObject_GetAttrString(mt, "ident") : NULL;
	Py_XDECREF(mt);
	Py_DECREF(threading);
	if (!ident)
		return -1;
	gfpy_main_thread_ident = PyLong_AsUnsignedLong(ident);
	Py_DECREF(ident);

	for (size_t i = 0; i < sizeof(module_types) / sizeof(module_types[0]); i++) {
		PyTypeObject *t = module_types[i].type;
		if (PyType_Ready(t) < 0)
			return -1;
		Py_INCREF(t);
		if (PyModule_AddObject(m, module_types[i].name, (PyObject *)t) < 0)
			return -1;
	}
	if (PyModule_AddStringConstant(m, "__version__", gf_version()) < 0)
		return -1;
	return 0;
}

static PyModuleDef_Slot module_slots[] = {
	{ Py_mod_exec, module_exec },
	{ 0, NULL },
};

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "gpufailover._gpufailover",
	.m_doc = "libgpufailover C extension; use the gpufailover package.",
	.m_size = 0,
	.m_methods = module_methods,
	.m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__gpufailover(void);
PyMODINIT_FUNC PyInit__gpufailover(void)
{
	return PyModuleDef_Init(&module_def);
}
