/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the lock component: state-file parsing, and the server
 * core's queue/epoch/reconnect-window logic driven in-process (exit wait
 * off, since every peer here is this very process). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "locktest.h"
#include "statefile.h"

static const char *GOOD =
	"{\"version\":1,\"holder\":\"engine-a\",\"epoch\":42,"
	"\"session_token\":\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\","
	"\"granted_at\":\"2026-01-01T00:00:00.000000Z\",\"granted_at_us\":1767225600000000,\"pid\":1234}";

static void test_state_good(void **s)
{
	(void)s;
	struct gf_lock_state st;
	assert_int_equal(gf_lock_state_parse(GOOD, strlen(GOOD), &st), 0);
	assert_true(st.has_holder);
	assert_string_equal(st.holder, "engine-a");
	assert_int_equal(st.epoch, 42);
	assert_int_equal(st.pid, 1234);
	assert_int_equal(st.token[1], 0x11);
	assert_int_equal(st.token[31], 0xff);
	const char *free_st = "{\"holder\":null,\"epoch\":7,\"session_token\":null}";
	assert_int_equal(gf_lock_state_parse(free_st, strlen(free_st), &st), 0);
	assert_false(st.has_holder);
	assert_int_equal(st.epoch, 7);
}

static void test_state_bad(void **s)
{
	(void)s;
	static const char *bad[] = {
		"",
		"not json",
		"[]",
		"{}",
		"{\"holder\":null}",
		"{\"holder\":null,\"epoch\":\"7\"}",
		"{\"holder\":null,\"epoch\":-1}",
		"{\"holder\":null,\"epoch\":1.5}",
		"{\"holder\":5,\"epoch\":7}",
		"{\"holder\":\"\",\"epoch\":7,\"session_token\":\"00\"}",
		"{\"holder\":\"a\",\"epoch\":7}",
		"{\"holder\":\"a\",\"epoch\":0,\"session_token\":\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}",
		"{\"holder\":\"a\",\"epoch\":7,\"session_token\":\"zz112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}",
		"{\"holder\":\"a\",\"epoch\":7,\"session_token\":\"0011\"}",
		"{\"holder\":\"a\",\"epoch\":7,\"session_token\":\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\",\"pid\":\"x\"}",
		"{\"holder\":\"a\",\"epoch\":7,\"session_token\":\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\",\"granted_at_us\":[]}",
		"{\"version\":2,\"holder\":null,\"epoch\":7}",
		"{\"holder\":null,\"epoch\":7,\"epoch\":8}",
	};
	for (size_t i = 0; i < GF_ARRAY_SIZE(bad); i++) {
		struct gf_lock_state st;
		memset(&st, 0x5a, sizeof(st));
		int rc = gf_lock_state_parse(bad[i], strlen(bad[i]), &st);
		if (rc != GF_ERR_PROTOCOL)
			fail_msg("case %zu '%s' gave %d", i, bad[i], rc);
		assert_true(strlen(gf_error_detail()) > 0);
		assert_int_equal(((unsigned char *)&st)[0], 0x5a); /* untouched on failure */
	}
}

static void test_state_truncated(void **s)
{
	(void)s;
	/* Every proper prefix of a good file (a torn write) is rejected. */
	size_t n = strlen(GOOD);
	for (size_t len = 0; len < n; len++) {
		struct gf_lock_state st;
		assert_int_not_equal(gf_lock_state_parse(GOOD, len, &st), 0);
	}
}

static void test_state_store_load(void **s)
{
	(void)s;
	char *dir = tu_tmpdir(), path[512];
	snprintf(path, sizeof(path), "%s/state.json", dir);
	struct gf_lock_state st, back;
	assert_int_equal(gf_lock_state_load(path, &back), GF_ERR_NOT_FOUND);
	memset(&st, 0, sizeof(st));
	st.has_holder = true;
	strcpy(st.holder, "e\"1\\");
	st.epoch = UINT64_C(1) << 52;
	for (int i = 0; i < 32; i++)
		st.token[i] = (uint8_t)(i * 7);
	st.granted_at_us = 123456789;
	st.pid = 77;
	assert_int_equal(gf_lock_state_store(path, &st), 0);
	assert_int_equal(gf_lock_state_load(path, &back), 0);
	assert_string_equal(back.holder, st.holder);
	assert_int_equal(back.epoch, st.epoch);
	assert_memory_equal(back.token, st.token, 32);
	assert_int_equal(back.pid, 77);
	/* Replacing a state (names swapped where the filesystem can) reads back the new one, again and again. */
	for (int k = 0; k < 3; k++) {
		st.epoch++;
		st.pid = 78 + (uint32_t)k;
		assert_int_equal(gf_lock_state_store(path, &st), 0);
		assert_int_equal(gf_lock_state_load(path, &back), 0);
		assert_int_equal(back.epoch, st.epoch);
		assert_int_equal(back.pid, st.pid);
	}
	/* A truncated file on disk is reported as corrupt, not as missing. */
	assert_int_equal(truncate(path, 20), 0);
	assert_int_equal(gf_lock_state_load(path, &back), GF_ERR_PROTOCOL);
	unlink(path);
	char tmp[600];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	unlink(tmp); /* the previous state, after a swap */
	assert_int_equal(rmdir(dir), 0);
	free(dir);
}

