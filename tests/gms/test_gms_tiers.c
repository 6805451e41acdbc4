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
		enum gms_tier want;
	} t[] = {
		{ true, true, true, GMS_TIER_HOT },       { false, true, true, GMS_TIER_WARM },
		{ false, true, false, GMS_TIER_WARM },    { false, false, true, GMS_TIER_COLD },
		{ false, false, false, GMS_TIER_LOADER }, { true, false, false, GMS_TIER_HOT },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct gms_tier_view v = { .hot = t[i].hot, .warm = t[i].warm, .cold = t[i].cold };
		if (gms_tier_restore_source(&v) != t[i].want)
			fail_msg("row %zu: got %s want %s", i, gms_tier_name(gms_tier_restore_source(&v)),
				 gms_tier_name(t[i].want));
	}
	assert_string_equal(gms_tier_name(GMS_TIER_LOADER), "loader");
	assert_string_equal(gms_tier_name((enum gms_tier)9), "unknown");
}

static void test_demote(void **state)
{
	(void)state;
	const int64_t min = 60000000; /* 60 s */
	struct {
		enum gms_tier at;
		bool pinned, pressure;
		int64_t resident;
		bool warm_room, cold_room;
		enum gms_tier want;
		const char *why;
	} t[] = {
		{ GMS_TIER_HOT, false, true, min, true, true, GMS_TIER_WARM, "hot to warm" },
		{ GMS_TIER_HOT, false, true, min - 1, true, true, GMS_TIER_HOT, "min_resident" }, /* hysteresis */
		{ GMS_TIER_HOT, true, true, 10 * min, true, true, GMS_TIER_HOT, "pinned" },
		{ GMS_TIER_HOT, false, false, 10 * min, true, true, GMS_TIER_HOT, "no pressure" },
		{ GMS_TIER_HOT, false, true, min, false, true, GMS_TIER_COLD, "no room in warm" },
		{ GMS_TIER_HOT, false, true, min, false, false, GMS_TIER_HOT, "no room" },
		{ GMS_TIER_WARM, false, true, min, true, true, GMS_TIER_COLD, "warm to cold" },
		{ GMS_TIER_WARM, false, true, min, true, false, GMS_TIER_WARM, "no room" },
		{ GMS_TIER_WARM, true, true, min, true, true, GMS_TIER_WARM, "pinned" },
		{ GMS_TIER_WARM, false, true, 0, true, true, GMS_TIER_WARM, "min_resident" },
		{ GMS_TIER_COLD, false, true, 10 * min, true, true, GMS_TIER_COLD, "last tier" },
		{ GMS_TIER_LOADER, false, true, 10 * min, true, true, GMS_TIER_LOADER, "nothing" },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct gms_demote_in in = { .at = t[i].at, .pinned = t[i].pinned, .pressure = t[i].pressure,
					    .resident_us = t[i].resident, .min_resident_us = min,
					    .warm_room = t[i].warm_room, .cold_room = t[i].cold_room };
		struct gms_demote_out out;
		gms_tier_demote(&in, &out);
		if (out.to != t[i].want || !strstr(out.reason, t[i].why))
			fail_msg("row %zu: got %s (%s), want %s (%s)", i, gms_tier_name(out.to), out.reason,
				 gms_tier_name(t[i].want), t[i].why);
	}
}

