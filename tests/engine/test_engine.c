/* SPDX-License-Identifier: Apache-2.0 */
/* The engine state machine against fake lock/GMS/mem clients and a fake
 * clock: every legal and illegal transition, the probe table, the waking
 * timeout, the loss hook, all-or-nothing wake, OOM retries, the default loss
 * policy (in forked children) and the probe server over real HTTP. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "../common/testutil.h"
#include "engine_int.h"

/* ---- fakes ---- */

struct gf_lock {
	gf_lock_lost_fn lost;
	void *ud;
	bool watching;
	bool interrupted;
};
struct gf_mem {
	int device;
};
struct gf_mem_alloc {
	size_t size;
};
struct gf_mem_va {
	int device;
	size_t size;
	bool mapped;
};
struct gf_gms {
	int device;
	int mode;
	bool mapped;
	bool connected;
	gf_gms_lost_fn lost;
	void *ud;
	bool watching;
};

static struct fake {
	int64_t now;
	int acquire_rc;
	uint64_t epoch;
	int granted_mode; /* what gms_connect grants */
	int connect_rc;
	int remap_fail_device; /* -1: none */
	int remap_rc;
	int map_fail_device;   /* private map fails on this device, -1: none */
	int oom_times;         /* mem_create returns OOM this many times (-1: forever) */
	int oom_calls;
	int live_allocs, live_vas, mapped_vas, mapped_gms, live_gms, live_mems, live_locks;
	int64_t slept_ms;
	gf_lock *lock;
	gf_gms *gms[4];
	int acquire_advance_ms; /* how long the fake acquire "waits" */
} fk;

static int64_t f_now(void)
{
	return fk.now;
}
static void f_sleep(int64_t ms)
{
	fk.now += ms * 1000;
	fk.slept_ms += ms;
}
static int f_lock_new(gf_lock **out, const char *uri, const char *id)
{
	*out = calloc(1, sizeof(**out));
	fk.lock = *out;
	fk.live_locks++;
	return 0;
}
static void f_lock_free(gf_lock *l)
{
	if (l) {
		fk.live_locks--;
		free(l);
	}
}
static int f_lock_acquire(gf_lock *l, int64_t t, struct gf_lock_grant *g)
{
	if (l->interrupted) {
		l->interrupted = false;
		return GF_ERR_INTERRUPTED;
	}
	if (fk.acquire_rc)
		return fk.acquire_rc;
	fk.now += fk.acquire_advance_ms * 1000;
	memset(g, 0, sizeof(*g));
	g->epoch = fk.epoch;
	return 0;
}
static int64_t reconnect_ms_seen = -2;
static int f_lock_reconnect(gf_lock *l, int64_t ms)
{
	reconnect_ms_seen = ms;
	return 0;
}
static void f_lock_set_lost(gf_lock *l, gf_lock_lost_fn fn, void *ud)
{
	l->lost = fn;
	l->ud = ud;
}
static int f_lock_watch(gf_lock *l)
{
	l->watching = true;
	return 0;
}
static void f_lock_unwatch(gf_lock *l)
{
	l->watching = false;
}
static void f_lock_interrupt(gf_lock *l)
{
	l->interrupted = true;
}
static int f_mem_open(gf_mem **out, int kind, int dev)
{
	*out = calloc(1, sizeof(**out));
	(*out)->device = dev;
	fk.live_mems++;
	return 0;
}
static void f_mem_free(gf_mem *m)
{
	if (m) {
		fk.live_mems--;
		free(m);
	}
}
static int f_mem_create(gf_mem *m, size_t size, gf_mem_alloc **out)
{
	fk.oom_calls++;
	if (fk.oom_times < 0 || fk.oom_calls <= fk.oom_times)
		return GF_ERR_OUT_OF_MEMORY;
	*out = calloc(1, sizeof(**out));
	(*out)->size = (size + 4095) & ~(size_t)4095;
	fk.live_allocs++;
	return 0;
}
static int f_mem_alloc_free(gf_mem_alloc *a)
{
	if (a) {
		fk.live_allocs--;
		free(a);
	}
	return 0;
}
static size_t f_mem_alloc_size(const gf_mem_alloc *a)
{
	return a->size;
}
static int f_mem_reserve(gf_mem *m, size_t size, size_t al, gf_mem_va **out)
{
	*out = calloc(1, sizeof(**out));
	(*out)->size = size;
	(*out)->device = m->device;
	fk.live_vas++;
	return 0;
}
static void f_mem_va_free(gf_mem_va *va)
{
	if (va) {
		if (va->mapped)
			fk.mapped_vas--;
		fk.live_vas--;
		free(va);
	}
}
static uint64_t f_mem_va_addr(const gf_mem_va *va)
{
	return 0x10000;
}
static int f_mem_map(gf_mem_va *va, size_t off, gf_mem_alloc *a, int access)
{
	if (fk.map_fail_device == va->device)
		return GF_ERR_DRIVER;
	va->mapped = true;
	fk.mapped_vas++;
	return 0;
}
static int f_mem_unmap_all(gf_mem_va *va)
{
	if (va->mapped)
		fk.mapped_vas--;
	va->mapped = false;
	return 0;
}
static int syncs;
static int f_mem_sync(gf_mem *m)
{
	syncs++;
	return 0;
}
static int f_gms_connect(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t t)
{
	if (fk.connect_rc)
		return fk.connect_rc;
	gf_gms *g = calloc(1, sizeof(*g));
	g->device = mem->device;
	g->mode = mode == GF_GMS_RO ? GF_GMS_RO : fk.granted_mode;
	g->connected = true;
	fk.gms[g->device] = g;
	fk.live_gms++;
	*out = g;
	return 0;
}
static void f_gms_free(gf_gms *g)
{
	if (g) {
		if (g->mapped)
			fk.mapped_gms--;
		fk.live_gms--;
		fk.gms[g->device] = NULL;
		free(g);
	}
}
static int f_gms_mode(const gf_gms *g)
{
	return g->connected ? g->mode : 0;
}
static int f_gms_map_all(gf_gms *g)
{
	g->mapped = true;
	fk.mapped_gms++;
	return 0;
}
static int f_gms_unmap(gf_gms *g)
{
	if (g->mapped)
		fk.mapped_gms--;
	g->mapped = false;
	g->connected = false;
	return 0;
}
static int f_gms_remap(gf_gms *g, int64_t t)
{
	if (fk.remap_fail_device == g->device)
		return fk.remap_rc;
	g->mapped = true;
	g->connected = true;
	g->mode = GF_GMS_RO;
	fk.mapped_gms++;
	return 0;
}
static void f_gms_set_lost(gf_gms *g, gf_gms_lost_fn fn, void *ud)
{
	g->lost = fn;
	g->ud = ud;
}
static int f_gms_watch(gf_gms *g)
{
	g->watching = true;
	return 0;
}
static void f_gms_unwatch(gf_gms *g)
{
	g->watching = false;
}

