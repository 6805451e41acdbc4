/* SPDX-License-Identifier: Apache-2.0 */
/* The supervisor's restart policy (internal): a pure state machine per
 * supervised engine, fed with events (spawned, probe results, exit, time)
 * and answering with actions (spawn, SIGTERM, SIGKILL the process group,
 * revoke the lock). No I/O and no clock of its own, so every rule is
 * unit-tested without processes (tests/supervise/test_supervise_policy.c).
 *
 * The periods and their defaults are the config file's, tabled in
 * gpufailover/supervise.h and docs/supervisor.md.
 */
#ifndef GF_SUPERVISE_POLICY_H
#define GF_SUPERVISE_POLICY_H

#include <stddef.h>
#include <stdint.h>

/** The least pause after a failed spawn, whatever retry_pause says. */
#define GF_SV_SPAWN_RETRY_MIN_MS 100
/** The pause after failed spawns doubles up to this (or retry_pause if longer). */
#define GF_SV_SPAWN_RETRY_MAX_MS 5000

/** Periods of the restart policy, all in milliseconds except retry_limit. */
struct gf_sv_periods {
	int64_t admission_ms;
	int64_t warmup_ms;
	int64_t failure_grace_ms;
	int64_t retry_pause_ms;
	int64_t retry_limit;
	int64_t term_grace_ms;
	int64_t revoke_grace_ms;
	int64_t deletion_on_failure_grace_ms;
	int64_t stable_ms;
	int64_t maximum_ms;
};

/** Fill @p p with the defaults of the table above. */
void gf_sv_periods_default(struct gf_sv_periods *p);

/**
 * Validate @p p as a config load does: negative values are refused;
 * admission > warmup is refused; every period above maximum is clamped to it
 * (a clamp is reported in @p note, if given, as "key clamped to N ms").
 * On error, gf_error_detail() names the offending key (e.g. "admission").
 * Returns 0 or GF_ERR_INVALID_ARG. Pure; thread-safe.
 */
int gf_sv_periods_validate(struct gf_sv_periods *p, char *note, size_t note_len);

/** States of one supervised engine. */
enum gf_sv_state {
	GF_SV_STOPPED = 0,     /**< not running, not scheduled (initial, or stopped on request) */
	GF_SV_STARTING = 1,    /**< spawned; waiting for its probe server (admission period) */
	GF_SV_WARMING = 2,     /**< probe server up; waiting for /startup 200 (warmup period) */
	GF_SV_RUNNING = 3,     /**< healthy: /live answers 200 */
	GF_SV_UNHEALTHY = 4,   /**< a probe fails, a deadline passed or the process exited; failure grace running */
	GF_SV_TERMINATING = 5, /**< SIGTERM sent; waiting term_grace for the exit */
	GF_SV_KILLING = 6,     /**< SIGKILL sent to the process group; waiting revoke_grace */
	GF_SV_PAUSED = 7,      /**< exited (or revoked); retry pause before the next start */
	GF_SV_FAILED = 8,      /**< retry limit reached or terminal exit code: not restarted */
	GF_SV_SUCCEEDED = 9,   /**< exited 0 on its own: not restarted */
	GF_SV_HELD = 10,       /**< failed with no retry left; kept alive deletion_on_failure_grace for debugging */
};

/** Lower-case name of a state ("running", ...), as in status JSON and /metrics; "unknown" otherwise. */
const char *gf_sv_state_name(int state);

/** How an exit is classed. */
enum gf_sv_exit_class {
	GF_SV_EXIT_NONE = 0,      /**< no exit seen yet */
	GF_SV_EXIT_SUCCESS = 1,   /**< exit status 0 */
	GF_SV_EXIT_RETRYABLE = 2, /**< any other status or signal */
	GF_SV_EXIT_TERMINAL = 3,  /**< a status in the terminal list: never retried */
	GF_SV_EXIT_PLANNED = 4,   /**< exit during a planned switchover or stop: not a failure */
};

/** Name of an exit class ("retryable", ...). */
const char *gf_sv_exit_class_name(int cls);

