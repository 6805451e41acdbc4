/* SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "pool_decl.h"
#include "schema_limits.h"

_Static_assert(GF_FIELD_COUNT(gf_LockAcquire, gpus) == GF_POOL_MAX_GPUS, "gf.LockAcquire.gpus");
_Static_assert(sizeof(((gf_LockAcquire *)0)->gpus[0]) == GF_POOL_UUID_MAX, "gf.LockAcquire.gpus");
_Static_assert(GF_FIELD_COUNT(gf_LockWaiter, gpus) == GF_POOL_MAX_GPUS, "gf.LockWaiter.gpus");
_Static_assert(sizeof(((gf_LockWaiter *)0)->gpus[0]) == GF_POOL_UUID_MAX, "gf.LockWaiter.gpus");
_Static_assert(GF_FIELD_SIZE(gf_LockGpu, uuid) == GF_POOL_UUID_MAX, "gf.LockGpu.uuid");
_Static_assert(GF_FIELD_SIZE(gf_LockAcquire, model) == sizeof(((struct gf_pool_decl *)0)->model), "gf.LockAcquire.model");
_Static_assert(GF_FIELD_SIZE(gf_LockWaiter, model) == sizeof(((struct gf_pool_decl *)0)->model), "gf.LockWaiter.model");

bool gf_pool_on_gpu(const struct gf_pool_decl *d, const char *uuid)
{
	if (!d)
		return false;
	for (size_t i = 0; i < d->ngpus; i++)
		if (!strcmp(d->gpus[i], uuid))
			return true;
	return false;
}

bool gf_pool_ready(const struct gf_pool_decl *holder_decl, const char (*gpus)[GF_POOL_UUID_MAX], size_t ngpus,
		   const char *model)
{
	if (!holder_decl)
		return false;
	for (size_t i = 0; i < ngpus; i++)
		if (!gf_pool_on_gpu(holder_decl, gpus[i]))
			return false;
	return !model || !*model || !strcmp(model, holder_decl->model);
}

int gf_pool_decl_from_acquire(const gf_LockAcquire *a, struct gf_pool_decl *out)
{
	memset(out, 0, sizeof(*out));
	if (a->gpus_count > GF_POOL_MAX_GPUS)
		return gf_err(GF_ERR_INVALID_ARG, "acquire: more than %d GPUs declared", GF_POOL_MAX_GPUS);
	for (pb_size_t i = 0; i < a->gpus_count; i++) {
		if (!gf_pool_uuid_parse(a->gpus[i], out->gpus[out->ngpus]))
			return gf_err(GF_ERR_INVALID_ARG,
				      "acquire: GPU \"%.60s\" is not a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
				      a->gpus[i]);
		if (gf_pool_on_gpu(out, out->gpus[out->ngpus]))
			return gf_err(GF_ERR_INVALID_ARG, "acquire: GPU %s declared twice", out->gpus[out->ngpus]);
		out->ngpus++;
	}
	if (a->model[0] && !gf_id_valid(a->model))
		return gf_err(GF_ERR_INVALID_ARG,
			      "acquire: model name must be 1..127 bytes of printable ASCII without spaces, quotes, '\\' or '='");
	snprintf(out->model, sizeof(out->model), "%s", a->model);
	out->pinned = a->pinned;
	out->wake_bytes = a->wake_bytes;
	out->asleep_bytes = a->asleep_bytes;
	return 0;
}
