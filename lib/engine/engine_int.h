/* SPDX-License-Identifier: Apache-2.0 */
/* Internals of the engine component, shared by its files: the state
 * machine and steps (engine.c), configuration (config.c), the loss policy
 * (loss.c), metrics and status (report.c), the startup watchdog and memory
 * gate (guards.c) and the probe server (engine_http.c). The engine calls the lock, GMS and memory APIs directly;
 * the only seam is the clock, so tests can move time. */
#ifndef GF_ENGINE_INT_H
#define GF_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "gpufailover.h"

#define GF_ENGINE_MAX_DEVICES 16
/* Backoff between private-memory OOM retries and memory gate polls: short
 * at first (a dying process gives its memory back within milliseconds to
 * seconds), capped so freed memory is noticed quickly. */
#define OOM_BACKOFF_FIRST_MS 5
#define OOM_BACKOFF_MAX_MS 100

/* Time as the engine sees it: monotonic microseconds, and a sleep (OOM
 * retry backoff). */
struct gf_engine_clock {
	int64_t (*now_us)(void);
	void (*sleep_ms)(int64_t ms);
};

struct engine_dev {
	char *uri;
	gf_mem *mem;
	gf_gms *gms;
	bool mapped;   /* weights mapped (after init_weights, again after remap) */
	bool watching; /* GMS watcher thread running */
	gf_mem_region *priv;
	bool kv_mapped;                  /* priv is backed by the GMS's KV pool */
	struct gf_gms_kv_map_info kv;    /* what the last map found */
};

/* The failover duration histogram of one phase (report.c). */
#define GF_ENGINE_HIST_PHASES 4
#define GF_ENGINE_HIST_BUCKETS 23
struct engine_hist {
	uint64_t bucket[GF_ENGINE_HIST_BUCKETS]; /* cumulative, as Prometheus counts them */
	uint64_t count;
	int64_t sum_us;
};

struct gf_engine {
	struct gf_engine_clock clock;

	/* Guards state, timestamps, metrics and hooks, which probe and watcher
	 * threads read. Configuration is written only in Init, by the thread
	 * that drives the steps. */
	pthread_mutex_t mu;
	int state;
	int64_t state_since_us;
	int64_t waking_since_us;
	int64_t acquire_start_us;
	uint64_t transitions;
	struct gf_engine_metrics m;
	struct engine_hist hist[GF_ENGINE_HIST_PHASES];
	int64_t created_us;
	char dead_cause[32];   /* why the engine is Dead, a short word ("" before) */
	char dead_reason[512]; /* and the full sentence */
	bool gate_waiting;     /* holding the lock, waiting for free memory */
	int64_t gate_us;       /* last acquire: grant until the memory gate opened; -1 before */
	gf_engine_health_fn health;
	void *health_ud;
	gf_engine_loss_fn loss;
	void *loss_ud;
	/* planned switchover (stepdown.c) */
	_Atomic(gf_engine_step_down_fn) step_down;
	void *_Atomic step_down_ud;

	char *lock_uri;
	uint8_t *lock_secret; /* wiped before it is freed */
	size_t lock_secret_len;
	char *id;
	int rank; /* >= 1: a rank engine (gf_engine_set_rank()), woken by gf_engine_wake_as_rank(); 0: holds the lock */
	/* Further processes of this engine registered with the lock
	 * (gf_engine_add_holder_pid()) before the lock client exists; under mu. */
	int holder_pids[GF_LOCK_MAX_PIDS];
	size_t nholder_pids;
	int role;
	int backend;
	int64_t waking_timeout_ms;
	int64_t remap_timeout_ms;
	int64_t init_timeout_ms; /* -1: forever */
	bool init_timeout_set;   /* else the role's default (gf_engine_init_timeout()) */
	int64_t lock_reconnect_ms; /* < 0: the lock client's default */
	int64_t loss_grace_ms;
	uint64_t private_bytes;
	/* The GMS's KV pool backs the private memory (gf_engine_set_kv_pool()). */
	bool kv_pool;
	uint64_t kv_block_bytes; /* 0: one block of the whole region */
	uint8_t kv_layout[16];
	struct gf_lock_proof kv_proof; /* the grant's, for the pool's map (epoch 0: none) */
	int first_device; /* ordinal of the device of GMS 0; GMS i is on first_device + i */
	int wake_priority; /* SCHED_FIFO priority of the wake, 0: none */
	bool settle_deferred; /* Active's readiness report and held lines wait for gf_engine_settle() */
	atomic_bool settle_pending;
	/* The stepping thread's policy before the wake raised it; only that
	 * thread reads or writes these. */
	bool boosted;
	int boost_old_policy;
	int boost_old_priority;
	int64_t startup_deadline_ms; /* <= 0: none */
	uint64_t memory_need;        /* free bytes per device the wake needs */
	bool memory_need_set;        /* else the need is private_bytes */
	/* Declared to the lock server's standby pool (pool.c). */
	char pool_gpus[8][48];
	size_t pool_ngpus;
	uint64_t asleep_bytes;
	bool pinned;
	char *model;
	char probe_addr[64];
	int probe_port;
	/* Set once by the stepping thread; reporting reads it from any thread. */
	_Atomic(struct gf_engine_http *) http;

	bool init_started; /* configuration is frozen from the first init_weights on */
	bool weights_ready;
	bool woken;
	_Atomic(gf_lock *) lock;
	bool lock_watching;
	atomic_bool lock_watch_due; /* the watcher's start put off at the grant (engine.c) */
	atomic_bool interrupted;
	/* gf_engine_interrupt() during Init: an eventfd that ends init_weights'
	 * wait in a GMS (the lock has no part in Init); init_done hands
	 * interrupts over to acquire() once the weights are ready. */
	int init_intr_fd;
	atomic_bool init_done;
	atomic_bool loss_called;
	/* The loss policy's own thread when a probe found the loss (loss.c), joined by free. */
	pthread_t fatal_thread;
	bool fatal_thread_running; /* under mu */
	int fatal_err;
	char fatal_cause[32];
	char fatal_reason[512];
	pthread_t watchdog;
	bool watchdog_running;
	atomic_bool watchdog_stop;

