/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One process per rank for gf-c-engine --ranks N: rank 0 is the engine (the
 * lock holder, the probe server, the HTTP endpoint, device 0); ranks 1..N-1
 * are child processes, each a rank engine (gf_engine_set_rank()) with the
 * GMS of its own device, driven over a socketpair through the same steps
 * (load or import, sleep, wake with rank 0's epoch). Rank 0 registers their
 * pids with the lock (gf_engine_add_holder_pid()), so the lock passes on
 * only once every rank has exited. The engine is one unit: any rank's death
 * takes all of it down. Calls return 0 or a GF_ERR_* code, with the detail
 * in ranks_error().
 */
#ifndef GF_C_ENGINE_RANKS_H
#define GF_C_ENGINE_RANKS_H

#include <stdint.h>

#include "gpufailover.h"

struct ranks;

/* What a rank does with a GMS it was granted RW: load and commit. */
typedef int (*ranks_load_fn)(gf_engine *e, int device, gf_gms *gms, void *userdata);

/* What every rank engine is configured with. */
struct ranks_config {
	const char *id;     /* the engine's id (rank 0's) */
	int role;           /* GF_ENGINE_LOADER or GF_ENGINE_FOLLOWER */
	int64_t init_ms;    /* < 0: forever */
	int64_t remap_ms;   /* > 0 */
	int64_t waking_ms;  /* <= 0: the library's default */
	uint64_t kv_bytes;  /* private (KV) bytes per rank */
	ranks_load_fn load;
	void *load_ud;
};

/*
 * Forks ranks 1..@n-1 (rank i connects to @gms_uri[i] as @cfg says), before
 * the caller starts any thread. Each child dies with its parent
 * (PR_SET_PDEATHSIG) and never returns from this call. 0 or a GF_ERR_* code.
 */
int ranks_start(struct ranks **out, int n, const char *const *gms_uri, const struct ranks_config *cfg);
/* The process id of rank @i (1..n-1), 0 otherwise. */
int ranks_pid(const struct ranks *r, int i);
/* Waits until every rank has its weights and is asleep (unmapped). */
int ranks_wait_asleep(struct ranks *r);
/* Wakes every rank with rank 0's grant @epoch (gf_engine_wake_as_rank():
 * memory gate, KV memory, remap at the same addresses, GMS watch), waiting at
 * most @timeout_ms; each rank's weight checksum is then ranks_checksum(). */
int ranks_wake(struct ranks *r, uint64_t epoch, int64_t timeout_ms);
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
