/* SPDX-License-Identifier: Apache-2.0 */
/* The engine state machine against real servers: a gf_lockd and one gf_gmsd
 * per device run in threads of this process, and the engine uses the real
 * lock, GMS and memory clients. argv[1] picks the backend: "host" (one
 * device) or "cuda" (two devices on the test driver tests/fakecuda, whose
 * fault knobs make remaps, private maps and allocations fail). Only the
 * clock is the test's: time moves when a test says so, and OOM backoff
 * sleeps advance it instead of waiting.
 * Covered: every legal and illegal transition, the probe table, the waking
 * timeout, the loss policy (real lock and GMS losses; the default policy in
 * forked children), all-or-nothing wake, OOM retries and the probe server
 * over real HTTP. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "../common/testutil.h"
#include "../gms/gmstest.h"
#include "common.h"
#include "engine_int.h"

#define WEIGHT_BYTES (1u << 20)
#define WEIGHT_BYTE 0x5a

static int kind = GF_MEM_HOST;
static int ndev = 1;

/* ---- the clock: real time plus a skew the test controls ---- */

static _Atomic int64_t skew_us;
static int64_t slept_ms;
static int sleeps;
/* Called at every backoff sleep (with the sleep count), e.g. to end an OOM. */
static void (*on_sleep)(int n);

static int64_t t_now(void)
{
	return gf_now_us() + atomic_load(&skew_us);
}
static void t_sleep(int64_t ms)
{
	atomic_fetch_add(&skew_us, ms * 1000);
	slept_ms += ms;
	sleeps++;
	if (on_sleep)
		on_sleep(sleeps);
}
static const struct gf_engine_clock test_clock = { .now_us = t_now, .sleep_ms = t_sleep };

static void advance_ms(int64_t ms)
{
	atomic_fetch_add(&skew_us, ms * 1000);
}

/* ---- servers ---- */

struct fixture {
	char *dir;
	gf_lockd *lockd;
	pthread_t lock_thread;
	char lock_uri[300];
	struct gt_server gms[2];
	gf_engine *e;
	int fds; /* open fds before the servers and the engine existed */
	/* A lost context cannot release driver objects: such a process must
	 * exit (as the default loss policy makes it); teardown drops them. */
	bool context_lost;
};

static void *lockd_main(void *arg)
{
	gf_lockd_run(arg);
	return NULL;
}

static void lockd_start(struct fixture *f)
{
	char state[400];
	snprintf(f->lock_uri, sizeof(f->lock_uri), "unix://%s/lock.sock", f->dir);
	snprintf(state, sizeof(state), "%s/lock.state", f->dir);
	assert_int_equal(gf_lockd_new(&f->lockd), 0);
	assert_int_equal(gf_lockd_add_listen(f->lockd, f->lock_uri), 0);
	assert_int_equal(gf_lockd_set_state_file(f->lockd, state), 0);
	/* The holder is this very process: there is no exit to wait for. */
	assert_int_equal(gf_lockd_set_exit_wait_timeout(f->lockd, 0), 0);
	assert_int_equal(gf_lockd_set_reconnect_window(f->lockd, 0), 0);
	assert_int_equal(gf_lockd_start(f->lockd), 0);
	assert_int_equal(pthread_create(&f->lock_thread, NULL, lockd_main, f->lockd), 0);
}

static void lockd_stop(struct fixture *f)
{
	if (!f->lockd)
		return;
	gf_lockd_stop(f->lockd);
	pthread_join(f->lock_thread, NULL);
	gf_lockd_free(f->lockd);
	f->lockd = NULL;
}

/* A GMS for device @i on the fixture's backend, in a thread. */
static void gms_start(struct fixture *f, int i)
{
	struct gt_server *s = &f->gms[i];
	snprintf(s->uri, sizeof(s->uri), "unix://%s/gms%d.sock", f->dir, i);
	s->pid = 0;
	assert_int_equal(gf_gmsd_new(&s->d), 0);
	assert_int_equal(gf_gmsd_add_listen(s->d, s->uri), 0);
	assert_int_equal(gf_gmsd_set_backend(s->d, kind), 0);
	assert_int_equal(gf_gmsd_set_device(s->d, i), 0);
	assert_int_equal(gf_gmsd_start(s->d), 0);
	assert_int_equal(pthread_create(&s->th, NULL, gt_run, s), 0);
}

static struct loss_rec {
	atomic_int calls;
	int err;
	int state_seen;
	char detail[256];
} loss;
static void record_loss(gf_engine *e, int err, const char *detail, void *ud)
{
	loss.err = err;
	loss.state_seen = gf_engine_state(e);
	snprintf(loss.detail, sizeof(loss.detail), "%s", detail);
	atomic_fetch_add(&loss.calls, 1);
}

static gf_engine *new_engine(struct fixture *f)
{
	gf_engine *e;
	assert_int_equal(gf_engine_new(&e), 0);
	gf_engine_set_clock(e, &test_clock);
	assert_int_equal(gf_engine_set_backend(e, kind), 0);
	assert_int_equal(gf_engine_set_lock(e, f->lock_uri, "eng-a"), 0);
	for (int i = 0; i < ndev; i++)
		assert_int_equal(gf_engine_add_gms(e, f->gms[i].uri), 0);
	assert_int_equal(gf_engine_set_private_bytes(e, 1 << 20), 0);
	assert_int_equal(gf_engine_set_waking_timeout(e, 2000), 0);
	assert_int_equal(gf_engine_set_remap_timeout(e, 2000), 0);
	assert_int_equal(gf_engine_set_init_timeout(e, 2000), 0);
	assert_int_equal(gf_engine_set_loss_fn(e, record_loss, NULL), 0);
	return e;
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	f->dir = tu_tmpdir();
	assert_non_null(f->dir);
	atomic_store(&skew_us, 0);
	slept_ms = 0;
	sleeps = 0;
	on_sleep = NULL;
	memset(&loss, 0, sizeof(loss));
	f->fds = tu_count_fds();
	lockd_start(f);
	for (int i = 0; i < ndev; i++)
		gms_start(f, i);
	f->e = new_engine(f);
	*state = f;
	return 0;
}

/* Wait (real time, generous for a loaded machine) until @cond holds. */
#define EVENTUALLY(cond)                                             \
	do {                                                         \
		for (int64_t i_ = 0; i_ < TU_MS(20000) && !(cond); i_++)        \
			usleep(1000);                                \
		assert_true(cond);                                   \
	} while (0)

/* What the exit of a process with a lost context does to the test
 * driver's objects (each allocation an open file in FAKECUDA_STATE_DIR):
 * nothing in the process can release them any more. */
static void drop_driver_fds(void)
{
	const char *dir = getenv("FAKECUDA_STATE_DIR");
	char link[64], target[4096];
	for (int fd = 3; dir && fd < 1024; fd++) {
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		ssize_t n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		if (strncmp(target, dir, strlen(dir)) == 0)
			close(fd);
	}
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	gf_engine_free(f->e);
	/* The lock is free again: another client gets it at once. */
	if (f->lockd) {
		gf_lock *l;
		struct gf_lock_grant g;
		assert_int_equal(gf_lock_new(&l, f->lock_uri, "after"), 0);
		assert_int_equal(gf_lock_acquire(l, TU_MS(5000), &g), 0);
		gf_lock_free(l);
	}
	for (int i = 0; i < ndev; i++)
		gt_stop(&f->gms[i]);
	lockd_stop(f);
	if (f->context_lost)
		drop_driver_fds();
	/* Everything the engine and the servers opened is closed again. */
	EVENTUALLY(tu_count_fds() == f->fds);
	tu_env_set("FAKECUDA_FAIL", NULL);
	tu_env_set("FAKECUDA_OOM_AFTER_BYTES", NULL);
	tu_env_set("FAKECUDA_TOTAL_MEM", NULL);
	tu_env_set("GF_MEM_HOST_AVAILABLE", NULL);
	gt_rmtree(f->dir);
	free(f->dir);
	free(f);
	return 0;
}

/* ---- weights ---- */

/* The loader's load: one allocation filled with WEIGHT_BYTE, one metadata
 * entry, commit. */
static int loads;
static int real_load(gf_engine *e, int device, gf_gms *g, void *ud)
{
	uint64_t id;
	struct gf_gms_alloc_info info;
	loads++;
	int rc = gf_gms_allocate(g, WEIGHT_BYTES, "w", &id);
	if (rc)
		return rc;
	if ((rc = gf_gms_alloc_at(g, 0, &info)))
		return rc;
	memset((void *)(uintptr_t)info.addr, WEIGHT_BYTE, WEIGHT_BYTES);
	if ((rc = gf_gms_put_meta(g, "w", id, 0, "v", 1)))
		return rc;
	return gf_gms_commit(g, NULL);
}
static int load_without_commit(gf_engine *e, int device, gf_gms *g, void *ud)
{
	return gf_gms_allocate(g, WEIGHT_BYTES, "w", NULL);
}

/* Are the weights of @device mapped and readable? (0: the client is asleep.) */
static bool weights_mapped(gf_engine *e, int device)
{
	gf_gms *g = gf_engine_gms(e, device);
	struct gf_gms_meta m;
	if (!g || gf_gms_granted_mode(g) == 0)
		return false;
	assert_int_equal(gf_gms_meta_get(g, "w", &m), 0);
	const uint8_t *p = (const uint8_t *)(uintptr_t)m.addr;
	return p[0] == WEIGHT_BYTE && p[WEIGHT_BYTES - 1] == WEIGHT_BYTE;
}

static int mapped_count(gf_engine *e)
{
	int n = 0;
	for (int i = 0; i < ndev; i++)
		n += weights_mapped(e, i);
	return n;
}

static int private_count(gf_engine *e)
{
	int n = 0;
	for (int i = 0; i < ndev; i++)
		n += gf_engine_private_backed(e, i) == 1;
	return n;
}

static void to_standby(gf_engine *e)
{
	assert_int_equal(gf_engine_init_weights(e, real_load, NULL), 0);
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

/* Is any byte of [addr, addr + len) mapped with some access in this process? */
static bool range_accessible(uint64_t addr, uint64_t len)
{
	FILE *fp = fopen("/proc/self/maps", "r");
	char line[512];
	bool any = false;
	assert_non_null(fp);
	while (fgets(line, sizeof(line), fp)) {
		unsigned long lo, hi;
		char perms[8];
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo < addr + len && hi > addr &&
		    strncmp(perms, "---", 3) != 0)
			any = true;
	}
	fclose(fp);
	return any;
}

/* The private (KV) region's address is known from Init and is the one the
 * wake backs: what an engine builds over it at Init (CUDA graphs) stays
 * valid. Nothing backs it before the wake, and a stale access faults. */
static void test_private_address_from_init(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	uint64_t a0, s0, a1, s1;
	assert_int_equal(gf_engine_private_memory(e, 0, &a0, &s0), GF_ERR_STATE); /* before init */
	assert_int_equal(gf_engine_init_weights(e, real_load, NULL), 0);
	assert_int_equal(gf_engine_private_memory(e, 0, &a0, &s0), 0);
	assert_true(a0 != 0 && s0 >= (1 << 20));
	assert_int_equal(gf_engine_private_backed(e, 0), 0);
	assert_false(range_accessible(a0, s0));
	assert_int_equal(gf_engine_sleep(e), 0);
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	assert_int_equal(gf_engine_wake_up(e), 0);
	for (int i = 0; i < ndev; i++)
		assert_int_equal(gf_engine_private_backed(e, i), 1);
	assert_int_equal(gf_engine_private_memory(e, 0, &a1, &s1), 0);
	assert_true(a1 == a0 && s1 == s0); /* the same range, now backed */
	assert_true(range_accessible(a1, s1));
	memset((void *)(uintptr_t)a1, 0x5a, s1);
	assert_int_equal(gf_engine_private_backed(e, ndev), GF_ERR_INVALID_ARG);
}

static int serve_calls;
static int count_serve(gf_engine *e, void *ud)
{
	serve_calls++;
	/* Still Waking while serve_endpoint runs: Active comes after. */
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
	return 0;
}

