/* SPDX-License-Identifier: Apache-2.0 */
/* URIs, durations, sizes, hex, error names: pure parsing, no sockets. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "../common/testutil.h"
#include "common.h"
#include "gf-config.h"
#include "wire.h"

static void test_uri_ok(void **state)
{
	struct gf_uri u;
	assert_int_equal(gf_uri_parse("unix:///run/gf/lock.sock", &u), 0);
	assert_int_equal(u.kind, GF_URI_UNIX);
	assert_string_equal(u.path, "/run/gf/lock.sock");
	assert_int_equal(gf_uri_parse("tcp://lockd.ns.svc:7070", &u), 0);
	assert_int_equal(u.kind, GF_URI_TCP);
	assert_string_equal(u.host, "lockd.ns.svc");
	assert_int_equal(u.port, 7070);
	assert_int_equal(gf_uri_parse("tcp://[::1]:65535", &u), 0);
	assert_string_equal(u.host, "::1");
	assert_int_equal(u.port, 65535);
	char buf[128];
	gf_uri_format(&u, buf, sizeof(buf));
	assert_string_equal(buf, "tcp://[::1]:65535");
}

static void test_uri_bad(void **state)
{
	static const char *bad[] = { "", "lock.sock", "unix://relative", "unix://", "unix:///",
				     "http://x:1", "tcp://host", "tcp://:80", "tcp://h:0", "tcp://h:65536",
				     "tcp://h:8o", "tcp://::1:80", "tcp://[::1", "tcp://[::1]80", "tcp://h:",
				     "tcp://a/b:1" };
	struct gf_uri u;
	memset(&u, 0x5a, sizeof(u));
	struct gf_uri before = u;
	for (size_t i = 0; i < GF_ARRAY_SIZE(bad); i++) {
		assert_int_equal(gf_uri_parse(bad[i], &u), GF_ERR_INVALID_ARG);
		assert_true(strlen(gf_error_detail()) > 0);
		assert_memory_equal(&u, &before, sizeof(u)); /* untouched on failure */
	}
	char longp[200] = "unix:///";
	memset(longp + 8, 'a', 150);
	assert_int_equal(gf_uri_parse(longp, &u), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_uri_parse(NULL, &u), GF_ERR_INVALID_ARG);
}

static void test_uri_listen_connect(void **state)
{
	char *dir = tu_tmpdir();
	char text[300];
	struct gf_uri u;
	int l, c, l2;
	snprintf(text, sizeof(text), "unix://%s/s.sock", dir);
	assert_int_equal(gf_uri_parse(text, &u), 0);
	assert_int_equal(gf_uri_connect(&u, gf_now_us() + 100000, &c), GF_ERR_UNREACHABLE);
	assert_int_equal(gf_uri_listen(&u, 8, &l), 0);
	/* A live server's socket is never stolen. */
	assert_int_equal(gf_uri_listen(&u, 8, &l2), GF_ERR_BUSY);
	assert_int_equal(gf_uri_connect(&u, gf_now_us() + 100000, &c), 0);
	close(c);
	close(l);
	/* A stale socket file (server gone) is replaced. */
	assert_int_equal(gf_uri_listen(&u, 8, &l), 0);
	close(l);
	unlink(u.path);
	rmdir(dir);
	free(dir);

	assert_int_equal(gf_uri_parse("tcp://127.0.0.1:1", &u), 0);
	assert_int_equal(gf_uri_connect(&u, gf_now_us() + 500000, &c), GF_ERR_UNREACHABLE);
}

static void test_bytes(void **state)
{
	(void)state;
	uint64_t b = 7;
	static const struct {
		const char *text;
		uint64_t want;
	} ok[] = {{"0", 0}, {"1048576", 1048576}, {"16B", 16}, {"4k", 4096}, {"4K", 4096}, {"4KiB", 4096},
		  {"512M", 512ull << 20}, {"2MiB", 2ull << 20}, {"8G", 8ull << 30}, {"1GiB", 1ull << 30},
		  {"3T", 3ull << 40}, {"16777215T", 16777215ull << 40}, {"18446744073709551615", UINT64_MAX}};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		assert_int_equal(gf_parse_bytes(ok[i].text, &b), 0);
		assert_true(b == ok[i].want);
	}
	b = 7;
	static const char *bad[] = {"", "-1", " 1", "1 ", "M", "1.5G", "1X", "1MB", "16777216T",
				    "18446744073709551616", "1KK", "+1"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(gf_parse_bytes(bad[i], &b), GF_ERR_INVALID_ARG);
	assert_true(b == 7); /* nothing written on failure */
	assert_int_equal(gf_parse_bytes(NULL, &b), GF_ERR_INVALID_ARG);
}

