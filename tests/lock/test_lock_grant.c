/* SPDX-License-Identifier: Apache-2.0 */
/* The lock's grant rules (pure module): every gate, every acquire case, the epoch boundary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "grant.h"

/* Only a waiter with nothing in the way is granted: walk all 32 gate combinations. */
static void test_may_grant_every_gate(void **state)
{
	(void)state;
	for (unsigned bits = 0; bits < 32; bits++) {
		struct gf_lock_gate g = {
			.has_holder = bits & 1,
			.exit_wait = bits & 2,
			.window = bits & 4,
			.store_failed = bits & 8,
			.has_waiter = bits & 16,
		};
		assert_int_equal(gf_lock_may_grant(&g), bits == 16);
	}
}

static void test_acquire_decisions(void **state)
{
	(void)state;
	struct {
		struct gf_lock_acquire_in in;
		enum gf_lock_acquire_decision want;
	} t[] = {
		/* the connection's own role comes first, even with a bad id */
		{{.is_holder = true, .id_valid = false}, GF_LOCK_REFUSE_HOLDER},
		{{.is_waiter = true, .id_valid = true, .has_token = true}, GF_LOCK_REFUSE_WAITER},
		{{.id_valid = false}, GF_LOCK_REFUSE_ID},
		{{.id_valid = false, .has_token = true, .token_matches = true, .window = true}, GF_LOCK_REFUSE_ID},
		/* no token: queue, whatever else holds */
		{{.id_valid = true}, GF_LOCK_QUEUE},
		{{.id_valid = true, .other_holder = true}, GF_LOCK_QUEUE},
		{{.id_valid = true, .window = true}, GF_LOCK_QUEUE},
		/* a reclaim is never queued */
		{{.id_valid = true, .has_token = true, .token_matches = true, .other_holder = true}, GF_LOCK_TAKEOVER},
		{{.id_valid = true, .has_token = true, .token_matches = true, .window = true}, GF_LOCK_RECLAIM},
		{{.id_valid = true, .has_token = true, .token_matches = false, .window = true}, GF_LOCK_REFUSE_MISMATCH},
		{{.id_valid = true, .has_token = true, .token_matches = false, .other_holder = true}, GF_LOCK_REFUSE_NO_WINDOW},
		{{.id_valid = true, .has_token = true, .token_matches = true}, GF_LOCK_REFUSE_NO_WINDOW},
		{{.id_valid = true, .has_token = true}, GF_LOCK_REFUSE_NO_WINDOW},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		enum gf_lock_acquire_decision got = gf_lock_decide_acquire(&t[i].in);
		if (got != t[i].want)
			fail_msg("case %zu: got %d, want %d", i, (int)got, (int)t[i].want);
	}
}

static void test_epoch_boundary(void **state)
{
	(void)state;
	uint64_t next = 0;
	assert_true(gf_lock_next_epoch(0, &next));
	assert_int_equal(next, 1);
	assert_true(gf_lock_next_epoch((uint64_t)INT64_MAX - 1, &next));
	assert_true(next == (uint64_t)INT64_MAX);
	next = 7;
	assert_false(gf_lock_next_epoch((uint64_t)INT64_MAX, &next));
	assert_false(gf_lock_next_epoch(UINT64_MAX, &next));
	assert_int_equal(next, 7); /* untouched on refusal */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_may_grant_every_gate),
		cmocka_unit_test(test_acquire_decisions),
		cmocka_unit_test(test_epoch_boundary),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
