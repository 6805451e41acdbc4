/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunked transfers (lib/mem/xfer.c) on one backend (argv[1] "host" or
 * "cuda" over tests/fakecuda, whose asynchronous copies land only when
 * waited for): every length around chunk boundaries arrives whole and in
 * order in both directions, a callback's error stops the transfer and is
 * returned, and nothing is left in flight.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "common.h"
#include "memtest.h"
#include "xfer.h"

struct stream {
	uint8_t *bytes; /* expected (read) or to give (write) */
	size_t pos, calls, fail_at;
};

static int sink(void *ud, const void *buf, size_t n)
{
	struct stream *s = ud;
	if (++s->calls == s->fail_at)
		return gf_err(GF_ERR_IO, "sink failed on purpose");
	if (memcmp(buf, s->bytes + s->pos, n) != 0)
		return gf_err(GF_ERR_PROTOCOL, "sink: bytes at %zu differ", s->pos);
	s->pos += n;
	return 0;
}

static int source(void *ud, void *buf, size_t n)
{
	struct stream *s = ud;
	if (++s->calls == s->fail_at)
		return gf_err(GF_ERR_IO, "source failed on purpose");
	memcpy(buf, s->bytes + s->pos, n);
	s->pos += n;
	return 0;
}

static void test_lengths(void **state)
{
	(void)state;
	gf_mem *m;
	gf_mem_alloc *a;
	gf_mem_va *va;
	size_t g, rec;
	const size_t chunk = 4096 * 3;
	assert_int_equal(gf_mem_open(&m, mt_kind, 0), 0);
	assert_int_equal(gf_mem_granularity(m, &g, &rec), 0);
	g = (8 * chunk + g - 1) / g * g; /* room for every length below and a guard byte */
	assert_int_equal(gf_mem_create(&a, m, g), 0);
	assert_int_equal(gf_mem_reserve(&va, m, g, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READWRITE), 0);
	uint8_t *dev = (uint8_t *)(uintptr_t)gf_mem_va_addr(va);
	uint8_t *want = malloc(g);
	for (size_t i = 0; i < g; i++)
		want[i] = (uint8_t)(i * 131 + 7);
	gf_mem_xfer *x;
	assert_int_equal(gf_mem_xfer_new(m, chunk, &x), 0);
	assert_int_equal(gf_mem_xfer_staged(x), mt_kind == GF_MEM_CUDA);
	size_t lens[] = { 0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk, 2 * chunk + 5, 5 * chunk + 17 };
	for (size_t i = 0; i < GF_ARRAY_SIZE(lens); i++) {
		size_t n = lens[i];
		memset(dev, 0, g);
		struct stream w = { .bytes = want };
		assert_int_equal(gf_mem_xfer_write(x, (uint64_t)(uintptr_t)dev, n, source, &w), 0);
		assert_int_equal(w.pos, n);
		assert_int_equal(w.calls, (n + chunk - 1) / chunk);
		/* Landed on the "device" when the call returned; nothing beyond. */
		assert_memory_equal(dev, want, n);
		assert_int_equal(dev[n], 0);
		struct stream r = { .bytes = want };
		int rc = gf_mem_xfer_read(x, (uint64_t)(uintptr_t)dev, n, sink, &r);
		if (rc < 0)
			fail_msg("read of %zu bytes: %s", n, gf_error_detail());
		assert_int_equal(r.pos, n);
	}
	/* A callback's error stops the transfer, comes back, and the next transfer works. */
	struct stream r = { .bytes = want, .fail_at = 2 };
	assert_int_equal(gf_mem_xfer_read(x, (uint64_t)(uintptr_t)dev, 4 * chunk, sink, &r), GF_ERR_IO);
	assert_int_equal(r.calls, 2);
	struct stream w = { .bytes = want, .fail_at = 3 };
	assert_int_equal(gf_mem_xfer_write(x, (uint64_t)(uintptr_t)dev, 4 * chunk, source, &w), GF_ERR_IO);
	assert_int_equal(w.calls, 3);
	assert_memory_equal(dev, want, 2 * chunk); /* what was given before the error landed */
	struct stream ok = { .bytes = want };
	assert_int_equal(gf_mem_xfer_read(x, (uint64_t)(uintptr_t)dev, 2 * chunk, sink, &ok), 0);
	assert_int_equal(gf_mem_xfer_read(x, 0, 1, sink, &ok), GF_ERR_INVALID_ARG);
	gf_mem_xfer_free(x);
	gf_mem_xfer_free(NULL);
	free(want);
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

/* Host allocations lend their memfds as files; cuda ones are not files. */
static void test_files(void **state)
{
	(void)state;
	gf_mem *m;
	assert_int_equal(gf_mem_open(&m, mt_kind, 0), 0);
	gf_mem_xfer *x;
	assert_int_equal(gf_mem_xfer_new(m, 0, &x), 0);
	assert_int_equal(gf_mem_xfer_files(x), mt_kind == GF_MEM_HOST);
	assert_false(gf_mem_xfer_files(NULL));
	gf_mem_xfer_free(x);
	gf_mem_free(m);
}

int main(int argc, char **argv)
{
	if (mt_init(argc, argv))
		return 2;
	const struct CMUnitTest tests[] = { cmocka_unit_test(test_lengths), cmocka_unit_test(test_files) };
	return tu_run_group_tests(tests, NULL, NULL);
}
