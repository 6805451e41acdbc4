/* SPDX-License-Identifier: Apache-2.0 */
/* The engine state machine (docs/design.md, decisions 2 and 4):
 * Init -> Standby -> Waking -> Active -> Dead, the steps that move it
 * (calling the lock, GMS and memory APIs directly) and the probe table. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common.h"
#include "engine_int.h"

static const struct gf_engine_clock real_clock = { .now_us = gf_now_us, .sleep_ms = gf_engine_real_sleep_ms };

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

GF_EXPORT int gf_engine_new(gf_engine **out)
{
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_new: NULL argument");
	gf_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return gf_err(GF_ERR_NOMEM, "gf_engine_new: out of memory");
	e->clock = real_clock;
	pthread_mutex_init(&e->mu, NULL);
	e->state = GF_ENGINE_INIT;
	e->state_since_us = e->created_us = e->clock.now_us();
	e->gate_us = -1;
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
	e->lsn_dummy = -1;
	snprintf(e->probe_addr, sizeof(e->probe_addr), "0.0.0.0");
	e->init_intr_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (e->init_intr_fd < 0) {
		int err = errno;
		pthread_mutex_destroy(&e->mu);
		free(e);
		return gf_err(GF_ERR_IO, "gf_engine_new: eventfd: %s", strerror(err));
	}
	*out = e;
	return 0;
}

/* Take an interrupt of Init; true when there was one. */
static bool drain_init_interrupt(gf_engine *e)
{
	uint64_t n;
	ssize_t r;
	while ((r = read(e->init_intr_fd, &n, sizeof(n))) < 0 && errno == EINTR)
		;
	return r == (ssize_t)sizeof(n);
}

void gf_engine_set_clock(gf_engine *e, const struct gf_engine_clock *clock)
{
	pthread_mutex_lock(&e->mu);
	e->clock = *clock;
	e->state_since_us = e->created_us = clock->now_us();
	pthread_mutex_unlock(&e->mu);
}

/* The private memory goes; its address range stays for the next backing. */
static void release_private(struct engine_dev *d)
{
	gf_mem_region_release(d->priv);
	d->kv_mapped = false;
}

static void stop_gms_watch(gf_engine *e, struct engine_dev *d)
{
	if (d->watching) {
		gf_gms_stop_watch(d->gms);
		d->watching = false;
	}
}

GF_EXPORT void gf_engine_free(gf_engine *e)
{
	if (!e)
		return;
	gf_log_release(); /* a wake's held lines, if it never got to serve */
	if (e->watchdog_running) {
		atomic_store(&e->watchdog_stop, true);
		pthread_join(e->watchdog, NULL);
	}
	gf_engine_http_stop(atomic_load(&e->http));
	/* No probe runs any more, so no loss-policy thread starts after this. */
	pthread_mutex_lock(&e->mu);
	bool fatal_thread = e->fatal_thread_running;
	pthread_mutex_unlock(&e->mu);
	if (fatal_thread)
		pthread_join(e->fatal_thread, NULL);
	gf_lock *lock = atomic_load(&e->lock);
	if (lock && e->lock_watching)
		gf_lock_stop_watch(lock);
	for (int i = e->ndev - 1; i >= 0; i--) {
		struct engine_dev *d = &e->dev[i];
		stop_gms_watch(e, d);
		gf_mem_region_free(d->priv);
		if (d->gms)
			gf_gms_free(d->gms);
		if (d->mem)
			gf_mem_free(d->mem);
		free(d->uri);
	}
	/* Closing the lock connection last: the lock passes on only once this
	 * engine's memory is given back. */
	if (lock)
		gf_lock_free(lock);
	free(e->lock_uri);
	gf_engine_wipe_lock_secret(e);
	free(e->id);
	free(e->model);
	gf_close(e->lsn_dummy);
	gf_close(e->init_intr_fd);
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
	int64_t now = e->clock.now_us();
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
	pthread_mutex_lock(gf_engine_mu(e));
	int s = e->state;
	pthread_mutex_unlock(gf_engine_mu(e));
	return s;
}

void gf_engine_die(gf_engine *e, const char *cause, const char *reason)
{
	pthread_mutex_lock(&e->mu);
	if (e->state == GF_ENGINE_DEAD) {
		pthread_mutex_unlock(&e->mu);
		return;
	}
	int from = e->state;
	int64_t now = e->clock.now_us();
	e->state = GF_ENGINE_DEAD;
	e->state_since_us = now;
	e->transitions++;
	snprintf(e->dead_cause, sizeof(e->dead_cause), "%s", cause);
	snprintf(e->dead_reason, sizeof(e->dead_reason), "%s", reason ? reason : "");
	pthread_mutex_unlock(&e->mu);
	/* A wake that ends here (on whichever thread) writes what it held first. */
	gf_log_release();
	gf_log(GF_LOG_WARN, "engine", "event=state from=%s to=dead id=%s cause=%s reason=\"%s\"",
	       gf_engine_state_name(from), e->id ? e->id : "", cause, reason ? reason : "");
}

