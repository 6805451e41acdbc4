/* SPDX-License-Identifier: Apache-2.0 */
/* Engine: the engine state machine. */
#include "common.h"

typedef struct {
	PyObject_HEAD
	gf_engine *engine;
	PyObject *on_loss;   /* callable or NULL: NULL keeps the library's default (terminate) */
	PyObject *on_step_down; /* callable() or NULL: a planned switchover asks this engine to step down */
	PyObject *health;    /* callable or NULL */
	PyObject *pending;   /* exception raised inside a callback, re-raised by the step */
	/* GMSClient views of the engine's own clients, made on first use. Not
	 * references: each view holds a reference to the engine, so the engine
	 * (and the memory the views expose) outlives every view. */
	GMSObject *views[16];
	Py_ssize_t busy; /* calls running with the GIL released */
	int acquiring;   /* one of them is acquire(), which close() can interrupt */
	int closing;     /* close() is ending a blocked acquire() */
	int release_handles; /* keep_handles=False: every GMS client releases its imports at sleep */
} EngineObject;

void gfpy_engine_forget_view(PyObject *engine, GMSObject *view)
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
	go = (GMSObject *)PyType_GenericNew(&gfpy_GMSType, NULL, NULL);
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
	int healthy = 1; /* no health callable: Active is healthy, as in C */
	if (self->health) {
		healthy = 0;
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
	gfpy_run_hook(&((EngineObject *)ud)->on_loss, err, detail);
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
		return gfpy_raise_gf(rc);
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

/* A lock URI, or none for a rank engine (rank >= 1): one or the other. */
static int lock_rank_arg(const char *lock_uri, int rank)
{
	if (!lock_uri != (rank != 0)) {
		PyErr_SetString(PyExc_ValueError, rank ? "a rank engine (rank >= 1) holds no lock: pass lock=None"
						       : "lock=None is for a rank engine: pass rank >= 1");
		return -1;
	}
	return 0;
}

/* probe_port=: None (no probe server, *@port stays), or 0..65535 (0: any free port). */
static int probe_port_arg(PyObject *obj, long *port)
{
	if (obj == Py_None)
		return 0;
	PyObject *idx = PyNumber_Index(obj);
	long v = idx ? PyLong_AsLong(idx) : -1; /* OverflowError beyond a long */
	Py_XDECREF(idx);
	if (PyErr_Occurred())
		return -1;
	if (v < 0 || v > 65535) {
		PyErr_SetString(PyExc_ValueError, "probe_port must be 0..65535 (0: any free port) or None");
		return -1;
	}
	*port = v;
	return 0;
}

/* Add every GMS URI of @seq (a PySequence_Fast) to @e: the library's code, or
 * -1 with *@py_error set and a Python exception when an entry is not a str. */
static int add_gms_uris(gf_engine *e, PyObject *seq, int *py_error)
{
	int rc = 0;
	for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
		PyObject *u = PySequence_Fast_GET_ITEM(seq, i);
		const char *us = PyUnicode_Check(u) ? PyUnicode_AsUTF8(u) : NULL;
		if (!us) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_TypeError, "gms entries must be str URIs");
			*py_error = 1;
			return -1;
		}
		rc = gf_engine_add_gms(e, us);
	}
	return rc;
}

