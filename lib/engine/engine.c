/* SPDX-License-Identifier: Apache-2.0 */
/* The engine state machine (DESIGN.md §7, seed 000 Decisions 2 and 4):
 * Init -> Standby -> Waking -> Active -> Dead, the steps that move it, the
 * probe table, the loss policy and the failover metrics. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common.h"
#include "engine_int.h"

#define GF_ENGINE_MAX_DEVICES 16
/* Backoff between private-memory OOM retries: short at first (a dying
 * process gives its memory back within milliseconds to seconds), capped so
 * freed memory is noticed quickly. */
#define OOM_BACKOFF_FIRST_MS 5
#define OOM_BACKOFF_MAX_MS 100

struct engine_dev {
	char *uri;
	gf_mem *mem;
	gf_gms *gms;
	bool mapped;   /* weights mapped (after init_weights, again after remap) */
	bool watching; /* GMS watcher thread running */
	gf_mem_alloc *priv_alloc;
	gf_mem_va *priv_va;
	uint64_t priv_addr;
	uint64_t priv_size;
};

struct gf_engine {
	struct gf_engine_ops ops;

	/* Guards state, timestamps, metrics and hooks, which probe and watcher
	 * threads read. Configuration is written only in Init, by the thread
	 * that drives the steps. */
	pthread_mutex_t mu;
	int state;
	int64_t state_since_us;
	int64_t waking_since_us;
	int64_t acquire_start_us;
	uint64_t transitions;
	struct gf_engine_metrics m;
	gf_engine_health_fn health;
	void *health_ud;
	gf_engine_loss_fn loss;
	void *loss_ud;

	char *lock_uri;
	char *id;
	int role;
	int backend;
	int64_t waking_timeout_ms;
	int64_t remap_timeout_ms;
	int64_t init_timeout_ms;
	int64_t lock_reconnect_ms; /* < 0: the lock client's default */
	int64_t loss_grace_ms;
	uint64_t private_bytes;
	char probe_addr[64];
	int probe_port;
	struct gf_engine_http *http;

	bool init_started; /* configuration is frozen from the first init_weights on */
	bool weights_ready;
	bool woken;
	_Atomic(gf_lock *) lock;
	bool lock_watching;
	atomic_bool interrupted;
	atomic_bool loss_called;

	int ndev;
	struct engine_dev dev[GF_ENGINE_MAX_DEVICES];
};

static pthread_mutex_t *mu_of(const gf_engine *e)
{
	/* Inspection calls take a const engine; the mutex is not part of its
	 * logical state. */
	return (pthread_mutex_t *)&e->mu;
}

GF_EXPORT const char *gf_engine_state_name(int state)
{
	switch (state) {
	case GF_ENGINE_INIT:
		return "init";
	case GF_ENGINE_STANDBY:
		return "standby";
	case GF_ENGINE_WAKING:
		return "waking";
	case GF_ENGINE_ACTIVE:
		return "active";
	case GF_ENGINE_DEAD:
		return "dead";
	default:
		return "unknown";
	}
}

int gf_engine_new_with_ops(gf_engine **out, const struct gf_engine_ops *ops)
{
	if (!out || !ops)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_new: NULL argument");
	gf_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return gf_err(GF_ERR_NOMEM, "gf_engine_new: out of memory");
	e->ops = *ops;
	pthread_mutex_init(&e->mu, NULL);
	e->state = GF_ENGINE_INIT;
	e->state_since_us = e->ops.now_us();
	e->m.lock_wait_us = e->m.remap_us = e->m.private_alloc_us = -1;
	e->m.serve_us = e->m.wake_total_us = -1;
	e->role = GF_ENGINE_LOADER;
	e->backend = GF_MEM_AUTO;
	e->waking_timeout_ms = 120000;
	e->remap_timeout_ms = 30000;
	e->init_timeout_ms = -1;
	e->lock_reconnect_ms = -1;
	e->loss_grace_ms = 10000;
	e->probe_port = -1;
	snprintf(e->probe_addr, sizeof(e->probe_addr), "0.0.0.0");
	*out = e;
	return 0;
}

static void release_private(gf_engine *e, struct engine_dev *d)
{
	if (d->priv_va) {
		e->ops.mem_unmap_all(d->priv_va);
		e->ops.mem_va_free(d->priv_va);
		d->priv_va = NULL;
	}
	if (d->priv_alloc) {
		e->ops.mem_alloc_free(d->priv_alloc);
		d->priv_alloc = NULL;
	}
	d->priv_addr = d->priv_size = 0;
}

static void stop_gms_watch(gf_engine *e, struct engine_dev *d)
{
	if (d->watching) {
		e->ops.gms_stop_watch(d->gms);
		d->watching = false;
	}
}

