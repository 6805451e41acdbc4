/* SPDX-License-Identifier: Apache-2.0 */
/* Tier choice, demotion policy and operation phases (pure module): every rule and every transition. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../common/testutil.h"

#include "tiers.h"

static void test_restore_source(void **state)
{
	(void)state;
	struct {
		bool hot, warm, cold;
		enum tier want;
	} t[] = {
		{ true, true, true, TIER_HOT },       { false, true, true, TIER_WARM },
		{ false, true, false, TIER_WARM },    { false, false, true, TIER_COLD },
		{ false, false, false, TIER_LOADER }, { true, false, false, TIER_HOT },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct tier_view v = { .hot = t[i].hot, .warm = t[i].warm, .cold = t[i].cold };
		if (tier_restore_source(&v) != t[i].want)
			fail_msg("row %zu: got %s want %s", i, tier_name(tier_restore_source(&v)),
				 tier_name(t[i].want));
	}
	assert_string_equal(tier_name(TIER_LOADER), "loader");
	assert_string_equal(tier_name((enum tier)9), "unknown");
}

static void test_demote(void **state)
{
	(void)state;
	const int64_t min = 60000000; /* 60 s */
	struct {
		enum tier at;
		bool pinned, pressure;
		int64_t resident;
		bool warm_room, cold_room;
		enum tier want;
		const char *why;
	} t[] = {
		{ TIER_HOT, false, true, min, true, true, TIER_WARM, "hot to warm" },
		{ TIER_HOT, false, true, min - 1, true, true, TIER_HOT, "min_resident" }, /* hysteresis */
		{ TIER_HOT, true, true, 10 * min, true, true, TIER_HOT, "pinned" },
		{ TIER_HOT, false, false, 10 * min, true, true, TIER_HOT, "no pressure" },
		{ TIER_HOT, false, true, min, false, true, TIER_COLD, "no room in warm" },
		{ TIER_HOT, false, true, min, false, false, TIER_HOT, "no room" },
		{ TIER_WARM, false, true, min, true, true, TIER_COLD, "warm to cold" },
		{ TIER_WARM, false, true, min, true, false, TIER_WARM, "no room" },
		{ TIER_WARM, true, true, min, true, true, TIER_WARM, "pinned" },
		{ TIER_WARM, false, true, 0, true, true, TIER_WARM, "min_resident" },
		{ TIER_COLD, false, true, 10 * min, true, true, TIER_COLD, "last tier" },
		{ TIER_LOADER, false, true, 10 * min, true, true, TIER_LOADER, "nothing" },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct tiers_demote_in in = { .at = t[i].at, .pinned = t[i].pinned, .pressure = t[i].pressure,
					    .resident_us = t[i].resident, .min_resident_us = min,
					    .warm_room = t[i].warm_room, .cold_room = t[i].cold_room };
		struct tiers_demote_out out;
		tier_demote(&in, &out);
		if (out.to != t[i].want || !strstr(out.reason, t[i].why))
			fail_msg("row %zu: got %s (%s), want %s (%s)", i, tier_name(out.to), out.reason,
				 tier_name(t[i].want), t[i].why);
	}
}

