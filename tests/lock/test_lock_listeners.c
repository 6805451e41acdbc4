/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Listeners carried by the lock: grants pass the server's listening sockets,
 * connections made while nobody holds the lock wait in the backlog for the
 * next holder, TCP locks refuse, and a server restart gets the sockets back
 * from the holder (or binds them again once the reconnect window ends).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "locktest.h"

/* A client connection to the served port; a refused one fails the test. */
static int dial(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

static int listener_fd(gf_lock *l, const char *name)
{
	const struct gf_lock_listener *ls;
	size_t n;
	assert_int_equal(gf_lock_listeners(l, &ls, &n), 0);
	for (size_t i = 0; i < n; i++)
		if (!strcmp(ls[i].name, name))
			return ls[i].fd;
	fail_msg("listener %s not in the grant", name);
	return -1;
}

/* Accept within 5 s on @lfd, write @tag on it; returns what the client @cfd reads. */
static char serve_one(int lfd, int cfd, char tag)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 5000), 1);
	int a = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	assert_true(a >= 0);
	assert_int_equal(write(a, &tag, 1), 1);
	close(a);
	char got = 0;
	assert_int_equal(read(cfd, &got, 1), 1);
	close(cfd);
	return got;
}

struct acq {
	gf_lock *l;
	int rc;
};

static void *acq_main(void *arg)
{
	struct acq *a = arg;
	a->rc = gf_lock_acquire(a->l, 10000, NULL);
	return NULL;
}

static void test_grant_carries_listeners(void **state)
{
	(void)state;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000, .http = true, .ux = true });
	/* Nobody holds the lock yet: the connection waits in the backlog. */
	int early = dial(sv.http_port);
	gf_lock *a, *b;
	assert_int_equal(gf_lock_new(&a, sv.uri, "eng-a"), 0);
	assert_int_equal(gf_lock_new(&b, sv.uri, "eng-b"), 0);
	const struct gf_lock_listener *ls;
	size_t n;
	assert_int_equal(gf_lock_listeners(a, &ls, &n), GF_ERR_STATE);
	assert_int_equal(gf_lock_acquire(a, 5000, NULL), 0);
	assert_int_equal(gf_lock_listeners(a, &ls, &n), 0);
	assert_int_equal(n, 2);
	assert_string_equal(ls[0].name, "http");
	assert_string_equal(ls[1].name, "ux");
	for (size_t i = 0; i < n; i++) {
		int v = 0;
		socklen_t len = sizeof(v);
		assert_int_equal(getsockopt(ls[i].fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len), 0);
		assert_int_equal(v, 1);
	}
	assert_int_equal(serve_one(listener_fd(a, "http"), early, 'a'), 'a');

	/* b waits; a releases; a connection made in the gap reaches b. */
	struct acq ab = { .l = b, .rc = 1 };
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, acq_main, &ab), 0);
	int a_http = dup(listener_fd(a, "http"));
	assert_int_equal(gf_lock_release(a), 0);
	int gap = dial(sv.http_port);
	pthread_join(t, NULL);
	assert_int_equal(ab.rc, 0);
	assert_int_equal(serve_one(listener_fd(b, "http"), gap, 'b'), 'b');
	/* The same socket as a's: the backlog is one, whoever holds it. */
	struct sockaddr_in x, y;
	socklen_t lx = sizeof(x), ly = sizeof(y);
	getsockname(a_http, (struct sockaddr *)&x, &lx);
	getsockname(listener_fd(b, "http"), (struct sockaddr *)&y, &ly);
	assert_int_equal(x.sin_port, y.sin_port);
	close(a_http);
	gf_lock_free(a);
	gf_lock_free(b);
	lt_stop(&sv);
}

static void test_tcp_lock_refuses_listeners(void **state)
{
	(void)state;
	gf_lock *l;
	assert_int_equal(gf_lock_new(&l, "tcp://127.0.0.1:9", "eng"), 0);
	const struct gf_lock_listener *ls;
	size_t n;
	assert_int_equal(gf_lock_listeners(l, &ls, &n), GF_ERR_NOT_SUPPORTED);
	assert_non_null(strstr(gf_error_detail(), "unix"));
	assert_int_equal(gf_lock_listeners(l, NULL, &n), GF_ERR_INVALID_ARG);
	gf_lock_free(l);
}

