/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPython C-API extension over libgpufailover. The thin Python package
 * (gpufailover/__init__.py) re-exports what is defined here.
 *
 * Rules kept throughout: every blocking library call runs with the GIL
 * released; arguments are checked before anything happens (TypeError /
 * ValueError, never a crash); library errors become exceptions of the
 * GpuFailoverError hierarchy carrying the library's detail text.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "gpufailover.h"
#include "dlpack_abi.h"
#include "_safetensors.h"

/* ------------------------------------------------------------------ */
/* exceptions                                                          */

static PyObject *GpuFailoverError, *LockLostError, *GMSLostError, *StaleLayoutError, *GFTimeoutError,
	*ProtocolError, *GFPermissionError, *UnreachableError, *NotSupportedError, *OutOfMemoryError,
	*StateError, *NotFoundError, *InterruptedError_;

static PyObject *error_class(int err)
{
	switch (err) {
	case GF_ERR_LOCK_LOST:
		return LockLostError;
	case GF_ERR_GMS_LOST:
		return GMSLostError;
	case GF_ERR_STALE_LAYOUT:
		return StaleLayoutError;
	case GF_ERR_TIMEOUT:
		return GFTimeoutError;
	case GF_ERR_PROTOCOL:
	case GF_ERR_VERSION:
		return ProtocolError;
	case GF_ERR_PERMISSION:
		return GFPermissionError;
	case GF_ERR_UNREACHABLE:
	case GF_ERR_CLOSED:
		return UnreachableError;
	case GF_ERR_NOT_SUPPORTED:
		return NotSupportedError;
	case GF_ERR_OUT_OF_MEMORY:
		return OutOfMemoryError;
	case GF_ERR_STATE:
	case GF_ERR_BUSY:
		return StateError;
	case GF_ERR_NOT_FOUND:
		return NotFoundError;
	case GF_ERR_INTERRUPTED:
		return InterruptedError_;
	default:
		return GpuFailoverError;
	}
}

/* Raise for a library error; the detail must be read on the thread that failed
 * (it is per-thread), which is this one because calls run on the caller's thread. */
static PyObject *raise_gf(int err)
{
	if (err == GF_ERR_NOMEM)
		return PyErr_NoMemory();
	if (err == GF_ERR_INVALID_ARG) {
		PyErr_Format(PyExc_ValueError, "%s", gf_error_detail()[0] ? gf_error_detail() : gf_strerror(err));
		return NULL;
	}
	const char *detail = gf_error_detail();
	PyObject *exc_args = Py_BuildValue("(s)", detail && *detail ? detail : gf_strerror(err));
	if (!exc_args)
		return NULL;
	PyObject *cls = error_class(err);
	PyObject *exc = PyObject_Call(cls, exc_args, NULL);
	Py_DECREF(exc_args);
	if (!exc)
		return NULL;
	PyObject *code = PyLong_FromLong(err);
	PyObject *name = PyUnicode_FromString(gf_error_name(err) ? gf_error_name(err) : "GF_ERR_UNKNOWN");
	if (code && name) {
		PyObject_SetAttrString(exc, "code", code);
		PyObject_SetAttrString(exc, "name", name);
	}
	Py_XDECREF(code);
	Py_XDECREF(name);
	PyErr_SetObject(cls, exc);
	Py_DECREF(exc);
	return NULL;
}

/* Timeout in seconds (None = forever) → milliseconds (-1 = forever). */
static int timeout_arg(PyObject *obj, int64_t *ms, int allow_none)
{
	if (obj == NULL || obj == Py_None) {
		if (!allow_none) {
			PyErr_SetString(PyExc_ValueError, "a finite timeout is required here");
			return -1;
		}
		*ms = -1;
		return 0;
	}
	if (PyBool_Check(obj) || !(PyFloat_Check(obj) || PyLong_Check(obj))) {
		PyErr_Format(PyExc_TypeError, "timeout must be a number of seconds or None, not %.100s",
			     Py_TYPE(obj)->tp_name);
		return -1;
	}
	double s = PyFloat_AsDouble(obj);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (!isfinite(s) || s < 0 || s > 1e9) {
		PyErr_SetString(PyExc_ValueError, "timeout must be between 0 and 1e9 seconds");
		return -1;
	}
	*ms = (int64_t)ceil(s * 1000.0);
	return 0;
}

/* ------------------------------------------------------------------ */
/* module functions                                                    */

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
		return raise_gf(rc);
	return PyFloat_FromDouble((double)ms / 1000.0);
}

static PyObject *py_strerror(PyObject *self, PyObject *arg)
{
	long code = PyLong_AsLong(arg);
	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(gf_strerror((int)code));
}

