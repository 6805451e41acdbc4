/* SPDX-License-Identifier: Apache-2.0 */
/* Engine configuration: the setters, each validating its input, allowed only
 * in Init before init_weights (hooks: any state). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "engine_int.h"

int gf_engine_config_check(gf_engine *e, const char *what)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "%s: NULL engine", what);
	if (gf_engine_state(e) != GF_ENGINE_INIT || e->init_started)
		return gf_err(GF_ERR_STATE, "%s: configuration is only possible in state init before init_weights",
			      what);
	return 0;
}

static int set_string(char **dst, const char *src)
{
	char *c = strdup(src);
	if (!c)
		return gf_err(GF_ERR_NOMEM, "engine: out of memory");
	free(*dst);
	*dst = c;
	return 0;
}

GF_EXPORT int gf_engine_set_lock(gf_engine *e, const char *uri, const char *engine_id)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_lock");
	if (rc)
		return rc;
	if (!uri || !*uri || !engine_id || !*engine_id)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_lock: empty URI or engine id");
	if (e->rank)
		return gf_err(GF_ERR_STATE, "gf_engine_set_lock: this engine is rank %d, which holds no lock of its own",
			      e->rank);
	if (gf_id_check(engine_id, "gf_engine_set_lock") < 0)
		return GF_ERR_INVALID_ARG;
	char *u = strdup(uri), *id = strdup(engine_id);
	if (!u || !id) {
		free(u);
		free(id);
		return gf_err(GF_ERR_NOMEM, "engine: out of memory");
	}
	free(e->lock_uri);
	free(e->id);
	e->lock_uri = u;
	e->id = id;
	return 0;
}

void gf_engine_wipe_lock_secret(gf_engine *e)
{
	if (e->lock_secret)
		explicit_bzero(e->lock_secret, e->lock_secret_len);
	free(e->lock_secret);
	e->lock_secret = NULL;
	e->lock_secret_len = 0;
}

GF_EXPORT int gf_engine_set_lock_secret(gf_engine *e, const void *secret, size_t len)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_lock_secret");
	if (rc)
		return rc;
	if (!secret || len == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_lock_secret: empty secret");
	if (e->rank)
		return gf_err(GF_ERR_STATE,
			      "gf_engine_set_lock_secret: this engine is rank %d, which holds no lock of its own", e->rank);
	uint8_t *b = malloc(len);
	if (!b)
		return gf_err(GF_ERR_NOMEM, "engine: out of memory");
	memcpy(b, secret, len);
	gf_engine_wipe_lock_secret(e);
	e->lock_secret = b;
	e->lock_secret_len = len;
	return 0;
}

GF_EXPORT int gf_engine_set_rank(gf_engine *e, const char *engine_id, int rank)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_rank");
	if (rc)
		return rc;
	if (rank < 1 || rank > GF_ENGINE_MAX_RANK)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_rank: rank %d outside 1..%d (rank 0 holds the lock)", rank,
			      GF_ENGINE_MAX_RANK);
	if (!engine_id || !*engine_id)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_rank: empty engine id");
	if (gf_id_check(engine_id, "gf_engine_set_rank") < 0)
		return GF_ERR_INVALID_ARG;
	if (e->lock_uri)
		return gf_err(GF_ERR_STATE, "gf_engine_set_rank: a lock is configured (gf_engine_set_lock): that engine is rank 0");
	rc = set_string(&e->id, engine_id);
	if (rc)
		return rc;
	e->rank = rank;
	return 0;
}

GF_EXPORT int gf_engine_add_gms(gf_engine *e, const char *uri)
{
	int rc = gf_engine_config_check(e, "gf_engine_add_gms");
	if (rc)
		return rc;
	if (!uri || !*uri)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_add_gms: empty URI");
	if (e->ndev >= GF_ENGINE_MAX_DEVICES)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_add_gms: more than %d devices", GF_ENGINE_MAX_DEVICES);
	rc = set_string(&e->dev[e->ndev].uri, uri);
	if (rc)
		return rc;
	e->ndev++;
	return 0;
}

GF_EXPORT int gf_engine_set_role(gf_engine *e, int role)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_role");
	if (rc)
		return rc;
	if (role != GF_ENGINE_LOADER && role != GF_ENGINE_FOLLOWER)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_role: unknown role %d", role);
	e->role = role;
	return 0;
}

GF_EXPORT int gf_engine_set_backend(gf_engine *e, int kind)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_backend");
	if (rc)
		return rc;
	if (kind != GF_MEM_AUTO && kind != GF_MEM_CUDA && kind != GF_MEM_HOST)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_backend: unknown backend %d", kind);
	e->backend = kind;
	return 0;
}

GF_EXPORT int gf_engine_set_waking_timeout(gf_engine *e, int64_t ms)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_waking_timeout");
	if (rc)
		return rc;
	if (ms <= 0 || ms > INT64_MAX / 2000)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_waking_timeout: must be > 0 and finite");
	e->waking_timeout_ms = ms;
	return 0;
}

GF_EXPORT int gf_engine_set_remap_timeout(gf_engine *e, int64_t ms)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_remap_timeout");
	if (rc)
		return rc;
	/* Decision 6: an unbounded remap hangs forever on a fresh GMS. */
	if (ms <= 0 || ms > INT64_MAX / 2000)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_remap_timeout: must be > 0 and finite");
	e->remap_timeout_ms = ms;
	return 0;
}

GF_EXPORT int gf_engine_set_lock_reconnect_timeout(gf_engine *e, int64_t ms)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_lock_reconnect_timeout");
	if (rc)
		return rc;
	e->lock_reconnect_ms = ms < 0 ? -1 : ms;
	return 0;
}

