/* SPDX-License-Identifier: Apache-2.0 */
/* The GMS lock FSM (pure module): every mode from every state, every transition. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../common/testutil.h"

#include "fsm.h"
#include "layout.h"

static struct gms_fsm in_state(enum gms_state s, unsigned readers)
{
	struct gms_fsm f = {.state = s, .readers = readers};
	return f;
}

/* decide(): the whole table, with and without a waiting writer. */
static void test_decide_table(void **state)
{
	(void)state;
	struct {
		enum gms_state s;
		unsigned readers;
		int mode;
		bool rw_waiting;
		enum gms_decision want;
	} t[] = {
		{GMS_EMPTY, 0, GMS_MODE_RW, false, GMS_GRANT_RW},
		{GMS_EMPTY, 0, GMS_MODE_RW, true, GMS_GRANT_RW},
		{GMS_EMPTY, 0, GMS_MODE_RO, false, GMS_WAIT},       /* needs a commit */
		{GMS_EMPTY, 0, GMS_MODE_RO, true, GMS_WAIT},
		{GMS_EMPTY, 0, GMS_MODE_RW_OR_RO, false, GMS_GRANT_RW},
		{GMS_EMPTY, 0, GMS_MODE_RW_OR_RO, true, GMS_GRANT_RW},
		{GMS_RW, 0, GMS_MODE_RW, false, GMS_WAIT},
		{GMS_RW, 0, GMS_MODE_RO, false, GMS_WAIT},
		{GMS_RW, 0, GMS_MODE_RW_OR_RO, false, GMS_WAIT},    /* wait for commit or abort */
		{GMS_COMMITTED, 0, GMS_MODE_RW, false, GMS_GRANT_RW_DROP},
		{GMS_COMMITTED, 0, GMS_MODE_RW, true, GMS_GRANT_RW_DROP},
		{GMS_COMMITTED, 0, GMS_MODE_RO, false, GMS_GRANT_RO},
		{GMS_COMMITTED, 0, GMS_MODE_RO, true, GMS_WAIT},    /* writer priority */
		{GMS_COMMITTED, 0, GMS_MODE_RW_OR_RO, false, GMS_GRANT_RO},
		{GMS_COMMITTED, 0, GMS_MODE_RW_OR_RO, true, GMS_WAIT},
		{GMS_RO, 2, GMS_MODE_RW, false, GMS_WAIT},          /* readers still map the layout */
		{GMS_RO, 2, GMS_MODE_RO, false, GMS_GRANT_RO},
		{GMS_RO, 2, GMS_MODE_RO, true, GMS_WAIT},
		{GMS_RO, 2, GMS_MODE_RW_OR_RO, false, GMS_GRANT_RO},
		{GMS_RO, 2, GMS_MODE_RW_OR_RO, true, GMS_WAIT},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct gms_fsm f = in_state(t[i].s, t[i].readers);
		enum gms_decision d = gms_fsm_decide(&f, t[i].mode, t[i].rw_waiting);
		if (d != t[i].want)
			fail_msg("row %zu: state %s mode %s rw_waiting %d: got %d want %d", i,
				 gms_state_name(t[i].s), gms_mode_name(t[i].mode), t[i].rw_waiting, d, t[i].want);
	}
	struct gms_fsm f = in_state(GMS_EMPTY, 0);
	assert_int_equal(gms_fsm_decide(&f, 0, false), GMS_INVALID);
	assert_int_equal(gms_fsm_decide(&f, 7, false), GMS_INVALID);
}

static void test_apply(void **state)
{
	(void)state;
	struct gms_fsm f;
	gms_fsm_init(&f);
	assert_int_equal(f.state, GMS_EMPTY);
	gms_fsm_apply(&f, GMS_GRANT_RW);
	assert_int_equal(f.state, GMS_RW);
	f = in_state(GMS_COMMITTED, 0);
	gms_fsm_apply(&f, GMS_GRANT_RW_DROP);
	assert_int_equal(f.state, GMS_RW);
	assert_int_equal(f.readers, 0);
	f = in_state(GMS_COMMITTED, 0);
	gms_fsm_apply(&f, GMS_GRANT_RO);
	assert_int_equal(f.state, GMS_RO);
	assert_int_equal(f.readers, 1);
	gms_fsm_apply(&f, GMS_GRANT_RO);
	assert_int_equal(f.readers, 2);
	gms_fsm_apply(&f, GMS_WAIT); /* no-op */
	assert_int_equal(f.state, GMS_RO);
	assert_int_equal(f.readers, 2);
}

