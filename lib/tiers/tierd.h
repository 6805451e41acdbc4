/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS's tier worker: keeps the WARM and COLD directories, writes
 * snapshots on its own thread (the server's loop keeps serving), tracks the
 * phase of the current or last operation and reports the tiers as status
 * JSON and Prometheus text. The GMS owns the layout; for a snapshot
 * residency.c hands the worker one exported fd per allocation plus a filled
 * manifest, and the GMS keeps the layout from changing (it counts the job as
 * a reader) until the worker's fd turns readable and tierd_collect() says
 * the job is done. See docs/tiers.md.
 */
#ifndef GF_TIERS_TIERD_H
#define GF_TIERS_TIERD_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "snapshot.h"
#include "tiers.h"

struct tierd;

/* A worker for backend @kind, device @device (it opens its own gf_mem). Errors as gf_mem_open(), GF_ERR_NOMEM, GF_ERR_IO. */
int tierd_new(struct tierd **out, int kind, int device);
/* Waits for a running job, then frees. NULL is a no-op. */
void tierd_free(struct tierd *t);
/* The WARM and COLD directories (NULL: that tier is not kept), probed at once. GF_ERR_BUSY while a job runs. */
int tierd_set_dirs(struct tierd *t, const char *warm, const char *cold);
/* The directory of @tier (TIER_WARM or TIER_COLD), or NULL when not kept. */
const char *tierd_dir(const struct tierd *t, enum tier tier);
/* Readable (eventfd) when a job finished: call tierd_collect(). */
int tierd_get_fd(const struct tierd *t);

/*
 * Start a snapshot job writing @mf (taken over: the caller filled ids,
 * sizes, tags, metadata, generation and layout hash) from @fds (@mf->nallocs
 * fds, taken over and closed by the worker in every case) to @dir, or, when
 * @dir is NULL, to the WARM and then the COLD directory. Phase Pending at
 * once, Checkpointing on the thread, then Checkpointed or Failed with the
 * reason. Errors: GF_ERR_BUSY (a job runs), GF_ERR_INVALID_ARG (no
 * directory at all), GF_ERR_NOMEM.
 */
int tierd_snapshot_start(struct tierd *t, const char *dir, struct tiers_manifest *mf, int *fds);
/* The GMS dropped its committed layout: let go of the populated mapping of it
 * the jobs keep (host), which would otherwise hold its memory. Not while a job
 * runs (the layout cannot drop then). NULL is a no-op. */
void tierd_release_source(struct tierd *t);
/* Whether a job runs. */
bool tierd_busy(struct tierd *t);
/* Drain the fd; true when a job finished since the last call (the caller then lets the layout change again). */
bool tierd_collect(struct tierd *t);
/* Wait until no job runs (for shutdown and tests). */
void tierd_wait(struct tierd *t);

/*
 * Restore on the caller's thread from @dir, or when NULL from the best tier
 * present (WARM before COLD), into @m: phases Pending → Restoring →
 * Restored|Failed. On success *@mf_out and *@allocs_out are the caller's
 * (see tiers_snapshot_restore()) and *@from (may be NULL) tells the tier.
 * GF_ERR_NOT_FOUND when no tier holds a usable snapshot (the loader must
 * load; phase stays as it was), else as tiers_snapshot_restore(). GF_ERR_BUSY
 * while a snapshot job runs.
 */
int tierd_restore(struct tierd *t, const char *dir, gf_mem *m, struct tiers_manifest **mf_out,
		  gf_mem_alloc ***allocs_out, enum tier *from);

/*
 * The same on the worker's thread, into the worker's own backend handle, so
 * the GMS's loop keeps serving meanwhile: GF_ERR_BUSY (a job runs),
 * GF_ERR_NOMEM. Its end makes the fd readable; after tierd_collect(),
 * tierd_restoring() is true and tierd_restore_result() hands the
 * result over (each restore job's exactly once).
 */
int tierd_restore_start(struct tierd *t, const char *dir);
/* Whether the job collected last was a restore whose result was not taken yet. */
bool tierd_restoring(const struct tierd *t);
/* The result of the restore job collected last: 0 with *@mf_out and *@allocs_out the caller's, or its error. */
int tierd_restore_result(struct tierd *t, struct tiers_manifest **mf_out, gf_mem_alloc ***allocs_out,
			 enum tier *from);

/* The current or last operation (copy). */
void tierd_op(struct tierd *t, struct tiers_op *out);
/* Probe results of WARM and COLD as last refreshed (after set_dirs and after every job). */
void tierd_probe(struct tierd *t, enum tier tier, struct tiers_snap_probe *out);

/*
 * Status object: {"warm": TIER, "cold": TIER, "operation": OP} with TIER =
 * {"dir", "present", "bytes", "allocations", "generation", "age_seconds",
 * "error"} (null when the tier is not kept) and OP = {"kind", "phase",
 * "reason", "dir", "bytes", "seconds"} (null before the first operation).
 * New reference, NULL when out of memory.
 */
json_t *tierd_status_json(struct tierd *t);
/*
 * Append Prometheus text (base units) to @buf of @cap bytes at *@len:
 * gf_gms_tier_present{tier}, gf_gms_tier_bytes{tier},
 * gf_gms_tier_age_seconds{tier}, gf_gms_operation_phase{operation,phase}
 * (1 for the current phase), gf_gms_operation_bytes,
 * gf_gms_operation_seconds. Truncates at @cap.
 */
void tierd_metrics(struct tierd *t, char *buf, size_t cap, size_t *len);

/* Free bytes in @dir's file system, or its parent's while @dir does not exist yet (0 when neither answers). */
uint64_t tier_fs_free(const char *dir);
/* The facts tier_place() needs for a layout of @hash and @bytes, probed now (WARM @warm, COLD @cold; NULL: not kept). */
void tier_place_facts(const char *warm, const char *cold, const uint8_t hash[16], uint64_t bytes,
		      struct tiers_place_in *in);

#endif
