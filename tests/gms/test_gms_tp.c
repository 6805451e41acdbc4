/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TP = 2 (docs/design.md, decision 5): two GMS (one per device; real gf-gmsd
 * processes when GF_GMSD is set, else in-process servers), two engines with
 * two workers each as threads of this process, with random sleeps. An engine's
 * workers meet at a barrier after connecting (vLLM's executor waits for
 * every worker's init_device() before load_model()), which is what makes
 * symmetric RW_OR_RO deadlock-prone.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common.h"
#include "gmstest.h"
#include "testutil.h"

#define MiB (1024u * 1024u)

static char *dir;
static const char *gmsd_bin; /* GF_GMSD: real gf-gmsd processes; unset: in-process servers */

static int srv_start(struct gt_server *s, const char *name)
{
	return gmsd_bin ? gt_start_proc(s, dir, name, gmsd_bin) : gt_start(s, dir, name, 0);
}

/* A barrier with a deadline: the executor's wait for all workers. */
struct tbarrier {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int arrived, need;
	bool broken;
};

static void tb_init(struct tbarrier *b, int need)
{
	pthread_mutex_init(&b->mu, NULL);
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&b->cv, &a);
	pthread_condattr_destroy(&a);
	b->arrived = 0;
	b->need = need;
	b->broken = false;
}

/* Returns 0 when everyone arrived, GF_ERR_TIMEOUT or GF_ERR_STATE (another worker failed). */
static int tb_wait(struct tbarrier *b, bool failed, int64_t timeout_ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (timeout_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&b->mu);
	if (failed)
		b->broken = true;
	else
		b->arrived++;
	pthread_cond_broadcast(&b->cv);
	int rc = 0;
	while (!b->broken && b->arrived < b->need)
		if (pthread_cond_timedwait(&b->cv, &b->mu, &ts) == ETIMEDOUT) {
			rc = GF_ERR_TIMEOUT;
			b->broken = true;
			pthread_cond_broadcast(&b->cv);
			break;
		}
	if (b->broken && rc == 0)
		rc = GF_ERR_STATE;
	pthread_mutex_unlock(&b->mu);
	return rc;
}

struct worker {
	const char *uri;
	int mode;
	int delay_us;          /* random sleep before connecting */
	int64_t connect_timeout_ms;
	struct tbarrier *barrier;
	/* results */
	int connect_rc, rc, granted;
	pthread_t th;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	gf_mem *mem;
	gf_gms *g = NULL;
	w->rc = gf_mem_open(&mem, GF_MEM_HOST, 0);
	if (w->rc < 0)
		return NULL;
	usleep((useconds_t)w->delay_us);
	w->connect_rc = gf_gms_connect(&g, w->uri, mem, w->mode, w->connect_timeout_ms, NULL);
	w->granted = w->connect_rc == 0 ? gf_gms_granted_mode(g) : 0;
	int rc = tb_wait(w->barrier, w->connect_rc < 0, 2 * w->connect_timeout_ms);
	if (w->connect_rc < 0)
		rc = w->connect_rc;
	if (rc == 0 && w->granted == GF_GMS_RW) {
		uint64_t id;
		struct gf_gms_alloc_info ai;
		usleep((useconds_t)(rand() % 2000));
		rc = gf_gms_allocate(g, MiB, "w", &id);
		if (rc == 0 && (rc = gf_gms_alloc_at(g, 0, &ai)) == 0) {
			memset((void *)(uintptr_t)ai.addr, 0x5a, ai.size);
			rc = gf_gms_commit(g, NULL);
		}
	} else if (rc == 0) {
		rc = gf_gms_map_all(g);
		struct gf_gms_alloc_info ai;
		if (rc == 0 && (rc = gf_gms_alloc_at(g, 0, &ai)) == 0 &&
		    ((const uint8_t *)(uintptr_t)ai.addr)[ai.size - 1] != 0x5a)
			rc = GF_ERR_STATE;
	}
	w->rc = rc;
	gf_gms_free(g);
	gf_mem_free(mem);
	return NULL;
}

static void run_workers(struct worker *w, size_t n)
{
	for (size_t i = 0; i < n; i++)
		assert_int_equal(pthread_create(&w[i].th, NULL, worker_main, &w[i]), 0);
	for (size_t i = 0; i < n; i++)
		pthread_join(w[i].th, NULL);
}

static char *status(const char *uri)
{
	char *j;
	int rc = gf_gms_status_json(uri, 2000, &j);
	if (rc < 0)
		fail_msg("status: %s", gf_error_detail());
	return j;
}

