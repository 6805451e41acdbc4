/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's declaration to the lock server's standby pool (docs/lock.md). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "engine_int.h"

_Static_assert(sizeof(((gf_engine *)0)->pool_gpus[0]) == GF_POOL_UUID_MAX, "engine pool UUID size");
_Static_assert(GF_ARRAY_SIZE(((gf_engine *)0)->pool_gpus) == GF_POOL_MAX_GPUS, "engine pool GPUs");

GF_EXPORT int gf_engine_set_gpus(gf_engine *e, const char *const *gpus, size_t ngpus)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_gpus");
	if (rc)
		return rc;
	if (ngpus > GF_ARRAY_SIZE(e->pool_gpus) || (ngpus && !gpus))
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_gpus: 0..%zu UUIDs", GF_ARRAY_SIZE(e->pool_gpus));
	/* Checked here, not at the first acquire: a bad --gpu is a configuration error. */
	char canon[GF_ARRAY_SIZE(e->pool_gpus)][GF_POOL_UUID_MAX];
	for (size_t i = 0; i < ngpus; i++) {
		if (!gpus[i] || !gf_pool_uuid_parse(gpus[i], canon[i]))
			return gf_err(GF_ERR_INVALID_ARG,
				      "gf_engine_set_gpus: \"%.60s\" is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
				      gpus[i] ? gpus[i] : "(null)");
		for (size_t k = 0; k < i; k++)
			if (!strcmp(canon[k], canon[i]))
				return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_gpus: %s given twice", canon[i]);
	}
	memcpy(e->pool_gpus, canon, ngpus * sizeof(canon[0]));
	e->pool_ngpus = ngpus;
	return 0;
}

GF_EXPORT int gf_engine_set_asleep_bytes(gf_engine *e, uint64_t bytes)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_asleep_bytes");
	if (rc)
		return rc;
	e->asleep_bytes = bytes;
	return 0;
}

GF_EXPORT int gf_engine_set_pinned(gf_engine *e, int pinned)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_pinned");
	if (rc)
		return rc;
	e->pinned = pinned != 0;
	return 0;
}

GF_EXPORT int gf_engine_set_model(gf_engine *e, const char *model)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_model");
	if (rc)
		return rc;
	if (model && *model && (rc = gf_id_check(model, "gf_engine_set_model")) < 0)
		return rc;
	char *m = model && *model ? strdup(model) : NULL;
	if (model && *model && !m)
		return gf_err(GF_ERR_NOMEM, "gf_engine_set_model: out of memory");
	free(e->model);
	e->model = m;
	return 0;
}

int gf_engine_pool_apply(gf_engine *e, gf_lock *lock)
{
	const char *gpus[GF_ARRAY_SIZE(e->pool_gpus)];
	char found[GF_ARRAY_SIZE(e->pool_gpus)][GF_POOL_UUID_MAX];
	size_t n = 0;
	for (size_t i = 0; i < e->pool_ngpus; i++)
		gpus[n++] = e->pool_gpus[i];
	/* Nothing declared: the devices' own UUIDs where the driver has them
	 * (the host backend's "HOST-..." ids name no GPU and are left out). */
	for (int i = 0; e->pool_ngpus == 0 && i < e->ndev && n < GF_ARRAY_SIZE(found); i++) {
		char uuid[64];
		if (e->dev[i].mem && gf_mem_device_uuid(e->dev[i].mem, uuid, sizeof(uuid)) == 0 &&
		    gf_pool_uuid_parse(uuid, found[n])) {
			bool seen = false;
			for (size_t k = 0; k < n && !seen; k++)
				seen = !strcmp(gpus[k], found[n]);
			if (!seen) {
				gpus[n] = found[n];
				n++;
			}
		}
	}
	int rc = gf_lock_set_resources(lock, gpus, n, gf_engine_memory_need(e), e->asleep_bytes);
	if (!rc)
		rc = gf_lock_set_pinned(lock, e->pinned);
	if (!rc)
		rc = gf_lock_set_model(lock, e->model);
	/* The engine says when it serves (gf_engine_serve): readiness waits for it. */
	if (!rc)
		rc = gf_lock_set_serving_report(lock, 1);
	return rc;
}
