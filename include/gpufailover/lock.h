/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gpufailover/lock.h
 * @brief The lock: a server where the connection is the lock, and its client.
 *
 * Contract (docs/lock.md has the full text):
 * - gf_lock_acquire() blocks until this connection holds the lock, the
 *   timeout passes or the server is lost; a grant carries a fencing epoch
 *   that strictly increases with every new grant, across server restarts.
 * - Closing the connection (process death) releases; there is no release a
 *   dead process could forget. Waiters are granted in FIFO order.
 * - On unix sockets the server grants the next waiter only after the previous
 *   holder's process has exited (bounded by its exit-wait timeout).
 */
#ifndef GPUFAILOVER_LOCK_H
#define GPUFAILOVER_LOCK_H

#include <stddef.h>
#include <stdint.h>

#include "../gpufailover.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup lock Lock client
 *  @{ */

typedef struct gf_lock gf_lock;

/** A grant, filled by gf_lock_acquire(). */
struct gf_lock_grant {
	uint64_t epoch;            /**< fencing epoch; strictly increasing per new grant */
	uint8_t session_token[32]; /**< proves this grant after a server restart */
	int64_t granted_at_us;     /**< server wall clock, microseconds since the epoch */
	int reclaimed;             /**< 1 when an earlier grant was kept across a server restart */
};

/**
 * Called once when a held lock is lost for good (server gone and not
 * regained within the reconnect time, or the grant refused on reconnect).
 * @p err is GF_ERR_LOCK_LOST; gf_error_detail() is not valid here, @p detail is.
 * Runs on the thread that noticed: the watcher thread, or the caller of
 * gf_lock_process(). The library itself never terminates the process; the
 * engine layer's default hook does (see gpufailover/engine.h).
 */
typedef void (*gf_lock_lost_fn)(gf_lock *lock, int err, const char *detail, void *userdata);

/**
 * New client for the lock server at @p uri ("unix:///path" or
 * "tcp://host:port") acting as @p engine_id. Does not connect yet.
 * Caller frees with gf_lock_free().
 */
GF_EXPORT int gf_lock_new(gf_lock **out, const char *uri, const char *engine_id);
/** Close the connection (releasing a held lock) and free. Stops the watcher. NULL is a no-op. */
GF_EXPORT void gf_lock_free(gf_lock *lock);
/** How long to try reconnecting after the server is lost (default 12s: a bit longer than the server's default 10s reconnect window). */
GF_EXPORT int gf_lock_set_reconnect_timeout(gf_lock *lock, int64_t ms);
/** Shared secret for TCP servers that require one (copied). */
GF_EXPORT int gf_lock_set_secret(gf_lock *lock, const void *secret, size_t len);
/** TCP lease: heartbeat interval and T_fence (report LOCK_LOST after this long without hearing the server). */
GF_EXPORT int gf_lock_set_lease(gf_lock *lock, int64_t heartbeat_ms, int64_t fence_ms);
/** Install the lock-lost hook (NULL removes it). */
GF_EXPORT void gf_lock_set_lost_fn(gf_lock *lock, gf_lock_lost_fn fn, void *userdata);

/**
 * Connect (if needed) and block until the lock is granted, @p timeout_ms
 * passes (< 0: forever), or gf_lock_interrupt() is called. A waiter whose
 * server restarts reconnects and keeps waiting. On success fills @p grant.
 * Errors: GF_ERR_TIMEOUT, GF_ERR_UNREACHABLE (server not reachable within the
 * reconnect time), GF_ERR_INTERRUPTED (the wait was abandoned and the
 * connection closed: nothing is held), GF_ERR_PERMISSION, GF_ERR_STATE
 * (already held), GF_ERR_PROTOCOL.
 */
GF_EXPORT int gf_lock_acquire(gf_lock *lock, int64_t timeout_ms, struct gf_lock_grant *grant);
/** Explicitly release for a clean shutdown (closes the connection). */
GF_EXPORT int gf_lock_release(gf_lock *lock);
/** Make a blocking gf_lock_acquire() on another thread return GF_ERR_INTERRUPTED. Async-signal-safe. */
GF_EXPORT void gf_lock_interrupt(gf_lock *lock);
/** 1 while held, 0 otherwise. */
GF_EXPORT int gf_lock_is_held(const gf_lock *lock);
/** Epoch of the current grant (0 when never granted). */
GF_EXPORT uint64_t gf_lock_epoch(const gf_lock *lock);

/** Event-loop integration (sd-bus style): the fd to watch, -1 when not connected. */
GF_EXPORT int gf_lock_get_fd(const gf_lock *lock);
/** poll() events to wait for on gf_lock_get_fd(). */
GF_EXPORT int gf_lock_get_events(const gf_lock *lock);
/** Milliseconds until gf_lock_process() must be called even without events (-1: none). */
GF_EXPORT int gf_lock_get_timeout_ms(const gf_lock *lock);
/**
 * Handle what happened on the connection: hangup (start reconnecting),
 * heartbeats, reconnect attempts. Never blocks for long. Returns 0, or
 * GF_ERR_LOCK_LOST once the lock is lost (after calling the hook).
 */
GF_EXPORT int gf_lock_process(gf_lock *lock);
/** Start a built-in watcher thread that runs the process loop while held. */
GF_EXPORT int gf_lock_start_watch(gf_lock *lock);
/** Stop the watcher thread (joins it). */
GF_EXPORT void gf_lock_stop_watch(gf_lock *lock);

/**
 * One-shot status query: a JSON object with holder, epoch, waiters,
 * reconnect window and uptime. *json is malloc'd; free() it.
 */
GF_EXPORT int gf_lock_status_json(const char *uri, const void *secret, size_t secret_len,
				  int64_t timeout_ms, char **json);
/** Check that the server answers a handshake within @p timeout_ms. */
GF_EXPORT int gf_lock_ping(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms);

/** @} */

/* The server API (gf_lockd_*) is declared below by the lock component. */

#ifdef __cplusplus
}
#endif

#endif
