/* SPDX-License-Identifier: Apache-2.0 */
/* The readiness relay: "is an engine Active and serving for this GPU set / this model", from a lock status. */
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "lockint.h"
#include "pool_decl.h"

const char *gf_lock_serving_name(const gf_LockStatus *s)
{
	if (!s->holder[0])
		return NULL;
	return s->holder_serving == 2 ? "yes" : s->holder_serving == 1 ? "no" : "unknown";
}

int gf_lock_ready_from_status(const gf_LockStatus *s, const char *const *gpus, size_t ngpus, const char *model,
			      char **json)
{
	char want[GF_POOL_MAX_GPUS][GF_POOL_UUID_MAX];
	if (ngpus > GF_POOL_MAX_GPUS)
		return gf_err(GF_ERR_INVALID_ARG, "ready: at most %d GPUs per query", GF_POOL_MAX_GPUS);
	for (size_t i = 0; i < ngpus; i++)
		if (!gpus[i] || !gf_pool_uuid_parse(gpus[i], want[i]))
			return gf_err(GF_ERR_INVALID_ARG,
				      "ready: GPU \"%.60s\" is not a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
				      gpus[i] ? gpus[i] : "(null)");
	if (model && *model && !gf_id_valid(model))
		return gf_err(GF_ERR_INVALID_ARG, "ready: model name must be 1..127 bytes of printable ASCII without "
						  "spaces, quotes, '\\' or '='");
	struct gf_pool_decl h;
	const struct gf_pool_decl *hp = NULL;
	if (s->holder[0]) {
		memset(&h, 0, sizeof(h));
		if (s->has_holder_info) {
			for (pb_size_t g = 0; g < s->holder_info.gpus_count && g < GF_POOL_MAX_GPUS; g++)
				memcpy(h.gpus[h.ngpus++], s->holder_info.gpus[g], GF_POOL_UUID_MAX);
			memcpy(h.model, s->holder_info.model, sizeof(h.model));
		}
		hp = &h;
	}
	/* A holder that reports when it serves is not ready while it wakes;
	 * one that does not (an older client, gfctl) counts from its grant. */
	bool ready = gf_pool_ready(hp, (const char(*)[GF_POOL_UUID_MAX])want, ngpus, model) && s->holder_serving != 1;
	const char *serving = gf_lock_serving_name(s);
	if (!json)
		return ready;
	json_t *o = json_object(), *ga = json_array();
	if (!o || !ga) {
		json_decref(o);
		json_decref(ga);
		return gf_err(GF_ERR_NOMEM, "ready: out of memory");
	}
	for (size_t i = 0; i < ngpus; i++)
		json_array_append_new(ga, json_string(want[i]));
	json_object_set_new(o, "ready", json_boolean(ready));
	json_object_set_new(o, "holder", s->holder[0] ? json_string(s->holder) : json_null());
	json_object_set_new(o, "epoch", json_integer(s->holder[0] ? (json_int_t)s->epoch : 0));
	json_object_set_new(o, "holder_model", hp && hp->model[0] ? json_string(hp->model) : json_null());
	json_object_set_new(o, "serving", serving ? json_string(serving) : json_null());
	json_object_set_new(o, "gpus", ga);
	json_object_set_new(o, "model", model && *model ? json_string(model) : json_null());
	char *text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (!text)
		return gf_err(GF_ERR_NOMEM, "ready: out of memory");
	*json = text;
	return ready;
}