/* commit / writer_left / reader_left from every state. */
static void test_transitions(void **state)
{
	(void)state;
	struct gms_fsm f;
	/* RW --commit--> RO(1) */
	f = in_state(GMS_RW, 0);
	assert_true(gms_fsm_commit(&f));
	assert_int_equal(f.state, GMS_RO);
	assert_int_equal(f.readers, 1);
	/* commit is refused anywhere else */
	enum gms_state others[] = {GMS_EMPTY, GMS_COMMITTED, GMS_RO};
	for (size_t i = 0; i < 3; i++) {
		f = in_state(others[i], others[i] == GMS_RO ? 1 : 0);
		assert_false(gms_fsm_commit(&f));
		assert_int_equal(f.state, others[i]);
		assert_false(gms_fsm_writer_left(&f));
		assert_int_equal(f.state, others[i]);
	}
	/* RW --writer leaves--> EMPTY (RW_ABORT) */
	f = in_state(GMS_RW, 0);
	assert_true(gms_fsm_writer_left(&f));
	assert_int_equal(f.state, GMS_EMPTY);
	/* RO(2) -> RO(1) -> COMMITTED */
	f = in_state(GMS_RO, 2);
	assert_true(gms_fsm_reader_left(&f));
	assert_int_equal(f.state, GMS_RO);
	assert_int_equal(f.readers, 1);
	assert_true(gms_fsm_reader_left(&f));
	assert_int_equal(f.state, GMS_COMMITTED);
	assert_int_equal(f.readers, 0);
	/* no reader to leave */
	assert_false(gms_fsm_reader_left(&f));
	f = in_state(GMS_EMPTY, 0);
	assert_false(gms_fsm_reader_left(&f));
	f = in_state(GMS_RW, 0);
	assert_false(gms_fsm_reader_left(&f));
	assert_int_equal(f.state, GMS_RW);
}

/* A full life: load, commit, readers come and go, a new writer drops the layout, aborts. */
static void test_lifecycle(void **state)
{
	(void)state;
	struct gms_fsm f;
	gms_fsm_init(&f);
	gms_fsm_apply(&f, gms_fsm_decide(&f, GMS_MODE_RW_OR_RO, false));
	assert_int_equal(f.state, GMS_RW);
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RW_OR_RO, false), GMS_WAIT);
	assert_true(gms_fsm_commit(&f));
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RW_OR_RO, false), GMS_GRANT_RO);
	gms_fsm_apply(&f, GMS_GRANT_RO);
	assert_int_equal(f.readers, 2);
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RW, false), GMS_WAIT);
	assert_true(gms_fsm_reader_left(&f));
	assert_true(gms_fsm_reader_left(&f));
	assert_int_equal(f.state, GMS_COMMITTED);
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RW, false), GMS_GRANT_RW_DROP);
	gms_fsm_apply(&f, GMS_GRANT_RW_DROP);
	assert_true(gms_fsm_writer_left(&f));
	assert_int_equal(f.state, GMS_EMPTY);
}

/* A verified restore: only EMPTY becomes COMMITTED; readers are then granted as after a commit. */
static void test_restored(void **state)
{
	(void)state;
	enum gms_state from[] = { GMS_EMPTY, GMS_RW, GMS_COMMITTED, GMS_RO };
	for (size_t i = 0; i < sizeof(from) / sizeof(from[0]); i++) {
		struct gms_fsm f = in_state(from[i], from[i] == GMS_RO ? 2 : 0);
		bool ok = gms_fsm_restored(&f);
		assert_int_equal(ok, from[i] == GMS_EMPTY);
		assert_int_equal(f.state, from[i] == GMS_EMPTY ? GMS_COMMITTED : from[i]);
	}
	struct gms_fsm f = in_state(GMS_EMPTY, 0);
	assert_true(gms_fsm_restored(&f));
	assert_int_equal(f.readers, 0);
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RO, false), GMS_GRANT_RO);
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RW_OR_RO, false), GMS_GRANT_RO);
}

/* A demotion drops the layout only from COMMITTED without readers; a restore brings it back. */
static void test_demoted(void **state)
{
	(void)state;
	enum gms_state from[] = { GMS_EMPTY, GMS_RW, GMS_COMMITTED, GMS_RO };
	for (size_t i = 0; i < sizeof(from) / sizeof(from[0]); i++) {
		struct gms_fsm f = in_state(from[i], from[i] == GMS_RO ? 1 : 0);
		bool ok = gms_fsm_demoted(&f);
		assert_int_equal(ok, from[i] == GMS_COMMITTED);
		assert_int_equal(f.state, from[i] == GMS_COMMITTED ? GMS_EMPTY : from[i]);
	}
	struct gms_fsm f = in_state(GMS_COMMITTED, 0);
	assert_true(gms_fsm_demoted(&f));
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RO, false), GMS_WAIT);
	assert_true(gms_fsm_restored(&f));
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RO, false), GMS_GRANT_RO);
}