static const struct gf_engine_ops fake_ops = {
	.now_us = f_now,
	.sleep_ms = f_sleep,
	.lock_new = f_lock_new,
	.lock_free = f_lock_free,
	.lock_acquire = f_lock_acquire,
	.lock_set_reconnect_timeout = f_lock_reconnect,
	.lock_set_lost_fn = f_lock_set_lost,
	.lock_start_watch = f_lock_watch,
	.lock_stop_watch = f_lock_unwatch,
	.lock_interrupt = f_lock_interrupt,
	.mem_open = f_mem_open,
	.mem_free = f_mem_free,
	.mem_create = f_mem_create,
	.mem_alloc_free = f_mem_alloc_free,
	.mem_alloc_size = f_mem_alloc_size,
	.mem_reserve = f_mem_reserve,
	.mem_va_free = f_mem_va_free,
	.mem_va_addr = f_mem_va_addr,
	.mem_map = f_mem_map,
	.mem_unmap_all = f_mem_unmap_all,
	.mem_synchronize = f_mem_sync,
	.gms_connect = f_gms_connect,
	.gms_free = f_gms_free,
	.gms_granted_mode = f_gms_mode,
	.gms_map_all = f_gms_map_all,
	.gms_unmap = f_gms_unmap,
	.gms_remap = f_gms_remap,
	.gms_set_lost_fn = f_gms_set_lost,
	.gms_start_watch = f_gms_watch,
	.gms_stop_watch = f_gms_unwatch,
};

/* The loader's "load": write and commit (the fake commit turns RW into RO). */
static int loads;
static int fake_load(gf_engine *e, int device, gf_gms *g, void *ud)
{
	loads++;
	g->mode = GF_GMS_RO;
	g->mapped = true;
	fk.mapped_gms++;
	return 0;
}
static int load_without_commit(gf_engine *e, int device, gf_gms *g, void *ud)
{
	return 0;
}

