/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A lock server that is down longer than the client's reconnect time
 * (docs/design.md, decision 31), with an in-process gf-lockd:
 *  - unix://: the holder keeps its lock and its listener, the waiter its
 *    place; both reattach when the server returns (the holder with its
 *    epoch, its listener handed back), and nothing is refused meanwhile;
 *  - tcp://: the lease rules as before: the holder reports the loss at
 *    T_fence without its server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "common.h"
#include "locktest.h"

struct waiter {
	gf_lock *l;
	pthread_t t;
	atomic_int done;
	int rc;
	struct gf_lock_grant g;
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	w->rc = gf_lock_acquire(w->l, -1, &w->g);
	atomic_store(&w->done, 1);
	return NULL;
}

/* Whether a connection to the unix socket @path is accepted into a backlog (not refused). */
static bool connects(const char *path)
{
	int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path)) {
		close(c);
		return false;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	bool ok = connect(c, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(c);
	return ok;
}

static bool status_has(const struct lt_server *sv, const char *needle)
{
	char *json = NULL;
	bool ok = gf_lock_status_json(sv->uri, sv->cfg.tcp ? LT_SECRET : NULL, sv->cfg.tcp ? sizeof(LT_SECRET) - 1 : 0,
				      TU_MS(1000), &json) == 0 &&
		  strstr(json, needle);
	free(json);
	return ok;
}

#define EVENTUALLY(cond, ms)                                                          \
	do {                                                                          \
		int64_t end_ = gf_now_us() + TU_MS(ms) * 1000;                        \
		while (!(cond) && gf_now_us() < end_)                                 \
			usleep(10000);                                                \
		assert_true(cond);                                                    \
	} while (0)

/*
 * unix://: the server down for three times the reconnect time. The holder
 * still holds (same epoch, no loss reported, its unreachable time shown),
 * the waiter still waits, the holder's listener takes connections; when
 * the server returns the holder reclaims (listener handed back) and the
 * waiter queues again, and a release hands over to it.
 */
static void test_unix_outage_holds_on(void **st)
{
	(void)st;
	const int64_t R = TU_MS(300);
	struct lt_server sv;
	struct lt_lost lr = { 0 };
	struct gf_lock_grant g;
	lt_start(&sv, &(struct lt_config){ .window_ms = TU_MS(5000), .ux = true });
	gf_lock *a = lt_client(&sv, "a", R, &lr);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	assert_int_equal(gf_lock_start_watch(a), 0);
	assert_int_equal(gf_lock_unreachable_ms(a), 0);
	struct waiter w = { .l = lt_client(&sv, "b", R, NULL) };
	assert_int_equal(pthread_create(&w.t, NULL, waiter_main, &w), 0);
	EVENTUALLY(status_has(&sv, "\"id\":\"b\""), 2000);

	lt_halt(&sv);
	int64_t end = gf_now_us() + 3 * R * 1000;
	int refused = 0;
	while (gf_now_us() < end) {
		refused += !connects(sv.serve);
		usleep(20000);
	}
	EVENTUALLY(gf_lock_unreachable_ms(a) >= 3 * R, 1000);
	assert_true(gf_lock_is_held(a));
	assert_int_equal(gf_lock_epoch(a), g.epoch);
	assert_int_equal(atomic_load(&lr.calls), 0);
	assert_int_equal(atomic_load(&w.done), 0);
	assert_true(gf_lock_unreachable_ms(w.l) >= 3 * R);
	assert_int_equal(refused, 0);

	lt_run(&sv, TU_MS(5000));
	EVENTUALLY(status_has(&sv, "\"holder\":\"a\"") && gf_lock_unreachable_ms(a) == 0, 3000);
	EVENTUALLY(status_has(&sv, "\"id\":\"b\"") && gf_lock_unreachable_ms(w.l) == 0, 3000);
	assert_true(status_has(&sv, "\"listeners_pending\":0"));
	assert_true(connects(sv.serve));
	assert_true(gf_lock_is_held(a));
	assert_int_equal(gf_lock_epoch(a), g.epoch);
	assert_int_equal(atomic_load(&lr.calls), 0);
	assert_int_equal(atomic_load(&w.done), 0);

	assert_int_equal(gf_lock_release(a), 0);
	EVENTUALLY(atomic_load(&w.done) == 1, 3000);
	pthread_join(w.t, NULL);
	assert_int_equal(w.rc, 0);
	assert_true(w.g.epoch > g.epoch);
	gf_lock_free(w.l);
	gf_lock_free(a);
	lt_stop(&sv);
}

/*
 * unix://: a server that returns without the holder's grant on record
 * (here: no reconnect window) refuses the reclaim; the holder reports the
 * loss at once instead of holding on.
 */
static void test_unix_outage_refused_reclaim_is_a_loss(void **st)
{
	(void)st;
	struct lt_server sv;
	struct lt_lost lr = { 0 };
	struct gf_lock_grant g;
	lt_start(&sv, &(struct lt_config){ .window_ms = 0, .ux = true });
	gf_lock *a = lt_client(&sv, "a", TU_MS(200), &lr);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	assert_int_equal(gf_lock_start_watch(a), 0);
	lt_halt(&sv);
	usleep((useconds_t)TU_MS(600) * 1000); /* three reconnect times */
	assert_true(gf_lock_is_held(a));
	lt_run(&sv, 0);
	EVENTUALLY(atomic_load(&lr.calls) == 1, 3000);
	assert_int_equal(lr.err, GF_ERR_LOCK_LOST);
	assert_non_null(strstr(lr.detail, "reclaim refused"));
	assert_false(gf_lock_is_held(a));
	gf_lock_free(a);
	lt_stop(&sv);
}

/*
 * unix://: a server that is up (its socket listens) but does not take the
 * holder back is not "down": it may be granting others, so the reconnect
 * time ends the holder as before. Here a socket that listens and never
 * answers stands at the lock's path.
 */
static void test_unix_silent_server_ends_the_holder(void **st)
{
	(void)st;
	struct lt_server sv;
	struct lt_lost lr = { 0 };
	struct gf_lock_grant g;
	lt_start(&sv, &(struct lt_config){ .window_ms = TU_MS(5000), .ux = true });
	gf_lock *a = lt_client(&sv, "a", TU_MS(500), &lr);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	assert_int_equal(gf_lock_start_watch(a), 0);
	lt_halt(&sv);
	char path[400];
	snprintf(path, sizeof(path), "%s/lock.sock", sv.dir);
	unlink(path);
	int silent = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	assert_true(strlen(path) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	assert_int_equal(bind(silent, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(silent, 64), 0);
	EVENTUALLY(atomic_load(&lr.calls) == 1, 10000);
	assert_int_equal(lr.err, GF_ERR_LOCK_LOST);
	assert_non_null(strstr(lr.detail, "reconnect time"));
	assert_int_equal(gf_lock_unreachable_ms(a), 0);
	close(silent);
	unlink(path);
	gf_lock_free(a);
	lt_stop(&sv);
}

/*
 * unix://: the state file lost with the server. Nobody can prove the old
 * grant, so the holder's reclaim is refused (it reports the loss) and the
 * restarted server grants nobody for a quiet period (the length of its
 * reconnect window): the old holder has that long to end itself before the
 * waiter is granted.
 */
static void test_unix_state_file_lost_quiet_period(void **st)
{
	(void)st;
	const int64_t quiet = TU_MS(1500);
	struct lt_server sv;
	struct lt_lost lr = { 0 };
	struct gf_lock_grant g;
	lt_start(&sv, &(struct lt_config){ .window_ms = quiet, .ux = true });
	gf_lock *a = lt_client(&sv, "a", TU_MS(200), &lr);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	assert_int_equal(gf_lock_start_watch(a), 0);
	struct waiter w = { .l = lt_client(&sv, "b", TU_MS(200), NULL) };
	assert_int_equal(pthread_create(&w.t, NULL, waiter_main, &w), 0);
	EVENTUALLY(status_has(&sv, "\"id\":\"b\""), 2000);
	lt_halt(&sv);
	assert_int_equal(unlink(sv.state), 0);
	int64_t t0 = gf_now_us();
	lt_run(&sv, quiet);
	EVENTUALLY(atomic_load(&lr.calls) == 1, 3000);
	assert_int_equal(lr.err, GF_ERR_LOCK_LOST);
	assert_true(status_has(&sv, "\"reconnect_window\":true"));
	EVENTUALLY(atomic_load(&w.done) == 1, 5000);
	assert_true(gf_now_us() - t0 >= quiet * 1000);
	pthread_join(w.t, NULL);
	assert_int_equal(w.rc, 0);
	assert_true(w.g.epoch > g.epoch);
	gf_lock_free(w.l);
	gf_lock_free(a);
	lt_stop(&sv);
}

/*
 * tcp://: the lease rules. The server gone, the holder reports the loss
 * once T_fence passed without word from it, well before its (long)
 * reconnect time; a waiter gives up after its reconnect time.
 */
static void test_tcp_outage_lease_rules(void **st)
{
	(void)st;
	struct lt_server sv;
	struct lt_lost lr = { 0 };
	struct gf_lock_grant g;
	lt_start(&sv, &(struct lt_config){ .window_ms = TU_MS(5000), .tcp = true });
	gf_lock *a = lt_client(&sv, "a", 60000, &lr);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	assert_int_equal(gf_lock_start_watch(a), 0);
	int64_t fence = gf_lock_fence_ms(a);
	assert_true(fence > 0 && fence <= 600);
	struct waiter w = { .l = lt_client(&sv, "b", TU_MS(500), NULL) };
	assert_int_equal(pthread_create(&w.t, NULL, waiter_main, &w), 0);
	EVENTUALLY(status_has(&sv, "\"id\":\"b\""), 2000);
	int64_t t0 = gf_now_us();
	lt_halt(&sv);
	EVENTUALLY(atomic_load(&lr.calls) == 1, 5000);
	/* Far from the 60 s reconnect time: the lease, not the reconnect time, decided. */
	assert_true(gf_now_us() - t0 < 30 * 1000 * 1000);
	assert_int_equal(lr.err, GF_ERR_LOCK_LOST);
	assert_false(gf_lock_is_held(a));
	EVENTUALLY(atomic_load(&w.done) == 1, 10000);
	pthread_join(w.t, NULL);
	assert_int_equal(w.rc, GF_ERR_UNREACHABLE);
	gf_lock_free(w.l);
	gf_lock_free(a);
	lt_stop(&sv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unix_outage_holds_on),
		cmocka_unit_test(test_unix_outage_refused_reclaim_is_a_loss),
		cmocka_unit_test(test_unix_state_file_lost_quiet_period),
		cmocka_unit_test(test_unix_silent_server_ends_the_holder),
		cmocka_unit_test(test_tcp_outage_lease_rules),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