/* The one hex decoder: either case, exactly 2 digits a byte, the first stray character refused. */
static void test_unhex(void **state)
{
	(void)state;
	uint8_t b[4] = {0}, want[4] = {0x00, 0x9f, 0xab, 0xff};
	assert_int_equal(gf_unhex("009fABff", 4, b), 0);
	assert_memory_equal(b, want, 4);
	char text[9];
	gf_hex(want, 4, text);
	memset(b, 0, sizeof(b));
	assert_int_equal(gf_unhex(text, 4, b), 0);
	assert_memory_equal(b, want, 4);
	assert_int_equal(gf_unhex("", 0, b), 0);
	static const char *bad[] = {"0g", "g0", "-1", " 1", "1 ", "0x", "\0\0"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(gf_unhex(bad[i], 1, b), -1);
	assert_int_equal(gf_unhex("00112z", 3, b), -1); /* the last digit counts too */
}

static void test_duration(void **state)
{
	uint64_t ms = 7;
	assert_int_equal(gf_parse_duration_ms("250ms", &ms), 0);
	assert_int_equal(ms, 250);
	assert_int_equal(gf_parse_duration_ms("10s", &ms), 0);
	assert_int_equal(ms, 10000);
	assert_int_equal(gf_parse_duration_ms("2m", &ms), 0);
	assert_int_equal(ms, 120000);
	assert_int_equal(gf_parse_duration_ms("1h", &ms), 0);
	assert_int_equal(ms, 3600000);
	assert_int_equal(gf_parse_duration_ms("1m30s", &ms), 0);
	assert_int_equal(ms, 90000);
	assert_int_equal(gf_parse_duration_ms("1500us", &ms), 0);
	assert_int_equal(ms, 1);
	assert_int_equal(gf_parse_duration_ms("42", &ms), 0);
	assert_int_equal(ms, 42);
	static const char *bad[] = { "", "s", "-1s", "10x", "1.5s", "10 s", "99999999999999999999s",
				     "18446744073709551615h", "5s10" };
	for (size_t i = 0; i < GF_ARRAY_SIZE(bad); i++) {
		ms = 7;
		assert_int_equal(gf_parse_duration_ms(bad[i], &ms), GF_ERR_INVALID_ARG);
		assert_int_equal(ms, 7);
	}
}

static void test_errors(void **state)
{
	for (int e = 0; e >= GF_ERR_EVICTED; e--) {
		assert_non_null(gf_error_name(e));
		assert_string_not_equal(gf_strerror(e), "unknown error");
	}
	assert_null(gf_error_name(-1000));
	assert_string_equal(gf_strerror(-1000), "unknown error");
	assert_string_equal(gf_error_name(GF_ERR_STALE_LAYOUT), "GF_ERR_STALE_LAYOUT");
	assert_int_equal(gf_version_number(), GF_VERSION_NUMBER);
	assert_string_equal(gf_version(), GF_VERSION_STRING);
}

static int logged;
static void count_log(int level, const char *c, const char *msg, void *ud)
{
	(void)level;
	(void)c;
	(void)msg;
	(void)ud;
	logged++;
}

static void test_log_hook(void **state)
{
	gf_set_log_fn(count_log, NULL);
	gf_set_log_level(GF_LOG_WARN);
	gf_log(GF_LOG_DEBUG, "test", "dropped");
	gf_log(GF_LOG_ERR, "test", "kept %d", 1);
	assert_int_equal(logged, 1);
	gf_set_log_fn(NULL, NULL);
}

struct rec_line {
	int level;
	char msg[64];
	int64_t mono, wall, called_at;
};
static struct rec_line recs[64];
static int nrecs;

static void record_log(int level, const char *c, const char *msg, void *ud)
{
	(void)c;
	(void)ud;
	if (nrecs >= 64)
		return;
	struct rec_line *r = &recs[nrecs++];
	r->level = level;
	snprintf(r->msg, sizeof(r->msg), "%s", msg);
	gf_log_line_time(&r->mono, &r->wall);
	r->called_at = gf_now_us();
}

/* Held lines reach the hook only at the release, in order, each with the
 * time it was logged; a warning releases what was held before it; more
 * lines than the hold keeps go out rather than being dropped. */
static void test_log_hold(void **state)
{
	(void)state;
	nrecs = 0;
	gf_set_log_fn(record_log, NULL);
	gf_set_log_level(GF_LOG_DEBUG);
	int64_t t0 = gf_now_us();
	gf_log_hold();
	gf_log(GF_LOG_INFO, "test", "one");
	usleep(3000);
	gf_log(GF_LOG_DEBUG, "test", "two %d", 2);
	assert_int_equal(nrecs, 0);
	int64_t t1 = gf_now_us();
	gf_log_release();
	assert_int_equal(nrecs, 2);
	assert_string_equal(recs[0].msg, "one");
	assert_string_equal(recs[1].msg, "two 2");
	assert_int_equal(recs[1].level, GF_LOG_DEBUG);
	assert_true(recs[0].mono >= t0 && recs[1].mono <= t1);
	assert_true(recs[1].mono - recs[0].mono >= 3000);
	assert_true(recs[0].called_at >= t1);
	assert_true(recs[1].wall - recs[0].wall >= 2000);
	gf_log_release(); /* nothing held: a no-op */
	assert_int_equal(nrecs, 2);

	/* A warning goes out at once, after what was held; the hold ends. */
	nrecs = 0;
	gf_log_hold();
	gf_log(GF_LOG_INFO, "test", "before");
	gf_log(GF_LOG_WARN, "test", "warned");
	assert_int_equal(nrecs, 2);
	assert_string_equal(recs[0].msg, "before");
	assert_string_equal(recs[1].msg, "warned");
	gf_log(GF_LOG_INFO, "test", "after");
	assert_int_equal(nrecs, 3);

	/* Overflow: nothing is lost, and the order is kept. */
	nrecs = 0;
	gf_log_hold();
	for (int i = 0; i < 40; i++)
		gf_log(GF_LOG_INFO, "test", "line %d", i);
	gf_log_release();
	assert_int_equal(nrecs, 40);
	for (int i = 0; i < 40; i++) {
		char want[32];
		snprintf(want, sizeof(want), "line %d", i);
		assert_string_equal(recs[i].msg, want);
	}
	/* Outside a delivery the time is now. */
	int64_t mono, wall;
	gf_log_line_time(&mono, &wall);
	assert_true(mono >= t1 && mono <= gf_now_us());
	gf_set_log_fn(NULL, NULL);
}

static void *log_from_other_thread(void *arg)
{
	gf_log(GF_LOG_INFO, "test", "%s", (const char *)arg);
	return NULL;
}

static void *release_from_other_thread(void *arg)
{
	(void)arg;
	gf_log_release();
	return NULL;
}

/* The hold is its owner's: another thread's lines go out as usual, another
 * thread may release it (an engine may serve on another thread than the one
 * that waited), and a hold older than a second lets its owner's next line out. */
static void test_log_hold_threads(void **state)
{
	(void)state;
	nrecs = 0;
	gf_set_log_fn(record_log, NULL);
	gf_set_log_level(GF_LOG_INFO);
	gf_log_hold();
	gf_log(GF_LOG_INFO, "test", "mine");
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, log_from_other_thread, (void *)"theirs"), 0);
	pthread_join(t, NULL);
	assert_int_equal(nrecs, 1);
	assert_string_equal(recs[0].msg, "theirs");
	assert_int_equal(pthread_create(&t, NULL, release_from_other_thread, NULL), 0);
	pthread_join(t, NULL);
	assert_int_equal(nrecs, 2);
	assert_string_equal(recs[1].msg, "mine");
	gf_log(GF_LOG_INFO, "test", "after");
	assert_int_equal(nrecs, 3);

	nrecs = 0;
	gf_log_hold();
	gf_log(GF_LOG_INFO, "test", "early");
	usleep(1100000);
	gf_log(GF_LOG_INFO, "test", "late");
	assert_int_equal(nrecs, 2);
	assert_string_equal(recs[0].msg, "early");
	assert_string_equal(recs[1].msg, "late");
	gf_set_log_fn(NULL, NULL);
}

