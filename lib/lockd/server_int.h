/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock server's own state, shared by its files: server.c (the lock:
 * grants, releases, exit waits, the state file, connections, timers),
 * server_conn.c (replies, the FIFO of waiters), server_pool.c (the standby
 * pool's bookkeeping around pool.c's rule) and server_report.c (status,
 * readiness, metrics).
 */
#ifndef GF_LOCKD_SERVER_INT_H
#define GF_LOCKD_SERVER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpufailover/lock.h"
#include "grant.h"
#include "listeners.h"
#include "pool.h"
#include "server.h"
#include "statefile.h"

/* Retry a failed state-file write this often, holding grants meanwhile. */
#define STORE_RETRY_US 1000000
/* TCP heartbeats a peer may send in a burst, and the fastest average pace
 * (one per min(heartbeat/8, 10 ms)): a flood is dropped, not served. */
#define HB_BURST 32

enum conn_role { R_NONE, R_WAITER, R_HOLDER };

/* A process registered with a connection (LockAddPids): another rank of its engine. */
struct reg_pid {
	int fd; /* pidfd */
	uint32_t pid;
};

/* One process the exit wait waits for, in the loop until it exits. */
struct exit_proc {
	struct gf_srv_watch w;
	int fd; /* pidfd; -1 once it exited (or the wait ended) */
	uint32_t pid;
};

/* Whom a holder going away leaves the next grant waiting for. */
enum exit_wait_mode {
	WAIT_NONE,  /* released on purpose or revoked: nobody */
	WAIT_RANKS, /* its own process is known to be gone: the processes it registered */
	WAIT_ALL,   /* its connection closed: its process and those it registered */
};

/* Per connection (the core's peer data). */
struct conn {
	struct gf_srv_peer *peer;
	struct gf_srv_watch pid_watch; /* the holder's pidfd in the loop */
	bool pid_watched;
	enum conn_role role;
	int64_t wait_deadline;      /* monotonic; INT64_MAX: forever */
	int64_t since_wall;
	int64_t next_hb;
	int64_t hb_credit_at;       /* heartbeat pacing: credit accrues since then */
	int hb_credit;
	uint32_t seq;               /* seq of the pending acquire, echoed in the grant */
	struct conn *wprev, *wnext; /* waiters FIFO */
	/* The standby pool: what the engine declared (NULL: nothing), when it
	 * registered (monotonic) and when it was last Active (wall clock, 0: never). */
	struct gf_pool_decl *decl;
	int64_t since_mono;
	int64_t last_active_us;
	uint64_t proc_start; /* its process's start time (unix peers; 0: unknown): who earned a recency */
	/* Readiness: the engine said it reports when it serves (LockServing),
	 * and whether it has, for its grant. */
	bool reports_serving, serving;
	bool takes_next; /* told LockNext before its grant */
	/* Further processes of this engine (LockAddPids): the exit wait of its
	 * grant waits for them too. Owned here until the wait takes them. */
	struct reg_pid *pids;
	size_t npids;
};

struct gf_lockd {
	struct gf_srv *srv;
	char *state_path;
	int state_lock_fd;
	/* Kept open so a write does not resolve the path again (a grant's latency). */
	int state_dirfd;
	char *state_name, *state_tmpname;
	int state_next_fd; /* the next store's temp file, created ahead (-1: none) */
	/* The next grant's session token, drawn while idle, not between a
	 * holder's exit and the next grant. */
	uint8_t next_token[GF_LOCK_TOKEN_LEN];
	bool next_token_ready;
	int64_t prep_at; /* the next grant's token, proof and temp file are made then (0: at once) */
	/* The next grant's fence proof, made with its token while idle (0: none yet). */
	struct gf_lock_proof next_proof;
	int64_t reconnect_window_ms, exit_wait_ms, heartbeat_ms, detect_ms;
	int64_t started_at;

	struct conn *whead, *wtail;
	size_t nwaiters;

