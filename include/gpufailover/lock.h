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
 * gf_lock_process(). It must not call gf_lock_free(), gf_lock_release() or
 * gf_lock_stop_watch() on @p lock (the watcher would join itself). The
 * library itself never terminates the process; the engine layer's default
 * hook does (see gpufailover/engine.h).
 */
typedef void (*gf_lock_lost_fn)(gf_lock *lock, int err, const char *detail, void *userdata);

/**
 * New client for the lock server at @p uri ("unix:///path" or
 * "tcp://host:port") or for the lock on etcd
 * ("etcd://host:port[,host:port...]/prefix/name[?ttl=S&user=U&password-file=F]",
 * "etcds://" adds cacert=, cert=, key= files; docs/lock.md; on etcd
 * gf_lock_set_lease() sets the keepalive interval and T_fence, which must
 * leave max(TTL/4, 500 ms) of the TTL: defaults TTL/6 and TTL/2) acting as
 * @p engine_id (1..127 bytes of printable
 * ASCII without spaces, quotes, backslash or '='; it appears in logs and
 * status). Does not connect yet. Caller frees with gf_lock_free().
 * Errors: GF_ERR_INVALID_ARG (bad URI or id), GF_ERR_NOMEM, GF_ERR_IO.
 */
GF_EXPORT int gf_lock_new(gf_lock **out, const char *uri, const char *engine_id);
/** Close the connection (releasing a held lock) and free. Stops the watcher. NULL is a no-op. */
GF_EXPORT void gf_lock_free(gf_lock *lock);
/** How long to try reconnecting after the server is lost (default 12s: a bit longer than the server's default 10s reconnect window). */
GF_EXPORT int gf_lock_set_reconnect_timeout(gf_lock *lock, int64_t ms);
/** Shared secret for TCP servers that require one, or the etcd user's password (copied). */
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
/**
 * Explicitly release for a clean shutdown: tells the server (which then
 * grants the next waiter without waiting for this process to exit), closes
 * the connection and stops the watcher. GF_ERR_STATE when nothing was held.
 */
GF_EXPORT int gf_lock_release(gf_lock *lock);
/**
 * Make a blocking gf_lock_acquire() on another thread return
 * GF_ERR_INTERRUPTED (an eventfd write). Async-signal-safe. An interrupt
 * sent while no acquire is blocked makes the next acquire return at once.
 */
GF_EXPORT void gf_lock_interrupt(gf_lock *lock);
/** 1 while held, 0 otherwise. */
GF_EXPORT int gf_lock_is_held(const gf_lock *lock);
/** Epoch of the current grant (0 when never granted). */
GF_EXPORT uint64_t gf_lock_epoch(const gf_lock *lock);

/** Event-loop integration (sd-bus style): the fd to watch while held, -1 otherwise (e.g. while reconnecting: rely on the timeout). */
GF_EXPORT int gf_lock_get_fd(const gf_lock *lock);
/** poll() events to wait for on gf_lock_get_fd(). */
GF_EXPORT int gf_lock_get_events(const gf_lock *lock);
/** Milliseconds until gf_lock_process() must be called even without events (-1: none). */
GF_EXPORT int gf_lock_get_timeout_ms(const gf_lock *lock);
/**
 * Handle what happened on the connection: hangup (start reconnecting),
 * heartbeats, reconnect attempts. Never blocks for long (one reconnect
 * attempt waits at most 1 s). Returns 0, or GF_ERR_LOCK_LOST once the lock
 * is lost (after calling the hook once). Thread-safe against the query
 * functions; do not run it while the watcher thread runs.
 */
GF_EXPORT int gf_lock_process(gf_lock *lock);
/** Start a built-in watcher thread that runs the process loop while held (GF_ERR_STATE if not held). */
GF_EXPORT int gf_lock_start_watch(gf_lock *lock);
/** Stop the watcher thread (joins it). */
GF_EXPORT void gf_lock_stop_watch(gf_lock *lock);

/**
 * One-shot status query: a JSON object with holder, epoch, waiters,
 * reconnect window and uptime (on etcd: holder, epoch, waiters, waiter_count,
 * prefix, revision, backend "etcd"; @p secret is the etcd password; ping on
 * etcd checks that a quorum answers a read). *json is malloc'd; free() it.
 */
GF_EXPORT int gf_lock_status_json(const char *uri, const void *secret, size_t secret_len,
				  int64_t timeout_ms, char **json);
