/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Run a test case in a forked child that loads the driver itself. The test
 * driver reads CUDA_VISIBLE_DEVICES and its device count once, at cuInit,
 * as the real driver does, and a sticky error poisons a process for good:
 * each case needs a process of its own. The parent of every case never
 * loads the driver. A child reports by exit status: CHECK prints the failed
 * condition and the error detail and exits 1.
 */
#ifndef TESTS_MEM_FORKCASE_H
#define TESTS_MEM_FORKCASE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <stdbool.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpufailover.h"

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: CHECK(%s) failed; last detail: %s\n", __FILE__,     \
				__LINE__, #cond, gf_error_detail());                                \
			_exit(1);                                                                  \
		}                                                                                  \
	} while (0)

static inline bool detail_has(const char *needle)
{
	return !needle || strstr(gf_error_detail(), needle);
}

/* CHECK that @rc is @want and the detail names @needle (NULL: any). */
#define CHECK_ERR(rc, want, needle)                                                                \
	do {                                                                                       \
		int got_ = (rc);                                                                   \
		if (got_ != (want) || !detail_has(needle)) {                                       \
			fprintf(stderr, "%s:%d: %s: got %s, want %s naming \"%s\"; detail: %s\n",   \
				__FILE__, __LINE__, #rc, gf_error_name(got_) ? gf_error_name(got_) : "0", \
				gf_error_name(want) ? gf_error_name(want) : "0", (needle) ? (needle) : "", \
				gf_error_detail());                                                 \
			_exit(1);                                                                  \
		}                                                                                  \
	} while (0)

/* Run @fn in a child with the environment settings @env ("NAME=value"
 * strings, NULL-terminated; "NAME" alone unsets) and assert it exits 0. */
static inline void run_case(void (*fn)(void), const char *const *env)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		for (const char *const *e = env; e && *e; e++) {
			const char *eq = strchr(*e, '=');
			if (!eq) {
				unsetenv(*e);
				continue;
			}
			char name[128];
			snprintf(name, sizeof(name), "%.*s", (int)(eq - *e), *e);
			setenv(name, eq + 1, 1);
		}
		fn();
		_exit(0);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

#endif
