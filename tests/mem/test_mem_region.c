/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gf_mem_region on one backend (argv[1] "host" or "cuda"; cuda runs on the
 * test driver tests/fakecuda): a usable read-write region, and on cuda every
 * failing step (create, reserve, map) unwinds to nothing, seen through the
 * driver's own accounting of used memory and through the fd count.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "memtest.h"


static void test_region_read_write(void **state)
{
	(void)state;
	int fds = tu_count_fds();
	gf_mem *m = mt_open();
	size_t minimum, recommended;
	assert_int_equal(gf_mem_granularity(m, &minimum, &recommended), 0);
	gf_mem_region *r = NULL;
	assert_int_equal(gf_mem_region_new(&r, m, minimum + 1), 0);
	/* Rounded up to whole granules. */
	assert_int_equal(gf_mem_region_size(r), 2 * minimum);
	uint64_t addr = gf_mem_region_addr(r);
	assert_true(addr != 0);
	uint8_t *p = (uint8_t *)(uintptr_t)addr;
	memset(p, 0xa5, gf_mem_region_size(r));
	assert_int_equal(p[0], 0xa5);
	assert_int_equal(p[gf_mem_region_size(r) - 1], 0xa5);
	gf_mem_region_free(r);
	gf_mem_region_free(NULL);
	gf_mem_free(m);
	assert_int_equal(tu_count_fds(), fds);
}

static void test_region_bad_args(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	gf_mem_region *r = (gf_mem_region *)&r;
	assert_int_equal(gf_mem_region_new(NULL, m, 4096), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_region_new(&r, NULL, 4096), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_region_new(&r, m, 0), GF_ERR_INVALID_ARG);
	assert_ptr_equal(r, (gf_mem_region *)&r); /* untouched on failure */
	assert_int_equal(gf_mem_region_addr(NULL), 0);
	assert_int_equal(gf_mem_region_size(NULL), 0);
	gf_mem_free(m);
}

static uint64_t used_bytes(gf_mem *m)
{
	uint64_t free_b, total_b;
	assert_int_equal(gf_mem_info(m, &free_b, &total_b), 0);
	return total_b - free_b;
}

/* A step of the region fails (the driver knob @knob=@value); nothing the
 * call made survives, and the error is the failing step's. */
static void expect_unwound(const char *knob, const char *value, int want_rc)
{
	gf_mem *m = mt_open();
	uint64_t used = used_bytes(m);
	int fds = tu_count_fds();
	gf_mem_region *r = NULL;
	tu_env_set(knob, value);
	int rc = gf_mem_region_new(&r, m, 4u << 20);
	tu_env_set(knob, NULL);
	assert_int_equal(rc, want_rc);
	assert_true(strlen(gf_error_detail()) > 0);
	assert_null(r);
	assert_int_equal(used_bytes(m), used);
	assert_int_equal(tu_count_fds(), fds);
	/* And the backend is still usable. */
	assert_int_equal(gf_mem_region_new(&r, m, 4u << 20), 0);
	assert_true(used_bytes(m) > used);
	gf_mem_region_free(r);
	assert_int_equal(used_bytes(m), used);
	gf_mem_free(m);
}

/* Reserved first, backed later, released and backed again: always at the
 * same address; the memory exists only while backed. */
static void test_region_reserve_back_release(void **state)
{
	(void)state;
	int fds = tu_count_fds();
	gf_mem *m = mt_open();
	uint64_t used = mt_kind == GF_MEM_CUDA ? used_bytes(m) : 0;
	size_t minimum;
	assert_int_equal(gf_mem_granularity(m, &minimum, NULL), 0);
	gf_mem_region *r = NULL;
	assert_int_equal(gf_mem_region_reserve(&r, m, minimum + 1), 0);
	uint64_t addr = gf_mem_region_addr(r);
	assert_true(addr != 0);
	assert_int_equal(gf_mem_region_size(r), 2 * minimum);
	assert_int_equal(gf_mem_region_backed(r), 0);
	assert_int_equal(gf_mem_region_release(r), 0); /* nothing to release */
	for (int round = 0; round < 2; round++) {
		assert_int_equal(gf_mem_region_back(r), 0);
		assert_int_equal(gf_mem_region_back(r), GF_ERR_STATE);
		assert_int_equal(gf_mem_region_backed(r), 1);
		assert_true(gf_mem_region_addr(r) == addr);
		if (mt_kind == GF_MEM_CUDA)
			assert_true(used_bytes(m) >= used + 2 * minimum);
		uint8_t *p = (uint8_t *)(uintptr_t)addr;
		memset(p, 0x3c, gf_mem_region_size(r));
		assert_int_equal(p[gf_mem_region_size(r) - 1], 0x3c);
		assert_int_equal(gf_mem_region_release(r), 0);
		assert_int_equal(gf_mem_region_backed(r), 0);
		if (mt_kind == GF_MEM_CUDA) /* the host's figure is the whole machine's */
			assert_int_equal(used_bytes(m), used);
	}
	gf_mem_region_free(r);
	assert_int_equal(gf_mem_region_backed(NULL), 0);
	assert_int_equal(gf_mem_region_back(NULL), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_region_release(NULL), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_region_reserve(NULL, m, 4096), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_region_reserve(&r, m, 0), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_region_reserve(&r, m, SIZE_MAX), GF_ERR_INVALID_ARG);
	gf_mem_free(m);
	assert_int_equal(tu_count_fds(), fds);
}

