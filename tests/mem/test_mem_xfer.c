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

/*
 * fill_from_file: host allocations are memfds, filled file to file (splice,
 * or read/write where a file system does not splice; a pipe is one such
 * source); cuda ones are not files. A file that ends early is a protocol
 * error, and the bytes before it landed.
 */
static void test_fill_from_file(void **state)
{
	(void)state;
	gf_mem *m;
	gf_mem_alloc *a;
	gf_mem_va *va;
	size_t g, rec;
	assert_int_equal(gf_mem_open(&m, mt_kind, 0), 0);
	assert_int_equal(gf_mem_granularity(m, &g, &rec), 0);
	size_t size = (3u << 20) / g * g + g; /* several pipe loads */
	assert_int_equal(gf_mem_create(&a, m, size), 0);
	size = gf_mem_alloc_size(a);
	gf_mem_xfer *x;
	assert_int_equal(gf_mem_xfer_new(m, 0, &x), 0);
	int src = memfd_create("xfer-src", MFD_CLOEXEC);
	assert_true(src >= 0);
	uint8_t *want = malloc(size + 100);
	for (size_t i = 0; i < size + 100; i++)
		want[i] = (uint8_t)(i * 29 + 3);
	assert_int_equal(write(src, want, size + 100), (ssize_t)(size + 100));
	uint64_t off = 100;
	int rc = gf_mem_xfer_fill_from_file(x, a, 0, src, &off, size);
	if (mt_kind == GF_MEM_CUDA) {
		assert_false(gf_mem_xfer_files(x));
		assert_int_equal(rc, GF_ERR_NOT_SUPPORTED);
	} else {
		assert_true(gf_mem_xfer_files(x));
		assert_int_equal(rc, 0);
		assert_int_equal(off, size + 100);
		assert_int_equal(gf_mem_reserve(&va, m, size, 0), 0);
		assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READ), 0);
		assert_memory_equal((const void *)(uintptr_t)gf_mem_va_addr(va), want + 100, size);
		/* Truncated: everything there was landed, then the error. */
		off = 0;
		assert_int_equal(ftruncate(src, 5000), 0);
		assert_int_equal(gf_mem_xfer_fill_from_file(x, a, 0, src, &off, size), GF_ERR_PROTOCOL);
		assert_int_equal(off, 5000);
		/* A source that cannot be spliced at an offset (a pipe) goes through the copy path. */
		int p[2];
		assert_int_equal(pipe(p), 0);
		assert_int_equal(write(p[1], "abc", 3), 3);
		close(p[1]);
		off = 0;
		assert_true(gf_mem_xfer_fill_from_file(x, a, 0, p[0], &off, 3) < 0); /* pread on a pipe: ESPIPE */
		close(p[0]);
		gf_mem_va_free(va);
	}
	close(src);
	free(want);
	gf_mem_xfer_free(x);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

int main(int argc, char **argv)
{
	if (mt_init(argc, argv))
		return 2;
	const struct CMUnitTest tests[] = { cmocka_unit_test(test_lengths), cmocka_unit_test(test_fill_from_file) };
	return tu_run_group_tests(tests, NULL, NULL);
}