static PyObject *json_loads(const char *text)
{
	PyObject *json = PyImport_ImportModule("json");
	if (!json)
		return NULL;
	PyObject *r = PyObject_CallMethod(json, "loads", "s", text);
	Py_DECREF(json);
	return r;
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
	else if (timeout_arg(tobj, &ms, 0) < 0) {
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
		return raise_gf(rc);
	PyObject *r = json_loads(json);
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
	if (tobj && timeout_arg(tobj, &ms, 0) < 0)
		return NULL;
	char *json = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_gms_status_json(uri, ms, &json);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_gf(rc);
	PyObject *r = json_loads(json);
	free(json);
	return r;
}

/* ------------------------------------------------------------------ */
/* hooks: Python callables run from library threads                    */

/* Call fn(code, detail) from whatever thread the library calls back on. */
static void run_hook(PyObject *fn, int err, const char *detail)
{
	PyGILState_STATE g = PyGILState_Ensure();
	if (fn && fn != Py_None) {
		PyObject *r = PyObject_CallFunction(fn, "is", err, detail ? detail : "");
		if (!r)
			PyErr_WriteUnraisable(fn);
		Py_XDECREF(r);
	}
	PyGILState_Release(g);
}

static PyObject *hook_get(PyObject *slot)
{
	PyObject *r = slot ? slot : Py_None;
	Py_INCREF(r);
	return r;
}

static int hook_set(PyObject **slot, PyObject *v, const char *what)
{
	if (!v)
		v = Py_None;
	if (v != Py_None && !PyCallable_Check(v)) {
		PyErr_Format(PyExc_TypeError, "%s must be callable(code, detail) or None", what);
		return -1;
	}
	Py_INCREF(v);
	Py_XSETREF(*slot, v);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Memory                                                              */

typedef struct {
	PyObject_HEAD
	gf_mem *mem;
} MemoryObject;

static int backend_arg(PyObject *obj, int *kind)
{
	if (!obj || obj == Py_None) {
		*kind = GF_MEM_AUTO;
		return 0;
	}
	if (!PyUnicode_Check(obj)) {
		PyErr_Format(PyExc_TypeError, "backend must be 'auto', 'cuda' or 'host', not %.100s",
			     Py_TYPE(obj)->tp_name);
		return -1;
	}
	const char *s = PyUnicode_AsUTF8(obj);
	if (!s)
		return -1;
	if (!strcmp(s, "auto"))
		*kind = GF_MEM_AUTO;
	else if (!strcmp(s, "cuda"))
		*kind = GF_MEM_CUDA;
	else if (!strcmp(s, "host"))
		*kind = GF_MEM_HOST;
	else {
		PyErr_Format(PyExc_ValueError, "backend must be 'auto', 'cuda' or 'host', not '%s'", s);
		return -1;
	}
	return 0;
}

static int Memory_init(MemoryObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "backend", "device", NULL };
	PyObject *bobj = NULL;
	int device = 0, kind;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|Oi", kwlist, &bobj, &device))
		return -1;
	if (backend_arg(bobj, &kind) < 0)
		return -1;
	if (device < 0) {
		PyErr_SetString(PyExc_ValueError, "device must be >= 0");
		return -1;
	}
	if (self->mem) {
		PyErr_SetString(PyExc_RuntimeError, "Memory is already initialized");
		return -1;
	}
	gf_mem *m = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_mem_open(&m, kind, device);
	Py_END_ALLOW_THREADS
	if (rc < 0) {
		raise_gf(rc);
		return -1;
	}
	self->mem = m;
	return 0;
}

static void Memory_dealloc(MemoryObject *self)
{
	gf_mem_free(self->mem);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int memory_ready(MemoryObject *self)
{
	if (!self->mem) {
		PyErr_SetString(PyExc_ValueError, "Memory is not initialized");
		return -1;
	}
	return 0;
}

static PyObject *Memory_get_backend(MemoryObject *self, void *c)
{
	if (memory_ready(self) < 0)
		return NULL;
	return PyUnicode_FromString(gf_mem_kind_name(gf_mem_kind(self->mem)));
}

static PyObject *Memory_get_device(MemoryObject *self, void *c)
{
	if (memory_ready(self) < 0)
		return NULL;
	return PyLong_FromLong(gf_mem_device(self->mem));
}

static PyObject *Memory_get_uuid(MemoryObject *self, void *c)
{
	char buf[64];
	if (memory_ready(self) < 0)
		return NULL;
	int rc = gf_mem_device_uuid(self->mem, buf, sizeof(buf));
	if (rc < 0)
		return raise_gf(rc);
	return PyUnicode_FromString(buf);
}

static PyObject *Memory_get_granularity(MemoryObject *self, void *c)
{
	size_t mn, rec;
	if (memory_ready(self) < 0)
		return NULL;
	int rc = gf_mem_granularity(self->mem, &mn, &rec);
	if (rc < 0)
		return raise_gf(rc);
	return Py_BuildValue("(nn)", (Py_ssize_t)mn, (Py_ssize_t)rec);
}

static PyObject *Memory_info(MemoryObject *self, PyObject *unused)
{
	uint64_t fr, tot;
	if (memory_ready(self) < 0)
		return NULL;
	int rc = gf_mem_info(self->mem, &fr, &tot);
	if (rc < 0)
		return raise_gf(rc);
	return Py_BuildValue("(KK)", (unsigned long long)fr, (unsigned long long)tot);
}

static PyGetSetDef Memory_getset[] = {
	{ "backend", (getter)Memory_get_backend, NULL, "'cuda' or 'host'", NULL },
	{ "device", (getter)Memory_get_device, NULL, "device index", NULL },
	{ "uuid", (getter)Memory_get_uuid, NULL, "device UUID", NULL },
	{ "granularity", (getter)Memory_get_granularity, NULL, "(minimum, recommended) allocation granularity", NULL },
	{ NULL },
};

static PyMethodDef Memory_methods[] = {
	{ "info", (PyCFunction)Memory_info, METH_NOARGS, "info() -> (free_bytes, total_bytes)" },
	{ NULL },
};

static PyTypeObject MemoryType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.Memory",
	.tp_basicsize = sizeof(MemoryObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Memory(backend='auto', device=0)\n\nA memory backend bound to one device: 'cuda' (CUDA VMM via the\n"
		  "driver, loaded at run time) or 'host' (memfd). 'auto' picks cuda when usable.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Memory_init,
	.tp_dealloc = (destructor)Memory_dealloc,
	.tp_getset = Memory_getset,
	.tp_methods = Memory_methods,
};

/* ------------------------------------------------------------------ */
/* LockClient                                                          */

typedef struct {
	PyObject_HEAD
	gf_lock *lock;
	PyObject *on_lost; /* callable or None */
} LockObject;

static void lock_lost_trampoline(gf_lock *l, int err, const char *detail, void *ud)
{
	run_hook(((LockObject *)ud)->on_lost, err, detail);
}

static int Lock_init(LockObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "engine_id", "reconnect_timeout", "secret", NULL };
	const char *uri, *id;
	PyObject *robj = NULL;
	Py_buffer secret = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|O$y*", kwlist, &uri, &id, &robj, &secret))
		return -1;
	if (self->lock) {
		PyBuffer_Release(&secret);
		PyErr_SetString(PyExc_RuntimeError, "LockClient is already initialized");
		return -1;
	}
	gf_lock *l = NULL;
	int rc = gf_lock_new(&l, uri, id);
	if (rc == 0 && robj && robj != Py_None) {
		int64_t ms;
		if (timeout_arg(robj, &ms, 0) < 0) {
			gf_lock_free(l);
			PyBuffer_Release(&secret);
			return -1;
		}
		rc = gf_lock_set_reconnect_timeout(l, ms);
	}
	if (rc == 0 && secret.buf && secret.len > 0)
		rc = gf_lock_set_secret(l, secret.buf, (size_t)secret.len);
	PyBuffer_Release(&secret);
	if (rc < 0) {
		gf_lock_free(l);
		raise_gf(rc);
		return -1;
	}
	self->lock = l;
	Py_INCREF(Py_None);
	self->on_lost = Py_None;
	gf_lock_set_lost_fn(l, lock_lost_trampoline, self);
	return 0;
}

static void Lock_dealloc(LockObject *self)
{
	gf_lock *l = self->lock;
	self->lock = NULL;
	/* Stopping the watcher may wait for a hook that needs the GIL. */
	Py_BEGIN_ALLOW_THREADS
	gf_lock_free(l);
	Py_END_ALLOW_THREADS
	Py_XDECREF(self->on_lost);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int lock_ready(LockObject *self)
{
	if (!self->lock) {
		PyErr_SetString(PyExc_ValueError, "LockClient is closed or not initialized");
		return -1;
	}
	return 0;
}

/* SIGINT during a blocking acquire: interrupt the wait (async-signal-safe
 * eventfd write), then chain to Python's own handler so KeyboardInterrupt is
 * raised once the call returns. */
static void (*volatile sigint_fn)(void *);
static void *volatile sigint_arg;
static unsigned long main_thread_ident;
static struct sigaction sigint_prev;

static void sigint_chain(int sig, siginfo_t *info, void *uctx)
{
	void (*fn)(void *) = sigint_fn;
	if (fn)
		fn(sigint_arg);
	if (sigint_prev.sa_flags & SA_SIGINFO) {
		if (sigint_prev.sa_sigaction)
			sigint_prev.sa_sigaction(sig, info, uctx);
	} else if (sigint_prev.sa_handler != SIG_DFL && sigint_prev.sa_handler != SIG_IGN) {
		sigint_prev.sa_handler(sig);
	}
}

/* Only the main thread receives Python's SIGINT; elsewhere Ctrl-C is
 * delivered to the main thread and the wait continues. */
static int sigint_hook(void (*fn)(void *), void *arg)
{
	if (PyThread_get_thread_ident() != main_thread_ident)
		return 0;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = sigint_chain;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	sigint_arg = arg;
	sigint_fn = fn;
	if (sigaction(SIGINT, &sa, &sigint_prev) < 0) {
		sigint_fn = NULL;
		return 0;
	}
	return 1;
}

static void sigint_unhook(int hooked)
{
	if (!hooked)
		return;
	sigaction(SIGINT, &sigint_prev, NULL);
	sigint_fn = NULL;
	sigint_arg = NULL;
}

static void lock_interrupt_cb(void *arg)
{
	gf_lock_interrupt(arg);
}

static PyObject *make_grant(const struct gf_lock_grant *g);

static PyObject *Lock_acquire(LockObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tobj = Py_None;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &tobj))
		return NULL;
	if (lock_ready(self) < 0 || timeout_arg(tobj, &ms, 1) < 0)
		return NULL;
	struct gf_lock_grant grant;
	int rc, hooked = sigint_hook(lock_interrupt_cb, self->lock);
	Py_BEGIN_ALLOW_THREADS
	rc = gf_lock_acquire(self->lock, ms, &grant);
	Py_END_ALLOW_THREADS
	sigint_unhook(hooked);
	if (rc == GF_ERR_INTERRUPTED && PyErr_CheckSignals() < 0)
		return NULL; /* KeyboardInterrupt: the wait was abandoned, nothing is held */
	if (rc < 0)
		return raise_gf(rc);
	return make_grant(&grant);
}

static PyObject *Lock_release(LockObject *self, PyObject *unused)
{
	if (lock_ready(self) < 0)
		return NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_lock_release(self->lock);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_close(LockObject *self, PyObject *unused)
{
	gf_lock *l = self->lock;
	self->lock = NULL;
	Py_BEGIN_ALLOW_THREADS
	gf_lock_free(l);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

static PyObject *Lock_fileno(LockObject *self, PyObject *unused)
{
	if (lock_ready(self) < 0)
		return NULL;
	return PyLong_FromLong(gf_lock_get_fd(self->lock));
}

static PyObject *Lock_process(LockObject *self, PyObject *unused)
{
	if (lock_ready(self) < 0)
		return NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_lock_process(self->lock);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_start_watch(LockObject *self, PyObject *unused)
{
	if (lock_ready(self) < 0)
		return NULL;
	int rc = gf_lock_start_watch(self->lock);
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_stop_watch(LockObject *self, PyObject *unused)
{
	if (lock_ready(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	gf_lock_stop_watch(self->lock);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

static PyObject *Lock_get_held(LockObject *self, void *c)
{
	return PyBool_FromLong(self->lock && gf_lock_is_held(self->lock));
}

static PyObject *Lock_get_epoch(LockObject *self, void *c)
{
	return PyLong_FromUnsignedLongLong(self->lock ? gf_lock_epoch(self->lock) : 0);
}

static PyObject *Lock_get_on_lost(LockObject *self, void *c)
{
	return hook_get(self->on_lost);
}

static int Lock_set_on_lost(LockObject *self, PyObject *v, void *c)
{
	return hook_set(&self->on_lost, v, "on_lost");
}

static PyObject *Lock_enter(PyObject *self, PyObject *unused)
{
	Py_INCREF(self);
	return self;
}

static PyObject *Lock_exit(LockObject *self, PyObject *args)
{
	return Lock_close(self, NULL);
}

static PyMethodDef Lock_methods[] = {
	{ "acquire", (PyCFunction)(void (*)(void))Lock_acquire, METH_VARARGS | METH_KEYWORDS,
	  "acquire(timeout=None) -> Grant\n\nBlock until this connection holds the lock (GIL released; Ctrl-C\n"
	  "raises KeyboardInterrupt and abandons the wait). Raises TimeoutError,\nUnreachableError, PermissionError." },
	{ "release", (PyCFunction)Lock_release, METH_NOARGS, "Release the lock (clean shutdown)." },
	{ "close", (PyCFunction)Lock_close, METH_NOARGS, "Close the connection (releases a held lock)." },
	{ "fileno", (PyCFunction)Lock_fileno, METH_NOARGS, "fd to watch for readability in an event loop, -1 if none." },
	{ "process", (PyCFunction)Lock_process, METH_NOARGS,
	  "Handle events on fileno(); raises LockLostError once the lock is lost." },
	{ "start_watch", (PyCFunction)Lock_start_watch, METH_NOARGS, "Start the built-in watcher thread." },
	{ "stop_watch", (PyCFunction)Lock_stop_watch, METH_NOARGS, "Stop the watcher thread." },
	{ "__enter__", (PyCFunction)Lock_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)Lock_exit, METH_VARARGS, NULL },
	{ NULL },
};

static PyGetSetDef Lock_getset[] = {
	{ "held", (getter)Lock_get_held, NULL, "True while this client holds the lock", NULL },
	{ "epoch", (getter)Lock_get_epoch, NULL, "fencing epoch of the current grant (0 if never granted)", NULL },
	{ "on_lost", (getter)Lock_get_on_lost, (setter)Lock_set_on_lost,
	  "callable(code, detail) run (on the watcher thread) when a held lock is lost", NULL },
	{ NULL },
};

static PyTypeObject LockType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.LockClient",
	.tp_basicsize = sizeof(LockObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "LockClient(uri, engine_id, reconnect_timeout=None, *, secret=None)\n\n"
		  "Client of the lock server where the connection is the lock.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Lock_init,
	.tp_dealloc = (destructor)Lock_dealloc,
	.tp_methods = Lock_methods,
	.tp_getset = Lock_getset,
};

static PyObject *GrantType; /* a namedtuple made in module exec */

static PyObject *make_grant(const struct gf_lock_grant *g)
{
	return PyObject_CallFunction(GrantType, "Ky#dO", (unsigned long long)g->epoch,
				     (const char *)g->session_token, (Py_ssize_t)sizeof(g->session_token),
				     (double)g->granted_at_us / 1e6, g->reclaimed ? Py_True : Py_False);
}

/* ------------------------------------------------------------------ */
/* GMSClient and Mapping                                               */

typedef struct {
	PyObject_HEAD
	gf_gms *gms;
	gf_mem *mem;
	PyObject *owner_ref; /* the Memory (own clients) or Engine (borrowed clients) kept alive */
	int borrowed;        /* the gf_gms belongs to an Engine: never freed here */
	int device;          /* with borrowed: the Engine's device index */
	Py_ssize_t exports;  /* live buffers / DLPack capsules over the mappings */
	PyObject *on_lost;
} GMSObject;

typedef struct {
	PyObject_HEAD
	GMSObject *owner;
	uint64_t addr;
	Py_ssize_t size;
	int readonly;
	int device_type, device_id;
	gf_DLDataType dtype;
	int ndim;
	int64_t shape[8];
	char format[4];
	Py_ssize_t itemsize;
	Py_ssize_t pyshape[8];
} MappingObject;

static PyTypeObject MappingType;
static void engine_forget_view(PyObject *engine, GMSObject *view);

static int gms_ready(GMSObject *self)
{
	if (!self->gms) {
		PyErr_SetString(PyExc_ValueError, "GMSClient is closed or not initialized");
		return -1;
	}
	return 0;
}

static int mode_arg(PyObject *obj, int *mode)
{
	if (!PyUnicode_Check(obj)) {
		PyErr_Format(PyExc_TypeError, "mode must be 'rw', 'ro' or 'rw_or_ro', not %.100s", Py_TYPE(obj)->tp_name);
		return -1;
	}
	const char *s = PyUnicode_AsUTF8(obj);
	if (!s)
		return -1;
	if (!strcmp(s, "rw"))
		*mode = GF_GMS_RW;
	else if (!strcmp(s, "ro"))
		*mode = GF_GMS_RO;
	else if (!strcmp(s, "rw_or_ro"))
		*mode = GF_GMS_RW_OR_RO;
	else {
		PyErr_Format(PyExc_ValueError, "mode must be 'rw', 'ro' or 'rw_or_ro', not '%s'", s);
		return -1;
	}
	return 0;
}

static void gms_lost_trampoline(gf_gms *g, int err, const char *detail, void *ud)
{
	run_hook(((GMSObject *)ud)->on_lost, err, detail);
}

static int GMS_init(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "memory", "mode", "timeout", NULL };
	const char *uri;
	PyObject *mobj, *modeobj = NULL, *tobj = Py_None;
	int mode = GF_GMS_RO;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "sO!|OO", kwlist, &uri, &MemoryType, &mobj, &modeobj, &tobj))
		return -1;
	if (self->gms) {
		PyErr_SetString(PyExc_RuntimeError, "GMSClient is already initialized");
		return -1;
	}
	if ((modeobj && mode_arg(modeobj, &mode) < 0) || timeout_arg(tobj, &ms, 1) < 0)
		return -1;
	if (memory_ready((MemoryObject *)mobj) < 0)
		return -1;
	gf_gms *g = NULL;
	int rc;
	gf_mem *mem = ((MemoryObject *)mobj)->mem;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_gms_connect(&g, uri, mem, mode, ms);
	Py_END_ALLOW_THREADS
	if (rc < 0) {
		raise_gf(rc);
		return -1;
	}
	self->gms = g;
	self->mem = mem;
	Py_INCREF(mobj);
	self->owner_ref = mobj;
	Py_INCREF(Py_None);
	self->on_lost = Py_None;
	gf_gms_set_lost_fn(g, gms_lost_trampoline, self);
	return 0;
}

static void GMS_dealloc(GMSObject *self)
{
	gf_gms *g = self->borrowed ? NULL : self->gms;
	self->gms = NULL;
	Py_BEGIN_ALLOW_THREADS
	gf_gms_free(g);
	Py_END_ALLOW_THREADS
	if (self->borrowed && self->owner_ref)
		engine_forget_view(self->owner_ref, self);
	Py_XDECREF(self->owner_ref);
	Py_XDECREF(self->on_lost);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Unmapping under a live numpy array or tensor would leave it pointing at
 * inaccessible memory, so (like mmap.close()) refuse while exports exist. */
static int no_exports(GMSObject *self, const char *what)
{
	if (self->exports > 0) {
		PyErr_Format(PyExc_BufferError, "cannot %s: %zd exported buffer(s)/tensor(s) still refer to the mappings",
			     what, self->exports);
		return -1;
	}
	return 0;
}

static PyObject *GMS_allocate(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "size", "tag", NULL };
	long long size;
	const char *tag = "";
	if (!PyArg_ParseTupleAndKeywords(args, kw, "L|s", kwlist, &size, &tag))
		return NULL;
	if (gms_ready(self) < 0)
		return NULL;
	if (size <= 0)
		return PyErr_Format(PyExc_ValueError, "size must be > 0, not %lld", size);
	uint64_t id;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_gms_allocate(self->gms, (uint64_t)size, tag, &id);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_gf(rc);
	return PyLong_FromUnsignedLongLong(id);
}

static PyObject *GMS_put_meta(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "key", "alloc_id", "offset", "value", NULL };
	const char *key;
	unsigned long long aid, off = 0;
	Py_buffer value = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "sK|Ky*", kwlist, &key, &aid, &off, &value))
		return NULL;
	if (gms_ready(self) < 0) {
		PyBuffer_Release(&value);
		return NULL;
	}
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_gms_put_meta(self->gms, key, aid, off, value.buf, (size_t)value.len);
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&value);
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_commit(GMSObject *self, PyObject *unused)
{
	if (gms_ready(self) < 0)
		return NULL;
	uint64_t gen;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_gms_commit(self->gms, &gen);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_gf(rc);
	return PyLong_FromUnsignedLongLong(gen);
}

static PyObject *GMS_map_all(GMSObject *self, PyObject *unused)
{
	if (gms_ready(self) < 0)
		return NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_gms_map_all(self->gms);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_unmap(GMSObject *self, PyObject *unused)
{
	if (gms_ready(self) < 0 || no_exports(self, "unmap") < 0)
		return NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_gms_unmap(self->gms);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_remap(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tobj;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O", kwlist, &tobj))
		return NULL;
	if (gms_ready(self) < 0 || timeout_arg(tobj, &ms, 0) < 0)
		return NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_gms_remap(self->gms, ms);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_close(GMSObject *self, PyObject *unused)
{
	if (no_exports(self, "close") < 0)
		return NULL;
	if (self->borrowed) {
		self->gms = NULL; /* the Engine closes its own clients */
		Py_RETURN_NONE;
	}
	gf_gms *g = self->gms;
	self->gms = NULL;
	Py_BEGIN_ALLOW_THREADS
	gf_gms_free(g);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

static PyObject *GMS_process(GMSObject *self, PyObject *unused)
{
	if (gms_ready(self) < 0)
		return NULL;
	int rc = gf_gms_process(self->gms);
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_start_watch(GMSObject *self, PyObject *unused)
{
	if (gms_ready(self) < 0)
		return NULL;
	int rc = gf_gms_start_watch(self->gms);
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_fileno(GMSObject *self, PyObject *unused)
{
	if (gms_ready(self) < 0)
		return NULL;
	return PyLong_FromLong(gf_gms_get_fd(self->gms));
}

static PyObject *GMS_get_mode(GMSObject *self, void *c)
{
	if (!self->gms)
		Py_RETURN_NONE;
	switch (gf_gms_granted_mode(self->gms)) {
	case GF_GMS_RW:
		return PyUnicode_FromString("rw");
	case GF_GMS_RO:
		return PyUnicode_FromString("ro");
	default:
		Py_RETURN_NONE; /* asleep */
	}
}

static PyObject *GMS_get_allocations(GMSObject *self, void *c)
{
	if (gms_ready(self) < 0)
		return NULL;
	size_t n = gf_gms_alloc_count(self->gms);
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++) {
		struct gf_gms_alloc_info a;
		int rc = gf_gms_alloc_at(self->gms, i, &a);
		if (rc < 0) {
			Py_DECREF(list);
			return raise_gf(rc);
		}
		PyObject *d = Py_BuildValue("{s:K,s:K,s:K,s:s}", "id", (unsigned long long)a.id, "size",
					    (unsigned long long)a.size, "addr", (unsigned long long)a.addr, "tag", a.tag);
		if (!d) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, d);
	}
	return list;
}

static PyObject *meta_dict(const struct gf_gms_meta *m)
{
	return Py_BuildValue("{s:K,s:K,s:K,s:y#}", "alloc_id", (unsigned long long)m->alloc_id, "offset",
			     (unsigned long long)m->offset, "addr", (unsigned long long)m->addr, "value",
			     (const char *)m->value, (Py_ssize_t)m->value_len);
}

static PyObject *GMS_get_metadata(GMSObject *self, void *c)
{
	if (gms_ready(self) < 0)
		return NULL;
	size_t n = gf_gms_meta_count(self->gms);
	PyObject *d = PyDict_New();
	for (size_t i = 0; d && i < n; i++) {
		struct gf_gms_meta m;
		int rc = gf_gms_meta_at(self->gms, i, &m);
		if (rc < 0) {
			Py_DECREF(d);
			return raise_gf(rc);
		}
		PyObject *v = meta_dict(&m);
		if (!v || PyDict_SetItemString(d, m.key, v) < 0) {
			Py_XDECREF(v);
			Py_DECREF(d);
			return NULL;
		}
		Py_DECREF(v);
	}
	return d;
}

static PyObject *GMS_get_layout(GMSObject *self, void *c)
{
	if (gms_ready(self) < 0)
		return NULL;
	uint8_t hash[16];
	uint64_t gen;
	int rc = gf_gms_layout(self->gms, hash, &gen);
	if (rc < 0)
		return raise_gf(rc);
	return Py_BuildValue("(y#K)", (const char *)hash, (Py_ssize_t)16, (unsigned long long)gen);
}

static PyObject *GMS_get_on_lost(GMSObject *self, void *c)
{
	return hook_get(self->on_lost);
}

static int GMS_set_on_lost(GMSObject *self, PyObject *v, void *c)
{
	return hook_set(&self->on_lost, v, "on_lost");
}

/* dtype names accepted by buffer(): numpy's spelling. */
static const struct {
	const char *name;
	const char *format;
	uint8_t code, bits;
} dtypes[] = {
	{ "uint8", "B", GF_DL_UINT, 8 },    { "int8", "b", GF_DL_INT, 8 },      { "int16", "h", GF_DL_INT, 16 },
	{ "int32", "i", GF_DL_INT, 32 },    { "int64", "q", GF_DL_INT, 64 },    { "uint16", "H", GF_DL_UINT, 16 },
	{ "uint32", "I", GF_DL_UINT, 32 },  { "uint64", "Q", GF_DL_UINT, 64 },  { "float16", "e", GF_DL_FLOAT, 16 },
	{ "float32", "f", GF_DL_FLOAT, 32 }, { "float64", "d", GF_DL_FLOAT, 64 }, { "bfloat16", "", GF_DL_BFLOAT, 16 },
};

static PyObject *GMS_buffer(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "key", "alloc_id", "offset", "size", "dtype", "shape", NULL };
	const char *key = NULL, *dtype = "uint8";
	PyObject *aidobj = Py_None, *shapeobj = Py_None;
	unsigned long long off = 0;
	long long size = -1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|z$OKLsO", kwlist, &key, &aidobj, &off, &size, &dtype, &shapeobj))
		return NULL;
	if (gms_ready(self) < 0)
		return NULL;
	size_t di;
	for (di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++)
		if (!strcmp(dtypes[di].name, dtype))
			break;
	if (di == sizeof(dtypes) / sizeof(dtypes[0]))
		return PyErr_Format(PyExc_ValueError, "unknown dtype '%s'", dtype);
	Py_ssize_t itemsize = dtypes[di].bits / 8;

	uint64_t base = 0, limit = 0;
	if (key) {
		struct gf_gms_meta m;
		int rc = gf_gms_meta_get(self->gms, key, &m);
		if (rc < 0)
			return raise_gf(rc);
		aidobj = NULL;
		base = m.addr;
		for (size_t i = 0; i < gf_gms_alloc_count(self->gms); i++) {
			struct gf_gms_alloc_info a;
			if (gf_gms_alloc_at(self->gms, i, &a) == 0 && a.id == m.alloc_id)
				limit = a.addr + a.size;
		}
		base += off;
	} else {
		if (aidobj == Py_None)
			return PyErr_Format(PyExc_TypeError, "buffer() needs a metadata key or alloc_id=");
		unsigned long long aid = PyLong_AsUnsignedLongLong(aidobj);
		if (PyErr_Occurred())
			return NULL;
		int found = 0;
		for (size_t i = 0; i < gf_gms_alloc_count(self->gms); i++) {
			struct gf_gms_alloc_info a;
			if (gf_gms_alloc_at(self->gms, i, &a) == 0 && a.id == aid) {
				base = a.addr + off;
				limit = a.addr + a.size;
				found = 1;
			}
		}
		if (!found)
			return PyErr_Format(NotFoundError, "no allocation with id %llu", aid);
	}
	if (gf_gms_granted_mode(self->gms) == 0 || base == 0)
		return PyErr_Format(StateError, "the weights are not mapped (asleep? call remap() or map_all())");
	if (base >= limit)
		return PyErr_Format(PyExc_ValueError, "offset beyond the end of the allocation");

	MappingObject *mo = PyObject_New(MappingObject, &MappingType);
	if (!mo)
		return NULL;
	mo->owner = self;
	Py_INCREF(self);
	mo->addr = base;
	mo->readonly = gf_gms_granted_mode(self->gms) != GF_GMS_RW;
	mo->device_type = gf_mem_kind(self->mem) == GF_MEM_CUDA ? GF_DL_CUDA : GF_DL_CPU;
	mo->device_id = gf_mem_device(self->mem);
	mo->dtype = (gf_DLDataType){ dtypes[di].code, dtypes[di].bits, 1 };
	snprintf(mo->format, sizeof(mo->format), "%s", dtypes[di].format);
	mo->itemsize = itemsize;
	Py_ssize_t avail = (Py_ssize_t)(limit - base);
	if (shapeobj != Py_None) {
		PyObject *seq = PySequence_Fast(shapeobj, "shape must be a sequence of ints");
		if (!seq)
			goto fail;
		Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
		if (nd < 1 || nd > 8) {
			Py_DECREF(seq);
			PyErr_SetString(PyExc_ValueError, "shape must have 1 to 8 dimensions");
			goto fail;
		}
		Py_ssize_t count = 1;
		for (Py_ssize_t i = 0; i < nd; i++) {
			Py_ssize_t v = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i), PyExc_OverflowError);
			if (v < 0 || (v == -1 && PyErr_Occurred())) {
				Py_DECREF(seq);
				if (!PyErr_Occurred())
					PyErr_SetString(PyExc_ValueError, "shape entries must be >= 0");
				goto fail;
			}
			mo->shape[i] = v;
			mo->pyshape[i] = v;
			if (v && count > PY_SSIZE_T_MAX / v) {
				Py_DECREF(seq);
				PyErr_SetString(PyExc_ValueError, "shape too large");
				goto fail;
			}
			count *= v;
		}
		Py_DECREF(seq);
		mo->ndim = (int)nd;
		mo->size = count * itemsize;
	} else {
		Py_ssize_t bytes = size >= 0 ? (Py_ssize_t)size : avail;
		mo->ndim = 1;
		mo->shape[0] = bytes / itemsize;
		mo->pyshape[0] = (Py_ssize_t)mo->shape[0];
		mo->size = mo->shape[0] * itemsize;
	}
	if (mo->size > avail) {
		PyErr_Format(PyExc_ValueError, "%zd bytes requested but only %zd remain in the allocation", mo->size, avail);
		goto fail;
	}
	return (PyObject *)mo;
fail:
	Py_DECREF(mo);
	return NULL;
}

static PyObject *GMS_enter(PyObject *self, PyObject *unused)
{
	Py_INCREF(self);
	return self;
}

static PyObject *GMS_exit(GMSObject *self, PyObject *args)
{
	return GMS_close(self, NULL);
}

static PyMethodDef GMS_methods[] = {
	{ "allocate", (PyCFunction)(void (*)(void))GMS_allocate, METH_VARARGS | METH_KEYWORDS,
	  "allocate(size, tag='') -> id\n\nWriter: allocate in the GMS, import and map read-write." },
	{ "put_meta", (PyCFunction)(void (*)(void))GMS_put_meta, METH_VARARGS | METH_KEYWORDS,
	  "put_meta(key, alloc_id, offset=0, value=b'')\n\nWriter: record a metadata entry." },
	{ "commit", (PyCFunction)GMS_commit, METH_NOARGS,
	  "commit() -> generation\n\nWriter: validate, hash the layout, commit; the client becomes a reader." },
	{ "map_all", (PyCFunction)GMS_map_all, METH_NOARGS,
	  "Reader: fetch all allocations and metadata in one round trip, import and map read-only." },
	{ "unmap", (PyCFunction)GMS_unmap, METH_NOARGS,
	  "Sleep: unmap everything, keep the addresses reserved, close the connection.\n"
	  "Raises BufferError while buffers/tensors over the mappings are alive." },
	{ "remap", (PyCFunction)(void (*)(void))GMS_remap, METH_VARARGS | METH_KEYWORDS,
	  "remap(timeout)\n\nWake: reconnect read-only within timeout seconds, check the layout, map at\n"
	  "the same addresses. Raises TimeoutError or StaleLayoutError." },
	{ "close", (PyCFunction)GMS_close, METH_NOARGS, "Unmap, release and close." },
	{ "process", (PyCFunction)GMS_process, METH_NOARGS, "Notice a lost GMS; raises GMSLostError." },
	{ "start_watch", (PyCFunction)GMS_start_watch, METH_NOARGS, "Start the loss watcher thread." },
	{ "fileno", (PyCFunction)GMS_fileno, METH_NOARGS, "fd of the GMS connection, -1 while asleep." },
	{ "buffer", (PyCFunction)(void (*)(void))GMS_buffer, METH_VARARGS | METH_KEYWORDS,
	  "buffer(key=None, *, alloc_id=None, offset=0, size=-1, dtype='uint8', shape=None) -> Mapping\n\n"
	  "A zero-copy view of mapped memory (buffer protocol on host, __dlpack__ on both backends).\n"
	  "Read-only unless this client is the writer." },
	{ "__enter__", (PyCFunction)GMS_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)GMS_exit, METH_VARARGS, NULL },
	{ NULL },
};

static PyGetSetDef GMS_getset[] = {
	{ "mode", (getter)GMS_get_mode, NULL, "'rw', 'ro', or None while asleep", NULL },
	{ "allocations", (getter)GMS_get_allocations, NULL, "list of {id, size, addr, tag}", NULL },
	{ "metadata", (getter)GMS_get_metadata, NULL, "dict key -> {alloc_id, offset, addr, value}", NULL },
	{ "layout", (getter)GMS_get_layout, NULL, "(layout_hash: bytes, generation: int)", NULL },
	{ "on_lost", (getter)GMS_get_on_lost, (setter)GMS_set_on_lost,
	  "callable(code, detail) run when the GMS is lost while connected", NULL },
	{ NULL },
};

static PyTypeObject GMSType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.GMSClient",
	.tp_basicsize = sizeof(GMSObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "GMSClient(uri, memory, mode='ro', timeout=None)\n\n"
		  "Client of one GPU Memory Service; the connection is the RW/RO lock.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)GMS_init,
	.tp_dealloc = (destructor)GMS_dealloc,
	.tp_methods = GMS_methods,
	.tp_getset = GMS_getset,
};

/* --- Mapping: buffer protocol and DLPack --- */

static void Mapping_dealloc(MappingObject *self)
{
	Py_XDECREF(self->owner);
	PyObject_Free(self);
}

static int Mapping_getbuffer(MappingObject *self, Py_buffer *view, int flags)
{
	if (self->device_type != GF_DL_CPU) {
		PyErr_SetString(PyExc_BufferError, "device memory has no host buffer: use __dlpack__ (torch/cupy.from_dlpack)");
		return -1;
	}
	if (!self->owner->gms || gf_gms_granted_mode(self->owner->gms) == 0) {
		PyErr_SetString(PyExc_BufferError, "the mapping is asleep (unmapped)");
		return -1;
	}
	if ((flags & PyBUF_WRITABLE) && self->readonly) {
		PyErr_SetString(PyExc_BufferError, "read-only mapping");
		return -1;
	}
	if (!self->format[0]) {
		PyErr_SetString(PyExc_BufferError, "bfloat16 has no buffer-protocol format: use __dlpack__");
		return -1;
	}
	view->obj = (PyObject *)self;
	Py_INCREF(self);
	view->buf = (void *)(uintptr_t)self->addr;
	view->len = self->size;
	view->readonly = self->readonly;
	view->itemsize = self->itemsize;
	view->format = (flags & PyBUF_FORMAT) ? self->format : NULL;
	view->ndim = self->ndim;
	view->shape = (flags & PyBUF_ND) ? self->pyshape : NULL;
	view->strides = NULL;
	view->suboffsets = NULL;
	view->internal = NULL;
	self->owner->exports++;
	return 0;
}

static void Mapping_releasebuffer(MappingObject *self, Py_buffer *view)
{
	self->owner->exports--;
}

static PyBufferProcs Mapping_as_buffer = {
	.bf_getbuffer = (getbufferproc)Mapping_getbuffer,
	.bf_releasebuffer = (releasebufferproc)Mapping_releasebuffer,
};

/* One allocation holds the managed tensor, its shape and the owner reference. */
struct dl_ctx {
	MappingObject *mapping;
	int64_t shape[8];
};

static void dl_release_ctx(struct dl_ctx *ctx)
{
	PyGILState_STATE st = PyGILState_Ensure();
	ctx->mapping->owner->exports--;
	Py_DECREF(ctx->mapping);
	PyGILState_Release(st);
	PyMem_RawFree(ctx);
}

static void dl_deleter(gf_DLManagedTensor *t)
{
	struct dl_ctx *ctx = t->manager_ctx;
	PyMem_RawFree(t);
	dl_release_ctx(ctx);
}

static void dl_deleter_v(gf_DLManagedTensorVersioned *t)
{
	struct dl_ctx *ctx = t->manager_ctx;
	PyMem_RawFree(t);
	dl_release_ctx(ctx);
}

static void capsule_destructor(PyObject *cap)
{
	/* A capsule never consumed (renamed "used_dltensor") still owns its tensor. */
	if (PyCapsule_IsValid(cap, "dltensor")) {
		gf_DLManagedTensor *t = PyCapsule_GetPointer(cap, "dltensor");
		if (t && t->deleter)
			t->deleter(t);
	} else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		gf_DLManagedTensorVersioned *t = PyCapsule_GetPointer(cap, "dltensor_versioned");
		if (t && t->deleter)
			t->deleter(t);
	}
}

