/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gf_mem_region_back_fd() on one backend (argv[1] "host" or "cuda"; cuda on
 * the test driver tests/fakecuda): a region backed by memory made elsewhere
 * (the GMS's KV pool) maps that memory at its reserved address, with its
 * content and nothing zeroed; releasing it lets go of the import only, and a
 * second backing maps the same memory again. Wrong fds and double backing
 * are refused with nothing left behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "memtest.h"


static void test_back_fd_maps_the_memory(void **state)
{
	(void)state;
	int fds = tu_count_fds();
	gf_mem *m = mt_open();
	size_t gran, rec;
	assert_int_equal(gf_mem_granularity(m, &gran, &rec), 0);
	size_t size = 2 * gran;
	/* The memory's owner (the GMS) writes it through its own mapping. */
	gf_mem_alloc *owner;
	gf_mem_va *ova;
	assert_int_equal(gf_mem_create(&owner, m, size), 0);
	assert_int_equal(gf_mem_reserve(&ova, m, size, 0), 0);
	assert_int_equal(gf_mem_map(ova, 0, owner, GF_MEM_READWRITE), 0);
	uint8_t *o = (uint8_t *)(uintptr_t)gf_mem_va_addr(ova);
	memset(o, 0x3c, size);
	int fd;
	assert_int_equal(gf_mem_export(owner, &fd), 0);

	gf_mem_region *r;
	assert_int_equal(gf_mem_region_reserve(&r, m, size), 0);
	uint64_t addr = gf_mem_region_addr(r);
	assert_int_equal(gf_mem_region_back_fd(r, fd), 0);
	assert_int_equal(gf_mem_region_backed(r), 1);
	assert_int_equal(gf_mem_region_addr(r), addr);
	uint8_t *p = (uint8_t *)(uintptr_t)addr;
	assert_int_equal(p[0], 0x3c); /* the owner's content: nothing zeroed */
	assert_int_equal(p[size - 1], 0x3c);
	p[1] = 0x99;
	assert_int_equal(o[1], 0x99); /* one memory */
	assert_int_equal(gf_mem_region_back_fd(r, fd), GF_ERR_STATE);
	/* Released: the import goes, the memory stays with its owner. */
	assert_int_equal(gf_mem_region_release(r), 0);
	assert_int_equal(gf_mem_region_backed(r), 0);
	assert_int_equal(o[1], 0x99);
	assert_int_equal(gf_mem_region_back_fd(r, fd), 0);
	assert_int_equal(p[1], 0x99);
	gf_mem_region_free(r);
	close(fd);
	gf_mem_va_free(ova);
	gf_mem_alloc_free(owner);
	gf_mem_free(m);
	assert_int_equal(tu_count_fds(), fds);
}

static void test_back_fd_refuses_bad_fds(void **state)
{
	(void)state;
	int fds = tu_count_fds();
	gf_mem *m = mt_open();
	size_t gran, rec;
	assert_int_equal(gf_mem_granularity(m, &gran, &rec), 0);
	gf_mem_region *r;
	assert_int_equal(gf_mem_region_reserve(&r, m, 2 * gran), 0);
	assert_int_equal(gf_mem_region_back_fd(NULL, 0), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_region_back_fd(r, -1), GF_ERR_INVALID_ARG);
	if (mt_kind == GF_MEM_HOST) {
		/* Memory of another size than the region: refused, nothing mapped. */
		gf_mem_alloc *small;
		int fd;
		assert_int_equal(gf_mem_create(&small, m, gran), 0);
		assert_int_equal(gf_mem_export(small, &fd), 0);
		assert_int_equal(gf_mem_region_back_fd(r, fd), GF_ERR_INVALID_ARG);
		assert_int_equal(gf_mem_region_backed(r), 0);
		close(fd);
		gf_mem_alloc_free(small);
	}
	gf_mem_region_free(r);
	gf_mem_free(m);
	assert_int_equal(tu_count_fds(), fds);
}

int main(int argc, char **argv)
{
	if (mt_init(argc, argv))
		return 2;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_back_fd_maps_the_memory),
		cmocka_unit_test(test_back_fd_refuses_bad_fds),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
