/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A private region: one allocation mapped read-write into its own
 * reservation, the shape of an engine's KV cache. The reservation can come
 * first and the memory later (and go again), so the region's address is
 * known, and stable, before any memory backs it. Built from the public
 * memory API so the unwinding below is the one place that knows the order
 * (map after reserve after create; undo in reverse). Where an allocation
 * takes no memory until it is touched (host: an empty memfd), the next one
 * is created ahead, at reserve and at release, so backing the region (an
 * engine's wake, on the failover's path) only maps it.
 */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "gpufailover/mem.h"
#include "mem_int.h"

struct gf_mem_region {
	gf_mem *m;
	gf_mem_va *va;       /* the address range, for the region's whole life */
	gf_mem_alloc *alloc; /* the memory behind it while backed, else NULL */
	gf_mem_alloc *spare; /* made ahead, unmapped and untouched (host only), else NULL */
};

/* The next backing, created now where that takes no memory; a failure here
 * only means gf_mem_region_back() creates it. */
static void make_spare(gf_mem_region *r)
{
	if (r->spare || !(gf_mem_caps(r->m) & GF_MEM_CAP_CREATE_FREE))
		return;
	if (gf_mem_create(&r->spare, r->m, gf_mem_va_size(r->va)) < 0)
		r->spare = NULL;
}

GF_EXPORT int gf_mem_region_reserve(gf_mem_region **out, gf_mem *m, size_t size)
{
	if (!out || !m)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_region_reserve: NULL argument");
	if (size == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_region_reserve: size 0");
	size_t gran = 0;
	int rc = gf_mem_granularity(m, &gran, NULL);
	if (rc < 0)
		return rc;
	if (gran == 0 || size > SIZE_MAX - gran)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_region_reserve: size %zu too large", size);
	gf_mem_region *r = calloc(1, sizeof(*r));
	if (!r)
		return gf_err(GF_ERR_NOMEM, "gf_mem_region_reserve: out of memory");
	r->m = m;
	/* The allocation made at gf_mem_region_back() rounds to the same
	 * granularity, so it fills the range exactly. */
	rc = gf_mem_reserve(&r->va, m, (size + gran - 1) / gran * gran, 0);
	if (rc < 0) {
		free(r);
		return rc;
	}
	make_spare(r);
	*out = r;
	return 0;
}

GF_EXPORT int gf_mem_region_back(gf_mem_region *r)
{
	if (!r)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_region_back: NULL region");
	if (r->alloc)
		return gf_err(GF_ERR_STATE, "gf_mem_region_back: already backed");
	size_t size = gf_mem_va_size(r->va);
	int rc = 0;
	if (r->spare) {
		r->alloc = r->spare;
		r->spare = NULL;
	} else {
		rc = gf_mem_create(&r->alloc, r->m, size);
		if (rc < 0)
			goto fail;
	}
	if (gf_mem_alloc_size(r->alloc) != size) {
		rc = gf_err(GF_ERR_DRIVER, "gf_mem_region_back: the allocation is %zu bytes, the range %zu",
			    gf_mem_alloc_size(r->alloc), size);
		goto fail;
	}
	rc = gf_mem_map(r->va, 0, r->alloc, GF_MEM_READWRITE);
	if (rc < 0)
		goto fail;
	return 0;
fail: {
	/* The failing step's detail is what the caller needs, not whatever the
	 * unwinding logs. */
	char why[512];
	snprintf(why, sizeof(why), "%s", gf_error_detail());
	gf_mem_alloc_free(r->alloc);
	r->alloc = NULL;
	return gf_err(rc, "%s", why);
}
}

GF_EXPORT int gf_mem_region_back_fd(gf_mem_region *r, int fd)
{
	if (!r || fd < 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_region_back_fd: NULL region or no fd");
	if (r->alloc)
		return gf_err(GF_ERR_STATE, "gf_mem_region_back_fd: already backed");
	/* The import's size is the range's: on host it is checked against the
	 * fd, on cuda the driver cannot tell and the caller vouches for it. */
	int rc = gf_mem_import(&r->alloc, r->m, fd, gf_mem_va_size(r->va));
	if (rc < 0) {
		r->alloc = NULL;
		return rc;
	}
	rc = gf_mem_map(r->va, 0, r->alloc, GF_MEM_READWRITE);
	if (rc < 0) {
		char why[512];
		snprintf(why, sizeof(why), "%s", gf_error_detail());
		gf_mem_alloc_free(r->alloc);
		r->alloc = NULL;
		return gf_err(rc, "%s", why);
	}
	return 0;
}

GF_EXPORT int gf_mem_region_release(gf_mem_region *r)
{
	if (!r)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_region_release: NULL region");
	if (!r->alloc)
		return 0;
	/* Unmapping first: an allocation is only freed once nothing maps it. */
	int rc = gf_mem_unmap_all(r->va);
	gf_mem_alloc_free(r->alloc);
	r->alloc = NULL;
	make_spare(r);
	return rc;
}

GF_EXPORT int gf_mem_region_backed(const gf_mem_region *r)
{
	return r && r->alloc ? 1 : 0;
}

GF_EXPORT int gf_mem_region_new(gf_mem_region **out, gf_mem *m, size_t size)
{
	if (!out || !m)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_region_new: NULL argument");
	gf_mem_region *r;
	int rc = gf_mem_region_reserve(&r, m, size);
	if (rc < 0)
		return rc;
	rc = gf_mem_region_back(r);
	if (rc < 0) {
		char why[512];
		snprintf(why, sizeof(why), "%s", gf_error_detail());
		gf_mem_region_free(r);
		return gf_err(rc, "%s", why);
	}
	*out = r;
	return 0;
}

GF_EXPORT void gf_mem_region_free(gf_mem_region *r)
{
	if (!r)
		return;
	gf_mem_region_release(r);
	gf_mem_alloc_free(r->spare);
	gf_mem_va_free(r->va);
	free(r);
}

GF_EXPORT uint64_t gf_mem_region_addr(const gf_mem_region *r)
{
	return r ? gf_mem_va_addr(r->va) : 0;
}

GF_EXPORT size_t gf_mem_region_size(const gf_mem_region *r)
{
	return r ? gf_mem_va_size(r->va) : 0;
}
