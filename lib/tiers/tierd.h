/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS's tier worker: keeps the WARM and COLD directories, writes
 * snapshots on its own thread (the server's loop keeps serving), tracks the
 * phase of the current or last operation and reports the tiers as status
 * JSON and Prometheus text. The GMS owns the layout; for a snapshot
 * residency.c hands the worker one exported fd per allocation plus a filled
 * manifest, and the GMS keeps the layout from changing (it counts the job as
 * a reader) until the worker's fd turns readable and gms_tierd_collect() says
 * the job is done. See docs/tiers.md.
 */
#ifndef GF_GMS_TIERD_H
#define GF_GMS_TIERD_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "snapshot.h"
#include "tiers.h"

struct gms_tierd;

/* A worker for backend @kind, device @device (it opens its own gf_mem). Errors as gf_mem_open(), GF_ERR_NOMEM, GF_ERR_IO. */
int gms_tierd_new(struct gms_tierd **out, int kind, int device);
/* Waits for a running job, then frees. NULL is a no-op. */
void gms_tierd_free(struct gms_tierd *t);
/* The WARM and COLD directories (NULL: that tier is not kept), probed at once. GF_ERR_BUSY while a job runs. */
int gms_tierd_set_dirs(struct gms_tierd *t, const char *warm, const char *cold);
/* The directory of @tier (GMS_TIER_WARM or GMS_TIER_COLD), or NULL when not kept. */
const char *gms_tierd_dir(const struct gms_tierd *t, enum gms_tier tier);
/* Readable (eventfd) when a job finished: call gms_tierd_collect(). */
int gms_tierd_get_fd(const struct gms_tierd *t);

/*
 * Start a snapshot job writing @mf (taken over: the caller filled ids,
 * sizes, tags, metadata, generation and layout hash) from @fds (@mf->nallocs
 * fds, taken over and closed by the worker in every case) to @dir, or, when
 * @dir is NULL, to the WARM and then the COLD directory. Phase Pending at
 * once, Checkpointing on the thread, then Checkpointed or Failed with the
 * reason. Errors: GF_ERR_BUSY (a job runs), GF_ERR_INVALID_ARG (no
 * directory at all), GF_ERR_NOMEM.
 */
int gms_tierd_snapshot_start(struct gms_tierd *t, const char *dir, struct gms_manifest *mf, int *fds);
/* The GMS dropped its committed layout: let go of the populated mapping of it
 * the jobs keep (host), which would otherwise hold its memory. Not while a job
 * runs (the layout cannot drop then). NULL is a no-op. */
void gms_tierd_release_source(struct gms_tierd *t);
/* Whether a job runs. */
bool gms_tierd_busy(struct gms_tierd *t);
/* Drain the fd; true when a job finished since the last call (the caller then lets the layout change again). */
bool gms_tierd_collect(struct gms_tierd *t);
/* Wait until no job runs (for shutdown and tests). */
void gms_tierd_wait(struct gms_tierd *t);

/*
 * Restore on the caller's thread from @dir, or when NULL from the best tier
 * present (WARM before COLD), into @m: phases Pending → Restoring →
 * Restored|Failed. On success *@mf_out and *@allocs_out are the caller's
 * (see gms_snapshot_restore()) and *@from (may be NULL) tells the tier.
 * GF_ERR_NOT_FOUND when no tier holds a usable snapshot (the loader must
 * load; phase stays as it was), else as gms_snapshot_restore(). GF_ERR_BUSY
 * while a snapshot job runs.
 */
int gms_tierd_restore(struct gms_tierd *t, const char *dir, gf_mem *m, struct gms_manifest **mf_out,
		      gf_mem_alloc ***allocs_out, enum gms_tier *from);

/*
 * The same on the worker's thread, into the worker's own backend handle, so
 * the GMS's loop keeps serving meanwhile: GF_ERR_BUSY (a job runs),
 * GF_ERR_NOMEM. Its end makes the fd readable; after gms_tierd_collect(),
 * gms_tierd_restoring() is true and gms_tierd_restore_result() hands the
 * result over (each restore job's exactly once).
 */
int gms_tierd_restore_start(struct gms_tierd *t, const char *dir);
/* Whether the job collected last was a restore whose result was not taken yet. */
bool gms_tierd_restoring(const struct gms_tierd *t);
/* The result of the restore job collected last: 0 with *@mf_out and *@allocs_out the caller's, or its error. */
int gms_tierd_restore_result(struct gms_tierd *t, struct gms_manifest **mf_out, gf_mem_alloc ***allocs_out,
			     enum gms_tier *from);

/* The current or last operation (copy). */
void gms_tierd_op(struct gms_tierd *t, struct gms_op *out);
/* Probe results of WARM and COLD as last refreshed (after set_dirs and after every job). */
void gms_tierd_probe(struct gms_tierd *t, enum gms_tier tier, struct gms_snap_probe *out);

/*
 * Status object: {"warm": TIER, "cold": TIER, "operation": OP} with TIER =
 * {"dir", "present", "bytes", "allocations", "generation", "age_seconds",
 * "error"} (null when the tier is not kept) and OP = {"kind", "phase",
 * "reason", "dir", "bytes", "seconds"} (null before the first operation).
 * New reference, NULL when out of memory.
 */
json_t *gms_tierd_status_json(struct gms_tierd *t);
/*
 * Append Prometheus text (base units) to @buf of @cap bytes at *@len:
 * gf_gms_tier_present{tier}, gf_gms_tier_bytes{tier},
 * gf_gms_tier_age_seconds{tier}, gf_gms_operation_phase{operation,phase}
 * (1 for the current phase), gf_gms_operation_bytes,
 * gf_gms_operation_seconds. Truncates at @cap.
 */
void gms_tierd_metrics(struct gms_tierd *t, char *buf, size_t cap, size_t *len);

/* Free bytes in @dir's file system, or its parent's while @dir does not exist yet (0 when neither answers). */
uint64_t gms_tier_fs_free(const char *dir);
/* The facts gms_tier_place() needs for a layout of @hash and @bytes, probed now (WARM @warm, COLD @cold; NULL: not kept). */
void gms_tier_place_facts(const char *warm, const char *cold, const uint8_t hash[16], uint64_t bytes,
			  struct gms_place_in *in);

#endif
