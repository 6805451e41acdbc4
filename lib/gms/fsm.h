/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS lock FSM as a pure module (no sockets, no memory): the server core
 * feeds it events and asks it who may be granted. See docs/gms.md.
 *
 *   EMPTY --RW grant--> RW --commit--> RO(1) --last reader leaves--> COMMITTED
 *   EMPTY --restore (verified snapshot)--> COMMITTED
 *   COMMITTED --demoted (no lock held, snapshot in a lower tier)--> EMPTY
 *   RW --writer leaves before commit--> EMPTY          (RW_ABORT)
 *   COMMITTED --RO grant--> RO(n)
 *   COMMITTED --RW grant (no readers)--> RW            (old layout dropped)
 */
#ifndef GF_GMS_FSM_H
#define GF_GMS_FSM_H

#include <stdbool.h>
#include <stdint.h>

#include "gpufailover/gms.h"

/* Short names for the public enums (the single source of the values). */
enum gms_state {
	GMS_EMPTY = GF_GMS_STATE_EMPTY,
	GMS_RW = GF_GMS_STATE_RW,
	GMS_COMMITTED = GF_GMS_STATE_COMMITTED,
	GMS_RO = GF_GMS_STATE_RO,
};
enum gms_mode { GMS_MODE_RW = GF_GMS_RW, GMS_MODE_RO = GF_GMS_RO, GMS_MODE_RW_OR_RO = GF_GMS_RW_OR_RO };

struct gms_fsm {
	enum gms_state state;
	unsigned readers;  /* connections holding RO */
};

/* What a request in @mode gets right now. */
enum gms_decision {
	GMS_WAIT = 0,         /* not grantable yet: keep waiting */
	GMS_GRANT_RW = 1,     /* becomes the writer on a fresh (empty) layout */
	GMS_GRANT_RW_DROP = 2,/* becomes the writer; the committed layout is dropped first */
	GMS_GRANT_RO = 3,     /* becomes a reader of the committed layout */
	GMS_INVALID = -1,     /* @mode is not a valid mode */
};

void gms_fsm_init(struct gms_fsm *f);
/*
 * Decide for one request. @other_rw_waiting: whether a request in mode RW
 * other than this one is waiting (writer priority: readers do not jump it).
 */
enum gms_decision gms_fsm_decide(const struct gms_fsm *f, int mode, bool other_rw_waiting);
/*
 * Whether an RW request would drop a committed layout (COMMITTED, RO). A
 * waiting RW holds back every new reader (writer priority), so a GMS fenced
 * by a lock makes such a request prove its grant before it may wait.
 */
bool gms_fsm_rw_would_drop(const struct gms_fsm *f);
/* Apply a grant returned by gms_fsm_decide(). */
void gms_fsm_apply(struct gms_fsm *f, enum gms_decision d);
/* The writer committed: RW -> RO with the writer as the only reader. Returns false in any other state. */
bool gms_fsm_commit(struct gms_fsm *f);
/* A verified snapshot was restored into an EMPTY GMS: EMPTY -> COMMITTED. Returns false in any other state. */
bool gms_fsm_restored(struct gms_fsm *f);
/*
 * The committed layout was demoted to a lower tier (docs/tiers.md) and
 * dropped: COMMITTED -> EMPTY. Only without readers or a writer; returns
 * false in any other state.
 */
bool gms_fsm_demoted(struct gms_fsm *f);
/* The writer left before committing: RW -> EMPTY (RW_ABORT). Returns false in any other state. */
bool gms_fsm_writer_left(struct gms_fsm *f);
/* A reader left: RO(n) -> RO(n-1), RO(1) -> COMMITTED. Returns false when no reader was counted. */
bool gms_fsm_reader_left(struct gms_fsm *f);
/*
 * When a request waiting by progress (GmsConnect.by_progress, docs/gms.md
 * "Waiting for a loader") times out: @timeout_us after the later of its
 * start @since_us and @mark_us, the writer's last progress while one holds
 * RW (its grant counts) or, without one, when the last one left. < 0
 * @timeout_us: never (INT64_MAX).
 */
int64_t gms_progress_deadline(int64_t since_us, int64_t timeout_us, int64_t mark_us);
#define gms_state_name gf_gms_state_name
#define gms_mode_name gf_gms_mode_name

#endif