/* The hand-written formatter must escape whatever the parser accepts as a holder. */
static void test_state_format_roundtrip(void **s)
{
	(void)s;
	static const char *holders[] = { "plain", "q\"uo\\te", "ctl\x01\x1f\n\t", "utf8-\xc3\xa9\xe2\x82\xac", "/slash", NULL };
	char longest[GF_LOCK_ID_MAX];
	memset(longest, '"', sizeof(longest) - 1); /* every byte escaped */
	longest[sizeof(longest) - 1] = '\0';
	for (int i = 0; i <= (int)GF_ARRAY_SIZE(holders); i++) {
		const char *h = i < (int)GF_ARRAY_SIZE(holders) ? holders[i] : longest;
		struct gf_lock_state st, back;
		memset(&st, 0, sizeof(st));
		st.epoch = UINT64_MAX >> 1;
		if (h) {
			st.has_holder = true;
			snprintf(st.holder, sizeof(st.holder), "%s", h);
			for (int k = 0; k < 32; k++)
				st.token[k] = (uint8_t)(255 - k);
			st.granted_at_us = INT64_C(1700000000123456);
			st.pid = UINT32_MAX;
		}
		char *text;
		assert_int_equal(gf_lock_state_format(&st, &text), 0);
		assert_int_equal(gf_lock_state_parse(text, strlen(text), &back), 0);
		assert_int_equal(back.has_holder, st.has_holder);
		assert_true(back.epoch == st.epoch);
		if (h) {
			assert_string_equal(back.holder, st.holder);
			assert_memory_equal(back.token, st.token, 32);
			assert_true(back.granted_at_us == st.granted_at_us);
			assert_int_equal(back.pid, st.pid);
			assert_non_null(strstr(text, "\"granted_at\":\"2023-11-14T22:13:20.123456Z\""));
			if (!strcmp(h, "plain")) /* an id that keeps the id rule skips jansson: the same text */
				assert_string_equal(text, "{\"version\":1,\"holder\":\"plain\",\"epoch\":9223372036854775807,"
							  "\"session_token\":\"fffefdfcfbfaf9f8f7f6f5f4f3f2f1f0efeeedecebeae9e8e7e6e5e4e3e2e1e0\","
							  "\"granted_at\":\"2023-11-14T22:13:20.123456Z\",\"granted_at_us\":1700000000123456,"
							  "\"pid\":4294967295}");
		} else {
			assert_string_equal(text, "{\"version\":1,\"holder\":null,\"epoch\":9223372036854775807,\"session_token\":null}");
		}
		free(text);
	}
	/* A buffer too small is an error, not a truncated state file. */
	struct gf_lock_state st;
	memset(&st, 0, sizeof(st));
	char small[16];
	assert_true(gf_lock_state_format_buf(&st, small, sizeof(small)) < 0);
	st.has_holder = true;
	snprintf(st.holder, sizeof(st.holder), "plain");
	char smaller[64];
	assert_true(gf_lock_state_format_buf(&st, smaller, sizeof(smaller)) < 0);
}

/* ---- the server core, in-process ---- */

static void raw_acquire(struct lt_raw *r, const char *id, int64_t timeout_ms, const uint8_t *token, uint64_t epoch)
{
	memset(&r->m, 0, sizeof(r->m));
	r->m.which_body = gf_Msg_lock_acquire_tag;
	strcpy(r->m.body.lock_acquire.engine_id, id);
	r->m.body.lock_acquire.timeout_ms = timeout_ms;
	if (token) {
		memcpy(r->m.body.lock_acquire.session_token.bytes, token, 32);
		r->m.body.lock_acquire.session_token.size = 32;
		r->m.body.lock_acquire.epoch = epoch;
	}
	lt_raw_send(r);
}

/* An acquire that asks to be told LockNext (@next), as the library's client does. */
static void raw_acquire_next(struct lt_raw *r, const char *id, bool next)
{
	memset(&r->m, 0, sizeof(r->m));
	r->m.which_body = gf_Msg_lock_acquire_tag;
	snprintf(r->m.body.lock_acquire.engine_id, sizeof(r->m.body.lock_acquire.engine_id), "%s", id);
	r->m.body.lock_acquire.timeout_ms = -1;
	r->m.body.lock_acquire.takes_next = next;
	lt_raw_send(r);
}

/* Waits until the server's status shows @n waiters. */
static void wait_waiters(struct lt_server *sv, int n)
{
	char want[32], *json = NULL;
	snprintf(want, sizeof(want), "\"waiter_count\":%d", n);
	int64_t end = gf_now_us() + TU_MS(2000) * 1000;
	while (!(json && strstr(json, want)) && gf_now_us() < end) {
		free(json);
		json = NULL;
		if (gf_lock_status_json(sv->uri, NULL, 0, TU_MS(2000), &json) < 0)
			json = NULL;
		usleep(1000);
	}
	assert_non_null(json);
	assert_non_null(strstr(json, want));
	free(json);
}

