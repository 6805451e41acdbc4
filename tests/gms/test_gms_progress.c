/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Waiting by progress (gf_gms_connect() by progress, docs/gms.md "Waiting
 * for a loader"): a reader keeps waiting while a writer makes progress,
 * however long the load takes, and times out, saying which, once no writer
 * has been connected or the connected one has made no progress for its
 * timeout. In-process server, host backend.
 *
 * Timing: the tests only assert outcomes and error details. The writer's
 * steps are 50 ms apart against a 1 s timeout, so only a stall of the test
 * process near a second could break a wait that must go on.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cmocka.h>

#include "common.h"
#include "gms_internal.h"
#include "gmsfixture.h"
#include "testutil.h"

#define KiB 1024u
#define WAIT_MS 1000      /* the reader's timeout while a writer loads */
#define STEP_US 50000     /* the writer's pace */
#define LOAD_US 3000000   /* how long the slow writer loads: three times WAIT_MS */

/* Waiting by progress, without a cancel fd. */
static const struct gf_gms_connect_opts BY_PROGRESS = { .by_progress = 1 };

/* A reader connecting on a thread of its own. */
struct reader {
	bool by_progress;
	int64_t timeout_ms;
	int cancel_fd;
	int rc;
	char detail[512];
	gf_gms *g;
	atomic_bool done;
	pthread_t th;
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;
	const struct gf_gms_connect_opts o = { .by_progress = 1, .cancel_fd = r->cancel_fd };
	r->rc = gf_gms_connect(&r->g, srv.uri, mem, GF_GMS_RO, r->timeout_ms, r->by_progress ? &o : NULL);
	snprintf(r->detail, sizeof(r->detail), "%s", r->rc < 0 ? gf_error_detail() : "");
	atomic_store(&r->done, true);
	return NULL;
}

static void reader_start(struct reader *r, bool by_progress, int64_t timeout_ms)
{
	memset(r, 0, sizeof(*r));
	r->by_progress = by_progress;
	r->timeout_ms = timeout_ms;
	r->cancel_fd = -1;
	assert_int_equal(pthread_create(&r->th, NULL, reader_main, r), 0);
}

static char *status(void)
{
	char *j;
	OK(gf_gms_status_json(srv.uri, 2000, &j));
	return j;
}

static bool status_has(const char *what)
{
	char *j = status();
	bool ok = strstr(j, what) != NULL;
	free(j);
	return ok;
}

static void wait_status(const char *what)
{
	for (int i = 0; i < 1000; i++) {
		if (status_has(what))
			return;
		usleep(10000);
	}
	fail_msg("the status never showed %s", what);
}

/*
 * A writer that loads for three times the reader's timeout, first by
 * allocating, then only by reporting bytes written, keeps a reader waiting
 * by progress; the reader then maps the commit. A reader with the same
 * timeout counted from its request gives up during the load.
 */
static void test_slow_writer_keeps_reader_waiting(void **state)
{
	(void)state;
	gf_gms *w;
	OK(gf_gms_connect(&w, srv.uri, mem, GF_GMS_RW, 5000, NULL));
	struct reader patient, absolute;
	reader_start(&patient, true, WAIT_MS);
	reader_start(&absolute, false, WAIT_MS);
	wait_status("\"waiters\":2");
	assert_true(status_has("\"waiters_by_progress\":1"));

	int64_t t0 = gf_now_us();
	uint64_t id, n = 0;
	/* First half: allocations, each a step of progress. */
	while (gf_now_us() - t0 < LOAD_US / 2) {
		OK(gf_gms_allocate(w, 64 * KiB, "weights", &id));
		n++;
		usleep(STEP_US);
	}
	OK(gf_gms_put_meta(w, "layer.0.weight", 1, 0, "v", 1));
	/* Second half: writing only, reported. */
	uint64_t total = n * 64 * KiB, done = 0;
	for (size_t i = 0; gf_now_us() - t0 < LOAD_US; i = (i + 1) % n) {
		struct gf_gms_alloc_info ai;
		OK(gf_gms_alloc_at(w, i, &ai));
		memset((void *)(uintptr_t)ai.addr, 0x5a, ai.size);
		done = done + ai.size > total ? total : done + ai.size;
		OK(gf_gms_report_progress(w, done, total));
		usleep(STEP_US);
	}
	/* The status shows the writer and what it reported. */
	char *j = status();
	assert_non_null(strstr(j, "\"writer_progress\":{"));
	assert_non_null(strstr(j, "\"no_writer_since_unix_ms\":null"));
	char want[96];
	snprintf(want, sizeof(want), "\"total_bytes\":%llu", (unsigned long long)total);
	assert_non_null(strstr(j, want));
	assert_null(strstr(j, "\"progress_reports\":0"));
	free(j);

	/* The load outlasted the timeout three times over: the absolute wait ended, the other did not. */
	assert_true(atomic_load(&absolute.done));
	assert_int_equal(absolute.rc, GF_ERR_TIMEOUT);
	assert_false(atomic_load(&patient.done));

	uint64_t gen;
	OK(gf_gms_commit(w, &gen));
	pthread_join(patient.th, NULL);
	pthread_join(absolute.th, NULL);
	OK(patient.rc);
	assert_int_equal(gf_gms_granted_mode(patient.g), GF_GMS_RO);
	OK(gf_gms_map_all(patient.g));
	assert_int_equal(gf_gms_alloc_count(patient.g), n);
	struct gf_gms_alloc_info ai;
	OK(gf_gms_alloc_at(patient.g, 0, &ai));
	assert_int_equal(((const uint8_t *)(uintptr_t)ai.addr)[0], 0x5a);
	gf_gms_free(patient.g);
	gf_gms_free(w);
	/* No writer now: the status says since when. */
	assert_true(status_has("\"writer_progress\":null"));
	assert_false(status_has("\"no_writer_since_unix_ms\":null"));
}

/* No writer at all: the wait ends after its timeout and says so. */
static void test_no_writer_times_out(void **state)
{
	(void)state;
	gf_gms *g = NULL;
	assert_int_equal(gf_gms_connect(&g, srv.uri, mem, GF_GMS_RO, 300, &BY_PROGRESS), GF_ERR_TIMEOUT);
	assert_null(g);
	assert_non_null(strstr(gf_error_detail(), "no writer connected for 0.3 s"));
	assert_true(status_has("reason=no_writer"));

	/* A writer that leaves (its load aborted) is no writer either, from the moment it left. */
	gf_gms *w;
	OK(gf_gms_connect(&w, srv.uri, mem, GF_GMS_RW, 5000, NULL));
	struct reader r;
	reader_start(&r, true, 300);
	wait_status("\"waiters_by_progress\":1");
	gf_gms_free(w);
	pthread_join(r.th, NULL);
	assert_int_equal(r.rc, GF_ERR_TIMEOUT);
	assert_non_null(strstr(r.detail, "no writer connected for 0.3 s"));
}

/* A writer that connects, allocates once and stalls: the wait ends with the stall's detail. */
static void test_stalled_writer_times_out(void **state)
{
	(void)state;
	gf_gms *w;
	uint64_t id;
	OK(gf_gms_connect(&w, srv.uri, mem, GF_GMS_RW, 5000, NULL));
	OK(gf_gms_allocate(w, 64 * KiB, "weights", &id));
	OK(gf_gms_report_progress(w, 1000, 5000));
	gf_gms *g = NULL;
	assert_int_equal(gf_gms_connect(&g, srv.uri, mem, GF_GMS_RO, 300, &BY_PROGRESS), GF_ERR_TIMEOUT);
	assert_null(g);
	const char *d = gf_error_detail();
	assert_non_null(strstr(d, "writer connected but made no progress for 0.3 s"));
	assert_non_null(strstr(d, "1 allocations"));
	assert_non_null(strstr(d, "reported 1000 of 5000 bytes written"));
	assert_true(status_has("reason=writer_stalled"));
	/* The writer is unharmed and still loads. */
	assert_int_equal(gf_gms_granted_mode(w), GF_GMS_RW);
	OK(gf_gms_allocate(w, 64 * KiB, "weights", &id));
	gf_gms_free(w);
}

/* Only the writer reports progress; a committed layout grants at once, as without progress. */
static void test_report_progress_rules(void **state)
{
	(void)state;
	assert_int_equal(gf_gms_report_progress(NULL, 0, 0), GF_ERR_INVALID_ARG);
	gf_gms *w;
	uint64_t id, gen;
	OK(gf_gms_connect(&w, srv.uri, mem, GF_GMS_RW, 5000, NULL));
	OK(gf_gms_allocate(w, 64 * KiB, "weights", &id));
	OK(gf_gms_report_progress(w, 1, 0));
	OK(gf_gms_report_progress(w, 2, 0)); /* within 100 ms: kept back, not an error */
	OK(gf_gms_commit(w, &gen));
	assert_int_equal(gf_gms_report_progress(w, 3, 0), GF_ERR_STATE);
	gf_gms *r;
	OK(gf_gms_connect(&r, srv.uri, mem, GF_GMS_RO, 0, &BY_PROGRESS));
	assert_int_equal(gf_gms_granted_mode(r), GF_GMS_RO);
	assert_int_equal(gf_gms_report_progress(r, 3, 0), GF_ERR_STATE);
	gf_gms_free(r);
	gf_gms_free(w);
}

/* The cancel fd withdraws a wait: GF_ERR_INTERRUPTED, and the GMS no longer counts the waiter. */
static void test_cancel_fd_withdraws_the_wait(void **state)
{
	(void)state;
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	assert_true(efd >= 0);
	struct reader r;
	memset(&r, 0, sizeof(r));
	r.by_progress = true;
	r.timeout_ms = 60000;
	r.cancel_fd = efd;
	assert_int_equal(pthread_create(&r.th, NULL, reader_main, &r), 0);
	wait_status("\"waiters_by_progress\":1");
	uint64_t one = 1;
	assert_int_equal(write(efd, &one, sizeof(one)), sizeof(one));
	pthread_join(r.th, NULL);
	assert_int_equal(r.rc, GF_ERR_INTERRUPTED);
	assert_null(r.g);
	wait_status("\"waiters\":0");
	close(efd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_slow_writer_keeps_reader_waiting, gt_setup, gt_teardown),
		cmocka_unit_test_setup_teardown(test_no_writer_times_out, gt_setup, gt_teardown),
		cmocka_unit_test_setup_teardown(test_stalled_writer_times_out, gt_setup, gt_teardown),
		cmocka_unit_test_setup_teardown(test_report_progress_rules, gt_setup, gt_teardown),
		cmocka_unit_test_setup_teardown(test_cancel_fd_withdraws_the_wait, gt_setup, gt_teardown),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