GF_EXPORT int gf_engine_mark_dead(gf_engine *e, const char *reason)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_mark_dead: NULL engine");
	gf_engine_die(e, "marked", reason);
	return 0;
}

/* ---- steps ---- */

static void close_devices(gf_engine *e)
{
	for (int i = e->ndev - 1; i >= 0; i--) {
		struct engine_dev *d = &e->dev[i];
		stop_gms_watch(e, d);
		gf_mem_region_free(d->priv);
		d->priv = NULL;
		if (d->gms)
			gf_gms_free(d->gms);
		if (d->mem)
			gf_mem_free(d->mem);
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
	rc = gf_engine_start_watchdog(e);
	if (rc)
		return rc;
	e->init_started = true;
	int mode = e->role == GF_ENGINE_LOADER ? GF_GMS_RW_OR_RO : GF_GMS_RO;
	for (int i = 0; i < e->ndev; i++) {
		struct engine_dev *d = &e->dev[i];
		int64_t t0 = e->clock.now_us();
		rc = gf_mem_open(&d->mem, e->backend, e->first_device + i);
		if (rc)
			goto fail;
		int64_t init_ms = gf_engine_init_timeout(e);
		/* A slow loader is not a missing one: the wait goes on while the
		 * GMS's writer makes progress, whatever the load takes. */
		const struct gf_gms_connect_opts opts = { .by_progress = 1, .cancel_fd = e->init_intr_fd };
		rc = gf_gms_connect(&d->gms, d->uri, d->mem, mode, init_ms, &opts);
		if (rc == GF_ERR_INTERRUPTED) {
			drain_init_interrupt(e);
			rc = gf_err(GF_ERR_INTERRUPTED, "init_weights: interrupted while waiting for the GMS of "
							"device %d (%s)", i, d->uri);
		} else if (rc == GF_ERR_TIMEOUT) {
			char why[512];
			snprintf(why, sizeof(why), "%s", gf_error_detail());
			rc = gf_err(GF_ERR_TIMEOUT,
				    "init_weights: no committed layout in the GMS of device %d (%s), init timeout %" PRId64
				    " ms: %s",
				    i, d->uri, init_ms, why);
			gf_log(GF_LOG_ERR, "engine",
			       "event=init_timeout id=%s device=%d gms=%s timeout_ms=%" PRId64 " reason=%s",
			       e->id ? e->id : "", i, d->uri, init_ms,
			       strstr(why, "no writer connected") ? "no_writer"
			       : strstr(why, "made no progress") ? "writer_stalled" : "timeout");
		}
		if (rc)
			goto fail;
		int granted = gf_gms_granted_mode(d->gms);
		if (granted == GF_GMS_RW) {
			gf_log(GF_LOG_INFO, "engine", "event=weights_loading device=%d gms=%s", i, d->uri);
			rc = load(e, i, d->gms, userdata);
			if (rc)
				goto fail;
			if (gf_gms_granted_mode(d->gms) != GF_GMS_RO) {
				rc = gf_err(GF_ERR_STATE, "init_weights: load_weights returned without committing "
							  "device %d",
					    i);
				goto fail;
			}
			gf_log(GF_LOG_INFO, "engine", "event=weights_committed device=%d us=%" PRId64, i,
			       e->clock.now_us() - t0);
		} else {
			rc = gf_gms_map_all(d->gms);
			if (rc)
				goto fail;
			gf_log(GF_LOG_INFO, "engine", "event=weights_imported device=%d us=%" PRId64, i,
			       e->clock.now_us() - t0);
		}
		d->mapped = true;
		/* The private (KV) memory's address is fixed from here on: an
		 * engine can build what points into it (CUDA graphs captured at
		 * Init) now, and the wake backs the same range. */
		if (e->private_bytes > 0) {
			rc = gf_mem_region_reserve(&d->priv, d->mem, (size_t)e->private_bytes);
			if (rc)
				goto fail;
		}
	}
	e->weights_ready = true;
	atomic_store(&e->init_done, true);
	/* One that came after the last wait is the next blocking call's: acquire()'s. */
	if (drain_init_interrupt(e))
		gf_engine_interrupt(e);
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
	int64_t t0 = e->clock.now_us();
	for (int i = 0; i < e->ndev; i++) {
		struct engine_dev *d = &e->dev[i];
		if (!d->mapped)
			continue;
		rc = gf_gms_unmap(d->gms);
		if (rc)
			return rc;
		d->mapped = false;
	}
	gf_log(GF_LOG_INFO, "engine", "event=weights_unmapped devices=%d us=%" PRId64, e->ndev,
	       e->clock.now_us() - t0);
	/* The grant's fence proof is an HMAC, and the first one a process
	 * computes loads the crypto library's providers (about 1 ms, far more
	 * under a debugger): that happens now, before the engine waits for the
	 * lock, with a throwaway grant. */
	struct gf_lock_grant warm = { .epoch = 1 };
	struct gf_lock_proof warm_proof;
	gf_lock_grant_proof(&warm, &warm_proof);
	return transition(e, GF_ENGINE_INIT, GF_ENGINE_STANDBY);
}

GF_EXPORT void gf_engine_interrupt(gf_engine *e)
{
	if (!e)
		return;
	if (!atomic_load(&e->init_done)) {
		uint64_t one = 1;
		ssize_t n = write(e->init_intr_fd, &one, sizeof(one));
		(void)n; /* a full counter is already an interrupt */
		return;
	}
	/* Exactly one acquire sees the interrupt: the lock client's own
	 * (sticky) interrupt once it exists, else a flag that acquire() checks
	 * after creating the client; a race between the two hands the flag over. */
	gf_lock *lock = atomic_load(&e->lock);
	if (lock) {
		gf_lock_interrupt(lock);
		return;
	}
	atomic_store(&e->interrupted, true);
	lock = atomic_load(&e->lock);
	if (lock && atomic_exchange(&e->interrupted, false))
		gf_lock_interrupt(lock);
}

static int acquire_boosted(gf_engine *e, gf_lock *lock, int64_t timeout_ms, int64_t t0);

/*
 * The lock's watcher thread is not woken at the grant: waking it there put
 * a thread wake-up, and on a busy machine the CPU it takes, between the
 * grant and the first answer. It starts when the engine settles (after
 * the first answers with settling deferred, at Active otherwise) or this
 * long after the grant, whichever comes first: a long wake is watched as
 * before (a loss seen, heartbeats of a TCP or etcd lease kept), a short one
 * is not slowed. Until then gf_engine_may_accept() looks for the lock
 * server's hang-up itself before each accept.
 */
#define LOCK_WATCH_DELAY_MS 5

/*
 * The lock server says this engine is next (gf_lock_set_next_fn()), on the
 * thread waiting in gf_engine_acquire(): the GMS wake requests go out now,
 * with the coming grant's proof, so each GMS answers while the lock server
 * writes its state and the grant travels, instead of after. A wake request
 * is an RO request, which needs no lock; a grant that does not come after
 * all takes them back (a reader that never maps must not hold back a writer).
 */
/*
 * Every GMS gets the wake's request (gf_gms_remap_begin(): a no-op once
 * sent), carrying @proof when there is one: a GMS fenced by the lock
 * (gf-gmsd --lock) then knows the wake's connects as the holder's. A
 * refusal only means the remap connects afresh.
 */
static void send_wake_requests(gf_engine *e, const struct gf_lock_proof *proof)
{
	for (int i = 0; i < e->ndev; i++) {
		gf_gms *g = e->dev[i].gms;
		if (!g)
			continue;
		if (proof)
			gf_gms_set_lock_proof(g, proof);
		if (gf_gms_remap_begin(g, e->remap_timeout_ms) < 0)
			gf_log(GF_LOG_DEBUG, "engine", "event=remap_begin device=%d msg=\"%s\"", i, gf_error_detail());
	}
}

static void lock_next_hook(gf_lock *lock, int next, const struct gf_lock_proof *proof, void *userdata)
{
	gf_engine *e = userdata;
	(void)lock;
	if (gf_engine_state(e) != GF_ENGINE_STANDBY)
		return;
	if (next) {
		send_wake_requests(e, proof);
		return;
	}
	for (int i = 0; i < e->ndev; i++)
		if (e->dev[i].gms)
			gf_gms_remap_cancel(e->dev[i].gms);
}

GF_EXPORT int gf_engine_acquire(gf_engine *e, int64_t timeout_ms)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_acquire: NULL engine");
	int rc = require_state(e, GF_ENGINE_STANDBY, "acquire");
	if (rc)
		return rc;
	if (e->rank)
		return gf_err(GF_ERR_STATE, "acquire: rank %d holds no lock; it wakes with gf_engine_wake_as_rank()", e->rank);
	if (!e->lock_uri)
		return gf_err(GF_ERR_INVALID_ARG, "acquire: no lock configured (gf_engine_set_lock)");
	gf_lock *lock = atomic_load(&e->lock);
	if (!lock) {
		rc = gf_lock_new(&lock, e->lock_uri, e->id);
		if (rc)
			return rc;
		if (e->lock_secret) {
			rc = gf_lock_set_secret(lock, e->lock_secret, e->lock_secret_len);
			if (rc) {
				gf_lock_free(lock);
				return rc;
			}
		}
		if (e->lock_reconnect_ms >= 0) {
			rc = gf_lock_set_reconnect_timeout(lock, e->lock_reconnect_ms);
			if (rc) {
				gf_lock_free(lock);
				return rc;
			}
		}
		rc = gf_engine_pool_apply(e, lock);
		if (rc) {
			gf_lock_free(lock);
			return rc;
		}
		/* The watcher thread exists before the wait: a wake only wakes it. */
		rc = gf_lock_prepare_watch(lock);
		if (rc) {
			gf_lock_free(lock);
			return rc;
		}
		/* The hook is in place before the lock can be held. */
		gf_lock_set_lost_fn(lock, gf_engine_lock_lost_hook, e);
		gf_lock_set_step_down_fn(lock, gf_engine_lock_step_down_hook, e);
		gf_lock_set_next_fn(lock, lock_next_hook, e);
		/* The ranks registered so far go with the first connection; later
		 * ones go straight to the lock client (gf_engine_add_holder_pid()). */
		pthread_mutex_lock(&e->mu);
		for (size_t i = 0; i < e->nholder_pids && rc == 0; i++) {
			rc = gf_lock_add_pid(lock, e->holder_pids[i]);
			if (rc == GF_ERR_NOT_FOUND) {
				/* Gone already: nothing of it is left to wait for. */
				gf_log(GF_LOG_INFO, "engine", "event=holder_pid_gone id=%s pid=%d", e->id, e->holder_pids[i]);
				rc = 0;
			}
		}
		if (rc == 0)
			atomic_store(&e->lock, lock);
		pthread_mutex_unlock(&e->mu);
		if (rc) {
			gf_lock_free(lock);
			return rc;
		}
	}
	if (atomic_exchange(&e->interrupted, false))
		return gf_err(GF_ERR_INTERRUPTED, "acquire: interrupted");
	gf_log(GF_LOG_INFO, "engine", "event=lock_waiting id=%s lock=%s", e->id, e->lock_uri);
	gf_log_hold_prepare();
	gf_engine_listener_prepare(e);
	int64_t t0 = e->clock.now_us();
	pthread_mutex_lock(&e->mu);
	e->acquire_start_us = t0;
	pthread_mutex_unlock(&e->mu);
	gf_engine_boost(e);
	rc = acquire_boosted(e, lock, timeout_ms, t0);
	if (rc) {
		gf_log_release();
		gf_engine_unboost(e);
	}
	return rc;
}

