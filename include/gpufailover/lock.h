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

#include "base.h"

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
	/** gf_lock_grant_proof() of this grant as the lock server computed it
	 *  ahead of the grant (valid when @c has_fence_proof): a new holder
	 *  then computes no MAC on its way to serving. */
	uint8_t fence_proof[32];
	int has_fence_proof; /**< 1 when @c fence_proof is set */
};

/**
 * Called once when a held lock is lost for good (the grant refused on
 * reconnect; on tcp:// also no word from the server for T_fence. On unix://
 * a server that stays away is waited for: docs/design.md, decision 31).
 * @p err is GF_ERR_LOCK_LOST; gf_error_detail() is not valid here, @p detail is.
 * Runs on the thread that noticed: the watcher thread, or the caller of
 * gf_lock_process(). It must not call gf_lock_free() or gf_lock_release()
 * on @p lock (the watcher would join itself); gf_lock_stop_watch() is
 * allowed and returns without waiting. The
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
/** How long to try reconnecting after the server is lost (default 12s: a bit longer than the server's default 10s reconnect window; at most a year, GF_ERR_INVALID_ARG beyond). On unix:// a holder, and a waiter that was in line, keep trying past it and only report it (gf_lock_unreachable_ms()); on tcp:// the lease caps it (decision 31). */
GF_EXPORT int gf_lock_set_reconnect_timeout(gf_lock *lock, int64_t ms);
/** Shared secret for TCP servers that require one, or the etcd user's password (copied). */
GF_EXPORT int gf_lock_set_secret(gf_lock *lock, const void *secret, size_t len);
/** TCP lease: heartbeat interval and T_fence (report LOCK_LOST after this long without hearing the server); 0 < heartbeat < fence <= a year, else GF_ERR_INVALID_ARG. */
GF_EXPORT int gf_lock_set_lease(gf_lock *lock, int64_t heartbeat_ms, int64_t fence_ms);
/** Install the lock-lost hook (NULL removes it). */
GF_EXPORT void gf_lock_set_lost_fn(gf_lock *lock, gf_lock_lost_fn fn, void *userdata);
/**
 * Declare this engine's resources for the server's standby pool, sent with
 * every acquire: the GPUs it runs on (@p ngpus UUIDs, at most 8, each
 * "GPU-" or "MIG-" and 8-4-4-4-12 hex digits; copied, kept lowercase), the
 * private memory its wake needs and the memory it keeps while asleep (bytes).
 * Replaces an earlier declaration; takes effect at the next acquire.
 * A server with a per-GPU standby budget may evict this engine while it
 * waits: its acquire then returns GF_ERR_EVICTED (docs/lock.md).
 * Errors: GF_ERR_INVALID_ARG (more than 8 GPUs, a malformed or repeated
 * UUID; nothing changed). Thread-safe.
 */
GF_EXPORT int gf_lock_set_resources(gf_lock *lock, const char *const *gpus, size_t ngpus, uint64_t wake_bytes,
				    uint64_t asleep_bytes);
/** Declare this engine pinned (@p pinned != 0): the server never evicts it to keep a GPU's standby budget. */
GF_EXPORT int gf_lock_set_pinned(gf_lock *lock, int pinned);
/**
 * Declare the model this engine serves (copied; the engine id rule applies;
 * NULL or "" clears), answered by readiness queries (gf_lock_ready_for()).
 * Errors: GF_ERR_INVALID_ARG.
 */
GF_EXPORT int gf_lock_set_model(gf_lock *lock, const char *model);
/**
 * Declare (@p on != 0, before the acquire) that this holder will call
 * gf_lock_serving() once it serves: gf-lockd's readiness relay then answers
 * "not ready" between the grant and that call (the holder is waking).
 * Without it the relay counts the grant as ready and says "serving unknown".
 * The engine library declares it. Takes effect at the next acquire.
 * Errors: GF_ERR_INVALID_ARG. Thread-safe.
 */
