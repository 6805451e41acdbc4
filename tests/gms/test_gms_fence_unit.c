/* SPDX-License-Identifier: Apache-2.0 */
/* The weight fence of a GMS connection (pure module): every event from every state. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../common/testutil.h"

#include "fence.h"

#define S(x) GMS_FENCE_##x
#define NSTATES 8
#define NEVENTS 6

/* The whole table: rows are states, columns ASK_ADMISSION, ASK_GRANT, ASK_COMMIT, YES, NO, RESET. */
static void test_transition_table(void **state)
{
	(void)state;
	static const enum gms_fence want[NSTATES][NEVENTS] = {
		[S(NONE)] = { S(ADMITTING), S(ASKING), S(COMMITTING), S(NONE), S(NONE), S(NONE) },
		[S(ADMITTING)] = { S(NONE), S(NONE), S(NONE), S(ADMITTED), S(NONE), S(NONE) },
		[S(ADMITTED)] = { S(NONE), S(ADMITTED_ASKING), S(NONE), S(NONE), S(NONE), S(NONE) },
		[S(ASKING)] = { S(NONE), S(NONE), S(NONE), S(PASSED), S(NONE), S(NONE) },
		[S(ADMITTED_ASKING)] = { S(NONE), S(NONE), S(NONE), S(ADMITTED_PASSED), S(NONE), S(NONE) },
		[S(PASSED)] = { S(NONE), S(NONE), S(NONE), S(NONE), S(NONE), S(NONE) },
		[S(ADMITTED_PASSED)] = { S(NONE), S(NONE), S(NONE), S(NONE), S(NONE), S(NONE) },
		[S(COMMITTING)] = { S(NONE), S(NONE), S(NONE), S(NONE), S(NONE), S(NONE) },
	};
	static const enum gms_fence_event ev[NEVENTS] = { GMS_FENCE_ASK_ADMISSION, GMS_FENCE_ASK_GRANT,
							  GMS_FENCE_ASK_COMMIT, GMS_FENCE_YES, GMS_FENCE_NO,
							  GMS_FENCE_RESET };
	for (int s = 0; s < NSTATES; s++)
		for (int e = 0; e < NEVENTS; e++) {
			enum gms_fence got = gms_fence_next((enum gms_fence)s, ev[e]);
			if (got != want[s][e])
				fail_msg("state %d event %d: got %d, want %d", s, e, (int)got, (int)want[s][e]);
		}
}

/* What the server reads off a state: a query in flight, readers held back, the grant may drop. */
static void test_predicates(void **state)
{
	(void)state;
	static const struct {
		enum gms_fence s;
		bool asking, admitted, passed;
	} t[] = {
		{ S(NONE), false, false, false },
		{ S(ADMITTING), true, false, false },
		{ S(ADMITTED), false, true, false },
		{ S(ASKING), true, false, false },
		{ S(ADMITTED_ASKING), true, true, false },
		{ S(PASSED), false, false, true },
		{ S(ADMITTED_PASSED), false, true, true },
		{ S(COMMITTING), true, false, false },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		assert_int_equal(gms_fence_asking(t[i].s), t[i].asking);
		assert_int_equal(gms_fence_admitted(t[i].s), t[i].admitted);
		assert_int_equal(gms_fence_passed(t[i].s), t[i].passed);
	}
}

/* The paths the server takes: an admitted writer keeps holding readers back while its grant is asked. */
static void test_paths(void **state)
{
	(void)state;
	enum gms_fence f = S(NONE);
	f = gms_fence_next(f, GMS_FENCE_ASK_ADMISSION);
	assert_false(gms_fence_admitted(f));
	f = gms_fence_next(f, GMS_FENCE_YES);
	assert_true(gms_fence_admitted(f));
	f = gms_fence_next(f, GMS_FENCE_ASK_GRANT);
	assert_true(gms_fence_admitted(f));
	assert_true(gms_fence_asking(f));
	f = gms_fence_next(f, GMS_FENCE_YES);
	assert_true(gms_fence_passed(f));
	f = gms_fence_next(f, GMS_FENCE_RESET); /* granted */
	assert_int_equal(f, S(NONE));
	f = gms_fence_next(f, GMS_FENCE_ASK_COMMIT);
	assert_true(gms_fence_asking(f));
	assert_int_equal(gms_fence_next(f, GMS_FENCE_NO), S(NONE));
	/* A refused admission holds nothing back. */
	f = gms_fence_next(gms_fence_next(S(NONE), GMS_FENCE_ASK_ADMISSION), GMS_FENCE_NO);
	assert_false(gms_fence_admitted(f));
	assert_false(gms_fence_asking(f));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_transition_table),
		cmocka_unit_test(test_predicates),
		cmocka_unit_test(test_paths),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
