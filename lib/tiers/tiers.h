/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Residency tiers and operation phases as pure decisions (no I/O), like
 * fsm.c: residency.c (for the GMS) and tierd.c (the tier worker) feed their
 * facts in and act on the answer. See docs/tiers.md.
 *
 * Tiers, best first, modelled on NDIF's candidate levels (a lower level is a
 * cheaper way to have the weights in the GMS):
 *   HOT    the layout is committed in the GMS
 *   WARM   a snapshot in host memory that outlives the GMS process (tmpfs)
 *   COLD   a snapshot on disk
 *   LOADER nothing usable: wait for an engine to load from the model files
 */
#ifndef GF_TIERS_TIERS_H
#define GF_TIERS_TIERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpufailover/base.h"

enum tier { TIER_HOT = 0, TIER_WARM = 1, TIER_COLD = 2, TIER_LOADER = 3 };

/* "hot", "warm", "cold", "loader" ("unknown" otherwise). */
const char *tier_name(enum tier t);

/* What is present, as checked by tiers_snapshot_open() (present = a snapshot
 * whose manifest and data size check out, compatible with this device). */
struct tier_view {
	bool hot;
	bool warm;
	bool cold;
};

/* Where a GMS starting EMPTY restores from: the best present tier below HOT
 * (WARM before COLD), else TIER_LOADER. A HOT layout needs no restore:
 * the answer is then TIER_HOT. */
enum tier tier_restore_source(const struct tier_view *v);

/* One demotion question: should the weights at tier @at move down? */
struct tiers_demote_in {
	enum tier at;        /* where they are now (HOT, WARM or COLD) */
	bool pinned;             /* never demoted while pinned */
	bool pressure;           /* the tier above needs the room (eviction requested) */
	int64_t resident_us;     /* how long they have been at @at */
	int64_t min_resident_us; /* anti-thrash hysteresis: no demotion before this */
	bool warm_room;          /* the WARM tier can take them */
	bool cold_room;          /* the COLD tier can take them */
};

struct tiers_demote_out {
	enum tier to;   /* == in->at when they stay */
	const char *reason; /* static text: why they move or stay */
};

/*
 * Decide a demotion: stay when pinned, without pressure, or before
 * min_resident; else move one step down to the first tier below with room
 * (HOT → WARM, or COLD when WARM has none; WARM → COLD); stay when no tier
 * below has room. COLD is the last tier that holds bytes: it stays.
 */
void tier_demote(const struct tiers_demote_in *in, struct tiers_demote_out *out);

/*
 * What a GMS does about one demotion question for its HOT layout, around
 * tier_demote(): the facts the server has, the step it takes next.
 */
struct tiers_demote_facts {
	bool committed;          /* a layout is HOT (COMMITTED or RO) */
	unsigned holders;        /* connections holding the RO or RW lock (a snapshot job is not one) */
	bool pinned;
	bool pressure;           /* an explicit request, or free memory below the threshold */
	int64_t resident_us, min_resident_us;
	enum tier want;      /* TIER_WARM or TIER_COLD as asked, TIER_HOT: the policy chooses */
	bool warm_kept, cold_kept;   /* the tier's directory is configured */
	bool warm_room, cold_room;   /* its file system can take the layout (or already holds it) */
	bool warm_current, cold_current; /* it holds a snapshot of exactly this layout (generation and hash) */
};

enum tiers_demote_step {
	TIERS_DEMOTE_STAY = 0,     /* nothing to do now: @reason (and @err for a request) says why */
	TIERS_DEMOTE_SNAPSHOT = 1, /* write the layout to @to first, then ask again */
	TIERS_DEMOTE_DROP = 2,     /* @to holds this layout: drop it from the GMS */
};

struct tiers_demote_plan {
	enum tiers_demote_step step;
	enum tier to;   /* target (HOT when staying) */
	int err;            /* STAY: the error a request gets (GF_ERR_STATE, GF_ERR_BUSY, GF_ERR_INVALID_ARG) */
	const char *reason; /* static text */
};

