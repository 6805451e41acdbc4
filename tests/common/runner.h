/* SPDX-License-Identifier: Apache-2.0 */
/* A forking runner for the cmocka tests, after libwayland's test runner:
 * every test runs in its own child process with a deadline, so a crash or a
 * hang fails that one test by name and cannot take the others with it; and
 * the child compares its open fds before and after the test (group setup and
 * teardown included), so a leaked fd fails the test that leaked it. A
 * test that called skip() is reported as a TAP SKIP, never as a pass: the
 * runner reads cmocka's report of each test back to tell.
 *
 * A main() includes testutil.h after cmocka.h and says
 * `return tu_run_group_tests(tests, setup, teardown);` in place of
 * cmocka_run_group_tests(). The runner prints the TAP stream itself (one
 * line per test); each child's cmocka output goes to stderr, the test log.
 *
 * Environment: GF_TEST_NOFORK=1 runs the tests in this process, one after
 * the other, still checking fds per test (the valgrind setup sets it, as
 * valgrind reports nothing from forked children there); GF_TEST_TIMEOUT=S
 * sets the per-test deadline (default 120 s); GF_TEST_ONLY=NAME runs only
 * the tests whose name contains NAME (the others are reported as skipped). */
#ifndef GF_TEST_RUNNER_H
#define GF_TEST_RUNNER_H

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"


#define TU_DEFAULT_TIMEOUT_S 120

/* Set by a main() whose tests need something a process opens once and
 * keeps for its lifetime (a GPU driver's device files): called in each
 * test's process before its fds are counted, so it is not taken for a leak.
 * It must be idempotent (GF_TEST_NOFORK calls it before every test). */
static void (*tu_process_init)(void);

/* What tu_run_one() returns for a test that called skip(): reported as a SKIP, not a pass. */
#define TU_SKIPPED 77

/* Copies cmocka's report of one test to the log; whether it says the test skipped (TAP or cmocka's own format). */
static inline bool tu_report_skipped(FILE *f)
{
	char line[512];
	bool skipped = false;
	rewind(f);
	while (fgets(line, sizeof(line), f)) {
		fputs(line, stderr);
		if (strstr(line, "# SKIP") || strstr(line, "[  SKIPPED ]"))
			skipped = true;
	}
	return skipped;
}

/* Runs test @t with the group fixtures; 0 when it passed and left no fd
 * behind, TU_SKIPPED when it skipped, else a failure (a leak is named on
 * stderr). cmocka's report of the test is read back to tell a skip. */
static inline int tu_run_one(const struct CMUnitTest *t, CMFixtureFunction setup, CMFixtureFunction teardown)
{
	fflush(stdout);
	FILE *report = tmpfile();
	int saved = report ? dup(STDOUT_FILENO) : -1;
	if (saved >= 0 && dup2(fileno(report), STDOUT_FILENO) < 0) {
		close(saved);
		saved = -1;
	}
	if (tu_process_init)
		tu_process_init();
	int before = tu_count_fds();
	int rc = _cmocka_run_group_tests(t->name, t, 1, setup, teardown);
	int after = tu_count_fds();
	fflush(stdout);
	if (saved >= 0) {
		dup2(saved, STDOUT_FILENO);
		close(saved);
	}
	bool skipped = report && tu_report_skipped(report);
	if (report)
		fclose(report);
	if (rc == 0 && after != before) {
		fprintf(stderr, "fd leak: %s: %d fds open before, %d after\n", t->name, before, after);
		rc = 1;
	}
	return rc == 0 && skipped ? TU_SKIPPED : rc;
}

/* Waits for @pid up to @timeout_s; kills it after that. The wait status, or
 * -1 after a timeout. */
static inline int tu_wait_child(pid_t pid, long timeout_s, const char *name)
{
	struct timespec nap = { 0, 10 * 1000 * 1000 };
	long naps = timeout_s * 100;
	int status;
	for (long i = 0; i <= naps; i++) {
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			return status;
		if (r < 0 && errno != EINTR)
			return -1;
		nanosleep(&nap, NULL);
	}
	fprintf(stderr, "timeout: %s still running after %lds; killed\n", name, timeout_s);
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	return -1;
}

static inline int tu_run_tests(const struct CMUnitTest *tests, size_t n, CMFixtureFunction setup,
			       CMFixtureFunction teardown)
{
	const char *nofork = getenv("GF_TEST_NOFORK");
	const char *tmo = getenv("GF_TEST_TIMEOUT");
	long timeout_s = tmo && atol(tmo) > 0 ? atol(tmo) : TU_DEFAULT_TIMEOUT_S;
	int failed = 0;
	/* TAP on stdout is ours alone; cmocka's own lines go to the log. */
	fflush(stdout);
	int tap = dup(STDOUT_FILENO);
	FILE *out = tap >= 0 ? fdopen(tap, "w") : NULL;
	if (!out || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
		fprintf(stderr, "test runner: cannot set up output: %s\n", strerror(errno));
		return 1;
	}
	fprintf(out, "1..%zu\n", n);
	fflush(out);
	tu_env_reserve(); /* before any test starts a thread */
	const char *only = getenv("GF_TEST_ONLY");
	for (size_t i = 0; i < n; i++) {
		const char *why = NULL;
		char whybuf[64];
		int ok, skipped = 0;
		if (only && *only && !strstr(tests[i].name, only)) {
			fprintf(out, "ok %zu - %s # SKIP not in GF_TEST_ONLY\n", i + 1, tests[i].name);
			continue;
		}
		if (nofork && !strcmp(nofork, "1")) {
			int rc = tu_run_one(&tests[i], setup, teardown);
			skipped = rc == TU_SKIPPED;
			ok = rc == 0 || skipped;
		} else {
			fflush(NULL);
			pid_t pid = fork();
			if (pid < 0) {
				fprintf(stderr, "test runner: fork: %s\n", strerror(errno));
				return 1;
			}
			if (pid == 0) {
				fclose(out);
				/* exit(), not _exit(): LeakSanitizer checks at exit. */
				int rc = tu_run_one(&tests[i], setup, teardown);
				exit(rc == TU_SKIPPED ? TU_SKIPPED : rc ? 1 : 0);
			}
			int status = tu_wait_child(pid, timeout_s, tests[i].name);
			skipped = status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == TU_SKIPPED;
			ok = (status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) || skipped;
			if (status < 0)
				why = "timed out";
			else if (WIFSIGNALED(status))
				why = strsignal(WTERMSIG(status));
			else if (!ok && WEXITSTATUS(status) != 1) {
				/* 1 is a failure the log explains; anything else is
				 * not cmocka's report (255: cmocka's exit(-1), an
				 * assertion or a crash in another thread). */
				snprintf(whybuf, sizeof(whybuf), "exit status %d", WEXITSTATUS(status));
				why = whybuf;
			}
		}
		failed += !ok;
		if (skipped)
			why = "SKIP (the reason is in the log)";
		fprintf(out, "%sok %zu - %s%s%s\n", ok ? "" : "not ", i + 1, tests[i].name, why ? " # " : "",
			why ? why : "");
		fflush(out);
	}
	fclose(out);
	return failed ? 1 : 0;
}

#define tu_run_group_tests(tests, setup, teardown)                                                          \
	tu_run_tests((tests), sizeof(tests) / sizeof((tests)[0]), (setup), (teardown))

#endif