GF_EXPORT int gf_engine_set_init_timeout(gf_engine *e, int64_t ms)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_init_timeout");
	if (rc)
		return rc;
	e->init_timeout_ms = ms < 0 ? -1 : ms;
	e->init_timeout_set = true;
	return 0;
}

int64_t gf_engine_init_timeout(const gf_engine *e)
{
	if (e->init_timeout_set)
		return e->init_timeout_ms;
	/* A follower fails fast when no loader ever commits (a wrong GMS
	 * address, a loader that cannot start): its process exits and the
	 * platform shows the restarts, instead of a standby that waits for
	 * hours looking healthy. A loader loads itself: its time is the
	 * loading's, bounded by the startup deadline if one is set. */
	return e->role == GF_ENGINE_FOLLOWER ? GF_ENGINE_FOLLOWER_INIT_TIMEOUT_MS : -1;
}

GF_EXPORT int gf_engine_set_private_bytes(gf_engine *e, uint64_t bytes)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_private_bytes");
	if (rc)
		return rc;
	if (bytes > SIZE_MAX / 2)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_private_bytes: %" PRIu64 " bytes is too large",
			      bytes);
	e->private_bytes = bytes;
	return 0;
}

GF_EXPORT int gf_engine_set_kv_pool(gf_engine *e, int on)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_kv_pool");
	if (rc)
		return rc;
	e->kv_pool = on != 0;
	return 0;
}

GF_EXPORT int gf_engine_set_kv_layout(gf_engine *e, uint64_t block_bytes, const uint8_t layout_hash[16])
{
	if (!e || !layout_hash || block_bytes == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_kv_layout: NULL argument or block size 0");
	if (e->private_bytes && block_bytes > e->private_bytes)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_kv_layout: a block of %" PRIu64 " bytes is larger than "
			      "the private memory (%" PRIu64 ")", block_bytes, e->private_bytes);
	pthread_mutex_lock(&e->mu);
	int st = e->state;
	if (st == GF_ENGINE_INIT || st == GF_ENGINE_STANDBY) {
		e->kv_block_bytes = block_bytes;
		memcpy(e->kv_layout, layout_hash, 16);
	}
	pthread_mutex_unlock(&e->mu);
	if (st != GF_ENGINE_INIT && st != GF_ENGINE_STANDBY)
		return gf_err(GF_ERR_STATE, "gf_engine_set_kv_layout: only in init or standby (state %s)",
			      gf_engine_state_name(st));
	return 0;
}

GF_EXPORT int gf_engine_set_first_device(gf_engine *e, int ordinal)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_first_device");
	if (rc)
		return rc;
	if (ordinal < 0 || ordinal > GF_ENGINE_MAX_FIRST_DEVICE)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_first_device: ordinal %d is not 0..%d", ordinal,
			      GF_ENGINE_MAX_FIRST_DEVICE);
	e->first_device = ordinal;
	return 0;
}

GF_EXPORT int gf_engine_set_wake_priority(gf_engine *e, int priority)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_wake_priority");
	if (rc)
		return rc;
	if (priority < 0 || priority > 99)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_wake_priority: %d is not a priority (0..99)", priority);
	e->wake_priority = priority;
	return 0;
}

GF_EXPORT int gf_engine_set_settle_deferred(gf_engine *e, int deferred)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_settle_deferred");
	if (rc)
		return rc;
	e->settle_deferred = deferred != 0;
	return 0;
}

GF_EXPORT int gf_engine_set_startup_deadline(gf_engine *e, int64_t ms)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_startup_deadline");
	if (rc)
		return rc;
	if (ms > INT64_MAX / 2000)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_startup_deadline: %" PRId64 " ms is too large", ms);
	e->startup_deadline_ms = ms > 0 ? ms : 0;
	return 0;
}

GF_EXPORT int gf_engine_set_memory_need(gf_engine *e, uint64_t bytes)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_memory_need");
	if (rc)
		return rc;
	e->memory_need = bytes;
	e->memory_need_set = true;
	return 0;
}

GF_EXPORT int gf_engine_set_probe_address(gf_engine *e, const char *address, int port)
{
	int rc = gf_engine_config_check(e, "gf_engine_set_probe_address");
	if (rc)
		return rc;
	if (port < -1 || port > 65535)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_probe_address: port %d out of range", port);
	if (!address)
		address = "0.0.0.0";
	if (strlen(address) >= sizeof(e->probe_addr))
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_probe_address: address too long");
	snprintf(e->probe_addr, sizeof(e->probe_addr), "%s", address);
	e->probe_port = port;
	return 0;
}

GF_EXPORT int gf_engine_set_health_fn(gf_engine *e, gf_engine_health_fn fn, void *userdata)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_health_fn: NULL engine");
	pthread_mutex_lock(&e->mu);
	e->health = fn;
	e->health_ud = userdata;
	pthread_mutex_unlock(&e->mu);
	return 0;
}

GF_EXPORT int gf_engine_set_loss_fn(gf_engine *e, gf_engine_loss_fn fn, void *userdata)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_loss_fn: NULL engine");
	pthread_mutex_lock(&e->mu);
	e->loss = fn;
	e->loss_ud = userdata;
	pthread_mutex_unlock(&e->mu);
	return 0;
}

GF_EXPORT int gf_engine_set_loss_grace(gf_engine *e, int64_t ms)
{
	if (!e || ms < 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_loss_grace: NULL engine or negative grace");
	pthread_mutex_lock(&e->mu);
	e->loss_grace_ms = ms;
	pthread_mutex_unlock(&e->mu);
	return 0;
}

