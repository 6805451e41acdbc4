/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock tests' in-process server (a gf_lockd on a thread of the test),
 * library clients of it with a loss hook, and raw protocol clients. A
 * cmocka program: include <cmocka.h> first; failures are cmocka asserts.
 */
#ifndef GF_LOCKTEST_H
#define GF_LOCKTEST_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "lockint.h"
#include "testutil.h"
#include "wire.h"

/* The shared secret of a tcp:// server and its clients. */
static const char LT_SECRET[] = "lock-test-secret-0123456789abcdef";

/* lt_config.window_ms: leave the server's own reconnect window. */
#define LT_WINDOW_DEFAULT INT64_MIN

/* What lt_start() makes; all zero is a unix:// server without a window,
 * with a state file (none written beforehand) and no listeners. */
struct lt_config {
	const char *state_text; /* written to the state file before the start (NULL: no file) */
	bool stateless;         /* no state file at all: grants are not persisted */
	int64_t window_ms;      /* the reconnect window (LT_WINDOW_DEFAULT: the server's own) */
	bool tcp;               /* tcp://127.0.0.1 on a free port, LT_SECRET, lease 200/1200 ms */
	bool ux;                /* carries the listener "ux": unix://<dir>/serve.sock */
	bool http;              /* carries the listener "http": tcp://127.0.0.1 on a free port */
	int64_t exit_wait_ms;   /* 0 (off) in these tests: every peer is this very process */
};

struct lt_server {
	struct lt_config cfg;
	gf_lockd *d; /* NULL while halted */
	pthread_t t;
	char dir[256], uri[300], state[300], serve[300], ux[320], http[64];
	int port;      /* the lock's own, with cfg.tcp */
	int http_port; /* the "http" listener's, with cfg.http */
};

/* A TCP port on 127.0.0.1 that was free a moment ago. */
static inline int lt_free_port(void)
{
	int port = tu_free_port();
	assert_true(port > 0);
	return port;
}

static inline void *lt_main(void *arg)
{
	gf_lockd_run(arg);
	return NULL;
}

/* A new server on @s's addresses and state file with @s->cfg and the
 * reconnect window @window_ms (LT_WINDOW_DEFAULT: the server's own),
 * running on a thread: the first start, or a restart after lt_halt(). */
static inline void lt_run(struct lt_server *s, int64_t window_ms)
{
	assert_int_equal(gf_lockd_new(&s->d), 0);
	assert_int_equal(gf_lockd_add_listen(s->d, s->uri), 0);
	if (s->cfg.tcp) {
		assert_int_equal(gf_lockd_set_secret(s->d, LT_SECRET, sizeof(LT_SECRET) - 1), 0);
		assert_int_equal(gf_lockd_set_lease(s->d, 200, 1200), 0);
	}
	if (s->cfg.http)
		assert_int_equal(gf_lockd_add_listener(s->d, "http", s->http), 0);
	if (s->cfg.ux)
		assert_int_equal(gf_lockd_add_listener(s->d, "ux", s->ux), 0);
	if (!s->cfg.stateless)
		assert_int_equal(gf_lockd_set_state_file(s->d, s->state), 0);
	assert_int_equal(gf_lockd_set_exit_wait_timeout(s->d, s->cfg.exit_wait_ms), 0);
	if (window_ms != LT_WINDOW_DEFAULT)
		assert_int_equal(gf_lockd_set_reconnect_window(s->d, window_ms), 0);
	assert_int_equal(gf_lockd_start(s->d), 0);
	assert_int_equal(pthread_create(&s->t, NULL, lt_main, s->d), 0);
}

/* A server as @cfg says, in a directory of its own. */
static inline void lt_start(struct lt_server *s, const struct lt_config *cfg)
{
	char *dir = tu_tmpdir();
	assert_non_null(dir);
	memset(s, 0, sizeof(*s));
	s->cfg = *cfg;
	s->cfg.state_text = NULL; /* written once, here; a restart keeps what the server made of it */
	snprintf(s->dir, sizeof(s->dir), "%s", dir);
	free(dir);
	if (cfg->tcp) {
		s->port = lt_free_port();
		snprintf(s->uri, sizeof(s->uri), "tcp://127.0.0.1:%d", s->port);
	} else {
		snprintf(s->uri, sizeof(s->uri), "unix://%s/lock.sock", s->dir);
	}
	snprintf(s->state, sizeof(s->state), "%s/state.json", s->dir);
	snprintf(s->serve, sizeof(s->serve), "%s/serve.sock", s->dir);
	snprintf(s->ux, sizeof(s->ux), "unix://%s", s->serve);
	if (cfg->http) {
		s->http_port = lt_free_port();
		snprintf(s->http, sizeof(s->http), "tcp://127.0.0.1:%d", s->http_port);
	}
	if (cfg->state_text) {
		FILE *f = fopen(s->state, "w");
		assert_non_null(f);
		assert_true(fputs(cfg->state_text, f) >= 0);
		assert_int_equal(fclose(f), 0);
	}
	lt_run(s, cfg->window_ms);
}

