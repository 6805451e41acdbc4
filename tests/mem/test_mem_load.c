/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Loading the driver (GF_LIBCUDA = the test driver): every way it can fail is
 * named, a failed load is not remembered, and the next attempt succeeds once
 * the cause is gone. The tests run in order in one process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../common/testutil.h"
#include "gpufailover.h"

static void expect_open_fails(const char *needle)
{
	gf_mem *m = NULL;
	assert_int_equal(gf_mem_open(&m, GF_MEM_CUDA, 0), GF_ERR_NOT_SUPPORTED);
	assert_null(m);
	if (!strstr(gf_error_detail(), needle))
		fail_msg("detail \"%s\" does not name \"%s\"", gf_error_detail(), needle);
}

static void test_missing_entry_point(void **state)
{
	(void)state;
	/* the 5th lookup is cuDeviceGetAttribute */
	tu_env_set("FAKECUDA_FAIL", "cuGetProcAddress:5");
	expect_open_fails("lacks entry point cuDeviceGetAttribute");
}

static void test_old_driver_lacking_entry_point(void **state)
{
	(void)state;
	tu_env_set("FAKECUDA_DRIVER_VERSION", "11020");
	tu_env_set("FAKECUDA_FAIL", "cuGetProcAddress:9");
	expect_open_fails("too old: version 11.2");
	tu_env_set("FAKECUDA_DRIVER_VERSION", NULL);
}

static void test_no_device(void **state)
{
	(void)state;
	tu_env_set("FAKECUDA_FAIL", NULL);
	setenv("FAKECUDA_DEVICES", "0", 1);
	expect_open_fails("no CUDA device");
	unsetenv("FAKECUDA_DEVICES");
}

static void test_init_failure_then_success(void **state)
{
	(void)state;
	tu_env_set("FAKECUDA_FAIL", "cuInit:1:804");
	expect_open_fails("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE");
	tu_env_set("FAKECUDA_FAIL", NULL);
	gf_mem *m = NULL;
	int rc = gf_mem_open(&m, GF_MEM_CUDA, 0);
	if (rc < 0)
		fail_msg("open after the cause is gone: %s", gf_error_detail());
	assert_int_equal(gf_mem_kind(m), GF_MEM_CUDA);
	gf_mem_free(m);
}

int main(void)
{
	char *dir = tu_tmpdir();
	setenv("FAKECUDA_STATE_DIR", dir, 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_missing_entry_point),
		cmocka_unit_test(test_old_driver_lacking_entry_point),
		cmocka_unit_test(test_no_device),
		cmocka_unit_test(test_init_failure_then_success),
	};
	int rc = tu_run_group_tests(tests, NULL, NULL);
	rmdir(dir);
	free(dir);
	return rc;
}
