/* SPDX-License-Identifier: Apache-2.0 */
/* The standby pool in the lock server, driven in-process (exit wait off: every
 * peer is this process): declarations checked, evictions told with
 * GF_ERR_EVICTED (the newcomer included), status, readiness and metrics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "locktest.h"

#define G0 "GPU-0a1b2c3d-0000-4000-8000-00000000000a"
#define G1 "GPU-0a1b2c3d-0000-4000-8000-00000000000b"

struct srv {
	gf_lockd *d;
	pthread_t t;
	char dir[256], uri[300];
};

static void srv_start(struct srv *s, uint32_t budget)
{
	char *dir = tu_tmpdir();
	snprintf(s->dir, sizeof(s->dir), "%s", dir);
	free(dir);
	snprintf(s->uri, sizeof(s->uri), "unix://%s/lock.sock", s->dir);
	assert_int_equal(gf_lockd_new(&s->d), 0);
	assert_int_equal(gf_lockd_add_listen(s->d, s->uri), 0);
	assert_int_equal(gf_lockd_set_exit_wait_timeout(s->d, 0), 0);
	assert_int_equal(gf_lockd_set_max_standby_per_gpu(s->d, budget), 0);
	assert_int_equal(gf_lockd_set_min_standby_age(s->d, -1), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_set_min_standby_age(s->d, 0), 0);
	assert_int_equal(gf_lockd_start(s->d), 0);
	assert_int_equal(gf_lockd_set_max_standby_per_gpu(s->d, 5), GF_ERR_STATE);
	assert_int_equal(gf_lockd_set_min_standby_age(s->d, 10), GF_ERR_STATE);
	assert_int_equal(pthread_create(&s->t, NULL, lt_main, s->d), 0);
}

/* The loop stops; the state stays for in-process queries until free. */
static void srv_halt(struct srv *s)
{
	gf_lockd_stop(s->d);
	pthread_join(s->t, NULL);
}

static void srv_free(struct srv *s)
{
	gf_lockd_free(s->d);
	rmdir(s->dir);
}

/* Acquire as @id declaring @gpu (NULL: nothing), @pinned and @model. */
static void raw_acquire(struct lt_raw *r, const char *id, const char *gpu, bool pinned, const char *model)
{
	memset(&r->m, 0, sizeof(r->m));
	r->m.which_body = gf_Msg_lock_acquire_tag;
	gf_LockAcquire *a = &r->m.body.lock_acquire;
	snprintf(a->engine_id, sizeof(a->engine_id), "%s", id);
	a->timeout_ms = -1;
	if (gpu) {
		a->gpus_count = 1;
		snprintf(a->gpus[0], sizeof(a->gpus[0]), "%s", gpu);
	}
	a->pinned = pinned;
	a->wake_bytes = 1 << 20;
	snprintf(a->model, sizeof(a->model), "%s", model ? model : "");
	lt_raw_send(r);
}

static void expect_error(struct lt_raw *r, int code)
{
	assert_int_equal(lt_raw_next(r, 5000), gf_Msg_error_tag);
	assert_int_equal(r->m.body.error.code, code);
}

static void test_declarations_refused(void **s)
{
	(void)s;
	struct srv sv;
	srv_start(&sv, 1);
	struct lt_raw r;
	lt_raw_open(&r, sv.uri, "t");
	/* The server checks what a client did not. */
	raw_acquire(&r, "e", "GPU-nope", false, NULL);
	expect_error(&r, GF_ERR_INVALID_ARG);
	assert_non_null(strstr(r.m.body.error.detail, "not a UUID"));
	raw_acquire(&r, "e", G0, false, "two words");
	expect_error(&r, GF_ERR_INVALID_ARG);
	memset(&r.m, 0, sizeof(r.m));
	r.m.which_body = gf_Msg_lock_acquire_tag;
	strcpy(r.m.body.lock_acquire.engine_id, "e");
	r.m.body.lock_acquire.gpus_count = 2;
	strcpy(r.m.body.lock_acquire.gpus[0], G0);
	strcpy(r.m.body.lock_acquire.gpus[1], "GPU-0A1B2C3D-0000-4000-8000-00000000000A"); /* the same GPU */
	lt_raw_send(&r);
	expect_error(&r, GF_ERR_INVALID_ARG);
	/* Refused acquires leave nothing behind: this one is granted. */
	raw_acquire(&r, "e", G0, false, NULL);
	assert_int_equal(lt_raw_next(&r, TU_MS(5000)), gf_Msg_lock_granted_tag);
	lt_raw_close(&r);
	/* The client refuses before connecting. */
	gf_lock *l;
	assert_int_equal(gf_lock_new(&l, sv.uri, "c"), 0);
	const char *bad[] = { G0, "GPU-0a1b2c3d-0000-4000-8000-00000000000" };
	assert_int_equal(gf_lock_set_resources(l, bad, 2, 0, 0), GF_ERR_INVALID_ARG);
	const char *dup[] = { G0, G0 };
	assert_int_equal(gf_lock_set_resources(l, dup, 2, 0, 0), GF_ERR_INVALID_ARG);
	const char *nine[9] = { G0 };
	assert_int_equal(gf_lock_set_resources(l, nine, 9, 0, 0), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lock_set_model(l, "a=b"), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lock_set_model(l, NULL), 0);
	gf_lock_free(l);
	srv_halt(&sv);
	srv_free(&sv);
}

