/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS client's sleep/wake state machine as a pure module (no sockets,
 * no memory), as fsm.c is for the server: client.c tells it what happened
 * and asks it what to do — what a sleep keeps, which way a wake goes, what a
 * hangup means, and whether the GMS's layout is the one this client mapped
 * (the one place "stale" is decided). See docs/gms.md "The client's states".
 *
 *   CLOSED --granted RW--> RW --commit--> RO (layout known)
 *   CLOSED --granted RO--> RO --map_all--> RO (layout known)
 *   RW, RO, LOST --sleep--> ASLEEP{what it kept}
 *   ASLEEP{session..} --wake sent--> WAKING --granted--> RO (kept handles, or the list)
 *   ASLEEP{nothing} --granted on a fresh connect--> RO (the list)
 *   WAKING, ASLEEP --the session is gone, a wake failed--> ASLEEP{nothing}
 *   ASLEEP{handles..} --hangup (the GMS dropped the layout)--> ASLEEP{session}
 *   RW, RO --hangup, an I/O failure--> LOST
 *
 * Not thread-safe: client.c holds its lock around every call, since its
 * watcher thread delivers hangups.
 */
#ifndef GF_GMS_CLIENT_FSM_H
#define GF_GMS_CLIENT_FSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gmsc_state {
	GMSC_CLOSED = 0, /* before the first grant */
	GMSC_RW,         /* connected, holding the RW lock: loading */
	GMSC_RO,         /* connected, holding the RO lock */
	GMSC_ASLEEP,     /* unmapped, no lock; .kept says what it holds */
	GMSC_WAKING,     /* the wake's request is out on the kept session, its reply unread */
	GMSC_LOST,       /* the GMS went away while this client held a lock */
};

/* What a sleeper holds, each level with everything the one before holds. */
enum gmsc_kept {
	GMSC_KEPT_NOTHING = 0, /* no session: the wake connects afresh */
	GMSC_KEPT_SESSION,     /* the session, handshaken, without a lock ("parked") */
	GMSC_KEPT_HANDLES,     /* ... and the layout's imported handles, unmapped */
	GMSC_KEPT_MAPPED,      /* ... still mapped, fenced (host): the wake opens them in place */
};

/* The first step of a wake. */
enum gmsc_wake {
	GMSC_WAKE_NOT_ASLEEP = -2, /* still connected (or never was) */
	GMSC_WAKE_NO_LAYOUT = -1,  /* asleep, but no committed layout was mapped before */
	GMSC_WAKE_CONNECT = 0,     /* no kept session: connect afresh */
	GMSC_WAKE_SEND = 1,        /* send the request on the kept session */
	GMSC_WAKE_READ = 2,        /* the request is out (gf_gms_remap_begin()): read its reply */
};

/* What a wake's grant leads to. */
enum gmsc_path {
	GMSC_PATH_ILLEGAL = -3,     /* no wake was under way */
	GMSC_PATH_BOGUS = -2,       /* the grant contradicts itself or what was sent: a protocol error */
	GMSC_PATH_STALE = -1,       /* the GMS holds another layout */
	GMSC_PATH_OPEN_IN_PLACE = 0,/* kept fenced mappings are valid: open them */
	GMSC_PATH_MAP_KEPT = 1,     /* kept handles are valid: map them at their offsets */
	GMSC_PATH_LIST = 2,         /* same layout, new handles: import the list */
};

/* What a hangup on the watched session means now. */
enum gmsc_hangup {
	GMSC_HANGUP_IGNORE = 0,  /* nothing: e.g. a wake in progress sees it itself */
	GMSC_HANGUP_RELEASE = 1, /* asleep: the GMS dropped the layout; release the kept handles */
	GMSC_HANGUP_LOST = 2,    /* awake and watched: the GMS is lost; report it (once) */
};

/* A count the GMS did not say (a grant names only the layout hash). */
#define GMSC_COUNT_ANY SIZE_MAX

