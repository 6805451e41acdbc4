/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers every type uses: argument conversion, JSON, hooks, SIGINT chaining. */
#include "common.h"

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/eventfd.h>

/* Timeout in seconds (None = forever) → milliseconds (-1 = forever). */
int gfpy_timeout_arg(PyObject *obj, int64_t *ms, int allow_none)
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

int gfpy_u64_arg(PyObject *obj, void *out)
{
	PyObject *idx = PyNumber_Index(obj);
	if (!idx)
		return 0;
	unsigned long long v = PyLong_AsUnsignedLongLong(idx);
	Py_DECREF(idx);
	if (v == (unsigned long long)-1 && PyErr_Occurred())
		return 0; /* OverflowError: negative or >= 2**64 */
	*(uint64_t *)out = v;
	return 1;
}

int gfpy_secret_arg(PyObject *obj, void *out)
{
	Py_buffer *b = out;
	if (!obj) { /* PyArg's cleanup after a later argument failed */
		PyBuffer_Release(b);
		return 1;
	}
	if (obj == Py_None)
		return Py_CLEANUP_SUPPORTED; /* no secret: @out stays empty */
	if (PyUnicode_Check(obj) || !PyObject_CheckBuffer(obj)) {
		PyErr_Format(PyExc_TypeError, "secret must be bytes or None, not %.100s", Py_TYPE(obj)->tp_name);
		return 0;
	}
	return PyObject_GetBuffer(obj, b, PyBUF_SIMPLE) < 0 ? 0 : Py_CLEANUP_SUPPORTED;
}

PyObject *gfpy_json_loads(const char *text)
{
	PyObject *json = PyImport_ImportModule("json");
	if (!json)
		return NULL;
	PyObject *r = PyObject_CallMethod(json, "loads", "s", text);
	Py_DECREF(json);
	return r;
}

/* Call the hook in *slot as fn(code, detail), from whatever thread the
 * library calls back on. The slot is read only once the GIL is held, and the
 * hook is called through a reference of its own: a setter on another thread
 * may replace (and free) the slot's object at any moment the GIL is free. */
void gfpy_run_hook(PyObject *const *slot, int err, const char *detail)
{
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *fn = *slot;
	if (fn && fn != Py_None) {
		Py_INCREF(fn);
		PyObject *r = PyObject_CallFunction(fn, "is", err, detail ? detail : "");
		if (!r)
			PyErr_WriteUnraisable(fn);
		Py_XDECREF(r);
		Py_DECREF(fn);
	}
	PyGILState_Release(g);
}

PyObject *gfpy_hook_get(PyObject *slot)
{
	PyObject *r = slot ? slot : Py_None;
	Py_INCREF(r);
	return r;
}

int gfpy_hook_set(PyObject **slot, PyObject *v, const char *what)
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

/*
 * PEP 475 for the blocking waits. While the main thread waits with the GIL
 * released, every signal that has a Python handler gets a C handler that
 * first chains to the previous one (Python's own, which records the signal)
 * and then interrupts the wait (an async-signal-safe eventfd write). The
 * caller then takes the GIL and runs PyErr_CheckSignals(): a handler that
 * raised ends the call with its exception, any other continues the wait with
 * the time that remains. Python runs handlers only in the main thread, so
 * waits on other threads are left alone (the main thread handles the signal).
 */
static void (*volatile wake_fn)(void *);
static void *volatile wake_arg;
static struct sigaction wake_prev[NSIG];
static unsigned char wake_hooked[NSIG];
unsigned long gfpy_main_thread_ident;

static void wake_chain(int sig, siginfo_t *info, void *uctx)
{
	int saved = errno;
	const struct sigaction *prev = &wake_prev[sig];
	if (prev->sa_flags & SA_SIGINFO) {
		if (prev->sa_sigaction)
			prev->sa_sigaction(sig, info, uctx);
	} else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
		prev->sa_handler(sig);
	}
	void (*fn)(void *) = wake_fn;
	if (fn)
		fn(wake_arg);
	errno = saved;
}