GF_EXPORT void gf_engine_free(gf_engine *e)
{
	if (!e)
		return;
	if (e->http)
		gf_engine_http_stop(e->http);
	gf_lock *lock = atomic_load(&e->lock);
	if (lock && e->lock_watching)
		e->ops.lock_stop_watch(lock);
	for (int i = e->ndev - 1; i >= 0; i--) {
		struct engine_dev *d = &e->dev[i];
		stop_gms_watch(e, d);
		release_private(e, d);
		if (d->gms)
			e->ops.gms_free(d->gms);
		if (d->mem)
			e->ops.mem_free(d->mem);
		free(d->uri);
	}
	/* Closing the lock connection last: the lock passes on only once this
	 * engine's memory is given back. */
	if (lock)
		e->ops.lock_free(lock);
	free(e->lock_uri);
	free(e->id);
	pthread_mutex_destroy(&e->mu);
	free(e);
}

/* ---- state ---- */

/* Move to @to if the current state is @from; GF_ERR_STATE otherwise. */
static int transition(gf_engine *e, int from, int to)
{
	pthread_mutex_lock(&e->mu);
	if (e->state != from) {
		int cur = e->state;
		pthread_mutex_unlock(&e->mu);
		return gf_err(GF_ERR_STATE, "engine: cannot go from %s to %s (state is %s)",
			      gf_engine_state_name(from), gf_engine_state_name(to), gf_engine_state_name(cur));
	}
	int64_t now = e->ops.now_us();
	int64_t spent = now - e->state_since_us;
	e->state = to;
	e->state_since_us = now;
	e->transitions++;
	if (to == GF_ENGINE_WAKING)
		e->waking_since_us = now;
	pthread_mutex_unlock(&e->mu);
	gf_log(GF_LOG_INFO, "engine", "event=state from=%s to=%s id=%s after_us=%" PRId64,
	       gf_engine_state_name(from), gf_engine_state_name(to), e->id ? e->id : "", spent);
	return 0;
}

static int require_state(const gf_engine *e, int want, const char *what)
{
	int cur = gf_engine_state(e);
	if (cur != want)
		return gf_err(GF_ERR_STATE, "engine: %s needs state %s, state is %s", what,
			      gf_engine_state_name(want), gf_engine_state_name(cur));
	return 0;
}

GF_EXPORT int gf_engine_state(const gf_engine *e)
{
	if (!e)
		return GF_ERR_INVALID_ARG;
	pthread_mutex_lock(mu_of(e));
	int s = e->state;
	pthread_mutex_unlock(mu_of(e));
	return s;
}

GF_EXPORT int gf_engine_mark_dead(gf_engine *e, const char *reason)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_mark_dead: NULL engine");
	pthread_mutex_lock(&e->mu);
	if (e->state == GF_ENGINE_DEAD) {
		pthread_mutex_unlock(&e->mu);
		return 0;
	}
	int from = e->state;
	int64_t now = e->ops.now_us();
	e->state = GF_ENGINE_DEAD;
	e->state_since_us = now;
	e->transitions++;
	pthread_mutex_unlock(&e->mu);
	gf_log(GF_LOG_WARN, "engine", "event=state from=%s to=dead id=%s reason=\"%s\"",
	       gf_engine_state_name(from), e->id ? e->id : "", reason ? reason : "");
	return 0;
}

/* ---- configuration ---- */

static int config_check(gf_engine *e, const char *what)
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
	int rc = config_check(e, "gf_engine_set_lock");
	if (rc)
		return rc;
	if (!uri || !*uri || !engine_id || !*engine_id)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_lock: empty URI or engine id");
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

GF_EXPORT int gf_engine_add_gms(gf_engine *e, const char *uri)
{
	int rc = config_check(e, "gf_engine_add_gms");
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
	int rc = config_check(e, "gf_engine_set_role");
	if (rc)
		return rc;
	if (role != GF_ENGINE_LOADER && role != GF_ENGINE_FOLLOWER)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_role: unknown role %d", role);
	e->role = role;
	return 0;
}

GF_EXPORT int gf_engine_set_backend(gf_engine *e, int kind)
{
	int rc = config_check(e, "gf_engine_set_backend");
	if (rc)
		return rc;
	if (kind != GF_MEM_AUTO && kind != GF_MEM_CUDA && kind != GF_MEM_HOST)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_backend: unknown backend %d", kind);
	e->backend = kind;
	return 0;
}

GF_EXPORT int gf_engine_set_waking_timeout(gf_engine *e, int64_t ms)
{
	int rc = config_check(e, "gf_engine_set_waking_timeout");
	if (rc)
		return rc;
	if (ms <= 0 || ms > INT64_MAX / 2000)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_waking_timeout: must be > 0 and finite");
	e->waking_timeout_ms = ms;
	return 0;
}

