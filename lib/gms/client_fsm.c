/* SPDX-License-Identifier: Apache-2.0 */
#include <string.h>

#include "client_fsm.h"
#include "gpufailover/gms.h"

void gmsc_fsm_init(struct gmsc_fsm *f)
{
	memset(f, 0, sizeof(*f));
	f->state = GMSC_CLOSED;
	f->kept = GMSC_KEPT_NOTHING;
}

int gmsc_fsm_mode(const struct gmsc_fsm *f)
{
	switch (f->state) {
	case GMSC_RW:
		return GF_GMS_RW;
	case GMSC_RO:
		return GF_GMS_RO;
	case GMSC_LOST:
		return f->lost_mode;
	default:
		return 0;
	}
}

bool gmsc_fsm_mapped(const struct gmsc_fsm *f)
{
	return f->have_layout && (f->state == GMSC_RO || f->state == GMSC_LOST);
}

bool gmsc_fsm_same_layout(const struct gmsc_fsm *f, const uint8_t hash[16], size_t count)
{
	if (!f->have_layout || !hash)
		return false;
	if (count != GMSC_COUNT_ANY && count != f->count)
		return false;
	return memcmp(hash, f->hash, 16) == 0;
}

enum gmsc_kept gmsc_fsm_sleep_plan(const struct gmsc_fsm *f, bool keep_handles, bool can_fence)
{
	/* Only a reader of a committed layout has something to come back to on
	 * the same session; a writer, a reader that mapped nothing, and a
	 * client whose GMS is lost close the connection. */
	if (f->state != GMSC_RO || !f->have_layout)
		return GMSC_KEPT_NOTHING;
	if (!keep_handles)
		return GMSC_KEPT_SESSION;
	return can_fence ? GMSC_KEPT_MAPPED : GMSC_KEPT_HANDLES;
}

enum gmsc_wake gmsc_fsm_wake_path(const struct gmsc_fsm *f)
{
	if (f->state == GMSC_WAKING)
		return GMSC_WAKE_READ;
	if (f->state != GMSC_ASLEEP)
		return GMSC_WAKE_NOT_ASLEEP;
	if (!f->have_layout)
		return GMSC_WAKE_NO_LAYOUT;
	return f->kept == GMSC_KEPT_NOTHING ? GMSC_WAKE_CONNECT : GMSC_WAKE_SEND;
}

bool gmsc_fsm_granted(struct gmsc_fsm *f, int mode)
{
	if (f->state != GMSC_CLOSED || (mode != GF_GMS_RW && mode != GF_GMS_RO))
		return false;
	f->state = mode == GF_GMS_RW ? GMSC_RW : GMSC_RO;
	return true;
}

static void set_layout(struct gmsc_fsm *f, const uint8_t hash[16], size_t count)
{
	memcpy(f->hash, hash, 16);
	f->count = count;
	f->have_layout = true;
}

bool gmsc_fsm_committed(struct gmsc_fsm *f, const uint8_t hash[16], size_t count)
{
	if (f->state != GMSC_RW || !hash)
		return false;
	set_layout(f, hash, count);
	f->state = GMSC_RO;
	return true;
}

bool gmsc_fsm_layout_mapped(struct gmsc_fsm *f, const uint8_t hash[16], size_t count)
{
	if (f->state != GMSC_RO || f->have_layout || !hash)
		return false;
	set_layout(f, hash, count);
	return true;
}

bool gmsc_fsm_slept(struct gmsc_fsm *f, enum gmsc_kept kept)
{
	if (f->state != GMSC_RW && f->state != GMSC_RO && f->state != GMSC_LOST)
		return false;
	if (kept < GMSC_KEPT_NOTHING || kept > GMSC_KEPT_MAPPED ||
	    (kept != GMSC_KEPT_NOTHING && (f->state != GMSC_RO || !f->have_layout)))
		return false;
	f->state = GMSC_ASLEEP;
	f->kept = kept;
	f->lost_mode = 0;
	f->in_place = false;
	return true;
}

