/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The test driver's copy engine: pinned host memory, streams, events and
 * asynchronous copies between host memory and "device addresses" (host
 * addresses in the driver's reservations, see fakecuda.c).
 *
 * Asynchronous copies are queued on their stream and run only when
 * something waits for them (cuEventSynchronize on a later event,
 * cuStreamSynchronize, cuStreamDestroy), in stream order. A caller that
 * reads a staging buffer before waiting, or refills one whose copy has not
 * been waited for, sees the wrong bytes, which the checksums of the tests
 * then catch: the laziness is the point.
 *
 * Fault knob (read on every call):
 *   FAKECUDA_COPY_FAIL=N   the Nth asynchronous copy of the process fails
 *                          with CUDA_ERROR_UNKNOWN (counted from 1)
 */
#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fakecuda_copy.h"

struct fk_copy {
	void *dst;
	const void *src;
	size_t n;
};

struct CUstream_st {
	struct fk_copy *ops;
	size_t nops, cap, done; /* ops[done..nops) are queued, not yet run */
};

struct CUevent_st {
	CUstream stream;
	size_t upto; /* the copies of @stream before this mark */
};

static pthread_mutex_t copy_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long copies_issued;

struct pinned {
	void *p;
	size_t size;
	struct pinned *next;
};
static struct pinned *pinned_list;

static CUresult run_until(CUstream s, size_t upto)
{
	while (s->done < upto && s->done < s->nops) {
		struct fk_copy *c = &s->ops[s->done++];
		memcpy(c->dst, c->src, c->n);
	}
	return CUDA_SUCCESS;
}

static CUresult fk_cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
	(void)flags;
	if (!pp || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct pinned *e = malloc(sizeof(*e));
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!e || p == MAP_FAILED) {
		free(e);
		if (p != MAP_FAILED)
			munmap(p, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	e->p = p;
	e->size = size;
	pthread_mutex_lock(&copy_lock);
	e->next = pinned_list;
	pinned_list = e;
	pthread_mutex_unlock(&copy_lock);
	*pp = p;
	return CUDA_SUCCESS;
}

static CUresult fk_cuMemFreeHost(void *p)
{
	pthread_mutex_lock(&copy_lock);
	for (struct pinned **pe = &pinned_list; *pe; pe = &(*pe)->next)
		if ((*pe)->p == p) {
			struct pinned *e = *pe;
			*pe = e->next;
			pthread_mutex_unlock(&copy_lock);
			munmap(e->p, e->size);
			free(e);
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&copy_lock);
	return CUDA_ERROR_INVALID_VALUE;
}

static CUresult fk_cuStreamCreate(CUstream *ps, unsigned int flags)
{
	(void)flags;
	if (!ps)
		return CUDA_ERROR_INVALID_VALUE;
	*ps = calloc(1, sizeof(**ps));
	return *ps ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fk_cuStreamSynchronize(CUstream s)
{
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&copy_lock);
	CUresult r = run_until(s, s->nops);
	pthread_mutex_unlock(&copy_lock);
	return r;
}

static CUresult fk_cuStreamDestroy(CUstream s)
{
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	/* The driver finishes queued work of a destroyed stream. */
	fk_cuStreamSynchronize(s);
	free(s->ops);
	free(s);
	return CUDA_SUCCESS;
}

static CUresult fk_cuEventCreate(CUevent *pe, unsigned int flags)
{
	(void)flags;
	if (!pe)
		return CUDA_ERROR_INVALID_VALUE;
	*pe = calloc(1, sizeof(**pe));
	return *pe ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fk_cuEventDestroy(CUevent e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	free(e);
	return CUDA_SUCCESS;
}

static CUresult fk_cuEventRecord(CUevent e, CUstream s)
{
	if (!e || !s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&copy_lock);
	e->stream = s;
	e->upto = s->nops;
	pthread_mutex_unlock(&copy_lock);
	return CUDA_SUCCESS;
}

static CUresult fk_cuEventSynchronize(CUevent e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&copy_lock);
	CUresult r = e->stream ? run_until(e->stream, e->upto) : CUDA_SUCCESS;
	pthread_mutex_unlock(&copy_lock);
	return r;
}

static CUresult enqueue(CUstream s, void *dst, const void *src, size_t n)
{
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!dst || !src)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&copy_lock);
	long fail_at = 0;
	const char *f = getenv("FAKECUDA_COPY_FAIL");
	if (f && *f)
		fail_at = strtol(f, NULL, 10);
	if (fail_at > 0 && ++copies_issued == (unsigned long)fail_at) {
		pthread_mutex_unlock(&copy_lock);
		return CUDA_ERROR_UNKNOWN;
	}
	if (s->nops == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 16;
		struct fk_copy *ops = realloc(s->ops, cap * sizeof(*ops));
		if (!ops) {
			pthread_mutex_unlock(&copy_lock);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		s->ops = ops;
		s->cap = cap;
	}
	s->ops[s->nops++] = (struct fk_copy){ .dst = dst, .src = src, .n = n };
	pthread_mutex_unlock(&copy_lock);
	return CUDA_SUCCESS;
}

static CUresult fk_cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	return enqueue(s, dst, (const void *)(uintptr_t)src, n);
}

static CUresult fk_cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	return enqueue(s, (void *)(uintptr_t)dst, src, n);
}

static const struct {
	const char *name;
	void *fn;
} copy_procs[] = {
#define P(n) { #n, (void *)fk_##n }
	P(cuMemHostAlloc), P(cuMemFreeHost), P(cuStreamCreate), P(cuStreamSynchronize), P(cuStreamDestroy),
	P(cuEventCreate), P(cuEventDestroy), P(cuEventRecord), P(cuEventSynchronize), P(cuMemcpyDtoHAsync),
	P(cuMemcpyHtoDAsync),
#undef P
};

void *fakecuda_copy_proc(const char *symbol)
{
	for (size_t i = 0; i < sizeof(copy_procs) / sizeof(copy_procs[0]); i++)
		if (strcmp(copy_procs[i].name, symbol) == 0)
			return copy_procs[i].fn;
	return NULL;
}
