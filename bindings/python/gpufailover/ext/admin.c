/* SPDX-License-Identifier: Apache-2.0 */
/* Module functions over the one-shot status and admin requests, and the device list. */
#include "common.h"

/* What a one-shot request needs, copied: it may outlive the Python call (gfpy_oneshot_run()). */
struct lock_req {
	char *uri;
	void *secret;
	size_t secret_len;
	int64_t ms;
	uint64_t epoch;
	char **gpus;
	size_t ngpus;
	char *model;
	char *engine_id; /* evict */
	int tier;        /* demote: enum gf_gms_tier */
};

static void lock_req_free(void *p)
{
	struct lock_req *r = p;
	free(r->uri);
	free(r->secret);
	gfpy_strv_free(r->gpus);
	free(r->model);
	free(r->engine_id);
	free(r);
}

/* Copy uri, secret and the timeout (None or omitted: def_ms) into a new request. */
static struct lock_req *lock_req_new(const char *uri, const Py_buffer *secret, PyObject *tobj, int64_t def_ms)
{
	int64_t ms = def_ms;
	if (tobj && tobj != Py_None && gfpy_timeout_arg(tobj, &ms, 0) < 0)
		return NULL;
	struct lock_req *r = calloc(1, sizeof(*r));
	if (r && !(r->uri = strdup(uri))) {
		free(r);
		r = NULL;
	}
	if (r && secret->buf && secret->len > 0) {
		r->secret = malloc((size_t)secret->len);
		if (!r->secret) {
			lock_req_free(r);
			r = NULL;
		} else {
			memcpy(r->secret, secret->buf, (size_t)secret->len);
			r->secret_len = (size_t)secret->len;
		}
	}
	if (!r)
		return (struct lock_req *)PyErr_NoMemory();
	r->ms = ms;
	return r;
}

static int status_call(void *p, char **json)
{
	struct lock_req *r = p;
	return gf_lock_status_json(r->uri, r->secret, r->secret_len, r->ms, json);
}

static int revoke_call(void *p, char **json)
{
	struct lock_req *r = p;
	return gf_lock_revoke(r->uri, r->secret, r->secret_len, r->epoch, r->ms);
}

static int switchover_call(void *p, char **json)
{
	struct lock_req *r = p;
	return gf_lock_switchover(r->uri, r->secret, r->secret_len, r->epoch, r->ms);
}

static int ready_call(void *p, char **json)
{
	struct lock_req *r = p;
	return gf_lock_ready_for(r->uri, r->secret, r->secret_len, (const char *const *)r->gpus, r->ngpus, r->model,
				 r->ms, json);
}

/* Run a request and turn its JSON answer into a dict (json_out) or return None. */
static PyObject *run_req(const char *what, int (*fn)(void *, char **), struct lock_req *r, int json_out)
{
	char *json = NULL;
	PyObject *rc = gfpy_oneshot_run(what, r->uri, r->ms, fn, r, lock_req_free, json_out ? &json : NULL);
	if (!rc)
		return NULL;
	Py_DECREF(rc);
	if (!json_out)
		Py_RETURN_NONE;
	PyObject *d = gfpy_json_loads(json ? json : "null");
	free(json);
	return d;
}

PyObject *gfpy_lock_status(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "timeout", "secret", NULL };
	const char *uri;
	PyObject *tobj = NULL;
	Py_buffer secret = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O$O&", kwlist, &uri, &tobj, gfpy_secret_arg, &secret))
		return NULL;
	struct lock_req *r = lock_req_new(uri, &secret, tobj, 5000);
	PyBuffer_Release(&secret);
	return r ? run_req("lock_status", status_call, r, 1) : NULL;
}

static int gms_status_call(void *p, char **json)
{
	struct lock_req *r = p;
	return gf_gms_status_json(r->uri, r->ms, json);
}

PyObject *gfpy_gms_status(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "timeout", NULL };
	const char *uri;
	PyObject *tobj = NULL;
	Py_buffer none = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O", kwlist, &uri, &tobj))
		return NULL;
	struct lock_req *r = lock_req_new(uri, &none, tobj, 5000);
	return r ? run_req("gms_status", gms_status_call, r, 1) : NULL;
}