static struct loss_rec {
	int calls;
	int err;
	int state_seen;
	char detail[256];
} loss;
static void record_loss(gf_engine *e, int err, const char *detail, void *ud)
{
	loss.calls++;
	loss.err = err;
	loss.state_seen = gf_engine_state(e);
	snprintf(loss.detail, sizeof(loss.detail), "%s", detail);
}

static int setup(void **state)
{
	memset(&fk, 0, sizeof(fk));
	memset(&loss, 0, sizeof(loss));
	fk.now = 1000000;
	fk.epoch = 7;
	fk.granted_mode = GF_GMS_RW;
	fk.remap_fail_device = -1;
	fk.map_fail_device = -1;
	loads = 0;
	gf_engine *e;
	assert_int_equal(gf_engine_new_with_ops(&e, &fake_ops), 0);
	assert_int_equal(gf_engine_set_lock(e, "unix:///tmp/x.sock", "eng-a"), 0);
	assert_int_equal(gf_engine_add_gms(e, "unix:///tmp/gms0.sock"), 0);
	assert_int_equal(gf_engine_add_gms(e, "unix:///tmp/gms1.sock"), 0);
	assert_int_equal(gf_engine_set_private_bytes(e, 1 << 20), 0);
	assert_int_equal(gf_engine_set_waking_timeout(e, 2000), 0);
	assert_int_equal(gf_engine_set_loss_fn(e, record_loss, NULL), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	gf_engine_free(*state);
	/* Everything the engine made through the ops is given back. */
	assert_int_equal(fk.live_allocs, 0);
	assert_int_equal(fk.live_vas, 0);
	assert_int_equal(fk.live_gms, 0);
	assert_int_equal(fk.live_mems, 0);
	assert_int_equal(fk.live_locks, 0);
	return 0;
}

static void to_standby(gf_engine *e)
{
	assert_int_equal(gf_engine_init_weights(e, fake_load, NULL), 0);
	assert_int_equal(gf_engine_sleep(e), 0);
}

static void to_waking(gf_engine *e)
{
	to_standby(e);
	assert_int_equal(gf_engine_acquire(e, -1), 0);
}

static void to_active(gf_engine *e)
{
	to_waking(e);
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
}

/* ---- transitions ---- */

static int serve_calls;
static int count_serve(gf_engine *e, void *ud)
{
	serve_calls++;
	/* Still Waking while serve_endpoint runs: Active comes after. */
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
	return 0;
}

static void test_legal_path(void **state)
{
	gf_engine *e = *state;
	struct gf_engine_metrics m;
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_int_equal(gf_engine_set_lock_reconnect_timeout(e, 1500), 0);
	assert_int_equal(gf_engine_init_weights(e, fake_load, NULL), 0);
	assert_int_equal(loads, 2);
	assert_int_equal(fk.mapped_gms, 2);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_int_equal(gf_engine_sleep(e), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	assert_int_equal(fk.mapped_gms, 0);
	fk.acquire_advance_ms = 5000;
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
	assert_int_equal(reconnect_ms_seen, 1500);
	assert_true(fk.lock->watching);
	assert_non_null(fk.lock->lost);
	assert_int_equal(gf_engine_epoch(e), 7);
	syncs = 0;
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(syncs, 2); /* every device synchronised before serving */
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
	assert_int_equal(fk.mapped_gms, 2);
	assert_int_equal(fk.mapped_vas, 2);
	assert_true(fk.gms[0]->watching && fk.gms[1]->watching);
	uint64_t addr, size;
	assert_int_equal(gf_engine_private_memory(e, 1, &addr, &size), 0);
	assert_true(size >= (1 << 20));
	assert_int_equal(gf_engine_serve(e, count_serve, NULL), 0);
	assert_int_equal(serve_calls, 1);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_ACTIVE);
	assert_int_equal(gf_engine_metrics(e, &m), 0);
	assert_int_equal(m.state, GF_ENGINE_ACTIVE);
	assert_int_equal(m.transitions, 3);
	assert_int_equal(m.failovers, 1);
	assert_int_equal(m.epoch, 7);
	assert_int_equal(m.lock_wait_us, 5000000);
	assert_true(m.remap_us >= 0 && m.private_alloc_us >= 0 && m.serve_us >= 0 && m.wake_total_us >= 0);
	fk.now += 3000;
	assert_int_equal(gf_engine_metrics(e, &m), 0);
	assert_int_equal(m.time_in_state_us, 3000);
	assert_int_equal(gf_engine_mark_dead(e, "test"), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_int_equal(gf_engine_mark_dead(e, "again"), 0);
	assert_int_equal(gf_engine_metrics(e, &m), 0);
	assert_int_equal(m.transitions, 4);
}

/* Every step that is not the next one is refused and changes nothing. */
static void expect_refused(gf_engine *e, int state, bool woken)
{
	assert_int_equal(gf_engine_state(e), state);
	if (state != GF_ENGINE_INIT)
		assert_int_equal(gf_engine_init_weights(e, fake_load, NULL), GF_ERR_STATE);
	if (state != GF_ENGINE_STANDBY)
		assert_int_equal(gf_engine_acquire(e, 0), GF_ERR_STATE);
	if (state != GF_ENGINE_WAKING || woken)
		assert_int_equal(gf_engine_wake_up(e), GF_ERR_STATE);
	if (state != GF_ENGINE_WAKING || !woken)
		assert_int_equal(gf_engine_serve(e, NULL, NULL), GF_ERR_STATE);
	assert_int_equal(gf_engine_sleep(e), GF_ERR_STATE); /* only from Init with weights */
	assert_int_equal(gf_engine_set_role(e, GF_ENGINE_FOLLOWER), GF_ERR_STATE);
	assert_int_equal(gf_engine_add_gms(e, "unix:///x"), GF_ERR_STATE);
	assert_int_equal(gf_engine_state(e), state);
	assert_true(strlen(gf_error_detail()) > 0);
}

static void test_illegal_transitions(void **state)
{
	gf_engine *e = *state;
	/* Init without weights: nothing but init_weights. */
	assert_int_equal(gf_engine_sleep(e), GF_ERR_STATE);
	assert_int_equal(gf_engine_acquire(e, 0), GF_ERR_STATE);
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_STATE);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), GF_ERR_STATE);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	/* Init with weights: only sleep. */
	assert_int_equal(gf_engine_init_weights(e, fake_load, NULL), 0);
	assert_int_equal(gf_engine_init_weights(e, fake_load, NULL), GF_ERR_STATE);
	assert_int_equal(gf_engine_acquire(e, 0), GF_ERR_STATE);
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_STATE);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), GF_ERR_STATE);
	assert_int_equal(gf_engine_set_waking_timeout(e, 5), GF_ERR_STATE);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_int_equal(gf_engine_sleep(e), 0);
	expect_refused(e, GF_ENGINE_STANDBY, false);
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	expect_refused(e, GF_ENGINE_WAKING, false);
	assert_int_equal(gf_engine_wake_up(e), 0);
	expect_refused(e, GF_ENGINE_WAKING, true);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
	expect_refused(e, GF_ENGINE_ACTIVE, true);
	assert_int_equal(gf_engine_mark_dead(e, "done"), 0);
	expect_refused(e, GF_ENGINE_DEAD, true);
	struct gf_engine_metrics m;
	gf_engine_metrics(e, &m);
	assert_int_equal(m.transitions, 4);
}