GF_EXPORT int gf_lock_set_serving_report(gf_lock *lock, int on);
/**
 * Tell the lock server that this holder now serves (its engine entered
 * Active); one small message on the lock's connection, no answer awaited,
 * repeated by itself with a reclaim after a server restart. Does not block
 * longer than sending one frame. Errors: GF_ERR_STATE (not held),
 * GF_ERR_NOT_SUPPORTED (etcd locks: there is no relay), GF_ERR_UNREACHABLE
 * (the send failed; the watcher reports the loss). Thread-safe.
 */
GF_EXPORT int gf_lock_serving(gf_lock *lock);

/**
 * Called when the server asks this holder to step down for a planned
 * switchover (gf_lock_switchover()): stop accepting new work, finish what is
 * in flight, then gf_lock_release(); the first waiter is granted next. The
 * lock stays held until then. Runs on the thread that runs
 * gf_lock_process() (the watcher thread), so it must not call
 * gf_lock_release(), gf_lock_free() or gf_lock_stop_watch() itself: hand the
 * work to another thread. Without a hook the request is ignored (logged).
 */
typedef void (*gf_lock_step_down_fn)(gf_lock *lock, uint64_t epoch, void *userdata);
/** Install the step-down hook (NULL removes it). */
GF_EXPORT void gf_lock_set_step_down_fn(gf_lock *lock, gf_lock_step_down_fn fn, void *userdata);

struct gf_lock_proof;
/**
 * Called on the thread in gf_lock_acquire() when the lock server says this
 * waiter is next (@p next 1): the grant, of @p proof's epoch (@p proof is
 * that grant's fence proof, NULL when the server sent none), follows once
 * the server has written its state file. Work that needs the grant's
 * arrival but not the lock itself (an engine's GMS wake request) can start
 * now and overlap the write. @p next 0 says the grant will not come after
 * all (the connection broke first, or gf_lock_acquire() returns an error):
 * undo that work. Called again with 1 if the server tells it again (a state
 * write retried). Must not call gf_lock_* on @p lock. Unix and TCP lock
 * servers; the etcd backend never calls it.
 */
typedef void (*gf_lock_next_fn)(gf_lock *lock, int next, const struct gf_lock_proof *proof, void *userdata);
/** Install the next hook (NULL removes it). An acquire asks the server for
 *  LockNext only when it begins with a hook installed: install it before
 *  gf_lock_acquire(). */
GF_EXPORT void gf_lock_set_next_fn(gf_lock *lock, gf_lock_next_fn fn, void *userdata);

/** Processes one lock client may register with gf_lock_add_pid(). */
#define GF_LOCK_MAX_PIDS 64

/**
 * Register a further process of this engine (another rank, e.g. a tensor
 * parallel worker) with the lock: once this client holds the lock and its
 * connection goes away (its process died or closed it), the server grants
 * the next waiter only after this process has exited too, as it waits for
 * the client's own process (bounded by the server's exit-wait timeout).
 * The client opens a pidfd of @p pid and passes it over the unix socket
 * (SCM_RIGHTS): now when connected (waiting or holding), and again on
 * every new connection (each acquire, a reclaim after a server restart),
 * so registering before gf_lock_acquire() is the usual order and a standby
 * registers its ranks while it waits. When this returns 0 on a connected
 * client the registration is on its way ahead of anything that follows on
 * the connection, so the server has it before it can see the hang-up.
 * An explicit gf_lock_release() waits for no process: the caller vouches
 * that its ranks stopped using the GPU; a revoke waits for none either.
 * Registering @p pid again, or the caller's own pid, changes nothing
 * (returns 0); processes that exited are forgotten (they free their slot).
 * Errors: GF_ERR_INVALID_ARG (NULL lock, @p pid <= 0), GF_ERR_NOT_FOUND
 * (no process @p pid: it exited or never was), GF_ERR_TOO_BIG (already
 * GF_LOCK_MAX_PIDS live processes registered), GF_ERR_NOT_SUPPORTED (tcp://
 * and etcd locks: a pidfd cannot cross hosts, docs/lock.md says what fences
 * ranks there; or a kernel without pidfd_open, before Linux 5.3),
 * GF_ERR_IO (no pidfd: out of fds). Does not block longer
 * than one send on a connected socket. Thread-safe.
 */