/* The server's plan around the policy: refusals with their error, snapshot first, or drop. */
static void test_demote_plan(void **state)
{
	(void)state;
	const int64_t min = 10000000;
	const struct tiers_demote_facts base = {
		.committed = true, .pressure = true, .resident_us = min, .min_resident_us = min, .want = TIER_HOT,
		.warm_kept = true, .cold_kept = true, .warm_room = true, .cold_room = true,
	};
	struct {
		struct tiers_demote_facts f;
		enum tiers_demote_step step;
		enum tier to;
		int err;
		const char *why;
	} t[] = {
		{ base, TIERS_DEMOTE_SNAPSHOT, TIER_WARM, 0, "hot to warm" },
		{ base, TIERS_DEMOTE_SNAPSHOT, TIER_WARM, 0, "" },
		{ base, TIERS_DEMOTE_DROP, TIER_WARM, 0, "hot to warm" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_STATE, "no committed layout" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_STATE, "pinned" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_STATE, "min_resident not reached" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_STATE, "no pressure" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_BUSY, "holds the RO or RW lock" },
		{ base, TIERS_DEMOTE_DROP, TIER_COLD, 0, "no room in warm: hot to cold" },
		{ base, TIERS_DEMOTE_SNAPSHOT, TIER_COLD, 0, "hot to cold" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_INVALID_ARG, "no WARM tier kept" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_INVALID_ARG, "no COLD tier kept" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_STATE, "no room in a lower tier" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_STATE, "min_resident not reached" },
		{ base, TIERS_DEMOTE_STAY, TIER_HOT, GF_ERR_INVALID_ARG, "warm or cold" },
	};
	t[1].f.cold_current = true;                      /* only WARM counts for hot to warm */
	t[2].f.warm_current = true;
	t[3].f.committed = false;
	t[4].f.pinned = true;
	t[5].f.resident_us = min - 1;                    /* hysteresis, even when asked */
	t[6].f.pressure = false;
	t[7].f.holders = 1;
	t[8].f.want = TIER_COLD;                     /* asked by name: WARM is no candidate */
	t[8].f.cold_current = true;
	t[8].f.warm_current = true;
	t[9].f.warm_room = false;                        /* WARM's file system is too small */
	t[10].f.want = TIER_WARM;
	t[10].f.warm_kept = false;
	t[11].f.want = TIER_COLD;
	t[11].f.cold_kept = false;
	t[12].f.want = TIER_WARM;                    /* asked by name: no fallback to COLD */
	t[12].f.warm_room = false;
	t[13].f.holders = 2;                             /* the policy's refusal comes first */
	t[13].f.resident_us = 0;
	t[14].f.want = TIER_LOADER;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct tiers_demote_plan p;
		tiers_demote_plan(&t[i].f, &p);
		if (p.step != t[i].step || p.to != t[i].to || p.err != t[i].err || !strstr(p.reason, t[i].why))
			fail_msg("row %zu: got step %d to %s err %d (%s)", i, (int)p.step, tier_name(p.to), p.err,
				 p.reason);
	}
}

/* Every (kind, from, to) step: only the documented ones are accepted. */
/* Where a snapshot goes as WARM fills up: evict its older snapshot when that makes room, else spill to COLD. */
static void test_place(void **state)
{
	(void)state;
	const uint64_t M = 1 << 20;
	struct tiers_place_out o;
	struct tiers_place_in in = { .bytes = 32 * M, .warm_kept = true, .cold_kept = true, .warm_free = 40 * M };
	tier_place(&in, &o);
	assert_true(o.write_warm && o.write_cold && !o.evict_warm);
	assert_string_equal(o.reason, "warm has room");
	/* Full with an older snapshot whose space makes room: it goes first. */
	in = (struct tiers_place_in){ .bytes = 32 * M, .warm_kept = true, .cold_kept = true, .warm_free = 8 * M,
				    .warm_other = true, .warm_other_bytes = 32 * M };
	tier_place(&in, &o);
	assert_true(o.evict_warm && o.write_warm && o.write_cold);
	assert_non_null(strstr(o.reason, "evicted to make room"));
	/* Not even then: spill to COLD, and the stale WARM snapshot goes all the same. */
	in.bytes = 48 * M;
	tier_place(&in, &o);
	assert_true(o.evict_warm && !o.write_warm && o.write_cold);
	assert_non_null(strstr(o.reason, "spilled to cold"));
	in.cold_kept = false;
	tier_place(&in, &o);
	assert_true(o.evict_warm && !o.write_warm && !o.write_cold);
	assert_non_null(strstr(o.reason, "no cold tier"));
	/* Full, but it already holds this layout: kept as it is, nothing evicted. */
	in = (struct tiers_place_in){ .bytes = 32 * M, .warm_kept = true, .cold_kept = true, .warm_free = 8 * M,
				    .warm_current = true, .warm_other_bytes = 32 * M };
	tier_place(&in, &o);
	assert_true(!o.evict_warm && !o.write_warm && o.write_cold);
	/* Empty WARM too small, nothing to evict: spill. */
	in = (struct tiers_place_in){ .bytes = 32 * M, .warm_kept = true, .cold_kept = true, .warm_free = 8 * M };
	tier_place(&in, &o);
	assert_true(!o.evict_warm && !o.write_warm && o.write_cold);
	/* No WARM kept: COLD only. */
	in = (struct tiers_place_in){ .bytes = 32 * M, .cold_kept = true };
	tier_place(&in, &o);
	assert_true(!o.write_warm && o.write_cold);
}

