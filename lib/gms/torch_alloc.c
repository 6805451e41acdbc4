/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The two entry points torch.cuda.memory.CUDAPluggableAllocator loads by
 * name, so that PyTorch allocations made inside a memory pool land in GMS
 * allocations (the way Dynamo and vLLM hook weight loading). Which GMS
 * writer receives them is set with gf_torch_pool_begin()/end().
 */
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.h"
#include "gpufailover.h"

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static gf_gms *pool_writer;
static uint64_t pool_allocs;

GF_EXPORT int gf_torch_pool_begin(gf_gms *writer)
{
	if (!writer)
		return gf_err(GF_ERR_INVALID_ARG, "torch pool: NULL writer");
	if (gf_gms_granted_mode(writer) != GF_GMS_RW)
		return gf_err(GF_ERR_STATE, "torch pool: the GMS client is not the writer");
	pthread_mutex_lock(&pool_lock);
	int busy = pool_writer != NULL;
	if (!busy) {
		pool_writer = writer;
		pool_allocs = 0;
	}
	pthread_mutex_unlock(&pool_lock);
	return busy ? gf_err(GF_ERR_BUSY, "torch pool: another pool is active") : 0;
}

GF_EXPORT int gf_torch_pool_end(void)
{
	pthread_mutex_lock(&pool_lock);
	int active = pool_writer != NULL;
	uint64_t n = pool_allocs;
	pool_writer = NULL;
	pthread_mutex_unlock(&pool_lock);
	if (!active)
		return gf_err(GF_ERR_STATE, "torch pool: no pool is active");
	gf_log(GF_LOG_DEBUG, "gms", "msg=\"torch pool ended\" allocations=%llu", (unsigned long long)n);
	return 0;
}

GF_EXPORT void *gf_torch_malloc(ssize_t size, int device, void *stream)
{
	(void)stream; /* GMS memory is stream-agnostic: allocation is synchronous */
	if (size <= 0)
		return NULL;
	pthread_mutex_lock(&pool_lock);
	void *ptr = NULL;
	gf_gms *w = pool_writer;
	uint64_t id;
	if (!w) {
		gf_log(GF_LOG_WARN, "gms", "msg=\"torch allocation outside a gpufailover pool refused\" size=%zd device=%d",
		       size, device);
	} else if (gf_gms_allocate(w, (uint64_t)size, "torch", &id) == 0) {
		/* The newest allocation is the last one: search from the end. */
		for (size_t i = gf_gms_alloc_count(w); i-- > 0;) {
			struct gf_gms_alloc_info info;
			if (gf_gms_alloc_at(w, i, &info) == 0 && info.id == id) {
				ptr = (void *)(uintptr_t)info.addr;
				break;
			}
		}
		pool_allocs++;
	} else {
		gf_log(GF_LOG_WARN, "gms", "msg=\"torch allocation failed\" size=%zd error=%s detail=\"%s\"", size,
		       gf_error_name(GF_ERR_OUT_OF_MEMORY), gf_error_detail());
	}
	pthread_mutex_unlock(&pool_lock);
	return ptr;
}

GF_EXPORT void gf_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
	/* Weights in the GMS live as long as their committed layout: a writer
	 * cannot give back one allocation, and readers may map it. Freeing is
	 * therefore deferred to the layout's end (an RW reconnect or GMS exit). */
	(void)ptr;
	(void)size;
	(void)device;
	(void)stream;
}