static PyObject *Mapping_dlpack(MappingObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "stream", "max_version", "dl_device", "copy", NULL };
	PyObject *stream = Py_None, *maxv = Py_None, *dldev = Py_None, *copy = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO", kwlist, &stream, &maxv, &dldev, &copy))
		return NULL;
	if (copy == Py_True)
		return PyErr_Format(PyExc_BufferError, "GMS mappings are exported without copying (copy=True refused)");
	if (!self->owner->gms || gf_gms_granted_mode(self->owner->gms) == 0)
		return PyErr_Format(PyExc_BufferError, "the mapping is asleep (unmapped)");
	int versioned = 0;
	if (maxv != Py_None) {
		long major = PyLong_AsLong(PyTuple_Check(maxv) && PyTuple_GET_SIZE(maxv) > 0 ? PyTuple_GET_ITEM(maxv, 0) : maxv);
		if (major == -1 && PyErr_Occurred())
			return NULL;
		versioned = major >= 1;
	}
	if (self->readonly && !versioned)
		return PyErr_Format(PyExc_BufferError,
				    "read-only mapping: the consumer must support DLPack >= 1.0 (max_version) to be told it is read-only");
	struct dl_ctx *ctx = PyMem_RawCalloc(1, sizeof(*ctx));
	if (!ctx)
		return PyErr_NoMemory();
	ctx->mapping = self;
	memcpy(ctx->shape, self->shape, sizeof(ctx->shape));
	gf_DLTensor tensor = {
		.data = (void *)(uintptr_t)self->addr,
		.device = { self->device_type, self->device_id },
		.ndim = self->ndim,
		.dtype = self->dtype,
		.shape = ctx->shape,
		.strides = NULL,
		.byte_offset = 0,
	};
	PyObject *cap;
	if (versioned) {
		gf_DLManagedTensorVersioned *t = PyMem_RawCalloc(1, sizeof(*t));
		if (!t) {
			PyMem_RawFree(ctx);
			return PyErr_NoMemory();
		}
		t->version = (gf_DLPackVersion){ GF_DLPACK_MAJOR, GF_DLPACK_MINOR };
		t->manager_ctx = ctx;
		t->deleter = dl_deleter_v;
		t->flags = self->readonly ? GF_DLPACK_FLAG_READ_ONLY : 0;
		t->dl_tensor = tensor;
		cap = PyCapsule_New(t, "dltensor_versioned", capsule_destructor);
		if (!cap) {
			PyMem_RawFree(t);
			PyMem_RawFree(ctx);
			return NULL;
		}
	} else {
		gf_DLManagedTensor *t = PyMem_RawCalloc(1, sizeof(*t));
		if (!t) {
			PyMem_RawFree(ctx);
			return PyErr_NoMemory();
		}
		t->manager_ctx = ctx;
		t->deleter = dl_deleter;
		t->dl_tensor = tensor;
		cap = PyCapsule_New(t, "dltensor", capsule_destructor);
		if (!cap) {
			PyMem_RawFree(t);
			PyMem_RawFree(ctx);
			return NULL;
		}
	}
	Py_INCREF(self);
	self->owner->exports++;
	return cap;
}

