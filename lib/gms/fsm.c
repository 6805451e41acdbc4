/* SPDX-License-Identifier: Apache-2.0 */
#include "fsm.h"
#include "gpufailover.pb.h"

void gms_fsm_init(struct gms_fsm *f)
{
	f->state = GMS_EMPTY;
	f->readers = 0;
}

enum gms_decision gms_fsm_decide(const struct gms_fsm *f, int mode, bool other_rw_waiting)
{
	bool committed = f->state == GMS_COMMITTED || f->state == GMS_RO;
	switch (mode) {
	case GMS_MODE_RW:
		if (f->state == GMS_EMPTY)
			return GMS_GRANT_RW;
		if (f->state == GMS_COMMITTED)
			return GMS_GRANT_RW_DROP;
		return GMS_WAIT; /* a writer is active, or readers still map the layout */
	case GMS_MODE_RO:
		/* Writer priority: a waiting RW would otherwise starve behind a stream of readers. */
		return committed && !other_rw_waiting ? GMS_GRANT_RO : GMS_WAIT;
	case GMS_MODE_RW_OR_RO:
		if (committed)
			return other_rw_waiting ? GMS_WAIT : GMS_GRANT_RO;
		if (f->state == GMS_EMPTY)
			return GMS_GRANT_RW;
		return GMS_WAIT; /* someone is loading: wait for its commit (RO) or its abort (RW) */
	default:
		return GMS_INVALID;
	}
}

bool gms_fsm_rw_would_drop(const struct gms_fsm *f)
{
	return f->state == GMS_COMMITTED || f->state == GMS_RO;
}

void gms_fsm_apply(struct gms_fsm *f, enum gms_decision d)
{
	switch (d) {
	case GMS_GRANT_RW:
	case GMS_GRANT_RW_DROP:
		f->state = GMS_RW;
		f->readers = 0;
		break;
	case GMS_GRANT_RO:
		f->state = GMS_RO;
		f->readers++;
		break;
	default:
		break;
	}
}

bool gms_fsm_commit(struct gms_fsm *f)
{
	if (f->state != GMS_RW)
		return false;
	f->state = GMS_RO;
	f->readers = 1;
	return true;
}

bool gms_fsm_restored(struct gms_fsm *f)
{
	if (f->state != GMS_EMPTY)
		return false;
	f->state = GMS_COMMITTED;
	f->readers = 0;
	return true;
}

bool gms_fsm_demoted(struct gms_fsm *f)
{
	if (f->state != GMS_COMMITTED || f->readers != 0)
		return false;
	f->state = GMS_EMPTY;
	return true;
}

bool gms_fsm_writer_left(struct gms_fsm *f)
{
	if (f->state != GMS_RW)
		return false;
	f->state = GMS_EMPTY;
	return true;
}

bool gms_fsm_reader_left(struct gms_fsm *f)
{
	if (f->state != GMS_RO || f->readers == 0)
		return false;
	if (--f->readers == 0)
		f->state = GMS_COMMITTED;
	return true;
}

int64_t gms_progress_deadline(int64_t since_us, int64_t timeout_us, int64_t mark_us)
{
	if (timeout_us < 0)
		return INT64_MAX;
	int64_t from = mark_us > since_us ? mark_us : since_us;
	return from > INT64_MAX - timeout_us ? INT64_MAX : from + timeout_us;
}

/* The public enums, the wire's and the FSM's are one set of values. */
_Static_assert(GF_GMS_STATE_EMPTY == (int)gf_GmsState_GMS_STATE_EMPTY, "GmsState EMPTY");
_Static_assert(GF_GMS_STATE_RW == (int)gf_GmsState_GMS_STATE_RW, "GmsState RW");
_Static_assert(GF_GMS_STATE_COMMITTED == (int)gf_GmsState_GMS_STATE_COMMITTED, "GmsState COMMITTED");
_Static_assert(GF_GMS_STATE_RO == (int)gf_GmsState_GMS_STATE_RO, "GmsState RO");
_Static_assert(_gf_GmsState_MAX == gf_GmsState_GMS_STATE_RO, "a new wire state needs a public one");
_Static_assert(GF_GMS_RW == (int)gf_GmsMode_GMS_MODE_RW, "GmsMode RW");
_Static_assert(GF_GMS_RO == (int)gf_GmsMode_GMS_MODE_RO, "GmsMode RO");
_Static_assert(GF_GMS_RW_OR_RO == (int)gf_GmsMode_GMS_MODE_RW_OR_RO, "GmsMode RW_OR_RO");
_Static_assert(_gf_GmsMode_MAX == gf_GmsMode_GMS_MODE_RW_OR_RO, "a new wire mode needs a public one");

GF_EXPORT const char *gf_gms_state_name(int state)
{
	switch (state) {
	case GF_GMS_STATE_EMPTY:
		return "EMPTY";
	case GF_GMS_STATE_RW:
		return "RW";
	case GF_GMS_STATE_COMMITTED:
		return "COMMITTED";
	case GF_GMS_STATE_RO:
		return "RO";
	}
	return "?";
}

GF_EXPORT const char *gf_gms_mode_name(int mode)
{
	switch (mode) {
	case GF_GMS_RW:
		return "RW";
	case GF_GMS_RO:
		return "RO";
	case GF_GMS_RW_OR_RO:
		return "RW_OR_RO";
	}
	return "?";
}