GF_EXPORT int gf_engine_set_remap_timeout(gf_engine *e, int64_t ms)
{
	int rc = config_check(e, "gf_engine_set_remap_timeout");
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
	int rc = config_check(e, "gf_engine_set_lock_reconnect_timeout");
	if (rc)
		return rc;
	e->lock_reconnect_ms = ms < 0 ? -1 : ms;
	return 0;
}

GF_EXPORT int gf_engine_set_init_timeout(gf_engine *e, int64_t ms)
{
	int rc = config_check(e, "gf_engine_set_init_timeout");
	if (rc)
		return rc;
	e->init_timeout_ms = ms < 0 ? -1 : ms;
	return 0;
}

GF_EXPORT int gf_engine_set_private_bytes(gf_engine *e, uint64_t bytes)
{
	int rc = config_check(e, "gf_engine_set_private_bytes");
	if (rc)
		return rc;
	if (bytes > SIZE_MAX / 2)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_set_private_bytes: %" PRIu64 " bytes is too large",
			      bytes);
	e->private_bytes = bytes;
	return 0;
}

GF_EXPORT int gf_engine_set_probe_address(gf_engine *e, const char *address, int port)
{
	int rc = config_check(e, "gf_engine_set_probe_address");
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

/* ---- loss policy ---- */

static void sleep_ms_real(int64_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void *loss_reaper(void *arg)
{
	int64_t grace_ms = (int64_t)(intptr_t)arg;
	sleep_ms_real(grace_ms);
	/* gf_log is not used here: the engine object may be gone by now. */
	fprintf(stderr, "gf-engine: still alive %lld ms after the loss policy's SIGTERM; _exit(70)\n",
		(long long)grace_ms);
	_exit(70);
	return NULL;
}

GF_EXPORT void gf_engine_default_loss(gf_engine *e, int err, const char *detail, void *userdata)
{
	int64_t grace_ms = 10000;
	if (e) {
		pthread_mutex_lock(&e->mu);
		grace_ms = e->loss_grace_ms;
		pthread_mutex_unlock(&e->mu);
	}
	gf_log(GF_LOG_ERR, "engine",
	       "event=engine_lost id=%s err=%s detail=\"%s\" action=terminate grace_ms=%" PRId64
	       " msg=\"terminating the process so the platform restarts it as a standby (default loss policy)\"",
	       e && e->id ? e->id : "", gf_error_name(err) ? gf_error_name(err) : "?", detail ? detail : "",
	       grace_ms);
	/* The grace timer runs on its own detached thread so the watcher
	 * thread that called us returns, and the engine's SIGTERM path can
	 * stop and join it while shutting down cleanly. */
	pthread_t t;
	pthread_attr_t attr;
	bool timer = false;
	if (pthread_attr_init(&attr) == 0) {
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		timer = pthread_create(&t, &attr, loss_reaper, (void *)(intptr_t)grace_ms) == 0;
		pthread_attr_destroy(&attr);
	}
	kill(getpid(), SIGTERM);
	if (!timer)
		loss_reaper((void *)(intptr_t)grace_ms);
}

static void engine_lost(gf_engine *e, int err, const char *what, const char *detail)
{
	/* Lock loss and GMS loss can race; the policy runs once. */
	if (atomic_exchange(&e->loss_called, true))
		return;
	char reason[512];
	snprintf(reason, sizeof(reason), "%s lost: %s", what, detail ? detail : "");
	gf_engine_mark_dead(e, reason);
	pthread_mutex_lock(&e->mu);
	gf_engine_loss_fn fn = e->loss;
	void *ud = e->loss_ud;
	pthread_mutex_unlock(&e->mu);
	if (fn)
		fn(e, err, reason, ud);
	else
		gf_engine_default_loss(e, err, reason, ud);
}

void gf_engine_lock_lost_hook(gf_lock *lock, int err, const char *detail, void *userdata)
{
	(void)lock;
	engine_lost(userdata, err ? err : GF_ERR_LOCK_LOST, "lock", detail);
}

void gf_engine_gms_lost_hook(gf_gms *gms, int err, const char *detail, void *userdata)
{
	gf_engine *e = userdata;
	int device = -1;
	for (int i = 0; i < e->ndev; i++)
		if (e->dev[i].gms == gms)
			device = i;
	char what[64];
	snprintf(what, sizeof(what), "GMS of device %d", device);
	engine_lost(e, err ? err : GF_ERR_GMS_LOST, what, detail);
}

/* ---- steps ---- */

static void close_devices(gf_engine *e)
{
	for (int i = e->ndev - 1; i >= 0; i--) {
		struct engine_dev *d = &e->dev[i];
		stop_gms_watch(e, d);
		if (d->gms)
			e->ops.gms_free(d->gms);
		if (d->mem)
			e->ops.mem_free(d->mem);
		d->gms = NULL;
		d->mem = NULL;
		d->mapped = false;
	}
}

GF_EXPORT int gf_engine_init_weights(gf_engine *e, gf_engine_load_fn load, void *userdata)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_init_weights: NULL engine");
	int rc = require_state(e, GF_ENGINE_INIT, "init_weights");
	if (rc)
		return rc;
	if (e->weights_ready)
		return gf_err(GF_ERR_STATE, "init_weights: weights are already initialised");
	if (e->ndev == 0)
		return gf_err(GF_ERR_INVALID_ARG, "init_weights: no GMS configured (gf_engine_add_gms)");
	if (e->role == GF_ENGINE_LOADER && !load)
		return gf_err(GF_ERR_INVALID_ARG, "init_weights: a loader needs a load_weights callback");
	e->init_started = true;
	int mode = e->role == GF_ENGINE_LOADER ? GF_GMS_RW_OR_RO : GF_GMS_RO;
	for (int i = 0; i < e->ndev; i++) {
		struct engine_dev *d = &e->dev[i];
		int64_t t0 = e->ops.now_us();
		rc = e->ops.mem_open(&d->mem, e->backend, i);
		if (rc)
			goto fail;
		rc = e->ops.gms_connect(&d->gms, d->uri, d->mem, mode, e->init_timeout_ms);
		if (rc)
			goto fail;
		int granted = e->ops.gms_granted_mode(d->gms);
		if (granted == GF_GMS_RW) {
			gf_log(GF_LOG_INFO, "engine", "event=weights_loading device=%d gms=%s", i, d->uri);
			rc = load(e, i, d->gms, userdata);
			if (rc)
				goto fail;
			if (e->ops.gms_granted_mode(d->gms) != GF_GMS_RO) {
				rc = gf_err(GF_ERR_STATE, "init_weights: load_weights returned without committing "
							  "device %d",
					    i);
				goto fail;
			}
			gf_log(GF_LOG_INFO, "engine", "event=weights_committed device=%d us=%" PRId64, i,
			       e->ops.now_us() - t0);
		} else {
			rc = e->ops.gms_map_all(d->gms);
			if (rc)
				goto fail;
			gf_log(GF_LOG_INFO, "engine", "event=weights_imported device=%d us=%" PRId64, i,
			       e->ops.now_us() - t0);
		}
		d->mapped = true;
	}
	e->weights_ready = true;
	return 0;
fail: {
	/* Keep the first failure's detail across the clean-up. */
	char detail[512];
	snprintf(detail, sizeof(detail), "%s", gf_error_detail());
	close_devices(e);
	e->init_started = false;
	return gf_err(rc, "%s", detail);
}
}

GF_EXPORT int gf_engine_sleep(gf_engine *e)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_sleep: NULL engine");
	int rc = require_state(e, GF_ENGINE_INIT, "sleep");
	if (rc)
		return rc;
	if (!e->weights_ready)
		return gf_err(GF_ERR_STATE, "sleep: init_weights has not completed");
	int64_t t0 = e->ops.now_us();
	for (int i = 0; i < e->ndev; i++) {
		struct engine_dev *d = &e->dev[i];
		if (!d->mapped)
			continue;
		rc = e->ops.gms_unmap(d->gms);
		if (rc)
			return rc;
		d->mapped = false;
	}
	gf_log(GF_LOG_INFO, "engine", "event=weights_unmapped devices=%d us=%" PRId64, e->ndev,
	       e->ops.now_us() - t0);
	return transition(e, GF_ENGINE_INIT, GF_ENGINE_STANDBY);
}

