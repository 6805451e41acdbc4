/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock's off-loop handles: the typed holder query and the revoke, each
 * polled on its fd, against an in-process server. A revoke's handle answers
 * the revoke's result, and a refused revoke (a stale epoch) changes nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "locktest.h"

/* Wait (bounded, generously: the machine may be busy) for @fd to turn readable. */
static void wait_readable(int fd)
{
	assert_true(fd >= 0);
	struct pollfd p = { .fd = fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 30000), 1);
}

/*
 * A freed handle's eventfd closes when its worker thread lets go, just after
 * signalling it: wait (bounded) until the process is back to @n fds.
 */
static void settle_fds(int n)
{
	for (int i = 0; i < 3000 && tu_count_fds() != n; i++)
		usleep(10000);
	assert_int_equal(tu_count_fds(), n);
}

static struct gf_lock_holder query(const char *uri)
{
	gf_lock_query *q;
	assert_int_equal(gf_lock_query_start(&q, uri, NULL, 0, NULL, 5000), 0);
	wait_readable(gf_lock_query_get_fd(q));
	struct gf_lock_holder h;
	assert_int_equal(gf_lock_query_result(q, &h), 0);
	gf_lock_query_free(q);
	return h;
}

static int revoke_epoch(const char *uri, uint64_t epoch)
{
	gf_lock_revoke_op *r;
	assert_int_equal(gf_lock_revoke_start(&r, uri, NULL, 0, epoch, 5000), 0);
	wait_readable(gf_lock_revoke_get_fd(r));
	int rc = gf_lock_revoke_result(r);
	gf_lock_revoke_free(r);
	return rc;
}

static void test_query_then_revoke(void **state)
{
	(void)state;
	int fds = tu_count_fds();
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = LT_WINDOW_DEFAULT });
	gf_lock *l;
	assert_int_equal(gf_lock_new(&l, sv.uri, "holder-a"), 0);
	struct gf_lock_grant g;
	assert_int_equal(gf_lock_acquire(l, 5000, &g), 0);

	struct gf_lock_holder h = query(sv.uri);
	assert_string_equal(h.id, "holder-a");
	assert_int_equal(h.epoch, g.epoch);
	assert_int_equal(h.pid, (uint32_t)getpid());

	/* A stale epoch names no current grant: refused, the holder stays. */
	assert_int_equal(revoke_epoch(sv.uri, g.epoch + 1), GF_ERR_STATE);
	h = query(sv.uri);
	assert_int_equal(h.epoch, g.epoch);

	assert_int_equal(revoke_epoch(sv.uri, g.epoch), 0);
	h = query(sv.uri);
	assert_int_equal(h.epoch, 0);
	assert_string_equal(h.id, "");
	gf_lock_free(l);
	lt_stop(&sv);
	settle_fds(fds);
}

static void test_revoke_handle_args(void **state)
{
	(void)state;
	int fds = tu_count_fds();
	gf_lock_revoke_op *r = NULL;
	assert_int_equal(gf_lock_revoke_start(&r, "unix:///nonexistent/lock.sock", NULL, 0, 0, 1000), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "epoch 0"));
	assert_int_equal(gf_lock_revoke_start(NULL, "unix:///nonexistent/lock.sock", NULL, 0, 1, 1000),
			 GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lock_revoke_start(&r, "unix:///nonexistent/lock.sock", NULL, 0, 1, -1), GF_ERR_INVALID_ARG);
	assert_null(r);
	assert_int_equal(gf_lock_revoke_get_fd(NULL), -1);
	assert_int_equal(gf_lock_revoke_result(NULL), GF_ERR_INVALID_ARG);
	gf_lock_revoke_free(NULL);

	/* No server: the start succeeds, the result carries the failure. */
	assert_int_equal(gf_lock_revoke_start(&r, "unix:///nonexistent/lock.sock", NULL, 0, 1, 1000), 0);
	wait_readable(gf_lock_revoke_get_fd(r));
	int rc = gf_lock_revoke_result(r);
	assert_true(rc < 0 && rc != GF_ERR_AGAIN);
	gf_lock_revoke_free(r);
	settle_fds(fds);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_query_then_revoke),
		cmocka_unit_test(test_revoke_handle_args),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