/* The signals whose current Python-level handler is a callable. */
static int python_handled(unsigned char *out)
{
	memset(out, 0, NSIG);
	PyObject *mod = PyImport_ImportModule("signal");
	PyObject *valid = mod ? PyObject_CallMethod(mod, "valid_signals", NULL) : NULL;
	PyObject *it = valid ? PyObject_GetIter(valid) : NULL;
	PyObject *item;
	int n = 0;
	while (it && (item = PyIter_Next(it))) {
		long sig = PyLong_AsLong(item);
		PyObject *h = sig > 0 && sig < NSIG ? PyObject_CallMethod(mod, "getsignal", "O", item) : NULL;
		if (h && h != Py_None && PyCallable_Check(h)) {
			out[sig] = 1;
			n++;
		}
		Py_XDECREF(h);
		Py_DECREF(item);
		PyErr_Clear();
	}
	Py_XDECREF(it);
	Py_XDECREF(valid);
	Py_XDECREF(mod);
	PyErr_Clear();
	return n;
}

int gfpy_in_main_thread(void)
{
	return PyThread_get_thread_ident() == gfpy_main_thread_ident;
}

/* Route the signals with Python handlers to fn(arg) (main thread only). */
static int signals_hook(void (*fn)(void *), void *arg)
{
	if (!gfpy_in_main_thread() || !python_handled(wake_hooked))
		return 0;
	wake_arg = arg;
	wake_fn = fn;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = wake_chain;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	for (int sig = 1; sig < NSIG; sig++)
		if (wake_hooked[sig] && sigaction(sig, &sa, &wake_prev[sig]) < 0)
			wake_hooked[sig] = 0;
	return 1;
}

static void signals_unhook(int hooked)
{
	if (!hooked)
		return;
	for (int sig = 1; sig < NSIG; sig++)
		if (wake_hooked[sig])
			sigaction(sig, &wake_prev[sig], NULL);
	wake_fn = NULL;
	wake_arg = NULL;
}

int64_t gfpy_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int gfpy_wait_interruptible(int (*call)(void *ctx, int64_t ms), void *ctx, void (*intr)(void *),
		       void *(*handle)(PyObject *obj), PyObject *obj, Py_ssize_t *busy, const int *stop, int64_t ms)
{
	const int64_t deadline = ms < 0 ? -1 : gfpy_now_ms() + ms;
	for (;;) {
		int hooked = signals_hook(intr, handle(obj));
		int rc;
		BLOCKING_COUNT(busy, rc = call(ctx, ms));
		signals_unhook(hooked);
		if (rc != GF_ERR_INTERRUPTED || !hooked || *stop)
			return rc;
		/* Not counted as busy while the handlers run: one may close the
		 * object (a SIGTERM handler's cleanup), which then frees it at once. */
		if (PyErr_CheckSignals() < 0)
			return GFPY_PYERR;
		if (!handle(obj))
			return GFPY_CLOSED;
		if (deadline >= 0) {
			ms = deadline - gfpy_now_ms();
			if (ms < 0)
				ms = 0;
		}
	}
}

int gfpy_refuse_busy(Py_ssize_t busy, const char *type, const char *what)
{
	if (busy <= 0)
		return 0;
	PyErr_Format(gfpy_StateError, "%s: cannot %s while another thread is in a call on it", type, what);
	return -1;
}

void gfpy_wait_idle(const Py_ssize_t *busy)
{
	while (*busy > 0) {
		Py_BEGIN_ALLOW_THREADS
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
		Py_END_ALLOW_THREADS
	}
}

/*
 * One-shot requests to a server (lock status, revoke, switchover, readiness,
 * snapshot, restore) have no interrupt of their own, and cannot be waited
 * for in slices: the request is sent once and answered once. So each runs on
 * a thread of its own and the caller waits for its answer through
 * gfpy_wait_interruptible(), as LockClient.acquire() waits: a signal handler
 * that raises ends the wait at once (the server carries on with the
 * request), one that returns lets the wait go on. The request thread ends by
 * itself within its own timeout, whether anyone still waits or not; the last
 * of the two to let go frees what they share.
 */
