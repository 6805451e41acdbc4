/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock's grant rules as a pure module (no sockets, no files): the server
 * describes the situation, these functions decide. See docs/lock.md.
 *
 *   free --next waiter--> held --holder gone--> exit wait --process exited
 *   or exit-wait timeout--> free. Grants also wait while a reconnect window
 *   is open (a restarted server with a holder on record) and while the state
 *   file cannot be written.
 */
#ifndef GF_LOCK_GRANT_H
#define GF_LOCK_GRANT_H

#include <stdbool.h>
#include <stdint.h>

/* What blocks a grant right now. */
struct gf_lock_gate {
	bool has_holder;
	bool exit_wait;       /* a released holder's process has not exited yet */
	bool window;          /* reconnect window open */
	bool store_failed;    /* the state file could not be written: retry pending */
	bool has_waiter;
};

/* Whether the first waiter may be granted now. */
bool gf_lock_may_grant(const struct gf_lock_gate *g);

/* One LockAcquire, as the server sees it. */
struct gf_lock_acquire_in {
	bool is_holder;       /* this connection holds the lock */
	bool is_waiter;       /* this connection is waiting */
	bool id_valid;        /* gf_id_valid(engine_id) */
	bool has_token;       /* the request carries a session token (a reclaim) */
	bool token_matches;   /* token and epoch match the holder on record */
	bool other_holder;    /* another connection holds the lock */
	bool window;          /* reconnect window open */
};

enum gf_lock_acquire_decision {
	GF_LOCK_REFUSE_HOLDER,     /* STATE: already holds the lock */
	GF_LOCK_REFUSE_WAITER,     /* STATE: already waiting */
	GF_LOCK_REFUSE_ID,         /* INVALID_ARG: engine id breaks the id rule */
	GF_LOCK_TAKEOVER,          /* the holder reconnected over a stale connection: move the grant, same epoch */
	GF_LOCK_RECLAIM,           /* the holder on record reclaims during the window: grant, same epoch */
	GF_LOCK_REFUSE_MISMATCH,   /* LOCK_LOST: token or epoch do not match the record */
	GF_LOCK_REFUSE_NO_WINDOW,  /* LOCK_LOST: no window open, the grant is gone */
	GF_LOCK_QUEUE,             /* join the FIFO of waiters */
};

enum gf_lock_acquire_decision gf_lock_decide_acquire(const struct gf_lock_acquire_in *in);

/*
 * The epoch after @last. Epochs are stored as JSON numbers and signed 64-bit
 * fields elsewhere: past INT64_MAX nothing more is granted. Returns false
 * when @last is INT64_MAX or more.
 */
bool gf_lock_next_epoch(uint64_t last, uint64_t *next);

#endif