GF_EXPORT void gf_engine_interrupt(gf_engine *e)
{
	if (!e)
		return;
	/* Exactly one acquire sees the interrupt: the lock client's own
	 * (sticky) interrupt once it exists, else a flag that acquire() checks
	 * after creating the client; a race between the two hands the flag over. */
	gf_lock *lock = atomic_load(&e->lock);
	if (lock) {
		e->ops.lock_interrupt(lock);
		return;
	}
	atomic_store(&e->interrupted, true);
	lock = atomic_load(&e->lock);
	if (lock && atomic_exchange(&e->interrupted, false))
		e->ops.lock_interrupt(lock);
}

GF_EXPORT int gf_engine_acquire(gf_engine *e, int64_t timeout_ms)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_acquire: NULL engine");
	int rc = require_state(e, GF_ENGINE_STANDBY, "acquire");
	if (rc)
		return rc;
	if (!e->lock_uri)
		return gf_err(GF_ERR_INVALID_ARG, "acquire: no lock configured (gf_engine_set_lock)");
	gf_lock *lock = atomic_load(&e->lock);
	if (!lock) {
		rc = e->ops.lock_new(&lock, e->lock_uri, e->id);
		if (rc)
			return rc;
		if (e->lock_reconnect_ms >= 0) {
			rc = e->ops.lock_set_reconnect_timeout(lock, e->lock_reconnect_ms);
			if (rc) {
				e->ops.lock_free(lock);
				return rc;
			}
		}
		/* The hook is in place before the lock can be held. */
		e->ops.lock_set_lost_fn(lock, gf_engine_lock_lost_hook, e);
		atomic_store(&e->lock, lock);
	}
	if (atomic_exchange(&e->interrupted, false))
		return gf_err(GF_ERR_INTERRUPTED, "acquire: interrupted");
	gf_log(GF_LOG_INFO, "engine", "event=lock_waiting id=%s lock=%s", e->id, e->lock_uri);
	struct gf_lock_grant grant;
	int64_t t0 = e->ops.now_us();
	pthread_mutex_lock(&e->mu);
	e->acquire_start_us = t0;
	pthread_mutex_unlock(&e->mu);
	rc = e->ops.lock_acquire(lock, timeout_ms, &grant);
	if (rc)
		return rc;
	int64_t t1 = e->ops.now_us();
	pthread_mutex_lock(&e->mu);
	e->m.epoch = grant.epoch;
	e->m.lock_wait_us = t1 - t0;
	e->m.remap_us = e->m.private_alloc_us = e->m.serve_us = e->m.wake_total_us = -1;
	e->m.private_alloc_retries = 0;
	pthread_mutex_unlock(&e->mu);
	gf_log(GF_LOG_INFO, "engine", "event=lock_granted epoch=%" PRIu64 " id=%s wait_us=%" PRId64 "%s", grant.epoch,
	       e->id, t1 - t0, grant.reclaimed ? " reclaimed=1" : "");
	rc = transition(e, GF_ENGINE_STANDBY, GF_ENGINE_WAKING);
	if (rc)
		return rc; /* lost meanwhile (Dead) */
	rc = e->ops.lock_start_watch(lock);
	if (rc) {
		gf_engine_mark_dead(e, "cannot watch the lock connection");
		return rc;
	}
	e->lock_watching = true;
	return 0;
}

