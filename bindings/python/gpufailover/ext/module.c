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

static PyObject *py_lock_status(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "timeout", "secret", NULL };
	const char *uri;
	PyObject *tobj = NULL;
	Py_buffer secret = { 0 };
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O$y*", kwlist, &uri, &tobj, &secret))
		return NULL;
	if (tobj == NULL)
		ms = 5000;
	else if (gfpy_timeout_arg(tobj, &ms, 0) < 0) {
		PyBuffer_Release(&secret);
		return NULL;
	}
	char *json = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_lock_status_json(uri, secret.buf, (size_t)secret.len, ms, &json);
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&secret);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	PyObject *r = gfpy_json_loads(json);
	free(json);
	return r;
}

static PyObject *py_gms_status(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "timeout", NULL };
	const char *uri;
	PyObject *tobj = NULL;
	int64_t ms = 5000;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O", kwlist, &uri, &tobj))
		return NULL;
	if (tobj && gfpy_timeout_arg(tobj, &ms, 0) < 0)
		return NULL;
	char *json = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_gms_status_json(uri, ms, &json);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return gfpy_raise_gf(rc);
	PyObject *r = gfpy_json_loads(json);
	free(json);
	return r;
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
	{ "lock_status", (PyCFunction)(void (*)(void))py_lock_status, METH_VARARGS | METH_KEYWORDS,
	  "lock_status($module, uri, timeout=5.0, *, secret=None)\n--\n\n"
	  "lock_status(uri, timeout=5.0, *, secret=None) -> dict" },
	{ "gms_status", (PyCFunction)(void (*)(void))py_gms_status, METH_VARARGS | METH_KEYWORDS,
	  "gms_status($module, uri, timeout=5.0)\n--\n\n"
	  "gms_status(uri, timeout=5.0) -> dict" },
	{ "gms_snapshot", (PyCFunction)(void (*)(void))gfpy_gms_snapshot, METH_VARARGS | METH_KEYWORDS,
	  "gms_snapshot($module, uri, dir=None, timeout=60.0)\n--\n\n"
	  "Snapshot the GMS's committed layout to dir (on the GMS's host; None or '': its kept tiers)." },
	{ "gms_restore", (PyCFunction)(void (*)(void))gfpy_gms_restore, METH_VARARGS | METH_KEYWORDS,
	  "gms_restore($module, uri, dir=None, timeout=60.0)\n--\n\n"
	  "Restore an EMPTY GMS from the snapshot in dir (None or '': its best kept tier)." },
	{ "_torch_pool_begin", py_torch_pool_begin, METH_O, "_torch_pool_begin($module, writer, /)\n--\n\n"
	  "route gf_torch_malloc to this GMS writer" },
	{ "_torch_pool_end", py_torch_pool_end, METH_NOARGS, "_torch_pool_end($module, /)\n--\n\n"
	  "end the torch pool" },
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