static void test_fifo_and_epochs(void **s)
{
	(void)s;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	int64_t before = gf_wall_us();
	struct lt_raw a, b, c;
	lt_raw_open(&a, sv.uri, "a");
	raw_acquire(&a, "a", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&a, TU_MS(2000)), gf_Msg_lock_granted_tag);
	uint64_t e = a.m.body.lock_granted.epoch;
	/* No state file: the epoch floor comes from the wall clock. */
	assert_true(e > (uint64_t)(before - 5000000));
	lt_raw_open(&b, sv.uri, "b");
	raw_acquire(&b, "b", -1, NULL, 0);
	lt_raw_open(&c, sv.uri, "c");
	raw_acquire(&c, "c", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&b, 100), 0);
	assert_int_equal(lt_raw_next(&c, 100), 0);
	char *json;
	assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, TU_MS(2000), &json), 0);
	assert_non_null(strstr(json, "\"holder\":\"a\""));
	assert_non_null(strstr(json, "\"waiter_count\":2"));
	assert_true(strstr(json, "\"id\":\"b\"") < strstr(json, "\"id\":\"c\""));
	free(json);
	/* A second acquire on a waiting connection is a state error. */
	raw_acquire(&b, "b", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&b, TU_MS(2000)), gf_Msg_error_tag);
	assert_int_equal(b.m.body.error.code, GF_ERR_STATE);
	lt_raw_close(&a);
	assert_int_equal(lt_raw_next(&b, TU_MS(2000)), gf_Msg_lock_granted_tag);
	assert_int_equal(b.m.body.lock_granted.epoch, e + 1);
	/* Ids that would break log lines are refused. */
	struct lt_raw bad;
	lt_raw_open(&bad, sv.uri, "bad");
	raw_acquire(&bad, "a b", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&bad, TU_MS(2000)), gf_Msg_error_tag);
	assert_int_equal(bad.m.body.error.code, GF_ERR_INVALID_ARG);
	raw_acquire(&bad, "x\"y", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&bad, TU_MS(2000)), gf_Msg_error_tag);
	lt_raw_close(&bad);
	assert_int_equal(lt_raw_next(&c, 100), 0);
	lt_raw_close(&b);
	assert_int_equal(lt_raw_next(&c, TU_MS(2000)), gf_Msg_lock_granted_tag);
	assert_int_equal(c.m.body.lock_granted.epoch, e + 2);
	lt_raw_close(&c);
	/* Released with nobody waiting: the state file says free, epoch kept. */
	struct gf_lock_state st = { .has_holder = true };
	for (int i = 0; i < 200 && st.has_holder; i++) {
		usleep(10000);
		assert_int_equal(gf_lock_state_load(sv.state, &st), 0);
	}
	assert_false(st.has_holder);
	assert_int_equal(st.epoch, e + 2);
	lt_stop(&sv);
}

/* A waiter that takes LockNext hears it before its grant, with the grant's
 * epoch, and only the waiter about to be granted hears it; one that did not
 * ask gets its grant alone. */
static void test_next_before_grant(void **s)
{
	(void)s;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	struct lt_raw a, b, c, d;
	lt_raw_open(&a, sv.uri, "a");
	raw_acquire(&a, "a", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&a, TU_MS(2000)), gf_Msg_lock_granted_tag);
	uint64_t e = a.m.body.lock_granted.epoch;
	lt_raw_open(&b, sv.uri, "b");
	lt_raw_open(&c, sv.uri, "c");
	lt_raw_open(&d, sv.uri, "d");
	struct lt_raw *w[] = { &b, &c, &d };
	const char *ids[] = { "b", "c", "d" };
	for (int i = 0; i < 3; i++) {
		raw_acquire_next(w[i], ids[i], i < 2); /* d does not ask */
		/* Queued before the next one asks: the FIFO order is the test's. */
		wait_waiters(&sv, i + 1);
	}
	assert_int_equal(lt_raw_next(&b, 100), 0);
	lt_raw_close(&a);
	assert_int_equal(lt_raw_next(&b, TU_MS(2000)), gf_Msg_lock_next_tag);
	assert_int_equal(b.m.body.lock_next.epoch, e + 1);
	assert_int_equal(lt_raw_next(&b, TU_MS(2000)), gf_Msg_lock_granted_tag);
	assert_int_equal(b.m.body.lock_granted.epoch, e + 1);
	assert_int_equal(lt_raw_next(&c, 100), 0); /* not next yet: told nothing */
	lt_raw_close(&b);
	assert_int_equal(lt_raw_next(&c, TU_MS(2000)), gf_Msg_lock_next_tag);
	assert_int_equal(c.m.body.lock_next.epoch, e + 2);
	assert_int_equal(lt_raw_next(&c, TU_MS(2000)), gf_Msg_lock_granted_tag);
	lt_raw_close(&c);
	assert_int_equal(lt_raw_next(&d, TU_MS(2000)), gf_Msg_lock_granted_tag);
	assert_int_equal(d.m.body.lock_granted.epoch, e + 3);
	lt_raw_close(&d);
	lt_stop(&sv);
}

/* The next grant's token, proof and temp file are made a while after a
 * grant (or when a waiter queues), not at once: a grant that comes first,
 * here to a waiter that queued before the last grant, still carries a fence
 * proof that is the MAC of its own epoch and token, and its state is on
 * disk before it is sent. */