/* gf_log_stderr() writes held lines together, each with its own time. */
static void test_log_hold_stderr(void **state)
{
	(void)state;
	int p[2];
	assert_int_equal(pipe(p), 0);
	int saved = dup(2);
	assert_true(saved >= 0);
	assert_true(dup2(p[1], 2) >= 0);
	gf_set_log_fn(gf_log_stderr, (void *)"unit");
	gf_set_log_level(GF_LOG_INFO);
	int64_t t0 = gf_now_us();
	gf_log_hold();
	gf_log(GF_LOG_INFO, "test", "held a");
	usleep(2000);
	gf_log(GF_LOG_INFO, "test", "held b");
	int64_t t1 = gf_now_us();
	gf_log_release();
	gf_set_log_fn(NULL, NULL);
	assert_true(dup2(saved, 2) >= 0);
	close(saved);
	close(p[1]);
	char buf[4096];
	ssize_t n = read(p[0], buf, sizeof(buf) - 1);
	close(p[0]);
	assert_true(n > 0);
	buf[n] = '\0';
	char *a = strstr(buf, "held a"), *b = strstr(buf, "held b");
	assert_non_null(a);
	assert_non_null(b);
	assert_true(a < b);
	long long ma = strtoll(strstr(buf, "mono_us=") + 8, NULL, 10);
	long long mb = strtoll(strstr(a, "mono_us=") + 8, NULL, 10);
	assert_true(ma >= t0 && mb <= t1 && mb - ma >= 2000);
	assert_non_null(strstr(buf, "prog=unit level=info component=test held a\n"));
}