static PyObject *Mapping_dlpack_device(MappingObject *self, PyObject *unused)
{
	return Py_BuildValue("(ii)", self->device_type, self->device_id);
}

static PyObject *Mapping_get_addr(MappingObject *self, void *c)
{
	return PyLong_FromUnsignedLongLong(self->addr);
}

static PyObject *Mapping_get_nbytes(MappingObject *self, void *c)
{
	return PyLong_FromSsize_t(self->size);
}

static PyObject *Mapping_get_readonly(MappingObject *self, void *c)
{
	return PyBool_FromLong(self->readonly);
}

static PyMethodDef Mapping_methods[] = {
	{ "__dlpack__", (PyCFunction)(void (*)(void))Mapping_dlpack, METH_VARARGS | METH_KEYWORDS,
	  "DLPack export (zero-copy). Read-only mappings need a consumer speaking DLPack >= 1.0." },
	{ "__dlpack_device__", (PyCFunction)Mapping_dlpack_device, METH_NOARGS, "(device_type, device_id)" },
	{ NULL },
};

static PyGetSetDef Mapping_getset[] = {
	{ "addr", (getter)Mapping_get_addr, NULL, "address of the first byte", NULL },
	{ "nbytes", (getter)Mapping_get_nbytes, NULL, "size in bytes", NULL },
	{ "readonly", (getter)Mapping_get_readonly, NULL, "True for read-only mappings", NULL },
	{ NULL },
};