static int alloc_private(gf_engine *e, int i, int64_t deadline_us)
{
	struct engine_dev *d = &e->dev[i];
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	int64_t backoff = OOM_BACKOFF_FIRST_MS;
	uint64_t retries = 0;
	int rc;
	for (;;) {
		rc = e->ops.mem_create(d->mem, (size_t)e->private_bytes, &a);
		if (rc != GF_ERR_OUT_OF_MEMORY)
			break;
		int64_t left_ms = (deadline_us - e->ops.now_us()) / 1000;
		if (left_ms <= 0) {
			rc = gf_err(GF_ERR_OUT_OF_MEMORY,
				    "wake: %" PRIu64 " private bytes on device %d still unavailable when the waking "
				    "timeout passed (%" PRIu64 " retries)",
				    e->private_bytes, i, retries);
			break;
		}
		if (retries == 0)
			gf_log(GF_LOG_WARN, "engine", "event=private_alloc_retry device=%d bytes=%" PRIu64
			       " msg=\"out of memory; the previous engine's memory may still be draining\"",
			       i, e->private_bytes);
		retries++;
		e->ops.sleep_ms(backoff < left_ms ? backoff : left_ms);
		backoff = backoff * 2 > OOM_BACKOFF_MAX_MS ? OOM_BACKOFF_MAX_MS : backoff * 2;
	}
	pthread_mutex_lock(&e->mu);
	e->m.private_alloc_retries += retries;
	pthread_mutex_unlock(&e->mu);
	if (rc)
		return rc;
	size_t size = e->ops.mem_alloc_size(a);
	rc = e->ops.mem_reserve(d->mem, size, 0, &va);
	if (rc) {
		e->ops.mem_alloc_free(a);
		return rc;
	}
	rc = e->ops.mem_map(va, 0, a, GF_MEM_READWRITE);
	if (rc) {
		e->ops.mem_va_free(va);
		e->ops.mem_alloc_free(a);
		return rc;
	}
	d->priv_alloc = a;
	d->priv_va = va;
	d->priv_addr = e->ops.mem_va_addr(va);
	d->priv_size = size;
	return 0;
}

