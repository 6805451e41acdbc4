/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gf_gmsd_demote() and the demotion setters in process: the test thread
 * drives the server's loop (gf_gmsd_demote() belongs to that thread) while a
 * writer and a reader run on their own threads against its socket. argv[1]:
 * "host" or "cuda" (the cuda backend runs on tests/fakecuda via GF_LIBCUDA).
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "gpufailover.h"
#include "../common/testutil.h"

#define ALLOC (2u << 20) /* the cuda granularity */

static int kind = GF_MEM_HOST;

struct fixture {
	char dir[64], warm[128], uri[160];
	gf_gmsd *d;
};

struct client_job {
	const char *uri;
	bool writer;
	int seed;
	int rc;
	uint8_t hash[16];
	atomic_bool done;
};

static void *client_main(void *arg)
{
	struct client_job *j = arg;
	gf_mem *mem = NULL;
	gf_gms *g = NULL;
	int rc = gf_mem_open(&mem, kind, 0);
	if (rc == 0)
		rc = gf_gms_connect(&g, j->uri, mem, j->writer ? GF_GMS_RW : GF_GMS_RO, 20000, NULL);
	for (int i = 0; rc == 0 && j->writer && i < 2; i++) {
		uint64_t id;
		struct gf_gms_alloc_info ai;
		if ((rc = gf_gms_allocate(g, ALLOC, "w", &id)) == 0 && (rc = gf_gms_alloc_at(g, (size_t)i, &ai)) == 0)
			memset((void *)(uintptr_t)ai.addr, j->seed + i, ai.size);
		if (rc == 0)
			rc = gf_gms_put_meta(g, i ? "b" : "a", id, 0, "v", 1);
	}
	if (rc == 0)
		rc = j->writer ? gf_gms_commit(g, NULL) : gf_gms_map_all(g);
	for (size_t i = 0; rc == 0 && !j->writer && i < gf_gms_alloc_count(g); i++) {
		struct gf_gms_alloc_info ai;
		gf_gms_alloc_at(g, i, &ai);
		const uint8_t *p = (const uint8_t *)(uintptr_t)ai.addr;
		if (ai.size != ALLOC || p[0] != (uint8_t)(j->seed + (int)i) || p[ai.size - 1] != (uint8_t)(j->seed + (int)i))
			rc = GF_ERR_STALE_LAYOUT;
	}
	if (rc == 0)
		rc = gf_gms_layout(g, j->hash, NULL);
	gf_gms_free(g);
	gf_mem_free(mem);
	j->rc = rc;
	atomic_store(&j->done, true);
	return NULL;
}

static json_t *status(gf_gmsd *d)
{
	char *text = NULL;
	assert_int_equal(gf_gmsd_status_json(d, &text), 0);
	json_t *st = json_loads(text, 0, NULL);
	free(text);
	assert_non_null(st);
	return st;
}

static const char *str(json_t *st, const char *key)
{
	const char *s = json_string_value(json_object_get(st, key));
	return s ? s : "";
}

/* Drive the server until @j is done and the server has seen its connection
 * close (the client's thread may finish before the server reads the hang-up). */
static int run_client(gf_gmsd *d, struct client_job *j)
{
	pthread_t th;
	atomic_store(&j->done, false);
	if (pthread_create(&th, NULL, client_main, j))
		return GF_ERR_IO;
	for (bool gone = false; !gone;) {
		struct pollfd p = { .fd = gf_gmsd_get_fd(d), .events = POLLIN };
		poll(&p, 1, 10);
		gf_gmsd_process(d);
		if (atomic_load(&j->done)) {
			json_t *st = status(d);
			gone = !json_integer_value(json_object_get(st, "readers")) &&
			       !json_integer_value(json_object_get(st, "writer"));
			json_decref(st);
		}
	}
	pthread_join(th, NULL);
	return j->rc;
}

