/* SPDX-License-Identifier: Apache-2.0 */
/* The GMS client's sleep/wake state machine (pure module): every event from
 * every state, legal or not, every decision, and a few whole lives. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../common/testutil.h"

#include "client_fsm.h"
#include "gpufailover/gms.h"

static const uint8_t H[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const uint8_t H2[16] = {16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
#define NALLOCS 3

/* Every configuration a client can be in. */
enum cfg {
	C_CLOSED,
	C_RW,
	C_RO0,      /* RO, nothing mapped yet */
	C_RO,       /* RO, layout H mapped */
	C_SLEEP0_NL,/* asleep, nothing kept, no layout (a writer slept before commit) */
	C_SLEEP0,   /* asleep, nothing kept */
	C_SLEEP_S,  /* asleep on the kept session */
	C_SLEEP_H,  /* ... with kept handles */
	C_SLEEP_M,  /* ... kept mapped */
	C_WAKE_S,
	C_WAKE_H,
	C_WAKE_M,
	C_LOST_RW,
	C_LOST_RO0,
	C_LOST_RO,
	NCFG,
	X = -1, /* illegal: nothing changes */
};

static const struct {
	const char *name;
	enum gmsc_state state;
	enum gmsc_kept kept;
	bool layout;
	int lost_mode;
} cfgs[NCFG] = {
	[C_CLOSED] = {"CLOSED", GMSC_CLOSED, GMSC_KEPT_NOTHING, false, 0},
	[C_RW] = {"RW", GMSC_RW, GMSC_KEPT_NOTHING, false, 0},
	[C_RO0] = {"RO without layout", GMSC_RO, GMSC_KEPT_NOTHING, false, 0},
	[C_RO] = {"RO", GMSC_RO, GMSC_KEPT_NOTHING, true, 0},
	[C_SLEEP0_NL] = {"ASLEEP{nothing} without layout", GMSC_ASLEEP, GMSC_KEPT_NOTHING, false, 0},
	[C_SLEEP0] = {"ASLEEP{nothing}", GMSC_ASLEEP, GMSC_KEPT_NOTHING, true, 0},
	[C_SLEEP_S] = {"ASLEEP{session}", GMSC_ASLEEP, GMSC_KEPT_SESSION, true, 0},
	[C_SLEEP_H] = {"ASLEEP{handles}", GMSC_ASLEEP, GMSC_KEPT_HANDLES, true, 0},
	[C_SLEEP_M] = {"ASLEEP{mapped}", GMSC_ASLEEP, GMSC_KEPT_MAPPED, true, 0},
	[C_WAKE_S] = {"WAKING{session}", GMSC_WAKING, GMSC_KEPT_SESSION, true, 0},
	[C_WAKE_H] = {"WAKING{handles}", GMSC_WAKING, GMSC_KEPT_HANDLES, true, 0},
	[C_WAKE_M] = {"WAKING{mapped}", GMSC_WAKING, GMSC_KEPT_MAPPED, true, 0},
	[C_LOST_RW] = {"LOST (RW)", GMSC_LOST, GMSC_KEPT_NOTHING, false, GF_GMS_RW},
	[C_LOST_RO0] = {"LOST (RO without layout)", GMSC_LOST, GMSC_KEPT_NOTHING, false, GF_GMS_RO},
	[C_LOST_RO] = {"LOST (RO)", GMSC_LOST, GMSC_KEPT_NOTHING, true, GF_GMS_RO},
};

static struct gmsc_fsm in_cfg(int c)
{
	struct gmsc_fsm f;
	gmsc_fsm_init(&f);
	f.state = cfgs[c].state;
	f.kept = cfgs[c].kept;
	f.lost_mode = cfgs[c].lost_mode;
	if (cfgs[c].layout) {
		f.have_layout = true;
		memcpy(f.hash, H, 16);
		f.count = NALLOCS;
	}
	return f;
}

static bool is_cfg(const struct gmsc_fsm *f, int c)
{
	return f->state == cfgs[c].state && f->kept == cfgs[c].kept && f->have_layout == cfgs[c].layout &&
	       f->lost_mode == cfgs[c].lost_mode && (!f->have_layout || !memcmp(f->hash, H, 16));
}