struct holder {
	gf_lock *lock;
	int64_t hold_ms;
	int64_t released_us; /* test clock, just before the release */
	pthread_t t;
};
static void *release_later(void *arg)
{
	struct holder *h = arg;
	usleep((useconds_t)h->hold_ms * 1000);
	h->released_us = t_now();
	gf_lock_release(h->lock);
	return NULL;
}

/* Another client holds the lock; a thread releases it after @hold_ms. */
static void hold_lock(struct fixture *f, struct holder *h, int64_t hold_ms)
{
	struct gf_lock_grant g;
	assert_int_equal(gf_lock_new(&h->lock, f->lock_uri, "holder"), 0);
	assert_int_equal(gf_lock_acquire(h->lock, TU_MS(5000), &g), 0);
	h->hold_ms = hold_ms;
	if (hold_ms >= 0)
		assert_int_equal(pthread_create(&h->t, NULL, release_later, h), 0);
}

static void test_legal_path(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	struct gf_engine_metrics m;
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_int_equal(gf_engine_set_lock_reconnect_timeout(e, TU_MS(1500)), 0);
	loads = 0;
	assert_int_equal(gf_engine_init_weights(e, real_load, NULL), 0);
	assert_int_equal(loads, ndev);
	assert_int_equal(mapped_count(e), ndev);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_int_equal(gf_engine_sleep(e), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	assert_int_equal(mapped_count(e), 0);
	/* The lock is busy for a while: the wait is measured. */
	struct holder h;
	hold_lock(f, &h, 300);
	uint64_t holder_epoch = gf_lock_epoch(h.lock);
	int64_t acquire_called_us = t_now();
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	int64_t acquire_returned_us = t_now();
	pthread_join(h.t, NULL);
	gf_lock_free(h.lock);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
	assert_true(gf_engine_epoch(e) > holder_epoch);
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
	assert_int_equal(mapped_count(e), ndev); /* same bytes, mapped again */
	assert_int_equal(private_count(e), ndev);
	uint64_t addr, size;
	assert_int_equal(gf_engine_private_memory(e, ndev - 1, &addr, &size), 0);
	assert_true(size >= (1 << 20));
	memset((void *)(uintptr_t)addr, 1, size); /* read-write */
	assert_int_equal(gf_engine_serve(e, count_serve, NULL), 0);
	assert_int_equal(serve_calls, 1);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_ACTIVE);
	assert_int_equal(gf_engine_metrics(e, &m), 0);
	assert_int_equal(m.state, GF_ENGINE_ACTIVE);
	assert_int_equal(m.transitions, 3);
	assert_int_equal(m.failovers, 1);
	assert_int_equal(m.epoch, gf_engine_epoch(e));
	/* The wait is measured from the lock request (after the call's own
	 * set-up, which a loaded machine may stretch) to the grant: inside the
	 * call, and covering the hold but that set-up. */
	assert_true(m.lock_wait_us <= acquire_returned_us - acquire_called_us);
	assert_true(m.lock_wait_us >= h.released_us - acquire_called_us - 100000);
	assert_true(m.remap_us >= 0 && m.private_alloc_us >= 0 && m.serve_us >= 0 && m.wake_total_us >= 0);
	advance_ms(3000);
	assert_int_equal(gf_engine_metrics(e, &m), 0);
	assert_true(m.time_in_state_us >= 3000000);
	assert_int_equal(gf_engine_mark_dead(e, "test"), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_int_equal(gf_engine_mark_dead(e, "again"), 0);
	assert_int_equal(gf_engine_metrics(e, &m), 0);
	assert_int_equal(m.transitions, 4);
}

/* The engine's log lines, with when each was logged and when it was delivered. */
static pthread_mutex_t wl_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	char msg[160];
	int64_t mono, delivered;
} wl[256];
static int nwl;

static void wake_log(int level, const char *c, const char *msg, void *ud)
{
	(void)level;
	(void)ud;
	if (strcmp(c, "engine") != 0)
		return;
	pthread_mutex_lock(&wl_mu);
	if (nwl < 256) {
		snprintf(wl[nwl].msg, sizeof(wl[nwl].msg), "%s", msg);
		gf_log_line_time(&wl[nwl].mono, NULL);
		wl[nwl].delivered = gf_now_us();
		nwl++;
	}
	pthread_mutex_unlock(&wl_mu);
}

static int wake_line(const char *event)
{
	for (int i = 0; i < nwl; i++)
		if (strstr(wl[i].msg, event))
			return i;
	fail_msg("no engine line with %s", event);
	return -1;
}

/* The lines of a wake (grant to Active) are written once the engine is
 * Active, not one write each on the way, and keep the times they were
 * logged at, in order. */
static void test_wake_lines_held_until_active(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	to_standby(e);
	nwl = 0;
	gf_set_log_fn(wake_log, NULL);
	gf_set_log_level(GF_LOG_INFO);
	int64_t before_acquire = gf_now_us();
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	assert_int_equal(gf_engine_wake_up(e), 0);
	usleep(2000);
	int64_t before_serve = gf_now_us();
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
	int64_t after_serve = gf_now_us();
	gf_set_log_fn(NULL, NULL);
	int granted = wake_line("event=lock_granted"), remapped = wake_line("event=weights_remapped"),
	    serving = wake_line("event=serving");
	assert_true(granted < remapped && remapped < serving);
	assert_true(wl[granted].mono >= before_acquire && wl[remapped].mono < before_serve);
	assert_true(wl[granted].mono <= wl[remapped].mono && wl[remapped].mono <= wl[serving].mono);
	assert_true(wl[serving].mono <= after_serve);
	/* Delivered together at Active: after the 2 ms between wake and serve. */
	assert_true(wl[granted].delivered >= before_serve);
	assert_true(wl[remapped].delivered >= before_serve);
	/* Before the grant nothing is held. */
	int waiting = wake_line("event=lock_waiting");
	assert_true(wl[waiting].delivered < before_serve);
}

static int find_line(const char *event)
{
	pthread_mutex_lock(&wl_mu);
	int found = -1;
	for (int i = 0; i < nwl && found < 0; i++)
		if (strstr(wl[i].msg, event))
			found = i;
	pthread_mutex_unlock(&wl_mu);
	return found;
}

/* The lock server's view of the holder: "yes", "no" or "unknown" serving. */
static bool lock_says_serving(struct fixture *f, const char *want)
{
	char *js = NULL, pat[64];
	snprintf(pat, sizeof(pat), "\"holder_serving\":\"%s\"", want);
	bool ok = gf_lock_status_json(f->lock_uri, NULL, 0, TU_MS(2000), &js) == 0 && strstr(js, pat);
	free(js);
	return ok;
}

/* Settling deferred: Active comes without the readiness report and the
 * wake's lines; gf_engine_settle() sends and writes them, once. */
static void test_settle_deferred(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_settle_deferred(NULL, 1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_settle(NULL), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_settle_deferred(e, 1), 0);
	assert_int_equal(gf_engine_settle(e), 0); /* nothing deferred yet: nothing done */
	to_standby(e);
	assert_int_equal(gf_engine_set_settle_deferred(e, 0), GF_ERR_STATE); /* configuration is over */
	nwl = 0;
	gf_set_log_fn(wake_log, NULL);
	gf_set_log_level(GF_LOG_INFO);
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_ACTIVE);
	usleep(20000);
	/* Active, yet nothing of the wake written and the holder not counted ready. */
	assert_int_equal(find_line("event=lock_granted"), -1);
	assert_int_equal(find_line("event=serving"), -1);
	assert_true(lock_says_serving(f, "no"));
	assert_int_equal(gf_engine_settle(e), 0);
	int granted = find_line("event=lock_granted"), serving = find_line("event=serving");
	assert_true(granted >= 0 && serving > granted);
	int64_t end = gf_now_us() + 5000000;
	while (!lock_says_serving(f, "yes") && gf_now_us() < end)
		usleep(2000);
	assert_true(lock_says_serving(f, "yes"));
	/* Once: a second call writes nothing again. */
	int lines = nwl;
	assert_int_equal(gf_engine_settle(e), 0);
	assert_int_equal(nwl, lines);
	gf_set_log_fn(NULL, NULL);
}

static int gms_readers(struct fixture *f)
{
	char *js;
	if (gf_gms_status_json(f->gms[0].uri, 2000, &js) < 0)
		return -1;
	const char *r = strstr(js, "\"readers\":");
	int n = r ? atoi(r + 10) : -1;
	free(js);
	return n;
}

struct acq {
	gf_engine *e;
	int64_t timeout_ms;
	atomic_int rc, done;
};
static void *acquire_main(void *p)
{
	struct acq *a = p;
	atomic_store(&a->rc, gf_engine_acquire(a->e, a->timeout_ms));
	atomic_store(&a->done, 1);
	return NULL;
}

/* A lock server in a thread of this process, on @uri with state file @state. */
static void own_lockd_start(gf_lockd **d, pthread_t *t, const char *uri, const char *state)
{
	assert_int_equal(gf_lockd_new(d), 0);
	assert_int_equal(gf_lockd_add_listen(*d, uri), 0);
	assert_int_equal(gf_lockd_set_state_file(*d, state), 0);
	assert_int_equal(gf_lockd_set_exit_wait_timeout(*d, 0), 0);
	assert_int_equal(gf_lockd_set_reconnect_window(*d, 0), 0);
	assert_int_equal(gf_lockd_start(*d), 0);
	assert_int_equal(pthread_create(t, NULL, lockd_main, *d), 0);
}

/*
 * Told it is next (LockNext, before the lock server writes its state), the
 * engine sends its GMS wake requests at once: the GMS grants the RO lock while
 * the lock is not granted yet. When the grant does not come after all (here:
 * the state file cannot be written, then the lock server goes away), the
 * requests are taken back and the GMS lets go of the reader; the engine stays
 * Standby and wakes normally under the next lock server.
 */
static void test_next_sends_the_wake_early(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	/* A lock server of its own whose state directory can be taken away. */
	char sdir[400], sstate[450], suri[420];
	snprintf(sdir, sizeof(sdir), "%s/st", f->dir);
	snprintf(sstate, sizeof(sstate), "%s/lock.state", sdir);
	snprintf(suri, sizeof(suri), "unix://%s/own-lock.sock", f->dir);
	assert_int_equal(mkdir(sdir, 0700), 0);
	gf_lockd *d;
	pthread_t dt;
	own_lockd_start(&d, &dt, suri, sstate);
	assert_int_equal(gf_engine_set_lock(e, suri, "eng-next"), 0);
	to_standby(e);
	assert_int_equal(gms_readers(f), 0);
	gf_lock *h;
	struct gf_lock_grant hg;
	assert_int_equal(gf_lock_new(&h, suri, "holder"), 0);
	assert_int_equal(gf_lock_acquire(h, TU_MS(2000), &hg), 0);
	struct acq a = { .e = e, .timeout_ms = 3000 };
	pthread_t at;
	assert_int_equal(pthread_create(&at, NULL, acquire_main, &a), 0);
	char *js = NULL;
	for (int i = 0; i < 5000; i++) {
		free(js);
		js = NULL;
		if (gf_lock_status_json(suri, NULL, 0, TU_MS(2000), &js) == 0 && strstr(js, "\"waiter_count\":1"))
			break;
		usleep(1000);
	}
	assert_non_null(strstr(js, "\"waiter_count\":1"));
	free(js);
	/* The state file can no longer be written: the server tells the engine
	 * it is next, then holds the grant (retrying the write). */
	char p[600];
	const char *names[] = { "lock.state", "lock.state.tmp", "lock.state.lock" };
	for (size_t i = 0; i < 3; i++) {
		snprintf(p, sizeof(p), "%s/%s", sdir, names[i]);
		unlink(p);
	}
	assert_int_equal(rmdir(sdir), 0);
	gf_lock_free(h); /* released: the engine is next */
	EVENTUALLY(gms_readers(f) == 1);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	assert_int_equal(atomic_load(&a.done), 0);
	assert_int_equal(gf_lock_status_json(suri, NULL, 0, TU_MS(2000), &js), 0);
	assert_null(strstr(js, "\"holder\":\"eng-next\""));
	free(js);
	/* The lock server goes: the grant will not come; the reader is let go. */
	gf_lockd_stop(d);
	pthread_join(dt, NULL);
	gf_lockd_free(d);
	EVENTUALLY(gms_readers(f) == 0);
	pthread_join(at, NULL);
	assert_true(atomic_load(&a.rc) < 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	/* Under a working lock server it wakes, connecting to the GMS afresh. */
	assert_int_equal(mkdir(sdir, 0700), 0);
	own_lockd_start(&d, &dt, suri, sstate);
	assert_int_equal(gf_engine_acquire(e, 3000), 0);
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
	assert_int_equal(mapped_count(e), ndev);
	assert_int_equal(gms_readers(f), 1);
	assert_int_equal(gf_engine_mark_dead(e, "test"), 0);
	gf_lockd_stop(d);
	pthread_join(dt, NULL);
	gf_lockd_free(d);
}

/* Every step that is not the next one is refused and changes nothing. */
static void expect_refused(gf_engine *e, int state, bool woken)
{
	assert_int_equal(gf_engine_state(e), state);
	if (state != GF_ENGINE_INIT)
		assert_int_equal(gf_engine_init_weights(e, real_load, NULL), GF_ERR_STATE);
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
	struct fixture *f = *state;
	gf_engine *e = f->e;
	/* Init without weights: nothing but init_weights. */
	assert_int_equal(gf_engine_sleep(e), GF_ERR_STATE);
	assert_int_equal(gf_engine_acquire(e, 0), GF_ERR_STATE);
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_STATE);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), GF_ERR_STATE);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	/* Init with weights: only sleep. */
	assert_int_equal(gf_engine_init_weights(e, real_load, NULL), 0);
	assert_int_equal(gf_engine_init_weights(e, real_load, NULL), GF_ERR_STATE);
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
		void *st;
		setup(&st);
		gf_engine *e = ((struct fixture *)st)->e;
		if (target == GF_ENGINE_STANDBY)
			to_standby(e);
		else if (target == GF_ENGINE_WAKING)
			to_waking(e);
		else if (target == GF_ENGINE_ACTIVE)
			to_active(e);
		assert_int_equal(gf_engine_state(e), target);
		assert_int_equal(gf_engine_mark_dead(e, "test"), 0);
		expect_refused(e, GF_ENGINE_DEAD, target >= GF_ENGINE_WAKING);
		teardown(&st);
	}
}