/* Drive the server until the status field @key is @want (a few seconds at most). */
static void pump_until(gf_gmsd *d, const char *key, const char *want)
{
	for (int i = 0; i < 6000; i++) {
		json_t *st = status(d);
		json_t *op = json_object_get(st, "operation");
		const char *v = !strcmp(key, "phase") ? (json_is_object(op) ? str(op, "phase") : "") : str(st, key);
		bool ok = !strcmp(v, want);
		json_decref(st);
		if (ok)
			return;
		struct pollfd p = { .fd = gf_gmsd_get_fd(d), .events = POLLIN };
		poll(&p, 1, 10);
		gf_gmsd_process(d);
	}
	fail_msg("%s never became %s", key, want);
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	snprintf(f->dir, sizeof(f->dir), "/tmp/gf-demote-XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	snprintf(f->warm, sizeof(f->warm), "%s/warm", f->dir);
	snprintf(f->uri, sizeof(f->uri), "unix://%s/g.sock", f->dir);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	gf_gmsd_free(f->d);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
	if (system(cmd) != 0)
		return -1;
	free(f);
	return 0;
}

static void start(struct fixture *f, int pinned)
{
	assert_int_equal(gf_gmsd_new(&f->d), 0);
	assert_int_equal(gf_gmsd_add_listen(f->d, f->uri), 0);
	assert_int_equal(gf_gmsd_set_backend(f->d, kind), 0);
	assert_int_equal(gf_gmsd_set_tiers(f->d, f->warm, NULL), 0);
	assert_int_equal(gf_gmsd_set_min_resident(f->d, -1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_gmsd_set_min_resident(f->d, 0), 0);
	assert_int_equal(gf_gmsd_set_pinned(f->d, pinned), 0);
	assert_int_equal(gf_gmsd_start(f->d), 0);
	/* Settings are fixed once started, like every other setter. */
	assert_int_equal(gf_gmsd_set_min_resident(f->d, 5), GF_ERR_STATE);
	assert_int_equal(gf_gmsd_set_pinned(f->d, 0), GF_ERR_STATE);
	assert_int_equal(gf_gmsd_set_demote_below_free(f->d, 1), GF_ERR_STATE);
}

static void test_demote_in_process(void **state)
{
	struct fixture *f = *state;
	start(f, 0);
	assert_int_equal(gf_gmsd_demote(f->d, GF_GMS_TIER_ANY), GF_ERR_STATE); /* nothing committed */
	struct client_job w = { .uri = f->uri, .writer = true, .seed = 0x41 };
	assert_int_equal(run_client(f->d, &w), 0);
	pump_until(f->d, "phase", "Checkpointed");
	/* The loop publishes Checkpointed as it ends the job and lets go of the
	 * layout: from then on the snapshot holds it no more (never RO here). */
	json_t *done = status(f->d);
	assert_string_equal(str(done, "state"), "COMMITTED");
	json_decref(done);
	assert_int_equal(gf_gmsd_demote(f->d, 7), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_gmsd_demote(f->d, GF_GMS_TIER_COLD), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "no COLD tier kept"));
	/* WARM already holds this layout (the commit's snapshot): dropped at once. */
	assert_int_equal(gf_gmsd_demote(f->d, GF_GMS_TIER_ANY), 0);
	json_t *st = status(f->d);
	assert_string_equal(str(st, "state"), "EMPTY");
	assert_string_equal(str(st, "resident_tier"), "warm");
	assert_int_equal(json_integer_value(json_object_get(st, "allocation_count")), 0);
	assert_string_equal(str(json_object_get(st, "last_demotion"), "reason"), "request");
	json_decref(st);
	char *m = NULL;
	assert_int_equal(gf_gmsd_metrics(f->d, &m), 0);
	assert_non_null(strstr(m, "gf_gms_resident_tier{tier=\"warm\"} 1\n"));
	free(m);
	/* The reader gets the same layout and bytes back. */
	struct client_job r = { .uri = f->uri, .seed = 0x41 };
	assert_int_equal(run_client(f->d, &r), 0);
	assert_memory_equal(r.hash, w.hash, 16);
	/* A tier without this layout gets it written first; the drop follows the snapshot. */
	char cmd[200];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", f->warm);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(gf_gmsd_demote(f->d, GF_GMS_TIER_WARM), 0);
	st = status(f->d);
	assert_string_equal(str(st, "resident_tier"), "hot");
	json_decref(st);
	assert_int_equal(gf_gmsd_demote(f->d, GF_GMS_TIER_WARM), GF_ERR_BUSY); /* one at a time */
	pump_until(f->d, "resident_tier", "warm");
	r.rc = -1;
	assert_int_equal(run_client(f->d, &r), 0);
	assert_memory_equal(r.hash, w.hash, 16);
}

static void test_pinned_in_process(void **state)
{
	struct fixture *f = *state;
	start(f, 1);
	struct client_job w = { .uri = f->uri, .writer = true, .seed = 0x51 };
	assert_int_equal(run_client(f->d, &w), 0);
	pump_until(f->d, "phase", "Checkpointed");
	pump_until(f->d, "state", "COMMITTED"); /* the loop ended the snapshot (see above) */
	assert_int_equal(gf_gmsd_demote(f->d, GF_GMS_TIER_ANY), GF_ERR_STATE);
	assert_non_null(strstr(gf_error_detail(), "pinned"));
	json_t *st = status(f->d);
	assert_string_equal(str(st, "state"), "COMMITTED");
	assert_true(json_is_true(json_object_get(st, "pinned")));
	json_decref(st);
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "cuda"))
		kind = GF_MEM_CUDA;
	else if (argc > 1 && strcmp(argv[1], "host")) {
		fprintf(stderr, "usage: %s host|cuda\n", argv[0]);
		return 2;
	}
	char state[] = "/tmp/gf-demote-fakecuda-XXXXXX";
	bool own_state = kind == GF_MEM_CUDA && !getenv("FAKECUDA_STATE_DIR");
	if (own_state && (!mkdtemp(state) || setenv("FAKECUDA_STATE_DIR", state, 1)))
		return 1;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_demote_in_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pinned_in_process, setup, teardown),
	};
	int rc = tu_run_group_tests(tests, NULL, NULL);
	if (own_state) {
		char cmd[128];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state);
		if (system(cmd) != 0)
			fprintf(stderr, "# could not remove %s\n", state);
	}
	return rc;
}