static void expect_cfg(const struct gmsc_fsm *f, int from, int want, const char *event)
{
	if (!is_cfg(f, want))
		fail_msg("%s from %s: got state %s kept %s layout %d, want %s", event, cfgs[from].name,
			 gmsc_state_name(f->state), gmsc_kept_name(f->kept), f->have_layout, cfgs[want].name);
}

/* An event that returns bool: @want[c] is where it leads from c, X where it is illegal. */
typedef bool (*event_fn)(struct gmsc_fsm *f);

static void check_event(const char *name, event_fn ev, const int want[NCFG])
{
	for (int c = 0; c < NCFG; c++) {
		struct gmsc_fsm f = in_cfg(c);
		bool ok = ev(&f);
		if (ok != (want[c] != X))
			fail_msg("%s from %s: returned %d", name, cfgs[c].name, ok);
		expect_cfg(&f, c, want[c] == X ? c : want[c], name);
	}
}

static bool ev_granted_rw(struct gmsc_fsm *f) { return gmsc_fsm_granted(f, GF_GMS_RW); }
static bool ev_granted_ro(struct gmsc_fsm *f) { return gmsc_fsm_granted(f, GF_GMS_RO); }
static bool ev_granted_rw_or_ro(struct gmsc_fsm *f) { return gmsc_fsm_granted(f, GF_GMS_RW_OR_RO); }
static bool ev_granted_bad(struct gmsc_fsm *f) { return gmsc_fsm_granted(f, 7); }
static bool ev_committed(struct gmsc_fsm *f) { return gmsc_fsm_committed(f, H, NALLOCS); }
static bool ev_committed_null(struct gmsc_fsm *f) { return gmsc_fsm_committed(f, NULL, NALLOCS); }
static bool ev_mapped(struct gmsc_fsm *f) { return gmsc_fsm_layout_mapped(f, H, NALLOCS); }
static bool ev_slept_nothing(struct gmsc_fsm *f) { return gmsc_fsm_slept(f, GMSC_KEPT_NOTHING); }
static bool ev_slept_session(struct gmsc_fsm *f) { return gmsc_fsm_slept(f, GMSC_KEPT_SESSION); }
static bool ev_slept_handles(struct gmsc_fsm *f) { return gmsc_fsm_slept(f, GMSC_KEPT_HANDLES); }
static bool ev_slept_mapped(struct gmsc_fsm *f) { return gmsc_fsm_slept(f, GMSC_KEPT_MAPPED); }
static bool ev_slept_bad(struct gmsc_fsm *f) { return gmsc_fsm_slept(f, (enum gmsc_kept)9); }
static bool ev_wake_sent(struct gmsc_fsm *f) { return gmsc_fsm_wake_sent(f); }
static bool ev_dropped(struct gmsc_fsm *f) { return gmsc_fsm_dropped(f); }
static bool ev_released(struct gmsc_fsm *f) { return gmsc_fsm_released(f); }
static bool ev_lost(struct gmsc_fsm *f) { return gmsc_fsm_lost(f); }

static void test_connect_commit_map(void **state)
{
	(void)state;
	int none[NCFG];
	for (int c = 0; c < NCFG; c++)
		none[c] = X;
	int rw[NCFG], ro[NCFG], committed[NCFG], mapped[NCFG];
	memcpy(rw, none, sizeof(none));
	memcpy(ro, none, sizeof(none));
	memcpy(committed, none, sizeof(none));
	memcpy(mapped, none, sizeof(none));
	rw[C_CLOSED] = C_RW;
	ro[C_CLOSED] = C_RO0;
	committed[C_RW] = C_RO;
	mapped[C_RO0] = C_RO;
	check_event("granted(RW)", ev_granted_rw, rw);
	check_event("granted(RO)", ev_granted_ro, ro);
	/* The server grants RW or RO, never the request's RW_OR_RO. */
	check_event("granted(RW_OR_RO)", ev_granted_rw_or_ro, none);
	check_event("granted(7)", ev_granted_bad, none);
	check_event("committed", ev_committed, committed);
	check_event("committed(no hash)", ev_committed_null, none);
	check_event("layout_mapped", ev_mapped, mapped);
	/* A commit records the layout a wake must find again. */
	struct gmsc_fsm f = in_cfg(C_RW);
	assert_true(gmsc_fsm_committed(&f, H2, 5));
	assert_memory_equal(f.hash, H2, 16);
	assert_int_equal(f.count, 5);
}