static void test_grant_before_prepared(void **s)
{
	(void)s;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	struct lt_raw a, b, c;
	lt_raw_open(&a, sv.uri, "a");
	raw_acquire(&a, "a", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&a, TU_MS(2000)), gf_Msg_lock_granted_tag);
	lt_raw_open(&b, sv.uri, "b");
	raw_acquire_next(&b, "b", true);
	lt_raw_open(&c, sv.uri, "c");
	raw_acquire_next(&c, "c", true);
	wait_waiters(&sv, 2);
	lt_raw_close(&a);
	assert_int_equal(lt_raw_next(&b, TU_MS(2000)), gf_Msg_lock_next_tag);
	assert_int_equal(lt_raw_next(&b, TU_MS(2000)), gf_Msg_lock_granted_tag);
	lt_raw_close(&b); /* at once: c queued before b's grant, nothing was made since */
	assert_int_equal(lt_raw_next(&c, TU_MS(2000)), gf_Msg_lock_next_tag);
	assert_int_equal(lt_raw_next(&c, TU_MS(2000)), gf_Msg_lock_granted_tag);
	const gf_LockGranted *g = &c.m.body.lock_granted;
	assert_int_equal(g->session_token.size, 32);
	assert_int_equal(g->fence_proof.size, GF_LOCK_PROOF_LEN);
	struct gf_lock_grant grant = { .epoch = g->epoch };
	memcpy(grant.session_token, g->session_token.bytes, 32);
	struct gf_lock_proof want;
	assert_int_equal(gf_lock_grant_proof(&grant, &want), 0);
	assert_memory_equal(g->fence_proof.bytes, want.token, GF_LOCK_PROOF_LEN);
	struct gf_lock_state st;
	assert_int_equal(gf_lock_state_load(sv.state, &st), 0);
	assert_true(st.has_holder);
	assert_string_equal(st.holder, "c");
	assert_true(st.epoch == g->epoch);
	assert_memory_equal(st.token, g->session_token.bytes, 32);
	lt_raw_close(&c);
	lt_stop(&sv);
}

/* Removes every entry of @dir, then @dir. */
static void remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		char p[600];
		snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
		assert_int_equal(unlink(p), 0);
	}
	closedir(d);
	assert_int_equal(rmdir(dir), 0);
}

/* A state file that cannot be written holds grants: the waiter is told it
 * is next but gets no grant, and status JSON and /metrics say so. */
static void test_grants_held_shown(void **s)
{
	(void)s;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	struct lt_raw a, b;
	lt_raw_open(&a, sv.uri, "a");
	raw_acquire(&a, "a", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&a, TU_MS(2000)), gf_Msg_lock_granted_tag);
	lt_raw_open(&b, sv.uri, "b");
	raw_acquire_next(&b, "b", true);
	char *json, *text;
	assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, TU_MS(2000), &json), 0);
	assert_non_null(strstr(json, "\"state_write_failing\":false"));
	assert_non_null(strstr(json, "\"state_write_failures\":0"));
	free(json);
	remove_dir(sv.dir);
	lt_raw_close(&a);
	assert_int_equal(lt_raw_next(&b, TU_MS(2000)), gf_Msg_lock_next_tag);
	assert_int_equal(lt_raw_next(&b, 300), 0); /* no grant: the write failed */
	/* Its socket's name is gone with the directory: asked in-process, on
	 * this thread once the loop has stopped (the state stays until freed). */
	gf_lockd_stop(sv.d);
	pthread_join(sv.t, NULL);
	assert_int_equal(gf_lockd_status_json(sv.d, &json), 0);
	assert_non_null(strstr(json, "\"state_write_failing\":true"));
	assert_null(strstr(json, "\"state_write_failures\":0"));
	assert_non_null(strstr(json, "\"holder\":null"));
	free(json);
	assert_int_equal(gf_lockd_metrics(sv.d, &text), 0);
	assert_non_null(strstr(text, "\ngf_lock_grants_held 1\n"));
	assert_null(strstr(text, "\ngf_lock_state_write_failures_total 0\n"));
	assert_non_null(strstr(text, "# TYPE gf_lock_state_write_failures_total counter\n"));
	free(text);
	lt_raw_close(&b);
	gf_lockd_free(sv.d);
}

static void test_waiter_timeout_and_client(void **s)
{
	(void)s;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	gf_lock *a, *b;
	struct gf_lock_grant g;
	assert_int_equal(gf_lock_new(&a, sv.uri, "a"), 0);
	assert_int_equal(gf_lock_new(&b, sv.uri, "b"), 0);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	assert_true(gf_lock_is_held(a));
	assert_int_equal(gf_lock_epoch(a), g.epoch);
	assert_int_equal(gf_lock_acquire(a, TU_MS(100), &g), GF_ERR_STATE);
	assert_int_equal(gf_lock_acquire(b, TU_MS(150), &g), GF_ERR_TIMEOUT);
	assert_false(gf_lock_is_held(b));
	uint64_t e = gf_lock_epoch(a);
	assert_int_equal(gf_lock_release(a), 0);
	assert_false(gf_lock_is_held(a));
	assert_int_equal(gf_lock_acquire(b, TU_MS(2000), &g), 0);
	assert_int_equal(g.epoch, e + 1);
	assert_int_equal(gf_lock_start_watch(b), 0);
	gf_lock_stop_watch(b);
	gf_lock_free(a);
	gf_lock_free(b);
	lt_stop(&sv);
}