/** Actions the policy asks the caller to carry out (a bit set). */
enum gf_sv_action {
	GF_SV_ACT_NONE = 0,
	GF_SV_ACT_SPAWN = 1 << 0,  /**< start the process now (the policy already counts it as Starting) */
	GF_SV_ACT_TERM = 1 << 1,   /**< send SIGTERM to the process */
	GF_SV_ACT_KILL = 1 << 2,   /**< send SIGKILL to the process group */
	GF_SV_ACT_REVOKE = 1 << 3, /**< revoke the engine's lock at the lock server (it will not die) */
};

/** Events fed to the policy. */
enum gf_sv_event {
	GF_SV_EV_START = 1,      /**< start (or restart after Stopped/Failed) on request */
	GF_SV_EV_SPAWN_FAILED = 3, /**< carrying out GF_SV_ACT_SPAWN failed (a retryable failure) */
	GF_SV_EV_PROBE = 4,      /**< a probe round finished: see struct gf_sv_probe */
	GF_SV_EV_EXITED = 5,     /**< the process exited: see exit_status / exit_signal */
	GF_SV_EV_TICK = 6,       /**< time passed (call at gf_sv_next_deadline) */
	GF_SV_EV_STOP = 7,       /**< stop on request: terminate, do not restart, no failure */
	GF_SV_EV_SWITCHOVER = 8, /**< a switchover was asked of the current process: its exit with
				      GF_ENGINE_EXIT_SWITCHOVER restarts at once, without a retry */
};

/** A probe round's results. */
struct gf_sv_probe {
	int reachable;  /**< the probe server answered at all */
	int startup_ok; /**< /startup answered 200 */
	int live_ok;    /**< /live answered 200 */
};

/** The policy's view of one supervised engine. Zero-initialise, then gf_sv_init(). */
struct gf_sv_engine {
	int state;                 /**< enum gf_sv_state */
	int64_t since_us;          /**< when the current state was entered */
	int64_t spawned_us;        /**< when the current process was spawned (0: none) */
	int64_t healthy_since_us;  /**< start of the current healthy run (0: not healthy) */
	int64_t retries;           /**< resets counted against retry_limit */
	int64_t restarts;          /**< processes started after the first, over the lifetime */
	int64_t spawn_failures;    /**< failed spawns in a row (the backoff), 0 once a process ran */
	int64_t pause_ms;          /**< the current Paused state's pause */
	int last_exit_status;      /**< exit status, or -1 */
	int last_exit_signal;      /**< terminating signal, or 0 */
	int last_exit_class;       /**< enum gf_sv_exit_class */
	int planned;               /**< a switchover was asked of the current process */
	int stopping;              /**< stop requested: do not restart */
	int revoked;               /**< the lock was revoked for the current process */
	int alive;                 /**< a process exists (spawned and not yet exited) */
	char exit_what[64];        /**< Unhealthy after an exit: that exit, for the reset's reason */
	char reason[160];          /**< why the engine is in its state (human-readable) */
};

/** Reset @p e to Stopped. */
void gf_sv_init(struct gf_sv_engine *e);

/** One event and the facts that come with it. */
struct gf_sv_input {
	int event;                       /**< enum gf_sv_event */
	const struct gf_sv_probe *probe; /**< read for GF_SV_EV_PROBE (NULL: ignored) */
	int exit_status;                 /**< GF_SV_EV_EXITED: exit status, -1 when killed by a signal */
	int exit_signal;                 /**< GF_SV_EV_EXITED: terminating signal, or 0 */
	const int *terminal;             /**< exit statuses classed terminal */
	size_t n_terminal;               /**< entries in @terminal */
	int64_t now_us;                  /**< CLOCK_MONOTONIC microseconds */
};

/**
 * Feed one event (@p in) to @p e under the periods @p p. Returns the
 * actions to carry out (enum gf_sv_action bits). Pure; none of the pointers
 * may be NULL (except in->probe).
 */
int gf_sv_step(struct gf_sv_engine *e, const struct gf_sv_periods *p, const struct gf_sv_input *in);

/** When the policy next needs a GF_SV_EV_TICK (monotonic µs), or INT64_MAX for never. Pure. */
int64_t gf_sv_next_deadline(const struct gf_sv_engine *e, const struct gf_sv_periods *p);

/** Whether the state wants probe rounds (Starting .. Unhealthy, with a process alive). */
int gf_sv_wants_probes(const struct gf_sv_engine *e);

#endif