static void test_sleep(void **state)
{
	(void)state;
	/* Closing: every lock holder; a writer's uncommitted layout is gone with it. */
	int nothing[NCFG] = {X, C_SLEEP0_NL, C_SLEEP0_NL, C_SLEEP0, X, X, X, X, X, X, X, X,
			     C_SLEEP0_NL, C_SLEEP0_NL, C_SLEEP0};
	/* Keeping anything: only a reader of a committed layout. */
	int session[NCFG], handles[NCFG], mapped[NCFG], bad[NCFG];
	for (int c = 0; c < NCFG; c++)
		session[c] = handles[c] = mapped[c] = bad[c] = X;
	session[C_RO] = C_SLEEP_S;
	handles[C_RO] = C_SLEEP_H;
	mapped[C_RO] = C_SLEEP_M;
	check_event("slept(nothing)", ev_slept_nothing, nothing);
	check_event("slept(session)", ev_slept_session, session);
	check_event("slept(handles)", ev_slept_handles, handles);
	check_event("slept(mapped)", ev_slept_mapped, mapped);
	check_event("slept(9)", ev_slept_bad, bad);
}

/* sleep_plan(): what a sleep tries to keep, from every state and setting. */
static void test_sleep_plan(void **state)
{
	(void)state;
	for (int c = 0; c < NCFG; c++) {
		struct gmsc_fsm f = in_cfg(c);
		for (int keep = 0; keep < 2; keep++)
			for (int fence = 0; fence < 2; fence++) {
				enum gmsc_kept want = GMSC_KEPT_NOTHING;
				if (c == C_RO)
					want = !keep ? GMSC_KEPT_SESSION : fence ? GMSC_KEPT_MAPPED : GMSC_KEPT_HANDLES;
				enum gmsc_kept got = gmsc_fsm_sleep_plan(&f, keep, fence);
				if (got != want)
					fail_msg("sleep_plan(keep %d, fence %d) in %s: %s, want %s", keep, fence,
						 cfgs[c].name, gmsc_kept_name(got), gmsc_kept_name(want));
			}
	}
}

/* wake_path(): the first step of a wake from every state. */
static void test_wake_path(void **state)
{
	(void)state;
	enum gmsc_wake want[NCFG] = {
		[C_CLOSED] = GMSC_WAKE_NOT_ASLEEP, [C_RW] = GMSC_WAKE_NOT_ASLEEP, [C_RO0] = GMSC_WAKE_NOT_ASLEEP,
		[C_RO] = GMSC_WAKE_NOT_ASLEEP,     [C_SLEEP0_NL] = GMSC_WAKE_NO_LAYOUT, [C_SLEEP0] = GMSC_WAKE_CONNECT,
		[C_SLEEP_S] = GMSC_WAKE_SEND,      [C_SLEEP_H] = GMSC_WAKE_SEND,      [C_SLEEP_M] = GMSC_WAKE_SEND,
		[C_WAKE_S] = GMSC_WAKE_READ,       [C_WAKE_H] = GMSC_WAKE_READ,       [C_WAKE_M] = GMSC_WAKE_READ,
		[C_LOST_RW] = GMSC_WAKE_NOT_ASLEEP, [C_LOST_RO0] = GMSC_WAKE_NOT_ASLEEP, [C_LOST_RO] = GMSC_WAKE_NOT_ASLEEP,
	};
	for (int c = 0; c < NCFG; c++) {
		struct gmsc_fsm f = in_cfg(c);
		if (gmsc_fsm_wake_path(&f) != want[c])
			fail_msg("wake_path in %s: %d, want %d", cfgs[c].name, gmsc_fsm_wake_path(&f), want[c]);
	}
	int sent[NCFG];
	for (int c = 0; c < NCFG; c++)
		sent[c] = X;
	sent[C_SLEEP_S] = C_WAKE_S;
	sent[C_SLEEP_H] = C_WAKE_H;
	sent[C_SLEEP_M] = C_WAKE_M;
	check_event("wake_sent", ev_wake_sent, sent);
}