GF_EXPORT int gf_engine_wake_up(gf_engine *e)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_wake_up: NULL engine");
	int rc = require_state(e, GF_ENGINE_WAKING, "wake_up");
	if (rc)
		return rc;
	if (e->woken)
		return gf_err(GF_ERR_STATE, "wake_up: already woken; serve next");
	pthread_mutex_lock(&e->mu);
	int64_t deadline = e->waking_since_us + e->waking_timeout_ms * 1000;
	pthread_mutex_unlock(&e->mu);

	int64_t t0 = e->ops.now_us();
	for (int i = 0; i < e->ndev; i++) {
		rc = e->ops.gms_remap(e->dev[i].gms, e->remap_timeout_ms);
		if (rc)
			goto fail;
		e->dev[i].mapped = true;
	}
	int64_t t1 = e->ops.now_us();
	gf_log(GF_LOG_INFO, "engine", "event=weights_remapped us=%" PRId64 " devices=%d", t1 - t0, e->ndev);
	if (e->private_bytes > 0) {
		for (int i = 0; i < e->ndev; i++) {
			rc = alloc_private(e, i, deadline);
			if (rc)
				goto fail;
		}
	}
	/* Mappings are complete on the device before anything is served from
	 * them (LESSONS.md item 2). */
	for (int i = 0; i < e->ndev; i++) {
		rc = e->ops.mem_synchronize(e->dev[i].mem);
		if (rc)
			goto fail;
	}
	int64_t t2 = e->ops.now_us();
	gf_log(GF_LOG_INFO, "engine", "event=kv_allocated us=%" PRId64 " devices=%d bytes=%" PRIu64, t2 - t1,
	       e->ndev, e->private_bytes);
	/* From here a GMS that goes away is a loss (Decision 1). */
	for (int i = 0; i < e->ndev; i++) {
		struct engine_dev *d = &e->dev[i];
		e->ops.gms_set_lost_fn(d->gms, gf_engine_gms_lost_hook, e);
		rc = e->ops.gms_start_watch(d->gms);
		if (rc)
			goto fail;
		d->watching = true;
	}
	pthread_mutex_lock(&e->mu);
	e->m.remap_us = t1 - t0;
	e->m.private_alloc_us = t2 - t1;
	pthread_mutex_unlock(&e->mu);
	e->woken = true;
	return 0;
fail: {
	char detail[512];
	snprintf(detail, sizeof(detail), "%s", gf_error_detail());
	/* All-or-nothing: nothing stays mapped after a failed wake. */
	for (int i = e->ndev - 1; i >= 0; i--) {
		struct engine_dev *d = &e->dev[i];
		stop_gms_watch(e, d);
		release_private(e, d);
		if (d->mapped) {
			e->ops.gms_unmap(d->gms);
			d->mapped = false;
		}
	}
	char reason[600];
	snprintf(reason, sizeof(reason), "wake failed: %s: %s", gf_error_name(rc) ? gf_error_name(rc) : "?",
		 detail);
	gf_log(GF_LOG_ERR, "engine", "event=wake_failed id=%s err=%s detail=\"%s\"", e->id ? e->id : "",
	       gf_error_name(rc) ? gf_error_name(rc) : "?", detail);
	gf_engine_mark_dead(e, reason);
	return gf_err(rc, "%s", detail);
}
}

GF_EXPORT int gf_engine_serve(gf_engine *e, gf_engine_step_fn serve, void *userdata)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_serve: NULL engine");
	int rc = require_state(e, GF_ENGINE_WAKING, "serve");
	if (rc)
		return rc;
	if (!e->woken)
		return gf_err(GF_ERR_STATE, "serve: wake_up has not completed");
	int64_t t0 = e->ops.now_us();
	if (serve) {
		rc = serve(e, userdata);
		if (rc) {
			char detail[512];
			snprintf(detail, sizeof(detail), "%s", gf_error_detail());
			char reason[600];
			snprintf(reason, sizeof(reason), "serve failed: %s", detail);
			gf_engine_mark_dead(e, reason);
			return gf_err(rc, "%s", detail);
		}
	}
	int64_t t1 = e->ops.now_us();
	pthread_mutex_lock(&e->mu);
	e->m.serve_us = t1 - t0;
	e->m.wake_total_us = t1 - e->waking_since_us;
	pthread_mutex_unlock(&e->mu);
	rc = transition(e, GF_ENGINE_WAKING, GF_ENGINE_ACTIVE);
	if (rc)
		return rc;
	pthread_mutex_lock(&e->mu);
	e->m.failovers++;
	struct gf_engine_metrics m = e->m;
	pthread_mutex_unlock(&e->mu);
	gf_log(GF_LOG_INFO, "engine",
	       "event=serving id=%s epoch=%" PRIu64 " lock_wait_us=%" PRId64 " remap_us=%" PRId64
	       " kv_us=%" PRId64 " serve_us=%" PRId64 " wake_total_us=%" PRId64,
	       e->id ? e->id : "", m.epoch, m.lock_wait_us, m.remap_us, m.private_alloc_us, m.serve_us,
	       m.wake_total_us);
	return 0;
}