GF_EXPORT int gf_engine_add_holder_pid(gf_engine *e, int pid)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_add_holder_pid: NULL engine");
	if (pid <= 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_add_holder_pid: pid %d is not a process id", pid);
	if (e->rank)
		return gf_err(GF_ERR_STATE, "gf_engine_add_holder_pid: rank %d holds no lock; register with rank 0's engine",
			      e->rank);
	if (gf_engine_state(e) == GF_ENGINE_DEAD)
		return gf_err(GF_ERR_STATE, "gf_engine_add_holder_pid: the engine is dead");
	pthread_mutex_lock(&e->mu);
	gf_lock *lock = atomic_load(&e->lock);
	int rc = 0;
	if (!lock) {
		/* Checked now, so the caller hears of a mistake where it made it. */
		if (e->lock_uri && strncmp(e->lock_uri, "unix://", 7) != 0) {
			rc = gf_err(GF_ERR_NOT_SUPPORTED,
				    "gf_engine_add_holder_pid: the lock %s cannot wait for processes (a pidfd cannot cross hosts); only unix:// lock servers can",
				    e->lock_uri);
		} else if (kill(pid, 0) < 0 && errno == ESRCH) {
			rc = gf_err(GF_ERR_NOT_FOUND, "gf_engine_add_holder_pid: no process %d", pid);
		} else {
			bool known = false;
			for (size_t i = 0; i < e->nholder_pids && !known; i++)
				known = e->holder_pids[i] == pid;
			if (!known && e->nholder_pids >= GF_LOCK_MAX_PIDS)
				rc = gf_err(GF_ERR_TOO_BIG, "gf_engine_add_holder_pid: more than %d processes", GF_LOCK_MAX_PIDS);
			else if (!known)
				e->holder_pids[e->nholder_pids++] = pid;
		}
	}
	pthread_mutex_unlock(&e->mu);
	if (!lock || rc)
		return rc;
	/* The lock client counts and checks (it is thread-safe); the count here is for the status. */
	rc = gf_lock_add_pid(lock, pid);
	if (rc == 0) {
		pthread_mutex_lock(&e->mu);
		bool known = false;
		for (size_t i = 0; i < e->nholder_pids && !known; i++)
			known = e->holder_pids[i] == pid;
		if (!known && e->nholder_pids < GF_LOCK_MAX_PIDS)
			e->holder_pids[e->nholder_pids++] = pid;
		pthread_mutex_unlock(&e->mu);
	}
	return rc;
}