/* lock_secret=: None (no secret; @out stays empty) or a non-empty bytes-like object. */
static int lock_secret_arg(PyObject *obj, Py_buffer *out)
{
	if (obj == Py_None)
		return 0;
	if (PyUnicode_Check(obj) || !PyObject_CheckBuffer(obj)) {
		PyErr_Format(PyExc_TypeError, "lock_secret must be bytes or None, not %.100s", Py_TYPE(obj)->tp_name);
		return -1;
	}
	if (PyObject_GetBuffer(obj, out, PyBUF_SIMPLE) < 0)
		return -1;
	if (out->len == 0) {
		PyBuffer_Release(out);
		PyErr_SetString(PyExc_ValueError, "lock_secret is empty");
		return -1;
	}
	return 0;
}

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "lock", "engine_id", "gms", "role", "backend", "waking_timeout", "remap_timeout",
				  "init_timeout", "private_bytes", "probe_port", "probe_address", "gpus", "memory_need",
				  "asleep_bytes", "pinned", "model", "rank", "lock_reconnect_timeout", "loss_grace",
				  "startup_deadline", "wake_priority", "settle_deferred", "keep_handles",
				  "first_device", "kv_pool", "lock_secret", NULL };
	const char *lock_uri, *id, *probe_addr = NULL; /* NULL: all interfaces, as kubelet probes need */
	PyObject *gms_list, *roleobj = NULL, *bobj = NULL, *wobj = NULL, *robj = NULL, *iobj = NULL, *pobj = Py_None;
	uint64_t priv = 0, need = 0, asleep = 0;
	PyObject *gpus_obj = Py_None, *need_obj = NULL;
	const char *model = NULL;
	char **gpus = NULL;
	size_t ngpus = 0;
	int pinned = 0, rank = 0, keep_handles = 1;
	long probe_port = -1; /* -1: no probe server */
	int role = GF_ENGINE_LOADER, kind = GF_MEM_AUTO;
	int64_t waking = -2, remap = -2, init_ms = -1, reconnect_ms = -1, grace_ms = -1, startup_ms = 0;
	PyObject *reconnect_obj = Py_None, *grace_obj = NULL, *startup_obj = Py_None;
	int wake_priority = 0, settle_deferred = 0, first_device = 0, kv_pool = 0;
	PyObject *secret_obj = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "zsO|$OOOOOO&OzOOO&O&ziOOOiO&O&iO&O", kwlist, &lock_uri, &id, &gms_list,
					 &roleobj, &bobj, &wobj, &robj, &iobj, gfpy_u64_arg, &priv, &pobj, &probe_addr,
					 &gpus_obj, &need_obj, gfpy_u64_arg, &asleep, gfpy_bool_arg, &pinned, &model, &rank,
					 &reconnect_obj, &grace_obj, &startup_obj, &wake_priority, gfpy_bool_arg,
					 &settle_deferred, gfpy_bool_arg, &keep_handles, &first_device, gfpy_bool_arg,
					 &kv_pool, &secret_obj))
		return -1;
	/* None: the lock client's own reconnect time; no startup deadline */
	if (gfpy_timeout_arg(reconnect_obj, &reconnect_ms, 1) < 0 ||
	    (grace_obj && gfpy_timeout_arg(grace_obj, &grace_ms, 0) < 0) || gfpy_timeout_arg(startup_obj, &startup_ms, 1) < 0)
		return -1;
	if (lock_rank_arg(lock_uri, rank) < 0)
		return -1;
	if (need_obj && need_obj != Py_None && !gfpy_u64_arg(need_obj, &need))
		return -1;
	if (self->engine) {
		PyErr_SetString(PyExc_RuntimeError, "Engine is already initialized");
		return -1;
	}
	if ((roleobj && role_arg(roleobj, &role) < 0) || gfpy_backend_arg(bobj, &kind) < 0 ||
	    (wobj && gfpy_timeout_arg(wobj, &waking, 0) < 0) || (robj && gfpy_timeout_arg(robj, &remap, 0) < 0) ||
	    (iobj && gfpy_timeout_arg(iobj, &init_ms, 1) < 0))
		return -1;
	if (probe_port_arg(pobj, &probe_port) < 0)
		return -1;
	Py_buffer secret = { 0 };
	if (lock_secret_arg(secret_obj, &secret) < 0)
		return -1;
	if (gpus_obj != Py_None && gfpy_strv_arg(gpus_obj, "gpus", 8, &gpus, &ngpus) < 0) {
		PyBuffer_Release(&secret);
		return -1;
	}
	PyObject *seq = PySequence_Fast(gms_list, "gms must be a list of GMS URIs");
	if (!seq) {
		PyBuffer_Release(&secret);
		gfpy_strv_free(gpus);
		return -1;
	}
	if (PySequence_Fast_GET_SIZE(seq) < 1) {
		Py_DECREF(seq);
		PyBuffer_Release(&secret);
		gfpy_strv_free(gpus);
		PyErr_SetString(PyExc_ValueError, "gms must name at least one GMS URI");
		return -1;
	}
	gf_engine *e = NULL;
	int rc = gf_engine_new(&e);
	if (rc == 0)
		rc = lock_uri ? gf_engine_set_lock(e, lock_uri, id) : gf_engine_set_rank(e, id, rank);
	if (rc == 0 && secret.buf)
		rc = gf_engine_set_lock_secret(e, secret.buf, (size_t)secret.len);
	PyBuffer_Release(&secret);
	int py_error = 0;
	if (rc == 0)
		rc = add_gms_uris(e, seq, &py_error);
	Py_DECREF(seq);
	if (py_error) {
		gfpy_strv_free(gpus);
		gf_engine_free(e);
		return -1;
	}
	if (rc == 0)
		rc = gf_engine_set_role(e, role);
	if (rc == 0)
		rc = gf_engine_set_backend(e, kind);
	if (rc == 0 && waking != -2)
		rc = gf_engine_set_waking_timeout(e, waking);
	if (rc == 0 && remap != -2)
		rc = gf_engine_set_remap_timeout(e, remap);
	if (rc == 0 && iobj) /* omitted: the library's default for the role */
		rc = gf_engine_set_init_timeout(e, init_ms);
	if (rc == 0 && priv)
		rc = gf_engine_set_private_bytes(e, priv);
	if (rc == 0 && first_device)
		rc = gf_engine_set_first_device(e, first_device);
	if (rc == 0 && kv_pool)
		rc = gf_engine_set_kv_pool(e, kv_pool);
	if (rc == 0 && need_obj && need_obj != Py_None)
		rc = gf_engine_set_memory_need(e, need);
	if (rc == 0 && gpus_obj != Py_None)
		rc = gf_engine_set_gpus(e, (const char *const *)gpus, ngpus);
	gfpy_strv_free(gpus);
	if (rc == 0 && asleep)
		rc = gf_engine_set_asleep_bytes(e, asleep);
	if (rc == 0 && pinned)
		rc = gf_engine_set_pinned(e, pinned);
	if (rc == 0 && model)
		rc = gf_engine_set_model(e, model);
	if (rc == 0 && reconnect_obj != Py_None)
		rc = gf_engine_set_lock_reconnect_timeout(e, reconnect_ms);
	if (rc == 0 && grace_obj)
		rc = gf_engine_set_loss_grace(e, grace_ms);
	if (rc == 0 && startup_obj != Py_None)
		rc = gf_engine_set_startup_deadline(e, startup_ms);
	if (rc == 0 && wake_priority)
		rc = gf_engine_set_wake_priority(e, wake_priority);
	if (rc == 0 && settle_deferred)
		rc = gf_engine_set_settle_deferred(e, settle_deferred);
	if (rc == 0 && probe_port >= 0)
		rc = gf_engine_set_probe_address(e, probe_addr, (int)probe_port);
	if (rc == 0)
		rc = gf_engine_set_health_fn(e, health_trampoline, self);
	if (rc == 0 && probe_port >= 0)
		rc = gf_engine_start_probe_server(e);
	if (rc < 0) {
		gf_engine_free(e);
		gfpy_raise_gf(rc);
		return -1;
	}
	self->engine = e;
	self->release_handles = !keep_handles;
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
	Py_XDECREF(self->on_step_down);
	Py_XDECREF(self->health);
	Py_XDECREF(self->pending);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static void engine_interrupt_cb(void *arg);