struct intr_arg {
	gf_lock *l;
	int rc;
};

static void *acq_thread(void *p)
{
	struct intr_arg *a = p;
	struct gf_lock_grant g;
	a->rc = gf_lock_acquire(a->l, -1, &g);
	return NULL;
}

static void test_interrupt(void **s)
{
	(void)s;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	gf_lock *a, *b;
	struct gf_lock_grant g;
	assert_int_equal(gf_lock_new(&a, sv.uri, "a"), 0);
	assert_int_equal(gf_lock_new(&b, sv.uri, "b"), 0);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	struct intr_arg ia = { .l = b, .rc = 1 };
	pthread_t t;
	pthread_create(&t, NULL, acq_thread, &ia);
	usleep(100000);
	gf_lock_interrupt(b);
	pthread_join(t, NULL);
	assert_int_equal(ia.rc, GF_ERR_INTERRUPTED);
	/* The abandoned waiter left the queue. */
	char *json;
	assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, TU_MS(2000), &json), 0);
	assert_non_null(strstr(json, "\"waiter_count\":0"));
	free(json);
	gf_lock_free(a);
	gf_lock_free(b);
	lt_stop(&sv);
}

static void test_reconnect_window_reclaim(void **s)
{
	(void)s;
	struct lt_server sv;
	uint8_t tok[32], bad[32];
	/* GOOD's token bytes are 00 11 22 ... ff 00 11 ... */
	for (int i = 0; i < 32; i++) {
		tok[i] = (uint8_t)((i % 16) * 0x11);
		bad[i] = (uint8_t)~tok[i];
	}
	lt_start(&sv, &(struct lt_config){ .state_text = GOOD, .window_ms = 10000 });
	struct lt_raw w, x;
	lt_raw_open(&w, sv.uri, "w");
	raw_acquire(&w, "w", -1, NULL, 0);
	/* The same engine id without the token is an ordinary waiter. */
	lt_raw_open(&x, sv.uri, "engine-a");
	raw_acquire(&x, "engine-a", -1, bad, 42);
	assert_int_equal(lt_raw_next(&x, TU_MS(2000)), gf_Msg_error_tag);
	assert_int_equal(x.m.body.error.code, GF_ERR_LOCK_LOST);
	raw_acquire(&x, "engine-a", -1, tok, 41); /* right token, wrong epoch */
	assert_int_equal(lt_raw_next(&x, TU_MS(2000)), gf_Msg_error_tag);
	raw_acquire(&x, "engine-a", -1, tok, 42);
	assert_int_equal(lt_raw_next(&x, TU_MS(2000)), gf_Msg_lock_granted_tag);
	assert_int_equal(x.m.body.lock_granted.epoch, 42);
	assert_true(x.m.body.lock_granted.reclaimed);
	assert_int_equal(lt_raw_next(&w, 200), 0);
	lt_raw_close(&x);
	assert_int_equal(lt_raw_next(&w, TU_MS(2000)), gf_Msg_lock_granted_tag);
	assert_int_equal(w.m.body.lock_granted.epoch, 43);
	lt_raw_close(&w);
	lt_stop(&sv);
}

static void test_holder_takeover_stale_connection(void **s)
{
	(void)s;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	struct lt_raw a, a2, w;
	lt_raw_open(&a, sv.uri, "a");
	raw_acquire(&a, "a", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&a, TU_MS(2000)), gf_Msg_lock_granted_tag);
	gf_LockGranted g = a.m.body.lock_granted;
	lt_raw_open(&w, sv.uri, "w");
	raw_acquire(&w, "w", -1, NULL, 0);
	/* The holder comes back on a new connection while the old one is
	 * still open (half-open TCP): the token moves the grant, same epoch. */
	lt_raw_open(&a2, sv.uri, "a");
	raw_acquire(&a2, "a", -1, g.session_token.bytes, g.epoch);
	assert_int_equal(lt_raw_next(&a2, TU_MS(2000)), gf_Msg_lock_granted_tag);
	assert_int_equal(a2.m.body.lock_granted.epoch, g.epoch);
	assert_true(a2.m.body.lock_granted.reclaimed);
	assert_int_equal(gf_msg_recv(&a.rd, a.fd, &a.m, NULL, NULL, gf_deadline_from_ms(TU_MS(2000))), GF_ERR_CLOSED);
	assert_int_equal(lt_raw_next(&w, 200), 0); /* the waiter was not granted */
	lt_raw_close(&a2);
	assert_int_equal(lt_raw_next(&w, TU_MS(2000)), gf_Msg_lock_granted_tag);
	assert_int_equal(w.m.body.lock_granted.epoch, g.epoch + 1);
	lt_raw_close(&a);
	lt_raw_close(&w);
	lt_stop(&sv);
}