GF_EXPORT int gf_engine_wake_as_rank(gf_engine *e, uint64_t epoch)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_wake_as_rank: NULL engine");
	if (!e->rank)
		return gf_err(GF_ERR_STATE, "wake_as_rank: not a rank engine (gf_engine_set_rank); rank 0 acquires the lock");
	if (epoch == 0)
		return gf_err(GF_ERR_INVALID_ARG, "wake_as_rank: epoch 0 is no grant");
	int rc = require_state(e, GF_ENGINE_STANDBY, "wake_as_rank");
	if (rc)
		return rc;
	gf_log_hold_prepare();
	gf_engine_boost(e);
	/* Rank 0 holds the grant: from here this rank's info lines wait for its serve, as after a grant. */
	gf_log_hold();
	int64_t t1 = e->clock.now_us();
	pthread_mutex_lock(&e->mu);
	e->m.epoch = epoch;
	e->m.lock_wait_us = e->m.remap_us = e->m.private_alloc_us = e->m.serve_us = e->m.wake_total_us = -1;
	e->m.private_alloc_retries = 0;
	pthread_mutex_unlock(&e->mu);
	send_wake_requests(e, NULL);
	gf_log(GF_LOG_INFO, "engine", "event=rank_waking id=%s rank=%d epoch=%" PRIu64, e->id, e->rank, epoch);
	rc = gf_engine_memory_gate(e, t1 + e->waking_timeout_ms * 1000);
	if (rc == 0)
		rc = transition(e, GF_ENGINE_STANDBY, GF_ENGINE_WAKING);
	if (rc) {
		gf_log_release();
		gf_engine_unboost(e);
	}
	return rc;
}

