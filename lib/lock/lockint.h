/* SPDX-License-Identifier: Apache-2.0 */
/* What the lock's client (lib/lock) and server (lib/lockd) share: limits, the status renderer, the readiness rule. */
#ifndef GF_LOCKINT_H
#define GF_LOCKINT_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "gpufailover.pb.h"
#include "schema_limits.h"

#define GF_LOCK_TOKEN_LEN GF_LIMIT_TOKEN
#define GF_LOCK_ID_MAX GF_LIMIT_ID /* engine id buffer, including the NUL */
/* Lock messages are tiny: anything larger is refused before allocating. */
#define GF_LOCK_MAX_FRAME 2048

/* A LockStatus message as a JSON object (malloc'd text); status_json.c. */
int gf_lock_status_to_json(const gf_LockStatus *s, char **json);

/*
 * Readiness from a status (ready.c): 1 when the holder declared every GPU of
 * @gpus and serves @model (NULL or empty: any), 0 when not, or
 * GF_ERR_INVALID_ARG for a malformed UUID or model. @json (may be NULL)
 * receives the answer as a malloc'd JSON object.
 */
/* The holder's LockStatus.holder_serving as "yes", "no" or "unknown" (NULL without a holder). */
const char *gf_lock_serving_name(const gf_LockStatus *s);
int gf_lock_ready_from_status(const gf_LockStatus *s, const char *const *gpus, size_t ngpus, const char *model,
			      char **json);

struct gf_lock;
/*
 * gf_lock_start_watch() in @delay_ms, unless a gf_lock_start_watch() comes
 * first: the watcher thread is not woken now (client.c). For a holder whose
 * next steps are on a failover's path, with a lock that can go unwatched
 * that long. Errors as gf_lock_start_watch()'s.
 */
int gf_lock_start_watch_by(struct gf_lock *l, int64_t delay_ms);

#endif