/* Dead is reachable from every state and final. */
static void test_dead_from_every_state(void **state)
{
	for (int target = GF_ENGINE_INIT; target <= GF_ENGINE_ACTIVE; target++) {
		gf_engine *e;
		setup((void **)&e);
		if (target == GF_ENGINE_STANDBY)
			to_standby(e);
		else if (target == GF_ENGINE_WAKING)
			to_waking(e);
		else if (target == GF_ENGINE_ACTIVE)
			to_active(e);
		assert_int_equal(gf_engine_state(e), target);
		assert_int_equal(gf_engine_mark_dead(e, "test"), 0);
		expect_refused(e, GF_ENGINE_DEAD, target >= GF_ENGINE_WAKING);
		teardown((void **)&e);
	}
}

static void test_config_errors(void **state)
{
	gf_engine *e = *state;
	assert_int_equal(gf_engine_set_role(e, 9), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_backend(e, 9), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_waking_timeout(e, 0), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_remap_timeout(e, -1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_probe_address(e, NULL, 70000), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_lock(e, "", "x"), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_add_gms(e, NULL), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_start_probe_server(e), GF_ERR_STATE); /* port -1: off */
	assert_int_equal(gf_engine_probe_port(e), -1);
	assert_int_equal(gf_engine_probe(e, 99), -1);
	assert_int_equal(gf_engine_init_weights(NULL, NULL, NULL), GF_ERR_INVALID_ARG);
	/* A loader needs its load callback. */
	assert_int_equal(gf_engine_init_weights(e, NULL, NULL), GF_ERR_INVALID_ARG);
	gf_engine_free(NULL);
}

static void test_follower_imports(void **state)
{
	gf_engine *e = *state;
	assert_int_equal(gf_engine_set_role(e, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_init_weights(e, NULL, NULL), 0);
	assert_int_equal(loads, 0);
	assert_int_equal(fk.mapped_gms, 2);
	assert_non_null(gf_engine_gms(e, 1));
	assert_null(gf_engine_gms(e, 2));
}

static void test_loader_must_commit(void **state)
{
	gf_engine *e = *state;
	assert_int_equal(gf_engine_init_weights(e, load_without_commit, NULL), GF_ERR_STATE);
	assert_non_null(strstr(gf_error_detail(), "commit"));
	/* Cleaned up: nothing connected, still Init, and init may be retried. */
	assert_int_equal(fk.live_gms, 0);
	assert_int_equal(fk.live_mems, 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_int_equal(gf_engine_init_weights(e, fake_load, NULL), 0);
}

static void test_init_connect_fails(void **state)
{
	gf_engine *e = *state;
	fk.connect_rc = GF_ERR_TIMEOUT;
	assert_int_equal(gf_engine_init_weights(e, fake_load, NULL), GF_ERR_TIMEOUT);
	assert_int_equal(fk.live_mems, 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
}

static void test_acquire_errors(void **state)
{
	gf_engine *e = *state;
	to_standby(e);
	/* Interrupted before the lock client exists: exactly one acquire returns. */
	gf_engine_interrupt(e);
	assert_int_equal(gf_engine_acquire(e, -1), GF_ERR_INTERRUPTED);
	assert_false(fk.lock->interrupted);
	fk.acquire_rc = GF_ERR_TIMEOUT;
	assert_int_equal(gf_engine_acquire(e, 10), GF_ERR_TIMEOUT);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	fk.acquire_rc = 0;
	gf_engine_interrupt(e);
	assert_int_equal(gf_engine_acquire(e, -1), GF_ERR_INTERRUPTED);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
}

/* ---- probes ---- */

static int health_answer = 1;
static int health_calls;
static int health(gf_engine *e, void *ud)
{
	health_calls++;
	return health_answer;
}

static void probes_are(gf_engine *e, int startup, int live, int ready)
{
	assert_int_equal(gf_engine_probe(e, GF_PROBE_STARTUP), startup);
	assert_int_equal(gf_engine_probe(e, GF_PROBE_LIVE), live);
	assert_int_equal(gf_engine_probe(e, GF_PROBE_READY), ready);
}

static void test_probe_table(void **state)
{
	gf_engine *e = *state;
	health_answer = 1;
	health_calls = 0;
	assert_int_equal(gf_engine_set_health_fn(e, health, NULL), 0);
	probes_are(e, 503, 503, 503); /* Init */
	assert_int_equal(gf_engine_init_weights(e, fake_load, NULL), 0);
	probes_are(e, 503, 503, 503); /* Init, weights loaded but not asleep yet */
	assert_int_equal(gf_engine_sleep(e), 0);
	probes_are(e, 200, 200, 200); /* Standby */
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	probes_are(e, 200, 200, 200); /* Waking, within the timeout */
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
	assert_int_equal(health_calls, 0); /* only Active asks the engine */
	probes_are(e, 200, 200, 200); /* Active, healthy */
	health_answer = 0;
	probes_are(e, 200, 503, 503); /* Active, unhealthy */
	assert_true(health_calls >= 4);
	health_answer = 1;
	gf_engine_mark_dead(e, "test");
	probes_are(e, 503, 503, 503); /* Dead */
}

static void test_probe_decision_table(void **state)
{
	/* The pure table, every cell. */
	static const int want[5][3] = {
		/* startup, live, ready */
		{ 503, 503, 503 }, { 200, 200, 200 }, { 200, 200, 200 }, { 200, 200, 200 }, { 503, 503, 503 },
	};
	static const int probes[3] = { GF_PROBE_STARTUP, GF_PROBE_LIVE, GF_PROBE_READY };
	for (int s = 0; s < 5; s++)
		for (int p = 0; p < 3; p++)
			assert_int_equal(gf_engine_probe_decision(s, probes[p], 0, 1), want[s][p]);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_WAKING, GF_PROBE_LIVE, 1, 1), 503);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_WAKING, GF_PROBE_READY, 1, 1), 200);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_WAKING, GF_PROBE_STARTUP, 1, 1), 200);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_ACTIVE, GF_PROBE_LIVE, 0, 0), 503);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_ACTIVE, GF_PROBE_READY, 0, 0), 503);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_ACTIVE, GF_PROBE_STARTUP, 0, 0), 200);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_STANDBY, 0, 0, 1), -1);
}

