/* SPDX-License-Identifier: Apache-2.0 */
/* LockClient: the connection is the lock. */
#include "common.h"

typedef struct {
	PyObject_HEAD
	gf_lock *lock;
	PyObject *on_lost; /* callable or None */
	PyObject *on_step_down; /* callable(epoch) or NULL */
	Py_ssize_t busy;   /* calls running with the GIL released */
	int closing;       /* close() is ending a blocked acquire() */
} LockObject;

static PyObject *GrantType; /* a namedtuple made in module exec */

static void lock_lost_trampoline(gf_lock *l, int err, const char *detail, void *ud)
{
	gfpy_run_hook(&((LockObject *)ud)->on_lost, err, detail);
}

/* A planned switchover asks this holder to step down (the watcher thread). */
static void lock_step_down_trampoline(gf_lock *l, uint64_t epoch, void *ud)
{
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *fn = ((LockObject *)ud)->on_step_down;
	if (fn) {
		Py_INCREF(fn); /* another thread may replace the hook while it runs */
		PyObject *r = PyObject_CallFunction(fn, "K", (unsigned long long)epoch);
		if (!r)
			PyErr_WriteUnraisable(fn);
		Py_XDECREF(r);
		Py_DECREF(fn);
	}
	PyGILState_Release(g);
}

static int Lock_init(LockObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "engine_id", "reconnect_timeout", "secret", NULL };
	const char *uri, *id;
	PyObject *robj = NULL;
	Py_buffer secret = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|O$O&", kwlist, &uri, &id, &robj, gfpy_secret_arg, &secret))
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
		if (gfpy_timeout_arg(robj, &ms, 0) < 0) {
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
		gfpy_raise_gf(rc);
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
	Py_XDECREF(self->on_step_down);
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

/* Ready, and no other thread is in a call on it (the library object is
 * not for concurrent use: an acquire owns the connection while it waits). */
static int lock_idle(LockObject *self, const char *what)
{
	return lock_ready(self) < 0 || gfpy_refuse_busy(self->busy, "LockClient", what) < 0 ? -1 : 0;
}

static void lock_interrupt_cb(void *arg)
{
	gf_lock_interrupt(arg);
}

static void *lock_handle(PyObject *obj)
{
	return ((LockObject *)obj)->lock;
}

struct acquire_ctx {
	gf_lock *lock;
	struct gf_lock_grant grant;
};

static int acquire_call(void *ctx, int64_t ms)
{
	struct acquire_ctx *c = ctx;
	return gf_lock_acquire(c->lock, ms, &c->grant);
}

static PyObject *make_grant(const struct gf_lock_grant *g)
{
	return PyObject_CallFunction(GrantType, "Ky#dO", (unsigned long long)g->epoch,
				     (const char *)g->session_token, (Py_ssize_t)sizeof(g->session_token),
				     (double)g->granted_at_us / 1e6, g->reclaimed ? Py_True : Py_False);
}

static PyObject *Lock_acquire(LockObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tobj = Py_None;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &tobj))
		return NULL;
	if (lock_idle(self, "acquire") < 0 || gfpy_timeout_arg(tobj, &ms, 1) < 0)
		return NULL;
	/* A signal whose handler raises abandons the wait (nothing is held);
	 * one whose handler returns re-queues with the time that remains. */
	struct acquire_ctx c = { .lock = self->lock };
	int rc = gfpy_wait_interruptible(acquire_call, &c, lock_interrupt_cb, lock_handle, (PyObject *)self,
				    &self->busy, &self->closing, ms);
	if (rc == GFPY_PYERR)
		return NULL;
	if (rc == GFPY_CLOSED)
		return PyErr_Format(gfpy_InterruptedError, "acquire: the LockClient was closed by a signal handler");
	if (rc == GF_ERR_INTERRUPTED && self->closing)
		return PyErr_Format(gfpy_InterruptedError, "acquire: the LockClient was closed by another thread");
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return make_grant(&c.grant);
}

