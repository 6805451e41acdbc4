/* SPDX-License-Identifier: Apache-2.0 */
/* gms_snapshot() and gms_restore(): the residency-tier requests (docs/tiers.md). */
#include "common.h"

#include <stdbool.h>

/* The request, copied: it may outlive the call (gfpy_oneshot_run()). */
struct tier_req {
	bool snapshot;
	char *uri, *dir;
	int64_t timeout_ms;
};

static void tier_req_free(void *p)
{
	struct tier_req *t = p;
	free(t->uri);
	free(t->dir);
	free(t);
}

static int tier_call(void *p, char **json)
{
	struct tier_req *t = p;
	return t->snapshot ? gf_gms_snapshot(t->uri, t->dir, t->timeout_ms)
			   : gf_gms_restore(t->uri, t->dir, t->timeout_ms);
}

/* A directory argument: None, or a str or os.PathLike naming one. *out is
 * NULL for None, else a copy to free(). */
static int dir_arg(PyObject *obj, char **out)
{
	*out = NULL;
	if (obj == Py_None)
		return 0;
	PyObject *path = PyOS_FSPath(obj);
	if (!path) {
		/* Not a path at all; an error raised by a __fspath__() stays as it is. */
		if (PyErr_ExceptionMatches(PyExc_TypeError)) {
			PyErr_Clear();
			PyErr_Format(PyExc_TypeError, "dir must be str, os.PathLike[str] or None, not %.100s",
				     Py_TYPE(obj)->tp_name);
		}
		return -1;
	}
	if (!PyUnicode_Check(path)) {
		PyErr_Format(PyExc_TypeError, "dir must be str, os.PathLike[str] or None, not a path of %.100s",
			     Py_TYPE(path)->tp_name);
		Py_DECREF(path);
		return -1;
	}
	Py_ssize_t len;
	const char *s = PyUnicode_AsUTF8AndSize(path, &len);
	if (s && strlen(s) != (size_t)len) {
		PyErr_SetString(PyExc_ValueError, "dir contains an embedded null character");
		s = NULL;
	}
	if (s && !(*out = strdup(s)))
		PyErr_NoMemory();
	Py_DECREF(path);
	return *out ? 0 : -1;
}

static PyObject *tier_request(PyObject *args, PyObject *kw, bool snapshot)
{
	static char *kwlist[] = { "uri", "dir", "timeout", NULL };
	const char *uri;
	PyObject *dobj = Py_None, *tobj = NULL;
	int64_t ms = 60000;
	char *dir;
	if (!PyArg_ParseTupleAndKeywords(args, kw, snapshot ? "s|OO:gms_snapshot" : "s|OO:gms_restore", kwlist, &uri,
					 &dobj, &tobj))
		return NULL;
	if (tobj && gfpy_timeout_arg(tobj, &ms, 0) < 0)
		return NULL;
	if (dir_arg(dobj, &dir) < 0)
		return NULL;
	struct tier_req *t = calloc(1, sizeof(*t));
	if (t && !(t->uri = strdup(uri))) {
		free(t);
		t = NULL;
	}
	if (!t) {
		free(dir);
		return PyErr_NoMemory();
	}
	t->snapshot = snapshot;
	t->dir = dir;
	t->timeout_ms = ms;
	PyObject *r = gfpy_oneshot_run(snapshot ? "gms_snapshot" : "gms_restore", uri, ms, tier_call, t, tier_req_free,
				       NULL);
	if (!r)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_NONE;
}

PyObject *gfpy_gms_snapshot(PyObject *self, PyObject *args, PyObject *kw)
{
	return tier_request(args, kw, true);
}

PyObject *gfpy_gms_restore(PyObject *self, PyObject *args, PyObject *kw)
{
	return tier_request(args, kw, false);
}