static void test_watcher_reclaims_then_reports_loss(void **s)
{
	(void)s;
	struct lt_server sv;
	struct lt_lost lr = { 0 };
	struct gf_lock_grant g;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	gf_lock *a = lt_client(&sv, "a", 1500, &lr);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	assert_int_equal(gf_lock_start_watch(a), 0);
	/* Server restart: the watcher reconnects with its token, keeps the epoch. */
	lt_halt(&sv);
	lt_run(&sv, 1000);
	int64_t end = gf_now_us() + 3000000;
	char *json = NULL;
	while (gf_now_us() < end) {
		free(json);
		json = NULL;
		if (gf_lock_status_json(sv.uri, NULL, 0, TU_MS(1000), &json) == 0 && strstr(json, "\"holder\":\"a\""))
			break;
		usleep(20000);
	}
	assert_non_null(json);
	assert_non_null(strstr(json, "\"holder\":\"a\""));
	free(json);
	assert_true(gf_lock_is_held(a));
	assert_int_equal(gf_lock_epoch(a), g.epoch);
	assert_int_equal(atomic_load(&lr.calls), 0);
	/* A server back without a window refuses the reclaim: LOCK_LOST
	 * through the hook, once. (A unix server merely gone keeps the holder
	 * holding on: test_lock_outage.c.) */
	lt_halt(&sv);
	lt_run(&sv, 0);
	end = gf_now_us() + 5000000;
	while (atomic_load(&lr.calls) == 0 && gf_now_us() < end)
		usleep(10000);
	assert_int_equal(atomic_load(&lr.calls), 1);
	assert_int_equal(lr.err, GF_ERR_LOCK_LOST);
	assert_non_null(strstr(lr.detail, "reclaim refused"));
	assert_false(gf_lock_is_held(a));
	assert_int_equal(gf_lock_process(a), GF_ERR_LOCK_LOST);
	gf_lock_free(a);
	lt_stop(&sv);
}

/* Refused reclaim after a restart: how long until the hook heard of it (-1: not within @ms). */
static int64_t loss_after_restart(struct lt_server *sv, struct lt_lost *lr, int64_t ms)
{
	lt_halt(sv);
	lt_run(sv, 0); /* back without a window: the reclaim is refused */
	int64_t t0 = gf_now_us(), end = t0 + ms * 1000;
	while (atomic_load(&lr->calls) == 0 && gf_now_us() < end)
		usleep(10000);
	return atomic_load(&lr->calls) ? gf_now_us() - t0 : -1;
}

/*
 * A prepared watcher: the thread exists before the wait, so starting the
 * watch after the grant creates none; it can be stopped and started again
 * for the same hold, and it still reports the loss.
 */
static void test_prepared_watcher(void **s)
{
	(void)s;
	struct lt_server sv;
	struct lt_lost lr = { 0 };
	struct gf_lock_grant g;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	gf_lock *a = lt_client(&sv, "a", TU_MS(200), &lr);
	assert_int_equal(gf_lock_prepare_watch(a), 0);
	assert_int_equal(gf_lock_prepare_watch(a), 0); /* idempotent */
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	int threads = tu_count_threads();
	assert_int_equal(gf_lock_start_watch(a), 0);
	assert_int_equal(tu_count_threads(), threads);
	assert_int_equal(gf_lock_start_watch(a), GF_ERR_STATE); /* one watch at a time */
	gf_lock_stop_watch(a);
	assert_int_equal(gf_lock_start_watch(a), 0);
	assert_int_equal(tu_count_threads(), threads);
	assert_true(loss_after_restart(&sv, &lr, TU_MS(5000)) >= 0);
	assert_int_equal(atomic_load(&lr.calls), 1);
	assert_int_equal(lr.err, GF_ERR_LOCK_LOST);
	gf_lock_stop_watch(a);
	gf_lock_free(a);
	lt_stop(&sv);
}

/*
 * A start put off (gf_lock_start_watch_by(), the engine's at the grant):
 * nothing is watched before it is due, a gf_lock_start_watch() starts it
 * at once, and one left alone starts when its time comes.
 */
static void test_watch_put_off(void **s)
{
	(void)s;
	struct lt_server sv;
	struct lt_lost lr = { 0 };
	struct gf_lock_grant g;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	gf_lock *a = lt_client(&sv, "a", TU_MS(200), &lr);
	assert_int_equal(gf_lock_prepare_watch(a), 0);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	assert_int_equal(gf_lock_start_watch_by(a, 600000), 0);
	assert_int_equal(gf_lock_start_watch_by(a, 600000), GF_ERR_STATE); /* one watch at a time */
	/* Unwatched: the refused reclaim is nobody's news yet. */
	assert_int_equal(loss_after_restart(&sv, &lr, TU_MS(1000)), -1);
	assert_true(gf_lock_is_held(a));
	assert_int_equal(gf_lock_start_watch(a), 0); /* now instead of then */
	int64_t end = gf_now_us() + TU_MS(5000) * 1000;
	while (atomic_load(&lr.calls) == 0 && gf_now_us() < end)
		usleep(10000);
	assert_int_equal(atomic_load(&lr.calls), 1);
	assert_int_equal(lr.err, GF_ERR_LOCK_LOST);
	gf_lock_stop_watch(a);
	gf_lock_free(a);
	lt_stop(&sv);

	/* Left alone, the start comes when it is due. */
	struct lt_lost lr2 = { 0 };
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	a = lt_client(&sv, "a", TU_MS(200), &lr2);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	assert_int_equal(gf_lock_start_watch_by(a, 300), 0); /* also without a prepared thread */
	assert_true(loss_after_restart(&sv, &lr2, TU_MS(5000)) >= 0);
	assert_int_equal(lr2.err, GF_ERR_LOCK_LOST);
	gf_lock_stop_watch(a);
	gf_lock_free(a);
	lt_stop(&sv);
}

