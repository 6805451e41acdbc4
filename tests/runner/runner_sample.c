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
#include <unistd.h>

#include <cmocka.h>

#include "../common/testutil.h"

static void test_clean(void **state)
{
	(void)state;
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
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_clean),	cmocka_unit_test(test_leaks_fd),
		cmocka_unit_test(test_crashes), cmocka_unit_test(test_hangs),
		cmocka_unit_test(test_exits),	cmocka_unit_test(test_after_the_others),
		cmocka_unit_test(test_skips),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