/* The wake priority: SCHED_FIFO from the wait on the lock until Active (what
 * the serve callback sees), the old policy after; an ordinary wake where the
 * platform does not permit it. */
struct prio_seen {
	int in_serve;
	int in_watcher; /* a thread started during the wake */
};
static void *policy_of_new_thread(void *ud)
{
	((struct prio_seen *)ud)->in_watcher = sched_getscheduler(0);
	return NULL;
}
static int prio_serve(gf_engine *e, void *ud)
{
	struct prio_seen *seen = ud;
	seen->in_serve = sched_getscheduler(0) & ~SCHED_RESET_ON_FORK;
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, policy_of_new_thread, seen), 0);
	pthread_join(t, NULL);
	return 0;
}

static void test_wake_priority(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_wake_priority(e, -1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_wake_priority(e, 100), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_wake_priority(NULL, 1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_wake_priority(e, 1), 0);
	/* Whether this process may use SCHED_FIFO at all (root, CAP_SYS_NICE, RLIMIT_RTPRIO). */
	struct sched_param p = { .sched_priority = 1 };
	bool permitted = pthread_setschedparam(pthread_self(), SCHED_FIFO, &p) == 0;
	p.sched_priority = 0;
	pthread_setschedparam(pthread_self(), SCHED_OTHER, &p);
	struct prio_seen seen = { -1, -1 };
	struct gf_engine_callbacks cb = { .load_weights = real_load, .serve = prio_serve, .userdata = &seen };
	assert_int_equal(gf_engine_run_shadow(e, &cb), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_ACTIVE);
	assert_int_equal(seen.in_serve, permitted ? SCHED_FIFO : SCHED_OTHER);
	assert_int_equal(seen.in_watcher, SCHED_OTHER);
	assert_int_equal(sched_getscheduler(0), SCHED_OTHER);
	/* Configuration is frozen once the engine has started. */
	assert_int_equal(gf_engine_set_wake_priority(e, 2), GF_ERR_STATE);
}

static void test_config_errors(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
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
	struct fixture *f = *state;
	/* A loader commits first; the follower maps what it committed. */
	gf_engine *loader = new_engine(f);
	assert_int_equal(gf_engine_init_weights(loader, real_load, NULL), 0);
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_role(e, GF_ENGINE_FOLLOWER), 0);
	loads = 0;
	assert_int_equal(gf_engine_init_weights(e, NULL, NULL), 0);
	assert_int_equal(loads, 0);
	assert_int_equal(mapped_count(e), ndev);
	assert_int_equal(gf_gms_granted_mode(gf_engine_gms(e, 0)), GF_GMS_RO);
	assert_non_null(gf_engine_gms(e, ndev - 1));
	assert_null(gf_engine_gms(e, ndev));
	gf_engine_free(loader);
}

/* The follower's fail-fast default: finite (a loader forever), shown in
 * /state and /metrics; a follower whose loader never commits gets
 * GF_ERR_TIMEOUT naming the GMS, and stays in Init. */
static void test_follower_init_timeout(void **state)
{
	struct fixture *f = *state;
	gf_engine *d;
	char *js, *text;
	assert_int_equal(gf_engine_new(&d), 0);
	assert_int_equal(gf_engine_state_json(d, &js), 0);
	assert_non_null(strstr(js, "\"init_timeout_ms\":null")); /* a loader: forever */
	free(js);
	assert_int_equal(gf_engine_set_role(d, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_state_json(d, &js), 0);
	char want[64];
	snprintf(want, sizeof(want), "\"init_timeout_ms\":%lld", (long long)GF_ENGINE_FOLLOWER_INIT_TIMEOUT_MS);
	assert_non_null(strstr(js, want));
	free(js);
	assert_int_equal(gf_engine_metrics_text(d, &text), 0);
	assert_non_null(strstr(text, "gf_engine_init_timeout_seconds 1800.000000\n"));
	free(text);
	assert_int_equal(gf_engine_set_init_timeout(d, -1), 0); /* explicitly forever */
	assert_int_equal(gf_engine_metrics_text(d, &text), 0);
	assert_non_null(strstr(text, "gf_engine_init_timeout_seconds +Inf\n"));
	free(text);
	gf_engine_free(d);

	/* No loader ever comes. */
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_role(e, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_set_init_timeout(e, 300), 0);
	assert_int_equal(gf_engine_init_weights(e, NULL, NULL), GF_ERR_TIMEOUT);
	assert_non_null(strstr(gf_error_detail(), "no committed layout"));
	assert_non_null(strstr(gf_error_detail(), f->gms[0].uri));
	assert_non_null(strstr(gf_error_detail(), "no writer connected for 0.3 s"));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_null(gf_engine_gms(e, 0));
}

/* A loader on threads of the test: one writer per device, loading for @load_ms by reported progress. */
struct slow_loader {
	struct fixture *f;
	int64_t load_ms;
	bool stall;  /* connect, allocate once and never go on */
	atomic_int connected;
	atomic_bool release; /* a stalled loader may leave */
	int rc;
	pthread_t th;
};

static void *slow_loader_main(void *arg)
{
	struct slow_loader *l = arg;
	gf_mem *m[GF_ENGINE_MAX_DEVICES] = { 0 };
	gf_gms *g[GF_ENGINE_MAX_DEVICES] = { 0 };
	uint64_t id;
	struct gf_gms_alloc_info info;
	int rc = 0;
	for (int i = 0; rc == 0 && i < ndev; i++) {
		rc = gf_mem_open(&m[i], kind, i);
		if (rc == 0)
			rc = gf_gms_connect(&g[i], l->f->gms[i].uri, m[i], GF_GMS_RW, 5000, NULL);
		if (rc == 0)
			rc = gf_gms_allocate(g[i], WEIGHT_BYTES, "w", &id);
		if (rc == 0)
			atomic_fetch_add(&l->connected, 1);
	}
	if (l->stall) {
		while (rc == 0 && !atomic_load(&l->release))
			usleep(10000);
	} else {
		int64_t t0 = gf_now_us();
		for (uint64_t done = 0; rc == 0 && gf_now_us() - t0 < l->load_ms * 1000; done += 4096) {
			for (int i = 0; rc == 0 && i < ndev; i++)
				rc = gf_gms_report_progress(g[i], done, WEIGHT_BYTES);
			usleep(50000);
		}
		for (int i = 0; rc == 0 && i < ndev; i++) {
			rc = gf_gms_alloc_at(g[i], 0, &info);
			if (rc == 0)
				memset((void *)(uintptr_t)info.addr, WEIGHT_BYTE, WEIGHT_BYTES);
			if (rc == 0)
				rc = gf_gms_put_meta(g[i], "w", id, 0, "v", 1);
			if (rc == 0)
				rc = gf_gms_commit(g[i], NULL);
		}
	}
	l->rc = rc;
	for (int i = 0; i < ndev; i++) {
		gf_gms_free(g[i]);
		gf_mem_free(m[i]);
	}
	return NULL;
}

/* A follower's init timeout counts only while its loader makes no progress:
 * a loader slower than the timeout keeps it waiting and it maps the commit;
 * a loader that stalls ends the wait, and the detail says so. */
static void test_follower_waits_for_a_slow_loader(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_role(e, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_set_init_timeout(e, 1000), 0);
	struct slow_loader l = { .f = f, .load_ms = 3000 };
	assert_int_equal(pthread_create(&l.th, NULL, slow_loader_main, &l), 0);
	EVENTUALLY(atomic_load(&l.connected) == ndev || l.rc);
	assert_int_equal(gf_engine_init_weights(e, NULL, NULL), 0);
	pthread_join(l.th, NULL);
	assert_int_equal(l.rc, 0);
	for (int i = 0; i < ndev; i++)
		assert_true(weights_mapped(e, i));

	/* A second follower, against a loader that connects and stalls. */
	gf_engine *s = new_engine(f);
	assert_int_equal(gf_engine_set_role(s, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_set_init_timeout(s, 300), 0);
	assert_int_equal(gf_engine_sleep(e), 0); /* its reader leaves: the stalled writer may load anew */
	struct slow_loader st = { .f = f, .stall = true };
	assert_int_equal(pthread_create(&st.th, NULL, slow_loader_main, &st), 0);
	EVENTUALLY(atomic_load(&st.connected) == ndev || st.rc);
	assert_int_equal(gf_engine_init_weights(s, NULL, NULL), GF_ERR_TIMEOUT);
	assert_non_null(strstr(gf_error_detail(), "writer connected but made no progress for 0.3 s"));
	atomic_store(&st.release, true);
	pthread_join(st.th, NULL);
	assert_int_equal(st.rc, 0);
	gf_engine_free(s);
}

struct init_thread {
	gf_engine *e;
	int rc;
	pthread_t th;
};

static void *init_main(void *arg)
{
	struct init_thread *t = arg;
	t->rc = gf_engine_init_weights(t->e, NULL, NULL);
	return NULL;
}

/* gf_engine_interrupt() ends a follower's wait in Init; Init may then be repeated. */
static void test_interrupt_ends_init_wait(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_role(e, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_set_init_timeout(e, 60000), 0);
	struct init_thread t = { .e = e };
	assert_int_equal(pthread_create(&t.th, NULL, init_main, &t), 0);
	char *js = NULL;
	for (int i = 0; i < 2000; i++) {
		free(js);
		assert_int_equal(gf_gms_status_json(f->gms[0].uri, 2000, &js), 0);
		if (strstr(js, "\"waiters_by_progress\":1"))
			break;
		usleep(10000);
	}
	assert_non_null(strstr(js, "\"waiters_by_progress\":1"));
	free(js);
	gf_engine_interrupt(e);
	pthread_join(t.th, NULL);
	assert_int_equal(t.rc, GF_ERR_INTERRUPTED);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_null(gf_engine_gms(e, 0));
	/* Again, once a loader committed: it maps. */
	gf_engine *l = new_engine(f);
	assert_int_equal(gf_engine_init_weights(l, real_load, NULL), 0);
	assert_int_equal(gf_engine_init_weights(e, NULL, NULL), 0);
	for (int i = 0; i < ndev; i++)
		assert_true(weights_mapped(e, i));
	gf_engine_free(l);
}

static void test_loader_must_commit(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_init_weights(e, load_without_commit, NULL), GF_ERR_STATE);
	assert_non_null(strstr(gf_error_detail(), "commit"));
	/* Cleaned up: nothing connected, still Init, and init may be retried. */
	assert_null(gf_engine_gms(e, 0));
	assert_null(gf_engine_mem(e, 0));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	loads = 0;
	assert_int_equal(gf_engine_init_weights(e, real_load, NULL), 0);
	assert_int_equal(loads, ndev); /* the uncommitted writer's work was dropped */
}

static void test_init_connect_fails(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	gt_stop(&f->gms[ndev - 1]);
	int rc = gf_engine_init_weights(e, real_load, NULL);
	assert_true(rc == GF_ERR_UNREACHABLE || rc == GF_ERR_TIMEOUT);
	assert_null(gf_engine_mem(e, 0));
	assert_null(gf_engine_gms(e, 0));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
}

/* The standby pool: what the engine declares shows in the lock server's status while it waits. */
struct status_poll {
	const char *uri;
	char *json;
	pthread_t t;
};
static void *poll_waiting_status(void *arg)
{
	struct status_poll *p = arg;
	for (int i = 0; i < 20000 && !p->json; i++) {
		char *json = NULL;
		if (gf_lock_status_json(p->uri, NULL, 0, TU_MS(2000), &json) == 0 && strstr(json, "\"waiter_count\":1")) {
			p->json = json;
			break;
		}
		free(json);
		usleep(1000);
	}
	return NULL;
}

static void test_pool_declaration(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	const char *bad[] = { "GPU-12" }, *dup[] = { "GPU-0a1b2c3d-0000-4000-8000-00000000000a",
						    "GPU-0A1B2C3D-0000-4000-8000-00000000000A" };
	assert_int_equal(gf_engine_set_gpus(e, bad, 1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_gpus(e, dup, 2), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_model(e, "no spaces"), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_model(e, "tiny-1"), 0);
	assert_int_equal(gf_engine_set_pinned(e, 1), 0);
	assert_int_equal(gf_engine_set_asleep_bytes(e, 4096), 0);
	to_standby(e);
	assert_int_equal(gf_engine_set_pinned(e, 0), GF_ERR_STATE); /* configuration is over */
	struct holder h;
	hold_lock(f, &h, -1);
	struct status_poll p = { .uri = f->lock_uri };
	assert_int_equal(pthread_create(&p.t, NULL, poll_waiting_status, &p), 0);
	assert_int_equal(gf_engine_acquire(e, 3000), GF_ERR_TIMEOUT);
	pthread_join(p.t, NULL);
	assert_non_null(p.json);
	assert_non_null(strstr(p.json, "\"model\":\"tiny-1\""));
	assert_non_null(strstr(p.json, "\"pinned\":true"));
	assert_non_null(strstr(p.json, "\"asleep_bytes\":4096"));
	assert_non_null(strstr(p.json, "\"wake_bytes\":1048576")); /* the memory need: the private bytes */
	/* Nothing set: the devices' UUIDs (cuda); the host backend names no GPU. */
	if (kind == GF_MEM_CUDA)
		assert_non_null(strstr(p.json, "\"gpus\":[\"GPU-"));
	else
		assert_non_null(strstr(p.json, "\"gpus\":[]"));
	free(p.json);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	gf_lock_free(h.lock);
}

static void test_acquire_errors(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	to_standby(e);
	/* Interrupted before the lock client exists: exactly one acquire returns. */
	gf_engine_interrupt(e);
	assert_int_equal(gf_engine_acquire(e, -1), GF_ERR_INTERRUPTED);
	/* Held by another: a bounded wait times out, an interrupt ends an unbounded one. */
	struct holder h;
	hold_lock(f, &h, -1);
	assert_int_equal(gf_engine_acquire(e, 10), GF_ERR_TIMEOUT);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	gf_engine_interrupt(e);
	assert_int_equal(gf_engine_acquire(e, -1), GF_ERR_INTERRUPTED);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	gf_lock_free(h.lock);
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
}

/* ---- probes ---- */

static int health_answer = 1;
static atomic_int health_calls;
static int health(gf_engine *e, void *ud)
{
	atomic_fetch_add(&health_calls, 1);
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
	struct fixture *f = *state;
	gf_engine *e = f->e;
	health_answer = 1;
	atomic_store(&health_calls, 0);
	assert_int_equal(gf_engine_set_health_fn(e, health, NULL), 0);
	probes_are(e, 503, 503, 503); /* Init */
	assert_int_equal(gf_engine_init_weights(e, real_load, NULL), 0);
	probes_are(e, 503, 503, 503); /* Init, weights loaded but not asleep yet */
	assert_int_equal(gf_engine_sleep(e), 0);
	probes_are(e, 200, 200, 200); /* Standby */
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	probes_are(e, 200, 200, 200); /* Waking, within the timeout */
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
	assert_int_equal(atomic_load(&health_calls), 0); /* only Active asks the engine */
	probes_are(e, 200, 200, 200); /* Active, healthy */
	health_answer = 0;
	probes_are(e, 200, 503, 503); /* Active, unhealthy */
	assert_true(atomic_load(&health_calls) >= 4);
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
			assert_int_equal(gf_engine_probe_decision(s, probes[p], 0, 1, 0), want[s][p]);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_WAKING, GF_PROBE_LIVE, 1, 1, 0), 503);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_WAKING, GF_PROBE_READY, 1, 1, 0), 200);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_WAKING, GF_PROBE_STARTUP, 1, 1, 0), 200);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_ACTIVE, GF_PROBE_LIVE, 0, 0, 0), 503);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_ACTIVE, GF_PROBE_READY, 0, 0, 0), 503);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_ACTIVE, GF_PROBE_STARTUP, 0, 0, 0), 200);
	assert_int_equal(gf_engine_probe_decision(GF_ENGINE_STANDBY, 0, 0, 1, 0), -1);
	/* A lost device: neither alive nor ready in any state; startup is the
	 * state's (Dead says 503 on its own). */
	for (int s = 0; s < 5; s++) {
		assert_int_equal(gf_engine_probe_decision(s, GF_PROBE_LIVE, 0, 1, 1), 503);
		assert_int_equal(gf_engine_probe_decision(s, GF_PROBE_READY, 0, 1, 1), 503);
		assert_int_equal(gf_engine_probe_decision(s, GF_PROBE_STARTUP, 0, 1, 1), want[s][0]);
	}
}