static void test_reconnect_window_expires(void **s)
{
	(void)s;
	struct lt_server sv;
	const int64_t window = TU_MS(300);
	lt_start(&sv, &(struct lt_config){ .state_text = GOOD, .window_ms = window });
	int64_t t0 = gf_now_us();
	struct lt_raw w;
	lt_raw_open(&w, sv.uri, "w");
	raw_acquire(&w, "w", -1, NULL, 0);
	char *json;
	assert_int_equal(gf_lock_status_json(sv.uri, NULL, 0, TU_MS(2000), &json), 0);
	assert_non_null(strstr(json, "\"reconnect_window\":true"));
	assert_non_null(strstr(json, "\"previous_holder\":\"engine-a\""));
	free(json);
	assert_int_equal(lt_raw_next(&w, TU_MS(5000)), gf_Msg_lock_granted_tag);
	assert_true(gf_now_us() - t0 >= (window - 10) * 1000);
	assert_int_equal(w.m.body.lock_granted.epoch, 43);
	lt_raw_close(&w);
	lt_stop(&sv);
}

static void test_corrupt_state_floor(void **s)
{
	(void)s;
	struct lt_server sv;
	int64_t before = gf_wall_us();
	lt_start(&sv, &(struct lt_config){ .state_text = "{\"holder\":\"a\",\"epo", .window_ms = 10000 });
	struct lt_raw w;
	lt_raw_open(&w, sv.uri, "w");
	raw_acquire(&w, "w", -1, NULL, 0);
	/* No window (nothing trustworthy on record), an epoch above the clock. */
	assert_int_equal(lt_raw_next(&w, TU_MS(2000)), gf_Msg_lock_granted_tag);
	assert_true(w.m.body.lock_granted.epoch > (uint64_t)before);
	/* The grant was persisted before it was sent. */
	struct gf_lock_state st;
	assert_int_equal(gf_lock_state_load(sv.state, &st), 0);
	assert_true(st.has_holder);
	assert_int_equal(st.epoch, w.m.body.lock_granted.epoch);
	assert_memory_equal(st.token, w.m.body.lock_granted.session_token.bytes, 32);
	lt_raw_close(&w);
	lt_stop(&sv);
}

static void test_config_validation(void **s)
{
	(void)s;
	gf_lockd *d;
	assert_int_equal(gf_lockd_new(&d), 0);
	assert_int_equal(gf_lockd_start(d), GF_ERR_INVALID_ARG); /* no listener */
	assert_int_equal(gf_lockd_set_lease(d, 100, 200), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_set_lease(d, 100, 300), 0);
	assert_int_equal(gf_lockd_add_listen(d, "tcp://127.0.0.1:1"), 0);
	assert_int_equal(gf_lockd_start(d), GF_ERR_INVALID_ARG); /* TCP without secret */
	assert_int_equal(gf_lockd_add_listen(d, "http://x"), GF_ERR_INVALID_ARG);
	gf_lockd_free(d);
	gf_lockd_free(NULL);
	gf_lock *l;
	assert_int_equal(gf_lock_new(&l, "unix:///nonexistent/x.sock", ""), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lock_new(&l, "unix:///nonexistent/x.sock", "a"), 0);
	assert_int_equal(gf_lock_set_lease(l, 300, 300), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lock_set_reconnect_timeout(l, 200), 0);
	struct gf_lock_grant g;
	assert_int_equal(gf_lock_acquire(l, -1, &g), GF_ERR_UNREACHABLE);
	/* The event-loop trio on a lock that is not held, and on none. */
	assert_int_equal(gf_lock_get_fd(l), -1);
	assert_int_equal(gf_lock_get_events(l), POLLIN);
	assert_int_equal(gf_lock_get_fd(NULL), -1);
	assert_int_equal(gf_lock_get_events(NULL), GF_ERR_INVALID_ARG);
	gf_lock_free(l);
	gf_lock_free(NULL);
}


/* Durations that overflow 64-bit microseconds used to become "none": every
 * setter refuses them, and a huge timeout on the wire means "forever", not
 * "expired". */
