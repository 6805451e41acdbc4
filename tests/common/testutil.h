/* SPDX-License-Identifier: Apache-2.0 */
/* Small helpers shared by the C test programs (not a test framework: the
 * tests use cmocka). A cmocka program (cmocka.h included first) also gets
 * the forking runner of runner.h. */
#ifndef GF_TESTUTIL_H
#define GF_TESTUTIL_H

#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "gpufailover.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif

/* How much longer than on a quiet machine a test may wait for something:
 * GF_TEST_TIMEOUT_SCALE (default 1), times 10 under valgrind and 3 in a
 * sanitizer build. Deadlines are bounds against hangs, never speed claims;
 * a loaded machine (or two test runs side by side) needs more of them. */
static inline double tu_timeout_scale(void)
{
	static double scale;
	if (scale > 0)
		return scale;
	double s = 1;
	const char *env = getenv("GF_TEST_TIMEOUT_SCALE");
	if (env && *env) {
		char *end;
		double v = strtod(env, &end);
		if (*end == '\0' && v >= 1 && v <= 1000)
			s = v;
	}
#ifdef RUNNING_ON_VALGRIND
	if (RUNNING_ON_VALGRIND)
		s *= 10;
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	s *= 3;
#endif
	scale = s;
	return s;
}

/* @ms milliseconds of waiting, scaled by tu_timeout_scale(). */
#define TU_MS(ms) ((int64_t)((double)(ms) * tu_timeout_scale()))

/* Entries of directory @path, "." and ".." aside (-1: unreadable). */
static inline int tu_count_entries(const char *path)
{
	int n = 0;
	DIR *d = opendir(path);
	struct dirent *e;
	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* Mappings of memfds in this process ("/memfd:" lines of /proc/self/maps):
 * whether a mapping still exists somewhere, wherever it was moved to. */
static inline int tu_memfd_mappings(void)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	int n = 0;
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, "/memfd:") != NULL;
	if (f)
		fclose(f);
	return n;
}

/* Number of open fds of this process, to check that nothing leaks. */
static inline int tu_count_fds(void)
{
	int n = tu_count_entries("/proc/self/fd");
	return n < 0 ? -1 : n - 1; /* the DIR's own fd */
}

/* Number of threads of this process, to check that a path starts none. */
static inline int tu_count_threads(void)
{
	return tu_count_entries("/proc/self/task");
}

static inline int tu_rm_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)type;
	(void)ftw;
	remove(path);
	return 0;
}

/* The directories tu_tmpdir() made, removed with what they hold when the
 * process that made them exits: a teardown that missed a file, or a failed
 * assert, must not leave them behind run after run. A forked child's
 * exit() leaves its parent's. */
#define TU_TMPDIRS 64
static struct {
	char path[256];
	pid_t owner;
} tu_tmpdirs[TU_TMPDIRS];
static size_t tu_ntmpdirs;

static inline void tu_remove_tmpdirs(void)
{
	for (size_t i = 0; i < tu_ntmpdirs; i++)
		if (tu_tmpdirs[i].owner == getpid())
			nftw(tu_tmpdirs[i].path, tu_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh private directory under $TMPDIR for sockets and state files,
 * removed when the process that made it exits. */
static inline char *tu_tmpdir(void)
{
	const char *base = getenv("TMPDIR");
	char tmpl[256];
	snprintf(tmpl, sizeof(tmpl), "%s/gf-test-XXXXXX", base && *base ? base : "/tmp");
	char *d = mkdtemp(tmpl);
	if (!d)
		return NULL;
	if (tu_ntmpdirs == 0)
		atexit(tu_remove_tmpdirs);
	if (tu_ntmpdirs < TU_TMPDIRS) {
		snprintf(tu_tmpdirs[tu_ntmpdirs].path, sizeof(tu_tmpdirs[0].path), "%s", d);
		tu_tmpdirs[tu_ntmpdirs++].owner = getpid();
	}
	return strdup(d);
}

/* Log lines of one component captured for assertions: install with
 * gf_set_log_fn(tu_capture_log, "mem"), read and reset with tu_logged(). */
static inline char *tu_logged(void)
{
	static char buf[4096];
	return buf;
}

static inline void tu_capture_log(int level, const char *component, const char *msg, void *userdata)
{
	char *buf = tu_logged();
	size_t used = strlen(buf);
	if (level <= GF_LOG_INFO && (!userdata || strcmp(component, (const char *)userdata) == 0))
		snprintf(buf + used, 4096 - used, "%s\n", msg);
}

/*
 * Test knobs in the environment while threads run. The fake driver reads
 * its FAKECUDA_* knobs with getenv() on every call, from every thread (the
 * in-process GMS and lock servers included). setenv() of a name not yet in
 * the environment, and unsetenv(), resize or shift the environment array
 * under a concurrent getenv(): a crash in the other thread (seen as a
 * silent exit status 255 under cmocka, whose signal handler replaces the
 * sanitizers'). So every knob a test changes exists from the start
 * (tu_env_reserve, called by the runner before any test) and is changed
 * with tu_env_set(), which replaces the value in place. An empty value
 * means "not set" to the fake driver and to the library's test knobs.
 */
static const char *const tu_env_knobs[] = {
	"FAKECUDA_FAIL", "FAKECUDA_COPY_FAIL", "FAKECUDA_OOM_AFTER_BYTES", "FAKECUDA_TOTAL_MEM",
	"FAKECUDA_NO_POSIX_FD", "FAKECUDA_DRIVER_VERSION", "GF_MEM_HOST_AVAILABLE",
};

static inline void tu_env_reserve(void)
{
	for (size_t i = 0; i < sizeof(tu_env_knobs) / sizeof(tu_env_knobs[0]); i++)
		if (!getenv(tu_env_knobs[i]))
			setenv(tu_env_knobs[i], "", 1);
}

/* Sets knob @name to @value; NULL clears it (to ""). */
static inline void tu_env_set(const char *name, const char *value)
{
	setenv(name, value ? value : "", 1);
}

/* A TCP port on 127.0.0.1 that was free a moment ago (bound, then closed:
 * the caller's server binds it next, or it stands for a dead port); -1 if
 * none could be had. */
static inline int tu_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	if (fd < 0)
		return -1;
	int ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0;
	close(fd);
	return ok ? ntohs(sa.sin_port) : -1;
}

#ifdef cmocka_unit_test
#include "runner.h"
#endif

#endif