/*
 * Plan a demotion of the HOT layout: stay when nothing is committed, when
 * the asked tier is not kept (GF_ERR_INVALID_ARG), when tier_demote()
 * says stay (pinned, no pressure, before min_resident, no room below:
 * GF_ERR_STATE) or while any connection holds the lock (GF_ERR_BUSY);
 * otherwise drop when the target tier already holds this layout, else write
 * it there first. A tier asked for by name is the only candidate.
 */
void tiers_demote_plan(const struct tiers_demote_facts *f, struct tiers_demote_plan *out);

/*
 * Where a snapshot of the HOT layout goes when the kept tiers are written
 * (every commit, and a demotion's snapshot to WARM): the facts about WARM's
 * room, the steps to take. WARM holds one snapshot; a replacement is written
 * beside it and exchanged, so it needs room for the whole new layout.
 */
struct tiers_place_in {
	uint64_t bytes;            /* the layout's size */
	bool warm_kept, cold_kept;
	bool warm_current;         /* WARM already holds exactly this layout */
	uint64_t warm_free;        /* free bytes in WARM's file system */
	bool warm_other;           /* WARM holds a snapshot of another (older) layout */
	uint64_t warm_other_bytes; /* its size */
};

struct tiers_place_out {
	bool evict_warm;    /* remove WARM's older snapshot first */
	bool write_warm;
	bool write_cold;
	const char *reason; /* static text */
};

/*
 * Place a snapshot: WARM when it has room (else kept as it is when it
 * already holds this layout); when it has room only without
 * its older snapshot, evict that one first (it is not the HOT layout: a
 * restart would restore it, not this one); when even that is not enough,
 * WARM is full: the snapshot spills to COLD only, and WARM's older snapshot
 * is evicted all the same, so a restart restores COLD's current layout
 * rather than WARM's stale one. COLD is written whenever it is kept.
 */
void tier_place(const struct tiers_place_in *in, struct tiers_place_out *out);

/* Phases of one snapshot or restore (docs/design.md, decision 24). */
enum tiers_phase {
	TIERS_PHASE_NONE = 0, /* no operation yet */
	TIERS_PHASE_PENDING,
	TIERS_PHASE_CHECKPOINTING,
	TIERS_PHASE_CHECKPOINTED,
	TIERS_PHASE_RESTORING,
	TIERS_PHASE_RESTORED,
	TIERS_PHASE_FAILED,
};
enum tiers_op_kind { TIERS_OP_SNAPSHOT = 1, TIERS_OP_RESTORE = 2 };

/* "None", "Pending", "Checkpointing", "Checkpointed", "Restoring", "Restored", "Failed". */
const char *tiers_phase_name(enum tiers_phase p);
/* "snapshot" / "restore". */
const char *tiers_op_name(enum tiers_op_kind k);

struct tiers_op {
	enum tiers_op_kind kind;
	enum tiers_phase phase;
	char reason[256];
	int64_t started_us, ended_us; /* wall clock; ended_us 0 until a final phase */
	uint64_t bytes;
};

/*
 * Start operation @kind at @now_us: phase Pending. Refused (false) while
 * another operation is in a non-final phase.
 */
bool tiers_op_begin(struct tiers_op *op, enum tiers_op_kind kind, int64_t now_us);
/*
 * Move to phase @to with @reason (may be NULL), at @now_us. Allowed:
 * snapshot Pending → Checkpointing → Checkpointed, restore Pending →
 * Restoring → Restored, and any non-final phase → Failed. Returns false
 * (nothing changed) for any other step.
 */
bool tiers_op_step(struct tiers_op *op, enum tiers_phase to, const char *reason, int64_t now_us);
/* Whether @p ends an operation (Checkpointed, Restored, Failed) or none runs. */
bool tiers_phase_final(enum tiers_phase p);

#endif