struct gmsc_fsm {
	enum gmsc_state state;
	enum gmsc_kept kept;   /* ASLEEP and WAKING; GMSC_KEPT_NOTHING otherwise */
	int lost_mode;         /* LOST: the mode that was held (GF_GMS_RW or GF_GMS_RO) */
	bool have_layout;      /* a committed layout is known: the one a wake must find again */
	uint8_t hash[16];      /* ... its layout hash */
	size_t count;          /* ... and number of allocations */
	bool in_place;         /* the last wake opened fenced mappings in place: nothing to prefault */
	bool watch;            /* a loss is to be reported from the watcher while awake (kept across sleeps) */
};

void gmsc_fsm_init(struct gmsc_fsm *f);

/* ---- queries */

/* The lock held: GF_GMS_RW, GF_GMS_RO (also when lost holding it), or 0. */
int gmsc_fsm_mode(const struct gmsc_fsm *f);
/* Whether the layout's allocations are mapped now (RO with a layout known, or lost while so). */
bool gmsc_fsm_mapped(const struct gmsc_fsm *f);
/*
 * The one place "stale" is decided: whether the layout the GMS names (its
 * @hash and, where it lists them, @count allocations; GMSC_COUNT_ANY when
 * it did not say) is the one this client mapped. False without a layout.
 */
bool gmsc_fsm_same_layout(const struct gmsc_fsm *f, const uint8_t hash[16], size_t count);
/* What a sleep now tries to keep, given the caller's setting and whether the backend can fence in place. */
enum gmsc_kept gmsc_fsm_sleep_plan(const struct gmsc_fsm *f, bool keep_handles, bool can_fence);
/* Which way a wake starts from here. */
enum gmsc_wake gmsc_fsm_wake_path(const struct gmsc_fsm *f);

/* ---- events; each returns false (and changes nothing) where it is illegal */

/* The first connect was granted @mode: CLOSED -> RW or RO. */
bool gmsc_fsm_granted(struct gmsc_fsm *f, int mode);
/* The writer committed the layout (@hash, @count allocations): RW -> RO with that layout. */
bool gmsc_fsm_committed(struct gmsc_fsm *f, const uint8_t hash[16], size_t count);
/* A reader mapped the committed layout for the first time: RO without a layout -> RO with it. */
bool gmsc_fsm_layout_mapped(struct gmsc_fsm *f, const uint8_t hash[16], size_t count);
/*
 * The connection went to sleep keeping @kept (at most what sleep_plan
 * said): RW, RO, LOST -> ASLEEP{kept}. A writer that had not committed
 * leaves no layout to come back to.
 */
bool gmsc_fsm_slept(struct gmsc_fsm *f, enum gmsc_kept kept);
/* The wake's request went out on the kept session: ASLEEP{session..} -> WAKING (the wake owns the handles). */
bool gmsc_fsm_wake_sent(struct gmsc_fsm *f);
/*
 * A wake was granted @mode by a GMS announcing @hash (NULL: none), saying
 * @handles_valid (the kept handles are this layout's): from WAKING, or from
 * ASLEEP{nothing} after a fresh connect. The paths go to RO; STALE and
 * BOGUS to ASLEEP{nothing} (the caller closes and releases everything).
 */
enum gmsc_path gmsc_fsm_woke(struct gmsc_fsm *f, int mode, const uint8_t *hash, bool handles_valid);
/*
 * The client closed its connection or kept session and released every
 * handle without a loss (the session was gone, a wake failed): any state
 * but CLOSED -> ASLEEP{nothing}, the layout still known.
 */
bool gmsc_fsm_dropped(struct gmsc_fsm *f);
/* The handles kept asleep were released (the watcher could not be armed): ASLEEP{handles..} -> ASLEEP{session}. */
bool gmsc_fsm_released(struct gmsc_fsm *f);
/* The GMS went away while a lock was held: RW, RO -> LOST. False when already lost (report once) or no lock was held. */
bool gmsc_fsm_lost(struct gmsc_fsm *f);
/* The watched session hung up: decide what that means, and move on (see enum gmsc_hangup). */
enum gmsc_hangup gmsc_fsm_hangup(struct gmsc_fsm *f);

const char *gmsc_state_name(enum gmsc_state s);
const char *gmsc_kept_name(enum gmsc_kept k);

#endif
