/* SPDX-License-Identifier: Apache-2.0 */
/*
 * LockNext through the library's client: a waiter with a next hook is told
 * before its grant, with that grant's epoch and fence proof; a waiter whose
 * acquire began without a hook does not ask for LockNext, so the server
 * grants it without the extra message (a hook installed during its wait is
 * never called).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "locktest.h"

struct next_rec {
	atomic_int told;    /* calls with next 1 */
	atomic_int untold;  /* calls with next 0 */
	atomic_ullong epoch; /* the proof's epoch of the last call with next 1 (0: none) */
	atomic_int granted; /* set by the waiter thread once its acquire returned */
};

static void on_next(gf_lock *lock, int next, const struct gf_lock_proof *proof, void *ud)
{
	(void)lock;
	struct next_rec *r = ud;
	/* Told before the grant returns, never after. */
	assert_int_equal(atomic_load(&r->granted), 0);
	if (next) {
		atomic_fetch_add(&r->told, 1);
		atomic_store(&r->epoch, proof ? proof->epoch : 0);
	} else {
		atomic_fetch_add(&r->untold, 1);
	}
}

struct waiter {
	gf_lock *l;
	struct next_rec *rec;
	struct gf_lock_grant g;
	int rc;
	pthread_t t;
};

static void *wait_main(void *arg)
{
	struct waiter *w = arg;
	w->rc = gf_lock_acquire(w->l, TU_MS(10000), &w->g);
	atomic_store(&w->rec->granted, 1);
	return NULL;
}

/* Until the server has @n waiters queued. */
static void wait_queued(const char *uri, int n)
{
	char want[64];
	snprintf(want, sizeof(want), "\"waiter_count\":%d", n);
	int64_t end = gf_now_us() + TU_MS(5000) * 1000;
	for (;;) {
		char *json = NULL;
		int ok = gf_lock_status_json(uri, NULL, 0, TU_MS(1000), &json) == 0 && strstr(json, want);
		free(json);
		if (ok)
			return;
		assert_true(gf_now_us() < end);
		usleep(2000);
	}
}

static void test_next_only_with_a_hook(void **state)
{
	(void)state;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = LT_WINDOW_DEFAULT });
	gf_lock *a, *b, *c;
	struct gf_lock_grant ga;
	assert_int_equal(gf_lock_new(&a, sv.uri, "a"), 0);
	assert_int_equal(gf_lock_new(&b, sv.uri, "b"), 0);
	assert_int_equal(gf_lock_new(&c, sv.uri, "c"), 0);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &ga), 0);

	/* b waits with its hook installed; c starts waiting without one. */
	struct next_rec rb = { 0 }, rc = { 0 };
	gf_lock_set_next_fn(b, on_next, &rb);
	struct waiter wb = { .l = b, .rec = &rb }, wc = { .l = c, .rec = &rc };
	assert_int_equal(pthread_create(&wb.t, NULL, wait_main, &wb), 0);
	wait_queued(sv.uri, 1);
	assert_int_equal(pthread_create(&wc.t, NULL, wait_main, &wc), 0);
	wait_queued(sv.uri, 2);
	/* Installed while c waits: its acquire did not ask for LockNext. */
	gf_lock_set_next_fn(c, on_next, &rc);

	assert_int_equal(gf_lock_release(a), 0);
	pthread_join(wb.t, NULL);
	assert_int_equal(wb.rc, 0);
	assert_int_equal(atomic_load(&rb.told), 1);
	assert_int_equal(atomic_load(&rb.untold), 0);
	assert_true(wb.g.epoch > ga.epoch);
	assert_int_equal(atomic_load(&rb.epoch), wb.g.epoch);

	assert_int_equal(gf_lock_release(b), 0);
	pthread_join(wc.t, NULL);
	assert_int_equal(wc.rc, 0);
	assert_true(wc.g.epoch > wb.g.epoch);
	assert_int_equal(atomic_load(&rc.told), 0);
	assert_int_equal(atomic_load(&rc.untold), 0);
	assert_int_equal(gf_lock_release(c), 0);

	/* Its next acquire began with the hook: told this time. */
	atomic_store(&rc.granted, 0);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &ga), 0);
	assert_int_equal(pthread_create(&wc.t, NULL, wait_main, &wc), 0);
	wait_queued(sv.uri, 1);
	assert_int_equal(gf_lock_release(a), 0);
	pthread_join(wc.t, NULL);
	assert_int_equal(wc.rc, 0);
	assert_int_equal(atomic_load(&rc.told), 1);
	assert_int_equal(atomic_load(&rc.epoch), wc.g.epoch);

	gf_lock_free(a);
	gf_lock_free(b);
	gf_lock_free(c);
	lt_stop(&sv);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_next_only_with_a_hook),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
