/* SPDX-License-Identifier: Apache-2.0 */
/* The etcd lock backend without an etcd: URI parsing, lease validation,
 * unreachable members, interrupts (through the public gf_lock_* API). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "../common/testutil.h"

#include "common.h"
#include "gpufailover/lock.h"

/* A loopback port nobody listens on (bound, then closed). */
static int dead_port(void)
{
	int port = tu_free_port();
	assert_true(port > 0);
	return port;
}

static void *interrupt_later(void *arg)
{
	usleep(300000);
	gf_lock_interrupt(arg);
	return NULL;
}

static void test_uris(void **state)
{
	(void)state;
	const char *good[] = { "etcd://127.0.0.1:2379/gf/lock", "etcd://a:1,b:2,[::1]:3/p/n/", "etcd://h:2379/x?ttl=5",
			       "etcds://h:2379/x?cacert=/ca&cert=/c&key=/k" };
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		gf_lock *l = NULL;
		assert_int_equal(gf_lock_new(&l, good[i], "e1"), 0);
		assert_int_equal(gf_lock_is_held(l), 0);
		assert_int_equal(gf_lock_get_fd(l), -1);
		assert_int_equal(gf_lock_get_timeout_ms(l), -1);
		assert_int_equal(gf_lock_release(l), GF_ERR_STATE);
		gf_lock_free(l);
	}
	const char *bad[] = { "etcd://", "etcd:///x", "etcd://h/x", "etcd://h:99999/x", "etcd://h:0/x", "etcd://h:1",
			      "etcd://h:1/", "etcd://h:1/x?ttl=0", "etcd://h:1/x?ttl=abc", "etcd://h:1/x?what=1",
			      "etcd://h:1/x?user", "etcd://h:1/x?cacert=/ca", "etcds://h:1/x?cert=/c", "etcd://a:1,,b:2/x",
			      "etcd://h h:1/x", "etcd://h:1/x?password-file=/nonexistent/pw", "etcd://h%:1/x" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		gf_lock *l = NULL;
		assert_int_equal(gf_lock_new(&l, bad[i], "e1"), GF_ERR_INVALID_ARG);
		assert_null(l);
		assert_non_null(strstr(gf_error_detail(), "etcd"));
	}
}

static void test_lease_rules(void **state)
{
	(void)state;
	gf_lock *l;
	assert_int_equal(gf_lock_new(&l, "etcd://127.0.0.1:1/x?ttl=4", "e1"), 0);
	/* TTL 4 s: margin max(1 s, 500 ms), so T_fence may be at most 3 s. */
	assert_int_equal(gf_lock_set_lease(l, 500, 3000), 0);
	assert_int_equal(gf_lock_set_lease(l, 500, 3001), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "TTL"));
	assert_int_equal(gf_lock_set_secret(l, "pw", 2), 0);
	assert_int_equal(gf_lock_set_secret(l, "p\0w", 3), GF_ERR_INVALID_ARG);
	gf_lock_free(l);
}

static void test_unreachable(void **state)
{
	(void)state;
	char uri[200];
	snprintf(uri, sizeof(uri), "etcd://127.0.0.1:%d,127.0.0.1:%d/gf/x?ttl=2", dead_port(), dead_port());
	gf_lock *l;
	assert_int_equal(gf_lock_new(&l, uri, "e1"), 0);
	assert_int_equal(gf_lock_set_reconnect_timeout(l, 300), 0);
	struct gf_lock_grant g;
	int64_t t0 = gf_now_us();
	assert_int_equal(gf_lock_acquire(l, 10000, &g), GF_ERR_UNREACHABLE);
	assert_true(gf_now_us() - t0 < 8000000);
	assert_int_equal(gf_lock_is_held(l), 0);
	/* A deadline shorter than the reconnect time is a timeout. */
	assert_int_equal(gf_lock_set_reconnect_timeout(l, 60000), 0);
	assert_int_equal(gf_lock_acquire(l, 200, &g), GF_ERR_TIMEOUT);
	/* An interrupt sent before the acquire makes it return at once. */
	gf_lock_interrupt(l);
	assert_int_equal(gf_lock_acquire(l, 10000, &g), GF_ERR_INTERRUPTED);
	/* An interrupt while the members are being tried ends the acquire and
	 * is used up: the next acquire is not interrupted by it. */
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, interrupt_later, l), 0);
	t0 = gf_now_us();
	assert_int_equal(gf_lock_acquire(l, 20000, &g), GF_ERR_INTERRUPTED);
	assert_true(gf_now_us() - t0 < 10000000);
	pthread_join(th, NULL);
	assert_int_equal(gf_lock_acquire(l, 300, &g), GF_ERR_TIMEOUT);
	gf_lock_free(l);
	char *json = NULL;
	assert_int_equal(gf_lock_status_json(uri, NULL, 0, 300, &json), GF_ERR_UNREACHABLE);
	assert_null(json);
	assert_int_equal(gf_lock_ping(uri, NULL, 0, 300), GF_ERR_UNREACHABLE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_uris),
		cmocka_unit_test(test_lease_rules),
		cmocka_unit_test(test_unreachable),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