GF_EXPORT int gf_lock_add_pid(gf_lock *lock, int pid);

/**
 * Connect (if needed) and block until the lock is granted, @p timeout_ms
 * passes (< 0: forever; 0: try once, i.e. one connection attempt of at most
 * 1 s and GF_ERR_TIMEOUT at once when the lock is held), or
 * gf_lock_interrupt() is called. A waiter whose
 * server restarts reconnects and keeps waiting. On success fills @p grant.
 * Errors: GF_ERR_TIMEOUT, GF_ERR_UNREACHABLE (server not reachable within the
 * reconnect time; on unix:// only before the server first took the
 * acquire: a waiter in line waits for a server that went away),
 * GF_ERR_INTERRUPTED (the wait was abandoned and the
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

/** A listening socket carried by the lock (see gf_lock_listeners()). */
struct gf_lock_listener {
	char name[64]; /**< the name given to the server (gf-lockd --listener NAME=URI) */
	int fd;        /**< a listening stream socket, blocking, close-on-exec */
};

/**
 * The listening sockets that came with the grant: duplicates of the lock
 * server's own (gf_lockd_add_listener()), so connections that arrived while
 * nobody held the lock wait in their backlog for this holder to accept them.
 * Sets *@p out to an array of *@p n entries (n is 0 when the server has none).
 * The lock object owns the array and the fds: they stay valid until
 * gf_lock_release(), gf_lock_free() or the next gf_lock_acquire(); dup() an fd
 * to keep it longer. A reclaim after a server restart keeps them (the server
 * adopts the same sockets). The file status flags are shared with the server
 * and every other holder's copy: the server makes them blocking, but an
 * earlier holder may have made them non-blocking (libmicrohttpd does), so
 * wait with poll() and treat EAGAIN from accept() as nothing to accept.
 * Call from the thread that acquired. Errors: GF_ERR_NOT_SUPPORTED on a
 * tcp:// lock (fds cannot cross hosts), GF_ERR_STATE when not held,
 * GF_ERR_INVALID_ARG.
 */
GF_EXPORT int gf_lock_listeners(const gf_lock *lock, const struct gf_lock_listener **out, size_t *n);

/**
 * The lock's T_fence in milliseconds: how long after the last renewal the
 * server heard of the holder still counts it as the holder may act. On
 * etcd:// the value set with gf_lock_set_lease() or, by default, half the
 * lease TTL; on tcp:// the heartbeat lease's (the server's advice at the
 * grant may shorten it); 0 on unix:// (no lease: the connection is the lock,
 * and its end releases). Something that must stop before the lock can pass
 * on (gfctl's guard) derives its deadline from this. GF_ERR_INVALID_ARG for
 * a NULL @p lock. Never blocks; thread-safe.
 */
GF_EXPORT int64_t gf_lock_fence_ms(const gf_lock *lock);
/**
 * How long this client has been without its lock server, in milliseconds:
 * 0 while connected (or idle, or while the server is up but has not taken it
 * back yet), else the time since the connection was lost (or the first
 * connect failed), once a connect found no server running (refused, or no
 * socket). On unix:// a holder (or a waiter that was in
 * line) keeps the lock (its place) past the reconnect time and retries until
 * the server returns (docs/design.md, decision 31), so a growing value is
 * the state "lock server unreachable, holding on". On tcp:// and etcd://
 * the lease decides as before; etcd reports 0. GF_ERR_INVALID_ARG for a NULL
 * @p lock. Never blocks; thread-safe.
 */
GF_EXPORT int64_t gf_lock_unreachable_ms(const gf_lock *lock);

