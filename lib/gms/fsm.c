/* SPDX-License-Identifier: Apache-2.0 */
#include "fsm.h"

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

const char *gms_state_name(enum gms_state s)
{
	switch (s) {
	case GMS_EMPTY:
		return "EMPTY";
	case GMS_RW:
		return "RW";
	case GMS_COMMITTED:
		return "COMMITTED";
	case GMS_RO:
		return "RO";
	}
	return "?";
}

const char *gms_mode_name(int mode)
{
	switch (mode) {
	case GMS_MODE_RW:
		return "RW";
	case GMS_MODE_RO:
		return "RO";
	case GMS_MODE_RW_OR_RO:
		return "RW_OR_RO";
	}
	return "?";
}