static PyTypeObject MappingType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.Mapping",
	.tp_basicsize = sizeof(MappingObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A zero-copy view of GMS-mapped memory (made by GMSClient.buffer()).",
	.tp_dealloc = (destructor)Mapping_dealloc,
	.tp_as_buffer = &Mapping_as_buffer,
	.tp_methods = Mapping_methods,
	.tp_getset = Mapping_getset,
};

/* ------------------------------------------------------------------ */
/* Engine                                                              */

typedef struct {
	PyObject_HEAD
	gf_engine *engine;
	PyObject *on_loss;   /* callable or NULL: NULL keeps the library's default (terminate) */
	PyObject *health;    /* callable or NULL */
	PyObject *pending;   /* exception raised inside a callback, re-raised by the step */
	/* GMSClient views of the engine's own clients, made on first use. Not
	 * references: each view holds a reference to the engine, so the engine
	 * (and the memory the views expose) outlives every view. */
	GMSObject *views[16];
} EngineObject;

static PyTypeObject EngineType;

static void engine_forget_view(PyObject *engine, GMSObject *view)
{
	EngineObject *e = (EngineObject *)engine;
	if (e->views[view->device] == view)
		e->views[view->device] = NULL;
}

static int engine_ready(EngineObject *self)
{
	if (!self->engine) {
		PyErr_SetString(PyExc_ValueError, "Engine is closed or not initialized");
		return -1;
	}
	return 0;
}