GF_EXPORT int gf_engine_run_shadow(gf_engine *e, const struct gf_engine_callbacks *cb)
{
	static const struct gf_engine_callbacks none;
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_run_shadow: NULL engine");
	if (!cb)
		cb = &none;
	int rc;
	if (e->probe_port >= 0 && !e->http) {
		rc = gf_engine_start_probe_server(e);
		if (rc)
			return rc;
	}
	rc = gf_engine_init_weights(e, cb->load_weights, cb->userdata);
	if (rc)
		return rc;
	if (cb->weights_ready) {
		rc = cb->weights_ready(e, cb->userdata);
		if (rc)
			return rc;
	}
	rc = gf_engine_sleep(e);
	if (rc)
		return rc;
	rc = gf_engine_acquire(e, -1);
	if (rc)
		return rc;
	rc = gf_engine_wake_up(e);
	if (rc)
		return rc;
	return gf_engine_serve(e, cb->serve, cb->userdata);
}

/* ---- probes ---- */

int gf_engine_probe_decision(int state, int probe, int waking_expired, int healthy)
{
	if (probe != GF_PROBE_LIVE && probe != GF_PROBE_READY && probe != GF_PROBE_STARTUP)
		return -1;
	switch (state) {
	case GF_ENGINE_STANDBY:
		/* A healthy standby must not pull the pod out of service. */
		return 200;
	case GF_ENGINE_WAKING:
		if (probe == GF_PROBE_LIVE && waking_expired)
			return 503; /* a hung wake gets the container killed */
		return 200;
	case GF_ENGINE_ACTIVE:
		if (probe == GF_PROBE_STARTUP)
			return 200;
		return healthy ? 200 : 503;
	case GF_ENGINE_INIT: /* the startup probe covers loading */
	case GF_ENGINE_DEAD:
	default:
		return 503;
	}
}

GF_EXPORT int gf_engine_probe(gf_engine *e, int probe)
{
	if (!e)
		return -1;
	pthread_mutex_lock(&e->mu);
	int state = e->state;
	int expired = state == GF_ENGINE_WAKING &&
		      e->ops.now_us() - e->waking_since_us >= e->waking_timeout_ms * 1000;
	gf_engine_health_fn health = e->health;
	void *ud = e->health_ud;
	pthread_mutex_unlock(&e->mu);
	int healthy = 1;
	if (state == GF_ENGINE_ACTIVE && probe != GF_PROBE_STARTUP && health)
		healthy = health(e, ud) ? 1 : 0;
	return gf_engine_probe_decision(state, probe, expired, healthy);
}

/* ---- inspection ---- */

GF_EXPORT int gf_engine_metrics(const gf_engine *e, struct gf_engine_metrics *out)
{
	if (!e || !out)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_metrics: NULL argument");
	pthread_mutex_lock(mu_of(e));
	struct gf_engine_metrics m = e->m;
	m.state = e->state;
	m.time_in_state_us = e->ops.now_us() - e->state_since_us;
	m.transitions = e->transitions;
	pthread_mutex_unlock(mu_of(e));
	*out = m;
	return 0;
}

GF_EXPORT int gf_engine_metrics_text(const gf_engine *e, char **text)
{
	struct gf_engine_metrics m;
	if (!text)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_metrics_text: NULL argument");
	int rc = gf_engine_metrics(e, &m);
	if (rc)
		return rc;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return gf_err(GF_ERR_NOMEM, "metrics: out of memory");
	fprintf(f, "# HELP gf_engine_state Engine state: 1 for the current state, 0 for the others.\n"
		   "# TYPE gf_engine_state gauge\n");
	for (int s = GF_ENGINE_INIT; s <= GF_ENGINE_DEAD; s++)
		fprintf(f, "gf_engine_state{state=\"%s\"} %d\n", gf_engine_state_name(s), s == m.state);
	fprintf(f, "# HELP gf_engine_time_in_state_us Microseconds since the last state change.\n"
		   "# TYPE gf_engine_time_in_state_us gauge\n"
		   "gf_engine_time_in_state_us %" PRId64 "\n",
		m.time_in_state_us);
	fprintf(f, "# HELP gf_engine_transitions_total State changes since the engine was created.\n"
		   "# TYPE gf_engine_transitions_total counter\n"
		   "gf_engine_transitions_total %" PRIu64 "\n",
		m.transitions);
	fprintf(f, "# HELP gf_engine_failovers_total Takeovers completed (Standby to Active).\n"
		   "# TYPE gf_engine_failovers_total counter\n"
		   "gf_engine_failovers_total %" PRIu64 "\n",
		m.failovers);
	fprintf(f, "# HELP gf_engine_lock_epoch Fencing epoch of the lock grant (0 before).\n"
		   "# TYPE gf_engine_lock_epoch gauge\n"
		   "gf_engine_lock_epoch %" PRIu64 "\n",
		m.epoch);
	fprintf(f, "# HELP gf_engine_last_failover_us Last takeover broken down by phase, in microseconds.\n"
		   "# TYPE gf_engine_last_failover_us gauge\n");
	const struct {
		const char *phase;
		int64_t us;
	} phases[] = { { "lock_wait", m.lock_wait_us }, { "remap", m.remap_us },
		       { "private_alloc", m.private_alloc_us }, { "serve", m.serve_us },
		       { "total", m.wake_total_us } };
	for (size_t i = 0; i < GF_ARRAY_SIZE(phases); i++)
		if (phases[i].us >= 0)
			fprintf(f, "gf_engine_last_failover_us{phase=\"%s\"} %" PRId64 "\n", phases[i].phase,
				phases[i].us);
	fprintf(f, "# HELP gf_engine_private_alloc_retries Out-of-memory retries of the last wake.\n"
		   "# TYPE gf_engine_private_alloc_retries gauge\n"
		   "gf_engine_private_alloc_retries %" PRIu64 "\n",
		m.private_alloc_retries);
	if (fclose(f) != 0 || !buf) {
		free(buf);
		return gf_err(GF_ERR_NOMEM, "metrics: out of memory");
	}
	*text = buf;
	return 0;
}