/** Event-loop integration (sd-bus style): the fd to watch while held, -1 otherwise (e.g. while reconnecting: rely on the timeout). */
GF_EXPORT int gf_lock_get_fd(const gf_lock *lock);
/** poll() events to wait for on gf_lock_get_fd() (POLLIN); GF_ERR_INVALID_ARG for a NULL @p lock. */
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
/**
 * Start the built-in watcher thread now, parked, so that a later
 * gf_lock_start_watch() only wakes it: call it before gf_lock_acquire() and
 * a failover creates no thread between the grant and serving. Idempotent.
 * Errors: GF_ERR_INVALID_ARG (NULL), GF_ERR_IO (no thread).
 */
GF_EXPORT int gf_lock_prepare_watch(gf_lock *lock);
/**
 * Run the process loop on the built-in watcher thread while held (started
 * here unless gf_lock_prepare_watch() did). GF_ERR_STATE if not held, or
 * if a watch already runs.
 */
GF_EXPORT int gf_lock_start_watch(gf_lock *lock);
/**
 * Stop the watch: when this returns, the loop has ended and no hook runs
 * (called from the hook itself, it does not wait). The thread stays,
 * parked, for the next hold; gf_lock_free() ends it.
 */
GF_EXPORT void gf_lock_stop_watch(gf_lock *lock);

/**
 * One-shot status query: a JSON object with holder, epoch, waiters,
 * reconnect window and uptime (on etcd: holder, epoch, waiters, waiter_count,
 * prefix, revision, backend "etcd"; @p secret is the etcd password; ping on
 * etcd checks that a quorum answers a read). *json is malloc'd; free() it.
 */
GF_EXPORT int gf_lock_status_json(const char *uri, const void *secret, size_t secret_len,
				  int64_t timeout_ms, char **json);
/**
 * Admin request: revoke the grant of @p epoch (the current holder's), so the
 * server drops that holder without waiting for its process to exit and grants
 * the next waiter a higher epoch. The revoked holder's later requests are
 * refused; its lost hook fires when it notices. Used by the supervisor for a
 * holder that will not die (uninterruptible sleep). Allowed for the server's
 * admin uids (root and the server's own uid by default) on unix sockets, and
 * for authenticated peers over TCP. Blocks up to @p timeout_ms.
 * Errors: GF_ERR_STATE (@p epoch is not the current grant: nothing revoked),
 * GF_ERR_PERMISSION, GF_ERR_UNREACHABLE, GF_ERR_TIMEOUT, GF_ERR_PROTOCOL.
 */
GF_EXPORT int gf_lock_revoke(const char *uri, const void *secret, size_t secret_len, uint64_t epoch,
			     int64_t timeout_ms);
/**
 * Admin request: evict the waiting standby @p engine_id from the standby
 * pool, as the per-GPU budget does: its acquire returns GF_ERR_EVICTED (an
 * engine exits 73) and the server closes its connection. A pinned standby
 * may be evicted this way (the admin names it). The holder is not a standby:
 * revoke it instead. Allowed for the same admins as gf_lock_revoke().
 * Blocks up to @p timeout_ms. Errors: GF_ERR_INVALID_ARG (malformed id),
 * GF_ERR_STATE (no waiter has that id), GF_ERR_PERMISSION,
 * GF_ERR_NOT_SUPPORTED (etcd locks), GF_ERR_UNREACHABLE, GF_ERR_TIMEOUT,
 * GF_ERR_PROTOCOL.
 */
GF_EXPORT int gf_lock_evict(const char *uri, const void *secret, size_t secret_len, const char *engine_id,
			    int64_t timeout_ms);
/**
 * Readiness relay: is an engine Active (the lock's holder) for the GPU set
 * @p gpus (the holder declared every one of them; @p ngpus 0: any GPUs) and
 * the model @p model (NULL or "": any), and serving? Answered from the
 * server's state in one status query. A holder that declared it reports
 * (gf_lock_set_serving_report(), as engines do) is ready only once it
 * called gf_lock_serving(); one that did not counts as ready from its grant
 * ("serving": "unknown"; it may still be waking). Returns 1 (yes) or 0
 * (no), and when @p json is not NULL the answer as a malloc'd JSON object
 * ({"ready", "holder", "epoch", "holder_model", "serving" ("yes", "no",
 * "unknown" or null without a holder), "gpus", "model"}; free() it).
 * Blocks up to @p timeout_ms.
 * Errors: GF_ERR_INVALID_ARG (malformed UUID or model, more than 8 GPUs),
 * GF_ERR_UNREACHABLE, GF_ERR_TIMEOUT, GF_ERR_PERMISSION, GF_ERR_PROTOCOL.
 */