/* revoke and switchover: (uri, epoch, timeout=5.0, *, secret=None). */
static PyObject *epoch_request(PyObject *args, PyObject *kw, const char *what, int (*fn)(void *, char **),
			       int epoch_required)
{
	static char *kwlist[] = { "uri", "epoch", "timeout", "secret", NULL };
	const char *uri;
	uint64_t epoch = 0;
	PyObject *tobj = NULL;
	Py_buffer secret = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, epoch_required ? "sO&|O$O&" : "s|O&O$O&", kwlist, &uri,
					 gfpy_u64_arg, &epoch, &tobj, gfpy_secret_arg, &secret))
		return NULL;
	if (epoch_required && epoch == 0) {
		PyBuffer_Release(&secret);
		return PyErr_Format(PyExc_ValueError, "epoch must be the holder's epoch (>= 1), not 0");
	}
	struct lock_req *r = lock_req_new(uri, &secret, tobj, 5000);
	PyBuffer_Release(&secret);
	if (!r)
		return NULL;
	r->epoch = epoch;
	return run_req(what, fn, r, 0);
}

PyObject *gfpy_lock_revoke(PyObject *self, PyObject *args, PyObject *kw)
{
	return epoch_request(args, kw, "lock_revoke", revoke_call, 1);
}

PyObject *gfpy_lock_switchover(PyObject *self, PyObject *args, PyObject *kw)
{
	return epoch_request(args, kw, "lock_switchover", switchover_call, 0);
}

PyObject *gfpy_ready_for(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "gpus", "model", "timeout", "secret", NULL };
	const char *uri, *model = NULL;
	PyObject *gobj = NULL, *tobj = NULL;
	Py_buffer secret = { 0 };
	char **gpus = NULL;
	size_t ngpus = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|OzO$O&", kwlist, &uri, &gobj, &model, &tobj, gfpy_secret_arg, &secret))
		return NULL;
	/* 8: the lock's limit, so a longer list fails here with the same message as the library's */
	if (gobj && gobj != Py_None && gfpy_strv_arg(gobj, "gpus", 8, &gpus, &ngpus) < 0) {
		PyBuffer_Release(&secret);
		return NULL;
	}
	struct lock_req *r = lock_req_new(uri, &secret, tobj, 5000);
	PyBuffer_Release(&secret);
	if (r && model && model[0] && !(r->model = strdup(model))) {
		lock_req_free(r);
		r = (struct lock_req *)PyErr_NoMemory();
	}
	if (!r) {
		gfpy_strv_free(gpus);
		return NULL;
	}
	r->gpus = gpus;
	r->ngpus = ngpus;
	return run_req("ready_for", ready_call, r, 1);
}

PyObject *gfpy_device_list(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "backend", NULL };
	PyObject *bobj = NULL;
	int kind;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &bobj) || gfpy_backend_arg(bobj, &kind) < 0)
		return NULL;
	struct gf_device_info *info = NULL;
	size_t n = 0, cap = 0;
	int rc;
	/* The count may change between the two calls (a hot-plugged device): list again until it fits. */
	for (;;) {
		Py_BEGIN_ALLOW_THREADS
		rc = gf_device_list(kind, info, cap, &n);
		Py_END_ALLOW_THREADS
		if (rc < 0 || n <= cap)
			break;
		free(info);
		cap = n;
		if (!(info = calloc(cap, sizeof(*info))))
			return PyErr_NoMemory();
	}
	if (rc < 0) {
		free(info);
		return gfpy_raise_gf(rc);
	}
	PyObject *list = PyList_New(0);
	for (size_t i = 0; list && i < n; i++) {
		PyObject *d = Py_BuildValue("{s:i,s:s,s:s,s:K,s:K,s:O}", "index", info[i].index, "uuid", info[i].uuid,
					    "name", info[i].name, "total_bytes", (unsigned long long)info[i].total_bytes,
					    "free_bytes", (unsigned long long)info[i].free_bytes, "mig",
					    info[i].mig ? Py_True : Py_False);
		if (!d || PyList_Append(list, d) < 0)
			Py_CLEAR(list);
		Py_XDECREF(d);
	}
	free(info);
	return list;
}

PyObject *gfpy_device_find_by_uuid(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uuid", "backend", NULL };
	const char *uuid;
	PyObject *bobj = NULL;
	int kind, index = -1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O", kwlist, &uuid, &bobj) || gfpy_backend_arg(bobj, &kind) < 0)
		return NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_device_find_by_uuid(kind, uuid, &index);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return PyLong_FromLong(index);
}

/* The probes and admin requests gfctl has (lock ping and evict; GMS ping,
 * wait-committed and demote), one-shot like the ones above. Their number
 * answers come back as a small JSON object, the one-shot's way of carrying
 * a result out of its thread. */
static int lock_ping_call(void *p, char **json)
{
	struct lock_req *r = p;
	return gf_lock_ping(r->uri, r->secret, r->secret_len, r->ms);
}

static int lock_evict_call(void *p, char **json)
{
	struct lock_req *r = p;
	return gf_lock_evict(r->uri, r->secret, r->secret_len, r->engine_id, r->ms);
}