/** Check that the server answers a handshake within @p timeout_ms. */
GF_EXPORT int gf_lock_ping(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms);

/** @} */

/** @defgroup lockd Lock server
 *  The server core, embeddable in any process: configure with the setters,
 *  gf_lockd_start(), then either gf_lockd_run() or drive it from your own
 *  loop with gf_lockd_get_fd() / gf_lockd_get_timeout_ms() / gf_lockd_process().
 *  One thread drives a server; only gf_lockd_stop() may be called from
 *  another thread (or a signal handler).
 *  @{ */

typedef struct gf_lockd gf_lockd;

/** New unconfigured server. Free with gf_lockd_free(). Errors: GF_ERR_NOMEM, GF_ERR_IO. */
GF_EXPORT int gf_lockd_new(gf_lockd **out);
/** Close every connection and listener (unix socket files are removed) and free. NULL is a no-op. */
GF_EXPORT void gf_lockd_free(gf_lockd *d);
/** Listen on @p uri ("unix:///path" or "tcp://host:port"); repeatable; before start. */
GF_EXPORT int gf_lockd_add_listen(gf_lockd *d, const char *uri);
/** Persist grants to @p path (JSON, written atomically before every grant); before start. */
GF_EXPORT int gf_lockd_set_state_file(gf_lockd *d, const char *path);
/** After a restart with a holder on record, only that holder may re-acquire for @p ms (default 10000). */
GF_EXPORT int gf_lockd_set_reconnect_window(gf_lockd *d, int64_t ms);
/**
 * How long to wait for a released unix holder's process to exit before
 * granting the next waiter anyway (default 10000). 0 disables the wait: the
 * socket close alone releases (what a server without pidfds falls back to).
 */
GF_EXPORT int gf_lockd_set_exit_wait_timeout(gf_lockd *d, int64_t ms);
/** Allow unix peers with uid @p uid (repeatable). With an empty list every uid may connect. */
GF_EXPORT int gf_lockd_add_allow_uid(gf_lockd *d, uint32_t uid);
/** Shared secret (copied). Mandatory when a TCP listener is configured; unix peers are not asked for it. */
GF_EXPORT int gf_lockd_set_secret(gf_lockd *d, const void *secret, size_t len);
/**
 * TCP lease: heartbeat interval and T_detect (re-grant after this long
 * without hearing the holder). Clients are told T_fence = T_detect / 2, so
 * the margin is T_detect / 2. GF_ERR_INVALID_ARG unless
 * detect_ms >= 3 * heartbeat_ms (defaults 1000 / 6000).
 */
GF_EXPORT int gf_lockd_set_lease(gf_lockd *d, int64_t heartbeat_ms, int64_t detect_ms);
/** A connection that has not finished its handshake after @p ms is dropped (default 3000). */
GF_EXPORT int gf_lockd_set_handshake_timeout(gf_lockd *d, int64_t ms);
/**
 * Read the state file, open the listeners. After this returns the sockets
 * accept connections. Errors: GF_ERR_INVALID_ARG (no listener, TCP without
 * secret), GF_ERR_BUSY (another server uses the state file or socket),
 * GF_ERR_IO, GF_ERR_PERMISSION.
 */
GF_EXPORT int gf_lockd_start(gf_lockd *d);
/** An fd that becomes readable when gf_lockd_process() has work (an epoll fd). */
GF_EXPORT int gf_lockd_get_fd(const gf_lockd *d);
/** Milliseconds until gf_lockd_process() must run even without events (-1: none). */
GF_EXPORT int gf_lockd_get_timeout_ms(const gf_lockd *d);
/** Handle every pending event and timer without blocking. Returns 0, or 1 once stopped. */
GF_EXPORT int gf_lockd_process(gf_lockd *d);
/** Run the event loop (what gf_lockd_process() does, blocking in epoll_wait between rounds) until gf_lockd_stop(). Returns 0 or a negative error. */
GF_EXPORT int gf_lockd_run(gf_lockd *d);
/** Make gf_lockd_run() return. Thread-safe and async-signal-safe. */
GF_EXPORT void gf_lockd_stop(gf_lockd *d);
/** Status as JSON (same shape as gf_lock_status_json()); *json is malloc'd. */
GF_EXPORT int gf_lockd_status_json(gf_lockd *d, char **json);

/** @} */

#ifdef __cplusplus
}
#endif

#endif