GF_EXPORT int gf_lock_ready_for(const char *uri, const void *secret, size_t secret_len, const char *const *gpus,
				size_t ngpus, const char *model, int64_t timeout_ms, char **json);
/**
 * Admin request: planned switchover. The server asks the holder (the grant
 * of @p epoch; 0: whoever holds the lock) to step down (its
 * gf_lock_step_down_fn), which then drains and releases, and the first
 * waiter is granted: no kill, no failure counted. Returns once the holder was
 * asked, not when it has released. Same permissions as gf_lock_revoke().
 * Blocks up to @p timeout_ms. Errors: GF_ERR_STATE (nobody holds the lock,
 * @p epoch is not the current grant, or no waiter would take over),
 * GF_ERR_PERMISSION, GF_ERR_UNREACHABLE, GF_ERR_TIMEOUT, GF_ERR_PROTOCOL.
 */
GF_EXPORT int gf_lock_switchover(const char *uri, const void *secret, size_t secret_len, uint64_t epoch,
				 int64_t timeout_ms);
/** Check that the server answers a handshake within @p timeout_ms. */
GF_EXPORT int gf_lock_ping(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms);

/** Bytes of a fence proof. */
#define GF_LOCK_PROOF_LEN 32

/**
 * What a holder shows a service fenced by the lock (a GMS started with
 * gf_gmsd_set_lock()): its grant's epoch and a value derived from the grant's
 * session token, which only the holder (and the lock server) knows. The
 * epoch alone is public (gfctl lock status shows it); the proof is not. It
 * cannot be turned back into the session token, so the fenced service cannot
 * reclaim the grant with it. On etcd the session token is the lease id, which
 * anyone who may read the lock's prefix can see (docs/lock.md).
 */
struct gf_lock_proof {
	uint64_t epoch;                       /**< the grant's epoch (0: no proof) */
	uint8_t token[GF_LOCK_PROOF_LEN];     /**< HMAC-SHA256 of the epoch under the session token */
};

/**
 * Derive the fence proof of @p grant (as filled by gf_lock_acquire()). Pure:
 * no I/O. A grant from a lock server (unix:// or tcp://) carries the proof
 * the server made ahead of the grant (gf_lock_grant.has_fence_proof), which
 * is copied; otherwise (etcd, or a grant built from its epoch and token) it
 * is computed. Errors: GF_ERR_INVALID_ARG (NULL, epoch 0), GF_ERR_NOMEM.
 */
GF_EXPORT int gf_lock_grant_proof(const struct gf_lock_grant *grant, struct gf_lock_proof *out);

/** The lock's holder, as one query saw it (gf_lock_query_result()). */
struct gf_lock_holder {
	char id[128];       /**< the holder's engine id; "" when nobody holds the lock */
	uint64_t epoch;     /**< the holder's epoch (0: nobody) */
	uint32_t pid;       /**< the holder's pid as the server sees it (0: unknown, e.g. on etcd) */
	int proof_valid;    /**< 1 when the query's proof is the current grant's; 0 when not or none was given */
};

typedef struct gf_lock_query gf_lock_query;

/**
 * Start a one-shot typed query of the lock's holder, for callers that must
 * not block their loop on it (a GMS's fence, a supervisor looking for a
 * stale grant): it runs on a thread of its own, and gf_lock_query_get_fd()
 * turns readable when it is done. @p proof (may be NULL) is checked by the
 * lock server against the current grant (gf_lock_holder.proof_valid).
 * @p timeout_ms: 0..a year. Errors: GF_ERR_INVALID_ARG, GF_ERR_NOMEM,
 * GF_ERR_IO (no thread); every error of the query itself comes from
 * gf_lock_query_result(). Free with gf_lock_query_free().
 */