/* woke(): the grant of a wake, every kind of grant from every state. */
static void test_woke(void **state)
{
	(void)state;
	struct {
		const char *name;
		int mode;
		const uint8_t *hash;
		bool valid;
		enum gmsc_path fresh, session, handles, mapped; /* from SLEEP0 (fresh connect), WAKE_S, WAKE_H, WAKE_M */
	} t[] = {
		{"same layout", GF_GMS_RO, H, false, GMSC_PATH_LIST, GMSC_PATH_LIST, GMSC_PATH_LIST, GMSC_PATH_LIST},
		{"same layout, handles valid", GF_GMS_RO, H, true, GMSC_PATH_BOGUS, GMSC_PATH_BOGUS, GMSC_PATH_MAP_KEPT,
		 GMSC_PATH_OPEN_IN_PLACE},
		{"another layout", GF_GMS_RO, H2, false, GMSC_PATH_STALE, GMSC_PATH_STALE, GMSC_PATH_STALE,
		 GMSC_PATH_STALE},
		{"another layout, handles valid", GF_GMS_RO, H2, true, GMSC_PATH_BOGUS, GMSC_PATH_BOGUS, GMSC_PATH_BOGUS,
		 GMSC_PATH_BOGUS},
		{"RW granted", GF_GMS_RW, H, false, GMSC_PATH_BOGUS, GMSC_PATH_BOGUS, GMSC_PATH_BOGUS, GMSC_PATH_BOGUS},
		{"no hash", GF_GMS_RO, NULL, false, GMSC_PATH_BOGUS, GMSC_PATH_BOGUS, GMSC_PATH_BOGUS, GMSC_PATH_BOGUS},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		for (int c = 0; c < NCFG; c++) {
			enum gmsc_path want = GMSC_PATH_ILLEGAL;
			if (c == C_SLEEP0)
				want = t[i].fresh;
			else if (c == C_WAKE_S)
				want = t[i].session;
			else if (c == C_WAKE_H)
				want = t[i].handles;
			else if (c == C_WAKE_M)
				want = t[i].mapped;
			struct gmsc_fsm f = in_cfg(c);
			enum gmsc_path got = gmsc_fsm_woke(&f, t[i].mode, t[i].hash, t[i].valid);
			if (got != want)
				fail_msg("woke(%s) from %s: %d, want %d", t[i].name, cfgs[c].name, got, want);
			/* A path goes to RO, a refusal closes everything, an illegal event changes nothing. */
			int to = want == GMSC_PATH_ILLEGAL ? c : want >= 0 ? C_RO : C_SLEEP0;
			expect_cfg(&f, c, to, t[i].name);
			assert_int_equal(f.in_place, want == GMSC_PATH_OPEN_IN_PLACE);
		}
	}
}

static void test_dropped_released_lost(void **state)
{
	(void)state;
	int dropped[NCFG] = {X, C_SLEEP0_NL, C_SLEEP0_NL, C_SLEEP0, C_SLEEP0_NL, C_SLEEP0, C_SLEEP0, C_SLEEP0,
			     C_SLEEP0, C_SLEEP0, C_SLEEP0, C_SLEEP0, C_SLEEP0_NL, C_SLEEP0_NL, C_SLEEP0};
	int released[NCFG], lost[NCFG];
	for (int c = 0; c < NCFG; c++)
		released[c] = lost[c] = X;
	released[C_SLEEP_H] = released[C_SLEEP_M] = C_SLEEP_S;
	lost[C_RW] = C_LOST_RW;
	lost[C_RO0] = C_LOST_RO0;
	lost[C_RO] = C_LOST_RO;
	check_event("dropped", ev_dropped, dropped);
	check_event("released", ev_released, released);
	/* Lost only while holding a lock, and once: a second loss reports nothing. */
	check_event("lost", ev_lost, lost);
}