	/* the lock */
	struct conn *holder;
	uint64_t epoch;            /* last epoch granted or on record */
	bool epochs_exhausted;     /* logged once: no epoch left to grant */
	struct gf_lock_state rec;  /* what the state file says (or would) */
	int64_t granted_at_wall;
	/* exit wait: processes of the released holder (its own, and those it
	 * registered) that have not exited yet; the wait lasts while any does */
	struct exit_proc exitp[1 + GF_LOCK_MAX_PIDS];
	size_t nexit;      /* entries in use (some may have exited: fd -1) */
	size_t exit_left;  /* of them, not exited yet; > 0: the exit wait is on */
	uint32_t exit_pid; /* the holder's own pid */
	char exit_id[GF_LOCK_ID_MAX];
	int64_t exit_deadline;
	/* reconnect window after a restart with a holder on record */
	bool window;
	int64_t window_deadline;
	/* the last run may have left a holder listening: a busy listener waits (listeners.h) */
	bool holder_may_listen;
	struct gf_lock_state prev;
	/* a failed state-file write holds grants until this time */
	int64_t store_retry_at;
	/* d->rec says "released" but is not on disk yet: settle() either
	 * writes the next grant over it or writes it. A crash in between leaves
	 * the old holder on record, which only costs a reconnect window. */
	bool release_unsaved;

	/* the "released" log line, written after the next grant is sent */
	struct release_log {
		bool pending;
		char id[GF_LOCK_ID_MAX];
		uint64_t epoch;
		uint32_t pid;
		char why[200];
		int64_t seen_us; /* when the release was seen: the line itself is written later */
	} release_log;
	/* The grant's line, held like the release's until the new holder had
	 * the CPU (settle writes both, the release's first). */
	struct grant_log {
		bool pending;
		bool reclaimed;
		bool tcp;
		char id[GF_LOCK_ID_MAX];
		uint64_t epoch;
		uint32_t pid;
		int64_t send_at; /* when the grant was handed to the socket */
	} grant_log;

	gf_Msg *msg; /* scratch reply: gf_Msg is large */

	/* the standby pool (pool.h) */
	struct gf_pool_policy pool;
	uint64_t evicted, over_budget;
	uint64_t store_failures; /* state-file writes that failed */
	bool warned_no_gpu; /* logged once: a standby outside the budget (no GPU declared) */
	/* When each engine id was last Active, so a standby that comes back
	 * keeps its place in the LRU order; bounded, the oldest entry goes.
	 * Only the process that was Active inherits the record (pid and start
	 * time, unix peers): an id, a uid or a transport is anyone's to reuse. */
	struct seen {
		char id[GF_LOCK_ID_MAX];
		int64_t last_active_us;
		uint32_t pid;
		uint64_t proc_start; /* 0: nobody inherits it */
	} *seen;
	size_t nseen;
	/* listening sockets handed to each holder (listeners.h) */
	struct gf_lsn_set *lsn;
	int64_t lsn_retry_at; /* a pending listener is bound again then (0: none) */
	/* a switchover asked this grant's holder to step down (0: none) */
	uint64_t step_down_epoch;
	/* the last /metrics text, reused for METRICS_REUSE_US: scrapes run on the loop */
	char *metrics;
	size_t metrics_len;
	int64_t metrics_at;
};

#define SEEN_MAX 1024

/* Per-GPU totals over the holder and every waiter (malloc'd array, in order of first appearance). */
struct pool_gpu {
	const char *uuid;
	uint32_t standbys;
	uint64_t asleep_bytes, wake_bytes_max;
	bool active;
};

/* server_conn.c */
/* TCP peers and, on unix sockets, root and the server's own uid. */
bool lockd_is_admin(const struct gf_srv_peer *p);
int lockd_reply(gf_lockd *d, struct conn *c, gf_Msg *m);
/* Send an error; the connection stays unless @close_after. Returns -1 if @c was closed. */
int lockd_reply_error(gf_lockd *d, struct conn *c, int code, const char *detail, bool close_after);
/* Take @c out of the FIFO of waiters (if it is in it). */
void lockd_waiter_unlink(gf_lockd *d, struct conn *c);

/* server.c: a holder's end, the status. */
void lockd_end_exit_wait(gf_lockd *d, const char *why);
void lockd_holder_gone(gf_lockd *d, struct conn *c, const char *why, enum exit_wait_mode mode);
void lockd_fill_status(gf_lockd *d, gf_LockStatus *s);

/* server_pool.c */
void lockd_pool_active_now(gf_lockd *d, struct conn *c);
int lockd_pool_take_decl(gf_lockd *d, struct conn *c, const gf_LockAcquire *a);
void lockd_pool_registered(gf_lockd *d, struct conn *c);
int lockd_pool_gpus(gf_lockd *d, struct pool_gpu **out, size_t *nout);
void lockd_pool_fill_status(gf_lockd *d, gf_LockStatus *s);

#endif
