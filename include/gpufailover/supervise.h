/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gpufailover/supervise.h
 * @brief The supervisor: restart policy, hung-engine detection and forced
 *        failover for engine processes (docs/design.md, decision 23).
 *
 * Two layers:
 * - the **policy** (gf_sv_*): a pure state machine per supervised engine,
 *   fed with events (spawned, probe results, exit, time) and answering with
 *   actions (spawn, SIGTERM, SIGKILL the process group, revoke the lock).
 *   It does no I/O and is unit-tested without processes;
 * - the **supervisor** (gf_supervisor_*): starts engine processes from a
 *   JSON config, watches them with pidfds and their HTTP probes, and carries
 *   out the policy's actions. `gf-supervise` is a thin main() around it.
 *
 * The periods and their defaults follow AppWrapper's (docs/supervisor.md):
 * | period            | default | meaning |
 * |---|---|---|
 * | admission         | 60 s    | spawn → the probe server answers at all |
 * | warmup            | 5 min   | spawn → /startup says 200 (Standby or Active reached) |
 * | failure_grace     | 60 s    | a failing probe (or a missed deadline) must persist this long |
 * | retry_pause       | 90 s    | pause between a reset and the next start |
 * | retry_limit       | 3       | resets allowed before Failed (0: never restart) |
 * | term_grace        | 30 s    | SIGTERM → SIGKILL of the process group |
 * | forceful_grace    | 10 min  | SIGKILL → confirmed exit; then the lock is revoked |
 * | stable            | 10 min  | healthy this long resets the retry counter |
 * | maximum           | 24 h    | clamps every other period |
 */
#ifndef GPUFAILOVER_SUPERVISE_H
#define GPUFAILOVER_SUPERVISE_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup supervise_policy Supervisor policy (pure)
 *  @{ */

/** Periods of the restart policy, all in milliseconds except retry_limit. */
struct gf_sv_periods {
	int64_t admission_ms;
	int64_t warmup_ms;
	int64_t failure_grace_ms;
	int64_t retry_pause_ms;
	int64_t retry_limit;
	int64_t term_grace_ms;
	int64_t forceful_grace_ms;
	int64_t stable_ms;
	int64_t maximum_ms;
};

/** Fill @p p with the defaults of the table above. */
GF_EXPORT void gf_sv_periods_default(struct gf_sv_periods *p);

/**
 * Validate @p p as a config load does: negative values are refused;
 * admission > warmup is refused; every period above maximum is clamped to it
 * (a clamp is reported in @p note, if given, as "key clamped to N ms").
 * On error, gf_error_detail() names the offending key (e.g. "admission").
 * Returns 0 or GF_ERR_INVALID_ARG. Pure; thread-safe.
 */
GF_EXPORT int gf_sv_periods_validate(struct gf_sv_periods *p, char *note, size_t note_len);

/** States of one supervised engine. */
enum gf_sv_state {
	GF_SV_STOPPED = 0,     /**< not running, not scheduled (initial, or stopped on request) */
	GF_SV_STARTING = 1,    /**< spawned; waiting for its probe server (admission period) */
	GF_SV_WARMING = 2,     /**< probe server up; waiting for /startup 200 (warmup period) */
	GF_SV_RUNNING = 3,     /**< healthy: /live answers 200 */
	GF_SV_UNHEALTHY = 4,   /**< a probe fails or a deadline passed; failure grace running */
	GF_SV_TERMINATING = 5, /**< SIGTERM sent; waiting term_grace for the exit */
	GF_SV_KILLING = 6,     /**< SIGKILL sent to the process group; waiting forceful_grace */
	GF_SV_PAUSED = 7,      /**< exited (or revoked); retry pause before the next start */
	GF_SV_FAILED = 8,      /**< retry limit reached or terminal exit code: not restarted */
	GF_SV_SUCCEEDED = 9,   /**< exited 0 on its own: not restarted */
};

/** Lower-case name of a state ("running", ...), as in status JSON and /metrics; "unknown" otherwise. */
GF_EXPORT const char *gf_sv_state_name(int state);

/** How an exit is classed. */
enum gf_sv_exit_class {
	GF_SV_EXIT_NONE = 0,      /**< no exit seen yet */
	GF_SV_EXIT_SUCCESS = 1,   /**< exit status 0 */
	GF_SV_EXIT_RETRYABLE = 2, /**< any other status or signal */
	GF_SV_EXIT_TERMINAL = 3,  /**< a status in the terminal list: never retried */
	GF_SV_EXIT_PLANNED = 4,   /**< exit during a planned switchover or stop: not a failure */
};

/** Name of an exit class ("retryable", ...). */
GF_EXPORT const char *gf_sv_exit_class_name(int cls);

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
	GF_SV_EV_SWITCHOVER = 8, /**< the next exit is a planned switchover: restart without a retry */
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
	int last_exit_status;      /**< exit status, or -1 */
	int last_exit_signal;      /**< terminating signal, or 0 */
	int last_exit_class;       /**< enum gf_sv_exit_class */
	int planned;               /**< a switchover or stop is in progress */
	int stopping;              /**< stop requested: do not restart */
	int revoked;               /**< the lock was revoked for the current process */
	int alive;                 /**< a process exists (spawned and not yet exited) */
	char reason[160];          /**< why the engine is in its state (human-readable) */
};