static PyObject *Lock_release(LockObject *self, PyObject *unused)
{
	if (lock_idle(self, "release") < 0)
		return NULL;
	int rc;
	BLOCKING(self, rc = gf_lock_release(self->lock));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_close(LockObject *self, PyObject *unused)
{
	if (self->busy > 0) {
		/* End a blocked acquire() on another thread and let it return
		 * before the connection is freed. */
		self->closing = 1;
		gf_lock_interrupt(self->lock);
		gfpy_wait_idle(&self->busy);
		self->closing = 0;
	}
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
	if (lock_idle(self, "process") < 0)
		return NULL;
	int rc;
	BLOCKING(self, rc = gf_lock_process(self->lock));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_prepare_watch(LockObject *self, PyObject *unused)
{
	if (lock_idle(self, "prepare_watch") < 0)
		return NULL;
	int rc = gf_lock_prepare_watch(self->lock);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_start_watch(LockObject *self, PyObject *unused)
{
	if (lock_idle(self, "start_watch") < 0)
		return NULL;
	int rc = gf_lock_start_watch(self->lock);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_stop_watch(LockObject *self, PyObject *unused)
{
	if (lock_idle(self, "stop_watch") < 0)
		return NULL;
	BLOCKING(self, gf_lock_stop_watch(self->lock));
	Py_RETURN_NONE;
}

/* {name: socket.socket} over duplicates of the grant's listeners: Python owns its copies. */
static PyObject *Lock_listeners(LockObject *self, PyObject *unused)
{
	if (lock_idle(self, "listeners") < 0)
		return NULL;
	const struct gf_lock_listener *ls;
	size_t n;
	int rc = gf_lock_listeners(self->lock, &ls, &n);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	PyObject *mod = PyImport_ImportModule("socket");
	PyObject *cls = mod ? PyObject_GetAttrString(mod, "socket") : NULL;
	Py_XDECREF(mod);
	PyObject *d = cls ? PyDict_New() : NULL;
	for (size_t i = 0; d && i < n; i++) {
		int fd = fcntl(ls[i].fd, F_DUPFD_CLOEXEC, 3);
		if (fd < 0) {
			PyErr_SetFromErrno(PyExc_OSError);
			Py_CLEAR(d);
			break;
		}
		PyObject *kw = Py_BuildValue("{s:i}", "fileno", fd);
		PyObject *empty = PyTuple_New(0);
		PyObject *sock = kw && empty ? PyObject_Call(cls, empty, kw) : NULL;
		Py_XDECREF(kw);
		Py_XDECREF(empty);
		if (!sock) {
			close(fd);
			Py_CLEAR(d);
			break;
		}
		int r = PyDict_SetItemString(d, ls[i].name, sock);
		Py_DECREF(sock); /* a socket dropped here closes its fd */
		if (r < 0)
			Py_CLEAR(d);
	}
	Py_XDECREF(cls);
	return d;
}

static PyObject *Lock_set_resources(LockObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "gpus", "wake_bytes", "asleep_bytes", NULL };
	PyObject *gobj;
	uint64_t wake = 0, asleep = 0;
	char **gpus = NULL;
	size_t n = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O&O&", kwlist, &gobj, gfpy_u64_arg, &wake, gfpy_u64_arg, &asleep))
		return NULL;
	if (lock_ready(self) < 0 || gfpy_strv_arg(gobj, "gpus", 8, &gpus, &n) < 0)
		return NULL;
	int rc = gf_lock_set_resources(self->lock, (const char *const *)gpus, n, wake, asleep);
	gfpy_strv_free(gpus);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_add_pid(LockObject *self, PyObject *arg)
{
	int pid;
	if (PyBool_Check(arg))
		return PyErr_Format(PyExc_TypeError, "pid must be an int, not bool");
	if (lock_ready(self) < 0 || !PyArg_Parse(arg, "i", &pid))
		return NULL;
	int rc;
	/* Allowed while acquire() waits on another thread: a standby registers its ranks then. */
	BLOCKING(self, rc = gf_lock_add_pid(self->lock, pid));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_set_pinned(LockObject *self, PyObject *arg)
{
	int pinned;
	if (lock_ready(self) < 0 || !gfpy_bool_arg(arg, &pinned))
		return NULL;
	int rc = gf_lock_set_pinned(self->lock, pinned);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Lock_set_model(LockObject *self, PyObject *arg)
{
	const char *model = NULL;
	if (lock_ready(self) < 0)
		return NULL;
	if (arg != Py_None) {
		Py_ssize_t sz;
		model = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, &sz) : NULL;
		if (!model) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_TypeError, "model must be str or None, not %.100s", Py_TYPE(arg)->tp_name);
			return NULL;
		}
		if ((size_t)sz != strlen(model))
			return PyErr_Format(PyExc_ValueError, "model contains a NUL character");
	}
	int rc = gf_lock_set_model(self->lock, model);
	if (rc < 0)
		return gfpy_raise_gf(rc);
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

static PyObject *Lock_get_unreachable(LockObject *self, void *c)
{
	int64_t ms = self->lock ? gf_lock_unreachable_ms(self->lock) : 0;
	return PyFloat_FromDouble(ms > 0 ? (double)ms / 1000.0 : 0.0);
}

static PyObject *Lock_get_on_lost(LockObject *self, void *c)
{
	return gfpy_hook_get(self->on_lost);
}

static int Lock_set_on_lost(LockObject *self, PyObject *v, void *c)
{
	return gfpy_hook_set(&self->on_lost, v, "on_lost");
}

static PyObject *Lock_get_on_step_down(LockObject *self, void *c)
{
	return gfpy_hook_get(self->on_step_down);
}

static int Lock_set_on_step_down(LockObject *self, PyObject *v, void *c)
{
	if (lock_ready(self) < 0)
		return -1;
	if (v && v != Py_None && !PyCallable_Check(v)) {
		PyErr_SetString(PyExc_TypeError, "on_step_down must be callable(epoch) or None");
		return -1;
	}
	if (!v || v == Py_None) {
		gf_lock_set_step_down_fn(self->lock, NULL, NULL);
		Py_CLEAR(self->on_step_down);
	} else {
		Py_INCREF(v);
		Py_XSETREF(self->on_step_down, v);
		gf_lock_set_step_down_fn(self->lock, lock_step_down_trampoline, self);
	}
	return 0;
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
	  "acquire($self, timeout=None)\n--\n\n"
	  "acquire(timeout=None) -> Grant\n\nBlock until this connection holds the lock (GIL released; Ctrl-C\n"
	  "raises KeyboardInterrupt and abandons the wait). Raises TimeoutError,\nUnreachableError, PermissionError." },
	{ "release", (PyCFunction)Lock_release, METH_NOARGS, "release($self, /)\n--\n\n"
	  "Release the lock (clean shutdown)." },
	{ "close", (PyCFunction)Lock_close, METH_NOARGS, "close($self, /)\n--\n\n"
	  "Close the connection (releases a held lock)." },
	{ "fileno", (PyCFunction)Lock_fileno, METH_NOARGS, "fileno($self, /)\n--\n\n"
	  "fd to watch for readability in an event loop, -1 if none." },
	{ "process", (PyCFunction)Lock_process, METH_NOARGS,
	  "process($self, /)\n--\n\n"
	  "Handle events on fileno(); raises LockLostError once the lock is lost." },
	{ "listeners", (PyCFunction)Lock_listeners, METH_NOARGS, "listeners($self, /)\n--\n\n"
	  "listeners() -> dict[str, socket.socket]\n\nThe listening sockets that came with the grant (gf-lockd --listener),\n"
	  "by name: new duplicates each call, owned by the caller. Connections that\n"
	  "arrived while nobody held the lock are waiting in their backlog. Raises\n"
	  "NotSupportedError on a tcp:// lock, StateError when not held." },
	{ "prepare_watch", (PyCFunction)Lock_prepare_watch, METH_NOARGS, "prepare_watch($self, /)\n--\n\n"
	  "Start the built-in watcher thread now, parked, so that start_watch() after\n"
	  "the grant only wakes it (no thread is created in a failover)." },
	{ "start_watch", (PyCFunction)Lock_start_watch, METH_NOARGS, "start_watch($self, /)\n--\n\n"
	  "Run the watch on the built-in watcher thread (started here unless\n"
	  "prepare_watch() did)." },
	{ "stop_watch", (PyCFunction)Lock_stop_watch, METH_NOARGS, "stop_watch($self, /)\n--\n\n"
	  "Stop the watcher thread." },
	{ "set_resources", (PyCFunction)(void (*)(void))Lock_set_resources, METH_VARARGS | METH_KEYWORDS,
	  "set_resources($self, gpus, wake_bytes=0, asleep_bytes=0)\n--\n\n"
	  "Declare this engine's resources for the server's standby pool, sent with every\n"
	  "acquire: the GPUs it runs on (at most 8 UUIDs, 'GPU-' or 'MIG-' and 8-4-4-4-12 hex\n"
	  "digits), the memory its wake needs and the memory it keeps while asleep (bytes).\n"
	  "Replaces an earlier declaration; takes effect at the next acquire. A server with a\n"
	  "per-GPU standby budget may evict this engine while it waits: acquire() then raises\n"
	  "GpuFailoverError (EVICTED). Raises ValueError for a malformed or\n"
	  "repeated UUID (nothing changed)." },
	{ "add_pid", (PyCFunction)Lock_add_pid, METH_O, "add_pid($self, pid, /)\n--\n\n"
	  "Register another process of this engine (a rank) with the lock: once this client\n"
	  "holds the lock and its connection goes away, the next holder is granted only after\n"
	  "that process has exited too (bounded by the server's exit-wait timeout). Sent now\n"
	  "when connected and with every new connection; any thread, also while acquire()\n"
	  "waits. Registering a pid again, or this process's own, does nothing. Raises\n"
	  "ValueError (pid <= 0), NotFoundError (no such process), GpuFailoverError\n"
	  "(TOO_BIG: more than 64 live processes), NotSupportedError (tcp:// and etcd locks)." },
	{ "set_pinned", (PyCFunction)Lock_set_pinned, METH_O, "set_pinned($self, pinned, /)\n--\n\n"
	  "Declare this engine pinned (True): the server never evicts it to keep a GPU's standby budget." },
	{ "set_model", (PyCFunction)Lock_set_model, METH_O, "set_model($self, model, /)\n--\n\n"
	  "Declare the model this engine serves (the engine id rule: 1..127 printable ASCII\n"
	  "characters without spaces, quotes, backslash or '='; None or '' clears), answered by\n"
	  "ready_for() queries." },
	{ "__enter__", (PyCFunction)Lock_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)Lock_exit, METH_VARARGS, NULL },
	{ NULL },
};

static PyGetSetDef Lock_getset[] = {
	{ "held", (getter)Lock_get_held, NULL, "True while this client holds the lock", NULL },
	{ "epoch", (getter)Lock_get_epoch, NULL, "fencing epoch of the current grant (0 if never granted)", NULL },
	{ "unreachable", (getter)Lock_get_unreachable, NULL,
	  "seconds this client has been without its lock server (0.0: connected); on unix:// a holder\n"
	  "holds on past its reconnect time while this grows (docs/lock.md)", NULL },
	{ "on_lost", (getter)Lock_get_on_lost, (setter)Lock_set_on_lost,
	  "callable(code, detail) run (on the watcher thread) when a held lock is lost", NULL },
	{ "on_step_down", (getter)Lock_get_on_step_down, (setter)Lock_set_on_step_down,
	  "callable(epoch) run on the watcher thread when a planned switchover (lock_switchover())\n"
	  "asks this holder to step down: hand the work to another thread, which stops accepting,\n"
	  "drains and calls release(). None: the request is ignored.", NULL },
	{ NULL },
};

PyTypeObject gfpy_LockType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.LockClient",
	.tp_basicsize = sizeof(LockObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "LockClient(uri, engine_id, reconnect_timeout=None, *, secret=None)\n--\n\n"
		  "Client of the lock server where the connection is the lock.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Lock_init,
	.tp_dealloc = (destructor)Lock_dealloc,
	.tp_methods = Lock_methods,
	.tp_getset = Lock_getset,
};

/* Create the Grant namedtuple and add it to module m. */
int gfpy_lock_add_grant(PyObject *m)
{
	PyObject *collections = PyImport_ImportModule("collections");
	if (!collections)
		return -1;
	GrantType = PyObject_CallMethod(collections, "namedtuple", "s[ssss]", "Grant", "epoch", "session_token",
					"granted_at", "reclaimed");
	Py_DECREF(collections);
	if (!GrantType)
		return -1;
	Py_INCREF(GrantType);
	return PyModule_AddObject(m, "Grant", GrantType);
}