static PyObject *borrowed_gms(EngineObject *self, int device)
{
	gf_gms *g = gf_engine_gms(self->engine, device);
	if (!g || device < 0 || device >= 16)
		return PyErr_Format(PyExc_IndexError, "no GMS for device %d", device);
	GMSObject *go = self->views[device];
	if (go && go->gms == g) {
		Py_INCREF(go);
		return (PyObject *)go;
	}
	go = (GMSObject *)PyType_GenericNew(&GMSType, NULL, NULL);
	if (!go)
		return NULL;
	go->gms = g;
	go->mem = gf_engine_mem(self->engine, device);
	go->borrowed = 1;
	go->device = device;
	Py_INCREF(self);
	go->owner_ref = (PyObject *)self;
	Py_INCREF(Py_None);
	go->on_lost = Py_None;
	self->views[device] = go;
	return (PyObject *)go;
}

/* Run a Python callback from a library callback (GIL released around the
 * library call): a raised exception is kept and the step fails. */
static int call_back(EngineObject *self, PyObject *fn, PyObject *args)
{
	PyObject *r = PyObject_CallObject(fn, args);
	if (!r) {
		if (!self->pending) {
			PyObject *t, *v, *tb;
			PyErr_Fetch(&t, &v, &tb);
			PyErr_NormalizeException(&t, &v, &tb);
			if (tb)
				PyException_SetTraceback(v, tb);
			self->pending = v;
			Py_XDECREF(t);
			Py_XDECREF(tb);
		} else {
			PyErr_Clear();
		}
		return GF_ERR_INTERRUPTED;
	}
	Py_DECREF(r);
	return 0;
}

struct step_ctx {
	EngineObject *self;
	PyObject *fn;
};

static int load_trampoline(gf_engine *e, int device, gf_gms *gms, void *ud)
{
	struct step_ctx *c = ud;
	PyGILState_STATE st = PyGILState_Ensure();
	int rc;
	PyObject *g = borrowed_gms(c->self, device);
	if (!g) {
		rc = call_back(c->self, Py_None, NULL); /* records the pending error */
	} else {
		PyObject *args = Py_BuildValue("(iO)", device, g);
		rc = args ? call_back(c->self, c->fn, args) : GF_ERR_NOMEM;
		Py_XDECREF(args);
		Py_DECREF(g);
	}
	PyGILState_Release(st);
	return rc;
}

static int step_trampoline(gf_engine *e, void *ud)
{
	struct step_ctx *c = ud;
	PyGILState_STATE st = PyGILState_Ensure();
	int rc = call_back(c->self, c->fn, NULL);
	PyGILState_Release(st);
	return rc;
}

static int health_trampoline(gf_engine *e, void *ud)
{
	EngineObject *self = ud;
	PyGILState_STATE st = PyGILState_Ensure();
	int healthy = 0;
	if (self->health) {
		PyObject *r = PyObject_CallNoArgs(self->health);
		if (r)
			healthy = PyObject_IsTrue(r) == 1;
		else
			PyErr_WriteUnraisable(self->health);
		Py_XDECREF(r);
	}
	PyGILState_Release(st);
	return healthy;
}

static void loss_trampoline(gf_engine *e, int err, const char *detail, void *ud)
{
	run_hook(((EngineObject *)ud)->on_loss, err, detail);
}

/* After a step: re-raise an exception from a callback, else the library error. */
static PyObject *step_result(EngineObject *self, int rc)
{
	if (self->pending) {
		PyObject *v = self->pending;
		self->pending = NULL;
		PyErr_SetObject((PyObject *)Py_TYPE(v), v);
		Py_DECREF(v);
		return NULL;
	}
	if (rc == GF_ERR_INTERRUPTED && PyErr_CheckSignals() < 0)
		return NULL;
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static int role_arg(PyObject *obj, int *role)
{
	const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
	if (!s) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_TypeError, "role must be 'loader' or 'follower', not %.100s", Py_TYPE(obj)->tp_name);
		return -1;
	}
	if (!strcmp(s, "loader"))
		*role = GF_ENGINE_LOADER;
	else if (!strcmp(s, "follower"))
		*role = GF_ENGINE_FOLLOWER;
	else {
		PyErr_Format(PyExc_ValueError, "role must be 'loader' or 'follower', not '%s'", s);
		return -1;
	}
	return 0;
}

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "lock", "engine_id", "gms", "role", "backend", "waking_timeout", "remap_timeout",
				  "init_timeout", "private_bytes", "probe_port", "probe_address", NULL };
	const char *lock_uri, *id, *probe_addr = NULL; /* NULL: all interfaces, as kubelet probes need */
	PyObject *gms_list, *roleobj = NULL, *bobj = NULL, *wobj = NULL, *robj = NULL, *iobj = Py_None;
	unsigned long long priv = 0;
	int probe_port = -1, role = GF_ENGINE_LOADER, kind = GF_MEM_AUTO;
	int64_t waking = -2, remap = -2, init_ms = -1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "ssO|$OOOOOKiz", kwlist, &lock_uri, &id, &gms_list, &roleobj, &bobj,
					 &wobj, &robj, &iobj, &priv, &probe_port, &probe_addr))
		return -1;
	if (self->engine) {
		PyErr_SetString(PyExc_RuntimeError, "Engine is already initialized");
		return -1;
	}
	if ((roleobj && role_arg(roleobj, &role) < 0) || backend_arg(bobj, &kind) < 0 ||
	    (wobj && timeout_arg(wobj, &waking, 0) < 0) || (robj && timeout_arg(robj, &remap, 0) < 0) ||
	    timeout_arg(iobj, &init_ms, 1) < 0)
		return -1;
	if (probe_port != -1 && (probe_port < 0 || probe_port > 65535)) {
		PyErr_SetString(PyExc_ValueError, "probe_port must be 0..65535 (0: any free port)");
		return -1;
	}
	PyObject *seq = PySequence_Fast(gms_list, "gms must be a list of GMS URIs");
	if (!seq)
		return -1;
	if (PySequence_Fast_GET_SIZE(seq) < 1) {
		Py_DECREF(seq);
		PyErr_SetString(PyExc_ValueError, "gms must name at least one GMS URI");
		return -1;
	}
	gf_engine *e = NULL;
	int rc = gf_engine_new(&e);
	if (rc == 0)
		rc = gf_engine_set_lock(e, lock_uri, id);
	for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
		PyObject *u = PySequence_Fast_GET_ITEM(seq, i);
		const char *us = PyUnicode_Check(u) ? PyUnicode_AsUTF8(u) : NULL;
		if (!us) {
			Py_DECREF(seq);
			gf_engine_free(e);
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_TypeError, "gms entries must be str URIs");
			return -1;
		}
		rc = gf_engine_add_gms(e, us);
	}
	Py_DECREF(seq);
	if (rc == 0)
		rc = gf_engine_set_role(e, role);
	if (rc == 0)
		rc = gf_engine_set_backend(e, kind);
	if (rc == 0 && waking != -2)
		rc = gf_engine_set_waking_timeout(e, waking);
	if (rc == 0 && remap != -2)
		rc = gf_engine_set_remap_timeout(e, remap);
	if (rc == 0)
		rc = gf_engine_set_init_timeout(e, init_ms);
	if (rc == 0 && priv)
		rc = gf_engine_set_private_bytes(e, priv);
	if (rc == 0 && probe_port >= 0)
		rc = gf_engine_set_probe_address(e, probe_addr, probe_port);
	if (rc == 0)
		rc = gf_engine_set_health_fn(e, health_trampoline, self);
	if (rc == 0 && probe_port >= 0)
		rc = gf_engine_start_probe_server(e);
	if (rc < 0) {
		gf_engine_free(e);
		raise_gf(rc);
		return -1;
	}
	self->engine = e;
	return 0;
}

static void Engine_dealloc(EngineObject *self)
{
	gf_engine *e = self->engine;
	self->engine = NULL;
	Py_BEGIN_ALLOW_THREADS
	gf_engine_free(e);
	Py_END_ALLOW_THREADS
	Py_XDECREF(self->on_loss);
	Py_XDECREF(self->health);
	Py_XDECREF(self->pending);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Engine_init_weights(EngineObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "load", NULL };
	PyObject *fn = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &fn))
		return NULL;
	if (engine_ready(self) < 0)
		return NULL;
	if (fn != Py_None && !PyCallable_Check(fn))
		return PyErr_Format(PyExc_TypeError, "load must be callable(device, gms) or None");
	struct step_ctx ctx = { self, fn };
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_engine_init_weights(self->engine, fn == Py_None ? NULL : load_trampoline, &ctx);
	Py_END_ALLOW_THREADS
	return step_result(self, rc);
}

