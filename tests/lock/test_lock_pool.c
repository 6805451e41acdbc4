/* SPDX-License-Identifier: Apache-2.0 */
/* The standby pool's rules (pure module): UUIDs, the eviction choice, readiness, declarations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../common/testutil.h"
#include "pool.h"

#define G0 "GPU-00000000-0000-0000-0000-000000000000"
#define G1 "GPU-11111111-1111-1111-1111-111111111111"

static struct gf_pool_decl decl_on(const char *gpu, bool pinned)
{
	struct gf_pool_decl d;
	memset(&d, 0, sizeof(d));
	d.ngpus = 1;
	d.pinned = pinned;
	snprintf(d.gpus[0], sizeof(d.gpus[0]), "%s", gpu);
	return d;
}

static void test_uuid_parse(void **state)
{
	(void)state;
	char out[GF_POOL_UUID_MAX];
	assert_true(gf_pool_uuid_parse("GPU-ABCDEF01-2345-6789-abcd-ef0123456789", out));
	assert_string_equal(out, "GPU-abcdef01-2345-6789-abcd-ef0123456789");
	assert_true(gf_pool_uuid_parse("MIG-abcdef01-2345-6789-abcd-ef0123456789", out));
	static const char *const bad[] = {
		"", "GPU-", "0", "gpu-abcdef01-2345-6789-abcd-ef0123456789", "GPU-abcdef01-2345-6789-abcd-ef012345678",
		"GPU-abcdef01-2345-6789-abcd-ef01234567890", "GPU-abcdef0g-2345-6789-abcd-ef0123456789",
		"GPU-abcdef01_2345-6789-abcd-ef0123456789", "GPU-abcdef01-2345-6789-abcd-ef0123456789 ",
		"MIG-GPU-abcdef01-2345-6789-abcd-ef0123456789/1/0",
	};
	strcpy(out, "untouched");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_false(gf_pool_uuid_parse(bad[i], out));
	assert_string_equal(out, "untouched");
	assert_false(gf_pool_uuid_parse(NULL, out));
}

/* Budget 2, four standbys on one GPU plus the holder: the two least recently Active go. */
static void test_evicts_least_recently_active(void **state)
{
	(void)state;
	struct gf_pool_decl d = decl_on(G0, false);
	struct gf_pool_member m[] = {
		{ .decl = &d, .holder = true, .since_us = 0, .last_active_us = 100 },
		{ .decl = &d, .since_us = 10, .last_active_us = 50 },
		{ .decl = &d, .since_us = 20, .last_active_us = 0 }, /* never Active: first to go */
		{ .decl = &d, .since_us = 30, .last_active_us = 70 },
		{ .decl = &d, .since_us = 40, .last_active_us = 0 }, /* the newcomer */
	};
	struct gf_pool_policy p = { .max_standby_per_gpu = 2 };
	size_t v[8], short_by = 9;
	size_t n = gf_pool_choose_evictions(m, 5, 4, &p, 1000, v, 8, &short_by);
	assert_int_equal(n, 2);
	assert_int_equal(v[0], 2);
	assert_int_equal(v[1], 4); /* the newcomer, never Active, is older than one Active at 50 */
	assert_int_equal(short_by, 0);
	m[4].last_active_us = 60;
	n = gf_pool_choose_evictions(m, 5, 4, &p, 1000, v, 8, &short_by);
	assert_int_equal(n, 2);
	assert_int_equal(v[0], 2);
	assert_int_equal(v[1], 1);
	/* Within budget: nobody. No budget: nobody. */
	assert_int_equal(gf_pool_choose_evictions(m, 3, 2, &p, 1000, v, 8, NULL), 0);
	p.max_standby_per_gpu = 0;
	assert_int_equal(gf_pool_choose_evictions(m, 5, 4, &p, 1000, v, 8, NULL), 0);
}

/* Ties in last Active: the one waiting longest goes first. */
static void test_tie_breaks_by_registration(void **state)
{
	(void)state;
	struct gf_pool_decl d = decl_on(G0, false);
	struct gf_pool_member m[] = {
		{ .decl = &d, .since_us = 30 },
		{ .decl = &d, .since_us = 10 },
		{ .decl = &d, .since_us = 40 },
	};
	struct gf_pool_policy p = { .max_standby_per_gpu = 2 };
	size_t v[4];
	assert_int_equal(gf_pool_choose_evictions(m, 3, 2, &p, 1000, v, 4, NULL), 1);
	assert_int_equal(v[0], 1);
}

