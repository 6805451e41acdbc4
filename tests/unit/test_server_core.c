/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The server core's contract with a component (lib/wire/server.h), checked
 * with a toy component: at most GF_SRV_MSGS_PER_ROUND messages from one peer
 * per round and the rest in later rounds (read ahead or not), on_close before settle and never inside it, the socket of a
 * closed peer still open during settle and gone after it, per-peer data
 * zeroed and kept until the end of the round.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "../common/testutil.h"
#include "server.h"

struct toy {
	struct gf_srv *srv;
	int round;              /* on_timer runs once per round */
	int msgs_this_round, max_per_round;
	atomic_int msgs, closes; /* polled by the test thread */
	int settles_after_close;
	int closed_sock;        /* the socket fd of the last closed peer, as seen in on_close */
	bool in_settle, close_inside_settle;
	bool sock_open_in_settle, data_was_zero;
	atomic_bool done;
};

struct toy_peer {
	int sock;
	int seen;
};

static void on_ready(void *ctx, struct gf_srv_peer *p)
{
	struct toy *t = ctx;
	struct toy_peer *tp = p->data;
	t->data_was_zero = tp->sock == 0 && tp->seen == 0;
	tp->sock = p->fd;
}

static void on_message(void *ctx, struct gf_srv_peer *p, gf_Msg *m, int *fds, size_t nfds)
{
	struct toy *t = ctx;
	(void)m;
	gf_close_fds(fds, nfds);
	free(fds);
	((struct toy_peer *)p->data)->seen++;
	t->msgs++;
	if (++t->msgs_this_round > t->max_per_round)
		t->max_per_round = t->msgs_this_round;
}

static void on_close(void *ctx, struct gf_srv_peer *p, const char *why)
{
	struct toy *t = ctx;
	(void)why;
	t->closes++;
	t->close_inside_settle |= t->in_settle;
	t->closed_sock = ((struct toy_peer *)p->data)->sock;
}

static void on_timer(void *ctx, int64_t now)
{
	struct toy *t = ctx;
	(void)now;
	t->round++;
	t->msgs_this_round = 0;
}

static void settle(void *ctx)
{
	struct toy *t = ctx;
	t->in_settle = true;
	if (t->closes > t->settles_after_close) {
		t->settles_after_close = t->closes;
		t->sock_open_in_settle = fcntl(t->closed_sock, F_GETFD) >= 0;
	}
	t->in_settle = false;
}

static void *run(void *arg)
{
	struct toy *t = arg;
	gf_srv_run(t->srv);
	atomic_store(&t->done, true);
	return NULL;
}

static void test_contract(void **state)
{
	(void)state;
	static const struct gf_srv_handlers h = {
		.on_ready = on_ready, .on_message = on_message, .on_close = on_close,
		.on_timer = on_timer, .settle = settle,
	};
	const struct gf_srv_config cfg = {
		.name = "toy", .component = gf_Component_COMPONENT_LOCK, .max_body = 1024,
		.peer_data_size = sizeof(struct toy_peer),
	};
	struct toy t = { 0 };
	assert_int_equal(gf_srv_new(&t.srv, &cfg, &h, &t), 0);
	char *dir = tu_tmpdir(), uri[300];
	snprintf(uri, sizeof(uri), "unix://%s/toy.sock", dir);
	assert_int_equal(gf_srv_add_listen(t.srv, uri, true), 0);
	assert_int_equal(gf_srv_add_listen(t.srv, "tcp://127.0.0.1:1", true), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_srv_start(t.srv), 0);
	assert_int_equal(gf_srv_add_allow_uid(t.srv, 1), GF_ERR_STATE);

	struct gf_uri u;
	int fd;
	assert_int_equal(gf_uri_parse(uri, &u), 0);
	assert_int_equal(gf_uri_connect(&u, gf_deadline_from_ms(TU_MS(2000)), &fd), 0);
	/* The whole flood is queued before the server's first look at the socket. */
	gf_Msg *m = gf_msg_new();
	m->which_body = gf_Msg_hello_tag;
	m->body.hello.version = GF_PROTOCOL_VERSION;
	m->body.hello.component = gf_Component_COMPONENT_LOCK;
	snprintf(m->body.hello.peer_id, sizeof(m->body.hello.peer_id), "toy");
	assert_int_equal(gf_msg_send(fd, m, NULL, 0, gf_deadline_from_ms(TU_MS(2000))), 0);
	for (int i = 0; i < 100; i++) {
		memset(m, 0, sizeof(*m));
		m->which_body = gf_Msg_heartbeat_tag;
		assert_int_equal(gf_msg_send(fd, m, NULL, 0, gf_deadline_from_ms(TU_MS(2000))), 0);
	}
	gf_msg_free(m);
	pthread_t th;
	pthread_create(&th, NULL, run, &t);
	for (int i = 0; i < 500 && t.msgs < 100; i++)
		usleep(10000);
	/* All of them before the close: what the server read ahead beyond a
	 * round's budget does not wait for the socket to become readable. */
	int before_close = atomic_load(&t.msgs);
	close(fd);
	for (int i = 0; i < 500 && t.closes < 1; i++)
		usleep(10000);
	gf_srv_stop(t.srv);
	pthread_join(th, NULL);
	assert_true(atomic_load(&t.done));

	assert_int_equal(before_close, 100);
	assert_int_equal(t.msgs, 100);
	assert_true(t.data_was_zero);
	assert_true(t.max_per_round <= GF_SRV_MSGS_PER_ROUND);
	assert_true(t.round >= 100 / GF_SRV_MSGS_PER_ROUND);
	assert_int_equal(t.closes, 1);
	assert_int_equal(t.settles_after_close, 1);
	assert_false(t.close_inside_settle);
	assert_true(t.sock_open_in_settle);          /* torn down only after settle */
	assert_true(fcntl(t.closed_sock, F_GETFD) < 0); /* and then gone */
	struct gf_srv_stats st;
	gf_srv_stats(t.srv, &st);
	assert_int_equal(st.connections, 0);
	assert_true(st.fd_limit > 0);
	assert_int_equal(gf_srv_process(t.srv, 0), 1); /* stopped stays stopped */
	gf_srv_free(t.srv);
	rmdir(dir);
	free(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_contract),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
