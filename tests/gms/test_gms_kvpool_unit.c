/* SPDX-License-Identifier: Apache-2.0 */
/* The KV pool's directory (pure module): who adopts it, and publishes applied whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../common/testutil.h"

#include "common.h"
#include "kvpool.h"

static const uint8_t L1[16] = { 1 }, L2[16] = { 2 };

static void test_decide(void **state)
{
	(void)state;
	struct gms_kv_dir d = { 0 };
	assert_int_equal(gms_kv_decide(&d, 5, 0, L1, 4096), GMS_KV_EMPTY_FIRST);
	assert_int_equal(gms_kv_take(&d, GMS_KV_EMPTY_FIRST, 5, L1, 4096, 1 << 20), 0);
	assert_int_equal(d.nslots, 256);
	assert_int_equal(gms_kv_decide(&d, 4, 0, L1, 4096), GMS_KV_STALE);
	assert_int_equal(gms_kv_decide(&d, 5, 0, L1, 4096), GMS_KV_ADOPTED); /* the same holder again */
	assert_int_equal(gms_kv_decide(&d, 5, 3, L1, 4096), GMS_KV_ADOPTED);
	assert_int_equal(gms_kv_decide(&d, 6, 0, L1, 4096), GMS_KV_ADOPTED);
	assert_int_equal(gms_kv_decide(&d, 6, 5, L1, 4096), GMS_KV_ADOPTED);
	assert_int_equal(gms_kv_decide(&d, 7, 6, L1, 4096), GMS_KV_EMPTY_CHAIN);
	assert_int_equal(gms_kv_decide(&d, 6, 5, L2, 4096), GMS_KV_EMPTY_LAYOUT);
	assert_int_equal(gms_kv_decide(&d, 6, 5, L1, 8192), GMS_KV_EMPTY_LAYOUT);
	assert_int_equal(gms_kv_take(&d, GMS_KV_STALE, 4, L1, 4096, 1 << 20), GF_ERR_INVALID_ARG);
	gms_kv_dir_clear(&d);
}

static void test_publish_whole(void **state)
{
	(void)state;
	struct gms_kv_dir d = { 0 };
	assert_int_equal(gms_kv_take(&d, GMS_KV_EMPTY_FIRST, 1, L1, 4096, 16 * 4096), 0);
	uint8_t h[32];
	memset(h, 7, sizeof(h));
	struct gms_kv_entry add[3] = { { 0, 32, h }, { 5, 8, h }, { 15, 1, h } };
	assert_int_equal(gms_kv_publish(&d, false, NULL, 0, add, 3), 0);
	assert_int_equal(d.count, 3);
	/* One bad entry refuses the whole publish: nothing applied, nothing removed. */
	uint32_t rm[1] = { 0 };
	struct gms_kv_entry bad[2] = { { 1, 32, h }, { 16, 32, h } };
	assert_int_equal(gms_kv_publish(&d, false, rm, 1, bad, 2), GF_ERR_INVALID_ARG);
	struct gms_kv_entry nohash[1] = { { 1, 0, h } };
	assert_int_equal(gms_kv_publish(&d, false, NULL, 0, nohash, 1), GF_ERR_INVALID_ARG);
	uint32_t rm_far[1] = { 99 };
	assert_int_equal(gms_kv_publish(&d, false, rm_far, 1, NULL, 0), GF_ERR_INVALID_ARG);
	assert_int_equal(d.count, 3);
	assert_int_equal(d.slots[0].len, 32);
	/* Removal before addition: a block removed and added in one publish holds the new hash. */
	uint8_t h2[4] = { 9, 9, 9, 9 };
	struct gms_kv_entry again[1] = { { 0, 4, h2 } };
	assert_int_equal(gms_kv_publish(&d, false, rm, 1, again, 1), 0);
	assert_int_equal(d.count, 3);
	assert_int_equal(d.slots[0].len, 4);
	/* Removing twice counts once. */
	uint32_t twice[2] = { 5, 5 };
	assert_int_equal(gms_kv_publish(&d, false, twice, 2, NULL, 0), 0);
	assert_int_equal(d.count, 2);
	assert_int_equal(gms_kv_next(&d, 0), 0);
	assert_int_equal(gms_kv_next(&d, 1), 15);
	assert_int_equal(gms_kv_next(&d, 16), 16);
	assert_int_equal(gms_kv_publish(&d, true, NULL, 0, NULL, 0), 0);
	assert_int_equal(d.count, 0);
	assert_int_equal(gms_kv_next(&d, 0), 16);
	/* Adopted: kept as is, owned by the new epoch. */
	assert_int_equal(gms_kv_publish(&d, false, NULL, 0, add, 1), 0);
	assert_int_equal(gms_kv_take(&d, GMS_KV_ADOPTED, 2, L1, 4096, 16 * 4096), 0);
	assert_int_equal(d.epoch, 2);
	assert_int_equal(d.count, 1);
	/* Emptied for another layout: sized again. */
	assert_int_equal(gms_kv_take(&d, GMS_KV_EMPTY_LAYOUT, 3, L2, 8192, 16 * 4096), 0);
	assert_int_equal(d.count, 0);
	assert_int_equal(d.nslots, 8);
	assert_memory_equal(d.layout, L2, 16);
	/* A pool too large for the directory's own memory is refused. */
	assert_int_equal(gms_kv_take(&d, GMS_KV_EMPTY_FIRST, 4, L1, 1, (uint64_t)GMS_KV_MAX_BLOCKS + 1), GF_ERR_INVALID_ARG);
	gms_kv_dir_clear(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decide),
		cmocka_unit_test(test_publish_whole),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
