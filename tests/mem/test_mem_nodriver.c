/* SPDX-License-Identifier: Apache-2.0 */
/*
 * No usable CUDA driver (run with GF_LIBCUDA=/nonexistent): the cuda backend
 * says why, GF_MEM_AUTO falls back to host and logs the reason.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../common/testutil.h"
#include "gpufailover.h"

static void test_cuda_unavailable(void **state)
{
	(void)state;
	gf_mem *m = NULL;
	int n = -1, idx = -1;
	assert_int_equal(gf_mem_open(&m, GF_MEM_CUDA, 0), GF_ERR_NOT_SUPPORTED);
	assert_null(m);
	const char *d = gf_error_detail();
	assert_true(strstr(d, "no CUDA driver") || strstr(d, "built without cuda.h"));
	assert_int_equal(gf_mem_device_count(GF_MEM_CUDA, &n), GF_ERR_NOT_SUPPORTED);
	assert_int_equal(n, -1);
	assert_int_equal(gf_mem_uuid_to_index(GF_MEM_CUDA, "GPU-0", &idx), GF_ERR_NOT_SUPPORTED);
}

static void test_auto_falls_back_to_host(void **state)
{
	(void)state;
	gf_mem *m = NULL;
	tu_logged()[0] = '\0';
	gf_set_log_fn(tu_capture_log, (void *)"mem");
	assert_int_equal(gf_mem_open(&m, GF_MEM_AUTO, 0), 0);
	gf_set_log_fn(NULL, NULL);
	assert_int_equal(gf_mem_kind(m), GF_MEM_HOST);
	assert_non_null(strstr(tu_logged(), "backend=host"));
	assert_true(strstr(tu_logged(), "no CUDA driver") || strstr(tu_logged(), "built without cuda.h"));
	gf_mem_free(m);
}

/* A library that is not a CUDA driver at all: named as too old. */
static void test_not_a_driver(void **state)
{
	(void)state;
	gf_mem *m = NULL;
	const char *old = getenv("GF_LIBCUDA");
	char *saved = old ? strdup(old) : NULL;
	setenv("GF_LIBCUDA", "libm.so.6", 1);
	int rc = gf_mem_open(&m, GF_MEM_CUDA, 0);
	assert_int_equal(rc, GF_ERR_NOT_SUPPORTED);
	assert_true(strstr(gf_error_detail(), "no cuGetProcAddress") || strstr(gf_error_detail(), "built without cuda.h"));
	if (saved)
		setenv("GF_LIBCUDA", saved, 1);
	else
		unsetenv("GF_LIBCUDA");
	free(saved);
}

int main(void)
{
	if (!getenv("GF_LIBCUDA"))
		setenv("GF_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cuda_unavailable),
		cmocka_unit_test(test_auto_falls_back_to_host),
		cmocka_unit_test(test_not_a_driver),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