static void test_waking_timeout_flips_live(void **state)
{
	gf_engine *e = *state; /* waking timeout 2000 ms */
	to_waking(e);
	fk.now += 1999 * 1000;
	probes_are(e, 200, 200, 200);
	fk.now += 1000;
	probes_are(e, 200, 503, 200);
	/* Also after wake_up: the timeout covers the whole Waking state. */
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_probe(e, GF_PROBE_LIVE), 503);
	/* A slow but healthy wake that completes is live again as Active. */
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
	probes_are(e, 200, 200, 200);
}

/* ---- wake ---- */

static void test_wake_remap_failure_is_all_or_nothing(void **state)
{
	gf_engine *e = *state;
	to_waking(e);
	fk.remap_fail_device = 1;
	fk.remap_rc = GF_ERR_STALE_LAYOUT;
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_STALE_LAYOUT);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_int_equal(fk.mapped_gms, 0); /* device 0 was remapped, then unmapped again */
	assert_int_equal(fk.mapped_vas, 0);
	assert_int_equal(fk.live_allocs, 0);
	assert_int_equal(loss.calls, 0); /* a failed wake is returned, not a loss */
}

static void test_wake_private_failure_is_all_or_nothing(void **state)
{
	gf_engine *e = *state;
	to_waking(e);
	fk.map_fail_device = 1;
	int rc = gf_engine_wake_up(e);
	assert_int_equal(rc, GF_ERR_DRIVER);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_int_equal(fk.mapped_gms, 0);
	assert_int_equal(fk.mapped_vas, 0);
	assert_int_equal(fk.live_allocs, 0);
	assert_int_equal(fk.live_vas, 0);
	uint64_t addr;
	assert_int_equal(gf_engine_private_memory(e, 0, &addr, NULL), GF_ERR_STATE);
}

