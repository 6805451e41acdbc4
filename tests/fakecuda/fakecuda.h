/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internals of the test driver shared by its source files (fakecuda.c has
 * the devices, contexts, allocations and virtual memory; other files add
 * entry points over the same state). Nothing here is exported from the
 * library: the build hides every symbol but the driver's.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FK_MAX_DEV 16
#define FK_GRAN (2u * 1024 * 1024)

struct CUctx_st {
	int dev;
	int refs;
};

/* One allocation handle of this process (created or imported). */
struct fk_alloc {
	CUmemGenericAllocationHandle h;
	int fd;      /* the open file that is the physical memory */
	size_t size;
	int dev;
	int creator; /* pid of the process that made it (from its file name) */
};

/* Guards all the driver's state below and in fakecuda.c. */
extern pthread_mutex_t fk_lock;
/* cuInit succeeded in this process. */
extern bool fk_initialized;

/* Integer environment knob @name, @dflt when unset or not a number. */
long long fk_env_ll(const char *name, long long dflt);
/* Devices visible to this process (after CUDA_VISIBLE_DEVICES). */
int fk_ndevices(void);
/* The code a call of entry point @name returns before doing anything:
 * CUDA_SUCCESS to proceed, else an injected fault (FAKECUDA_FAIL), the
 * sticky error of a faulted context, or a fork-unsafe child's refusal.
 * Does not check cuInit; FK_ENTRY does both. */
CUresult fk_fault(const char *name);
/* The allocation of handle @h, NULL if none. Call with fk_lock held. */
struct fk_alloc *fk_find_alloc(CUmemGenericAllocationHandle h);
/* The calling thread's current context, NULL if none. */
CUcontext fk_current(void);
/* Is @c a retained primary context? */
bool fk_ctx_valid(CUcontext c);

/* Start of every entry point: injected faults first, then cuInit. */
#define FK_ENTRY(name)                                     \
	do {                                               \
		CUresult f_ = fk_fault(name);              \
		if (f_ != CUDA_SUCCESS)                    \
			return f_;                         \
		if (!fk_initialized)                       \
			return CUDA_ERROR_NOT_INITIALIZED; \
	} while (0)

/* One entry of cuGetProcAddress's table: @fn is returned for requests of
 * @name at a cudaVersion >= @since (the newest such variant wins). */
struct fk_proc {
	const char *name;
	int since;
	void *fn;
};

/* Entry points defined in fakecuda_copy.c (copies, host allocations,
 * streams), when that file is part of the build. */
extern const struct fk_proc fk_copy_procs[] __attribute__((weak));
extern const size_t fk_copy_nprocs __attribute__((weak));

#endif