/* >= 100 randomized interleavings of a loader engine and a follower engine: never a deadlock. */
static void test_roles_no_deadlock(void **state)
{
	(void)state;
	srand((unsigned)time(NULL));
	for (int it = 0; it < 120; it++) {
		struct gt_server s[2];
		char name[32];
		for (int d = 0; d < 2; d++) {
			snprintf(name, sizeof(name), "r%d-d%d", it, d);
			assert_int_equal(srv_start(&s[d], name), 0);
		}
		struct tbarrier ba, bb;
		tb_init(&ba, 2);
		tb_init(&bb, 2);
		struct worker w[4];
		memset(w, 0, sizeof(w));
		for (int e = 0; e < 2; e++)
			for (int d = 0; d < 2; d++) {
				struct worker *x = &w[e * 2 + d];
				x->uri = s[d].uri;
				/* engine 0 loads, engine 1 follows; which one is "A" is random */
				bool loader = (e == (it & 1));
				x->mode = loader ? GF_GMS_RW_OR_RO : GF_GMS_RO;
				x->delay_us = rand() % 3000;
				x->connect_timeout_ms = 5000;
				x->barrier = e == 0 ? &ba : &bb;
			}
		int64_t t0 = gf_now_us();
		run_workers(w, 4);
		for (int i = 0; i < 4; i++)
			if (w[i].rc != 0)
				fail_msg("iteration %d worker %d (%s): %s", it, i,
					 w[i].mode == GF_GMS_RO ? "follower" : "loader", gf_error_name(w[i].rc));
		assert_true(gf_now_us() - t0 < 5000000);
		for (int d = 0; d < 2; d++) {
			char *j = status(s[d].uri);
			/* one copy per device, whoever loaded it */
			assert_non_null(strstr(j, "\"allocation_count\":1"));
			assert_non_null(strstr(j, "\"generation\":1"));
			free(j);
			gt_stop(&s[d]);
		}
	}
}

/*
 * The deadlock of Decision 5 with symmetric RW_OR_RO: A0 gets RW on device
 * 0, B1 gets RW on device 1, then A1 and B0 wait for RO behind them while
 * A0 and B1 wait at their engine's barrier. It must end by the connect
 * timeout, not hang. With roles the same interleaving completes.
 */
static void test_symmetric_deadlock_ends_by_timeout(void **state)
{
	(void)state;
	for (int roles = 0; roles < 2; roles++) {
		struct gt_server s[2];
		char name[32];
		for (int d = 0; d < 2; d++) {
			snprintf(name, sizeof(name), "sym%d-d%d", roles, d);
			assert_int_equal(srv_start(&s[d], name), 0);
		}
		struct tbarrier ba, bb;
		tb_init(&ba, 2);
		tb_init(&bb, 2);
		struct worker w[4];
		memset(w, 0, sizeof(w));
		/* order: A0 (dev0), B1 (dev1), then A1 (dev1) and B0 (dev0) */
		struct {
			int dev, engine, delay_us;
		} plan[4] = {{0, 0, 0}, {1, 1, 30000}, {1, 0, 80000}, {0, 1, 80000}};
		for (int i = 0; i < 4; i++) {
			w[i].uri = s[plan[i].dev].uri;
			w[i].mode = (!roles || plan[i].engine == 0) ? GF_GMS_RW_OR_RO : GF_GMS_RO;
			w[i].connect_timeout_ms = 500;
			w[i].barrier = plan[i].engine == 0 ? &ba : &bb;
			w[i].delay_us = plan[i].delay_us; /* grants take well under a millisecond */
		}
		int64_t t0 = gf_now_us();
		run_workers(w, 4);
		int64_t dt = gf_now_us() - t0;
		assert_true(dt < 5000000); /* hang guard: the timeout ended it */
		if (!roles) {
			assert_int_equal(w[0].granted, GF_GMS_RW);
			assert_int_equal(w[1].granted, GF_GMS_RW);
			int timeouts = 0;
			for (int i = 0; i < 4; i++)
				timeouts += w[i].connect_rc == GF_ERR_TIMEOUT;
			assert_true(timeouts >= 1);
			assert_true(dt >= 400000); /* it really waited for the timeout */
		} else {
			for (int i = 0; i < 4; i++)
				if (w[i].rc != 0)
					fail_msg("with roles, worker %d: %s", i, gf_error_name(w[i].rc));
		}
		for (int d = 0; d < 2; d++)
			gt_stop(&s[d]);
	}
}

