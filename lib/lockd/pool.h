/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The standby pool's eviction rule as a pure module (no sockets, no clocks):
 * which standby engines to evict when a GPU has more of them than its budget.
 * The lock server describes its waiters and holder; this function decides.
 * What an engine declares (and readiness) is in lib/lock/pool_decl.h. See
 * docs/lock.md.
 */
#ifndef GF_LOCKD_POOL_H
#define GF_LOCKD_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool_decl.h"

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

#endif
