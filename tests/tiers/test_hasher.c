/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The snapshot hasher (lib/tiers/hasher.c): every way of feeding it gives the
 * library's one-shot XXH3-64 of the same bytes: chunked streams, streams
 * ended by a chunk's digest_out (and the next one starting fresh), chunks
 * of a fresh mapping faulted in by the helper, chunks of a file the helper
 * reads into the caller's buffers (and a failed read reported, not hashed
 * over), and the AVX2
 * build of XXH3 where this CPU has AVX2.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "../common/testutil.h"

#include "gf-config.h"
#include "hasher.h"
#if GF_HAVE_XXH3_AVX2
#include "xxh3_fast.h"
#endif

static uint8_t *random_bytes(size_t n)
{
	uint8_t *p = malloc(n ? n : 1);
	assert_non_null(p);
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		p[i] = (uint8_t)x;
	}
	return p;
}

/* Lengths around XXH3's internal boundaries (16, 128, 240, stripes, blocks). */
static const size_t lengths[] = {0, 1, 16, 17, 128, 129, 240, 241, 1024, 4095, 65536, 1000003};

static void test_stream_equals_oneshot(void **state)
{
	(void)state;
	uint8_t *p = random_bytes(1000003);
	struct tiers_hasher *h;
	assert_int_equal(tiers_hasher_new(&h), 0);
	for (size_t k = 0; k < sizeof(lengths) / sizeof(lengths[0]); k++) {
		size_t n = lengths[k];
		tiers_hasher_reset(h);
		for (size_t off = 0; off < n; off += 7777)
			tiers_hasher_submit(h, p + off, n - off < 7777 ? n - off : 7777);
		assert_true(tiers_hasher_digest(h) == XXH3_64bits(p, n));
	}
	tiers_hasher_free(h);
	free(p);
}

/* Streams ended by digest_out, back to back, over a fresh mapping the helper faults in. */
static void test_digest_out_and_fault_in(void **state)
{
	(void)state;
	size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 64 * page;
	uint8_t *src = random_bytes(2 * n);
	int fd = memfd_create("hasher-test", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, src, 2 * n), (ssize_t)(2 * n));
	uint8_t *m = mmap(NULL, 2 * n, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	struct tiers_hasher *h;
	assert_int_equal(tiers_hasher_new(&h), 0);
	uint64_t d[3] = {0, 0, 0};
	tiers_hasher_submit_ex(h, m, page, true, NULL);
	tiers_hasher_submit_ex(h, m + page, n - page, true, &d[0]); /* stream 1: the first n bytes */
	tiers_hasher_submit_ex(h, m + n, n, true, &d[1]);          /* stream 2: the next n */
	tiers_hasher_submit_ex(h, m, 0, false, &d[2]);              /* an empty stream */
	tiers_hasher_wait(h);
	assert_true(d[0] == XXH3_64bits(src, n));
	assert_true(d[1] == XXH3_64bits(src + n, n));
	assert_true(d[2] == XXH3_64bits(NULL, 0));
	tiers_hasher_free(h);
	munmap(m, 2 * n);
	close(fd);
	free(src);
}

/* Queued chunks (up to TIERS_HASHER_QUEUE waiting, the ring wrapping many
 * times) hash in order: each stream's digest_out is its one-shot XXH3. */
static void test_queue_deep(void **state)
{
	(void)state;
	uint8_t *p = random_bytes(7060000);
	uint64_t got[40], want[40];
	struct tiers_hasher *h;
	assert_int_equal(tiers_hasher_new(&h), 0);
	size_t at = 0;
	for (int k = 0; k < 40; k++) {
		size_t n = 1000 + (size_t)k * 9000, piece = 1 + (size_t)k * 1111;
		want[k] = XXH3_64bits(p + at, n);
		for (size_t off = 0; off < n; off += piece) {
			size_t c = n - off < piece ? n - off : piece;
			tiers_hasher_queue(h, p + at + off, c, k % 2 == 0, off + c == n ? &got[k] : NULL);
		}
		at += n;
	}
	tiers_hasher_wait(h);
	for (int k = 0; k < 40; k++)
		assert_true(got[k] == want[k]);
	tiers_hasher_free(h);
	free(p);
}

/* File chunks: read by the helper into the caller's buffers and hashed
 * there, mixed with memory chunks in one stream; each ticket's buffer then
 * holds exactly the bytes hashed. */