/* A backing that fails (out of memory) leaves the region reserved and
 * unbacked, and a later backing works. */
static void test_region_back_oom_keeps_reservation(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	uint64_t used = used_bytes(m);
	gf_mem_region *r = NULL;
	assert_int_equal(gf_mem_region_reserve(&r, m, 4u << 20), 0);
	uint64_t addr = gf_mem_region_addr(r);
	tu_env_set("FAKECUDA_OOM_AFTER_BYTES", "0");
	assert_int_equal(gf_mem_region_back(r), GF_ERR_OUT_OF_MEMORY);
	tu_env_set("FAKECUDA_OOM_AFTER_BYTES", NULL);
	assert_int_equal(gf_mem_region_backed(r), 0);
	assert_int_equal(used_bytes(m), used);
	assert_int_equal(gf_mem_region_back(r), 0);
	assert_true(gf_mem_region_addr(r) == addr);
	gf_mem_region_free(r);
	assert_int_equal(used_bytes(m), used);
	gf_mem_free(m);
}

static void test_region_oom(void **state)
{
	(void)state;
	expect_unwound("FAKECUDA_OOM_AFTER_BYTES", "0", GF_ERR_OUT_OF_MEMORY);
}

static void test_region_reserve_fails(void **state)
{
	(void)state;
	expect_unwound("FAKECUDA_FAIL", "cuMemAddressReserve:1", GF_ERR_DRIVER);
}

static void test_region_map_fails(void **state)
{
	(void)state;
	expect_unwound("FAKECUDA_FAIL", "cuMemMap:1", GF_ERR_DRIVER);
}

static void test_region_access_fails(void **state)
{
	(void)state;
	expect_unwound("FAKECUDA_FAIL", "cuMemSetAccess:1", GF_ERR_DRIVER);
}

/* The region's memfds (host): how many, and the pages they hold in all. */
static int region_memfds(long long *blocks)
{
	int n = 0;
	*blocks = 0;
	DIR *d = opendir("/proc/self/fd");
	assert_non_null(d);
	struct dirent *de;
	while ((de = readdir(d))) {
		char path[300], target[256];
		snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
		ssize_t len = readlink(path, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		struct stat st;
		if (strncmp(target, "/memfd:gf-mem ", 14) != 0 || stat(path, &st) != 0)
			continue;
		n++;
		*blocks += (long long)st.st_blocks;
	}
	closedir(d);
	return n;
}

/* Where an allocation costs nothing until touched (host), the next backing
 * is made ahead, at reserve and at release, so that backing (a wake) only
 * maps it: it holds no page while unused, and each backing is fresh memory
 * (zeros, nothing of the last one). Where it costs memory (cuda), nothing
 * is made ahead: a reserved region takes no device memory. */
static void test_region_backing_made_ahead(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	uint64_t used = mt_kind == GF_MEM_CUDA ? used_bytes(m) : 0;
	size_t minimum;
	assert_int_equal(gf_mem_granularity(m, &minimum, NULL), 0);
	long long blocks;
	int before = region_memfds(&blocks);
	gf_mem_region *r = NULL;
	assert_int_equal(gf_mem_region_reserve(&r, m, 4 * minimum), 0);
	if (mt_kind == GF_MEM_CUDA) {
		assert_int_equal(used_bytes(m), used);
	} else {
		assert_int_equal(region_memfds(&blocks), before + 1);
		assert_int_equal(blocks, 0);
	}
	uint8_t *p = (uint8_t *)(uintptr_t)gf_mem_region_addr(r);
	for (int round = 0; round < 3; round++) {
		assert_int_equal(gf_mem_region_back(r), 0);
		if (mt_kind != GF_MEM_CUDA) /* the spare was mapped: none made meanwhile */
			assert_int_equal(region_memfds(&blocks), before + 1);
		for (size_t i = 0; i < gf_mem_region_size(r); i += 4096)
			assert_int_equal(p[i], 0);
		memset(p, 0x5a, gf_mem_region_size(r));
		assert_int_equal(gf_mem_region_release(r), 0);
		if (mt_kind == GF_MEM_CUDA) {
			assert_int_equal(used_bytes(m), used);
		} else {
			assert_int_equal(region_memfds(&blocks), before + 1);
			assert_int_equal(blocks, 0);
		}
	}
	gf_mem_region_free(r);
	assert_int_equal(region_memfds(&blocks), before);
	gf_mem_free(m);
}

int main(int argc, char **argv)
{
	if (mt_init(argc, argv))
		return 2;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_region_read_write), cmocka_unit_test(test_region_bad_args),
		cmocka_unit_test(test_region_reserve_back_release), cmocka_unit_test(test_region_backing_made_ahead),
		cmocka_unit_test(test_region_oom),        cmocka_unit_test(test_region_reserve_fails),
		cmocka_unit_test(test_region_map_fails),  cmocka_unit_test(test_region_access_fails),
		cmocka_unit_test(test_region_back_oom_keeps_reservation),
	};
	/* The host backend has no fault knobs: it runs the first four only. */
	size_t n = mt_kind == GF_MEM_CUDA ? sizeof(tests) / sizeof(tests[0]) : 4;
	return tu_run_tests(tests, n, NULL, NULL);
}
