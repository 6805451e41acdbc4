/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kill_group_on_exit(): another process's exit SIGKILLs this process's
 * group, from a thread that never takes the GIL. A Python thread waiting on
 * the same pidfd must get the GIL before it can act, and a busy interpreter
 * (vLLM's worker polls its message queue in Python) makes it wait.
 */
#include "common.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/syscall.h>

/* Set by _group_watches_off(): the process ends its group itself. */
static atomic_bool watches_off;

struct group_watch {
	int pidfd;
	pid_t pgid;
	char line[480]; /* logged to stderr (after "mono_us=N ") just before the kill */
};

static void *group_watch_run(void *arg)
{
	struct group_watch *w = arg;
	struct pollfd p = { .fd = w->pidfd, .events = POLLIN };
	/* Only a readable pidfd means the process exited: an error (EINTR,
	 * ENOMEM) is waited out, never taken for an exit; one that is not a
	 * signal waits 10 ms first, so a lasting one does not spin a core. */
	for (;;) {
		int r = poll(&p, 1, -1);
		if (r > 0)
			break;
		if (r < 0 && errno != EINTR)
			nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	}
	if (p.revents & POLLNVAL) {
		/* The fd was closed under the watch: the exit can no longer be seen,
		 * and a closed fd is no proof of one, so the group is left alone. */
		static const char lost[] = "gpufailover: group watch lost its pidfd; the group is not killed by it\n";
		(void)!write(STDERR_FILENO, lost, sizeof(lost) - 1);
		return NULL;
	}
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic_ns()'s clock: the log lines compare */
	char out[512];
	int n = snprintf(out, sizeof(out), "mono_us=%lld %s\n", (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000,
			 w->line);
	if (atomic_load(&watches_off))
		return NULL;
	if (n > 0)
		(void)!write(STDERR_FILENO, out, (size_t)n < sizeof(out) ? (size_t)n : sizeof(out) - 1);
	kill(-w->pgid, SIGKILL);
	return NULL;
}

PyObject *gfpy_group_watches_off(PyObject *self, PyObject *unused)
{
	(void)self;
	(void)unused;
	atomic_store(&watches_off, true);
	Py_RETURN_NONE;
}

PyObject *gfpy_kill_group_on_exit(PyObject *self, PyObject *args)
{
	int pid;
	const char *line;
	if (!PyArg_ParseTuple(args, "is:_kill_group_on_exit", &pid, &line))
		return NULL;
	if (pid <= 0)
		return PyErr_Format(PyExc_ValueError, "pid must be > 0, not %d", pid);
	if (strlen(line) >= sizeof(((struct group_watch *)0)->line) || strchr(line, '\n'))
		return PyErr_Format(PyExc_ValueError, "the log line must be one line of under %zu bytes",
				    sizeof(((struct group_watch *)0)->line));
	pid_t pgid = getpgid(0);
	if (pgid < 0)
		return PyErr_SetFromErrno(PyExc_OSError);
	struct group_watch *w = calloc(1, sizeof(*w));
	if (!w)
		return PyErr_NoMemory();
	snprintf(w->line, sizeof(w->line), "%s", line);
	w->pgid = pgid;
	w->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0); /* close-on-exec */
	if (w->pidfd < 0) {
		free(w);
		return PyErr_SetFromErrno(PyExc_OSError); /* ESRCH: ProcessLookupError, ENOSYS: before Linux 5.3 */
	}
	/* The thread takes none of the process's signals (they stay Python's). */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 64 * 1024);
	pthread_t t;
	int rc = pthread_create(&t, &attr, group_watch_run, w);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		close(w->pidfd);
		free(w);
		errno = rc;
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	/* The watch lasts as long as the process: @w is the thread's until then. */
	Py_RETURN_NONE;
}