static void test_file_chunks(void **state)
{
	(void)state;
	size_t big = (size_t)1 << 20, total = 3 * big + 12345;
	uint8_t *src = random_bytes(total);
	int fd = memfd_create("hasher-file-test", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, src, total), (ssize_t)total);
	uint8_t *buf = malloc(4 * big);
	assert_non_null(buf);
	memset(buf, 0xa5, 4 * big);
	struct tiers_hasher *h;
	assert_int_equal(tiers_hasher_new(&h), 0);
	uint64_t d[4] = { 0, 0, 0, 0 };
	uint64_t t0 = tiers_hasher_queue_read(h, fd, 0, big, buf, &d[0]);                      /* one stream */
	uint64_t t1 = tiers_hasher_queue_read(h, fd, big, big, buf + big, NULL);               /* the next, in two */
	uint64_t t2 = tiers_hasher_queue_read(h, fd, 2 * big, big + 12345, buf + 2 * big, &d[1]);
	uint64_t t3 = tiers_hasher_queue_read(h, fd, 7, 100, buf + 3 * big + 20000, NULL);     /* a file chunk, then memory */
	tiers_hasher_queue(h, src + 107, 1000, false, &d[2]);
	uint64_t t4 = tiers_hasher_queue_read(h, fd, 5, 0, buf, &d[3]);                        /* empty */
	assert_true(t0 < t1 && t1 < t2 && t2 < t3 && t3 < t4);
	assert_int_equal(tiers_hasher_wait_for(h, t2), 0);
	assert_memory_equal(buf, src, 3 * big + 12345);
	assert_int_equal(tiers_hasher_wait_for(h, t4), 0);
	assert_memory_equal(buf + 3 * big + 20000, src + 7, 100);
	assert_int_equal(tiers_hasher_read_error(h), 0);
	assert_true(d[0] == XXH3_64bits(src, big));
	assert_true(d[1] == XXH3_64bits(src + big, 2 * big + 12345));
	assert_true(d[2] == XXH3_64bits(src + 7, 1100));
	assert_true(d[3] == XXH3_64bits(NULL, 0));
	tiers_hasher_free(h);

	/* A chunk past the end of the file (ENODATA), or of a closed fd, is a
	 * read error the caller sees at that chunk's ticket, whatever the
	 * digest; the chunks after it are not read. */
	assert_int_equal(tiers_hasher_new(&h), 0);
	uint64_t ok = tiers_hasher_queue_read(h, fd, 0, 10, buf, NULL);
	assert_int_equal(tiers_hasher_wait_for(h, ok), 0);
	memset(buf, 0xa5, 20);
	uint64_t t = tiers_hasher_queue_read(h, fd, total - 10, 20, buf + 100, &d[0]);
	uint64_t after = tiers_hasher_queue_read(h, fd, 0, 20, buf, &d[1]);
	assert_int_equal(tiers_hasher_wait_for(h, t), ENODATA);
	assert_int_equal(tiers_hasher_wait_for(h, after), ENODATA);
	assert_int_equal(buf[0], 0xa5); /* not read after the failure */
	assert_int_equal(tiers_hasher_read_error(h), ENODATA);
	tiers_hasher_free(h);
	close(fd);
	assert_int_equal(tiers_hasher_new(&h), 0);
	t = tiers_hasher_queue_read(h, fd, 0, 10, buf, &d[0]);
	assert_int_equal(tiers_hasher_wait_for(h, t), EBADF);
	assert_int_equal(tiers_hasher_read_error(h), EBADF);
	tiers_hasher_free(h);
	free(buf);
	free(src);
}

static void test_avx2_build_equals_library(void **state)
{
	(void)state;
#if GF_HAVE_XXH3_AVX2
	if (!__builtin_cpu_supports("avx2"))
		skip();
	uint8_t *p = random_bytes(1000003);
	void *st = tiers_xxh3_avx2_new();
	assert_non_null(st);
	for (size_t k = 0; k < sizeof(lengths) / sizeof(lengths[0]); k++) {
		size_t n = lengths[k];
		tiers_xxh3_avx2_reset(st);
		for (size_t off = 0; off < n; off += 4099)
			tiers_xxh3_avx2_update(st, p + off, n - off < 4099 ? n - off : 4099);
		assert_true(tiers_xxh3_avx2_digest(st) == XXH3_64bits(p, n));
	}
	tiers_xxh3_avx2_free(st);
	free(p);
#else
	skip();
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stream_equals_oneshot),
		cmocka_unit_test(test_digest_out_and_fault_in),
		cmocka_unit_test(test_queue_deep),
		cmocka_unit_test(test_file_chunks),
		cmocka_unit_test(test_avx2_build_equals_library),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
