/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The internal lock backend interface. lib/lock/client.c implements the
 * public gf_lock_* API once (fork safety, the watcher thread, the lost and
 * step-down hooks, the settings) over this table; socket.c (gf-lockd over
 * unix:// and tcp://) and etcd_backend.c (etcd:// and etcds://) only speak
 * their protocol. oneshot.c dispatches the one-shot calls the same way.
 */
#ifndef GF_LOCK_BACKEND_H
#define GF_LOCK_BACKEND_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpufailover/lock.h"
#include "lockint.h"
#include "pool_decl.h"

/* What one process() step noticed, for the façade to act on after it let go of the mutex. */
struct gf_lock_news {
	bool lost;          /* lost on this very call: the lost hook runs once */
	char detail[512];   /* why, when lost */
	uint64_t step_down; /* a switchover asked this epoch to step down (0: not) */
};

struct gf_lock_backend {
	const char *name; /* "socket" / "etcd" */
	/* Does @uri name this backend? The last backend takes what no other does. */
	bool (*matches)(const char *uri);

	/* Parse @uri and fill l->priv; l->id is set. Errors say what is wrong. */
	int (*open)(gf_lock *l, const char *uri);
	void (*free)(gf_lock *l);
	/* The settings, after the façade checked the common bounds. */
	int (*set_secret)(gf_lock *l, const void *secret, size_t len);
	/* Optional: the façade already stored the values in l. */
	int (*set_reconnect_timeout)(gf_lock *l, int64_t ms);
	int (*set_lease)(gf_lock *l, int64_t heartbeat_ms, int64_t fence_ms);

	/* Blocks on the caller's thread, without l->mu; returns early on an
	 * l->intr_fd event (GF_ERR_INTERRUPTED). */
	int (*acquire)(gf_lock *l, int64_t timeout_ms, struct gf_lock_grant *grant);
	/* Without l->mu (the backend takes it where it needs it); the watch is stopped. */
	int (*release)(gf_lock *l);
	/* With l->mu held: read, heartbeat, reconnect, notice a loss. 0, or the
	 * error; a loss noticed now sets news->lost (and returns GF_ERR_LOCK_LOST). */
	int (*process)(gf_lock *l, struct gf_lock_news *news);
	/* With l->mu held. */
	int (*get_fd)(gf_lock *l);
	int (*get_timeout_ms)(gf_lock *l);
	int64_t (*fence_ms)(const gf_lock *l); /* T_fence, 0 when there is no lease */
	/* Lock-free queries (atomics): callable from any thread and from the hooks. */
	int64_t (*unreachable_ms)(const gf_lock *l); /* optional: how long the server has been out of reach */
	uint64_t (*epoch)(const gf_lock *l);
	int (*is_held)(const gf_lock *l);
	/* Optional (NULL: GF_ERR_NOT_SUPPORTED): the listeners that came with the grant. */
	int (*listeners)(const gf_lock *l, const struct gf_lock_listener **out, size_t *n);
	/* In a fork child: drop what is the parent's (its connection, its lease) without touching it. */
	void (*forked)(gf_lock *l);

	/* Optional (NULL: GF_ERR_NOT_SUPPORTED): tell the server the holder serves. Takes l->mu. */
	int (*serving)(gf_lock *l);
	/* Optional (NULL: GF_ERR_NOT_SUPPORTED): register another process of the engine (pid > 0). Any thread. */
	int (*add_pid)(gf_lock *l, int pid);

	/* One-shot calls on a connection of their own (oneshot.c). */
	int (*ping)(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms);
	int (*status_json)(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, char **json);
	/* The holder as typed fields; @proof (may be NULL) is checked against the current grant. */
	int (*holder)(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms,
		      const struct gf_lock_proof *proof, struct gf_lock_holder *out);
	/* Optional (NULL: GF_ERR_NOT_SUPPORTED): one request of gf-lockd's own
	 * (readiness, revoke, switchover); @m is the request, then the reply. */
	int (*call)(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, gf_Msg *m,
		    pb_size_t want, const char *what);
};

/* The façade's object; the backend's own state hangs off priv. */
struct gf_lock {
	pthread_mutex_t mu;
	const struct gf_lock_backend *be;
	void *priv;
	char id[GF_LOCK_ID_MAX];
	int64_t reconnect_ms, hb_ms, fence_ms;
	gf_lock_lost_fn lost_fn;
	void *lost_ud;
	struct gf_pool_decl decl; /* sent with every acquire */
	/* gf_lock_set_serving_report(), and whether this grant serves already
	 * (gf_lock_serving(); a reclaim says so again). Guarded by mu. */
	bool reports_serving, serving;
	gf_lock_step_down_fn step_down_fn;
	gf_lock_next_fn next_fn; /* called on the acquiring thread (socket backend) */
	void *next_ud;
	void *step_down_ud;
	int intr_fd; /* gf_lock_interrupt() */
	/*
	 * The watcher: one thread, started by gf_lock_prepare_watch() (the
	 * engine does it before waiting, so a wake creates no thread) or by the
	 * first gf_lock_start_watch(), and parked between holds: in a poll of
	 * watch_wake_fd (a start, or the end) and watch_timer_fd (a start put
	 * off by gf_lock_start_watch_by(), due). wmu guards the w_* flags;
	 * watch_stop_fd ends a watch loop; wcond tells of a loop's end.
	 */
	pthread_mutex_t wmu;
	pthread_cond_t wcond;
	pthread_t watcher;
	bool w_started, w_quit;
	bool watching; /* armed: the loop runs (or is about to) */
	bool w_due;    /* a start put off: the loop runs when watch_timer_fd fires, or at the next start */
	bool w_active; /* the thread is inside the loop */
	int watch_stop_fd;
	int watch_wake_fd, watch_timer_fd;
	struct gf_lock *lnext, *lprev;
};

extern const struct gf_lock_backend gf_lock_socket_backend;
extern const struct gf_lock_backend gf_lock_etcd_backend;

/* The backend for @uri (etcd:// and etcds://: etcd; anything else: the socket protocol). */
const struct gf_lock_backend *gf_lock_backend_for(const char *uri);

/* Did the interrupt eventfd fire (and reset it)? */
bool gf_lock_interrupted(gf_lock *l);

#endif
