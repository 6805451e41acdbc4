/* SPDX-License-Identifier: Apache-2.0 */
/* GMSClient: client of one GPU Memory Service. */
#include <sys/eventfd.h>

#include "common.h"

int gfpy_gms_ready(GMSObject *self)
{
	if (!self->gms) {
		PyErr_SetString(PyExc_ValueError, "GMSClient is closed or not initialized");
		return -1;
	}
	return 0;
}

/* Ready, and no other thread is in a call on it (the library object is not
 * for concurrent use). */
static int gms_idle(GMSObject *self, const char *what)
{
	return gfpy_gms_ready(self) < 0 || gfpy_refuse_busy(self->busy, "GMSClient", what) < 0 ? -1 : 0;
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
	gfpy_run_hook(&((GMSObject *)ud)->on_lost, err, detail);
}

/* The fence proof of a Grant (Lock.acquire()): its epoch and session token. */
static int grant_proof(PyObject *grant, struct gf_lock_proof *out)
{
	PyObject *ep = PyObject_GetAttrString(grant, "epoch");
	PyObject *tok = ep ? PyObject_GetAttrString(grant, "session_token") : NULL;
	int rc = -1;
	struct gf_lock_grant g = { .epoch = 0 };
	if (!ep || !tok) {
		PyErr_Clear();
		PyErr_SetString(PyExc_TypeError, "grant: expected a Grant from Lock.acquire() (epoch, session_token)");
		goto out;
	}
	g.epoch = PyLong_AsUnsignedLongLong(ep);
	if (PyErr_Occurred())
		goto out;
	if (!PyBytes_Check(tok) || PyBytes_GET_SIZE(tok) != (Py_ssize_t)sizeof(g.session_token)) {
		PyErr_Format(PyExc_ValueError, "grant: session_token must be %zu bytes", sizeof(g.session_token));
		goto out;
	}
	memcpy(g.session_token, PyBytes_AS_STRING(tok), sizeof(g.session_token));
	if (g.epoch == 0) {
		PyErr_SetString(PyExc_ValueError, "grant: epoch 0 names no grant");
		goto out;
	}
	int r = gf_lock_grant_proof(&g, out);
	if (r < 0) {
		gfpy_raise_gf(r);
		goto out;
	}
	rc = 0;
out:
	Py_XDECREF(ep);
	Py_XDECREF(tok);
	return rc;
}

/*
 * A wait by progress may last as long as a loader loads, so it follows PEP
 * 475 as LockClient.acquire() does: a signal with a Python handler writes
 * the eventfd the connect polls, the wait is withdrawn, the handler runs,
 * and unless it raised the connect is made again (its timeout counting
 * afresh).
 */
struct progress_connect {
	const char *uri;
	gf_mem *mem;
	int mode;
	int64_t ms;
	const struct gf_lock_proof *proof;
	int cancel_fd;
	gf_gms *g;
};

static int progress_connect_call(void *ctx, int64_t unused)
{
	struct progress_connect *p = ctx;
	const struct gf_gms_connect_opts opts = { .proof = p->proof, .by_progress = 1, .cancel_fd = p->cancel_fd };
	int rc = gf_gms_connect(&p->g, p->uri, p->mem, p->mode, p->ms, &opts);
	if (rc == GF_ERR_INTERRUPTED) {
		uint64_t n;
		ssize_t r = read(p->cancel_fd, &n, sizeof(n));
		(void)r; /* non-blocking: drained or already empty */
	}
	return rc;
}

/* From a signal handler: async-signal-safe. */
static void progress_connect_wake(void *ctx)
{
	uint64_t one = 1;
	ssize_t n = write(((struct progress_connect *)ctx)->cancel_fd, &one, sizeof(one));
	(void)n; /* a full counter already wakes the wait */
}

static void *progress_connect_handle(PyObject *capsule)
{
	return PyCapsule_GetPointer(capsule, NULL);
}

