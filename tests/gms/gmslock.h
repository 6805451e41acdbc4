/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A GMS fenced by a lock, both in-process (the fixture of the fence and KV
 * pool tests): a lock server on a thread (tests/lock/locktest.h, without a
 * state file), or a mute one that listens and never answers, and a
 * host-backend GMS set to it, in a private directory. A cmocka program:
 * include <cmocka.h> first.
 */
#ifndef GF_GMSLOCK_H
#define GF_GMSLOCK_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../lock/locktest.h"
#include "gmstest.h"
#include "testutil.h"

struct world {
	char *dir;
	char lock_uri[300];
	struct lt_server lock; /* lock.dir empty: none (a mute one instead) */
	int mute_fd;           /* a lock "server" that accepts connections and never answers (-1: none) */
	struct gt_server gms;
	gf_mem *mem;
};

static inline struct world *gl_new(void)
{
	struct world *w = calloc(1, sizeof(*w));
	assert_non_null(w);
	w->dir = tu_tmpdir();
	assert_non_null(w->dir);
	w->mute_fd = -1;
	return w;
}

/* The GMS, fenced by @w->lock_uri (settings fixed once started), and a gf_mem for its clients. */
static inline void gl_start_gms(struct world *w)
{
	snprintf(w->gms.uri, sizeof(w->gms.uri), "unix://%s/gms.sock", w->dir);
	assert_int_equal(gf_gmsd_new(&w->gms.d), 0);
	assert_int_equal(gf_gmsd_add_listen(w->gms.d, w->gms.uri), 0);
	assert_int_equal(gf_gmsd_set_backend(w->gms.d, GF_MEM_HOST), 0);
	assert_int_equal(gf_gmsd_set_lock(w->gms.d, w->lock_uri, NULL, 0), 0);
	assert_int_equal(gf_gmsd_start(w->gms.d), 0);
	assert_int_equal(gf_gmsd_set_lock(w->gms.d, w->lock_uri, NULL, 0), GF_ERR_STATE);
	assert_int_equal(pthread_create(&w->gms.th, NULL, gt_run, &w->gms), 0);
	assert_int_equal(gf_mem_open(&w->mem, GF_MEM_HOST, 0), 0);
}

/* A lock server (its own reconnect window, exit wait off) and the GMS fenced by it. */
static inline struct world *gl_start(void)
{
	struct world *w = gl_new();
	lt_start(&w->lock, &(struct lt_config){ .stateless = true, .window_ms = LT_WINDOW_DEFAULT });
	snprintf(w->lock_uri, sizeof(w->lock_uri), "%s", w->lock.uri);
	gl_start_gms(w);
	return w;
}

/* A lock server that listens and never answers: its backlog takes the connection, the handshake hangs. */
static inline struct world *gl_start_mute(void)
{
	struct world *w = gl_new();
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s/mute.sock", w->dir);
	snprintf(w->lock_uri, sizeof(w->lock_uri), "unix://%s", a.sun_path);
	w->mute_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(w->mute_fd >= 0);
	assert_int_equal(bind(w->mute_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(w->mute_fd, 8), 0);
	gl_start_gms(w);
	return w;
}

static inline void gl_free(struct world *w)
{
	gt_stop(&w->gms);
	if (w->lock.dir[0])
		lt_stop(&w->lock);
	if (w->mute_fd >= 0)
		close(w->mute_fd);
	gf_mem_free(w->mem);
	gt_rmtree(w->dir);
	free(w->dir);
	free(w);
}

#endif