static void *engine_handle(PyObject *obj);

struct init_call {
	gf_engine *engine;
	gf_engine_load_fn load;
	struct step_ctx ctx;
};

static int engine_init_call(void *arg, int64_t unused)
{
	struct init_call *c = arg;
	return gf_engine_init_weights(c->engine, c->load, &c->ctx);
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
	struct init_call c = { self->engine, fn == Py_None ? NULL : load_trampoline, { self, fn } };
	/* A follower may wait here for as long as its loader loads: PEP 475, as acquire(). */
	int rc = gfpy_wait_interruptible(engine_init_call, &c, engine_interrupt_cb, engine_handle, (PyObject *)self,
					 &self->busy, &self->closing, -1);
	if (rc == GFPY_PYERR) {
		Py_CLEAR(self->pending);
		return NULL;
	}
	if (rc == GFPY_CLOSED)
		return PyErr_Format(gfpy_InterruptedError, "init_weights: the Engine was closed by a signal handler");
	/* The clients exist from here on; their first unmap is the engine's sleep. */
	for (int i = 0; rc == 0 && self->release_handles && i < gf_engine_device_count(self->engine); i++)
		rc = gf_gms_set_keep_handles(gf_engine_gms(self->engine, i), 0);
	return step_result(self, rc);
}