/** Reset @p e to Stopped. */
GF_EXPORT void gf_sv_init(struct gf_sv_engine *e);

/**
 * Feed one event at time @p now_us (CLOCK_MONOTONIC microseconds).
 * @p probe is read for GF_SV_EV_PROBE; @p exit_status / @p exit_signal for
 * GF_SV_EV_EXITED (status -1 when killed by a signal). @p terminal lists
 * exit statuses classed terminal (@p n_terminal entries).
 * Returns the actions to carry out (enum gf_sv_action bits). Pure.
 */
GF_EXPORT int gf_sv_step(struct gf_sv_engine *e, const struct gf_sv_periods *p, int event,
			 const struct gf_sv_probe *probe, int exit_status, int exit_signal,
			 const int *terminal, size_t n_terminal, int64_t now_us);

/** When the policy next needs a GF_SV_EV_TICK (monotonic µs), or INT64_MAX for never. Pure. */
GF_EXPORT int64_t gf_sv_next_deadline(const struct gf_sv_engine *e, const struct gf_sv_periods *p);

/** Whether the state wants probe rounds (Starting .. Unhealthy). */
GF_EXPORT int gf_sv_wants_probes(const struct gf_sv_engine *e);

/** @} */

/** @defgroup supervisor Supervisor (processes)
 *  @{ */

typedef struct gf_supervisor gf_supervisor;

/** New supervisor with no engines. Caller frees with gf_supervisor_free(). */
GF_EXPORT int gf_supervisor_new(gf_supervisor **out);
/** Stop watching (does not kill the children: call gf_supervisor_stop() and run first). NULL is a no-op. */
GF_EXPORT void gf_supervisor_free(gf_supervisor *sv);

/**
 * Load a JSON config (docs/supervisor.md has the schema) from @p path, or
 * from the string @p json when @p path is NULL. Unknown keys, wrong types,
 * negative or unordered periods are refused with GF_ERR_INVALID_ARG and a
 * detail that names the key ("engines[1].argv: expected an array of strings").
 * Only before gf_supervisor_start().
 */
GF_EXPORT int gf_supervisor_load_config(gf_supervisor *sv, const char *path, const char *json);

/** Start every engine of the config. Errors: GF_ERR_STATE (no config / started), GF_ERR_IO. */
GF_EXPORT int gf_supervisor_start(gf_supervisor *sv);

/**
 * Run until gf_supervisor_request_stop() and every engine has exited
 * (they are sent SIGTERM, then SIGKILL after term_grace). Blocks.
 * Returns 0, or a negative error if the loop itself fails.
 */
GF_EXPORT int gf_supervisor_run(gf_supervisor *sv);

/** Ask gf_supervisor_run() to stop every engine and return. Async-signal-safe. */
GF_EXPORT void gf_supervisor_request_stop(gf_supervisor *sv);

/**
 * Status as JSON: per engine its name, state, pid, reason, retries, retries
 * left, restarts, last exit status/signal/class and seconds in state.
 * *json is malloc'd; free() it. Thread-safe against gf_supervisor_run().
 */
GF_EXPORT int gf_supervisor_status_json(gf_supervisor *sv, char **json);

/**
 * The same as Prometheus text (gf_supervisor_* series labelled by engine).
 * *text is malloc'd; free() it. Thread-safe against gf_supervisor_run().
 */
GF_EXPORT int gf_supervisor_metrics(gf_supervisor *sv, char **text);

/** @} */

#ifdef __cplusplus
}
#endif

#endif