/* hangup(): what the watcher does with a hangup, watched or not, from every state. */
static void test_hangup(void **state)
{
	(void)state;
	for (int watch = 0; watch < 2; watch++)
		for (int c = 0; c < NCFG; c++) {
			struct gmsc_fsm f = in_cfg(c);
			f.watch = watch;
			enum gmsc_hangup want = GMSC_HANGUP_IGNORE;
			int to = c;
			if (c == C_SLEEP_H || c == C_SLEEP_M) {
				want = GMSC_HANGUP_RELEASE;
				to = C_SLEEP_S;
			} else if (watch && (c == C_RW || c == C_RO0 || c == C_RO)) {
				want = GMSC_HANGUP_LOST;
				to = c == C_RW ? C_LOST_RW : c == C_RO0 ? C_LOST_RO0 : C_LOST_RO;
			}
			enum gmsc_hangup got = gmsc_fsm_hangup(&f);
			if (got != want)
				fail_msg("hangup (watch %d) in %s: %d, want %d", watch, cfgs[c].name, got, want);
			expect_cfg(&f, c, to, "hangup");
		}
}

static void test_queries(void **state)
{
	(void)state;
	int mode[NCFG] = {[C_RW] = GF_GMS_RW,     [C_RO0] = GF_GMS_RO,     [C_RO] = GF_GMS_RO,
			  [C_LOST_RW] = GF_GMS_RW, [C_LOST_RO0] = GF_GMS_RO, [C_LOST_RO] = GF_GMS_RO};
	for (int c = 0; c < NCFG; c++) {
		struct gmsc_fsm f = in_cfg(c);
		if (gmsc_fsm_mode(&f) != mode[c])
			fail_msg("mode in %s: %d, want %d", cfgs[c].name, gmsc_fsm_mode(&f), mode[c]);
		if (gmsc_fsm_mapped(&f) != (c == C_RO || c == C_LOST_RO))
			fail_msg("mapped in %s: %d", cfgs[c].name, gmsc_fsm_mapped(&f));
	}
	/* Stale is decided here only: another hash, or another count where the GMS lists one. */
	struct gmsc_fsm f = in_cfg(C_SLEEP_M);
	assert_true(gmsc_fsm_same_layout(&f, H, GMSC_COUNT_ANY));
	assert_true(gmsc_fsm_same_layout(&f, H, NALLOCS));
	assert_false(gmsc_fsm_same_layout(&f, H, NALLOCS + 1));
	assert_false(gmsc_fsm_same_layout(&f, H2, NALLOCS));
	assert_false(gmsc_fsm_same_layout(&f, H2, GMSC_COUNT_ANY));
	assert_false(gmsc_fsm_same_layout(&f, NULL, GMSC_COUNT_ANY));
	f = in_cfg(C_SLEEP0_NL);
	assert_false(gmsc_fsm_same_layout(&f, H, GMSC_COUNT_ANY)); /* nothing to be the same as */
	assert_string_equal(gmsc_state_name(GMSC_WAKING), "WAKING");
	assert_string_equal(gmsc_state_name((enum gmsc_state)42), "?");
	assert_string_equal(gmsc_kept_name(GMSC_KEPT_MAPPED), "mapped");
	assert_string_equal(gmsc_kept_name((enum gmsc_kept)42), "?");
}