#define ENGINE_STEP(name, call)                                                 \
	static PyObject *Engine_##name(EngineObject *self, PyObject *unused)    \
	{                                                                       \
		if (engine_ready(self) < 0)                                     \
			return NULL;                                            \
		int rc;                                                         \
		BLOCKING(self, rc = call);                                      \
		return step_result(self, rc);                                   \
	}
ENGINE_STEP(sleep, gf_engine_sleep(self->engine))
ENGINE_STEP(wake_up, gf_engine_wake_up(self->engine))
#undef ENGINE_STEP

static PyObject *Engine_sleep_checked(EngineObject *self, PyObject *unused)
{
	/* Sleep unmaps the weights: refuse while Python still holds views on them. */
	for (int i = 0; i < 16; i++)
		if (self->views[i] && gfpy_no_exports(self->views[i], "sleep") < 0)
			return NULL;
	return Engine_sleep(self, unused);
}

static PyObject *Engine_add_holder_pid(EngineObject *self, PyObject *arg)
{
	int pid;
	if (PyBool_Check(arg))
		return PyErr_Format(PyExc_TypeError, "pid must be an int, not bool");
	if (engine_ready(self) < 0 || !PyArg_Parse(arg, "i", &pid))
		return NULL;
	int rc;
	BLOCKING(self, rc = gf_engine_add_holder_pid(self->engine, pid));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Engine_wake_as_rank(EngineObject *self, PyObject *arg)
{
	uint64_t epoch;
	if (engine_ready(self) < 0 || !gfpy_u64_arg(arg, &epoch))
		return NULL;
	int rc;
	BLOCKING(self, rc = gf_engine_wake_as_rank(self->engine, epoch));
	return step_result(self, rc);
}

static void engine_interrupt_cb(void *arg)
{
	gf_engine_interrupt(arg);
}

static void *engine_handle(PyObject *obj)
{
	return ((EngineObject *)obj)->engine;
}

static int engine_acquire_call(void *ctx, int64_t ms)
{
	return gf_engine_acquire(ctx, ms);
}

static PyObject *Engine_acquire(EngineObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tobj = Py_None;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &tobj))
		return NULL;
	if (engine_ready(self) < 0 || gfpy_timeout_arg(tobj, &ms, 1) < 0)
		return NULL;
	self->acquiring++;
	int rc = gfpy_wait_interruptible(engine_acquire_call, self->engine, engine_interrupt_cb, engine_handle,
				    (PyObject *)self, &self->busy, &self->closing, ms);
	self->acquiring--;
	if (rc == GFPY_PYERR)
		return NULL;
	if (rc == GFPY_CLOSED)
		return PyErr_Format(gfpy_InterruptedError, "acquire: the Engine was closed by a signal handler");
	if (rc == GF_ERR_INTERRUPTED && self->closing)
		return PyErr_Format(gfpy_InterruptedError, "acquire: the Engine was closed by another thread");
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
	BLOCKING(self, rc = gf_engine_serve(self->engine, fn == Py_None ? NULL : step_trampoline, &ctx));
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
		return gfpy_raise_gf(rc);
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
	BLOCKING(self, code = gf_engine_probe(self->engine, probe));
	if (code < 0)
		return gfpy_raise_gf(code);
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
		return gfpy_raise_gf(rc);
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
		return gfpy_raise_gf(rc);
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
		return gfpy_raise_gf(rc);
	PyObject *r = gfpy_json_loads(text);
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