/* The server's plan around the policy: refusals with their error, snapshot first, or drop. */
static void test_demote_plan(void **state)
{
	(void)state;
	const int64_t min = 10000000;
	const struct gms_demote_facts base = {
		.committed = true, .pressure = true, .resident_us = min, .min_resident_us = min, .want = GMS_TIER_HOT,
		.warm_kept = true, .cold_kept = true, .warm_room = true, .cold_room = true,
	};
	struct {
		struct gms_demote_facts f;
		enum gms_demote_step step;
		enum gms_tier to;
		int err;
		const char *why;
	} t[] = {
		{ base, GMS_DEMOTE_SNAPSHOT, GMS_TIER_WARM, 0, "hot to warm" },
		{ base, GMS_DEMOTE_SNAPSHOT, GMS_TIER_WARM, 0, "" },
		{ base, GMS_DEMOTE_DROP, GMS_TIER_WARM, 0, "hot to warm" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_STATE, "no committed layout" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_STATE, "pinned" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_STATE, "min_resident not reached" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_STATE, "no pressure" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_BUSY, "holds the RO or RW lock" },
		{ base, GMS_DEMOTE_DROP, GMS_TIER_COLD, 0, "no room in warm: hot to cold" },
		{ base, GMS_DEMOTE_SNAPSHOT, GMS_TIER_COLD, 0, "hot to cold" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_INVALID_ARG, "no WARM tier kept" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_INVALID_ARG, "no COLD tier kept" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_STATE, "no room in a lower tier" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_STATE, "min_resident not reached" },
		{ base, GMS_DEMOTE_STAY, GMS_TIER_HOT, GF_ERR_INVALID_ARG, "warm or cold" },
	};
	t[1].f.cold_current = true;                      /* only WARM counts for hot to warm */
	t[2].f.warm_current = true;
	t[3].f.committed = false;
	t[4].f.pinned = true;
	t[5].f.resident_us = min - 1;                    /* hysteresis, even when asked */
	t[6].f.pressure = false;
	t[7].f.holders = 1;
	t[8].f.want = GMS_TIER_COLD;                     /* asked by name: WARM is no candidate */
	t[8].f.cold_current = true;
	t[8].f.warm_current = true;
	t[9].f.warm_room = false;                        /* WARM's file system is too small */
	t[10].f.want = GMS_TIER_WARM;
	t[10].f.warm_kept = false;
	t[11].f.want = GMS_TIER_COLD;
	t[11].f.cold_kept = false;
	t[12].f.want = GMS_TIER_WARM;                    /* asked by name: no fallback to COLD */
	t[12].f.warm_room = false;
	t[13].f.holders = 2;                             /* the policy's refusal comes first */
	t[13].f.resident_us = 0;
	t[14].f.want = GMS_TIER_LOADER;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct gms_demote_plan p;
		gms_demote_plan(&t[i].f, &p);
		if (p.step != t[i].step || p.to != t[i].to || p.err != t[i].err || !strstr(p.reason, t[i].why))
			fail_msg("row %zu: got step %d to %s err %d (%s)", i, (int)p.step, gms_tier_name(p.to), p.err,
				 p.reason);
	}
}

/* Every (kind, from, to) step: only the documented ones are accepted. */
/* Where a snapshot goes as WARM fills up: evict its older snapshot when that makes room, else spill to COLD. */
static void test_place(void **state)
{
	(void)state;
	const uint64_t M = 1 << 20;
	struct gms_place_out o;
	struct gms_place_in in = { .bytes = 32 * M, .warm_kept = true, .cold_kept = true, .warm_free = 40 * M };
	gms_tier_place(&in, &o);
	assert_true(o.write_warm && o.write_cold && !o.evict_warm);
	assert_string_equal(o.reason, "warm has room");
	/* Full with an older snapshot whose space makes room: it goes first. */
	in = (struct gms_place_in){ .bytes = 32 * M, .warm_kept = true, .cold_kept = true, .warm_free = 8 * M,
				    .warm_other = true, .warm_other_bytes = 32 * M };
	gms_tier_place(&in, &o);
	assert_true(o.evict_warm && o.write_warm && o.write_cold);
	assert_non_null(strstr(o.reason, "evicted to make room"));
	/* Not even then: spill to COLD, and the stale WARM snapshot goes all the same. */
	in.bytes = 48 * M;
	gms_tier_place(&in, &o);
	assert_true(o.evict_warm && !o.write_warm && o.write_cold);
	assert_non_null(strstr(o.reason, "spilled to cold"));
	in.cold_kept = false;
	gms_tier_place(&in, &o);
	assert_true(o.evict_warm && !o.write_warm && !o.write_cold);
	assert_non_null(strstr(o.reason, "no cold tier"));
	/* Full, but it already holds this layout: kept as it is, nothing evicted. */
	in = (struct gms_place_in){ .bytes = 32 * M, .warm_kept = true, .cold_kept = true, .warm_free = 8 * M,
				    .warm_current = true, .warm_other_bytes = 32 * M };
	gms_tier_place(&in, &o);
	assert_true(!o.evict_warm && !o.write_warm && o.write_cold);
	/* Empty WARM too small, nothing to evict: spill. */
	in = (struct gms_place_in){ .bytes = 32 * M, .warm_kept = true, .cold_kept = true, .warm_free = 8 * M };
	gms_tier_place(&in, &o);
	assert_true(!o.evict_warm && !o.write_warm && o.write_cold);
	/* No WARM kept: COLD only. */
	in = (struct gms_place_in){ .bytes = 32 * M, .cold_kept = true };
	gms_tier_place(&in, &o);
	assert_true(!o.write_warm && o.write_cold);
}

