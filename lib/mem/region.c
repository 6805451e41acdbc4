/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A private region: one allocation mapped read-write into its own
 * reservation, the shape of an engine's KV cache. Built only from the public
 * memory API so the unwinding below is the one place that knows the order
 * (map after reserve after create; undo in reverse).
 */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "gpufailover.h"

struct gf_mem_region {
	gf_mem_alloc *alloc;
	gf_mem_va *va;
};

GF_EXPORT int gf_mem_region_new(gf_mem_region **out, gf_mem *m, size_t size)
{
	if (!out || !m)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_region_new: NULL argument");
	if (size == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_region_new: size 0");
	gf_mem_region *r = calloc(1, sizeof(*r));
	if (!r)
		return gf_err(GF_ERR_NOMEM, "gf_mem_region_new: out of memory");
	int rc = gf_mem_create(m, size, &r->alloc);
	if (rc < 0)
		goto fail;
	rc = gf_mem_reserve(m, gf_mem_alloc_size(r->alloc), 0, &r->va);
	if (rc < 0)
		goto fail;
	rc = gf_mem_map(r->va, 0, r->alloc, GF_MEM_READWRITE);
	if (rc < 0)
		goto fail;
	*out = r;
	return 0;
fail: {
	/* The failing step's detail is what the caller needs, not whatever the
	 * unwinding logs. */
	char why[512];
	snprintf(why, sizeof(why), "%s", gf_error_detail());
	gf_mem_va_free(r->va);
	gf_mem_alloc_free(r->alloc);
	free(r);
	return gf_err(rc, "%s", why);
}
}

GF_EXPORT void gf_mem_region_free(gf_mem_region *r)
{
	if (!r)
		return;
	/* Unmapping first: an allocation is only freed once nothing maps it. */
	gf_mem_va_free(r->va);
	gf_mem_alloc_free(r->alloc);
	free(r);
}

GF_EXPORT uint64_t gf_mem_region_addr(const gf_mem_region *r)
{
	return r ? gf_mem_va_addr(r->va) : 0;
}

GF_EXPORT size_t gf_mem_region_size(const gf_mem_region *r)
{
	return r ? gf_mem_alloc_size(r->alloc) : 0;
}