static void test_wake_retries_oom(void **state)
{
	gf_engine *e = *state;
	to_waking(e);
	fk.oom_times = 3;
	assert_int_equal(gf_engine_wake_up(e), 0);
	struct gf_engine_metrics m;
	gf_engine_metrics(e, &m);
	assert_int_equal(m.private_alloc_retries, 3);
	assert_true(fk.slept_ms > 0);
	assert_int_equal(m.private_alloc_us, fk.slept_ms * 1000);
	assert_int_equal(fk.mapped_vas, 2);
}

static void test_wake_oom_until_timeout(void **state)
{
	gf_engine *e = *state; /* waking timeout 2 s */
	to_waking(e);
	fk.oom_times = -1;
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_OUT_OF_MEMORY);
	assert_non_null(strstr(gf_error_detail(), "waking timeout"));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	/* Retried for the waking timeout, not longer. */
	assert_int_equal(fk.slept_ms, 2000);
	assert_int_equal(fk.mapped_gms, 0);
	assert_int_equal(fk.live_allocs, 0);
}

static int failing_serve(gf_engine *e, void *ud)
{
	return GF_ERR_IO;
}

static void test_serve_failure_is_dead(void **state)
{
	gf_engine *e = *state;
	to_waking(e);
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_serve(e, failing_serve, NULL), GF_ERR_IO);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
}

static int run_serve(gf_engine *e, void *ud)
{
	(*(int *)ud)++;
	return 0;
}
static int run_ready(gf_engine *e, void *ud)
{
	(*(int *)ud) += 10;
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	return 0;
}

static void test_run_shadow(void **state)
{
	gf_engine *e = *state;
	int calls = 0;
	struct gf_engine_callbacks cb = { .load_weights = fake_load, .weights_ready = run_ready, .serve = run_serve,
					  .userdata = &calls };
	assert_int_equal(gf_engine_run_shadow(e, &cb), 0);
	assert_int_equal(calls, 11);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_ACTIVE);
	assert_int_equal(gf_engine_run_shadow(e, &cb), GF_ERR_STATE);
}

/* run_shadow starts a configured probe server first, so Init is probed too;
 * a failing step is returned and leaves the state where it failed. */
