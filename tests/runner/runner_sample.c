/* SPDX-License-Identifier: Apache-2.0 */
/* Tests through the forking runner of tests/common/runner.h, one of each
 * outcome; test_runner.py checks the TAP stream and the log it produces. */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "../common/testutil.h"

/* An fd a process opens once and keeps, as a GPU driver keeps its device
 * files: a leak unless the runner's tu_process_init opened it first. */
static int kept_fd = -1;

static void open_kept(void)
{
	if (kept_fd < 0)
		kept_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void test_clean(void **state)
{
	(void)state;
	if (getenv("GF_SAMPLE_KEEP_FD"))
		open_kept();
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	close(fd);
}

static void test_leaks_fd(void **state)
{
	(void)state;
	assert_true(open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0);
}

static void test_crashes(void **state)
{
	(void)state;
	raise(SIGKILL);
}

static void test_hangs(void **state)
{
	(void)state;
	for (;;)
		pause();
}

/* Leaves without cmocka's say, as an assertion outside the test's thread
 * does (cmocka's exit(-1)). */
static void test_exits(void **state)
{
	(void)state;
	exit(3);
}

static void test_after_the_others(void **state)
{
	(void)state;
}

/* Cannot run here (as a test needing a GPU or another uid says): a SKIP, never a pass. */
static void test_skips(void **state)
{
	(void)state;
	fprintf(stderr, "test_skips: nothing to run it on\n");
	skip();
}

int main(void)
{
	if (getenv("GF_SAMPLE_PROCESS_INIT"))
		tu_process_init = open_kept;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_clean),	cmocka_unit_test(test_leaks_fd),
		cmocka_unit_test(test_crashes), cmocka_unit_test(test_hangs),
		cmocka_unit_test(test_exits),	cmocka_unit_test(test_after_the_others),
		cmocka_unit_test(test_skips),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