static void test_waking_timeout_flips_live(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e; /* waking timeout 2000 ms */
	to_waking(e);
	probes_are(e, 200, 200, 200);
	advance_ms(2000);
	probes_are(e, 200, 503, 200);
	/* Also after wake_up: the timeout covers the whole Waking state. */
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_probe(e, GF_PROBE_LIVE), 503);
	/* A slow but healthy wake that completes is live again as Active. */
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
	probes_are(e, 200, 200, 200);
}

/* ---- wake ---- */

/* A writer replaces the committed weights of @device while the engine sleeps. */
static void replace_weights(struct fixture *f, int device)
{
	gf_mem *m;
	gf_gms *g;
	assert_int_equal(gf_mem_open(&m, kind, device), 0);
	assert_int_equal(gf_gms_connect(&g, f->gms[device].uri, m, GF_GMS_RW, 5000, NULL), 0);
	assert_int_equal(gf_gms_allocate(g, 2 * WEIGHT_BYTES, "other", NULL), 0);
	assert_int_equal(gf_gms_commit(g, NULL), 0);
	gf_gms_free(g);
	gf_mem_free(m);
}

/* A writer cannot replace the weights of a waking engine: it waits until the engine sleeps again. */
static void test_waking_engine_holds_the_layout(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	to_waking(e);
	gf_mem *m;
	gf_gms *g;
	assert_int_equal(gf_mem_open(&m, kind, 0), 0);
	assert_int_equal(gf_gms_connect(&g, f->gms[0].uri, m, GF_GMS_RW, 200, NULL), GF_ERR_TIMEOUT);
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(mapped_count(e), ndev);
	gf_mem_free(m);
}

static void test_wake_remap_failure_is_all_or_nothing(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	/* Replaced while the engine sleeps: from the grant on, the waking
	 * engine holds the GMS's RO lock (its request goes out with the grant),
	 * so no writer can replace the weights between grant and remap. */
	to_standby(e);
	replace_weights(f, ndev - 1);
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_STALE_LAYOUT);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_int_equal(mapped_count(e), 0); /* on cuda device 0 was remapped, then unmapped again */
	assert_int_equal(private_count(e), 0);
	assert_int_equal(atomic_load(&loss.calls), 0); /* a failed wake is returned, not a loss */
}

/*
 * Issue 39.6: a GMS that said at connect it keeps no residency tier cannot
 * come back with the weights once it is gone, so the wake fails at once
 * (GMS_LOST) instead of retrying its connect for the whole remap timeout,
 * and the engine is Dead (its caller ends it; the lock passes on).
 */
static void test_wake_gms_gone_without_tier_fails_at_once(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	const int64_t remap_ms = TU_MS(30000);
	assert_int_equal(gf_engine_set_remap_timeout(e, remap_ms), 0);
	to_standby(e);
	gt_stop(&f->gms[ndev - 1]);
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	int64_t t0 = gf_now_us();
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_GMS_LOST);
	/* Well before the remap timeout: it did not wait for it. */
	assert_true(gf_now_us() - t0 < remap_ms * 1000 / 2);
	assert_non_null(strstr(gf_error_detail(), "no residency tier"));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_int_equal(mapped_count(e), 0);
	gms_start(f, ndev - 1); /* for the teardown */
}

/* The same with a WARM tier kept: a restarted GMS may restore, so the wake
 * keeps trying to connect until the remap timeout. */
static void test_wake_gms_gone_with_tier_retries(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	char warm[400];
	snprintf(warm, sizeof(warm), "%s/warm", f->dir);
	assert_int_equal(mkdir(warm, 0700), 0);
	gt_stop(&f->gms[ndev - 1]);
	struct gt_server *s = &f->gms[ndev - 1];
	assert_int_equal(gf_gmsd_new(&s->d), 0);
	assert_int_equal(gf_gmsd_add_listen(s->d, s->uri), 0);
	assert_int_equal(gf_gmsd_set_backend(s->d, kind), 0);
	assert_int_equal(gf_gmsd_set_device(s->d, ndev - 1), 0);
	assert_int_equal(gf_gmsd_set_tiers(s->d, warm, NULL), 0);
	assert_int_equal(gf_gmsd_start(s->d), 0);
	assert_int_equal(pthread_create(&s->th, NULL, gt_run, s), 0);
	const int64_t remap_ms = 600;
	assert_int_equal(gf_engine_set_remap_timeout(e, remap_ms), 0);
	to_standby(e);
	gt_stop(&f->gms[ndev - 1]);
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	int64_t t0 = gf_now_us();
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_UNREACHABLE);
	assert_true(gf_now_us() - t0 >= (remap_ms - 100) * 1000);
	gms_start(f, ndev - 1);
}

static void test_wake_private_failure_is_all_or_nothing(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	to_waking(e);
	/* The remaps map one allocation per device, then each private region
	 * maps one: the map of the last device's region fails. */
	char spec[64];
	snprintf(spec, sizeof(spec), "cuMemMap:%d", 2 * ndev);
	tu_env_set("FAKECUDA_FAIL", spec);
	int rc = gf_engine_wake_up(e);
	tu_env_set("FAKECUDA_FAIL", NULL);
	assert_int_equal(rc, GF_ERR_DRIVER);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_int_equal(mapped_count(e), 0);
	assert_int_equal(private_count(e), 0);
	/* The address range stays reserved (the engine is Dead; freeing it goes). */
	uint64_t addr;
	assert_int_equal(gf_engine_private_memory(e, 0, &addr, NULL), 0);
}

static void end_oom_after_three(int n)
{
	if (n == 3)
		tu_env_set("FAKECUDA_OOM_AFTER_BYTES", NULL);
}