static void fmt(char *buf, size_t cap, const char *f, ...)
{
	va_list ap;
	va_start(ap, f);
	gf_log_vformat(buf, cap, f, ap);
	va_end(ap);
}

/* Log lines stay logfmt whatever their values hold. */
static void test_log_format(void **state)
{
	char b[256];
	fmt(b, sizeof(b), "msg=\"state file loaded\" path=%s epoch=%llu", "/run/gf/lock.state", 7ULL);
	assert_string_equal(b, "event=state_file_loaded msg=\"state file loaded\" path=/run/gf/lock.state epoch=7");
	fmt(b, sizeof(b), "msg=\"x\" path=%s id=%d", "/tmp/a b\"c=d", 3);
	assert_string_equal(b, "event=x msg=\"x\" path=\"/tmp/a b\\\"c=d\" id=3");
	fmt(b, sizeof(b), "event=lost error=\"%s\" n=%zu t=%.3f", "said \"no\"\nthen left\\", (size_t)2, 1.5);
	assert_string_equal(b, "event=lost error=\"said \\\"no\\\"\\nthen left\\\\\" n=2 t=1.500");
	fmt(b, sizeof(b), "event=e empty=%s free text %s", "", "a b");
	assert_string_equal(b, "event=e empty=\"\" free text a b");
	fmt(b, sizeof(b), "event=p pct=%d%% w=%5s|%-3d|%x", 5, "ab", 1, 255);
	assert_string_equal(b, "event=p pct=5% w=   ab|1  |ff");
	fmt(b, sizeof(b), "backend=host msg=\"a parked mapping could not be moved back\" error=%s", "EINVAL");
	assert_string_equal(b, "event=a_parked_mapping_could_not_be_moved_back backend=host msg=\"a parked mapping could not "
			       "be moved back\" error=EINVAL");
	fmt(b, sizeof(b), "wake: kept session to %s is gone", "unix:///g.sock"); /* free text: as written */
	assert_string_equal(b, "wake: kept session to unix:///g.sock is gone");
	fmt(b, sizeof(b), "event=s cut=%.*s w=%*d path=%s", 2, "abc", 3, 7, "a b");
	assert_string_equal(b, "event=s cut=ab w=  7 path=\"a b\"");
	fmt(b, sizeof(b), "engine=%s started pid=%d", "a", 7);
	assert_string_equal(b, "engine=a started pid=7");
	fmt(b, 12, "msg=\"long message\" v=%s", "x y");
	assert_int_equal(strlen(b), 11);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_uri_ok),       cmocka_unit_test(test_uri_bad),
		cmocka_unit_test(test_uri_listen_connect), cmocka_unit_test(test_duration), cmocka_unit_test(test_bytes),
		cmocka_unit_test(test_unhex),
		cmocka_unit_test(test_errors),       cmocka_unit_test(test_log_hook),
		cmocka_unit_test(test_log_hold),     cmocka_unit_test(test_log_hold_stderr),
		cmocka_unit_test(test_log_hold_threads), cmocka_unit_test(test_log_format),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