/* gf_engine_acquire() from the wait on: under the wake priority, if any. */
static int acquire_boosted(gf_engine *e, gf_lock *lock, int64_t timeout_ms, int64_t t0)
{
	struct gf_lock_grant grant;
	int rc = gf_lock_acquire(lock, timeout_ms, &grant);
	if (rc == GF_ERR_EVICTED) {
		/* Not a crash: the lock server made room on a GPU. Dead says why;
		 * the caller exits with GF_ENGINE_EXIT_EVICTED. */
		gf_engine_die(e, "evicted", gf_error_detail());
		return rc;
	}
	if (rc)
		return rc;
	/* From the grant to Active this thread's info lines are held and
	 * written together once serving (gf_engine_serve()): a write per line
	 * would be on the failover's path. */
	gf_log_hold();
	int64_t t1 = e->clock.now_us();
	pthread_mutex_lock(&e->mu);
	e->m.epoch = grant.epoch;
	e->m.lock_wait_us = t1 - t0;
	e->m.remap_us = e->m.private_alloc_us = e->m.serve_us = e->m.wake_total_us = -1;
	e->m.private_alloc_retries = 0;
	pthread_mutex_unlock(&e->mu);
	/* The GMS answers the wake's request while this thread does the rest
	 * of the wake (log, memory gate, lock watcher); wake_up() reads it.
	 * Sent already when the lock server said this engine was next
	 * (lock_next_hook()); the grant's own proof replaces that one for the
	 * connects to come. */
	struct gf_lock_proof proof;
	bool proven = gf_lock_grant_proof(&grant, &proof) == 0;
	if (!proven)
		gf_log(GF_LOG_WARN, "engine", "event=fence_proof msg=\"%s\"", gf_error_detail());
	e->kv_proof = proven ? proof : (struct gf_lock_proof){ 0 };
	send_wake_requests(e, proven ? &proof : NULL);
	gf_log(GF_LOG_INFO, "engine", "event=lock_granted epoch=%" PRIu64 " id=%s wait_us=%" PRId64 "%s", grant.epoch,
	       e->id, t1 - t0, grant.reclaimed ? " reclaimed=1" : "");
	rc = gf_engine_memory_gate(e, t1 + e->waking_timeout_ms * 1000);
	if (rc)
		return rc;
	rc = transition(e, GF_ENGINE_STANDBY, GF_ENGINE_WAKING);
	if (rc)
		return rc; /* lost meanwhile (Dead) */
	/* Not woken now: at the first answers (settle()) or LOCK_WATCH_DELAY_MS from now. */
	rc = gf_lock_start_watch_by(lock, LOCK_WATCH_DELAY_MS);
	if (rc) {
		gf_engine_die(e, "lock_watch", "cannot watch the lock connection");
		return rc;
	}
	e->lock_watching = true;
	atomic_store(&e->lock_watch_due, true);
	return 0;
}