static void test_phases(void **state)
{
	(void)state;
	for (int kind = TIERS_OP_SNAPSHOT; kind <= TIERS_OP_RESTORE; kind++) {
		enum tiers_phase working = kind == TIERS_OP_SNAPSHOT ? TIERS_PHASE_CHECKPOINTING : TIERS_PHASE_RESTORING;
		enum tiers_phase done = kind == TIERS_OP_SNAPSHOT ? TIERS_PHASE_CHECKPOINTED : TIERS_PHASE_RESTORED;
		for (int from = TIERS_PHASE_PENDING; from <= TIERS_PHASE_FAILED; from++)
			for (int to = TIERS_PHASE_NONE; to <= TIERS_PHASE_FAILED; to++) {
				struct tiers_op op = { .kind = kind, .phase = from };
				bool want = (from == TIERS_PHASE_PENDING && to == (int)working) ||
					    (from == (int)working && to == (int)done) ||
					    (!tiers_phase_final(from) && to == TIERS_PHASE_FAILED);
				bool got = tiers_op_step(&op, to, "why", 42);
				if (got != want)
					fail_msg("%s: %s -> %s: got %d want %d", tiers_op_name(kind), tiers_phase_name(from),
						 tiers_phase_name(to), got, want);
				assert_int_equal(op.phase, got ? to : from);
				if (got && tiers_phase_final(to)) {
					assert_int_equal(op.ended_us, 42);
					assert_string_equal(op.reason, "why");
				}
			}
	}
	struct tiers_op op = { 0 };
	assert_true(tiers_op_begin(&op, TIERS_OP_SNAPSHOT, 7));
	assert_int_equal(op.phase, TIERS_PHASE_PENDING);
	assert_int_equal(op.started_us, 7);
	assert_false(tiers_op_begin(&op, TIERS_OP_RESTORE, 8)); /* one operation at a time */
	assert_true(tiers_op_step(&op, TIERS_PHASE_CHECKPOINTING, NULL, 9));
	assert_false(tiers_op_begin(&op, TIERS_OP_SNAPSHOT, 9));
	assert_true(tiers_op_step(&op, TIERS_PHASE_FAILED, "no space left on device", 10));
	assert_string_equal(op.reason, "no space left on device");
	assert_true(tiers_op_begin(&op, TIERS_OP_RESTORE, 11));
	assert_int_equal(op.kind, TIERS_OP_RESTORE);
	assert_string_equal(op.reason, "");
	assert_false(tiers_op_begin(&op, 0, 12));
	assert_string_equal(tiers_phase_name(TIERS_PHASE_CHECKPOINTED), "Checkpointed");
	assert_string_equal(tiers_phase_name(TIERS_PHASE_RESTORING), "Restoring");
	assert_string_equal(tiers_phase_name((enum tiers_phase)99), "unknown");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restore_source),
		cmocka_unit_test(test_demote),
		cmocka_unit_test(test_demote_plan),
		cmocka_unit_test(test_place),
		cmocka_unit_test(test_phases),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