bool gmsc_fsm_wake_sent(struct gmsc_fsm *f)
{
	if (f->state != GMSC_ASLEEP || f->kept == GMSC_KEPT_NOTHING || !f->have_layout)
		return false;
	f->state = GMSC_WAKING;
	return true;
}

static enum gmsc_path decide_wake(const struct gmsc_fsm *f, int mode, const uint8_t *hash, bool handles_valid)
{
	if (mode != GF_GMS_RO || !hash)
		return GMSC_PATH_BOGUS; /* a wake asks for RO, and an RO grant names its layout */
	if (handles_valid) {
		/* The GMS vouches for handles: there must be some, and of the layout it names. */
		if (f->state != GMSC_WAKING || f->kept < GMSC_KEPT_HANDLES || !gmsc_fsm_same_layout(f, hash, GMSC_COUNT_ANY))
			return GMSC_PATH_BOGUS;
		return f->kept == GMSC_KEPT_MAPPED ? GMSC_PATH_OPEN_IN_PLACE : GMSC_PATH_MAP_KEPT;
	}
	return gmsc_fsm_same_layout(f, hash, GMSC_COUNT_ANY) ? GMSC_PATH_LIST : GMSC_PATH_STALE;
}

enum gmsc_path gmsc_fsm_woke(struct gmsc_fsm *f, int mode, const uint8_t *hash, bool handles_valid)
{
	bool fresh = f->state == GMSC_ASLEEP && f->kept == GMSC_KEPT_NOTHING && f->have_layout;
	if (f->state != GMSC_WAKING && !fresh)
		return GMSC_PATH_ILLEGAL;
	enum gmsc_path p = decide_wake(f, mode, hash, handles_valid);
	f->in_place = p == GMSC_PATH_OPEN_IN_PLACE;
	f->state = p >= 0 ? GMSC_RO : GMSC_ASLEEP;
	f->kept = GMSC_KEPT_NOTHING;
	return p;
}

bool gmsc_fsm_dropped(struct gmsc_fsm *f)
{
	if (f->state == GMSC_CLOSED)
		return false;
	if (f->state == GMSC_RW)
		f->have_layout = false; /* an uncommitted layout is aborted */
	f->state = GMSC_ASLEEP;
	f->kept = GMSC_KEPT_NOTHING;
	f->lost_mode = 0;
	f->in_place = false;
	return true;
}

bool gmsc_fsm_released(struct gmsc_fsm *f)
{
	if (f->state != GMSC_ASLEEP || f->kept < GMSC_KEPT_HANDLES)
		return false;
	f->kept = GMSC_KEPT_SESSION;
	return true;
}

bool gmsc_fsm_lost(struct gmsc_fsm *f)
{
	if (f->state != GMSC_RW && f->state != GMSC_RO)
		return false;
	f->lost_mode = gmsc_fsm_mode(f);
	f->state = GMSC_LOST;
	return true;
}

enum gmsc_hangup gmsc_fsm_hangup(struct gmsc_fsm *f)
{
	if (gmsc_fsm_released(f))
		return GMSC_HANGUP_RELEASE;
	if (f->watch && gmsc_fsm_lost(f))
		return GMSC_HANGUP_LOST;
	return GMSC_HANGUP_IGNORE;
}

const char *gmsc_state_name(enum gmsc_state s)
{
	switch (s) {
	case GMSC_CLOSED:
		return "CLOSED";
	case GMSC_RW:
		return "RW";
	case GMSC_RO:
		return "RO";
	case GMSC_ASLEEP:
		return "ASLEEP";
	case GMSC_WAKING:
		return "WAKING";
	case GMSC_LOST:
		return "LOST";
	}
	return "?";
}

const char *gmsc_kept_name(enum gmsc_kept k)
{
	switch (k) {
	case GMSC_KEPT_NOTHING:
		return "nothing";
	case GMSC_KEPT_SESSION:
		return "session";
	case GMSC_KEPT_HANDLES:
		return "handles";
	case GMSC_KEPT_MAPPED:
		return "mapped";
	}
	return "?";
}
