/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The standby pool's rules as a pure module (no sockets, no clocks): which
 * standby engines to evict when a GPU has more of them than its budget, and
 * whether an engine is Active for a GPU set or a model. The lock server
 * describes its waiters and holder; these functions decide. See docs/lock.md.
 */
#ifndef GF_LOCK_POOL_H
#define GF_LOCK_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gpufailover.pb.h"


/* What one engine declared on connect. */
struct gf_pool_decl {
	uint8_t ngpus;
	bool pinned;
	char gpus[GF_POOL_MAX_GPUS][GF_POOL_UUID_MAX];
	char model[128];
	uint64_t wake_bytes;   /* private memory the wake needs (KV ...) */
	uint64_t asleep_bytes; /* memory it keeps while asleep */
};

/* One engine as the eviction rule sees it. */
struct gf_pool_member {
	const struct gf_pool_decl *decl; /* NULL: declared nothing (on no GPU, never evicted) */
	bool holder;                     /* holds the lock: never evicted, not a standby */
	int64_t since_us;                /* when it registered as a standby (monotonic) */
	int64_t last_active_us;          /* when it last held the lock (wall clock); 0: never */
};

struct gf_pool_policy {
	uint32_t max_standby_per_gpu; /* 0: no budget */
	int64_t min_standby_age_us;   /* younger standbys are never evicted */
};

/*
 * After member @newcomer registered: the standbys to evict so that no GPU
 * the newcomer declared has more than the budget of standbys. On each such
 * GPU the least recently Active standby goes first (never Active counts as
 * oldest; ties: the one waiting longest, so of two never Active the
 * newcomer stays), never the holder, a pinned engine or one younger than
 * min_standby_age. The newcomer is a candidate like any other: a pool full
 * of engines Active more recently than it keeps them (min_standby_age
 * protects a fresh one).
 * Writes up to @cap member indexes to @victims and returns how many.
 * *@short_by (if not NULL) is how many standbys remain over budget on the
 * worst GPU because nothing more was evictable.
 */
size_t gf_pool_choose_evictions(const struct gf_pool_member *m, size_t n, size_t newcomer,
				const struct gf_pool_policy *p, int64_t now_us, size_t *victims, size_t cap,
				size_t *short_by);

/* Whether @d declared GPU @uuid (canonical form). */
bool gf_pool_on_gpu(const struct gf_pool_decl *d, const char *uuid);

/*
 * Readiness: whether the holder's declaration answers a query for the GPU
 * set @gpus (every one of them declared by the holder; none: any) and
 * @model (NULL or empty: any). @holder_decl NULL means no holder.
 */
bool gf_pool_ready(const struct gf_pool_decl *holder_decl, const char (*gpus)[GF_POOL_UUID_MAX], size_t ngpus,
		   const char *model);

/* A LockAcquire's pool fields into @out: 0, or GF_ERR_INVALID_ARG naming the bad field. */
int gf_pool_decl_from_acquire(const gf_LockAcquire *a, struct gf_pool_decl *out);

#endif