#define ENGINE_STEP(name, call)                                                 \
	static PyObject *Engine_##name(EngineObject *self, PyObject *unused)    \
	{                                                                       \
		if (engine_ready(self) < 0)                                     \
			return NULL;                                            \
		int rc;                                                         \
		Py_BEGIN_ALLOW_THREADS rc = call;                               \
		Py_END_ALLOW_THREADS return step_result(self, rc);              \
	}
ENGINE_STEP(sleep, gf_engine_sleep(self->engine))
ENGINE_STEP(wake_up, gf_engine_wake_up(self->engine))
#undef ENGINE_STEP

static PyObject *Engine_sleep_checked(EngineObject *self, PyObject *unused)
{
	/* Sleep unmaps the weights: refuse while Python still holds views on them. */
	for (int i = 0; i < 16; i++)
		if (self->views[i] && no_exports(self->views[i], "sleep") < 0)
			return NULL;
	return Engine_sleep(self, unused);
}

static void engine_interrupt_cb(void *arg)
{
	gf_engine_interrupt(arg);
}

static PyObject *Engine_acquire(EngineObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tobj = Py_None;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &tobj))
		return NULL;
	if (engine_ready(self) < 0 || timeout_arg(tobj, &ms, 1) < 0)
		return NULL;
	int hooked = sigint_hook(engine_interrupt_cb, self->engine);
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_engine_acquire(self->engine, ms);
	Py_END_ALLOW_THREADS
	sigint_unhook(hooked);
	PyObject *r = step_result(self, rc);
	if (!r)
		return NULL;
	Py_DECREF(r);
	return PyLong_FromUnsignedLongLong(gf_engine_epoch(self->engine));
}

static PyObject *Engine_serve(EngineObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "serve", NULL };
	PyObject *fn = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &fn))
		return NULL;
	if (engine_ready(self) < 0)
		return NULL;
	if (fn != Py_None && !PyCallable_Check(fn))
		return PyErr_Format(PyExc_TypeError, "serve must be callable() or None");
	struct step_ctx ctx = { self, fn };
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_engine_serve(self->engine, fn == Py_None ? NULL : step_trampoline, &ctx);
	Py_END_ALLOW_THREADS
	return step_result(self, rc);
}

static PyObject *Engine_mark_dead(EngineObject *self, PyObject *args)
{
	const char *reason = "marked dead by the engine";
	if (!PyArg_ParseTuple(args, "|s", &reason))
		return NULL;
	if (engine_ready(self) < 0)
		return NULL;
	int rc = gf_engine_mark_dead(self->engine, reason);
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static int probe_arg(PyObject *obj, int *probe)
{
	const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
	if (!s) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_TypeError, "probe must be 'live', 'ready' or 'startup'");
		return -1;
	}
	if (!strcmp(s, "live"))
		*probe = GF_PROBE_LIVE;
	else if (!strcmp(s, "ready"))
		*probe = GF_PROBE_READY;
	else if (!strcmp(s, "startup"))
		*probe = GF_PROBE_STARTUP;
	else {
		PyErr_Format(PyExc_ValueError, "probe must be 'live', 'ready' or 'startup', not '%s'", s);
		return -1;
	}
	return 0;
}

static PyObject *Engine_probe(EngineObject *self, PyObject *arg)
{
	int probe;
	if (engine_ready(self) < 0 || probe_arg(arg, &probe) < 0)
		return NULL;
	int code;
	Py_BEGIN_ALLOW_THREADS
	code = gf_engine_probe(self->engine, probe);
	Py_END_ALLOW_THREADS
	if (code < 0)
		return raise_gf(code);
	return PyLong_FromLong(code);
}

static PyObject *Engine_get_state(EngineObject *self, void *c)
{
	if (engine_ready(self) < 0)
		return NULL;
	return PyUnicode_FromString(gf_engine_state_name(gf_engine_state(self->engine)));
}

static PyObject *Engine_get_metrics(EngineObject *self, void *c)
{
	struct gf_engine_metrics m;
	if (engine_ready(self) < 0)
		return NULL;
	int rc = gf_engine_metrics(self->engine, &m);
	if (rc < 0)
		return raise_gf(rc);
	return Py_BuildValue("{s:s,s:L,s:K,s:K,s:K,s:L,s:L,s:L,s:L,s:L,s:K}", "state", gf_engine_state_name(m.state),
			     "time_in_state_us", (long long)m.time_in_state_us, "transitions",
			     (unsigned long long)m.transitions, "failovers", (unsigned long long)m.failovers, "epoch",
			     (unsigned long long)m.epoch, "lock_wait_us", (long long)m.lock_wait_us, "remap_us",
			     (long long)m.remap_us, "private_alloc_us", (long long)m.private_alloc_us, "serve_us",
			     (long long)m.serve_us, "wake_total_us", (long long)m.wake_total_us, "private_alloc_retries",
			     (unsigned long long)m.private_alloc_retries);
}

static PyObject *Engine_metrics_text(EngineObject *self, PyObject *unused)
{
	char *text = NULL;
	if (engine_ready(self) < 0)
		return NULL;
	int rc = gf_engine_metrics_text(self->engine, &text);
	if (rc < 0)
		return raise_gf(rc);
	PyObject *r = PyUnicode_FromString(text);
	free(text);
	return r;
}

static PyObject *Engine_state_info(EngineObject *self, PyObject *unused)
{
	char *text = NULL;
	if (engine_ready(self) < 0)
		return NULL;
	int rc = gf_engine_state_json(self->engine, &text);
	if (rc < 0)
		return raise_gf(rc);
	PyObject *r = json_loads(text);
	free(text);
	return r;
}

static PyObject *Engine_gms(EngineObject *self, PyObject *args)
{
	int device = 0;
	if (!PyArg_ParseTuple(args, "|i", &device))
		return NULL;
	if (engine_ready(self) < 0)
		return NULL;
	if (device < 0 || device >= gf_engine_device_count(self->engine))
		return PyErr_Format(PyExc_IndexError, "device %d out of range", device);
	return borrowed_gms(self, device);
}

static PyObject *Engine_private_memory(EngineObject *self, PyObject *args)
{
	int device = 0;
	uint64_t addr, size;
	if (!PyArg_ParseTuple(args, "|i", &device))
		return NULL;
	if (engine_ready(self) < 0)
		return NULL;
	int rc = gf_engine_private_memory(self->engine, device, &addr, &size);
	if (rc < 0)
		return raise_gf(rc);
	return Py_BuildValue("(KK)", (unsigned long long)addr, (unsigned long long)size);
}

static PyObject *Engine_get_epoch(EngineObject *self, void *c)
{
	return PyLong_FromUnsignedLongLong(self->engine ? gf_engine_epoch(self->engine) : 0);
}

static PyObject *Engine_get_probe_port(EngineObject *self, void *c)
{
	if (engine_ready(self) < 0)
		return NULL;
	int p = gf_engine_probe_port(self->engine);
	if (p <= 0)
		Py_RETURN_NONE;
	return PyLong_FromLong(p);
}

static PyObject *Engine_get_on_loss(EngineObject *self, void *c)
{
	return hook_get(self->on_loss);
}

static int Engine_set_on_loss(EngineObject *self, PyObject *v, void *c)
{
	if (engine_ready(self) < 0)
		return -1;
	if (v && v != Py_None && !PyCallable_Check(v)) {
		PyErr_SetString(PyExc_TypeError, "on_loss must be callable(code, detail) or None (the default: terminate)");
		return -1;
	}
	int rc;
	if (!v || v == Py_None) {
		Py_CLEAR(self->on_loss);
		rc = gf_engine_set_loss_fn(self->engine, gf_engine_default_loss, NULL);
	} else {
		Py_INCREF(v);
		Py_XSETREF(self->on_loss, v);
		rc = gf_engine_set_loss_fn(self->engine, loss_trampoline, self);
	}
	if (rc < 0) {
		raise_gf(rc);
		return -1;
	}
	return 0;
}

static PyObject *Engine_get_health(EngineObject *self, void *c)
{
	return hook_get(self->health);
}

static int Engine_set_health(EngineObject *self, PyObject *v, void *c)
{
	if (v && v != Py_None && !PyCallable_Check(v)) {
		PyErr_SetString(PyExc_TypeError, "health must be callable() -> bool or None");
		return -1;
	}
	Py_XINCREF(v == Py_None ? NULL : v);
	Py_XSETREF(self->health, v == Py_None ? NULL : v);
	return 0;
}