/* Connect by progress, interruptible; 0 with *out set, or -1 with an exception. */
static int connect_by_progress(GMSObject *self, struct progress_connect *p, gf_gms **out)
{
	p->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p->cancel_fd < 0) {
		PyErr_SetFromErrno(PyExc_OSError);
		return -1;
	}
	PyObject *capsule = PyCapsule_New(p, NULL, NULL);
	if (!capsule) {
		close(p->cancel_fd);
		return -1;
	}
	const int stop = 0;
	int rc = gfpy_wait_interruptible(progress_connect_call, p, progress_connect_wake, progress_connect_handle,
					 capsule, &self->busy, &stop, -1);
	Py_DECREF(capsule);
	close(p->cancel_fd);
	if (rc == GFPY_PYERR)
		return -1;
	if (rc < 0) {
		gfpy_raise_gf(rc);
		return -1;
	}
	*out = p->g;
	return 0;
}

static int GMS_init(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "memory", "mode", "timeout", "grant", "by_progress", NULL };
	const char *uri;
	PyObject *mobj, *modeobj = NULL, *tobj = Py_None, *grant = Py_None;
	int mode = GF_GMS_RO, by_progress = 0;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "sO!|OO$Op", kwlist, &uri, &gfpy_MemoryType, &mobj, &modeobj, &tobj,
					 &grant, &by_progress))
		return -1;
	struct gf_lock_proof proof;
	if (grant != Py_None && grant_proof(grant, &proof) < 0)
		return -1;
	if (self->gms) {
		PyErr_SetString(PyExc_RuntimeError, "GMSClient is already initialized");
		return -1;
	}
	if ((modeobj && mode_arg(modeobj, &mode) < 0) || gfpy_timeout_arg(tobj, &ms, 1) < 0)
		return -1;
	if (gfpy_memory_ready((MemoryObject *)mobj) < 0)
		return -1;
	gf_gms *g = NULL;
	int rc;
	gf_mem *mem = ((MemoryObject *)mobj)->mem;
	if (by_progress) {
		struct progress_connect p = { uri, mem, mode, ms, grant != Py_None ? &proof : NULL, -1, NULL };
		if (connect_by_progress(self, &p, &g) < 0)
			return -1;
	} else {
		const struct gf_gms_connect_opts opts = { .proof = grant != Py_None ? &proof : NULL };
		Py_BEGIN_ALLOW_THREADS
		rc = gf_gms_connect(&g, uri, mem, mode, ms, &opts);
		Py_END_ALLOW_THREADS
		if (rc < 0) {
			gfpy_raise_gf(rc);
			return -1;
		}
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
		gfpy_engine_forget_view(self->owner_ref, self);
	Py_XDECREF(self->owner_ref);
	Py_XDECREF(self->on_lost);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Unmapping under a live numpy array or tensor would leave it pointing at
 * inaccessible memory, so (like mmap.close()) refuse while exports exist. */
int gfpy_no_exports(GMSObject *self, const char *what)
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
	if (gms_idle(self, "allocate") < 0)
		return NULL;
	if (size <= 0)
		return PyErr_Format(PyExc_ValueError, "size must be > 0, not %lld", size);
	uint64_t id;
	int rc;
	BLOCKING(self, rc = gf_gms_allocate(self->gms, (uint64_t)size, tag, &id));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return PyLong_FromUnsignedLongLong(id);
}

static PyObject *GMS_put_meta(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "key", "alloc_id", "offset", "value", NULL };
	const char *key;
	uint64_t aid, off = 0;
	Py_buffer value = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "sO&|O&y*", kwlist, &key, gfpy_u64_arg, &aid, gfpy_u64_arg, &off, &value))
		return NULL;
	if (gms_idle(self, "put_meta") < 0) {
		PyBuffer_Release(&value);
		return NULL;
	}
	int rc;
	BLOCKING(self, rc = gf_gms_put_meta(self->gms, key, aid, off, value.buf, (size_t)value.len));
	PyBuffer_Release(&value);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_commit(GMSObject *self, PyObject *unused)
{
	if (gms_idle(self, "commit") < 0)
		return NULL;
	uint64_t gen;
	int rc;
	BLOCKING(self, rc = gf_gms_commit(self->gms, &gen));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return PyLong_FromUnsignedLongLong(gen);
}

