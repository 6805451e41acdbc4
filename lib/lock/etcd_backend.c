/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock's etcd backend (etcd:// and etcds:// URIs): the table over etcd.c,
 * which speaks etcd's v3 JSON gateway. The etcd lock has no server of ours,
 * so gf-lockd's own requests (readiness, revoke, switchover) and the
 * listeners that travel with a grant are not available here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/crypto.h>

#include "backend.h"
#include "etcd.h"

static struct gf_etcd *E(const gf_lock *l)
{
	return l->priv;
}

static int etcd_open(gf_lock *l, const char *uri)
{
	struct gf_etcd *e;
	int rc = gf_etcd_new(&e, uri, l->id);
	if (rc < 0)
		return rc;
	l->priv = e;
	return 0;
}

static void etcd_free(gf_lock *l)
{
	gf_etcd_free(E(l));
	l->priv = NULL;
}

static int etcd_set_secret(gf_lock *l, const void *secret, size_t len)
{
	return gf_etcd_set_password(E(l), secret, len);
}

static int etcd_set_reconnect_timeout(gf_lock *l, int64_t ms)
{
	return gf_etcd_set_reconnect_timeout(E(l), ms);
}

static int etcd_set_lease(gf_lock *l, int64_t heartbeat_ms, int64_t fence_ms)
{
	return gf_etcd_set_lease(E(l), heartbeat_ms, fence_ms);
}

static int etcd_acquire(gf_lock *l, int64_t timeout_ms, struct gf_lock_grant *grant)
{
	return gf_etcd_acquire(E(l), timeout_ms, grant, l->intr_fd);
}

static int etcd_release(gf_lock *l)
{
	return gf_etcd_release(E(l));
}

static int etcd_process(gf_lock *l, struct gf_lock_news *news)
{
	return gf_etcd_process(E(l), &news->lost, news->detail, sizeof(news->detail));
}

static int etcd_get_fd(gf_lock *l)
{
	return gf_etcd_get_fd(E(l));
}

static int64_t etcd_fence_ms(const gf_lock *l)
{
	return gf_etcd_fence_ms(E(l));
}

static int etcd_get_timeout_ms(gf_lock *l)
{
	return gf_etcd_get_timeout_ms(E(l));
}

static uint64_t etcd_epoch(const gf_lock *l)
{
	return gf_etcd_epoch(E(l));
}

static int etcd_is_held(const gf_lock *l)
{
	return gf_etcd_is_held(E(l));
}

static void etcd_forked(gf_lock *l)
{
	gf_etcd_forked(E(l));
}

static json_t *entry_json(const struct gf_etcd_entry *w)
{
	json_t *x = json_object();
	json_object_set_new(x, "id", json_string(w->id));
	json_object_set_new(x, "key", json_string(w->key));
	json_object_set_new(x, "create_revision", json_integer(w->create_revision));
	return x;
}

/* etcd's status as JSON, for gfctl and HTTP (the only place it becomes text). */
static int etcd_status_json(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, char **json)
{
	struct gf_etcd_status *st = malloc(sizeof(*st));
	if (!st)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	int rc = gf_etcd_status(uri, secret, secret_len, timeout_ms, st);
	if (rc < 0) {
		free(st);
		return rc;
	}
	json_t *root = json_object(), *w = json_array();
	if (!root || !w) {
		json_decref(root);
		json_decref(w);
		free(st);
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	}
	json_object_set_new(root, "backend", json_string("etcd"));
	json_object_set_new(root, "prefix", json_string(st->prefix));
	json_object_set_new(root, "holder", st->has_holder ? json_string(st->holder.id) : json_null());
	json_object_set_new(root, "epoch", json_integer(st->has_holder ? (json_int_t)st->holder.create_revision : 0));
	if (st->has_holder)
		json_object_set_new(root, "holder_key", json_string(st->holder.key));
	for (size_t i = 0; i < st->nwaiters; i++)
		json_array_append_new(w, entry_json(&st->waiters[i]));
	json_object_set_new(root, "waiters", w);
	json_object_set_new(root, "waiter_count", json_integer((json_int_t)st->waiter_count));
	json_object_set_new(root, "revision", json_integer(st->revision));
	free(st);
	*json = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	return *json ? 0 : gf_err(GF_ERR_NOMEM, "etcd: out of memory");
}

/*
 * The holder from etcd's status. The session token of an etcd grant is its
 * lease id, which names the holder's key (PREFIX/<lease-id-hex>): a proof is
 * checked against the proof of that lease at the holder's epoch.
 */
static int etcd_holder(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms,
		       const struct gf_lock_proof *proof, struct gf_lock_holder *out)
{
	struct gf_etcd_status *st = malloc(sizeof(*st));
	if (!st)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	int rc = gf_etcd_status(uri, secret, secret_len, timeout_ms, st);
	if (rc < 0) {
		free(st);
		return rc;
	}
	memset(out, 0, sizeof(*out));
	if (st->has_holder) {
		snprintf(out->id, sizeof(out->id), "%.*s", (int)sizeof(out->id) - 1, st->holder.id);
		out->epoch = (uint64_t)st->holder.create_revision;
	}
	const char *slash = st->has_holder ? strrchr(st->holder.key, '/') : NULL;
	if (proof && proof->epoch == out->epoch && slash) {
		char *end;
		unsigned long long lease = strtoull(slash + 1, &end, 16);
		struct gf_lock_grant g = { .epoch = out->epoch };
		for (int i = 0; i < 8; i++)
			g.session_token[i] = (uint8_t)(lease >> (8 * i));
		struct gf_lock_proof want;
		if (*end == 0 && end != slash + 1 && gf_lock_grant_proof(&g, &want) == 0)
			out->proof_valid = CRYPTO_memcmp(want.token, proof->token, GF_LOCK_PROOF_LEN) == 0;
	}
	free(st);
	return 0;
}

static bool etcd_matches(const char *uri)
{
	return gf_etcd_is_uri(uri);
}

const struct gf_lock_backend gf_lock_etcd_backend = {
	.name = "etcd",
	.matches = etcd_matches,
	.open = etcd_open,
	.free = etcd_free,
	.set_secret = etcd_set_secret,
	.set_reconnect_timeout = etcd_set_reconnect_timeout,
	.set_lease = etcd_set_lease,
	.acquire = etcd_acquire,
	.release = etcd_release,
	.process = etcd_process,
	.get_fd = etcd_get_fd,
	.get_timeout_ms = etcd_get_timeout_ms,
	.fence_ms = etcd_fence_ms,
	.epoch = etcd_epoch,
	.is_held = etcd_is_held,
	.forked = etcd_forked,
	.ping = gf_etcd_ping,
	.status_json = etcd_status_json,
	.holder = etcd_holder,
};