GF_EXPORT int gf_lock_query_start(gf_lock_query **out, const char *uri, const void *secret, size_t secret_len,
				  const struct gf_lock_proof *proof, int64_t timeout_ms);
/** An fd that turns readable (POLLIN) when the query is done; the query's own, valid until its free. -1 for NULL. */
GF_EXPORT int gf_lock_query_get_fd(const gf_lock_query *q);
/**
 * The query's result: 0 and @p out (may be NULL) filled, GF_ERR_AGAIN while it runs, or
 * its error (GF_ERR_UNREACHABLE, GF_ERR_TIMEOUT, GF_ERR_PERMISSION,
 * GF_ERR_PROTOCOL, ...) with a detail. Does not block.
 */
GF_EXPORT int gf_lock_query_result(gf_lock_query *q, struct gf_lock_holder *out);
/**
 * Forget the query. Never blocks: a query still running finishes on its
 * own thread (within its timeout) and its result is dropped. NULL is a no-op.
 */
GF_EXPORT void gf_lock_query_free(gf_lock_query *q);

/** A gf_lock_revoke() in flight off the caller's loop (gf_lock_revoke_start()). */
typedef struct gf_lock_revoke_op gf_lock_revoke_op;

/**
 * Start gf_lock_revoke() of the grant of @p epoch on a thread of its own,
 * for callers that must not block their loop on it (a supervisor revoking a
 * holder that will not die); gf_lock_revoke_get_fd() turns readable when it
 * is done. The same call shape as gf_lock_query_start(), with a handle of
 * its own type: a revoke has no holder to read. @p timeout_ms: 0..a year.
 * Errors of the start: GF_ERR_INVALID_ARG (epoch 0, NULL argument, timeout),
 * GF_ERR_NOMEM, GF_ERR_IO (no thread); the revoke's own come from
 * gf_lock_revoke_result(). Free with gf_lock_revoke_free().
 */
GF_EXPORT int gf_lock_revoke_start(gf_lock_revoke_op **out, const char *uri, const void *secret,
				   size_t secret_len, uint64_t epoch, int64_t timeout_ms);
/** An fd that turns readable (POLLIN) when the revoke is done; the handle's own, valid until its free. -1 for NULL. */
GF_EXPORT int gf_lock_revoke_get_fd(const gf_lock_revoke_op *r);
/**
 * The revoke's result, as gf_lock_revoke() would have returned it (0: the
 * grant is revoked; GF_ERR_STATE, GF_ERR_PERMISSION, GF_ERR_UNREACHABLE,
 * GF_ERR_TIMEOUT, GF_ERR_PROTOCOL, ... with a detail; on a timeout or a lost
 * connection the revoke may still have taken effect), or GF_ERR_AGAIN while
 * it runs. Does not block.
 */
GF_EXPORT int gf_lock_revoke_result(gf_lock_revoke_op *r);
/**
 * Forget the revoke's handle. Never blocks: a revoke still running finishes
 * on its own thread (within its timeout; it may still take effect) and its
 * result is dropped. NULL is a no-op.
 */
GF_EXPORT void gf_lock_revoke_free(gf_lock_revoke_op *r);

/** @} */

/** @defgroup lockd Lock server
 *  The server core, embeddable in any process: configure with the setters,
 *  gf_lockd_start(), then either gf_lockd_run() or drive it from your own
 *  loop with gf_lockd_get_fd() / gf_lockd_get_timeout_ms() / gf_lockd_process().
 *  One thread drives a server; only gf_lockd_stop() may be called from
 *  another thread (or a signal handler).
 *
 *  Connections: a peer that does not finish its handshake, or a frame it
 *  began, within the handshake timeout is dropped; a peer whose socket
 *  buffer stays full for 50 ms while a reply waits is dropped; at most 16
 *  messages are read from one peer before the others are served; a unix
 *  peer sending heartbeats, or a TCP peer sending them much faster than the
 *  lease needs, is dropped. A unix peer whose process cannot be watched (no
 *  fd left for its pidfd) is refused with GF_ERR_BUSY rather than served
 *  without the exit wait.
 *  @{ */