static PyObject *Engine_close(EngineObject *self, PyObject *unused)
{
	for (int i = 0; i < 16; i++)
		if (self->views[i] && no_exports(self->views[i], "close") < 0)
			return NULL;
	for (int i = 0; i < 16; i++)
		if (self->views[i])
			self->views[i]->gms = NULL;
	gf_engine *e = self->engine;
	self->engine = NULL;
	Py_BEGIN_ALLOW_THREADS
	gf_engine_free(e);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

static PyMethodDef Engine_methods[] = {
	{ "init_weights", (PyCFunction)(void (*)(void))Engine_init_weights, METH_VARARGS | METH_KEYWORDS,
	  "init_weights(load=None)\n\nConnect every GMS (loader: rw_or_ro, follower: ro). Where this engine is\n"
	  "the writer, load(device, gms) is called and must allocate, fill, put metadata and commit;\n"
	  "elsewhere the committed weights are imported read-only. Stays in Init." },
	{ "sleep", (PyCFunction)Engine_sleep_checked, METH_NOARGS,
	  "Unmap the weights (addresses stay reserved) and enter Standby." },
	{ "acquire", (PyCFunction)(void (*)(void))Engine_acquire, METH_VARARGS | METH_KEYWORDS,
	  "acquire(timeout=None) -> epoch\n\nBlock on the lock (GIL released, Ctrl-C works); enter Waking." },
	{ "wake_up", (PyCFunction)Engine_wake_up, METH_NOARGS,
	  "Remap weights, allocate private memory (retrying on OOM within the waking timeout).\n"
	  "Failure is fatal: the engine is Dead and the caller should exit." },
	{ "serve", (PyCFunction)(void (*)(void))Engine_serve, METH_VARARGS | METH_KEYWORDS,
	  "serve(serve=None)\n\nRun serve() (register the endpoint), then enter Active." },
	{ "mark_dead", (PyCFunction)Engine_mark_dead, METH_VARARGS, "mark_dead(reason='')" },
	{ "probe", (PyCFunction)Engine_probe, METH_O, "probe('live'|'ready'|'startup') -> HTTP status" },
	{ "metrics_text", (PyCFunction)Engine_metrics_text, METH_NOARGS, "Prometheus text of the metrics" },
	{ "state_info", (PyCFunction)Engine_state_info, METH_NOARGS, "the /state document as a dict" },
	{ "gms", (PyCFunction)Engine_gms, METH_VARARGS, "gms(device=0) -> GMSClient owned by the engine" },
	{ "private_memory", (PyCFunction)Engine_private_memory, METH_VARARGS,
	  "private_memory(device=0) -> (addr, size) of the KV memory allocated on wake" },
	{ "close", (PyCFunction)Engine_close, METH_NOARGS, "Release everything (and the lock)." },
	{ NULL },
};

static PyGetSetDef Engine_getset[] = {
	{ "state", (getter)Engine_get_state, NULL, "'Init', 'Standby', 'Waking', 'Active' or 'Dead'", NULL },
	{ "metrics", (getter)Engine_get_metrics, NULL, "dict of state, transitions, failovers and the last wake's breakdown", NULL },
	{ "epoch", (getter)Engine_get_epoch, NULL, "fencing epoch of the lock grant", NULL },
	{ "probe_port", (getter)Engine_get_probe_port, NULL, "port of the built-in probe server, or None", NULL },
	{ "on_loss", (getter)Engine_get_on_loss, (setter)Engine_set_on_loss,
	  "callable(code, detail) on lock or GMS loss; None restores the default (log and terminate)", NULL },
	{ "health", (getter)Engine_get_health, (setter)Engine_set_health,
	  "callable() -> bool deciding /live and /ready while Active", NULL },
	{ NULL },
};

static PyTypeObject EngineType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.Engine",
	.tp_basicsize = sizeof(EngineObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Engine(lock, engine_id, gms, *, role='loader', backend='auto', waking_timeout=120,\n"
		  "       remap_timeout=30, init_timeout=None, private_bytes=0, probe_port=None,\n"
		  "       probe_address=None)\n\n"
		  "The engine state machine Init -> Standby -> Waking -> Active -> Dead.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Engine_init,
	.tp_dealloc = (destructor)Engine_dealloc,
	.tp_methods = Engine_methods,
	.tp_getset = Engine_getset,
};


static PyObject *py_torch_pool_begin(PyObject *self, PyObject *arg)
{
	if (!PyObject_TypeCheck(arg, &GMSType))
		return PyErr_Format(PyExc_TypeError, "torch pool needs a GMSClient, not %.100s", Py_TYPE(arg)->tp_name);
	GMSObject *g = (GMSObject *)arg;
	if (gms_ready(g) < 0)
		return NULL;
	int rc = gf_torch_pool_begin(g->gms);
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *py_torch_pool_end(PyObject *self, PyObject *unused)
{
	int rc = gf_torch_pool_end();
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

/* Fault reporter: names the GMS allocation and key behind a SIGSEGV/SIGBUS. */
static PyObject *py_install_fault_reporter(PyObject *self, PyObject *arg)
{
	if (!PyObject_TypeCheck(arg, &GMSType))
		return PyErr_Format(PyExc_TypeError, "install_fault_reporter needs a GMSClient, not %.100s",
				    Py_TYPE(arg)->tp_name);
	GMSObject *g = (GMSObject *)arg;
	if (gms_ready(g) < 0)
		return NULL;
	int rc = gf_gms_fault_reporter_install(g->gms);
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *py_remove_fault_reporter(PyObject *self, PyObject *args)
{
	PyObject *arg = Py_None;
	if (!PyArg_ParseTuple(args, "|O:remove_fault_reporter", &arg))
		return NULL;
	if (arg != Py_None && !PyObject_TypeCheck(arg, &GMSType))
		return PyErr_Format(PyExc_TypeError, "remove_fault_reporter needs a GMSClient or None, not %.100s",
				    Py_TYPE(arg)->tp_name);
	gf_gms_fault_reporter_remove(arg == Py_None ? NULL : ((GMSObject *)arg)->gms);
	Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ */
/* module                                                              */

static PyMethodDef module_methods[] = {
	{ "parse_duration", py_parse_duration, METH_O, "parse_duration('250ms') -> seconds (float)" },
	{ "strerror", py_strerror, METH_O, "strerror(code) -> text" },
	{ "lock_status", (PyCFunction)(void (*)(void))py_lock_status, METH_VARARGS | METH_KEYWORDS,
	  "lock_status(uri, timeout=5.0, *, secret=None) -> dict" },
	{ "gms_status", (PyCFunction)(void (*)(void))py_gms_status, METH_VARARGS | METH_KEYWORDS,
	  "gms_status(uri, timeout=5.0) -> dict" },
	{ "_torch_pool_begin", py_torch_pool_begin, METH_O, "route gf_torch_malloc to this GMS writer" },
	{ "_torch_pool_end", py_torch_pool_end, METH_NOARGS, "end the torch pool" },
	{ "install_fault_reporter", py_install_fault_reporter, METH_O,
	  "install_fault_reporter(gms)\n\nOn a SIGSEGV/SIGBUS inside gms's mappings, log the allocation and metadata\n"
	  "key to stderr, then die with the usual signal. Call again after the first map to refresh." },
	{ "remove_fault_reporter", py_remove_fault_reporter, METH_VARARGS,
	  "remove_fault_reporter(gms=None)\n\nForget gms's mappings (None: all); the last removal restores the handlers." },
	{ NULL },
};

static int add_exc(PyObject *m, PyObject **slot, const char *name, PyObject *bases, const char *doc)
{
	char full[128];
	snprintf(full, sizeof(full), "gpufailover.%s", name);
	*slot = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
	if (!*slot)
		return -1;
	Py_INCREF(*slot);
	return PyModule_AddObject(m, name, *slot);
}

static int module_exec(PyObject *m)
{
	if (gf_py_safetensors_add(m) < 0)
		return -1;
	if (add_exc(m, &GpuFailoverError, "GpuFailoverError", NULL, "Base of every libgpufailover error.") < 0)
		return -1;
#define SUB(slot, name, extra, doc)                                                            \
	do {                                                                                   \
		PyObject *b = (extra) ? PyTuple_Pack(2, GpuFailoverError, (extra))             \
				      : PyTuple_Pack(1, GpuFailoverError);                     \
		if (!b || add_exc(m, &slot, name, b, doc) < 0) {                               \
			Py_XDECREF(b);                                                         \
			return -1;                                                             \
		}                                                                              \
		Py_DECREF(b);                                                                  \
	} while (0)
	SUB(LockLostError, "LockLostError", NULL, "The lock was held and is lost.");
	SUB(GMSLostError, "GMSLostError", NULL, "The GPU memory service went away while connected.");
	SUB(StaleLayoutError, "StaleLayoutError", NULL, "The GMS holds a different committed layout.");
	SUB(GFTimeoutError, "TimeoutError", PyExc_TimeoutError, "The deadline passed (also a builtin TimeoutError).");
	SUB(ProtocolError, "ProtocolError", NULL, "The peer violated the protocol or speaks another version.");
	SUB(GFPermissionError, "PermissionError", PyExc_PermissionError, "Refused (also a builtin PermissionError).");
	SUB(UnreachableError, "UnreachableError", PyExc_ConnectionError, "The server could not be reached.");
	SUB(NotSupportedError, "NotSupportedError", NULL, "Not available here (backend, device, feature).");
	SUB(OutOfMemoryError, "OutOfMemoryError", NULL, "Device (or backend) memory exhausted.");
	SUB(StateError, "StateError", NULL, "The call is not valid in the object's current state.");
	SUB(NotFoundError, "NotFoundError", PyExc_LookupError, "Unknown id, key or device.");
	SUB(InterruptedError_, "InterruptedError", NULL, "A blocking call was interrupted.");
#undef SUB

	PyObject *threading = PyImport_ImportModule("threading");
	if (!threading)
		return -1;
	PyObject *mt = PyObject_CallMethod(threading, "main_thread", NULL);
	PyObject *ident = mt ? PyObject_GetAttrString(mt, "ident") : NULL;
	Py_XDECREF(mt);
	Py_DECREF(threading);
	if (!ident)
		return -1;
	main_thread_ident = PyLong_AsUnsignedLong(ident);
	Py_DECREF(ident);

	PyObject *collections = PyImport_ImportModule("collections");
	if (!collections)
		return -1;
	GrantType = PyObject_CallMethod(collections, "namedtuple", "s[ssss]", "Grant", "epoch", "session_token",
					"granted_at", "reclaimed");
	Py_DECREF(collections);
	if (!GrantType)
		return -1;
	Py_INCREF(GrantType);
	if (PyModule_AddObject(m, "Grant", GrantType) < 0)
		return -1;

	PyTypeObject *types[] = { &MemoryType, &LockType, &GMSType, &MappingType, &EngineType };
	const char *names[] = { "Memory", "LockClient", "GMSClient", "Mapping", "Engine" };
	for (size_t i = 0; i < 5; i++) {
		if (PyType_Ready(types[i]) < 0)
			return -1;
		Py_INCREF(types[i]);
		if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0)
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
