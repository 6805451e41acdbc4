/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One process per rank for gf-c-engine --ranks N: rank 0 is the engine (the
 * lock holder, the probe server, the HTTP endpoint, device 0); ranks 1..N-1
 * are child processes, each with the GMS of its own device, driven over a
 * socketpair through the same steps (load or import, sleep, wake). The
 * engine is one unit: any rank's death takes all of it down. Calls return 0
 * or a GF_ERR_* code, with the detail in ranks_error().
 */
#ifndef GF_C_ENGINE_RANKS_H
#define GF_C_ENGINE_RANKS_H

#include <stdint.h>

#include "gpufailover.h"

struct ranks;

/* What a rank does with a GMS it was granted RW: load and commit. */
typedef int (*ranks_load_fn)(gf_engine *e, int device, gf_gms *gms, void *userdata);

/*
 * Forks ranks 1..@n-1 (rank i connects to @gms_uri[i] as @role says, with
 * @init_ms as the connect timeout, < 0 forever), before the caller starts any
 * thread. Each child dies with its parent (PR_SET_PDEATHSIG) and never returns
 * from this call. 0 or a GF_ERR_* code.
 */
int ranks_start(struct ranks **out, int n, const char *const *gms_uri, int role, int64_t init_ms,
		int64_t remap_ms, ranks_load_fn load, void *load_ud);
/* Waits until every rank has its weights and is asleep (unmapped). */
int ranks_wait_asleep(struct ranks *r);
/* Wakes every rank (remap at the same addresses), waiting at most @timeout_ms;
 * each rank's weight checksum is then ranks_checksum(). */
int ranks_wake(struct ranks *r, int64_t timeout_ms);
/* Rank @i's weight checksum after the wake (hex), "" before. */
const char *ranks_checksum(const struct ranks *r, int i);
int ranks_count(const struct ranks *r);
/* The detail of the last failure of a ranks_* call. */
const char *ranks_error(void);
/*
 * Watches the ranks from a thread of its own: when any of them exits, @fn
 * runs once on that thread with the rank and its wait status, after every
 * other rank was killed.
 */
int ranks_watch(struct ranks *r, void (*fn)(int rank, int status, void *ud), void *ud);
/* Ends every rank (SIGKILL), reaps them, stops the watcher, frees. NULL is a no-op. */
void ranks_free(struct ranks *r);

#endif
