/* SPDX-License-Identifier: Apache-2.0 */
/* gms_snapshot() and gms_restore(): the residency-tier requests (docs/tiers.md). */
#include "common.h"

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/eventfd.h>

/*
 * The library cannot interrupt these requests, and unlike remap() they cannot
 * be waited for in slices: the request is sent once and the GMS answers once,
 * when the snapshot is written or the restore is done. So the request runs on
 * a thread of its own and the caller waits for its answer through
 * gfpy_wait_interruptible(), as LockClient.acquire() waits: a signal handler that
 * raises ends the wait at once (the GMS carries on with the request; its
 * status "operation" tells how it ended), one that returns lets the wait go
 * on with the time that remains. The request thread ends by itself within
 * the timeout (the library's deadline), whether anyone still waits or not;
 * the last of the two to let go frees what they share.
 */
struct tier_call {
	atomic_int refs;
	atomic_bool answered; /* rc and detail are set */
	int done_fd;          /* eventfd: the request thread has answered */
	int wake_fd;          /* eventfd: a signal with a Python handler arrived */
	bool snapshot;
	char *uri, *dir;
	int64_t timeout_ms;
	int rc;
	char *detail; /* the library's detail text on the request thread (NULL on success) */
};

/* The caller waits this long beyond the request's own deadline before it
 * gives up on an answer, for a machine too loaded to report the timeout on time. */
#define TIER_GRACE_MS 10000

static void tier_call_put(struct tier_call *c)
{
	if (atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	if (c->done_fd >= 0)
		close(c->done_fd);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	free(c->uri);
	free(c->dir);
	free(c->detail);
	free(c);
}

static void *tier_thread(void *arg)
{
	struct tier_call *c = arg;
	int rc = c->snapshot ? gf_gms_snapshot(c->uri, c->dir, c->timeout_ms)
			     : gf_gms_restore(c->uri, c->dir, c->timeout_ms);
	if (rc < 0)
		c->detail = strdup(gf_error_detail());
	c->rc = rc;
	atomic_store(&c->answered, true);
	uint64_t one = 1;
	while (write(c->done_fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
	tier_call_put(c);
	return NULL;
}

/* From a signal handler: async-signal-safe. */
static void tier_wake(void *arg)
{
	struct tier_call *c = arg;
	uint64_t one = 1;
	ssize_t n = write(c->wake_fd, &one, sizeof(one));
	(void)n; /* a full counter already wakes the wait */
}

static void *tier_handle(PyObject *capsule)
{
	return PyCapsule_GetPointer(capsule, NULL);
}

/* Wait (GIL released) for the answer, a wake, or @p ms (-1: forever). */
static int tier_wait(void *ctx, int64_t ms)
{
	struct tier_call *c = ctx;
	const int64_t deadline = ms < 0 ? -1 : gfpy_now_ms() + ms;
	for (;;) {
		int64_t left = deadline < 0 ? -1 : deadline - gfpy_now_ms();
		if (deadline >= 0 && left < 0)
			left = 0;
		struct pollfd p[2] = { { .fd = c->done_fd, .events = POLLIN }, { .fd = c->wake_fd, .events = POLLIN } };
		int n = poll(p, 2, left > INT_MAX ? INT_MAX : (int)left);
		if (n < 0 && errno != EINTR)
			return GF_ERR_IO;
		if (atomic_load(&c->answered))
			return c->rc;
		if (n > 0 && p[1].revents) {
			uint64_t count;
			ssize_t r = read(c->wake_fd, &count, sizeof(count));
			(void)r; /* non-blocking: drained or already empty */
			return GF_ERR_INTERRUPTED;
		}
		if (n == 0 && left == 0)
			return GF_ERR_TIMEOUT;
	}
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

static struct tier_call *tier_call_new(bool snapshot, const char *uri, char *dir, int64_t ms)
{
	struct tier_call *c = calloc(1, sizeof(*c));
	if (!c) {
		free(dir);
		return NULL;
	}
	atomic_init(&c->refs, 1);
	atomic_init(&c->answered, false);
	c->snapshot = snapshot;
	c->dir = dir;
	c->timeout_ms = ms;
	c->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->uri = strdup(uri);
	if (c->done_fd < 0 || c->wake_fd < 0 || !c->uri) {
		tier_call_put(c);
		return NULL;
	}
	return c;
}

/* Start the request thread with every signal blocked, so signals go to the
 * threads that handle them (Python's run only in the main thread). */
static int tier_start(struct tier_call *c)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_attr_t attr;
	if (pthread_attr_init(&attr) != 0)
		return -1;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	atomic_fetch_add(&c->refs, 1);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int err = pthread_create(&t, &attr, tier_thread, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (err != 0) {
		atomic_fetch_sub(&c->refs, 1);
		errno = err;
		return -1;
	}
	return 0;
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
	struct tier_call *c = tier_call_new(snapshot, uri, dir, ms);
	if (!c)
		return PyErr_NoMemory();
	PyObject *capsule = PyCapsule_New(c, NULL, NULL);
	if (!capsule) {
		tier_call_put(c);
		return NULL;
	}
	if (tier_start(c) < 0) {
		Py_DECREF(capsule);
		tier_call_put(c);
		return PyErr_Format(PyExc_OSError, "%s: cannot start the request thread: %s",
				    snapshot ? "gms_snapshot" : "gms_restore", strerror(errno));
	}
	Py_ssize_t busy = 0;
	const int stop = 0;
	int rc = gfpy_wait_interruptible(tier_wait, c, tier_wake, tier_handle, capsule, &busy, &stop,
				    ms + TIER_GRACE_MS);
	Py_DECREF(capsule);
	const char *what = snapshot ? "gms_snapshot" : "gms_restore";
	char text[512];
	PyObject *r = NULL;
	if (rc == GFPY_PYERR) {
		/* a signal handler's exception is set */
	} else if (!atomic_load(&c->answered)) {
		snprintf(text, sizeof(text), "%s: %s %s", what, c->uri,
			 rc == GF_ERR_TIMEOUT ? "did not answer in time" : "cannot be waited for (poll failed)");
		gfpy_raise_gf_detail(rc == GF_ERR_TIMEOUT ? GF_ERR_TIMEOUT : GF_ERR_IO, text);
	} else if (rc < 0) {
		gfpy_raise_gf_detail(rc, c->detail);
	} else {
		Py_INCREF(Py_None);
		r = Py_None;
	}
	tier_call_put(c);
	return r;
}

PyObject *gfpy_gms_snapshot(PyObject *self, PyObject *args, PyObject *kw)
{
	return tier_request(args, kw, true);
}

PyObject *gfpy_gms_restore(PyObject *self, PyObject *args, PyObject *kw)
{
	return tier_request(args, kw, false);
}