	int ndev;
	struct engine_dev dev[GF_ENGINE_MAX_DEVICES];

	/* Listener duplicates handed out by gf_engine_listener() (listener.c),
	 * under mu: the loss path stops them accepting. */
	struct engine_lsn {
		int fd;
		uint64_t dev, ino; /* the socket's identity, so a closed and reused number is left alone */
	} lsn_out[16];
	size_t nlsn_out;
	int lsn_dummy; /* what they are replaced with; made with the first, so the loss path needs no new fd */
};

/* Inspection calls take a const engine; the mutex is not part of its
 * logical state. */
static inline pthread_mutex_t *gf_engine_mu(const gf_engine *e)
{
	return (pthread_mutex_t *)&e->mu;
}

/* Replace the clock (tests). Also restarts the time in the current state. */
void gf_engine_set_clock(gf_engine *e, const struct gf_engine_clock *clock);

/* Enter Dead from any state (no-op when Dead already) for @cause (a short
 * word shown in status and metrics) and @reason (a sentence). Any thread. */
void gf_engine_die(gf_engine *e, const char *cause, const char *reason);

/* A fatal condition noticed off the stepping thread: Dead for @cause, then
 * the loss policy with @err and @reason, once per engine (loss.c). */
void gf_engine_fatal(gf_engine *e, int err, const char *cause, const char *reason);
/* The init timeout in force: the one set, else the role's default (a
 * follower waits GF_ENGINE_FOLLOWER_INIT_TIMEOUT_MS for a commit, a loader
 * forever); -1 is forever. */
int64_t gf_engine_init_timeout(const gf_engine *e);
/* Dead now, the loss policy as gf_engine_fatal() on a detached thread (the
 * caller's thread if none can be made): for callers that must return first,
 * such as a probe. */
void gf_engine_fatal_async(gf_engine *e, int err, const char *cause, const char *reason);

/* Make every listener duplicate handed out stop accepting (listener.c). Any thread. */
void gf_engine_stop_accepting(gf_engine *e);
/* Makes what gf_engine_stop_accepting() needs ahead (before the wait). */
void gf_engine_listener_prepare(gf_engine *e);

/* guards.c: the startup watchdog, the memory gate and the real sleep. */
void gf_engine_real_sleep_ms(int64_t ms);
/* Start the startup watchdog thread if a deadline is set (once). */
int gf_engine_start_watchdog(gf_engine *e);
/* Free bytes every device must have before the engine enters Waking. */
uint64_t gf_engine_memory_need(const gf_engine *e);
/* Run the calling thread at the wake priority, if one is set and the
 * platform permits it (else a debug line); gf_engine_unboost() puts its old
 * policy back (a no-op when not raised). */
void gf_engine_boost(gf_engine *e);
void gf_engine_unboost(gf_engine *e);
/* Declare the engine's pool resources on its new lock client (pool.c). */
int gf_engine_pool_apply(gf_engine *e, gf_lock *lock);
/* With the lock granted: wait until every device has the memory need free,
 * until @deadline_us; else Dead (cause memory_gate) and the error. */
int gf_engine_memory_gate(gf_engine *e, int64_t deadline_us);

/* Add the last takeover's phases to the histogram. Under e->mu. */
void gf_engine_record_failover(gf_engine *e);

/* The hooks the engine installs into the lock and GMS clients (loss.c). */
void gf_engine_lock_lost_hook(gf_lock *lock, int err, const char *detail, void *userdata);
/* The lock client's step-down hook: passes a planned switchover to the application. */
void gf_engine_lock_step_down_hook(gf_lock *lock, uint64_t epoch, void *userdata);
void gf_engine_gms_lost_hook(gf_gms *gms, int err, const char *detail, void *userdata);

/* Probe decision for a state, the pure table of docs/design.md, decision 2. @waking_expired
 * tells whether the waking timeout has passed; @healthy is the Active
 * health callback's answer; @device_lost whether a sticky driver error lost
 * a device's context (then /live and /ready fail in every state). */
int gf_engine_probe_decision(int state, int probe, int waking_expired, int healthy, int device_lost);

/* Probe server (engine_http.c). */
struct gf_engine_http;
int gf_engine_http_start(gf_engine *e, const char *address, int port, struct gf_engine_http **out);
int gf_engine_http_port(const struct gf_engine_http *h);
void gf_engine_http_stop(struct gf_engine_http *h);
/* What the probe server did to protect itself (all zero when not running). */
struct gf_engine_http_stats {
	unsigned open;         /* connections open and not cut */
	uint64_t cut_deadline; /* cut for not finishing a request within the deadline */
	uint64_t cut_evicted;  /* cut, oldest first, to make room for a new one */
};
void gf_engine_http_stats(struct gf_engine_http *h, struct gf_engine_http_stats *out);

/* 0 while @e may still be configured (Init, before init_weights); else the
 * error for @what (GF_ERR_INVALID_ARG for NULL, GF_ERR_STATE). config.c. */
int gf_engine_config_check(gf_engine *e, const char *what);
/* Wipe and free the lock secret (gf_engine_set_lock_secret()). */
void gf_engine_wipe_lock_secret(gf_engine *e);

/* The lock client's put-off watcher start (lib/lock/lockint.h). */
int gf_lock_start_watch_by(gf_lock *l, int64_t delay_ms);

#endif
