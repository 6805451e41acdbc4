/* SPDX-License-Identifier: Apache-2.0 */
/* _set_log_sink(): the library's log hook into a Python callable
 * (gpufailover.log_to_logging() passes one that feeds the logging module).
 *
 * The hook never takes the GIL: library threads may log while holding their
 * own locks, which a thread holding the GIL may be waiting for. It copies the
 * line into a bounded queue and asks the interpreter (Py_AddPendingCall) to
 * drain it on the main thread, which calls the sink with the line's own
 * times. A line that finds the queue full is counted, and the count is
 * reported with the next line delivered. */
#include "common.h"

#include <stdatomic.h>
#include <stdbool.h>

#define LOG_QUEUE 1024

struct queued_line {
	int level;
	const char *component; /* static (gf_log_fn's contract) */
	int64_t mono_us, wall_us;
	char *msg;
};

static pthread_mutex_t queue_mu = PTHREAD_MUTEX_INITIALIZER;
static struct queued_line queue[LOG_QUEUE];
static size_t queue_head, queue_len;
static unsigned long long queue_dropped;
static atomic_bool drain_scheduled;
static PyObject *sink; /* owned; touched with the GIL held */

static int drain(void *unused)
{
	atomic_store(&drain_scheduled, false);
	for (;;) {
		pthread_mutex_lock(&queue_mu);
		if (queue_len == 0) {
			pthread_mutex_unlock(&queue_mu);
			return 0;
		}
		struct queued_line l = queue[queue_head];
		queue_head = (queue_head + 1) % LOG_QUEUE;
		queue_len--;
		unsigned long long dropped = queue_dropped;
		queue_dropped = 0;
		pthread_mutex_unlock(&queue_mu);
		if (sink) {
			PyObject *r = PyObject_CallFunction(sink, "issLLK", l.level, l.component, l.msg,
							    (long long)l.mono_us, (long long)l.wall_us, dropped);
			if (!r)
				PyErr_WriteUnraisable(sink);
			Py_XDECREF(r);
		}
		free(l.msg);
	}
}

static void hook(int level, const char *component, const char *msg, void *userdata)
{
	int64_t mono, wall;
	gf_log_line_time(&mono, &wall);
	char *copy = strdup(msg);
	pthread_mutex_lock(&queue_mu);
	if (!copy || queue_len == LOG_QUEUE) {
		queue_dropped++;
		pthread_mutex_unlock(&queue_mu);
		free(copy);
		return;
	}
	queue[(queue_head + queue_len) % LOG_QUEUE] =
		(struct queued_line){ .level = level, .component = component, .mono_us = mono, .wall_us = wall, .msg = copy };
	queue_len++;
	pthread_mutex_unlock(&queue_mu);
	/* One pending call at a time; a failed schedule is retried by the next line. */
	if (!atomic_exchange(&drain_scheduled, true) && Py_AddPendingCall(drain, NULL) < 0)
		atomic_store(&drain_scheduled, false);
}

PyObject *gfpy_set_log_sink(PyObject *self, PyObject *args)
{
	PyObject *fn;
	int level = -1;
	if (!PyArg_ParseTuple(args, "O|i:_set_log_sink", &fn, &level))
		return NULL;
	if (fn != Py_None && !PyCallable_Check(fn))
		return PyErr_Format(PyExc_TypeError, "the log sink must be callable or None, not %.100s",
				    Py_TYPE(fn)->tp_name);
	if (level != -1 && level != GF_LOG_ERR && level != GF_LOG_WARN && level != GF_LOG_INFO && level != GF_LOG_DEBUG)
		return PyErr_Format(PyExc_ValueError, "level must be 3, 4, 6 or 7 (error, warning, info, debug), not %d",
				    level);
	if (fn == Py_None) {
		gf_set_log_fn(NULL, NULL);
		drain(NULL); /* what was queued goes to the old sink */
		Py_CLEAR(sink);
		Py_RETURN_NONE;
	}
	Py_INCREF(fn);
	Py_XSETREF(sink, fn);
	if (level != -1)
		gf_set_log_level(level);
	gf_set_log_fn(hook, NULL);
	Py_RETURN_NONE;
}

PyObject *gfpy_drain_log(PyObject *self, PyObject *unused)
{
	drain(NULL);
	if (PyErr_Occurred())
		return NULL;
	Py_RETURN_NONE;
}
