/* SPDX-License-Identifier: Apache-2.0 */
/* A GMS fenced by a lock (gf_gmsd_set_lock): the committed layout is dropped
 * only for the lock's current holder; stale, missing or revoked epochs are
 * refused and the weights stay. Real in-process lock server and GMS. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gmstest.h"
#include "testutil.h"

struct world {
	char *dir;
	char lock_uri[300];
	gf_lockd *lockd;
	pthread_t lock_th;
	struct gt_server gms;
	gf_mem *mem;
};

static void *run_lockd(void *arg)
{
	gf_lockd_run(arg);
	return NULL;
}

static int setup(void **state)
{
	struct world *w = calloc(1, sizeof(*w));
	w->dir = tu_tmpdir();
	snprintf(w->lock_uri, sizeof(w->lock_uri), "unix://%s/lock.sock", w->dir);
	assert_int_equal(gf_lockd_new(&w->lockd), 0);
	assert_int_equal(gf_lockd_add_listen(w->lockd, w->lock_uri), 0);
	assert_int_equal(gf_lockd_set_exit_wait_timeout(w->lockd, 0), 0);
	assert_int_equal(gf_lockd_start(w->lockd), 0);
	assert_int_equal(pthread_create(&w->lock_th, NULL, run_lockd, w->lockd), 0);

	snprintf(w->gms.uri, sizeof(w->gms.uri), "unix://%s/gms.sock", w->dir);
	assert_int_equal(gf_gmsd_new(&w->gms.d), 0);
	assert_int_equal(gf_gmsd_add_listen(w->gms.d, w->gms.uri), 0);
	assert_int_equal(gf_gmsd_set_backend(w->gms.d, GF_MEM_HOST), 0);
	assert_int_equal(gf_gmsd_set_lock(w->gms.d, w->lock_uri, NULL, 0), 0);
	assert_int_equal(gf_gmsd_start(w->gms.d), 0);
	assert_int_equal(gf_gmsd_set_lock(w->gms.d, w->lock_uri, NULL, 0), GF_ERR_STATE);
	assert_int_equal(pthread_create(&w->gms.th, NULL, gt_run, &w->gms), 0);
	assert_int_equal(gf_mem_open(&w->mem, GF_MEM_HOST, 0), 0);
	*state = w;
	return 0;
}

static int teardown(void **state)
{
	struct world *w = *state;
	gt_stop(&w->gms);
	if (w->lockd) {
		gf_lockd_stop(w->lockd);
		pthread_join(w->lock_th, NULL);
		gf_lockd_free(w->lockd);
	}
	gf_mem_free(w->mem);
	gt_rmtree(w->dir);
	free(w->dir);
	free(w);
	return 0;
}

/* Load and commit one allocation holding @byte as writer with @epoch; returns the connect's result. */
static int load(struct world *w, uint64_t epoch, uint8_t byte)
{
	gf_gms *g;
	int rc = gf_gms_connect_epoch(&g, w->gms.uri, w->mem, GF_GMS_RW, 2000, epoch);
	if (rc < 0)
		return rc;
	uint64_t id;
	assert_int_equal(gf_gms_allocate(g, 4096, "weights", &id), 0);
	struct gf_gms_alloc_info ai;
	assert_int_equal(gf_gms_alloc_at(g, 0, &ai), 0);
	memset((void *)(uintptr_t)ai.addr, byte, 4096);
	assert_int_equal(gf_gms_put_meta(g, "w", id, 0, "x", 1), 0);
	assert_int_equal(gf_gms_commit(g, NULL), 0);
	gf_gms_free(g);
	return 0;
}

/* The first byte of the committed weights, read by an RO client. */
static int first_byte(struct world *w)
{
	gf_gms *g;
	assert_int_equal(gf_gms_connect(&g, w->gms.uri, w->mem, GF_GMS_RO, 2000), 0);
	assert_int_equal(gf_gms_map_all(g), 0);
	struct gf_gms_alloc_info ai;
	assert_int_equal(gf_gms_alloc_at(g, 0, &ai), 0);
	int b = *(volatile uint8_t *)(uintptr_t)ai.addr;
	gf_gms_free(g);
	return b;
}

static int json_has(const char *uri, const char *needle)
{
	char *js;
	assert_int_equal(gf_gms_status_json(uri, 2000, &js), 0);
	int r = strstr(js, needle) != NULL;
	free(js);
	return r;
}

static void test_fence(void **state)
{
	struct world *w = *state;
	/* The first load needs no grant: nothing is committed yet. */
	assert_int_equal(load(w, 0, 0x11), 0);
	assert_int_equal(first_byte(w), 0x11);

	/* No holder at all: a drop is refused. */
	assert_int_equal(load(w, 0, 0x22), GF_ERR_PERMISSION);
	assert_non_null(strstr(gf_error_detail(), "only the lock's current holder"));

	gf_lock *a;
	struct gf_lock_grant ga;
	assert_int_equal(gf_lock_new(&a, w->lock_uri, "a"), 0);
	assert_int_equal(gf_lock_acquire(a, 2000, &ga), 0);
	/* A writer without the grant, or with a wrong one, cannot drop the weights. */
	assert_int_equal(load(w, 0, 0x22), GF_ERR_PERMISSION);
	assert_int_equal(load(w, ga.epoch + 1, 0x22), GF_ERR_PERMISSION);
	assert_int_equal(first_byte(w), 0x11);
	/* RW_OR_RO on a committed GMS becomes RO: never fenced. */
	gf_gms *ro;
	assert_int_equal(gf_gms_connect(&ro, w->gms.uri, w->mem, GF_GMS_RW_OR_RO, 2000), 0);
	assert_int_equal(gf_gms_granted_mode(ro), GF_GMS_RO);
	gf_gms_free(ro);

	/* The holder may reload. */
	assert_int_equal(load(w, ga.epoch, 0x33), 0);
	assert_int_equal(first_byte(w), 0x33);

	/* Revoked: its epoch no longer opens the fence; the new holder's does. */
	gf_lock *b;
	struct gf_lock_grant gb;
	assert_int_equal(gf_lock_new(&b, w->lock_uri, "b"), 0);
	assert_int_equal(gf_lock_revoke(w->lock_uri, NULL, 0, ga.epoch, 2000), 0);
	assert_int_equal(gf_lock_acquire(b, 2000, &gb), 0);
	assert_true(gb.epoch > ga.epoch);
	assert_int_equal(load(w, ga.epoch, 0x44), GF_ERR_PERMISSION);
	assert_int_equal(first_byte(w), 0x33);
	assert_int_equal(load(w, gb.epoch, 0x55), 0);
	assert_int_equal(first_byte(w), 0x55);

	assert_true(json_has(w->gms.uri, "\"fenced\":true"));
	assert_true(json_has(w->gms.uri, "\"fence_refusals\":4"));
	assert_true(json_has(w->gms.uri, "event=rw_refused"));
	gf_lock_free(a);
	gf_lock_free(b);
}

static void test_lock_server_gone(void **state)
{
	struct world *w = *state;
	assert_int_equal(load(w, 0, 0x11), 0);
	gf_lockd_stop(w->lockd);
	pthread_join(w->lock_th, NULL);
	gf_lockd_free(w->lockd);
	w->lockd = NULL;
	/* Unknown grant: refused, and the weights stay. */
	assert_int_equal(load(w, 7, 0x22), GF_ERR_UNREACHABLE);
	assert_int_equal(first_byte(w), 0x11);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_fence, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_server_gone, setup, teardown),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