static void test_listener_config(void **state)
{
	(void)state;
	gf_lockd *d;
	assert_int_equal(gf_lockd_new(&d), 0);
	assert_int_equal(gf_lockd_add_listener(d, "", "tcp://127.0.0.1:1"), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_add_listener(d, "a:b", "tcp://127.0.0.1:1"), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_add_listener(d, "a b", "tcp://127.0.0.1:1"), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_add_listener(d, "http", "http://x"), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "http"));
	assert_int_equal(gf_lockd_add_listener(d, "http", NULL), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_add_listener(d, "http", "tcp://127.0.0.1:1"), 0);
	assert_int_equal(gf_lockd_add_listener(d, "http", "tcp://127.0.0.1:2"), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "twice"));
	for (int i = 1; i < 16; i++) {
		char name[16];
		snprintf(name, sizeof(name), "l%d", i);
		assert_int_equal(gf_lockd_add_listener(d, name, "tcp://127.0.0.1:3"), 0);
	}
	assert_int_equal(gf_lockd_add_listener(d, "one-more", "tcp://127.0.0.1:4"), GF_ERR_INVALID_ARG);
	gf_lockd_free(d);

	assert_int_equal(gf_lockd_new(&d), 0);
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	assert_int_equal(gf_lockd_add_listener_fd(d, "p", pfd[0]), GF_ERR_INVALID_ARG);
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* not listening */
	assert_int_equal(gf_lockd_add_listener_fd(d, "s", s), GF_ERR_INVALID_ARG);
	assert_int_equal(listen(s, 4), 0);
	assert_int_equal(gf_lockd_add_listener_fd(d, "s", s), 0); /* taken: gf_lockd_free closes it */
	close(pfd[0]);
	close(pfd[1]);
	gf_lockd_free(d);
	assert_int_equal(fcntl(s, F_GETFD), -1);
}

/* The holder keeps the sockets across a server restart and hands them back. */
static void test_restart_holder_hands_back(void **state)
{
	(void)state;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 5000, .http = true, .ux = true });
	gf_lock *a;
	assert_int_equal(gf_lock_new(&a, sv.uri, "eng-a"), 0);
	assert_int_equal(gf_lock_acquire(a, 5000, NULL), 0);
	int fd = listener_fd(a, "http");
	lt_halt(&sv);
	/* The holder's copy keeps listening: no refusal while the server is down. */
	assert_int_equal(serve_one(fd, dial(sv.http_port), 'x'), 'x');
	lt_run(&sv, 5000);
	/* gf_lockd_status_json() is not for another thread while the server runs:
	 * the status goes over the wire. */
	char *json;
	assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, 5000, &json), 0);
	assert_non_null(strstr(json, "\"listeners_pending\":2"));
	free(json);
	for (int i = 0; i < 500 && gf_lock_epoch(a) && gf_lock_is_held(a); i++) {
		gf_lock_process(a);
		assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, 5000, &json), 0);
		bool done = strstr(json, "\"listeners_pending\":0") != NULL;
		free(json);
		if (done)
			break;
		usleep(10000);
	}
	assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, 5000, &json), 0);
	assert_non_null(strstr(json, "\"listeners_pending\":0"));
	assert_non_null(strstr(json, "\"reconnect_window\":false"));
	free(json);
	assert_true(gf_lock_is_held(a));
	assert_int_equal(listener_fd(a, "http"), fd); /* kept: the engine's fd stays valid */

	/* The next holder gets the very socket the first one kept. */
	gf_lock *b;
	assert_int_equal(gf_lock_new(&b, sv.uri, "eng-b"), 0);
	assert_int_equal(gf_lock_release(a), 0);
	int gap = dial(sv.http_port);
	assert_int_equal(gf_lock_acquire(b, 5000, NULL), 0);
	assert_int_equal(serve_one(listener_fd(b, "http"), gap, 'b'), 'b');
	gf_lock_free(a);
	gf_lock_free(b);
	lt_stop(&sv);
}

/* A holder that never reclaims: after the window the server binds once the port is free. */
static void test_restart_without_reclaim_binds_after_window(void **state)
{
	(void)state;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 200, .http = true, .ux = true });
	gf_lock *a;
	assert_int_equal(gf_lock_new(&a, sv.uri, "eng-a"), 0);
	assert_int_equal(gf_lock_acquire(a, 5000, NULL), 0);
	lt_halt(&sv);
	lt_run(&sv, 200);
	usleep(400000); /* the window ends; a's copy still holds the port: still pending */
	char *json;
	assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, 5000, &json), 0);
	assert_null(strstr(json, "\"listeners_pending\":0"));
	free(json);
	gf_lock_free(a); /* its copies close: the port is free */
	bool open = false;
	for (int i = 0; i < 100 && !open; i++) {
		usleep(50000);
		assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, 5000, &json), 0);
		open = strstr(json, "\"listeners_pending\":0") != NULL;
		free(json);
	}
	assert_true(open);
	gf_lock *b;
	assert_int_equal(gf_lock_new(&b, sv.uri, "eng-b"), 0);
	int early = dial(sv.http_port);
	assert_int_equal(gf_lock_acquire(b, 5000, NULL), 0);
	assert_int_equal(serve_one(listener_fd(b, "http"), early, 'b'), 'b');
	gf_lock_free(b);
	lt_stop(&sv);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grant_carries_listeners),
		cmocka_unit_test(test_tcp_lock_refuses_listeners),
		cmocka_unit_test(test_listener_config),
		cmocka_unit_test(test_restart_holder_hands_back),
		cmocka_unit_test(test_restart_without_reclaim_binds_after_window),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