/* A reader's life: load nothing, map, sleep keeping mappings, wake in place; then a wake into a changed layout. */
static void test_reader_life(void **state)
{
	(void)state;
	struct gmsc_fsm f;
	gmsc_fsm_init(&f);
	assert_int_equal(f.state, GMSC_CLOSED);
	assert_true(gmsc_fsm_granted(&f, GF_GMS_RO));
	assert_int_equal(gmsc_fsm_sleep_plan(&f, true, true), GMSC_KEPT_NOTHING); /* nothing mapped yet */
	assert_true(gmsc_fsm_layout_mapped(&f, H, NALLOCS));
	f.watch = true;
	assert_int_equal(gmsc_fsm_sleep_plan(&f, true, true), GMSC_KEPT_MAPPED);
	assert_true(gmsc_fsm_slept(&f, GMSC_KEPT_MAPPED));
	assert_int_equal(gmsc_fsm_wake_path(&f), GMSC_WAKE_SEND);
	assert_true(gmsc_fsm_wake_sent(&f));
	assert_int_equal(gmsc_fsm_hangup(&f), GMSC_HANGUP_IGNORE); /* the wake owns the handles now */
	assert_int_equal(gmsc_fsm_woke(&f, GF_GMS_RO, H, true), GMSC_PATH_OPEN_IN_PLACE);
	assert_true(f.in_place);
	assert_true(f.watch); /* kept across the sleep */
	assert_true(gmsc_fsm_mapped(&f));

	/* Asleep again with handles; the GMS drops the layout: the watcher releases them. */
	assert_true(gmsc_fsm_slept(&f, GMSC_KEPT_HANDLES));
	assert_false(f.in_place);
	assert_int_equal(gmsc_fsm_hangup(&f), GMSC_HANGUP_RELEASE);
	assert_int_equal(f.kept, GMSC_KEPT_SESSION);
	/* The wake finds the session gone and connects afresh, into another layout: stale. */
	assert_true(gmsc_fsm_wake_sent(&f));
	assert_true(gmsc_fsm_dropped(&f));
	assert_int_equal(gmsc_fsm_wake_path(&f), GMSC_WAKE_CONNECT);
	assert_int_equal(gmsc_fsm_woke(&f, GF_GMS_RO, H2, false), GMSC_PATH_STALE);
	assert_int_equal(f.state, GMSC_ASLEEP);
	assert_int_equal(gmsc_fsm_wake_path(&f), GMSC_WAKE_CONNECT); /* may be retried */
	assert_true(gmsc_fsm_same_layout(&f, H, NALLOCS));            /* still the layout it mapped */

	/* Awake and watched, the GMS dies: lost once, then asleep to connect afresh. */
	assert_int_equal(gmsc_fsm_woke(&f, GF_GMS_RO, H, false), GMSC_PATH_LIST);
	assert_int_equal(gmsc_fsm_hangup(&f), GMSC_HANGUP_LOST);
	assert_false(gmsc_fsm_lost(&f));
	assert_int_equal(gmsc_fsm_mode(&f), GF_GMS_RO);
	assert_int_equal(gmsc_fsm_sleep_plan(&f, true, true), GMSC_KEPT_NOTHING);
	assert_true(gmsc_fsm_slept(&f, GMSC_KEPT_NOTHING));
	assert_int_equal(gmsc_fsm_wake_path(&f), GMSC_WAKE_CONNECT);
}

/* A writer's life: a sleep before commit leaves nothing to wake into; after commit it sleeps as a reader. */
static void test_writer_life(void **state)
{
	(void)state;
	struct gmsc_fsm f;
	gmsc_fsm_init(&f);
	assert_true(gmsc_fsm_granted(&f, GF_GMS_RW));
	assert_int_equal(gmsc_fsm_mode(&f), GF_GMS_RW);
	assert_int_equal(gmsc_fsm_sleep_plan(&f, true, true), GMSC_KEPT_NOTHING);
	assert_true(gmsc_fsm_slept(&f, GMSC_KEPT_NOTHING));
	assert_int_equal(gmsc_fsm_wake_path(&f), GMSC_WAKE_NO_LAYOUT);

	gmsc_fsm_init(&f);
	assert_true(gmsc_fsm_granted(&f, GF_GMS_RW));
	assert_true(gmsc_fsm_committed(&f, H, NALLOCS));
	assert_int_equal(gmsc_fsm_mode(&f), GF_GMS_RO);
	assert_false(gmsc_fsm_layout_mapped(&f, H, NALLOCS)); /* the writer's mappings are the layout's */
	assert_int_equal(gmsc_fsm_sleep_plan(&f, false, true), GMSC_KEPT_SESSION);
	assert_true(gmsc_fsm_slept(&f, GMSC_KEPT_SESSION));
	assert_true(gmsc_fsm_wake_sent(&f));
	assert_int_equal(gmsc_fsm_woke(&f, GF_GMS_RO, H, false), GMSC_PATH_LIST);
	assert_int_equal(gmsc_fsm_mode(&f), GF_GMS_RO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_connect_commit_map),
		cmocka_unit_test(test_sleep),
		cmocka_unit_test(test_sleep_plan),
		cmocka_unit_test(test_wake_path),
		cmocka_unit_test(test_woke),
		cmocka_unit_test(test_dropped_released_lost),
		cmocka_unit_test(test_hangup),
		cmocka_unit_test(test_queries),
		cmocka_unit_test(test_reader_life),
		cmocka_unit_test(test_writer_life),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