static int alloc_private(gf_engine *e, int i, int64_t deadline_us)
{
	struct engine_dev *d = &e->dev[i];
	int64_t backoff = OOM_BACKOFF_FIRST_MS;
	uint64_t retries = 0;
	int rc;
	for (;;) {
		rc = gf_mem_region_back(d->priv);
		if (rc != GF_ERR_OUT_OF_MEMORY)
			break;
		int64_t left_ms = (deadline_us - e->clock.now_us()) / 1000;
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
		e->clock.sleep_ms(backoff < left_ms ? backoff : left_ms);
		backoff = backoff * 2 > OOM_BACKOFF_MAX_MS ? OOM_BACKOFF_MAX_MS : backoff * 2;
	}
	pthread_mutex_lock(&e->mu);
	e->m.private_alloc_retries += retries;
	pthread_mutex_unlock(&e->mu);
	return rc;
}

/*
 * Back device @i's private memory with its GMS's KV pool: map it as the
 * holder (the grant's proof), then map its memory at the reserved address.
 * Needs the weights' session connected (after the remap).
 */
static int map_kv_pool(gf_engine *e, int i)
{
	struct engine_dev *d = &e->dev[i];
	if (e->rank)
		return gf_err(GF_ERR_NOT_SUPPORTED, "wake: the KV pool is mapped by the lock holder; rank %d has no grant "
			      "of its own", e->rank);
	if (!e->kv_proof.epoch)
		return gf_err(GF_ERR_PERMISSION, "wake: the KV pool needs the grant's fence proof, and there is none");
	pthread_mutex_lock(&e->mu);
	uint8_t layout[16];
	memcpy(layout, e->kv_layout, 16);
	uint64_t size = gf_mem_region_size(d->priv);
	uint64_t block = e->kv_block_bytes ? e->kv_block_bytes : size;
	pthread_mutex_unlock(&e->mu);
	int fd = -1;
	int rc = gf_gms_kv_map(d->gms, &e->kv_proof, size, block, layout, 0, &fd, &d->kv);
	if (rc)
		return gf_err(rc, "wake: KV pool of device %d: %s", i, gf_error_detail());
	rc = gf_mem_region_back_fd(d->priv, fd);
	gf_close(fd);
	if (rc)
		return gf_err(rc, "wake: mapping the KV pool of device %d: %s", i, gf_error_detail());
	d->kv_mapped = true;
	gf_log(GF_LOG_INFO, "engine", "event=kv_pool_mapped device=%d bytes=%" PRIu64 " start=%s blocks=%u previous=%" PRIu64
	       "%s", i, size, d->kv.start, d->kv.blocks, d->kv.previous_epoch, d->kv.created ? " created=1" : "");
	return 0;
}

static int wake_up(gf_engine *e);

GF_EXPORT int gf_engine_wake_up(gf_engine *e)
{
	int rc = wake_up(e);
	if (rc)
		gf_log_release(); /* no serve follows to write what the wake held */
	return rc;
}

static int wake_up(gf_engine *e)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_wake_up: NULL engine");
	int rc = require_state(e, GF_ENGINE_WAKING, "wake_up");
	if (rc) {
		gf_engine_unboost(e); /* lost meanwhile: no wake to hurry */
		return rc;
	}
	if (e->woken)
		return gf_err(GF_ERR_STATE, "wake_up: already woken; serve next");
	pthread_mutex_lock(&e->mu);
	int64_t deadline = e->waking_since_us + e->waking_timeout_ms * 1000;
	pthread_mutex_unlock(&e->mu);

	/* Private (KV) memory first: the GMS is answering the wake's request
	 * (gf_gms_remap_begin() sent it with the grant) meanwhile, so the remap
	 * after it finds the answer there instead of waiting for it. */
	int64_t t0 = e->clock.now_us();
	if (e->private_bytes > 0 && !e->kv_pool) {
		for (int i = 0; i < e->ndev; i++) {
			rc = alloc_private(e, i, deadline);
			if (rc)
				goto fail;
		}
	}
	int64_t t1 = e->clock.now_us();
	if (!e->kv_pool)
		gf_log(GF_LOG_INFO, "engine", "event=kv_allocated us=%" PRId64 " devices=%d bytes=%" PRIu64, t1 - t0,
		       e->ndev, e->private_bytes);
	for (int i = 0; i < e->ndev; i++) {
		rc = gf_gms_remap(e->dev[i].gms, e->remap_timeout_ms);
		if (rc)
			goto fail;
		e->dev[i].mapped = true;
	}
	/* The KV pool is mapped over the session the remap connected: it
	 * creates nothing, so it is the cheaper half, and it needs the session. */
	int64_t t_kv = e->clock.now_us();
	if (e->private_bytes > 0 && e->kv_pool) {
		for (int i = 0; i < e->ndev; i++) {
			rc = map_kv_pool(e, i);
			if (rc)
				goto fail;
		}
	}
	int64_t kv_us = e->clock.now_us() - t_kv;
	/* Host backend: the first request would otherwise take a page fault per 64 KiB of weights. */
	for (int i = 0; i < e->ndev; i++)
		gf_gms_prefault(e->dev[i].gms);
	/* Mappings are complete on the device before anything is served from
	 * them (docs/design.md, rule 2). */
	for (int i = 0; i < e->ndev; i++) {
		rc = gf_mem_synchronize(e->dev[i].mem);
		if (rc)
			goto fail;
	}
	int64_t t2 = e->clock.now_us();
	gf_log(GF_LOG_INFO, "engine", "event=weights_remapped us=%" PRId64 " devices=%d", t2 - t1, e->ndev);
	/* From here a GMS that goes away is a loss (Decision 1). */
	for (int i = 0; i < e->ndev; i++) {
		struct engine_dev *d = &e->dev[i];
		gf_gms_set_lost_fn(d->gms, gf_engine_gms_lost_hook, e);
		rc = gf_gms_start_watch(d->gms);
		if (rc)
			goto fail;
		d->watching = true;
	}
	pthread_mutex_lock(&e->mu);
	e->m.private_alloc_us = e->kv_pool ? kv_us : t1 - t0;
	e->m.remap_us = e->kv_pool ? t2 - t1 - kv_us : t2 - t1;
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
		release_private(d);
		if (d->mapped) {
			gf_gms_unmap(d->gms);
			d->mapped = false;
		}
	}
	char reason[600];
	snprintf(reason, sizeof(reason), "wake failed: %s: %s", gf_error_name(rc) ? gf_error_name(rc) : "?",
		 detail);
	gf_log(GF_LOG_ERR, "engine", "event=wake_failed id=%s err=%s detail=\"%s\"", e->id ? e->id : "",
	       gf_error_name(rc) ? gf_error_name(rc) : "?", detail);
	gf_engine_die(e, "wake_failed", reason);
	gf_engine_unboost(e);
	return gf_err(rc, "%s", detail);
}
}