static void test_durations_do_not_overflow(void **s)
{
	(void)s;
	const int64_t huge = INT64_C(1) << 62;
	gf_lockd *d;
	assert_int_equal(gf_lockd_new(&d), 0);
	assert_int_equal(gf_lockd_set_reconnect_window(d, huge), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_set_exit_wait_timeout(d, huge), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_set_handshake_timeout(d, huge), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_set_lease(d, 1000, huge), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_lockd_set_handshake_timeout(d, 86400000), 0);
	gf_lockd_free(d);
	gf_gmsd *g;
	assert_int_equal(gf_gmsd_new(&g), 0);
	assert_int_equal(gf_gmsd_set_oom_retry(g, huge), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_gmsd_set_handshake_timeout(g, huge), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_gmsd_set_handshake_timeout(g, 0), GF_ERR_INVALID_ARG);
	gf_gmsd_free(g);

	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	struct lt_raw a, b;
	lt_raw_open(&a, sv.uri, "a");
	raw_acquire(&a, "a", -1, NULL, 0);
	assert_int_equal(lt_raw_next(&a, TU_MS(5000)), gf_Msg_lock_granted_tag);
	lt_raw_open(&b, sv.uri, "b");
	raw_acquire(&b, "b", huge, NULL, 0);
	assert_int_equal(lt_raw_next(&b, 300), 0); /* still waiting: no TIMEOUT */
	lt_raw_close(&a);
	assert_int_equal(lt_raw_next(&b, TU_MS(5000)), gf_Msg_lock_granted_tag);
	lt_raw_close(&b);
	lt_stop(&sv);
}

/* The two servers' loop contracts are the same: a timeout getter, and
 * process() says 1 once stopped. */
static void test_servers_symmetric(void **s)
{
	(void)s;
	char *dir = tu_tmpdir();
	char uri[300];
	gf_lockd *d;
	assert_int_equal(gf_lockd_new(&d), 0);
	assert_int_equal(gf_lockd_get_timeout_ms(d), -1);
	snprintf(uri, sizeof(uri), "unix://%s/l.sock", dir);
	assert_int_equal(gf_lockd_add_listen(d, uri), 0);
	assert_int_equal(gf_lockd_add_allow_uid(d, 12345), 0);
	assert_int_equal(gf_lockd_start(d), 0);
	assert_int_equal(gf_lockd_add_allow_uid(d, 1), GF_ERR_STATE);
	assert_int_equal(gf_lockd_process(d), 0);
	gf_lockd_stop(d);
	assert_int_equal(gf_lockd_process(d), 1);
	gf_lockd_free(d);
	gf_gmsd *g;
	assert_int_equal(gf_gmsd_new(&g), 0);
	assert_int_equal(gf_gmsd_get_timeout_ms(g), -1);
	snprintf(uri, sizeof(uri), "unix://%s/g.sock", dir);
	assert_int_equal(gf_gmsd_add_listen(g, "tcp://127.0.0.1:1"), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_gmsd_add_listen(g, uri), 0);
	assert_int_equal(gf_gmsd_set_backend(g, GF_MEM_HOST), 0);
	assert_int_equal(gf_gmsd_add_allow_uid(g, 12345), 0);
	assert_int_equal(gf_gmsd_start(g), 0);
	assert_int_equal(gf_gmsd_add_allow_uid(g, 1), GF_ERR_STATE);
	assert_int_equal(gf_gmsd_process(g), 0);
	gf_gmsd_stop(g);
	assert_int_equal(gf_gmsd_process(g), 1);
	gf_gmsd_free(g);
	rmdir(dir);
	free(dir);
}

static void test_fork_child_does_not_hold(void **s)
{
	(void)s;
	struct lt_server sv;
	lt_start(&sv, &(struct lt_config){ .window_ms = 1000 });
	gf_lock *a;
	struct gf_lock_grant g;
	assert_int_equal(gf_lock_new(&a, sv.uri, "a"), 0);
	assert_int_equal(gf_lock_acquire(a, TU_MS(2000), &g), 0);
	int fd = gf_lock_get_fd(a);
	assert_true(fd >= 0);
	pid_t pid = fork();
	if (pid == 0) {
		/* The child's copy of the socket is closed and it holds nothing. */
		int ok = gf_lock_get_fd(a) == -1 && !gf_lock_is_held(a) && fcntl(fd, F_GETFD) == -1 && errno == EBADF;
		_exit(ok ? 0 : 1);
	}
	int status;
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_true(gf_lock_is_held(a));
	gf_lock_free(a);
	lt_stop(&sv);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_state_good),
		cmocka_unit_test(test_state_bad),
		cmocka_unit_test(test_state_truncated),
		cmocka_unit_test(test_state_store_load),
		cmocka_unit_test(test_state_format_roundtrip),
		cmocka_unit_test(test_fifo_and_epochs), cmocka_unit_test(test_next_before_grant),
		cmocka_unit_test(test_grant_before_prepared),
		cmocka_unit_test(test_grants_held_shown),
		cmocka_unit_test(test_waiter_timeout_and_client),
		cmocka_unit_test(test_interrupt),
		cmocka_unit_test(test_reconnect_window_reclaim),
		cmocka_unit_test(test_holder_takeover_stale_connection),
		cmocka_unit_test(test_watcher_reclaims_then_reports_loss),
		cmocka_unit_test(test_prepared_watcher),
		cmocka_unit_test(test_watch_put_off),
		cmocka_unit_test(test_reconnect_window_expires),
		cmocka_unit_test(test_corrupt_state_floor),
		cmocka_unit_test(test_config_validation),
		cmocka_unit_test(test_durations_do_not_overflow),
		cmocka_unit_test(test_servers_symmetric),
		cmocka_unit_test(test_fork_child_does_not_hold),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
