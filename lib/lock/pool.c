/* SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "pool.h"
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

static bool is_victim(const size_t *victims, size_t nv, size_t i)
{
	for (size_t k = 0; k < nv; k++)
		if (victims[k] == i)
			return true;
	return false;
}

/* Whether @a was Active less recently than @b (the eviction order). */
static bool older(const struct gf_pool_member *a, const struct gf_pool_member *b)
{
	if (a->last_active_us != b->last_active_us)
		return a->last_active_us < b->last_active_us;
	return a->since_us < b->since_us;
}

size_t gf_pool_choose_evictions(const struct gf_pool_member *m, size_t n, size_t newcomer,
				const struct gf_pool_policy *p, int64_t now_us, size_t *victims, size_t cap,
				size_t *short_by)
{
	size_t nv = 0, worst = 0;
	if (short_by)
		*short_by = 0;
	if (newcomer >= n || !m[newcomer].decl || p->max_standby_per_gpu == 0)
		return 0;
	const struct gf_pool_decl *nd = m[newcomer].decl;
	for (size_t g = 0; g < nd->ngpus; g++) {
		const char *uuid = nd->gpus[g];
		size_t count = 0;
		for (size_t i = 0; i < n; i++)
			if (!m[i].holder && !is_victim(victims, nv, i) && gf_pool_on_gpu(m[i].decl, uuid))
				count++;
		while (count > p->max_standby_per_gpu) {
			size_t best = n;
			for (size_t i = 0; i < n; i++) {
				const struct gf_pool_member *c = &m[i];
				if (c->holder || !gf_pool_on_gpu(c->decl, uuid) || c->decl->pinned ||
				    is_victim(victims, nv, i) || now_us - c->since_us < p->min_standby_age_us)
					continue;
				if (best == n || older(c, &m[best]))
					best = i;
			}
			if (best == n || nv == cap)
				break;
			victims[nv++] = best;
			count--;
		}
		if (count > p->max_standby_per_gpu && count - p->max_standby_per_gpu > worst)
			worst = count - p->max_standby_per_gpu;
	}
	if (short_by)
		*short_by = worst;
	return nv;
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