static void test_run_shadow_probe_server_and_failure(void **state)
{
	gf_engine *e = *state;
	assert_int_equal(gf_engine_set_probe_address(e, "127.0.0.1", 0), 0);
	fk.connect_rc = GF_ERR_UNREACHABLE;
	struct gf_engine_callbacks cb = { .load_weights = fake_load };
	assert_int_equal(gf_engine_run_shadow(e, &cb), GF_ERR_UNREACHABLE);
	assert_true(gf_engine_probe_port(e) > 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_int_equal(gf_engine_probe(e, GF_PROBE_STARTUP), 503);
	fk.connect_rc = 0;
	fk.acquire_rc = GF_ERR_PERMISSION;
	assert_int_equal(gf_engine_run_shadow(e, &cb), GF_ERR_PERMISSION);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
}

/* ---- loss ---- */

static void test_lock_loss_calls_hook(void **state)
{
	gf_engine *e = *state;
	to_active(e);
	/* The hook the engine installed into the lock client. */
	assert_ptr_equal(fk.lock->lost, gf_engine_lock_lost_hook);
	fk.lock->lost(fk.lock, GF_ERR_LOCK_LOST, "server gone, reconnect failed", fk.lock->ud);
	assert_int_equal(loss.calls, 1);
	assert_int_equal(loss.err, GF_ERR_LOCK_LOST);
	assert_int_equal(loss.state_seen, GF_ENGINE_DEAD);
	assert_non_null(strstr(loss.detail, "lock"));
	assert_non_null(strstr(loss.detail, "reconnect failed"));
	probes_are(e, 503, 503, 503);
	/* Once only, even if the GMS goes too. */
	fk.gms[0]->lost(fk.gms[0], GF_ERR_GMS_LOST, "hangup", fk.gms[0]->ud);
	assert_int_equal(loss.calls, 1);
}

static void test_gms_loss_calls_hook(void **state)
{
	gf_engine *e = *state;
	to_active(e);
	assert_ptr_equal(fk.gms[1]->lost, gf_engine_gms_lost_hook);
	fk.gms[1]->lost(fk.gms[1], GF_ERR_GMS_LOST, "POLLHUP", fk.gms[1]->ud);
	assert_int_equal(loss.calls, 1);
	assert_int_equal(loss.err, GF_ERR_GMS_LOST);
	assert_non_null(strstr(loss.detail, "device 1"));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
}

static void test_lock_loss_while_waking(void **state)
{
	gf_engine *e = *state;
	to_waking(e);
	fk.lock->lost(fk.lock, GF_ERR_LOCK_LOST, "gone", fk.lock->ud);
	assert_int_equal(loss.calls, 1);
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_STATE);
}

/* The default policy in a child: SIGTERM first; _exit(70) if that did not
 * end the process within the grace period. */
static int run_default_loss_child(bool ignore_term)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (ignore_term)
			signal(SIGTERM, SIG_IGN);
		else
			signal(SIGTERM, SIG_DFL);
		gf_engine *e;
		if (gf_engine_new_with_ops(&e, &fake_ops) || gf_engine_set_loss_grace(e, 100))
			_exit(3);
		gf_engine_default_loss(e, GF_ERR_GMS_LOST, "test", NULL);
		/* The policy returned at once; a stuck engine ends by the timer. */
		for (;;)
			pause();
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	return st;
}

static void test_default_loss_policy(void **state)
{
	int st = run_default_loss_child(false);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGTERM);
	st = run_default_loss_child(true);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 70);
}

/* ---- metrics and the probe server ---- */

static void test_metrics_text_and_json(void **state)
{
	gf_engine *e = *state;
	char *text, *js;
	assert_int_equal(gf_engine_metrics_text(e, &text), 0);
	assert_non_null(strstr(text, "gf_engine_state{state=\"init\"} 1"));
	assert_non_null(strstr(text, "gf_engine_failovers_total 0"));
	assert_null(strstr(text, "phase=\"remap\"")); /* not measured yet */
	free(text);
	fk.acquire_advance_ms = 42;
	to_active(e);
	assert_int_equal(gf_engine_metrics_text(e, &text), 0);
	assert_non_null(strstr(text, "gf_engine_state{state=\"active\"} 1"));
	assert_non_null(strstr(text, "gf_engine_state{state=\"init\"} 0"));
	assert_non_null(strstr(text, "gf_engine_failovers_total 1"));
	assert_non_null(strstr(text, "gf_engine_transitions_total 3"));
	assert_non_null(strstr(text, "gf_engine_last_failover_us{phase=\"lock_wait\"} 42000"));
	assert_non_null(strstr(text, "gf_engine_last_failover_us{phase=\"remap\"}"));
	assert_non_null(strstr(text, "gf_engine_last_failover_us{phase=\"private_alloc\"}"));
	assert_non_null(strstr(text, "gf_engine_last_failover_us{phase=\"serve\"}"));
	assert_non_null(strstr(text, "gf_engine_lock_epoch 7"));
	free(text);
	assert_int_equal(gf_engine_state_json(e, &js), 0);
	json_error_t je;
	json_t *o = json_loads(js, 0, &je);
	assert_non_null(o);
	assert_string_equal(json_string_value(json_object_get(o, "state")), "active");
	assert_string_equal(json_string_value(json_object_get(o, "id")), "eng-a");
	assert_int_equal(json_integer_value(json_object_get(o, "epoch")), 7);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "last_failover"), "lock_wait_us")),
			 42000);
	json_decref(o);
	free(js);
}

