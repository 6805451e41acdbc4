/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The metadata blob (lib/wire/metablob.c): what the GMS writes is what a
 * reader decodes, the fd must be sealed and of the announced size, and
 * every malformed blob (each truncation, wrong counts, unsorted or
 * duplicate keys, a key with an inner NUL, trailing bytes) is refused with
 * GF_ERR_PROTOCOL.
 */
#include <fcntl.h>
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

#include "../common/testutil.h"

#include "metablob.h"
#include "schema_limits.h"

#define N 300

struct got {
	struct gf_lc_meta e[N];
	char keys[N][GF_LIMIT_META_KEY];
	size_t n;
};

static int collect(void *ud, const struct gf_lc_meta *e)
{
	struct got *g = ud;
	if (g->n == N)
		return gf_err(GF_ERR_TOO_BIG, "more than %d", N);
	g->e[g->n] = *e;
	g->n++;
	return 0;
}

static char keys[N][GF_LIMIT_META_KEY];
static uint8_t value[GF_LIMIT_META_VALUE];
static struct gf_lc_meta ents[N];

static void fill(void)
{
	for (size_t i = 0; i < sizeof(value); i++)
		value[i] = (uint8_t)(i * 7);
	for (int i = 0; i < N; i++) {
		/* sorted by strcmp; the longest key allowed once, empty and full values */
		if (i == N - 1)
			memset(keys[i], 'z', GF_LIMIT_META_KEY - 1);
		else
			snprintf(keys[i], sizeof(keys[i]), "model.layers.%05d.weight", i);
		ents[i] = (struct gf_lc_meta){keys[i], (uint64_t)i + 1, (uint64_t)i << 40, value,
					      i == 0 ? 0 : (i == 1 ? GF_LIMIT_META_VALUE : (size_t)i % 97)};
	}
}

static uint8_t *blob(size_t n, uint64_t *size)
{
	int fd;
	uint8_t *buf;
	assert_int_equal(gf_mb_make_memfd(ents, n, &fd, size), 0);
	assert_int_equal(gf_mb_read_fd(fd, *size, &buf), 0);
	/* sealed: nobody holding the fd can change what readers decode */
	assert_true(write(fd, "x", 1) < 0);
	assert_true(ftruncate(fd, 0) < 0);
	assert_true(mmap(NULL, (size_t)*size, PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
	close(fd);
	return buf;
}

static void test_round_trip(void **state)
{
	(void)state;
	uint64_t size;
	uint8_t *buf = blob(N, &size);
	struct got *g = calloc(1, sizeof(*g));
	assert_int_equal(gf_mb_decode(buf, (size_t)size, N, collect, g), 0);
	assert_int_equal(g->n, N);
	for (int i = 0; i < N; i++) {
		assert_string_equal(g->e[i].key, ents[i].key);
		assert_int_equal(g->e[i].alloc_id, ents[i].alloc_id);
		assert_int_equal(g->e[i].offset, ents[i].offset);
		assert_int_equal(g->e[i].value_len, ents[i].value_len);
		if (ents[i].value_len)
			assert_memory_equal(g->e[i].value, ents[i].value, ents[i].value_len);
	}
	/* none: just the header */
	free(buf);
	buf = blob(0, &size);
	assert_int_equal(size, GF_MB_HEADER);
	g->n = 0;
	assert_int_equal(gf_mb_decode(buf, (size_t)size, 0, collect, g), 0);
	assert_int_equal(g->n, 0);
	free(buf);
	free(g);
}

static void test_fd_checks(void **state)
{
	(void)state;
	uint8_t *buf;
	int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint64_t size;
	uint8_t *good = blob(3, &size);
	assert_int_equal(write(fd, good, (size_t)size), (ssize_t)size);
	assert_int_equal(gf_mb_read_fd(fd, size, &buf), GF_ERR_PROTOCOL);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK), 0);
	assert_int_equal(gf_mb_read_fd(fd, size + 1, &buf), GF_ERR_PROTOCOL);
	assert_int_equal(gf_mb_read_fd(fd, size - 1, &buf), GF_ERR_PROTOCOL);
	assert_int_equal(gf_mb_read_fd(fd, size, &buf), 0);
	assert_memory_equal(buf, good, (size_t)size);
	free(buf);
	free(good);
	close(fd);
	/* a key too long is refused by the writer */
	char lng[GF_LIMIT_META_KEY + 1];
	memset(lng, 'k', GF_LIMIT_META_KEY);
	lng[GF_LIMIT_META_KEY] = 0;
	struct gf_lc_meta bad = {lng, 1, 0, NULL, 0};
	assert_int_equal(gf_mb_make_memfd(&bad, 1, &fd, &size), GF_ERR_INVALID_ARG);
}

static void test_malformed(void **state)
{
	(void)state;
	uint64_t size;
	uint8_t *buf = blob(5, &size);
	struct got *g = calloc(1, sizeof(*g));
	/* every truncation */
	for (size_t len = 0; len < size; len++) {
		uint8_t *cut = malloc(len ? len : 1);
		memcpy(cut, buf, len);
		g->n = 0;
		assert_int_equal(gf_mb_decode(cut, len, 5, collect, g), GF_ERR_PROTOCOL);
		free(cut);
	}
	/* count other than announced, trailing bytes */
	assert_int_equal(gf_mb_decode(buf, (size_t)size, 4, collect, g), GF_ERR_PROTOCOL);
	uint8_t *more = malloc((size_t)size + 1);
	memcpy(more, buf, (size_t)size);
	more[size] = 0;
	g->n = 0;
	assert_int_equal(gf_mb_decode(more, (size_t)size + 1, 5, collect, g), GF_ERR_PROTOCOL);
	free(more);
	/* another version */
	buf[4] = 2;
	assert_int_equal(gf_mb_decode(buf, (size_t)size, 5, collect, g), GF_ERR_PROTOCOL);
	buf[4] = 1;
	/* entry 0's key "model.layers.00000.weight" starts at 16 + 20: an inner NUL, then a key sorting after entry 1's */
	size_t key0 = GF_MB_HEADER + 20;
	buf[key0 + 3] = 0;
	g->n = 0;
	assert_int_equal(gf_mb_decode(buf, (size_t)size, 5, collect, g), GF_ERR_PROTOCOL);
	buf[key0 + 3] = 'e';
	buf[key0 + 17] = '9'; /* "...00009..." > "...00001..." */
	g->n = 0;
	assert_int_equal(gf_mb_decode(buf, (size_t)size, 5, collect, g), GF_ERR_PROTOCOL);
	buf[key0 + 17] = '1'; /* equal to entry 1's key: a duplicate */
	g->n = 0;
	assert_int_equal(gf_mb_decode(buf, (size_t)size, 5, collect, g), GF_ERR_PROTOCOL);
	buf[key0 + 17] = '0';
	g->n = 0;
	assert_int_equal(gf_mb_decode(buf, (size_t)size, 5, collect, g), 0);
	/* a value length over the limit */
	buf[GF_MB_HEADER + 18] = 0xff;
	buf[GF_MB_HEADER + 19] = 0xff;
	assert_int_equal(gf_mb_decode(buf, (size_t)size, 5, collect, g), GF_ERR_PROTOCOL);
	free(buf);
	free(g);
}

int main(void)
{
	fill();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_fd_checks),
		cmocka_unit_test(test_malformed),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
