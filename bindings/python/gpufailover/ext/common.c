/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers every type uses: argument conversion, JSON, hooks, SIGINT chaining. */
#include "common.h"

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

PyObject *gfpy_json_loads(const char *text)
{
	PyObject *json = PyImport_ImportModule("json");
	if (!json)
		return NULL;
	PyObject *r = PyObject_CallMethod(json, "loads", "s", text);
	Py_DECREF(json);
	return r;
}

/* Call fn(code, detail) from whatever thread the library calls back on. */
void gfpy_run_hook(PyObject *fn, int err, const char *detail)
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