static void test_evictions_status_ready_metrics(void **s)
{
	(void)s;
	struct srv sv;
	srv_start(&sv, 1);
	struct lt_raw x, h, x2, y, p;
	/* x was Active once, then h holds. */
	lt_raw_open(&x, sv.uri, "t");
	raw_acquire(&x, "x", G0, false, NULL);
	assert_int_equal(lt_raw_next(&x, TU_MS(5000)), gf_Msg_lock_granted_tag);
	lt_raw_close(&x);
	lt_raw_open(&h, sv.uri, "t");
	raw_acquire(&h, "h", G0, false, "llama");
	assert_int_equal(lt_raw_next(&h, TU_MS(5000)), gf_Msg_lock_granted_tag);
	lt_raw_open(&x2, sv.uri, "t");
	raw_acquire(&x2, "x", G0, false, NULL);
	assert_int_equal(lt_raw_next(&x2, 200), 0);
	/* y, never Active, registers on a full GPU: y itself is the least recent. */
	lt_raw_open(&y, sv.uri, "t");
	raw_acquire(&y, "y", G0, false, NULL);
	expect_error(&y, GF_ERR_EVICTED);
	assert_non_null(strstr(y.m.body.error.detail, "evicted from the standby pool"));
	lt_raw_close(&y);
	/* A pinned newcomer: x is evicted, the pinned one stays over x. */
	lt_raw_open(&p, sv.uri, "t");
	raw_acquire(&p, "p", G0, true, NULL);
	expect_error(&x2, GF_ERR_EVICTED);
	lt_raw_close(&x2);
	assert_int_equal(lt_raw_next(&p, 200), 0);
	/* Through the client: z is evicted, its acquire says so. */
	gf_lock *z;
	assert_int_equal(gf_lock_new(&z, sv.uri, "z"), 0);
	const char *gz[] = { G0 };
	assert_int_equal(gf_lock_set_resources(z, gz, 1, 1 << 20, 0), 0);
	struct gf_lock_grant g;
	assert_int_equal(gf_lock_acquire(z, TU_MS(5000), &g), GF_ERR_EVICTED);
	assert_non_null(strstr(gf_error_detail(), "standby"));
	gf_lock_free(z);
	/* Another GPU has its own budget. */
	struct lt_raw o;
	lt_raw_open(&o, sv.uri, "t");
	raw_acquire(&o, "o", G1, false, NULL);
	assert_int_equal(lt_raw_next(&o, 200), 0);

	char *json;
	assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, TU_MS(2000), &json), 0);
	assert_non_null(strstr(json, "\"evicted\":3"));
	assert_non_null(strstr(json, "\"max_standby_per_gpu\":1"));
	assert_non_null(strstr(json, "\"uuid\":\"" G0 "\",\"standbys\":1"));
	assert_non_null(strstr(json, "\"uuid\":\"" G1 "\",\"standbys\":1"));
	assert_non_null(strstr(json, "\"model\":\"llama\""));
	free(json);
	const char *q0[] = { G0 }, *q01[] = { G0, G1 }, *qbad[] = { "GPU-" };
	json = NULL;
	assert_int_equal(gf_lock_ready_for(sv.uri, NULL, 0, q0, 1, "llama", TU_MS(2000), &json), 1);
	assert_non_null(strstr(json, "\"holder\":\"h\""));
	free(json);
	assert_int_equal(gf_lock_ready_for(sv.uri, NULL, 0, q01, 2, NULL, TU_MS(2000), NULL), 0);
	assert_int_equal(gf_lock_ready_for(sv.uri, NULL, 0, q0, 1, "qwen", TU_MS(2000), NULL), 0);
	assert_int_equal(gf_lock_ready_for(sv.uri, NULL, 0, qbad, 1, NULL, TU_MS(2000), NULL), GF_ERR_INVALID_ARG);

	srv_halt(&sv);
	char *text;
	assert_int_equal(gf_lockd_metrics(sv.d, &text), 0);
	assert_non_null(strstr(text, "gf_lock_pool_evicted_total 3\n"));
	assert_non_null(strstr(text, "gf_lock_pool_gpu_standbys{uuid=\"" G0 "\"} 1\n"));
	assert_non_null(strstr(text, "gf_lock_pool_gpu_active{uuid=\"" G0 "\"} 1\n"));
	assert_non_null(strstr(text, "gf_lock_pool_gpu_active{uuid=\"" G1 "\"} 0\n"));
	assert_non_null(strstr(text, "gf_lock_engine_pinned{id=\"p\",role=\"standby\"} 1\n"));
	assert_non_null(strstr(text, "gf_lock_engine_wake_bytes{id=\"o\",role=\"standby\"} 1048576\n"));
	free(text);
	assert_int_equal(gf_lockd_ready_json(sv.d, q0, 1, "llama", &json), 1);
	free(json);
	assert_int_equal(gf_lockd_ready_json(sv.d, qbad, 1, NULL, &json), GF_ERR_INVALID_ARG);
	lt_raw_close(&h);
	lt_raw_close(&p);
	lt_raw_close(&o);
	srv_free(&sv);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_declarations_refused),
		cmocka_unit_test(test_evictions_status_ready_metrics),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