static void test_phases(void **state)
{
	(void)state;
	for (int kind = GMS_OP_SNAPSHOT; kind <= GMS_OP_RESTORE; kind++) {
		enum gms_phase working = kind == GMS_OP_SNAPSHOT ? GMS_PHASE_CHECKPOINTING : GMS_PHASE_RESTORING;
		enum gms_phase done = kind == GMS_OP_SNAPSHOT ? GMS_PHASE_CHECKPOINTED : GMS_PHASE_RESTORED;
		for (int from = GMS_PHASE_PENDING; from <= GMS_PHASE_FAILED; from++)
			for (int to = GMS_PHASE_NONE; to <= GMS_PHASE_FAILED; to++) {
				struct gms_op op = { .kind = kind, .phase = from };
				bool want = (from == GMS_PHASE_PENDING && to == (int)working) ||
					    (from == (int)working && to == (int)done) ||
					    (!gms_phase_final(from) && to == GMS_PHASE_FAILED);
				bool got = gms_op_step(&op, to, "why", 42);
				if (got != want)
					fail_msg("%s: %s -> %s: got %d want %d", gms_op_name(kind), gms_phase_name(from),
						 gms_phase_name(to), got, want);
				assert_int_equal(op.phase, got ? to : from);
				if (got && gms_phase_final(to)) {
					assert_int_equal(op.ended_us, 42);
					assert_string_equal(op.reason, "why");
				}
			}
	}
	struct gms_op op = { 0 };
	assert_true(gms_op_begin(&op, GMS_OP_SNAPSHOT, 7));
	assert_int_equal(op.phase, GMS_PHASE_PENDING);
	assert_int_equal(op.started_us, 7);
	assert_false(gms_op_begin(&op, GMS_OP_RESTORE, 8)); /* one operation at a time */
	assert_true(gms_op_step(&op, GMS_PHASE_CHECKPOINTING, NULL, 9));
	assert_false(gms_op_begin(&op, GMS_OP_SNAPSHOT, 9));
	assert_true(gms_op_step(&op, GMS_PHASE_FAILED, "no space left on device", 10));
	assert_string_equal(op.reason, "no space left on device");
	assert_true(gms_op_begin(&op, GMS_OP_RESTORE, 11));
	assert_int_equal(op.kind, GMS_OP_RESTORE);
	assert_string_equal(op.reason, "");
	assert_false(gms_op_begin(&op, 0, 12));
	assert_string_equal(gms_phase_name(GMS_PHASE_CHECKPOINTED), "Checkpointed");
	assert_string_equal(gms_phase_name(GMS_PHASE_RESTORING), "Restoring");
	assert_string_equal(gms_phase_name((enum gms_phase)99), "unknown");
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