/* Pinned and young standbys are never chosen; the shortfall is reported. */
static void test_protected_members(void **state)
{
	(void)state;
	struct gf_pool_decl pinned = decl_on(G0, true), free_ = decl_on(G0, false);
	struct gf_pool_member m[] = {
		{ .decl = &pinned, .since_us = 0, .last_active_us = 0 },
		{ .decl = &free_, .since_us = 900, .last_active_us = 0 }, /* 100us old */
		{ .decl = &free_, .since_us = 0, .last_active_us = 5 },
		{ .decl = &free_, .since_us = 1000, .last_active_us = 0 }, /* the newcomer */
	};
	struct gf_pool_policy p = { .max_standby_per_gpu = 1, .min_standby_age_us = 500 };
	size_t v[4], short_by;
	size_t n = gf_pool_choose_evictions(m, 4, 3, &p, 1000, v, 4, &short_by);
	assert_int_equal(n, 1);
	assert_int_equal(v[0], 2);
	assert_int_equal(short_by, 2); /* 3 left on a budget of 1 */
	/* Once old enough, the young one is evictable too. */
	n = gf_pool_choose_evictions(m, 4, 3, &p, 1400, v, 4, &short_by);
	assert_int_equal(n, 2);
	assert_int_equal(v[0], 1); /* never Active */
	assert_int_equal(v[1], 2);
	assert_int_equal(short_by, 1); /* the pinned one and the newcomer stay */
	/* The victims array's capacity is respected. */
	assert_int_equal(gf_pool_choose_evictions(m, 4, 3, &p, 1400, v, 1, NULL), 1);
}

/* Only GPUs the newcomer declared are checked; standbys elsewhere or without a declaration are not counted. */
static void test_other_gpus_untouched(void **state)
{
	(void)state;
	struct gf_pool_decl a = decl_on(G0, false), b = decl_on(G1, false), both = decl_on(G0, false);
	both.ngpus = 2;
	snprintf(both.gpus[1], sizeof(both.gpus[1]), "%s", G1);
	struct gf_pool_member m[] = {
		{ .decl = &b, .since_us = 1 },  { .decl = &b, .since_us = 2 }, { .decl = NULL, .since_us = 3 },
		{ .decl = &a, .since_us = 4 },  { .decl = &a, .since_us = 5 },
	};
	struct gf_pool_policy p = { .max_standby_per_gpu = 1 };
	size_t v[4];
	assert_int_equal(gf_pool_choose_evictions(m, 5, 4, &p, 100, v, 4, NULL), 1);
	assert_int_equal(v[0], 3);
	/* A newcomer on two GPUs makes room on both. */
	m[4].decl = &both;
	assert_int_equal(gf_pool_choose_evictions(m, 5, 4, &p, 100, v, 4, NULL), 3);
	assert_int_equal(v[0], 3);
	assert_int_equal(v[1], 0);
	assert_int_equal(v[2], 1);
	/* A newcomer that declared nothing evicts nobody. */
	assert_int_equal(gf_pool_choose_evictions(m, 5, 2, &p, 100, v, 4, NULL), 0);
}

static void test_ready(void **state)
{
	(void)state;
	struct gf_pool_decl h = decl_on(G0, false);
	h.ngpus = 2;
	snprintf(h.gpus[1], sizeof(h.gpus[1]), "%s", G1);
	snprintf(h.model, sizeof(h.model), "llama");
	char q[2][GF_POOL_UUID_MAX] = { G1, G0 };
	assert_true(gf_pool_ready(&h, (const char(*)[GF_POOL_UUID_MAX])q, 2, NULL));
	assert_true(gf_pool_ready(&h, (const char(*)[GF_POOL_UUID_MAX])q, 1, "llama"));
	assert_true(gf_pool_ready(&h, NULL, 0, ""));
	assert_false(gf_pool_ready(&h, (const char(*)[GF_POOL_UUID_MAX])q, 1, "qwen"));
	assert_false(gf_pool_ready(NULL, NULL, 0, NULL)); /* no holder */
	h.ngpus = 1;
	assert_false(gf_pool_ready(&h, (const char(*)[GF_POOL_UUID_MAX])q, 2, NULL));
}

static void test_decl_from_acquire(void **state)
{
	(void)state;
	gf_LockAcquire a;
	memset(&a, 0, sizeof(a));
	struct gf_pool_decl d;
	a.gpus_count = 2;
	strcpy(a.gpus[0], "GPU-AAAAAAAA-0000-0000-0000-000000000000");
	strcpy(a.gpus[1], G1);
	strcpy(a.model, "m-1");
	a.pinned = true;
	a.wake_bytes = 7;
	a.asleep_bytes = 3;
	assert_int_equal(gf_pool_decl_from_acquire(&a, &d), 0);
	assert_int_equal(d.ngpus, 2);
	assert_string_equal(d.gpus[0], "GPU-aaaaaaaa-0000-0000-0000-000000000000");
	assert_true(d.pinned);
	assert_int_equal(d.wake_bytes, 7);
	assert_int_equal(d.asleep_bytes, 3);
	assert_string_equal(d.model, "m-1");
	strcpy(a.gpus[1], "GPU-aaaaaaaa-0000-0000-0000-000000000000"); /* the same GPU twice */
	assert_int_equal(gf_pool_decl_from_acquire(&a, &d), GF_ERR_INVALID_ARG);
	strcpy(a.gpus[1], "0");
	assert_int_equal(gf_pool_decl_from_acquire(&a, &d), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "not a UUID"));
	a.gpus_count = 0;
	strcpy(a.model, "has space");
	assert_int_equal(gf_pool_decl_from_acquire(&a, &d), GF_ERR_INVALID_ARG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_uuid_parse),
		cmocka_unit_test(test_evicts_least_recently_active),
		cmocka_unit_test(test_tie_breaks_by_registration),
		cmocka_unit_test(test_protected_members),
		cmocka_unit_test(test_other_gpus_untouched),
		cmocka_unit_test(test_ready),
		cmocka_unit_test(test_decl_from_acquire),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