static PyObject *GMS_report_progress(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "done", "total", NULL };
	uint64_t done, total = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O&", kwlist, gfpy_u64_arg, &done, gfpy_u64_arg, &total))
		return NULL;
	if (gms_idle(self, "report_progress") < 0)
		return NULL;
	int rc;
	BLOCKING(self, rc = gf_gms_report_progress(self->gms, done, total));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

/* (index, hash) pairs into blocks; -1 with a Python error set. */
static int kv_blocks_arg(PyObject *o, struct gf_gms_kv_block **out, size_t *n)
{
	PyObject *seq = PySequence_Fast(o, "add must be a sequence of (index, hash) pairs");
	if (!seq)
		return -1;
	size_t len = (size_t)PySequence_Fast_GET_SIZE(seq);
	struct gf_gms_kv_block *b = len ? calloc(len, sizeof(*b)) : NULL;
	if (len && !b) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (size_t i = 0; i < len; i++) {
		unsigned int index;
		const char *hash;
		Py_ssize_t hlen;
		if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "Iy#", &index, &hash, &hlen)) {
			Py_DECREF(seq);
			free(b);
			return -1;
		}
		if (hlen < 1 || hlen > (Py_ssize_t)sizeof(b[i].hash)) {
			Py_DECREF(seq);
			free(b);
			PyErr_Format(PyExc_ValueError, "block %u: a hash of %zd bytes (1..48)", index, hlen);
			return -1;
		}
		b[i].index = index;
		b[i].hash_len = (uint32_t)hlen;
		memcpy(b[i].hash, hash, (size_t)hlen);
	}
	Py_DECREF(seq);
	*out = b;
	*n = len;
	return 0;
}

static PyObject *GMS_kv_publish(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "epoch", "add", "remove", "clear", NULL };
	uint64_t epoch;
	PyObject *add_obj = NULL, *rm_obj = NULL;
	int clear = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|OOp", kwlist, gfpy_u64_arg, &epoch, &add_obj, &rm_obj, &clear))
		return NULL;
	if (gms_idle(self, "kv_publish") < 0)
		return NULL;
	struct gf_gms_kv_block *add = NULL;
	size_t nadd = 0, nrm = 0;
	uint32_t *rm = NULL;
	if (add_obj && add_obj != Py_None && kv_blocks_arg(add_obj, &add, &nadd) < 0)
		return NULL;
	if (rm_obj && rm_obj != Py_None) {
		PyObject *seq = PySequence_Fast(rm_obj, "remove must be a sequence of block indexes");
		if (!seq) {
			free(add);
			return NULL;
		}
		nrm = (size_t)PySequence_Fast_GET_SIZE(seq);
		rm = nrm ? calloc(nrm, sizeof(*rm)) : NULL;
		for (size_t i = 0; rm && i < nrm; i++) {
			unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));
			if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
				if (!PyErr_Occurred())
					PyErr_Format(PyExc_ValueError, "block index %lu is out of range", v);
				free(rm);
				rm = NULL;
				nrm = 0;
				break;
			}
			rm[i] = (uint32_t)v;
		}
		Py_DECREF(seq);
		if (PyErr_Occurred() || (nrm && !rm)) {
			free(add);
			return PyErr_Occurred() ? NULL : PyErr_NoMemory();
		}
	}
	int rc;
	BLOCKING(self, rc = gf_gms_kv_publish(self->gms, epoch, clear, add, nadd, rm, nrm));
	free(add);
	free(rm);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_kv_directory(GMSObject *self, PyObject *unused)
{
	if (gms_idle(self, "kv_directory") < 0)
		return NULL;
	struct gf_gms_kv_block *b = NULL;
	size_t n = 0;
	uint64_t epoch = 0;
	int rc;
	BLOCKING(self, rc = gf_gms_kv_directory(self->gms, &b, &n, &epoch));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++) {
		PyObject *t = Py_BuildValue("(Iy#)", b[i].index, (const char *)b[i].hash, (Py_ssize_t)b[i].hash_len);
		if (!t) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, t);
	}
	free(b);
	if (!list)
		return NULL;
	return Py_BuildValue("(KN)", (unsigned long long)epoch, list);
}

