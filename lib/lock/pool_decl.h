/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What an engine declares to the standby pool (its GPUs, its model, its
 * memory), as a pure module both sides use: the client checks and sends a
 * declaration with every acquire, the server reads it back and answers
 * readiness queries with it. The eviction rule is the server's
 * (lib/lockd/pool.h). See docs/lock.md.
 */
#ifndef GF_LOCK_POOL_DECL_H
#define GF_LOCK_POOL_DECL_H

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