struct oneshot {
	atomic_int refs;
	atomic_bool answered; /* rc, json and detail are set */
	int done_fd;          /* eventfd: the request thread has answered */
	int wake_fd;          /* eventfd: a signal with a Python handler arrived */
	int (*fn)(void *arg, char **json);
	void *arg;
	void (*free_arg)(void *arg);
	int rc;
	char *json;
	char *detail; /* the library's detail text on the request thread (NULL on success) */
};

/* The caller waits this long beyond the request's own deadline before it
 * gives up on an answer, for a machine too loaded to report the timeout on time. */
#define ONESHOT_GRACE_MS 10000

static void oneshot_put(struct oneshot *o)
{
	if (atomic_fetch_sub(&o->refs, 1) != 1)
		return;
	if (o->done_fd >= 0)
		close(o->done_fd);
	if (o->wake_fd >= 0)
		close(o->wake_fd);
	free(o->json);
	free(o->detail);
	o->free_arg(o->arg);
	free(o);
}

static void *oneshot_thread(void *p)
{
	struct oneshot *o = p;
	int rc = o->fn(o->arg, &o->json);
	if (rc < 0)
		o->detail = strdup(gf_error_detail());
	o->rc = rc;
	atomic_store(&o->answered, true);
	uint64_t one = 1;
	while (write(o->done_fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
	oneshot_put(o);
	return NULL;
}

/* From a signal handler: async-signal-safe. */
static void oneshot_wake(void *ctx)
{
	struct oneshot *o = ctx;
	uint64_t one = 1;
	ssize_t n = write(o->wake_fd, &one, sizeof(one));
	(void)n; /* a full counter already wakes the wait */
}

static void *oneshot_handle(PyObject *capsule)
{
	return PyCapsule_GetPointer(capsule, NULL);
}

/* Wait (GIL released) for the answer, a wake, or @p ms (-1: forever). */
static int oneshot_wait(void *ctx, int64_t ms)
{
	struct oneshot *o = ctx;
	const int64_t deadline = ms < 0 ? -1 : gfpy_now_ms() + ms;
	for (;;) {
		int64_t left = deadline < 0 ? -1 : deadline - gfpy_now_ms();
		if (deadline >= 0 && left < 0)
			left = 0;
		struct pollfd p[2] = { { .fd = o->done_fd, .events = POLLIN }, { .fd = o->wake_fd, .events = POLLIN } };
		int n = poll(p, 2, left > INT_MAX ? INT_MAX : (int)left);
		if (n < 0 && errno != EINTR)
			return GF_ERR_IO;
		if (atomic_load(&o->answered))
			return 0; /* o->rc, which may be positive: never mistaken for GFPY_PYERR */
		if (n > 0 && p[1].revents) {
			uint64_t count;
			ssize_t r = read(o->wake_fd, &count, sizeof(count));
			(void)r; /* non-blocking: drained or already empty */
			return GF_ERR_INTERRUPTED;
		}
		if (n == 0 && left == 0)
			return GF_ERR_TIMEOUT;
	}
}

/* Start the request thread with every signal blocked, so signals go to the
 * threads that handle them (Python's run only in the main thread). */
static int oneshot_start(struct oneshot *o)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_attr_t attr;
	int err = pthread_attr_init(&attr);
	if (err != 0)
		return err;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	atomic_fetch_add(&o->refs, 1);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	err = pthread_create(&t, &attr, oneshot_thread, o);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (err != 0)
		atomic_fetch_sub(&o->refs, 1);
	return err;
}

PyObject *gfpy_oneshot_run(const char *what, const char *uri, int64_t timeout_ms, int (*fn)(void *arg, char **json),
			   void *arg, void (*free_arg)(void *arg), char **json)
{
	struct oneshot *o = calloc(1, sizeof(*o));
	if (!o) {
		free_arg(arg);
		return PyErr_NoMemory();
	}
	atomic_init(&o->refs, 1);
	atomic_init(&o->answered, false);
	o->fn = fn;
	o->arg = arg;
	o->free_arg = free_arg;
	o->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	o->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (o->done_fd < 0 || o->wake_fd < 0) {
		PyErr_Format(PyExc_OSError, "%s: eventfd: %s", what, strerror(errno));
		oneshot_put(o);
		return NULL;
	}
	PyObject *capsule = PyCapsule_New(o, NULL, NULL);
	if (!capsule) {
		oneshot_put(o);
		return NULL;
	}
	int err = oneshot_start(o);
	if (err != 0) {
		Py_DECREF(capsule);
		oneshot_put(o);
		return PyErr_Format(PyExc_OSError, "%s: cannot start the request thread: %s", what, strerror(err));
	}
	Py_ssize_t busy = 0;
	const int stop = 0;
	int rc = gfpy_wait_interruptible(oneshot_wait, o, oneshot_wake, oneshot_handle, capsule, &busy, &stop,
					 timeout_ms < 0 ? -1 : timeout_ms + ONESHOT_GRACE_MS);
	Py_DECREF(capsule);
	char text[512];
	PyObject *r = NULL;
	if (rc == GFPY_PYERR) {
		/* a signal handler's exception is set */
	} else if (!atomic_load(&o->answered)) {
		snprintf(text, sizeof(text), "%s: %s %s", what, uri,
			 rc == GF_ERR_TIMEOUT ? "did not answer in time" : "cannot be waited for (poll failed)");
		gfpy_raise_gf_detail(rc == GF_ERR_TIMEOUT ? GF_ERR_TIMEOUT : GF_ERR_IO, text);
	} else if (o->rc < 0) {
		gfpy_raise_gf_detail(o->rc, o->detail);
	} else {
		if (json) {
			*json = o->json;
			o->json = NULL;
		}
		r = PyLong_FromLong(o->rc);
	}
	oneshot_put(o);
	return r;
}

int gfpy_strv_arg(PyObject *obj, const char *what, size_t max, char ***out, size_t *n)
{
	if (PyUnicode_Check(obj) || PyBytes_Check(obj)) {
		PyErr_Format(PyExc_TypeError, "%s must be a sequence of str, not a single %.100s", what,
			     Py_TYPE(obj)->tp_name);
		return -1;
	}
	PyObject *seq = PySequence_Fast(obj, "");
	if (!seq) {
		PyErr_Format(PyExc_TypeError, "%s must be a sequence of str, not %.100s", what, Py_TYPE(obj)->tp_name);
		return -1;
	}
	Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
	if ((size_t)len > max) {
		Py_DECREF(seq);
		PyErr_Format(PyExc_ValueError, "%s: at most %zu entries, got %zd", what, max, len);
		return -1;
	}
	char **v = calloc((size_t)len + 1, sizeof(*v));
	if (!v) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < len; i++) {
		PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
		Py_ssize_t sz;
		const char *s = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, &sz) : NULL;
		if (s && (size_t)sz != strlen(s)) {
			PyErr_Format(PyExc_ValueError, "%s[%zd] contains a NUL character", what, i);
			s = NULL;
		}
		if (!s) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_TypeError, "%s[%zd] must be str, not %.100s", what, i,
					     Py_TYPE(item)->tp_name);
			Py_DECREF(seq);
			gfpy_strv_free(v);
			return -1;
		}
		if (!(v[i] = strdup(s))) {
			Py_DECREF(seq);
			gfpy_strv_free(v);
			PyErr_NoMemory();
			return -1;
		}
	}
	Py_DECREF(seq);
	*out = v;
	*n = (size_t)len;
	return 0;
}

void gfpy_strv_free(char **v)
{
	for (size_t i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

int gfpy_bool_arg(PyObject *obj, void *out)
{
	if (!PyBool_Check(obj)) {
		PyErr_Format(PyExc_TypeError, "pinned must be True or False, not %.100s", Py_TYPE(obj)->tp_name);
		return 0;
	}
	*(int *)out = obj == Py_True;
	return 1;
}