static int gms_ping_call(void *p, char **json)
{
	struct lock_req *r = p;
	int64_t rtt = 0;
	int rc = gf_gms_ping(r->uri, r->ms, &rtt);
	if (rc == 0 && asprintf(json, "{\"rtt_us\": %lld}", (long long)rtt) < 0)
		*json = NULL;
	return rc;
}

static int gms_wait_committed_call(void *p, char **json)
{
	struct lock_req *r = p;
	uint64_t gen = 0;
	int rc = gf_gms_wait_committed(r->uri, r->ms, &gen);
	if (rc == 0 && asprintf(json, "{\"generation\": %llu}", (unsigned long long)gen) < 0)
		*json = NULL;
	return rc;
}

static int gms_demote_call(void *p, char **json)
{
	struct lock_req *r = p;
	return gf_gms_demote(r->uri, r->tier, r->ms);
}

PyObject *gfpy_lock_ping(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "timeout", "secret", NULL };
	const char *uri;
	PyObject *tobj = NULL;
	Py_buffer secret = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O$O&:lock_ping", kwlist, &uri, &tobj, gfpy_secret_arg, &secret))
		return NULL;
	struct lock_req *r = lock_req_new(uri, &secret, tobj, 5000);
	PyBuffer_Release(&secret);
	return r ? run_req("lock_ping", lock_ping_call, r, 0) : NULL;
}

PyObject *gfpy_lock_evict(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "engine_id", "timeout", "secret", NULL };
	const char *uri, *id;
	PyObject *tobj = NULL;
	Py_buffer secret = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|O$O&:lock_evict", kwlist, &uri, &id, &tobj, gfpy_secret_arg, &secret))
		return NULL;
	struct lock_req *r = lock_req_new(uri, &secret, tobj, 5000);
	PyBuffer_Release(&secret);
	if (r && !(r->engine_id = strdup(id))) {
		lock_req_free(r);
		r = (struct lock_req *)PyErr_NoMemory();
	}
	return r ? run_req("lock_evict", lock_evict_call, r, 0) : NULL;
}

/* One number out of a JSON answer, as a Python int. */
static PyObject *answer_number(PyObject *d, const char *key)
{
	PyObject *v = d ? PyDict_GetItemString(d, key) : NULL;
	if (d && !v)
		PyErr_Format(PyExc_RuntimeError, "no '%s' in the answer", key);
	Py_XINCREF(v);
	Py_XDECREF(d);
	return v;
}

PyObject *gfpy_gms_ping(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "timeout", NULL };
	const char *uri;
	PyObject *tobj = NULL;
	Py_buffer none = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:gms_ping", kwlist, &uri, &tobj))
		return NULL;
	struct lock_req *r = lock_req_new(uri, &none, tobj, 5000);
	PyObject *us = r ? answer_number(run_req("gms_ping", gms_ping_call, r, 1), "rtt_us") : NULL;
	if (!us)
		return NULL;
	double s = PyLong_AsDouble(us) / 1e6;
	Py_DECREF(us);
	return PyErr_Occurred() ? NULL : PyFloat_FromDouble(s);
}

PyObject *gfpy_gms_wait_committed(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "timeout", NULL };
	const char *uri;
	PyObject *tobj = Py_None;
	Py_buffer none = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:gms_wait_committed", kwlist, &uri, &tobj))
		return NULL;
	/* None: wait as long as it takes, as gfctl's startup probe does (-1) */
	struct lock_req *r = lock_req_new(uri, &none, tobj, -1);
	return r ? answer_number(run_req("gms_wait_committed", gms_wait_committed_call, r, 1), "generation") : NULL;
}

PyObject *gfpy_gms_demote(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "to", "timeout", NULL };
	const char *uri, *to = NULL;
	PyObject *tobj = NULL;
	Py_buffer none = { 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zO:gms_demote", kwlist, &uri, &to, &tobj))
		return NULL;
	int tier = GF_GMS_TIER_ANY;
	if (to && !strcmp(to, "warm"))
		tier = GF_GMS_TIER_WARM;
	else if (to && !strcmp(to, "cold"))
		tier = GF_GMS_TIER_COLD;
	else if (to)
		return PyErr_Format(PyExc_ValueError, "to must be 'warm', 'cold' or None (the policy's choice), not '%s'",
				    to);
	/* Writing the snapshot first takes as long as the bytes need: a minute unless told otherwise. */
	struct lock_req *r = lock_req_new(uri, &none, tobj, 60000);
	if (!r)
		return NULL;
	r->tier = tier;
	return run_req("gms_demote", gms_demote_call, r, 0);
}