/* Stop and free the server but keep its state file: a crash as its clients see it. */
static inline void lt_halt(struct lt_server *s)
{
	gf_lockd_stop(s->d);
	pthread_join(s->t, NULL);
	gf_lockd_free(s->d);
	s->d = NULL;
}

/* Stop the server if it runs and remove what it and lt_start() made. */
static inline void lt_stop(struct lt_server *s)
{
	static const char *const made[] = { "lock.sock", "serve.sock", "state.json", "state.json.tmp", "state.json.lock" };
	if (s->d)
		lt_halt(s);
	for (size_t i = 0; i < sizeof(made) / sizeof(made[0]); i++) {
		char p[400];
		snprintf(p, sizeof(p), "%s/%s", s->dir, made[i]);
		unlink(p);
	}
	rmdir(s->dir);
}

/* What a loss hook was told. */
struct lt_lost {
	atomic_int calls;
	int err;
	char detail[512];
};

static inline void lt_on_lost(gf_lock *l, int err, const char *detail, void *ud)
{
	struct lt_lost *r = ud;
	(void)l;
	r->err = err;
	snprintf(r->detail, sizeof(r->detail), "%s", detail);
	atomic_fetch_add(&r->calls, 1);
}

/* A library client @id of @s with the reconnect time @reconnect_ms (on tcp
 * also the secret and a lease of 200/600 ms), its loss hook recording into
 * @lost unless that is NULL. */
static inline gf_lock *lt_client(const struct lt_server *s, const char *id, int64_t reconnect_ms, struct lt_lost *lost)
{
	gf_lock *l;
	assert_int_equal(gf_lock_new(&l, s->uri, id), 0);
	assert_int_equal(gf_lock_set_reconnect_timeout(l, reconnect_ms), 0);
	if (s->cfg.tcp) {
		assert_int_equal(gf_lock_set_secret(l, LT_SECRET, sizeof(LT_SECRET) - 1), 0);
		assert_int_equal(gf_lock_set_lease(l, 200, 600), 0);
	}
	if (lost)
		gf_lock_set_lost_fn(l, lt_on_lost, lost);
	return l;
}

/* A protocol client of its own, the library's client bypassed. */
struct lt_raw {
	int fd;
	struct gf_frame_reader rd;
	gf_Msg m;
};

/* Connect to @uri and complete the handshake as @id. */
static inline void lt_raw_open(struct lt_raw *r, const char *uri, const char *id)
{
	struct gf_uri u;
	assert_int_equal(gf_uri_parse(uri, &u), 0);
	assert_int_equal(gf_uri_connect(&u, gf_deadline_from_ms(TU_MS(2000)), &r->fd), 0);
	gf_frame_reader_init(&r->rd, 0);
	assert_int_equal(gf_handshake_client(r->fd, &r->rd, gf_Component_COMPONENT_LOCK, id, NULL, 0,
					     gf_deadline_from_ms(TU_MS(2000)), NULL), 0);
}

/* Send @r->m. */
static inline void lt_raw_send(struct lt_raw *r)
{
	assert_int_equal(gf_msg_send(r->fd, &r->m, NULL, 0, gf_deadline_from_ms(TU_MS(1000))), 0);
}

/* The next message within @ms into @r->m: its tag, or 0 on timeout. */
static inline int lt_raw_next(struct lt_raw *r, int ms)
{
	int rc = gf_msg_recv(&r->rd, r->fd, &r->m, NULL, NULL, gf_deadline_from_ms(ms));
	if (rc == GF_ERR_TIMEOUT)
		return 0;
	assert_int_equal(rc, 0);
	return (int)r->m.which_body;
}

static inline void lt_raw_close(struct lt_raw *r)
{
	gf_close(r->fd);
	gf_frame_reader_clear(&r->rd);
}

#endif
