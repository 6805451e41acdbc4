/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gpufailover/supervise.h
 * @brief The supervisor: restart policy, hung-engine detection and forced
 *        failover for engine processes (docs/design.md, decision 23).
 *
 * The supervisor (gf_supervisor_*) starts engine processes from a JSON
 * config, watches them with pidfds and their HTTP probes, and carries out
 * the actions of a pure restart policy (spawn, SIGTERM, SIGKILL the process
 * group, revoke the lock; docs/supervisor.md has its states).
 * `gf-supervise` is a thin main() around it.
 *
 * The periods and their defaults follow AppWrapper's (docs/supervisor.md maps
 * each to AppWrapper's name):
 * | period                    | default | meaning |
 * |---|---|---|
 * | admission                 | 60 s    | spawn → the probe server answers at all |
 * | warmup                    | 5 min   | spawn → /startup says 200 (Standby or Active reached) |
 * | failure_grace             | 60 s    | a failing probe, a missed deadline or an exit must persist this long before the reset |
 * | retry_pause               | 90 s    | pause between a reset and the next start |
 * | retry_limit               | 3       | resets allowed before Failed (0: never restart) |
 * | deletion_on_failure_grace | 0       | a failure with no retry left: the process is kept (state held) this long before SIGTERM |
 * | term_grace                | 30 s    | SIGTERM → SIGKILL of the process group (AppWrapper's ForcefulDeletionGracePeriod) |
 * | revoke_grace              | 10 min  | SIGKILL → confirmed exit; then the lock is revoked (`forceful_grace`: its deprecated name) |
 * | stable                    | 10 min  | healthy this long resets the retry counter |
 * | maximum                   | 24 h    | clamps every other period |
 */
#ifndef GPUFAILOVER_SUPERVISE_H
#define GPUFAILOVER_SUPERVISE_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup supervisor Supervisor (processes)
 *  @{ */

typedef struct gf_supervisor gf_supervisor;

/** New supervisor with no engines. Caller frees with gf_supervisor_free(). */
GF_EXPORT int gf_supervisor_new(gf_supervisor **out);
/** Stop watching (does not kill the children: stop them first with gf_supervisor_request_stop() and let gf_supervisor_run() return). NULL is a no-op. */
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