static int serve_step(gf_engine *e, gf_engine_step_fn serve, void *userdata);

/* What follows Active: the readiness relay told, the wake's held lines written (together). */
static void settle(gf_engine *e)
{
	gf_lock *lock = atomic_load(&e->lock);
	/* The lock's watcher, put off at the grant, if its time has not come yet. */
	if (lock && atomic_exchange(&e->lock_watch_due, false) && gf_lock_start_watch(lock) < 0)
		gf_log(GF_LOG_DEBUG, "engine", "event=lock_watch_started_already id=%s", e->id ? e->id : "");
	/* gf-lockd's readiness relay counts this holder ready from now on (not a dead one). */
	if (lock && gf_engine_state(e) == GF_ENGINE_ACTIVE && gf_lock_serving(lock) < 0)
		gf_log(GF_LOG_DEBUG, "engine", "event=serving_not_reported id=%s detail=\"%s\"", e->id ? e->id : "",
		       gf_error_detail());
	gf_log_release();
}

GF_EXPORT int gf_engine_serve(gf_engine *e, gf_engine_step_fn serve, void *userdata)
{
	int rc = serve_step(e, serve, userdata);
	if (rc == 0 && e->settle_deferred) {
		/* The engine answers what waited first (gf_engine_settle()). */
		atomic_store(&e->settle_pending, true);
		return 0;
	}
	if (rc == 0)
		settle(e);
	else
		gf_log_release(); /* failed: what the wake held, now */
	return rc;
}

GF_EXPORT int gf_engine_settle(gf_engine *e)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_settle: NULL engine");
	if (atomic_exchange(&e->settle_pending, false))
		settle(e);
	return 0;
}