static void test_wake_retries_oom(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	to_waking(e);
	/* The device is full until the third backoff sleep frees it. */
	tu_env_set("FAKECUDA_OOM_AFTER_BYTES", "0");
	on_sleep = end_oom_after_three;
	assert_int_equal(gf_engine_wake_up(e), 0);
	struct gf_engine_metrics m;
	gf_engine_metrics(e, &m);
	assert_int_equal(m.private_alloc_retries, 3);
	assert_true(slept_ms > 0);
	assert_true(m.private_alloc_us >= slept_ms * 1000);
	assert_int_equal(private_count(e), ndev);
}

static void test_wake_oom_until_timeout(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e; /* waking timeout 2 s */
	to_waking(e);
	tu_env_set("FAKECUDA_OOM_AFTER_BYTES", "0");
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_OUT_OF_MEMORY);
	tu_env_set("FAKECUDA_OOM_AFTER_BYTES", NULL);
	assert_non_null(strstr(gf_error_detail(), "waking timeout"));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	/* Retried for the waking timeout, not longer (real time passed too). */
	assert_true(slept_ms > 0 && slept_ms <= 2000);
	assert_int_equal(mapped_count(e), 0);
	assert_int_equal(private_count(e), 0);
}

static int failing_serve(gf_engine *e, void *ud)
{
	return GF_ERR_IO;
}

static void test_serve_failure_is_dead(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
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
	struct fixture *f = *state;
	gf_engine *e = f->e;
	int calls = 0;
	struct gf_engine_callbacks cb = { .load_weights = real_load, .weights_ready = run_ready, .serve = run_serve,
					  .userdata = &calls };
	assert_int_equal(gf_engine_run_shadow(e, &cb), 0);
	assert_int_equal(calls, 11);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_ACTIVE);
	assert_int_equal(mapped_count(e), ndev);
	assert_int_equal(gf_engine_run_shadow(e, &cb), GF_ERR_STATE);
}

/* run_shadow starts a configured probe server first, so Init is probed too;
 * a failing step is returned and leaves the state where it failed. */
static void test_run_shadow_probe_server_and_failure(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_probe_address(e, "127.0.0.1", 0), 0);
	gt_stop(&f->gms[0]);
	struct gf_engine_callbacks cb = { .load_weights = real_load };
	int rc = gf_engine_run_shadow(e, &cb);
	assert_true(rc == GF_ERR_UNREACHABLE || rc == GF_ERR_TIMEOUT);
	assert_true(gf_engine_probe_port(e) > 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_int_equal(gf_engine_probe(e, GF_PROBE_STARTUP), 503);
	gms_start(f, 0);
	/* The lock server is gone: acquire fails and the engine stays Standby. */
	lockd_stop(f);
	assert_int_equal(gf_engine_set_lock_reconnect_timeout(e, 100), 0);
	rc = gf_engine_run_shadow(e, &cb);
	assert_true(rc < 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
}

/* ---- loss ---- */

static void test_lock_loss_calls_hook(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_lock_reconnect_timeout(e, 200), 0);
	to_active(e);
	/* The lock server comes back without the grant (no reconnect window):
	 * the reclaim is refused and the loss policy runs, once, with the
	 * engine already Dead. (Merely gone, a unix server leaves the holder
	 * holding on: tests/lock/test_lock_outage.c.) */
	lockd_stop(f);
	lockd_start(f);
	EVENTUALLY(atomic_load(&loss.calls) == 1);
	assert_int_equal(loss.err, GF_ERR_LOCK_LOST);
	assert_int_equal(loss.state_seen, GF_ENGINE_DEAD);
	assert_non_null(strstr(loss.detail, "lock"));
	probes_are(e, 503, 503, 503);
	/* Once only, even if the GMS goes too. */
	gt_stop(&f->gms[0]);
	usleep(200 * 1000);
	assert_int_equal(atomic_load(&loss.calls), 1);
}

/*
 * Issue 28.12: once the lock is lost, the listener duplicate the engine
 * handed out no longer accepts (the next holder serves from the same
 * socket), though connections still wait in its backlog for that holder.
 */
static void test_lock_loss_stops_accepting(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	char serve[400], lsn[420];
	snprintf(serve, sizeof(serve), "%s/serve.sock", f->dir);
	snprintf(lsn, sizeof(lsn), "unix://%s", serve);
	lockd_stop(f);
	assert_int_equal(gf_lockd_new(&f->lockd), 0);
	assert_int_equal(gf_lockd_add_listen(f->lockd, f->lock_uri), 0);
	assert_int_equal(gf_lockd_add_listener(f->lockd, "http", lsn), 0);
	assert_int_equal(gf_lockd_set_exit_wait_timeout(f->lockd, 0), 0);
	assert_int_equal(gf_lockd_start(f->lockd), 0);
	assert_int_equal(pthread_create(&f->lock_thread, NULL, lockd_main, f->lockd), 0);
	assert_int_equal(gf_engine_set_lock_reconnect_timeout(e, 200), 0);
	assert_int_equal(gf_engine_may_accept(e), 0);
	to_active(e);
	int fd;
	assert_int_equal(gf_engine_listener(e, "http", &fd), 0);
	assert_int_equal(gf_engine_may_accept(e), 1);
	lockd_stop(f);
	lockd_start(f); /* without the grant: the reclaim is refused */
	EVENTUALLY(atomic_load(&loss.calls) == 1);
	assert_int_equal(gf_engine_may_accept(e), 0);
	int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	assert_true(strlen(serve) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, serve, strlen(serve) + 1);
	assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
	struct pollfd p = { .fd = fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 50), 0);
	errno = 0;
	assert_int_equal(accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), -1);
	assert_int_equal(errno, EOPNOTSUPP);
	close(c);
	close(fd);
	unlink(serve);
}

/*
 * Issue 39.3: the lock server down (unix): the engine holds on past its
 * reconnect time, its state says the server is unreachable, and it may go
 * on accepting from its listener (nobody else can be granted); a server
 * back without its grant refuses the reclaim, and it stops.
 */
static void test_lock_server_down_holds_on(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_lock_reconnect_timeout(e, 200), 0);
	to_active(e);
	assert_int_equal(gf_engine_may_accept(e), 1);
	lockd_stop(f);
	usleep(TU_MS(600) * 1000);
	assert_int_equal(atomic_load(&loss.calls), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_ACTIVE);
	assert_int_equal(gf_engine_may_accept(e), 1);
	char *json = NULL;
	assert_int_equal(gf_engine_state_json(e, &json), 0);
	assert_non_null(strstr(json, "\"lock_server\":\"unreachable\""));
	free(json);
	lockd_start(f); /* without the grant: the reclaim is refused */
	EVENTUALLY(atomic_load(&loss.calls) == 1);
	assert_int_equal(loss.err, GF_ERR_LOCK_LOST);
	assert_int_equal(gf_engine_may_accept(e), 0);
}

static void test_gms_loss_calls_hook(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	to_active(e);
	gt_stop(&f->gms[ndev - 1]);
	EVENTUALLY(atomic_load(&loss.calls) == 1);
	assert_int_equal(loss.err, GF_ERR_GMS_LOST);
	char want[32];
	snprintf(want, sizeof(want), "device %d", ndev - 1);
	assert_non_null(strstr(loss.detail, want));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
}

static void test_lock_loss_while_waking(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_lock_reconnect_timeout(e, 200), 0);
	to_waking(e);
	lockd_stop(f);
	lockd_start(f); /* without the grant: the reclaim is refused */
	EVENTUALLY(atomic_load(&loss.calls) == 1);
	assert_int_equal(gf_engine_wake_up(e), GF_ERR_STATE);
}

/* The default policy in a child: SIGTERM first; _exit(70) if that did not
 * end the process within the grace period. */
static int run_default_loss_child(bool ignore_term)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		signal(SIGTERM, ignore_term ? SIG_IGN : SIG_DFL);
		gf_engine *e;
		if (gf_engine_new(&e) || gf_engine_set_loss_grace(e, 100))
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
	struct fixture *f = *state;
	gf_engine *e = f->e;
	char *text, *js;
	assert_int_equal(gf_engine_metrics_text(e, &text), 0);
	assert_non_null(strstr(text, "gf_engine_state{state=\"init\"} 1"));
	assert_non_null(strstr(text, "gf_engine_failovers_total 0"));
	assert_null(strstr(text, "gf_engine_last_failover_seconds{phase=\"remap\"}")); /* not measured yet */
	assert_non_null(strstr(text, "gf_engine_failover_duration_seconds_count{phase=\"total\"} 0\n"));
	free(text);
	to_active(e);
	struct gf_engine_metrics m;
	gf_engine_metrics(e, &m);
	char want[128];
	assert_int_equal(gf_engine_metrics_text(e, &text), 0);
	assert_non_null(strstr(text, "gf_engine_state{state=\"active\"} 1"));
	assert_non_null(strstr(text, "gf_engine_state{state=\"init\"} 0"));
	assert_non_null(strstr(text, "gf_engine_failovers_total 1"));
	assert_non_null(strstr(text, "gf_engine_transitions_total 3"));
	/* Base units: seconds, exactly the microseconds measured. */
	snprintf(want, sizeof(want), "gf_engine_last_failover_seconds{phase=\"lock_wait\"} %lld.%06lld\n",
		 (long long)m.lock_wait_us / 1000000, (long long)m.lock_wait_us % 1000000);
	assert_non_null(strstr(text, want));
	assert_non_null(strstr(text, "gf_engine_last_failover_seconds{phase=\"remap\"}"));
	assert_non_null(strstr(text, "gf_engine_last_failover_seconds{phase=\"private_alloc\"}"));
	assert_non_null(strstr(text, "gf_engine_last_failover_seconds{phase=\"serve\"}"));
	assert_non_null(strstr(text, "gf_engine_time_in_state_seconds "));
	assert_null(strstr(text, "_us"));
	/* The takeover is one observation per phase; its buckets are cumulative. */
	static const char *const phases[] = { "remap", "private_alloc", "serve", "total" };
	for (size_t p = 0; p < 4; p++) {
		snprintf(want, sizeof(want), "gf_engine_failover_duration_seconds_count{phase=\"%s\"} 1\n", phases[p]);
		assert_non_null(strstr(text, want));
		snprintf(want, sizeof(want), "gf_engine_failover_duration_seconds_bucket{phase=\"%s\",le=\"+Inf\"} 1\n",
			 phases[p]);
		assert_non_null(strstr(text, want));
		snprintf(want, sizeof(want), "gf_engine_failover_duration_seconds_bucket{phase=\"%s\",le=\"300.000000\"} 1\n",
			 phases[p]);
		assert_non_null(strstr(text, want));
	}
	assert_null(strstr(text, "gf_engine_failover_duration_seconds_count{phase=\"lock_wait\"}"));
	/* The total of a takeover within 1 ms would be in every bucket; the
	 * bucket that holds it is the first whose bound is not below it. */
	char *line = strstr(text, "gf_engine_failover_duration_seconds_bucket{phase=\"total\",le=\"0.001000\"} ");
	assert_non_null(line);
	assert_int_equal(atoi(strchr(line, '}') + 2), m.wake_total_us <= 1000 ? 1 : 0);
	/* The buckets resolve a takeover of microseconds: from 10 us on. */
	line = strstr(text, "gf_engine_failover_duration_seconds_bucket{phase=\"total\",le=\"0.000010\"} ");
	assert_non_null(line);
	assert_int_equal(atoi(strchr(line, '}') + 2), m.wake_total_us <= 10 ? 1 : 0);
	assert_non_null(strstr(text, "gf_engine_failover_duration_seconds_bucket{phase=\"total\",le=\"0.000250\"} "));
	assert_non_null(strstr(text, "gf_engine_failover_duration_seconds_bucket{phase=\"total\",le=\"10.000000\"} "));
	snprintf(want, sizeof(want), "gf_engine_lock_epoch %llu\n", (unsigned long long)m.epoch);
	assert_non_null(strstr(text, want));
	/* The device's answers: read-only weights protected (always on the host
	 * backend; on the test driver as its default knob says), context intact. */
	const char *prot = gf_mem_read_protection_name(gf_mem_read_protection(gf_engine_mem(e, 0)));
	if (kind == GF_MEM_HOST)
		assert_string_equal(prot, "enforced");
	snprintf(want, sizeof(want), "gf_engine_read_protection{mode=\"%s\"} 1\n", prot);
	assert_non_null(strstr(text, want));
	assert_non_null(strstr(text, "gf_engine_device_lost 0\n"));
	free(text);
	assert_int_equal(gf_engine_state_json(e, &js), 0);
	json_error_t je;
	json_t *o = json_loads(js, 0, &je);
	assert_non_null(o);
	assert_string_equal(json_string_value(json_object_get(o, "state")), "active");
	assert_string_equal(json_string_value(json_object_get(o, "id")), "eng-a");
	assert_string_equal(json_string_value(json_object_get(o, "read_protection")), prot);
	assert_true(json_is_false(json_object_get(o, "device_lost")));
	assert_int_equal(json_integer_value(json_object_get(o, "epoch")), m.epoch);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "last_failover"), "lock_wait_us")),
			 m.lock_wait_us);
	json_decref(o);
	free(js);
}