static PyObject *GMS_map_all(GMSObject *self, PyObject *unused)
{
	if (gms_idle(self, "map_all") < 0)
		return NULL;
	int rc;
	BLOCKING(self, rc = gf_gms_map_all(self->gms));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_unmap(GMSObject *self, PyObject *unused)
{
	if (gms_idle(self, "unmap") < 0 || gfpy_no_exports(self, "unmap") < 0)
		return NULL;
	int rc;
	BLOCKING(self, rc = gf_gms_unmap(self->gms));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

/* The library cannot interrupt a GMS wait, so on the main thread remap()
 * waits in slices and runs the signal handlers between them (PEP 475): a
 * handler that raises ends the call, else the wait goes on. */
#define REMAP_SLICE_MS 200

static PyObject *GMS_remap(GMSObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tobj;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O", kwlist, &tobj))
		return NULL;
	if (gms_idle(self, "remap") < 0 || gfpy_timeout_arg(tobj, &ms, 0) < 0)
		return NULL;
	const int64_t deadline = gfpy_now_ms() + ms;
	int rc;
	for (;;) {
		int64_t left = deadline - gfpy_now_ms();
		if (left < 0)
			left = 0;
		int64_t slice = gfpy_in_main_thread() && left > REMAP_SLICE_MS ? REMAP_SLICE_MS : left;
		BLOCKING(self, rc = gf_gms_remap(self->gms, slice));
		if (rc != GF_ERR_TIMEOUT || slice == left)
			break;
		/* A handler may close this client: check it again before going on. */
		if (PyErr_CheckSignals() < 0 || gms_idle(self, "remap") < 0)
			return NULL;
	}
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_close(GMSObject *self, PyObject *unused)
{
	/* No library call of a GMS client can be interrupted: a close() while
	 * another thread waits in one (remap) raises instead of freeing under it. */
	if (gfpy_no_exports(self, "close") < 0 || gfpy_refuse_busy(self->busy, "GMSClient", "close") < 0)
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
	if (gfpy_gms_ready(self) < 0)
		return NULL;
	int rc = gf_gms_process(self->gms);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_set_keep_handles(GMSObject *self, PyObject *keep)
{
	if (gfpy_gms_ready(self) < 0)
		return NULL;
	if (!PyBool_Check(keep)) {
		PyErr_Format(PyExc_TypeError, "set_keep_handles() takes a bool, not %.100s", Py_TYPE(keep)->tp_name);
		return NULL;
	}
	int rc = gf_gms_set_keep_handles(self->gms, keep == Py_True);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_start_watch(GMSObject *self, PyObject *unused)
{
	if (gfpy_gms_ready(self) < 0)
		return NULL;
	int rc = gf_gms_start_watch(self->gms);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

static PyObject *GMS_fileno(GMSObject *self, PyObject *unused)
{
	if (gfpy_gms_ready(self) < 0)
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
	if (gfpy_gms_ready(self) < 0)
		return NULL;
	size_t n = gf_gms_alloc_count(self->gms);
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++) {
		struct gf_gms_alloc_info a;
		int rc = gf_gms_alloc_at(self->gms, i, &a);
		if (rc < 0) {
			Py_DECREF(list);
			return gfpy_raise_gf(rc);
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
	if (gfpy_gms_ready(self) < 0)
		return NULL;
	size_t n = gf_gms_meta_count(self->gms);
	PyObject *d = PyDict_New();
	for (size_t i = 0; d && i < n; i++) {
		struct gf_gms_meta m;
		int rc = gf_gms_meta_at(self->gms, i, &m);
		if (rc < 0) {
			Py_DECREF(d);
			return gfpy_raise_gf(rc);
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
	if (gfpy_gms_ready(self) < 0)
		return NULL;
	uint8_t hash[16];
	uint64_t gen;
	int rc = gf_gms_layout(self->gms, hash, &gen);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return Py_BuildValue("(y#K)", (const char *)hash, (Py_ssize_t)16, (unsigned long long)gen);
}

static PyObject *GMS_get_on_lost(GMSObject *self, void *c)
{
	return gfpy_hook_get(self->on_lost);
}

static int GMS_set_on_lost(GMSObject *self, PyObject *v, void *c)
{
	return gfpy_hook_set(&self->on_lost, v, "on_lost");
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
	uint64_t off = 0;
	long long size = -1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|z$OO&LsO", kwlist, &key, &aidobj, gfpy_u64_arg, &off, &size, &dtype,
					 &shapeobj))
		return NULL;
	if (gfpy_gms_ready(self) < 0)
		return NULL;
	size_t di;
	for (di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++)
		if (!strcmp(dtypes[di].name, dtype))
			break;
	if (di == sizeof(dtypes) / sizeof(dtypes[0]))
		return PyErr_Format(PyExc_ValueError, "unknown dtype '%s'", dtype);
	Py_ssize_t itemsize = dtypes[di].bits / 8;

	uint64_t start = 0, limit = 0; /* the view's first byte before offset=, the allocation's end */
	if (key) {
		struct gf_gms_meta m;
		int rc = gf_gms_meta_get(self->gms, key, &m);
		if (rc < 0)
			return gfpy_raise_gf(rc);
		start = m.addr;
		for (size_t i = 0; i < gf_gms_alloc_count(self->gms); i++) {
			struct gf_gms_alloc_info a;
			if (gf_gms_alloc_at(self->gms, i, &a) == 0 && a.id == m.alloc_id)
				limit = a.addr + a.size;
		}
	} else {
		if (aidobj == Py_None)
			return PyErr_Format(PyExc_TypeError, "buffer() needs a metadata key or alloc_id=");
		uint64_t aid;
		if (!gfpy_u64_arg(aidobj, &aid))
			return NULL;
		int found = 0;
		for (size_t i = 0; i < gf_gms_alloc_count(self->gms); i++) {
			struct gf_gms_alloc_info a;
			if (gf_gms_alloc_at(self->gms, i, &a) == 0 && a.id == aid) {
				start = a.addr;
				limit = a.addr + a.size;
				found = 1;
			}
		}
		if (!found)
			return PyErr_Format(gfpy_NotFoundError, "no allocation with id %llu", (unsigned long long)aid);
	}
	if (gf_gms_granted_mode(self->gms) == 0 || start == 0)
		return PyErr_Format(gfpy_StateError, "the weights are not mapped (asleep? call remap() or map_all())");
	/* Compared before adding, so a huge offset cannot wrap around into range. */
	if (start >= limit || off >= limit - start)
		return PyErr_Format(PyExc_ValueError, "offset beyond the end of the allocation");
	const uint64_t base = start + off;

	MappingObject *mo = PyObject_New(MappingObject, &gfpy_MappingType);
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
		if (nd > GFPY_MAX_DIMS) { /* 0 dimensions: a scalar, one item */
			Py_DECREF(seq);
			PyErr_Format(PyExc_ValueError, "shape must have at most %d dimensions", GFPY_MAX_DIMS);
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
	  "allocate($self, size, tag='')\n--\n\n"
	  "allocate(size, tag='') -> id\n\nWriter: allocate in the GMS, import and map read-write." },
	{ "put_meta", (PyCFunction)(void (*)(void))GMS_put_meta, METH_VARARGS | METH_KEYWORDS,
	  "put_meta($self, key, alloc_id, offset=0, value=b'')\n--\n\n"
	  "put_meta(key, alloc_id, offset=0, value=b'')\n\nWriter: record a metadata entry." },
	{ "commit", (PyCFunction)GMS_commit, METH_NOARGS,
	  "commit($self, /)\n--\n\n"
	  "commit() -> generation\n\nWriter: validate, hash the layout, commit; the client becomes a reader." },
	{ "report_progress", (PyCFunction)(void (*)(void))GMS_report_progress, METH_VARARGS | METH_KEYWORDS,
	  "report_progress($self, done, total=0)\n--\n\n"
	  "report_progress(done, total=0)\n\nWriter: bytes written so far (of total, 0: unknown). Readers waiting\n"
	  "by_progress keep waiting while the writer reports; at most one report per 100 ms\n"
	  "goes to the GMS (later calls return at once)." },
	{ "kv_publish", (PyCFunction)(void (*)(void))GMS_kv_publish, METH_VARARGS | METH_KEYWORDS,
	  "kv_publish($self, epoch, add=(), remove=(), clear=False)\n--\n\n"
	  "The KV pool's holder, fenced by the epoch of its map: empty the directory (clear),\n"
	  "drop the blocks at remove (before writing them again), then record add, (index, hash)\n"
	  "pairs of finished blocks (after writing them). Raises PermissionError when this\n"
	  "connection's map is not the current one, ValueError for an index outside the pool." },
	{ "kv_directory", (PyCFunction)GMS_kv_directory, METH_NOARGS,
	  "kv_directory($self, /)\n--\n\n"
	  "kv_directory() -> (epoch, [(index, hash), ...])\n\nThe KV pool's directory of finished\n"
	  "blocks and its owner's epoch (0: never mapped)." },
	{ "map_all", (PyCFunction)GMS_map_all, METH_NOARGS,
	  "map_all($self, /)\n--\n\n"
	  "Reader: fetch all allocations and metadata in one round trip, import and map read-only." },
	{ "unmap", (PyCFunction)GMS_unmap, METH_NOARGS,
	  "unmap($self, /)\n--\n\n"
	  "Sleep: nothing of the weights stays readable, the addresses stay reserved.\n"
	  "A reader keeps its session (without a lock) and its handles (on host still\n"
	  "mapped, fenced), so remap() is one request; a writer closes the connection.\n"
	  "Raises BufferError while buffers/tensors over the mappings are alive." },
	{ "set_keep_handles", (PyCFunction)GMS_set_keep_handles, METH_O,
	  "set_keep_handles($self, keep, /)\n--\n\n"
	  "Whether a sleeping reader keeps its imported handles (default True); False\n"
	  "releases them at every unmap() and the wake receives every fd again." },
	{ "remap", (PyCFunction)(void (*)(void))GMS_remap, METH_VARARGS | METH_KEYWORDS,
	  "remap($self, timeout)\n--\n\n"
	  "remap(timeout)\n\nWake: reconnect read-only within timeout seconds, check the layout, map at\n"
	  "the same addresses. Raises TimeoutError or StaleLayoutError." },
	{ "close", (PyCFunction)GMS_close, METH_NOARGS, "close($self, /)\n--\n\n"
	  "Unmap, release and close." },
	{ "process", (PyCFunction)GMS_process, METH_NOARGS, "process($self, /)\n--\n\n"
	  "Notice a lost GMS; raises GMSLostError." },
	{ "start_watch", (PyCFunction)GMS_start_watch, METH_NOARGS, "start_watch($self, /)\n--\n\n"
	  "Start the loss watcher thread." },
	{ "fileno", (PyCFunction)GMS_fileno, METH_NOARGS, "fileno($self, /)\n--\n\n"
	  "fd of the GMS connection, -1 while asleep." },
	{ "buffer", (PyCFunction)(void (*)(void))GMS_buffer, METH_VARARGS | METH_KEYWORDS,
	  "buffer($self, key=None, *, alloc_id=None, offset=0, size=-1, dtype='uint8', shape=None)\n--\n\n"
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

PyTypeObject gfpy_GMSType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.GMSClient",
	.tp_basicsize = sizeof(GMSObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "GMSClient(uri, memory, mode='ro', timeout=None, *, grant=None, by_progress=False)\n--\n\n"
		  "Client of one GPU Memory Service; the connection is the RW/RO lock. grant (the\n"
		  "Grant of Lock.acquire()) makes the connect carry its fence proof: a GMS fenced by\n"
		  "the lock (gf-gmsd --lock) lets only the current holder replace committed weights.\n"
		  "by_progress: the timeout counts only while no writer makes progress (a follower\n"
		  "waiting for its loader): TimeoutError once no writer has been connected, or the\n"
		  "connected one has made no progress, for timeout seconds.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)GMS_init,
	.tp_dealloc = (destructor)GMS_dealloc,
	.tp_methods = GMS_methods,
	.tp_getset = GMS_getset,
};

/* --- Mapping: buffer protocol and DLPack --- */