static int serve_step(gf_engine *e, gf_engine_step_fn serve, void *userdata)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_serve: NULL engine");
	int rc = require_state(e, GF_ENGINE_WAKING, "serve");
	if (rc) {
		gf_engine_unboost(e); /* lost meanwhile: no wake to hurry */
		return rc;
	}
	if (!e->woken)
		return gf_err(GF_ERR_STATE, "serve: wake_up has not completed");
	int64_t t0 = e->clock.now_us();
	if (serve) {
		rc = serve(e, userdata);
		if (rc) {
			char detail[512];
			snprintf(detail, sizeof(detail), "%s", gf_error_detail());
			char reason[600];
			snprintf(reason, sizeof(reason), "serve failed: %s", detail);
			gf_engine_die(e, "serve_failed", reason);
			gf_engine_unboost(e);
			return gf_err(rc, "%s", detail);
		}
	}
	int64_t t1 = e->clock.now_us();
	pthread_mutex_lock(&e->mu);
	e->m.serve_us = t1 - t0;
	e->m.wake_total_us = t1 - e->waking_since_us;
	pthread_mutex_unlock(&e->mu);
	rc = transition(e, GF_ENGINE_WAKING, GF_ENGINE_ACTIVE);
	/* Serving runs at the priority the thread had before the wake. */
	gf_engine_unboost(e);
	if (rc)
		return rc;
	pthread_mutex_lock(&e->mu);
	e->m.failovers++;
	gf_engine_record_failover(e);
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
	if (e->probe_port >= 0 && !atomic_load(&e->http)) {
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

int gf_engine_probe_decision(int state, int probe, int waking_expired, int healthy, int device_lost)
{
	if (probe != GF_PROBE_LIVE && probe != GF_PROBE_READY && probe != GF_PROBE_STARTUP)
		return -1;
	/* A lost GPU context never comes back in this process: whatever the
	 * state, it is neither alive for the platform nor ready to serve. */
	if (device_lost && probe != GF_PROBE_STARTUP)
		return 503;
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

/* Has a sticky device error lost the context of any device? A driver error
 * is only recorded when some call returns it, and an engine that is just
 * serving makes none through the library; so unless the loss is already
 * known, ask each device something cheap (its free memory), which returns
 * the sticky error if there is one. */
static bool device_check(gf_engine *e, char *reason, size_t len)
{
	for (int i = 0; i < e->ndev; i++) {
		gf_mem *m = e->dev[i].mem;
		if (!m)
			continue;
		if (!gf_mem_device_lost(m) && gf_mem_info(m, NULL, NULL) == 0)
			continue;
		if (gf_mem_device_lost(m) == 1) {
			snprintf(reason, len, "device %d lost: a sticky driver error ended its context (%s)", i,
				 gf_error_detail());
			return true;
		}
	}
	return false;
}

GF_EXPORT int gf_engine_probe(gf_engine *e, int probe)
{
	if (!e)
		return -1;
	pthread_mutex_lock(&e->mu);
	int state = e->state;
	int expired = state == GF_ENGINE_WAKING &&
		      e->clock.now_us() - e->waking_since_us >= e->waking_timeout_ms * 1000;
	gf_engine_health_fn health = e->health;
	void *ud = e->health_ud;
	pthread_mutex_unlock(&e->mu);
	int lost = 0;
	if (probe != GF_PROBE_STARTUP &&
	    (state == GF_ENGINE_STANDBY || state == GF_ENGINE_WAKING || state == GF_ENGINE_ACTIVE)) {
		char reason[512];
		if (device_check(e, reason, sizeof(reason))) {
			lost = 1;
			/* The standby cannot wake and the holder cannot serve: the
			 * loss policy runs (once), so the process ends, its lock
			 * connection closes and the next engine takes over. */
			gf_log(GF_LOG_ERR, "engine", "event=device_lost id=%s state=%s reason=\"%s\"",
			       e->id ? e->id : "", gf_engine_state_name(state), reason);
			gf_engine_fatal_async(e, GF_ERR_DRIVER, "device_lost", reason);
		}
	}
	int healthy = 1;
	if (!lost && state == GF_ENGINE_ACTIVE && probe != GF_PROBE_STARTUP && health)
		healthy = health(e, ud) ? 1 : 0;
	return gf_engine_probe_decision(state, probe, expired, healthy, lost);
}

/* ---- inspection ---- */

GF_EXPORT uint64_t gf_engine_epoch(const gf_engine *e)
{
	if (!e)
		return 0;
	pthread_mutex_lock(gf_engine_mu(e));
	uint64_t ep = e->m.epoch;
	pthread_mutex_unlock(gf_engine_mu(e));
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

GF_EXPORT int gf_engine_kv_pool_info(const gf_engine *e, int device, struct gf_gms_kv_map_info *out)
{
	if (!e || !out || device < 0 || device >= e->ndev)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_kv_pool_info: bad engine or device");
	if (!e->dev[device].kv_mapped)
		return gf_err(GF_ERR_STATE, "gf_engine_kv_pool_info: no KV pool mapped on device %d", device);
	*out = e->dev[device].kv;
	return 0;
}

GF_EXPORT int gf_engine_private_backed(const gf_engine *e, int device)
{
	if (!e || device < 0 || device >= e->ndev)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_private_backed: bad engine or device");
	return gf_mem_region_backed(e->dev[device].priv);
}

GF_EXPORT int gf_engine_private_memory(const gf_engine *e, int device, uint64_t *addr, uint64_t *size)
{
	if (!e || device < 0 || device >= e->ndev)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_private_memory: bad engine or device");
	if (!e->dev[device].priv)
		return gf_err(GF_ERR_STATE, "gf_engine_private_memory: no private memory on device %d (before "
					    "init_weights, or none configured)",
			      device);
	if (addr)
		*addr = gf_mem_region_addr(e->dev[device].priv);
	if (size)
		*size = gf_mem_region_size(e->dev[device].priv);
	return 0;
}