/* A TCP connection from @src (a loopback address) to the probe server;
 * -1 when refused. Reads and writes give up after 20 s, so a server that
 * never answers fails the test instead of hanging it. */
static int connect_from(const char *src, int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in me = { .sin_family = AF_INET };
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { .tv_sec = 20 };
	inet_pton(AF_INET, src, &me.sin_addr);
	inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (bind(fd, (struct sockaddr *)&me, sizeof(me)) < 0 ||
	    connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* A minimal HTTP/1.0 GET; returns the status and copies the body. */
static int http_get(int port, const char *path, char *body, size_t len)
{
	int fd = connect_from("127.0.0.1", port);
	if (fd < 0)
		return -1;
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
	struct fixture *f = *state;
	gf_engine *e = f->e;
	char body[16384];
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
	advance_ms(3000); /* past the waking timeout */
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
	f->e = NULL;
	/* The teardown checks that the server's sockets are closed. */
	assert_int_equal(http_get(port, "/live", NULL, 0), -1);
}

/* A slow client: a request begun but never finished. */
static int slow_client(const char *src, int port)
{
	int fd = connect_from(src, port);
	static const char part[] = "GET /live HTTP/1.1\r\nHost: x\r\n";
	if (fd >= 0 && write(fd, part, sizeof(part) - 1) != (ssize_t)(sizeof(part) - 1)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Has the server closed @fd (end of file or reset, no answer)? Waits up to 20 s. */
static bool closed_by_server(int fd)
{
	char c;
	ssize_t r = read(fd, &c, 1);
	return r == 0 || (r < 0 && errno == ECONNRESET);
}

static int standby_with_probe_server(struct fixture *f)
{
	assert_int_equal(gf_engine_set_probe_address(f->e, "127.0.0.1", 0), 0);
	assert_int_equal(gf_engine_start_probe_server(f->e), 0);
	to_standby(f->e);
	return gf_engine_probe_port(f->e);
}

#define SLOW_CLIENTS 70

/* Seventy slow connections from one address: the per-address limit keeps
 * most out, and /live from another address still answers. */
static void test_probe_server_slow_clients_one_address(void **state)
{
	struct fixture *f = *state;
	int port = standby_with_probe_server(f);
	int fds[SLOW_CLIENTS];
	for (int i = 0; i < SLOW_CLIENTS; i++)
		fds[i] = slow_client("127.0.0.2", port);
	assert_int_equal(http_get(port, "/live", NULL, 0), 200);
	int refused = 0;
	for (int i = 0; i < SLOW_CLIENTS; i++) {
		if (fds[i] < 0 || closed_by_server(fds[i]))
			refused++;
		if (fds[i] >= 0)
			close(fds[i]);
	}
	assert_int_equal(refused, SLOW_CLIENTS); /* the admitted ones too, at the deadline */
	assert_int_equal(http_get(port, "/ready", NULL, 0), 200);
}

/* Kubelet probes from the node's address, which others on the node share:
 * forty-five slow (half-sent) connections from the probe's own address do
 * not keep /ready or /live out. The oldest of that address make room (no
 * refusal, which libmicrohttpd's own per-address limit would have been). */
static void test_probe_server_flood_from_the_probes_address(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(gf_engine_set_probe_address(f->e, "127.0.0.1", 0), 0);
	assert_int_equal(gf_engine_start_probe_server(f->e), 0);
	to_active(f->e);
	int port = gf_engine_probe_port(f->e);
	enum { N = 45 };
	int fds[N];
	for (int i = 0; i < N; i++) {
		fds[i] = slow_client("127.0.0.1", port);
		assert_true(fds[i] >= 0);
	}
	char body[16384];
	assert_int_equal(http_get(port, "/ready", body, sizeof(body)), 200);
	assert_non_null(strstr(body, "active"));
	assert_int_equal(http_get(port, "/live", NULL, 0), 200);
	assert_true(closed_by_server(fds[0]));
	for (int i = 0; i < N; i++)
		close(fds[i]);
}

/* Seventy slow connections from seventy addresses hold every slot: the
 * oldest are cut so /live still gets in, and the cuts are counted. */
static void test_probe_server_full_of_others(void **state)
{
	struct fixture *f = *state;
	int port = standby_with_probe_server(f);
	int fds[SLOW_CLIENTS];
	for (int i = 0; i < SLOW_CLIENTS; i++) {
		char src[32];
		snprintf(src, sizeof(src), "127.0.1.%d", i + 1);
		fds[i] = slow_client(src, port);
		assert_true(fds[i] >= 0);
	}
	char body[16384];
	assert_int_equal(http_get(port, "/live", body, sizeof(body)), 200);
	assert_non_null(strstr(body, "standby"));
	/* The oldest were evicted (no answer, closed), and it shows. */
	assert_true(closed_by_server(fds[0]));
	assert_int_equal(http_get(port, "/metrics", body, sizeof(body)), 200);
	unsigned long long evicted = 0;
	char *p = strstr(body, "gf_engine_probe_connections_cut_total{reason=\"evicted\"} ");
	assert_non_null(p);
	sscanf(strchr(p, ' ') + 1, "%llu", &evicted);
	assert_true(evicted >= SLOW_CLIENTS - 32);
	for (int i = 0; i < SLOW_CLIENTS; i++)
		close(fds[i]);
}

/* A client trickling one byte every 50 ms never goes idle; the request
 * deadline cuts it long before it could finish, and it shows in /state. */
static void test_probe_server_request_deadline(void **state)
{
	struct fixture *f = *state;
	int port = standby_with_probe_server(f);
	int fd = connect_from("127.0.0.3", port);
	assert_true(fd >= 0);
	static const char req[] = "GET /live HTTP/1.1\r\nHost: x\r\n";
	bool cut = false;
	/* 2,000 bytes of header at 50 ms each would take 100 s. */
	for (int i = 0; i < 2000 && !cut; i++) {
		char c = i < (int)sizeof(req) - 1 ? req[i] : 'a';
		if (i == (int)sizeof(req) - 1)
			c = 'X';
		cut = write(fd, &c, 1) != 1;
		if (!cut) {
			struct pollfd pfd = { .fd = fd, .events = POLLIN };
			cut = poll(&pfd, 1, 50) == 1;
		}
	}
	assert_true(cut);
	close(fd);
	char body[16384];
	assert_int_equal(http_get(port, "/state", body, sizeof(body)), 200);
	json_error_t je;
	json_t *o = json_loads(body, 0, &je);
	assert_non_null(o);
	assert_true(json_integer_value(json_object_get(json_object_get(o, "probe_connections_cut"), "deadline")) >=
		    1);
	json_decref(o);
}

/* ---- startup watchdog ---- */

struct init_call {
	gf_engine *e;
	int rc;
	pthread_t t;
};
static void *init_in_thread(void *arg)
{
	struct init_call *c = arg;
	c->rc = gf_engine_init_weights(c->e, NULL, NULL);
	return NULL;
}

/* A follower waits in Init for a commit that never comes: at its startup
 * deadline it is Dead, the loss policy runs with GF_ERR_TIMEOUT, and the
 * probes, /state and /metrics say why. */
static void test_startup_deadline(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_startup_deadline(e, 5000), 0);
	assert_int_equal(gf_engine_set_role(e, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_set_init_timeout(e, -1), 0);
	struct init_call c = { .e = e };
	assert_int_equal(pthread_create(&c.t, NULL, init_in_thread, &c), 0);
	usleep(100 * 1000);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_INIT);
	assert_int_equal(atomic_load(&loss.calls), 0);
	advance_ms(5000);
	EVENTUALLY(gf_engine_state(e) == GF_ENGINE_DEAD);
	EVENTUALLY(atomic_load(&loss.calls) == 1);
	assert_int_equal(loss.err, GF_ERR_TIMEOUT);
	assert_non_null(strstr(loss.detail, "startup deadline"));
	probes_are(e, 503, 503, 503);
	char *text, *js;
	assert_int_equal(gf_engine_metrics_text(e, &text), 0);
	assert_non_null(strstr(text, "gf_engine_dead_cause{cause=\"startup_deadline\"} 1\n"));
	assert_non_null(strstr(text, "gf_engine_startup_deadline_seconds 5.000000\n"));
	free(text);
	assert_int_equal(gf_engine_state_json(e, &js), 0);
	json_error_t je;
	json_t *o = json_loads(js, 0, &je);
	assert_non_null(o);
	assert_string_equal(json_string_value(json_object_get(o, "dead_cause")), "startup_deadline");
	assert_non_null(strstr(json_string_value(json_object_get(o, "dead_reason")), "5000 ms"));
	json_decref(o);
	free(js);
	/* The GMS going away ends the blocked init; the engine stays Dead. */
	for (int i = 0; i < ndev; i++)
		gt_stop(&f->gms[i]);
	pthread_join(c.t, NULL);
	assert_true(c.rc < 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_int_equal(gf_engine_sleep(e), GF_ERR_STATE);
	assert_int_equal(atomic_load(&loss.calls), 1);
}

/* An engine that reaches Standby in time is left alone after its deadline. */
static void test_startup_deadline_met(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_startup_deadline(e, 5000), 0);
	assert_int_equal(gf_engine_set_startup_deadline(e, INT64_MAX), GF_ERR_INVALID_ARG);
	to_standby(e);
	advance_ms(10000);
	usleep(200 * 1000); /* ten times the watchdog's poll */
	assert_int_equal(gf_engine_state(e), GF_ENGINE_STANDBY);
	assert_int_equal(atomic_load(&loss.calls), 0);
	probes_are(e, 200, 200, 200);
}

/* ---- memory gate ---- */

#define NEED_BYTES (1u << 20) /* the fixture's private bytes */

static gf_engine *gate_engine;
static bool gate_seen_waiting;

/* Make every device short of memory for the wake (host: the MemAvailable
 * knob; cuda: the test driver's total just above what is used). */
static void close_gate(gf_engine *e)
{
	if (kind == GF_MEM_HOST) {
		tu_env_set("GF_MEM_HOST_AVAILABLE", "4096");
		return;
	}
	uint64_t most_used = 0;
	for (int i = 0; i < ndev; i++) {
		uint64_t free_b, total_b;
		assert_int_equal(gf_mem_info(gf_engine_mem(e, i), &free_b, &total_b), 0);
		if (total_b - free_b > most_used)
			most_used = total_b - free_b;
	}
	char v[32];
	snprintf(v, sizeof(v), "%llu", (unsigned long long)(most_used + NEED_BYTES / 2));
	tu_env_set("FAKECUDA_TOTAL_MEM", v);
}

static void open_gate(void)
{
	tu_env_set("GF_MEM_HOST_AVAILABLE", NULL);
	tu_env_set("FAKECUDA_TOTAL_MEM", NULL);
}

static void open_gate_after_three(int n)
{
	char *js;
	if (gf_engine_state_json(gate_engine, &js) == 0) {
		if (strstr(js, "\"memory_gate_waiting\":true"))
			gate_seen_waiting = true;
		free(js);
	}
	if (n == 3)
		open_gate();
}

static void test_memory_gate_opens(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	to_standby(e);
	close_gate(e);
	gate_engine = e;
	gate_seen_waiting = false;
	on_sleep = open_gate_after_three;
	/* Holding the lock it waits, still Standby, until the memory is there. */
	assert_int_equal(gf_engine_acquire(e, -1), 0);
	assert_int_equal(sleeps, 3);
	assert_true(gate_seen_waiting);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
	char *text;
	assert_int_equal(gf_engine_metrics_text(e, &text), 0);
	assert_non_null(strstr(text, "gf_engine_memory_gate_waiting 0\n"));
	assert_non_null(strstr(text, "gf_engine_memory_need_bytes 1048576\n"));
	char *p = strstr(text, "gf_engine_last_failover_seconds{phase=\"memory_gate\"} ");
	assert_non_null(p);
	assert_true(strtod(strchr(p, ' ') + 1, NULL) * 1000 >= (double)slept_ms);
	free(text);
	assert_int_equal(gf_engine_wake_up(e), 0);
	assert_int_equal(gf_engine_serve(e, NULL, NULL), 0);
}

static void test_memory_gate_stays_closed(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e; /* waking timeout 2 s */
	to_standby(e);
	close_gate(e);
	assert_int_equal(gf_engine_acquire(e, -1), GF_ERR_OUT_OF_MEMORY);
	open_gate();
	assert_non_null(strstr(gf_error_detail(), "memory gate"));
	assert_non_null(strstr(gf_error_detail(), "waking timeout"));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_true(slept_ms > 0 && slept_ms <= 2000);
	assert_int_equal(mapped_count(e), 0);
	assert_int_equal(private_count(e), 0); /* nothing was allocated */
	assert_int_equal(gf_engine_probe(e, GF_PROBE_LIVE), 503);
	char *js;
	assert_int_equal(gf_engine_state_json(e, &js), 0);
	assert_non_null(strstr(js, "\"dead_cause\":\"memory_gate\""));
	free(js);
	/* A need of 0 turns the gate off: a second engine wakes on the same
	 * short machine once this one has gone (and released the lock). */
	gf_engine_free(e);
	f->e = new_engine(f);
	assert_int_equal(gf_engine_set_memory_need(f->e, 0), 0);
	to_standby(f->e);
	close_gate(f->e);
	assert_int_equal(gf_engine_acquire(f->e, -1), 0);
	open_gate();
	assert_int_equal(gf_engine_state(f->e), GF_ENGINE_WAKING);
}

/* A knob that is not a byte count is a clear error, not a guess. */
static void test_memory_gate_bad_knob(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	to_standby(e);
	tu_env_set("GF_MEM_HOST_AVAILABLE", "12x");
	int rc = gf_engine_acquire(e, -1);
	tu_env_set("GF_MEM_HOST_AVAILABLE", NULL);
	assert_int_equal(rc, GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "GF_MEM_HOST_AVAILABLE"));
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	assert_int_equal(gf_engine_probe(e, GF_PROBE_LIVE), 503);
}

/* A sticky driver error at run time (the test driver's FAKECUDA_LOSE_CONTEXT
 * file): the next probe finds it, the engine is Dead with cause
 * device_lost and the loss policy runs, in Active (the holder must let the
 * standby take over) and in Standby (it can never wake). */
static void lose_context_and_probe(gf_engine *e, int probe)
{
	char *dir = tu_tmpdir(), path[512];
	snprintf(path, sizeof(path), "%s/lost", dir);
	setenv("FAKECUDA_LOSE_CONTEXT", path, 1);
	probes_are(e, 200, 200, 200); /* no file yet: nothing is lost */
	assert_int_equal(atomic_load(&loss.calls), 0);
	FILE *fp = fopen(path, "w");
	assert_non_null(fp);
	fclose(fp);
	assert_int_equal(gf_engine_probe(e, probe), 503);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_DEAD);
	EVENTUALLY(atomic_load(&loss.calls) == 1); /* the policy runs on a thread of its own */
	assert_int_equal(loss.err, GF_ERR_DRIVER);
	assert_non_null(strstr(loss.detail, "lost"));
	probes_are(e, 503, 503, 503);
	char *js;
	assert_int_equal(gf_engine_state_json(e, &js), 0);
	assert_non_null(strstr(js, "\"dead_cause\":\"device_lost\""));
	assert_non_null(strstr(js, "\"device_lost\":true"));
	free(js);
	unsetenv("FAKECUDA_LOSE_CONTEXT");
	unlink(path);
	rmdir(dir);
	free(dir);
}

/* A lost context is lost for the whole process: in one process for all
 * tests (GF_TEST_NOFORK, the valgrind run) it would fail every later one, so
 * these run only in the forked suite. */
static bool nofork_skip(void)
{
	const char *v = getenv("GF_TEST_NOFORK");
	return v && *v && strcmp(v, "0") != 0;
}

static void test_device_lost_active(void **state)
{
	struct fixture *f = *state;
	if (nofork_skip())
		skip();
	to_active(f->e);
	f->context_lost = true;
	lose_context_and_probe(f->e, GF_PROBE_LIVE);
}

static void test_device_lost_standby(void **state)
{
	struct fixture *f = *state;
	if (nofork_skip())
		skip();
	to_standby(f->e);
	f->context_lost = true;
	lose_context_and_probe(f->e, GF_PROBE_READY);
}

/* ---- rank engines (issue 37: every rank fenced) ---- */

/* A rank engine of f->e's engine: no lock, woken with rank 0's epoch. */
static gf_engine *new_rank_engine(struct fixture *f, int rank)
{
	gf_engine *r;
	assert_int_equal(gf_engine_new(&r), 0);
	gf_engine_set_clock(r, &test_clock);
	assert_int_equal(gf_engine_set_backend(r, kind), 0);
	assert_int_equal(gf_engine_set_rank(r, "eng-a", rank), 0);
	for (int i = 0; i < ndev; i++)
		assert_int_equal(gf_engine_add_gms(r, f->gms[i].uri), 0);
	assert_int_equal(gf_engine_set_role(r, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_set_private_bytes(r, 1 << 20), 0);
	assert_int_equal(gf_engine_set_waking_timeout(r, 2000), 0);
	assert_int_equal(gf_engine_set_remap_timeout(r, 2000), 0);
	assert_int_equal(gf_engine_set_init_timeout(r, 2000), 0);
	assert_int_equal(gf_engine_set_loss_fn(r, record_loss, NULL), 0);
	return r;
}

/* A rank engine runs rank 0's states and guards without a lock: woken with
 * its holder's epoch, its private region backed at the address reserved at
 * Init (with the OOM retry on the test driver), its GMS watched once Active. */
static void test_rank_engine(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	/* Configuration: a rank has no lock, rank 0 no rank. */
	gf_engine *bad;
	assert_int_equal(gf_engine_new(&bad), 0);
	assert_int_equal(gf_engine_set_rank(bad, "eng-a", 0), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_rank(bad, "eng-a", GF_ENGINE_MAX_RANK + 1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_rank(bad, "bad id", 1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_rank(bad, "eng-a", 1), 0);
	assert_int_equal(gf_engine_set_lock(bad, f->lock_uri, "eng-a"), GF_ERR_STATE);
	gf_engine_free(bad);
	assert_int_equal(gf_engine_set_rank(e, "eng-a", 1), GF_ERR_STATE); /* e has a lock */

	gf_engine *r = new_rank_engine(f, 1);
	to_standby(e); /* rank 0 loads and commits */
	assert_int_equal(gf_engine_wake_as_rank(r, 5), GF_ERR_STATE); /* Init */
	assert_int_equal(gf_engine_init_weights(r, NULL, NULL), 0);
	uint64_t addr_init, addr_wake;
	assert_int_equal(gf_engine_private_memory(r, 0, &addr_init, NULL), 0);
	assert_int_equal(gf_engine_sleep(r), 0);
	assert_int_equal(gf_engine_acquire(r, 0), GF_ERR_STATE);
	assert_non_null(strstr(gf_error_detail(), "wake_as_rank"));
	assert_int_equal(gf_engine_add_holder_pid(r, (int)getpid()), GF_ERR_STATE);
	assert_int_equal(gf_engine_wake_as_rank(r, 0), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_wake_as_rank(e, 5), GF_ERR_STATE); /* rank 0 acquires */
	assert_int_equal(gf_engine_state(r), GF_ENGINE_STANDBY);

	assert_int_equal(gf_engine_acquire(e, -1), 0);
	uint64_t epoch = gf_engine_epoch(e);
	assert_int_equal(gf_engine_wake_as_rank(r, epoch), 0);
	assert_int_equal(gf_engine_state(r), GF_ENGINE_WAKING);
	assert_int_equal(gf_engine_wake_as_rank(r, epoch), GF_ERR_STATE); /* once */
	if (kind == GF_MEM_CUDA) {
		/* The device is full until the third backoff sleep frees it. */
		tu_env_set("FAKECUDA_OOM_AFTER_BYTES", "0");
		on_sleep = end_oom_after_three;
	}
	assert_int_equal(gf_engine_wake_up(r), 0);
	assert_int_equal(gf_engine_serve(r, NULL, NULL), 0);
	assert_int_equal(gf_engine_state(r), GF_ENGINE_ACTIVE);
	struct gf_engine_metrics m;
	gf_engine_metrics(r, &m);
	assert_int_equal(m.epoch, epoch);
	assert_int_equal(m.failovers, 1);
	if (kind == GF_MEM_CUDA)
		assert_int_equal(m.private_alloc_retries, 3);
	assert_int_equal(gf_engine_private_memory(r, 0, &addr_wake, NULL), 0);
	assert_int_equal(addr_wake, addr_init);
	assert_int_equal(private_count(r), ndev);
	assert_int_equal(mapped_count(r), ndev);
	char *js;
	assert_int_equal(gf_engine_state_json(r, &js), 0);
	assert_non_null(strstr(js, "\"rank\":1"));
	assert_non_null(strstr(js, "\"id\":\"eng-a\""));
	free(js);
	assert_int_equal(gf_engine_metrics_text(r, &js), 0);
	assert_non_null(strstr(js, "\ngf_engine_rank 1\n"));
	free(js);
	/* No lock: no listener, no step-down, never "may accept" from one. */
	int fd;
	assert_int_equal(gf_engine_listener(r, "http", &fd), GF_ERR_STATE);
	assert_int_equal(gf_engine_step_down(r), GF_ERR_STATE);
	/* Its GMS goes: the loss policy runs for the rank (and for rank 0, same GMS). */
	gt_stop(&f->gms[ndev - 1]);
	EVENTUALLY(gf_engine_state(r) == GF_ENGINE_DEAD);
	EVENTUALLY(atomic_load(&loss.calls) >= 1);
	assert_int_equal(loss.err, GF_ERR_GMS_LOST);
	gf_engine_free(r);
	gms_start(f, ndev - 1); /* teardown stops it */
}

/* A rank's memory gate: closed until the waking timeout, the rank is Dead. */
static void test_rank_memory_gate(void **state)
{
	struct fixture *f = *state;
	gf_engine *r = new_rank_engine(f, 2);
	to_standby(f->e);
	assert_int_equal(gf_engine_init_weights(r, NULL, NULL), 0);
	assert_int_equal(gf_engine_sleep(r), 0);
	close_gate(r);
	assert_int_equal(gf_engine_wake_as_rank(r, 7), GF_ERR_OUT_OF_MEMORY);
	open_gate();
	assert_non_null(strstr(gf_error_detail(), "memory gate"));
	assert_int_equal(gf_engine_state(r), GF_ENGINE_DEAD);
	assert_true(slept_ms > 0 && slept_ms <= 2000);
	assert_int_equal(private_count(r), 0);
	gf_engine_free(r);
}

/* A rank engine on the GMS of device 1 only, with its first device 1: its
 * memory backend and private region are on device 1 (a tensor-parallel
 * rank N on GPU N). The host backend has only device 0: the ordinal fails
 * init_weights there. */
static void test_first_device(void **state)
{
	struct fixture *f = *state;
	gf_engine *r;
	assert_int_equal(gf_engine_new(&r), 0);
	assert_int_equal(gf_engine_set_first_device(r, -1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_first_device(r, GF_ENGINE_MAX_FIRST_DEVICE + 1), GF_ERR_INVALID_ARG);
	gf_engine_set_clock(r, &test_clock);
	assert_int_equal(gf_engine_set_backend(r, kind), 0);
	assert_int_equal(gf_engine_set_rank(r, "eng-a", 1), 0);
	assert_int_equal(gf_engine_add_gms(r, f->gms[ndev - 1].uri), 0);
	assert_int_equal(gf_engine_set_role(r, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_set_private_bytes(r, 1 << 20), 0);
	assert_int_equal(gf_engine_set_init_timeout(r, 2000), 0);
	assert_int_equal(gf_engine_set_first_device(r, 1), 0);
	to_standby(f->e);
	if (kind != GF_MEM_CUDA) {
		assert_int_equal(gf_engine_init_weights(r, NULL, NULL), GF_ERR_NOT_FOUND);
		gf_engine_free(r);
		return;
	}
	assert_int_equal(gf_engine_init_weights(r, NULL, NULL), 0);
	assert_int_equal(gf_engine_set_first_device(r, 0), GF_ERR_STATE);
	assert_int_equal(gf_engine_device_count(r), 1);
	assert_int_equal(gf_mem_device(gf_engine_mem(r, 0)), 1);
	uint64_t addr = 0;
	assert_int_equal(gf_engine_private_memory(r, 0, &addr, NULL), 0);
	assert_true(addr != 0);
	gf_engine_free(r);
}

/* Rank 0 registers its ranks' pids: kept until the lock client exists,
 * then registered with the lock (its status counts them). */
static void test_add_holder_pid(void **state)
{
	struct fixture *f = *state;
	gf_engine *e = f->e;
	assert_int_equal(gf_engine_add_holder_pid(NULL, 1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_add_holder_pid(e, 0), GF_ERR_INVALID_ARG);
	int probe = (int)syscall(SYS_pidfd_open, getpid(), 0);
	if (probe < 0 && errno == ENOSYS) {
		/* No pidfd_open here (valgrind 3.19 does not know the call; an old
		 * kernel): nothing below can be checked. The plain and sanitizer
		 * builds run it. */
		print_message("# skipped: pidfd_open is not available here\n");
		return;
	}
	if (probe >= 0)
		close(probe);
	pid_t dead = fork();
	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);
	assert_int_equal(gf_engine_add_holder_pid(e, dead), GF_ERR_NOT_FOUND);
	pid_t kid = fork();
	if (kid == 0) {
		pause();
		_exit(0);
	}
	assert_int_equal(gf_engine_add_holder_pid(e, kid), 0);
	assert_int_equal(gf_engine_add_holder_pid(e, kid), 0); /* again: nothing new */
	to_waking(e);
	char *js;
	assert_int_equal(gf_lock_status_json(f->lock_uri, NULL, 0, 5000, &js), 0);
	assert_non_null(strstr(js, "\"holder_pids\":1"));
	free(js);
	assert_int_equal(gf_engine_state_json(e, &js), 0);
	assert_non_null(strstr(js, "\"holder_pids\":1"));
	free(js);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	/* A tcp:// lock cannot wait for processes: said at the call. */
	gf_engine *t;
	assert_int_equal(gf_engine_new(&t), 0);
	assert_int_equal(gf_engine_set_lock(t, "tcp://127.0.0.1:1", "eng-t"), 0);
	assert_int_equal(gf_engine_add_holder_pid(t, (int)getpid()), GF_ERR_NOT_SUPPORTED);
	gf_engine_free(t);
}

/* A free TCP port on the loopback (closed again: the server binds it next). */
static int free_tcp_port(void)
{
	int port = tu_free_port();
	assert_true(port > 0);
	return port;
}

/* A follower of the fixture's GMS in Standby on the lock @uri, with
 * @secret (NULL: none). */
static gf_engine *tcp_follower(struct fixture *f, const char *uri, const char *id, const char *secret)
{
	gf_engine *e = new_engine(f);
	assert_int_equal(gf_engine_set_lock(e, uri, id), 0);
	if (secret)
		assert_int_equal(gf_engine_set_lock_secret(e, secret, strlen(secret)), 0);
	assert_int_equal(gf_engine_set_role(e, GF_ENGINE_FOLLOWER), 0);
	assert_int_equal(gf_engine_init_weights(e, NULL, NULL), 0);
	assert_int_equal(gf_engine_sleep(e), 0);
	return e;
}

/* A tcp:// lock server requires its shared secret: an engine given it
 * (gf_engine_set_lock_secret(), the last one set counts) is granted; one
 * with a wrong or no secret gets GF_ERR_PERMISSION from its acquire and
 * stays in Standby. */
static void test_lock_secret_over_tcp(void **state)
{
	struct fixture *f = *state;
	static const char secret[] = "engine-test-secret-0123456789";
	char uri[64], lock_state[400];
	snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%d", free_tcp_port());
	snprintf(lock_state, sizeof(lock_state), "%s/tcp-lock.state", f->dir);
	gf_lockd *d;
	pthread_t th;
	assert_int_equal(gf_lockd_new(&d), 0);
	assert_int_equal(gf_lockd_add_listen(d, uri), 0);
	assert_int_equal(gf_lockd_set_secret(d, secret, sizeof(secret) - 1), 0);
	assert_int_equal(gf_lockd_set_state_file(d, lock_state), 0);
	assert_int_equal(gf_lockd_set_exit_wait_timeout(d, 0), 0);
	assert_int_equal(gf_lockd_set_reconnect_window(d, 0), 0);
	assert_int_equal(gf_lockd_start(d), 0);
	assert_int_equal(pthread_create(&th, NULL, lockd_main, d), 0);

	gf_engine *e = f->e;
	assert_int_equal(gf_engine_set_lock_secret(NULL, secret, 1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_lock_secret(e, NULL, 1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_lock_secret(e, secret, 0), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_lock(e, uri, "eng-a"), 0);
	assert_int_equal(gf_engine_set_lock_secret(e, "wrong", 5), 0);
	assert_int_equal(gf_engine_set_lock_secret(e, secret, sizeof(secret) - 1), 0);
	to_standby(e);
	assert_int_equal(gf_engine_set_lock_secret(e, secret, sizeof(secret) - 1), GF_ERR_STATE);
	assert_int_equal(gf_engine_acquire(e, TU_MS(5000)), 0);
	assert_int_equal(gf_engine_state(e), GF_ENGINE_WAKING);
	assert_true(gf_engine_epoch(e) > 0);

	gf_engine *wrong = tcp_follower(f, uri, "eng-w", "not-the-secret");
	assert_int_equal(gf_engine_acquire(wrong, TU_MS(5000)), GF_ERR_PERMISSION);
	assert_int_equal(gf_engine_state(wrong), GF_ENGINE_STANDBY);
	gf_engine *none = tcp_follower(f, uri, "eng-n", NULL);
	assert_int_equal(gf_engine_acquire(none, TU_MS(5000)), GF_ERR_PERMISSION);
	assert_non_null(strstr(gf_error_detail(), "secret"));
	assert_int_equal(gf_engine_state(none), GF_ENGINE_STANDBY);
	/* The holder is the one the server has on record. */
	char *js;
	assert_int_equal(gf_lock_status_json(uri, secret, sizeof(secret) - 1, TU_MS(5000), &js), 0);
	assert_non_null(strstr(js, "\"eng-a\""));
	free(js);
	gf_engine_free(none);
	gf_engine_free(wrong);

	/* A rank engine holds no lock, so it takes no secret. */
	gf_engine *r;
	assert_int_equal(gf_engine_new(&r), 0);
	assert_int_equal(gf_engine_set_rank(r, "eng-a", 1), 0);
	assert_int_equal(gf_engine_set_lock_secret(r, secret, sizeof(secret) - 1), GF_ERR_STATE);
	gf_engine_free(r);

	gf_engine_free(e);
	f->e = NULL;
	gf_lockd_stop(d);
	pthread_join(th, NULL);
	gf_lockd_free(d);
	char p[420];
	snprintf(p, sizeof(p), "%s.lock", lock_state);
	unlink(p);
	unlink(lock_state);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
		kind = GF_MEM_CUDA;
		ndev = 2;
		setenv("FAKECUDA_DEVICES", "2", 1);
	} else if (argc > 1 && strcmp(argv[1], "host") != 0) {
		fprintf(stderr, "usage: %s host|cuda\n", argv[0]);
		return 2;
	}
	char *state_dir = NULL;
	if (kind == GF_MEM_CUDA && !getenv("FAKECUDA_STATE_DIR")) {
		state_dir = tu_tmpdir();
		setenv("FAKECUDA_STATE_DIR", state_dir, 1);
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_legal_path, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_lines_held_until_active, setup, teardown),
		cmocka_unit_test_setup_teardown(test_settle_deferred, setup, teardown),
		cmocka_unit_test_setup_teardown(test_next_sends_the_wake_early, setup, teardown),
		cmocka_unit_test_setup_teardown(test_illegal_transitions, setup, teardown),
		cmocka_unit_test(test_dead_from_every_state),
		cmocka_unit_test_setup_teardown(test_config_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_follower_imports, setup, teardown),
		cmocka_unit_test_setup_teardown(test_loader_must_commit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_follower_init_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_follower_waits_for_a_slow_loader, setup, teardown),
		cmocka_unit_test_setup_teardown(test_interrupt_ends_init_wait, setup, teardown),
		cmocka_unit_test_setup_teardown(test_private_address_from_init, setup, teardown),
		cmocka_unit_test_setup_teardown(test_init_connect_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pool_declaration, setup, teardown),
		cmocka_unit_test_setup_teardown(test_acquire_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_probe_table, setup, teardown),
		cmocka_unit_test(test_probe_decision_table),
		cmocka_unit_test_setup_teardown(test_waking_timeout_flips_live, setup, teardown),
		cmocka_unit_test_setup_teardown(test_waking_engine_holds_the_layout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_remap_failure_is_all_or_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_gms_gone_without_tier_fails_at_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_server_down_holds_on, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_gms_gone_with_tier_retries, setup, teardown),
		cmocka_unit_test_setup_teardown(test_serve_failure_is_dead, setup, teardown),
		cmocka_unit_test_setup_teardown(test_run_shadow, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_priority, setup, teardown),
		cmocka_unit_test_setup_teardown(test_run_shadow_probe_server_and_failure, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_loss_calls_hook, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_loss_stops_accepting, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gms_loss_calls_hook, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_loss_while_waking, setup, teardown),
		cmocka_unit_test(test_default_loss_policy),
		cmocka_unit_test_setup_teardown(test_metrics_text_and_json, setup, teardown),
		cmocka_unit_test_setup_teardown(test_probe_server_http, setup, teardown),
		cmocka_unit_test_setup_teardown(test_probe_server_slow_clients_one_address, setup, teardown),
		cmocka_unit_test_setup_teardown(test_probe_server_flood_from_the_probes_address, setup, teardown),
		cmocka_unit_test_setup_teardown(test_probe_server_full_of_others, setup, teardown),
		cmocka_unit_test_setup_teardown(test_probe_server_request_deadline, setup, teardown),
		cmocka_unit_test_setup_teardown(test_startup_deadline, setup, teardown),
		cmocka_unit_test_setup_teardown(test_startup_deadline_met, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memory_gate_opens, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memory_gate_stays_closed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rank_engine, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rank_memory_gate, setup, teardown),
		cmocka_unit_test_setup_teardown(test_first_device, setup, teardown),
		cmocka_unit_test_setup_teardown(test_add_holder_pid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_secret_over_tcp, setup, teardown),
		/* Host only. */
		cmocka_unit_test_setup_teardown(test_memory_gate_bad_knob, setup, teardown),
		/* The driver's fault knobs: cuda only, last (five). */
		cmocka_unit_test_setup_teardown(test_wake_private_failure_is_all_or_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_retries_oom, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wake_oom_until_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_device_lost_active, setup, teardown),
		cmocka_unit_test_setup_teardown(test_device_lost_standby, setup, teardown),
	};
	size_t n = sizeof(tests) / sizeof(tests[0]);
	int rc;
	if (kind == GF_MEM_CUDA) {
		/* All but the host-only test before the last five. */
		struct CMUnitTest cuda_tests[sizeof(tests) / sizeof(tests[0])];
		memcpy(cuda_tests, tests, sizeof(tests));
		memmove(&cuda_tests[n - 6], &cuda_tests[n - 5], 5 * sizeof(tests[0]));
		rc = tu_run_tests(cuda_tests, n - 1, NULL, NULL);
	} else {
		rc = tu_run_tests(tests, n - 5, NULL, NULL);
	}
	if (state_dir) {
		gt_rmtree(state_dir);
		free(state_dir);
	}
	return rc;
}