/* Which states make an RW request a drop of the committed layout: there a
 * fenced GMS makes it prove its grant before it may hold readers back. */
static void test_rw_would_drop(void **state)
{
	(void)state;
	struct gms_fsm f = in_state(GMS_EMPTY, 0);
	assert_false(gms_fsm_rw_would_drop(&f));
	f = in_state(GMS_RW, 0);
	assert_false(gms_fsm_rw_would_drop(&f));
	f = in_state(GMS_COMMITTED, 0);
	assert_true(gms_fsm_rw_would_drop(&f));
	f = in_state(GMS_RO, 2);
	assert_true(gms_fsm_rw_would_drop(&f));
	/* The same as what decide() answers an RW: a drop now or once the readers leave. */
	f = in_state(GMS_COMMITTED, 0);
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RW, false), GMS_GRANT_RW_DROP);
	f = in_state(GMS_RO, 1);
	gms_fsm_reader_left(&f);
	assert_int_equal(gms_fsm_decide(&f, GMS_MODE_RW, false), GMS_GRANT_RW_DROP);
}

static void test_names(void **state)
{
	(void)state;
	assert_string_equal(gms_state_name(GMS_COMMITTED), "COMMITTED");
	assert_string_equal(gms_mode_name(GMS_MODE_RW_OR_RO), "RW_OR_RO");
	assert_string_equal(gms_mode_name(9), "?");
}

/* The layout hash covers structure: sizes, order, keys, offsets, values. */
static void test_layout_hash(void **state)
{
	(void)state;
	uint64_t sizes[2] = {4096, 8192};
	struct gms_layout_meta m[2] = {{"a", 0, 16, "x", 1}, {"b", 1, 0, "yz", 2}};
	uint8_t h0[16], h[16];
	assert_int_equal(gms_layout_hash(sizes, 2, m, 2, h0), 0);
	assert_int_equal(gms_layout_hash(sizes, 2, m, 2, h), 0);
	assert_memory_equal(h0, h, 16);
	uint64_t swapped[2] = {8192, 4096};
	assert_int_equal(gms_layout_hash(swapped, 2, m, 2, h), 0);
	assert_memory_not_equal(h0, h, 16);
	struct gms_layout_meta m2[2] = {m[0], m[1]};
	m2[1].offset = 8;
	gms_layout_hash(sizes, 2, m2, 2, h);
	assert_memory_not_equal(h0, h, 16);
	m2[1] = m[1];
	m2[1].value = "yy";
	gms_layout_hash(sizes, 2, m2, 2, h);
	assert_memory_not_equal(h0, h, 16);
	m2[1] = m[1];
	m2[1].key = "c";
	gms_layout_hash(sizes, 2, m2, 2, h);
	assert_memory_not_equal(h0, h, 16);
	gms_layout_hash(sizes, 2, m, 1, h);
	assert_memory_not_equal(h0, h, 16);
	/* key/value boundaries cannot shift: "ab"+"" vs "a"+"b" */
	struct gms_layout_meta p[1] = {{"ab", 0, 0, "", 0}}, q[1] = {{"a", 0, 0, "b", 1}};
	uint8_t hp[16], hq[16];
	gms_layout_hash(sizes, 1, p, 1, hp);
	gms_layout_hash(sizes, 1, q, 1, hq);
	assert_memory_not_equal(hp, hq, 16);
}

/* A wait by progress ends its timeout after the later of its start and the writer's last event. */
static void test_progress_deadline(void **state)
{
	(void)state;
	assert_int_equal(gms_progress_deadline(100, 50, 0), 150);     /* no writer since before the wait */
	assert_int_equal(gms_progress_deadline(100, 50, 100), 150);
	assert_int_equal(gms_progress_deadline(100, 50, 140), 190);   /* progress moves it */
	assert_int_equal(gms_progress_deadline(100, 0, 140), 140);
	assert_true(gms_progress_deadline(100, -1, 140) == INT64_MAX); /* forever */
	assert_true(gms_progress_deadline(INT64_MAX - 10, 50, 0) == INT64_MAX); /* no overflow */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decide_table), cmocka_unit_test(test_apply),
		cmocka_unit_test(test_transitions),  cmocka_unit_test(test_lifecycle),
		cmocka_unit_test(test_names),        cmocka_unit_test(test_layout_hash),
		cmocka_unit_test(test_restored),
		cmocka_unit_test(test_demoted),
		cmocka_unit_test(test_rw_would_drop),
		cmocka_unit_test(test_progress_deadline),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
