/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Snapshot and restore on a real GPU through the staged (pinned, double-
 * buffered) copy path: device bytes written with the driver's own synchronous
 * cuMemcpyHtoD, snapshotted, restored into fresh allocations and read back
 * with cuMemcpyDtoH. Exits 77 (SKIP) unless the real driver works with a
 * device; it never runs against tests/fakecuda.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <cuda.h>

#include "gpu_driver.h"
#include "gpufailover.h"
#include "snapshot.h"
#include "testutil.h"
#include "xfer.h"

#define SKIP GPU_SKIP
#define NALLOCS 3

static CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
static CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);

static uint8_t pattern(size_t alloc, size_t off)
{
	return (uint8_t)(alloc * 37 + off * 11 + (off >> 12));
}

/* Copy between one allocation and host memory through a temporary mapping (READWRITE for both directions). */
static void dev_copy(gf_mem *m, gf_mem_alloc *a, uint8_t *host, bool to_device)
{
	gf_mem_va *va;
	size_t n = gf_mem_alloc_size(a);
	assert_int_equal(gf_mem_reserve(&va, m, n, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READWRITE), 0);
	CUresult r = to_device ? memcpy_htod(gf_mem_va_addr(va), host, n) : memcpy_dtoh(host, gf_mem_va_addr(va), n);
	assert_int_equal(r, CUDA_SUCCESS);
	gf_mem_va_free(va);
}

/* Whether the real driver works with a device; finds its copy functions.
 * 0, SKIP (the reason printed) or 1. Loads the driver. */
static int find_driver(void)
{
	void *sym = gpu_real_driver();
	if (!sym)
		return SKIP;
	CUresult (*gp)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
		(CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))sym;
	if (gp("cuMemcpyHtoD", (void **)&memcpy_htod, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuMemcpyDtoH", (void **)&memcpy_dtoh, 12000, 0, NULL) != CUDA_SUCCESS) {
		printf("FAIL: cannot look up cuMemcpyHtoD/DtoH in the driver\n");
		return 1;
	}
	return 0;
}

/* In each test's process: the driver and its device files, before the runner counts fds. */
static void load_driver(void)
{
	if (!memcpy_htod && find_driver() != 0)
		fprintf(stderr, "the driver did not load in the test's process\n");
}

static void test_round_trip(void **state)
{
	(void)state;
	assert_non_null(memcpy_htod);
	gf_mem *m;
	size_t g, rec;
	assert_int_equal(gf_mem_open(&m, GF_MEM_CUDA, 0), 0);
	assert_int_equal(gf_mem_granularity(m, &g, &rec), 0);
	size_t sizes[NALLOCS] = { g, (2 * GF_MEM_XFER_CHUNK + g) / g * g + g, 3 * g };
	gf_mem_alloc *allocs[NALLOCS];
	struct tiers_manifest *mf = tiers_manifest_new();
	mf->allocs = calloc(NALLOCS, sizeof(*mf->allocs));
	mf->nallocs = NALLOCS;
	for (size_t i = 0; i < NALLOCS; i++) {
		assert_int_equal(gf_mem_create(&allocs[i], m, sizes[i]), 0);
		uint8_t *h = malloc(sizes[i]);
		for (size_t b = 0; b < sizes[i]; b++)
			h[b] = pattern(i, b);
		dev_copy(m, allocs[i], h, true);
		free(h);
		mf->allocs[i].id = i + 1;
		mf->allocs[i].size = gf_mem_alloc_size(allocs[i]);
	}
	assert_int_equal(tiers_manifest_layout_hash(mf, mf->layout_hash), 0);
	char *tmp = tu_tmpdir(), dir[600];
	snprintf(dir, sizeof(dir), "%s/snap", tmp);
	int rc = tiers_snapshot_write(dir, m, mf, allocs, NULL);
	if (rc < 0)
		fail_msg("snapshot: %s", gf_error_detail());
	struct tiers_manifest *back;
	gf_mem_alloc **got;
	rc = tiers_snapshot_restore(dir, m, &back, &got, NULL);
	if (rc < 0)
		fail_msg("restore: %s", gf_error_detail());
	for (size_t i = 0; i < NALLOCS; i++) {
		uint8_t *h = malloc(sizes[i]);
		dev_copy(m, got[i], h, false);
		for (size_t b = 0; b < sizes[i]; b++)
			if (h[b] != pattern(i, b))
				fail_msg("allocation %zu byte %zu differs after restore", i + 1, b);
		free(h);
		gf_mem_alloc_free(allocs[i]);
	}
	tiers_snapshot_restored_free(back, got);
	tiers_manifest_free(mf);
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	assert_int_equal(system(cmd), 0);
	free(tmp);
	gf_mem_free(m);
}

int main(void)
{
	/* Only the real driver counts: no override, no test driver. The driver
	 * is loaded in forked children only (a process that initialised it
	 * cannot use it in its fork children): one to decide SKIP, then one per
	 * test. */
	unsetenv("GF_LIBCUDA");
	int rc = gpu_decide_in_child(find_driver);
	if (rc != 0)
		return rc;
	tu_process_init = load_driver;
	const struct CMUnitTest tests[] = { cmocka_unit_test(test_round_trip) };
	return tu_run_group_tests(tests, NULL, NULL);
}
