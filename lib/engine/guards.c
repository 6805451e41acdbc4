/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's guards against waiting forever or failing half-way (seed
 * 001): the startup watchdog (Init must reach Standby in time) and the
 * memory gate (no wake without the memory it needs). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "common.h"
#include "engine_int.h"

void gf_engine_real_sleep_ms(int64_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

#define WATCHDOG_POLL_MS 20

/* Polls rather than sleeping until the deadline: the engine's clock may be
 * a test's, and leaving Init or freeing the engine must end it quickly. */
static void *watchdog_main(void *arg)
{
	gf_engine *e = arg;
	int64_t deadline = e->created_us + e->startup_deadline_ms * 1000;
	while (!atomic_load(&e->watchdog_stop) && gf_engine_state(e) == GF_ENGINE_INIT) {
		if (e->clock.now_us() >= deadline) {
			char reason[256];
			snprintf(reason, sizeof(reason),
				 "startup deadline: not in standby %" PRId64 " ms after the engine was created "
				 "(weights still loading or waiting for a GMS)",
				 e->startup_deadline_ms);
			gf_log(GF_LOG_ERR, "engine", "event=startup_deadline id=%s deadline_ms=%" PRId64,
			       e->id ? e->id : "", e->startup_deadline_ms);
			gf_engine_fatal(e, GF_ERR_TIMEOUT, "startup_deadline", reason);
			break;
		}
		gf_engine_real_sleep_ms(WATCHDOG_POLL_MS);
	}
	return NULL;
}

int gf_engine_start_watchdog(gf_engine *e)
{
	if (e->startup_deadline_ms <= 0 || e->watchdog_running)
		return 0;
	if (pthread_create(&e->watchdog, NULL, watchdog_main, e) != 0)
		return gf_err(GF_ERR_NOMEM, "init_weights: cannot start the startup watchdog thread");
	e->watchdog_running = true;
	return 0;
}

uint64_t gf_engine_memory_need(const gf_engine *e)
{
	/* The KV pool's memory exists already (in the GMS): the wake makes none. */
	return e->memory_need_set ? e->memory_need : e->kv_pool ? 0 : e->private_bytes;
}

/* The first device with less free memory than @need (-1: none), and its free bytes. */
static int short_device(gf_engine *e, uint64_t need, uint64_t *free_out, int *err)
{
	for (int i = 0; i < e->ndev; i++) {
		int has = gf_mem_has_free(e->dev[i].mem, need, free_out);
		if (has <= 0) {
			*err = has;
			return i;
		}
	}
	return -1;
}

/* The memory gate (docs/design.md, decision 22): with the lock granted, wait until every
 * device has the free memory the wake needs, polling with the OOM backoff,
 * until @deadline_us. A wake that would not fit is refused before it
 * starts, instead of failing half-way; on failure the engine is Dead. */
int gf_engine_memory_gate(gf_engine *e, int64_t deadline_us)
{
	uint64_t need = gf_engine_memory_need(e);
	if (need == 0)
		return 0;
	int64_t t0 = e->clock.now_us();
	int64_t backoff = OOM_BACKOFF_FIRST_MS;
	uint64_t free_b = 0;
	int err = 0, i;
	bool logged = false;
	while ((i = short_device(e, need, &free_b, &err)) >= 0 && !err) {
		int64_t left_ms = (deadline_us - e->clock.now_us()) / 1000;
		if (left_ms <= 0)
			break;
		if (!logged) {
			gf_log(GF_LOG_WARN, "engine",
			       "event=memory_gate_waiting id=%s device=%d free_bytes=%" PRIu64 " need_bytes=%" PRIu64
			       " msg=\"waiting for free memory before waking\"",
			       e->id, i, free_b, need);
			logged = true;
			pthread_mutex_lock(&e->mu);
			e->gate_waiting = true;
			pthread_mutex_unlock(&e->mu);
		}
		e->clock.sleep_ms(backoff < left_ms ? backoff : left_ms);
		backoff = backoff * 2 > OOM_BACKOFF_MAX_MS ? OOM_BACKOFF_MAX_MS : backoff * 2;
	}
	int64_t waited = e->clock.now_us() - t0;
	pthread_mutex_lock(&e->mu);
	e->gate_waiting = false;
	e->gate_us = waited;
	pthread_mutex_unlock(&e->mu);
	if (i < 0) {
		if (logged)
			gf_log(GF_LOG_INFO, "engine", "event=memory_gate_open id=%s waited_us=%" PRId64, e->id, waited);
		return 0;
	}
	char reason[400];
	if (err) {
		snprintf(reason, sizeof(reason), "memory gate: cannot read the free memory of device %d: %s", i,
			 gf_error_detail());
	} else {
		snprintf(reason, sizeof(reason),
			 "memory gate: device %d has %" PRIu64 " free bytes, the wake needs %" PRIu64
			 "; still short when the waking timeout (%" PRId64 " ms) passed",
			 i, free_b, need, e->waking_timeout_ms);
		err = GF_ERR_OUT_OF_MEMORY;
	}
	gf_log(GF_LOG_ERR, "engine", "event=memory_gate_closed id=%s detail=\"%s\"", e->id, reason);
	gf_engine_die(e, "memory_gate", reason);
	return gf_err(err, "%s", reason);
}