typedef struct gf_lockd gf_lockd;

/** New unconfigured server (handshake timeout 3000 ms; allowed uids: the server's own and root). Free with gf_lockd_free(). Errors: GF_ERR_NOMEM, GF_ERR_IO. */
GF_EXPORT int gf_lockd_new(gf_lockd **out);
/** Close every connection and listener (unix socket files are removed) and free. NULL is a no-op. */
GF_EXPORT void gf_lockd_free(gf_lockd *d);
/** Listen on @p uri ("unix:///path" or "tcp://host:port"); repeatable; before start. */
GF_EXPORT int gf_lockd_add_listen(gf_lockd *d, const char *uri);
/**
 * A listening socket carried by the lock: the server binds @p uri
 * ("tcp://host:port" or "unix:///path") at gf_lockd_start(), keeps it for its
 * lifetime and passes a duplicate with every grant over a unix connection
 * (gf_lock_listeners()), so a failover refuses no connection: they wait in
 * the backlog for the next holder. @p name: 1..63 of letters, digits, '.',
 * '_', '-' (an sd_listen_fds name); unique; at most 16 listeners. A unix
 * listener's socket file is not removed when the server exits (a holder may
 * still serve from it). Restart: a listener still held by the holder on
 * record (busy) is adopted back from that holder's reclaim, or bound again
 * once the reconnect window ends. Before start. Errors: GF_ERR_INVALID_ARG,
 * GF_ERR_STATE (after start).
 */
GF_EXPORT int gf_lockd_add_listener(gf_lockd *d, const char *name, const char *uri);
/**
 * Like gf_lockd_add_listener() with an already listening stream socket
 * (e.g. from systemd socket activation, which keeps it across server
 * restarts); the server takes @p fd on success and makes it blocking and
 * close-on-exec. Errors: GF_ERR_INVALID_ARG (bad name, not a listening stream socket), GF_ERR_STATE.
 */
GF_EXPORT int gf_lockd_add_listener_fd(gf_lockd *d, const char *name, int fd);
/** Persist grants to @p path (JSON, written atomically before every grant); before start. */
GF_EXPORT int gf_lockd_set_state_file(gf_lockd *d, const char *path);
/** After a restart with a holder on record, only that holder may re-acquire for @p ms (default 10000; at most a year). */
GF_EXPORT int gf_lockd_set_reconnect_window(gf_lockd *d, int64_t ms);
/**
 * How long to wait for a released unix holder's process to exit before
 * granting the next waiter anyway (default 10000; at most a year). 0 disables the wait: the
 * socket close alone releases (what a server without pidfds falls back to).
 */
GF_EXPORT int gf_lockd_set_exit_wait_timeout(gf_lockd *d, int64_t ms);
/**
 * Allow unix peers with uid @p uid (SO_PEERCRED; repeatable, at most 64).
 * With an empty list the server's own uid and root may connect; once any
 * uid is added, exactly the listed uids may. TCP peers prove the shared
 * secret instead. A refused peer gets GF_ERR_PERMISSION in answer to its hello.
 */
GF_EXPORT int gf_lockd_add_allow_uid(gf_lockd *d, uint32_t uid);
/** Shared secret (copied). Mandatory when a TCP listener is configured; unix peers are not asked for it. */
GF_EXPORT int gf_lockd_set_secret(gf_lockd *d, const void *secret, size_t len);
/**
 * TCP lease: heartbeat interval and T_detect (re-grant after this long
 * without hearing the holder). Clients are told T_fence = T_detect / 2, so
 * the margin is T_detect / 2. GF_ERR_INVALID_ARG unless
 * detect_ms >= 3 * heartbeat_ms and detect_ms <= a year (defaults 1000 / 6000).
 */