static json_t *us_or_null(int64_t us)
{
	return us >= 0 ? json_integer(us) : json_null();
}

GF_EXPORT int gf_engine_state_json(const gf_engine *e, char **out)
{
	struct gf_engine_metrics m;
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_state_json: NULL argument");
	int rc = gf_engine_metrics(e, &m);
	if (rc)
		return rc;
	json_t *last = json_pack("{s:o,s:o,s:o,s:o,s:o,s:I}", "lock_wait_us", us_or_null(m.lock_wait_us),
				 "remap_us", us_or_null(m.remap_us), "private_alloc_us",
				 us_or_null(m.private_alloc_us), "serve_us", us_or_null(m.serve_us), "total_us",
				 us_or_null(m.wake_total_us), "private_alloc_retries",
				 (json_int_t)m.private_alloc_retries);
	json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "state", gf_engine_state_name(m.state),
			      "id", e->id ? e->id : "", "role", e->role == GF_ENGINE_LOADER ? "loader" : "follower",
			      "devices", (json_int_t)e->ndev, "epoch", (json_int_t)m.epoch, "time_in_state_us",
			      (json_int_t)m.time_in_state_us, "transitions", (json_int_t)m.transitions, "failovers",
			      (json_int_t)m.failovers, "waking_timeout_ms", (json_int_t)e->waking_timeout_ms,
			      "last_failover", last);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!s)
		return gf_err(GF_ERR_NOMEM, "state json: out of memory");
	*out = s;
	return 0;
}

GF_EXPORT uint64_t gf_engine_epoch(const gf_engine *e)
{
	if (!e)
		return 0;
	pthread_mutex_lock(mu_of(e));
	uint64_t ep = e->m.epoch;
	pthread_mutex_unlock(mu_of(e));
	return ep;
}

GF_EXPORT const char *gf_engine_id(const gf_engine *e)
{
	return e && e->id ? e->id : "";
}

GF_EXPORT int gf_engine_device_count(const gf_engine *e)
{
	return e ? e->ndev : 0;
}

GF_EXPORT gf_gms *gf_engine_gms(gf_engine *e, int device)
{
	if (!e || device < 0 || device >= e->ndev)
		return NULL;
	return e->dev[device].gms;
}

GF_EXPORT gf_mem *gf_engine_mem(gf_engine *e, int device)
{
	if (!e || device < 0 || device >= e->ndev)
		return NULL;
	return e->dev[device].mem;
}

GF_EXPORT int gf_engine_private_memory(const gf_engine *e, int device, uint64_t *addr, uint64_t *size)
{
	if (!e || device < 0 || device >= e->ndev)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_private_memory: bad engine or device");
	if (!e->dev[device].priv_va)
		return gf_err(GF_ERR_STATE, "gf_engine_private_memory: no private memory on device %d (not awake, "
					    "or none configured)",
			      device);
	if (addr)
		*addr = e->dev[device].priv_addr;
	if (size)
		*size = e->dev[device].priv_size;
	return 0;
}

/* ---- probe server ---- */

GF_EXPORT int gf_engine_start_probe_server(gf_engine *e)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_start_probe_server: NULL engine");
	if (e->http)
		return 0;
	if (e->probe_port < 0)
		return gf_err(GF_ERR_STATE, "probe server disabled (gf_engine_set_probe_address with port >= 0)");
	return gf_engine_http_start(e, e->probe_addr, e->probe_port, &e->http);
}

GF_EXPORT int gf_engine_probe_port(const gf_engine *e)
{
	return e && e->http ? gf_engine_http_port(e->http) : -1;
}