/* socket.socket over a duplicate of the lock's listener @name: the caller owns it. */
static PyObject *Engine_listener(EngineObject *self, PyObject *args)
{
	const char *name;
	if (!PyArg_ParseTuple(args, "s", &name))
		return NULL;
	if (engine_ready(self) < 0)
		return NULL;
	int fd, rc = gf_engine_listener(self->engine, name, &fd);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	PyObject *mod = PyImport_ImportModule("socket");
	PyObject *sock = mod ? PyObject_CallMethod(mod, "socket", "iiii", -1, -1, -1, fd) : NULL;
	Py_XDECREF(mod);
	if (!sock)
		close(fd);
	return sock;
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
		return gfpy_raise_gf(rc);
	return Py_BuildValue("(KK)", (unsigned long long)addr, (unsigned long long)size);
}

static PyObject *Engine_set_kv_layout(EngineObject *self, PyObject *args)
{
	uint64_t block;
	const char *hash;
	Py_ssize_t hlen;
	if (!PyArg_ParseTuple(args, "O&y#", gfpy_u64_arg, &block, &hash, &hlen))
		return NULL;
	if (hlen != 16) {
		PyErr_Format(PyExc_ValueError, "set_kv_layout: the layout hash is 16 bytes, not %zd", hlen);
		return NULL;
	}
	if (engine_ready(self) < 0)
		return NULL;
	int rc = gf_engine_set_kv_layout(self->engine, block, (const uint8_t *)hash);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Engine_kv_pool_info(EngineObject *self, PyObject *args)
{
	int device = 0;
	if (!PyArg_ParseTuple(args, "|i", &device))
		return NULL;
	if (engine_ready(self) < 0)
		return NULL;
	struct gf_gms_kv_map_info i;
	int rc = gf_engine_kv_pool_info(self->engine, device, &i);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return Py_BuildValue("{s:K, s:K, s:I, s:O, s:s}", "size", (unsigned long long)i.size, "previous_epoch",
			     (unsigned long long)i.previous_epoch, "blocks", i.blocks, "created",
			     i.created ? Py_True : Py_False, "start", i.start);
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

/* On the lock's watcher thread: the callable should only hand the work to another thread. */
static void step_down_trampoline(gf_engine *e, void *ud)
{
	(void)e;
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *fn = ((EngineObject *)ud)->on_step_down;
	if (fn) {
		PyObject *r = PyObject_CallNoArgs(fn);
		if (!r)
			PyErr_WriteUnraisable(fn);
		Py_XDECREF(r);
	}
	PyGILState_Release(g);
}

static PyObject *Engine_get_on_step_down(EngineObject *self, void *c)
{
	return gfpy_hook_get(self->on_step_down);
}

static int Engine_set_on_step_down(EngineObject *self, PyObject *v, void *c)
{
	if (engine_ready(self) < 0)
		return -1;
	if (v && v != Py_None && !PyCallable_Check(v)) {
		PyErr_SetString(PyExc_TypeError, "on_step_down must be callable() or None");
		return -1;
	}
	if (!v || v == Py_None) {
		Py_CLEAR(self->on_step_down);
		gf_engine_set_step_down_fn(self->engine, NULL, NULL);
	} else {
		Py_INCREF(v);
		Py_XSETREF(self->on_step_down, v);
		gf_engine_set_step_down_fn(self->engine, step_down_trampoline, self);
	}
	return 0;
}

static PyObject *Engine_step_down(EngineObject *self, PyObject *unused)
{
	if (engine_ready(self) < 0)
		return NULL;
	int rc;
	BLOCKING(self, rc = gf_engine_step_down(self->engine));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Engine_settle(EngineObject *self, PyObject *unused)
{
	if (engine_ready(self) < 0)
		return NULL;
	int rc;
	BLOCKING(self, rc = gf_engine_settle(self->engine));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *Engine_get_on_loss(EngineObject *self, void *c)
{
	return gfpy_hook_get(self->on_loss);
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
		gfpy_raise_gf(rc);
		return -1;
	}
	return 0;
}

static PyObject *Engine_get_health(EngineObject *self, void *c)
{
	return gfpy_hook_get(self->health);
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
	/* acquire() on another thread is interrupted and waited for; any other
	 * call (wake_up, serve, a view's remap ...) cannot be, so close() raises. */
	if (self->busy > 0 && self->busy == self->acquiring) {
		self->closing = 1;
		gf_engine_interrupt(self->engine);
		gfpy_wait_idle(&self->busy);
		self->closing = 0;
		if (!self->engine)
			Py_RETURN_NONE; /* another close() finished meanwhile */
	}
	if (gfpy_refuse_busy(self->busy, "Engine", "close") < 0)
		return NULL;
	for (int i = 0; i < 16; i++)
		if (self->views[i] && (gfpy_no_exports(self->views[i], "close") < 0 ||
				       gfpy_refuse_busy(self->views[i]->busy, "Engine", "close") < 0))
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
	  "init_weights($self, load=None)\n--\n\n"
	  "init_weights(load=None)\n\nConnect every GMS (loader: rw_or_ro, follower: ro). Where this engine is\n"
	  "the writer, load(device, gms) is called and must allocate, fill, put metadata and commit;\n"
	  "elsewhere the committed weights are imported read-only. Stays in Init." },
	{ "sleep", (PyCFunction)Engine_sleep_checked, METH_NOARGS,
	  "sleep($self, /)\n--\n\n"
	  "Unmap the weights (addresses stay reserved) and enter Standby." },
	{ "acquire", (PyCFunction)(void (*)(void))Engine_acquire, METH_VARARGS | METH_KEYWORDS,
	  "acquire($self, timeout=None)\n--\n\n"
	  "acquire(timeout=None) -> epoch\n\nBlock on the lock (GIL released, Ctrl-C works); enter Waking." },
	{ "wake_as_rank", (PyCFunction)Engine_wake_as_rank, METH_O,
	  "wake_as_rank($self, epoch, /)\n--\n\n"
	  "A rank engine's acquire() (rank >= 1, lock=None): rank 0 holds the lock at @epoch, so\n"
	  "this rank wakes too. Waits at the memory gate (up to the waking timeout; GIL released)\n"
	  "and enters Waking; then wake_up() and serve() as for rank 0. Raises ValueError\n"
	  "(epoch 0), StateError (not a rank engine, not Standby), OutOfMemoryError (the gate\n"
	  "never opened: the engine is Dead)." },
	{ "add_holder_pid", (PyCFunction)Engine_add_holder_pid, METH_O,
	  "add_holder_pid($self, pid, /)\n--\n\n"
	  "Register another process of this engine (a rank) with its lock (LockClient.add_pid):\n"
	  "the next holder is granted only once that process has exited too. Any state but\n"
	  "Dead, any thread; kept until the lock client exists (the first acquire()). Raises\n"
	  "ValueError, StateError (a rank engine, or Dead), NotFoundError, NotSupportedError\n"
	  "(not a unix:// lock), GpuFailoverError (TOO_BIG: more than 64)." },
	{ "wake_up", (PyCFunction)Engine_wake_up, METH_NOARGS,
	  "wake_up($self, /)\n--\n\n"
	  "Remap weights, allocate private memory (retrying on OOM within the waking timeout).\n"
	  "Failure is fatal: the engine is Dead and the caller should exit." },
	{ "serve", (PyCFunction)(void (*)(void))Engine_serve, METH_VARARGS | METH_KEYWORDS,
	  "serve($self, serve=None)\n--\n\n"
	  "serve(serve=None)\n\nRun serve() (register the endpoint), then enter Active." },
	{ "step_down", (PyCFunction)Engine_step_down, METH_NOARGS, "step_down($self, /)\n--\n\n"
	  "Finish a planned switchover (after on_step_down, once in-flight requests are done):\n"
	  "release the lock (the standby is granted at once) and enter 'dead'; then exit with\n"
	  "status 75. Raises StateError when the lock is not held." },
	{ "mark_dead", (PyCFunction)Engine_mark_dead, METH_VARARGS, "mark_dead($self, reason='marked dead by the engine', /)\n--\n\n"
	  "mark_dead(reason='')" },
	{ "probe", (PyCFunction)Engine_probe, METH_O, "probe($self, probe, /)\n--\n\n"
	  "probe('live'|'ready'|'startup') -> HTTP status" },
	{ "metrics_text", (PyCFunction)Engine_metrics_text, METH_NOARGS, "metrics_text($self, /)\n--\n\n"
	  "Prometheus text of the metrics" },
	{ "state_info", (PyCFunction)Engine_state_info, METH_NOARGS, "state_info($self, /)\n--\n\n"
	  "the /state document as a dict" },
	{ "listener", (PyCFunction)Engine_listener, METH_VARARGS, "listener($self, name, /)\n--\n\n"
	  "listener(name) -> socket.socket\n\nThe listening socket the lock carries under @name (gf-lockd --listener\n"
	  "NAME=URI), for the serve step: a new duplicate the caller owns. Connections\n"
	  "that arrived while no engine was Active wait in its backlog. Raises\n"
	  "StateError when the lock is not held, NotFoundError for an unknown name,\n"
	  "NotSupportedError on a tcp:// lock." },
	{ "gms", (PyCFunction)Engine_gms, METH_VARARGS, "gms($self, device=0, /)\n--\n\n"
	  "gms(device=0) -> GMSClient owned by the engine" },
	{ "private_memory", (PyCFunction)Engine_private_memory, METH_VARARGS,
	  "private_memory($self, device=0, /)\n--\n\n"
	  "private_memory(device=0) -> (addr, size) of the KV memory: the address is fixed from\n"
	  "init_weights() on, memory backs it from the wake on" },
	{ "set_kv_layout", (PyCFunction)Engine_set_kv_layout, METH_VARARGS,
	  "set_kv_layout($self, block_bytes, layout_hash, /)\n--\n\n"
	  "With kv_pool=True: the KV layout the pool's directory is for (bytes per block, a\n"
	  "16-byte hash of the cache's shape). In init or standby; the next wake uses it." },
	{ "kv_pool_info", (PyCFunction)Engine_kv_pool_info, METH_VARARGS,
	  "kv_pool_info($self, device=0, /)\n--\n\n"
	  "kv_pool_info(device=0) -> dict(size, previous_epoch, blocks, created, start): what the\n"
	  "last wake's map of the GMS's KV pool found. Raises StateError when none is mapped." },
	{ "settle", (PyCFunction)Engine_settle, METH_NOARGS, "settle($self, /)\n--\n\n"
	  "After serve() with settle_deferred=True: tell the lock's readiness relay that this engine\n"
	  "serves and write the log lines the wake held. Once per wake; later calls do nothing." },
	{ "close", (PyCFunction)Engine_close, METH_NOARGS, "close($self, /)\n--\n\n"
	  "Release everything (and the lock)." },
	{ NULL },
};

static PyGetSetDef Engine_getset[] = {
	{ "state", (getter)Engine_get_state, NULL, "'init', 'standby', 'waking', 'active' or 'dead'", NULL },
	{ "metrics", (getter)Engine_get_metrics, NULL, "dict of state, transitions, failovers and the last wake's breakdown", NULL },
	{ "epoch", (getter)Engine_get_epoch, NULL, "fencing epoch of the lock grant", NULL },
	{ "probe_port", (getter)Engine_get_probe_port, NULL, "port of the built-in probe server, or None", NULL },
	{ "on_loss", (getter)Engine_get_on_loss, (setter)Engine_set_on_loss,
	  "callable(code, detail) on lock or GMS loss; None restores the default (log and terminate)", NULL },
	{ "on_step_down", (getter)Engine_get_on_step_down, (setter)Engine_set_on_step_down,
	  "callable() when a planned switchover asks this engine to step down (runs on the lock's\n"
	  "watcher thread: signal the main thread, which stops accepting, drains and calls step_down())",
	  NULL },
	{ "health", (getter)Engine_get_health, (setter)Engine_set_health,
	  "callable() -> bool deciding /live and /ready while Active", NULL },
	{ NULL },
};

PyTypeObject gfpy_EngineType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.Engine",
	.tp_basicsize = sizeof(EngineObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Engine(lock, engine_id, gms, *, role='loader', backend='auto', waking_timeout=120,\n"
		  "       remap_timeout=30, init_timeout=..., private_bytes=0, probe_port=None,\n"
		  "       probe_address=None, gpus=None, memory_need=None, asleep_bytes=0, pinned=False,\n"
		  "       model=None, rank=0, lock_reconnect_timeout=None, loss_grace=10,\n"
		  "       startup_deadline=None, wake_priority=0, settle_deferred=False,\n"
		  "       keep_handles=True, first_device=0, kv_pool=False, lock_secret=None)\n\n"
		  "The engine state machine Init -> Standby -> Waking -> Active -> Dead.\n"
		  "init_timeout: seconds Init waits for each GMS (a follower: for the loader's commit);\n"
		  "None waits forever; omitted: a follower 1800 s, a loader forever.\n"
		  "memory_need: free bytes every device must have before Waking (None: private_bytes;\n"
		  "0: no gate). The standby pool, declared to the lock server with every acquire:\n"
		  "gpus (at most 8 UUIDs; None: the devices' own UUIDs on cuda, none on host),\n"
		  "asleep_bytes (memory kept while asleep), pinned (never evicted for a GPU's standby\n"
		  "budget) and model (answered by ready_for()).\n"
		  "rank: >= 1 makes a rank engine (lock=None): a further process of the engine\n"
		  "engine_id, whose rank 0 holds the lock; it wakes with wake_as_rank(epoch).\n"
		  "lock_reconnect_timeout: how long the lock client reconnects after losing the server\n"
		  "before the loss policy runs on tcp:// (None: the client's default; on unix:// it holds\n"
		  "on past it until the server returns). loss_grace: the default loss\n"
		  "policy's time between SIGTERM and _exit(70). startup_deadline: not in Standby this\n"
		  "long after construction -> Dead, loss policy with TimeoutError (None: none).\n"
		  "wake_priority: SCHED_FIFO priority 1..99 of the acquiring thread until Active (0: off).\n"
		  "settle_deferred: serve() returns at Active before the readiness report; call settle().\n"
		  "keep_handles: True (default) keeps every GMS session and its imported handles through\n"
		  "sleep, so a wake maps without fd passing; False releases the handles at sleep, so a\n"
		  "sleeping engine pins none of the GMS's memory (each wake receives every fd again).\n"
		  "first_device: the device ordinal of gms[0]; gms[i] is on device first_device + i\n"
		  "(a tensor-parallel rank N on GPU N passes N; the host backend has only device 0).\n"
		  "kv_pool: back the private memory with each GMS's KV pool (a GMS fenced by the lock):\n"
		  "the wake maps the memory the previous holder used instead of creating it.\n"
		  "lock_secret: the shared secret (bytes) a tcp:// lock server requires (for etcd the\n"
		  "user's password); copied, and the copy wiped when the engine is freed. A wrong or\n"
		  "missing one makes acquire() raise PermissionError.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Engine_init,
	.tp_dealloc = (destructor)Engine_dealloc,
	.tp_methods = Engine_methods,
	.tp_getset = Engine_getset,
};
