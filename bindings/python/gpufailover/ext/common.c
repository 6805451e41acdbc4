/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers every type uses: argument conversion, JSON, hooks, SIGINT chaining. */
#include "common.h"

/* Timeout in seconds (None = forever) → milliseconds (-1 = forever). */
int timeout_arg(PyObject *obj, int64_t *ms, int allow_none)
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

PyObject *json_loads(const char *text)
{
	PyObject *json = PyImport_ImportModule("json");
	if (!json)
		return NULL;
	PyObject *r = PyObject_CallMethod(json, "loads", "s", text);
	Py_DECREF(json);
	return r;
}

/* Call fn(code, detail) from whatever thread the library calls back on. */
void run_hook(PyObject *fn, int err, const char *detail)
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

PyObject *hook_get(PyObject *slot)
{
	PyObject *r = slot ? slot : Py_None;
	Py_INCREF(r);
	return r;
}

int hook_set(PyObject **slot, PyObject *v, const char *what)
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

/* SIGINT during a blocking acquire: interrupt the wait (async-signal-safe
 * eventfd write), then chain to Python's own handler so KeyboardInterrupt is
 * raised once the call returns. */
static void (*volatile sigint_fn)(void *);
static void *volatile sigint_arg;
unsigned long main_thread_ident;
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
int sigint_hook(void (*fn)(void *), void *arg)
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

void sigint_unhook(int hooked)
{
	if (!hooked)
		return;
	sigaction(SIGINT, &sigint_prev, NULL);
	sigint_fn = NULL;
	sigint_arg = NULL;
}