GF_EXPORT int gf_lockd_set_lease(gf_lockd *d, int64_t heartbeat_ms, int64_t detect_ms);
/** A connection that has not finished its handshake, or a frame it began, after @p ms is dropped (default 3000; 1..86400000). */
GF_EXPORT int gf_lockd_set_handshake_timeout(gf_lockd *d, int64_t ms);
/**
 * Standby budget: at most @p n waiting engines per GPU (0, the default: no
 * budget). When a standby registers and a GPU it declared has more, the
 * least recently Active standbys on that GPU are evicted (never Active
 * counts as least recent; ties: the longest waiting; never the holder, a
 * pinned engine or one younger than the min standby age; the newcomer is a
 * candidate like the others): their acquire fails with GF_ERR_EVICTED and
 * the server closes their connection. Before gf_lockd_start(); GF_ERR_STATE after.
 */
GF_EXPORT int gf_lockd_set_max_standby_per_gpu(gf_lockd *d, uint32_t n);
/** Standbys registered less than @p ms ago are never evicted (default 0; at most a year). Before start. */
GF_EXPORT int gf_lockd_set_min_standby_age(gf_lockd *d, int64_t ms);
/**
 * Read the state file, open the listeners; raises the process's soft
 * RLIMIT_NOFILE to its hard limit (every peer is an fd, two for unix peers).
 * After this returns the sockets accept connections. Errors: GF_ERR_INVALID_ARG (no listener, TCP without
 * secret), GF_ERR_BUSY (another server uses the state file or socket, or a
 * listener's address while no holder is on record that could hand it back),
 * GF_ERR_IO, GF_ERR_PERMISSION.
 */
GF_EXPORT int gf_lockd_start(gf_lockd *d);
/** An fd that becomes readable when gf_lockd_process() has work (an epoll fd). */
GF_EXPORT int gf_lockd_get_fd(const gf_lockd *d);
/** Milliseconds until gf_lockd_process() must run even without events (-1: none). */
GF_EXPORT int gf_lockd_get_timeout_ms(const gf_lockd *d);
/** Handle every pending event and timer without blocking. Returns 0, or 1 once stopped. */
GF_EXPORT int gf_lockd_process(gf_lockd *d);
/** Run the event loop (what gf_lockd_process() does, blocking in epoll_wait between rounds) until gf_lockd_stop(). Blocks. Returns 0 or a negative error. */
GF_EXPORT int gf_lockd_run(gf_lockd *d);
/** Make gf_lockd_run() return. Thread-safe and async-signal-safe. */
GF_EXPORT void gf_lockd_stop(gf_lockd *d);
/** Status as JSON (same shape as gf_lock_status_json()); *json is malloc'd. */
GF_EXPORT int gf_lockd_status_json(gf_lockd *d, char **json);
/**
 * The server's state in the Prometheus text format (malloc'd in *@p text):
 * the lock, the pool's budget and evictions, per GPU totals
 * (gf_lock_pool_gpu_*{uuid=...}) and per engine declarations and last time
 * Active (gf_lock_engine_*{id=...,role=holder|standby}). Call on the thread
 * that drives the server. A rendering is reused for 1 s (the text is at most
 * that old), so scrapers asking at once cost the server's loop one rendering.
 * Errors: GF_ERR_INVALID_ARG, GF_ERR_NOMEM.
 */
GF_EXPORT int gf_lockd_metrics(gf_lockd *d, char **text);
/**
 * gf_lock_ready_for() answered in process: 1 or 0, and the JSON answer in
 * *@p json (malloc'd). Call on the thread that drives the server.
 * Errors: GF_ERR_INVALID_ARG, GF_ERR_NOMEM.
 */
GF_EXPORT int gf_lockd_ready_json(gf_lockd *d, const char *const *gpus, size_t ngpus, const char *model,
				  char **json);

/** @} */

#ifdef __cplusplus
}
#endif

#endif