/* Decision 5, steps 1-5, in-process: A crashes between device 0's commit and device 1's. */
/* A loader's rank connects RW_OR_RO on every device (GF_GMS_ROLE_LOADER), in device order. */
static int connect_loader(gf_gms **grp, const char *const *uris, gf_mem *const *mems)
{
	for (size_t i = 0; i < 2; i++) {
		int rc = gf_gms_connect(&grp[i], uris[i], mems[i], GF_GMS_RW_OR_RO, 1000, NULL);
		if (rc < 0) {
			while (i > 0)
				gf_gms_free(grp[--i]);
			return rc;
		}
	}
	return 0;
}

static void test_partial_commit(void **state)
{
	(void)state;
	struct gt_server s[2];
	gf_mem *mem;
	assert_int_equal(gf_mem_open(&mem, GF_MEM_HOST, 0), 0);
	assert_int_equal(srv_start(&s[0], "pc-d0"), 0);
	assert_int_equal(srv_start(&s[1], "pc-d1"), 0);
	gf_gms *a0, *a1;
	const char *uris[2] = {s[0].uri, s[1].uri};
	gf_mem *mems[2] = {mem, mem};
	gf_gms *grp[2];
	assert_int_equal(connect_loader(grp, uris, mems), 0);
	a0 = grp[0];
	a1 = grp[1];
	uint64_t id;
	struct gf_gms_alloc_info ai;
	assert_int_equal(gf_gms_allocate(a0, MiB, "w", &id), 0);
	assert_int_equal(gf_gms_alloc_at(a0, 0, &ai), 0);
	memset((void *)(uintptr_t)ai.addr, 0x5a, ai.size);
	assert_int_equal(gf_gms_commit(a0, NULL), 0);
	assert_int_equal(gf_gms_allocate(a1, MiB, "w", &id), 0);
	/* B (follower) workers wait for RO on each device */
	struct tbarrier bb;
	tb_init(&bb, 2);
	struct worker b[2];
	memset(b, 0, sizeof(b));
	for (int d = 0; d < 2; d++) {
		b[d].uri = s[d].uri;
		b[d].mode = GF_GMS_RO;
		b[d].connect_timeout_ms = 10000;
		b[d].barrier = &bb;
	}
	/* The barrier of B needs both; B1's RO waits across A's crash and restart. */
	for (int d = 0; d < 2; d++)
		assert_int_equal(pthread_create(&b[d].th, NULL, worker_main, &b[d]), 0);
	usleep(100000);
	/* 1. A crashes: device 0 stays COMMITTED, device 1 aborts */
	gf_gms_free(a0);
	gf_gms_free(a1);
	usleep(100000);
	char *j = status(s[0].uri);
	assert_non_null(strstr(j, "\"allocation_count\":1"));
	free(j);
	j = status(s[1].uri);
	assert_non_null(strstr(j, "event=rw_abort"));
	assert_non_null(strstr(j, "\"waiters\":1")); /* 2. B1 keeps waiting */
	free(j);
	/* 3. A restarts: RO on device 0, RW on device 1 */
	assert_int_equal(connect_loader(grp, uris, mems), 0);
	assert_int_equal(gf_gms_granted_mode(grp[0]), GF_GMS_RO);
	assert_int_equal(gf_gms_granted_mode(grp[1]), GF_GMS_RW);
	assert_int_equal(gf_gms_map_all(grp[0]), 0);
	/* the follower's reader checks 0x5a: write it on device 1 only (device 0 keeps A's first bytes) */
	assert_int_equal(gf_gms_allocate(grp[1], MiB, "w", &id), 0);
	assert_int_equal(gf_gms_alloc_at(grp[1], 0, &ai), 0);
	memset((void *)(uintptr_t)ai.addr, 0x5a, ai.size);
	/* 4. commit device 1: B1 is granted */
	assert_int_equal(gf_gms_commit(grp[1], NULL), 0);
	pthread_join(b[1].th, NULL);
	pthread_join(b[0].th, NULL);
	/* 5. B finished init without restarting; device 0 was never reloaded */
	assert_int_equal(b[1].connect_rc, 0);
	assert_int_equal(b[0].connect_rc, 0);
	assert_int_equal(b[1].rc, 0);
	j = status(s[0].uri);
	assert_non_null(strstr(j, "\"generation\":1"));
	free(j);
	gf_gms_free(grp[0]);
	gf_gms_free(grp[1]);
	gt_stop(&s[0]);
	gt_stop(&s[1]);
	gf_mem_free(mem);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	dir = tu_tmpdir();
	gmsd_bin = getenv("GF_GMSD");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roles_no_deadlock),
		cmocka_unit_test(test_symmetric_deadlock_ends_by_timeout),
		cmocka_unit_test(test_partial_commit),
	};
	int rc = tu_run_group_tests(tests, NULL, NULL);
	gt_rmtree(dir);
	free(dir);
	return rc;
}