/* A minimal HTTP/1.0 GET; returns the status and copies the body. */
static int http_get(int port, const char *path, char *body, size_t len)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
	if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		close(fd);
		return -1;
	}
	char req[256];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
	if (write(fd, req, (size_t)n) != n) {
		close(fd);
		return -1;
	}
	static char buf[16384];
	size_t got = 0;
	ssize_t r;
	while (got < sizeof(buf) - 1 && (r = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0)
		got += (size_t)r;
	buf[got] = 0;
	close(fd);
	int status = -1;
	sscanf(buf, "HTTP/1.%*d %d", &status);
	char *b = strstr(buf, "\r\n\r\n");
	if (body)
		snprintf(body, len, "%s", b ? b + 4 : "");
	return status;
}

static void test_probe_server_http(void **state)
{
	gf_engine *e = *state;
	char body[16384];
	int fds = tu_count_fds();
	assert_int_equal(gf_engine_set_probe_address(e, "127.0.0.1", 0), 0);
	assert_int_equal(gf_engine_start_probe_server(e), 0);
	assert_int_equal(gf_engine_start_probe_server(e), 0); /* already running */
	int port = gf_engine_probe_port(e);
	assert_true(port > 0);
	assert_int_equal(http_get(port, "/live", NULL, 0), 503);
	assert_int_equal(http_get(port, "/ready", NULL, 0), 503);
	assert_int_equal(http_get(port, "/startup", NULL, 0), 503);
	to_standby(e);
	assert_int_equal(http_get(port, "/live", body, sizeof(body)), 200);
	assert_non_null(strstr(body, "standby"));
	assert_int_equal(http_get(port, "/ready", NULL, 0), 200);
	assert_int_equal(http_get(port, "/startup", NULL, 0), 200);
	assert_int_equal(http_get(port, "/state", body, sizeof(body)), 200);
	assert_non_null(strstr(body, "\"state\":\"standby\""));
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	fk.now += 3000 * 1000; /* past the waking timeout */
	assert_int_equal(http_get(port, "/live", NULL, 0), 503);
	assert_int_equal(http_get(port, "/ready", NULL, 0), 200);
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
	assert_int_equal(http_get(port, "/live", NULL, 0), 200);
	assert_int_equal(http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_non_null(strstr(body, "gf_engine_failovers_total 1"));
	assert_int_equal(http_get(port, "/nope", NULL, 0), 404);
	gf_engine_mark_dead(e, "test");
	assert_int_equal(http_get(port, "/live", NULL, 0), 503);
	gf_engine_free(e);
	*state = NULL;
	assert_int_equal(tu_count_fds(), fds); /* the server's sockets are closed */
	assert_int_equal(http_get(port, "/live", NULL, 0), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_legal_path, setup, teardown),
		cmocka_unit_test_setup_teardown(test_illegal_transitions, setup, teardown),
		cmocka_unit_test(test_dead_from_every_state),
		cmocka_unit_test_setup_teardown(test_config_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_follower_imports, setup, teardown),
		cmocka_unit_test_setup_teardown(test_loader_must_commit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_init_connect_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_acquire_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_probe_table, setup, teardown),
		cmocka_unit_test(test_probe_decision_table),
		cmocka_unit_test_setup_teardown(test_waking_timeout_flips_live, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_remap_failure_is_all_or_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_private_failure_is_all_or_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_retries_oom, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_oom_until_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_serve_failure_is_dead, setup, teardown),
		cmocka_unit_test_setup_teardown(test_run_shadow, setup, teardown),
		cmocka_unit_test_setup_teardown(test_run_shadow_probe_server_and_failure, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_loss_calls_hook, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gms_loss_calls_hook, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_loss_while_waking, setup, teardown),
		cmocka_unit_test(test_default_loss_policy),
		cmocka_unit_test_setup_teardown(test_metrics_text_and_json, setup, teardown),
		cmocka_unit_test_setup_teardown(test_probe_server_http, setup, teardown),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
