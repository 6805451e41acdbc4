/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Integration with real processes: gf-gmsd, gms-engine helpers and gfctl,
 * killed with SIGKILL at the steps of the failure cases in docs/design.md.
 * Paths come from meson: GF_GMSD, GF_GMS_ENGINE, GF_GFCTL.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common.h"
#include "gpufailover.h"
#include "gmstest.h"
#include "testutil.h"

static char *dir;
static const char *gmsd_bin, *engine_bin, *gfctl_bin;
static const char *backend = "host";

struct proc {
	pid_t pid;
	int in;      /* its stdin */
	int out;     /* its stdout (engine) or stderr (gmsd) */
	char buf[8192];
	size_t len;
};

static void spawn(struct proc *p, char *const argv[], bool capture_stderr, const char *const *env)
{
	int in[2], out[2];
	assert_int_equal(pipe2(in, O_CLOEXEC), 0);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	p->pid = fork();
	assert_true(p->pid >= 0);
	if (p->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], capture_stderr ? 2 : 1);
		for (; env && *env; env += 2)
			setenv(env[0], env[1], 1);
		execv(argv[0], argv);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	p->in = in[1];
	p->out = out[0];
	p->len = 0;
}

/* Wait for a line containing @needle; returns a static copy of it, or fails the test. */
static const char *expect(struct proc *p, const char *needle, int timeout_ms)
{
	static char line[1024];
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	for (;;) {
		char *nl;
		while ((nl = memchr(p->buf, '\n', p->len))) {
			size_t n = (size_t)(nl - p->buf);
			snprintf(line, sizeof(line), "%.*s", (int)n, p->buf);
			memmove(p->buf, nl + 1, p->len - n - 1);
			p->len -= n + 1;
			if (strstr(line, needle))
				return line;
			if (strstr(line, "error=") && !strstr(needle, "error="))
				fail_msg("waiting for '%s', got '%s'", needle, line);
		}
		struct pollfd pf = {.fd = p->out, .events = POLLIN};
		int t = gf_poll_timeout_ms(deadline);
		if (t == 0 || poll(&pf, 1, t) <= 0)
			fail_msg("timed out waiting for '%s' from pid %d", needle, (int)p->pid);
		ssize_t r = read(p->out, p->buf + p->len, sizeof(p->buf) - 1 - p->len);
		if (r <= 0)
			fail_msg("pid %d ended before '%s'", (int)p->pid, needle);
		p->len += (size_t)r;
	}
}

static void send_line(struct proc *p)
{
	assert_int_equal(write(p->in, "go\n", 3), 3);
}

static int reap(struct proc *p, int timeout_ms)
{
	int st = 0;
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	while (waitpid(p->pid, &st, WNOHANG) == 0) {
		if (gf_now_us() > deadline) {
			kill(p->pid, SIGKILL);
			waitpid(p->pid, &st, 0);
			fail_msg("pid %d did not exit", (int)p->pid);
		}
		usleep(2000);
	}
	close(p->in);
	close(p->out);
	p->pid = 0;
	return st;
}

static void kill9(struct proc *p)
{
	kill(p->pid, SIGKILL);
	reap(p, 5000);
}

static void sock_uri(char *uri, size_t n, const char *name)
{
	snprintf(uri, n, "unix://%s/%s.sock", dir, name);
}

static void start_gmsd(struct proc *p, const char *uri)
{
	char *argv[] = {(char *)gmsd_bin, "--listen", (char *)uri, "--backend", (char *)backend, NULL};
	spawn(p, argv, true, NULL);
	expect(p, "msg=\"ready\"", 10000);
}

static void start_engine(struct proc *p, const char *uri, const char *mode, const char *extra)
{
	char *argv[32];
	int n = 0;
	static char buf[512];
	argv[n++] = (char *)engine_bin;
	argv[n++] = (char *)uri;
	argv[n++] = (char *)mode;
	argv[n++] = "--backend";
	argv[n++] = (char *)backend;
	snprintf(buf, sizeof(buf), "%s", extra ? extra : "");
	for (char *t = strtok(buf, " "); t && n < 31; t = strtok(NULL, " "))
		argv[n++] = t;
	argv[n] = NULL;
	spawn(p, argv, false, NULL);
}

static char *status(const char *uri)
{
	char *j;
	if (gf_gms_status_json(uri, 2000, &j) < 0)
		fail_msg("status %s: %s", uri, gf_error_detail());
	return j;
}

static int gfctl(const char *args)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "%s %s >/dev/null 2>&1", gfctl_bin, args);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Two engines race with RW_OR_RO: exactly one loads, the other maps the same memory. */
static void test_race_one_loads(void **state)
{
	(void)state;
	char uri[300];
	sock_uri(uri, sizeof(uri), "race");
	struct proc g, a, b;
	start_gmsd(&g, uri);
	start_engine(&a, uri, "rw_or_ro", "--allocs 4 --meta 50 --seed 49");
	start_engine(&b, uri, "rw_or_ro", "--allocs 4 --meta 50 --seed 49");
	const char *la = expect(&a, "granted=", 5000);
	bool a_rw = strstr(la, "granted=RW") != NULL;
	const char *lb = expect(&b, "granted=", 5000);
	bool b_rw = strstr(lb, "granted=RW") != NULL;
	assert_true(a_rw != b_rw);
	struct proc *w = a_rw ? &a : &b, *r = a_rw ? &b : &a;
	expect(w, "committed generation=1", 5000);
	expect(r, "mapped allocs=4 meta=50", 5000);
	expect(r, "verified allocs=4", 5000);
	char *j = status(uri);
	assert_non_null(strstr(j, "\"allocation_count\":4")); /* no second copy */
	assert_non_null(strstr(j, "\"generation\":1"));
	char want[64];
	snprintf(want, sizeof(want), "\"backend\":\"%s\"", backend);
	assert_non_null(strstr(j, want)); /* the server really runs the backend under test */
	free(j);
	assert_int_equal(reap(&a, 5000), 0);
	assert_int_equal(reap(&b, 5000), 0);
	/* gfctl: committed now; status and ping work */
	char args[512];
	snprintf(args, sizeof(args), "gms wait-committed --gms %s --timeout 2s", uri);
	assert_int_equal(gfctl(args), 0);
	snprintf(args, sizeof(args), "gms status --gms %s --json", uri);
	assert_int_equal(gfctl(args), 0);
	snprintf(args, sizeof(args), "gms status --gms %s", uri);
	assert_int_equal(gfctl(args), 0);
	snprintf(args, sizeof(args), "gms ping --gms %s", uri);
	assert_int_equal(gfctl(args), 0);
	/* clean SIGTERM */
	kill(g.pid, SIGTERM);
	int st = reap(&g, 5000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	struct stat sb;
	assert_int_not_equal(stat(uri + strlen("unix://"), &sb), 0);
	snprintf(args, sizeof(args), "gms ping --gms %s --timeout 200ms", uri);
	assert_int_equal(gfctl(args), 5);
}

/* The writer is SIGKILLed before commit: RW_ABORT, a waiting RW_OR_RO becomes the writer. */
static void test_writer_killed_before_commit(void **state)
{
	(void)state;
	char uri[300], args[512];
	sock_uri(uri, sizeof(uri), "abort");
	struct proc g, a, b;
	start_gmsd(&g, uri);
	snprintf(args, sizeof(args), "gms wait-committed --gms %s --timeout 200ms", uri);
	assert_int_equal(gfctl(args), 3); /* nothing committed yet: timeout exit code */
	start_engine(&a, uri, "rw_or_ro", "--allocs 3 --pause-before-commit --seed 10");
	expect(&a, "granted=RW", 5000);
	expect(&a, "loaded", 5000);
	start_engine(&b, uri, "rw_or_ro", "--allocs 2 --seed 20");
	/* B queues behind A's RW lock once it has connected (slower under ASan and load). */
	char *j = NULL;
	for (int i = 0; i < 500 && !(j && strstr(j, "\"waiters\":1")); i++) {
		free(j);
		usleep(10000);
		j = status(uri);
	}
	assert_non_null(strstr(j, "\"waiters\":1"));
	free(j);
	kill9(&a);
	expect(&b, "granted=RW", 5000);
	expect(&b, "committed generation=1", 5000);
	expect(&b, "verified allocs=2", 5000);
	j = status(uri);
	assert_non_null(strstr(j, "event=rw_abort"));
	assert_non_null(strstr(j, "\"allocation_count\":2"));
	free(j);
	assert_int_equal(reap(&b, 5000), 0);
	kill9(&g);
}

/* The GMS is SIGKILLed while an engine maps its memory: the lost hook fires at once. */
static void test_gms_killed_while_mapped(void **state)
{
	(void)state;
	char uri[300];
	sock_uri(uri, sizeof(uri), "lost");
	struct proc g, a, b;
	start_gmsd(&g, uri);
	start_engine(&a, uri, "rw", "--hold");
	expect(&a, "holding", 5000);
	start_engine(&b, uri, "ro", "--hold --timeout 2000");
	expect(&b, "holding", 5000);
	int64_t t0 = gf_now_us();
	kill9(&g);
	expect(&a, "lost err=GF_ERR_GMS_LOST", 2000);
	expect(&b, "lost err=GF_ERR_GMS_LOST", 2000);
	assert_true(gf_now_us() - t0 < 2000000);
	int st = reap(&a, 2000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 42);
	reap(&b, 2000);
}

/* Decision 6: the GMS crashes while engines sleep. A fresh GMS: remap times out. Another layout: STALE. */
static void test_gms_crash_during_sleep(void **state)
{
	(void)state;
	char uri[300];
	sock_uri(uri, sizeof(uri), "sleep");
	struct proc g, a, b, c;
	start_gmsd(&g, uri);
	start_engine(&a, uri, "rw_or_ro", "--sleep --remap-timeout 400 --allocs 3");
	expect(&a, "asleep", 5000);
	start_engine(&b, uri, "ro", "--sleep --remap-timeout 400 --timeout 2000");
	expect(&b, "verified allocs=3", 5000);
	expect(&b, "asleep", 5000);
	/* healthy wake first: same layout, same memory */
	send_line(&b);
	expect(&b, "awake", 5000);
	reap(&b, 5000);
	start_engine(&b, uri, "ro", "--sleep --remap-timeout 400 --timeout 2000");
	expect(&b, "asleep", 5000);

	kill9(&g);
	start_gmsd(&g, uri);
	send_line(&a);
	const char *l = expect(&a, "error=", 5000);
	assert_non_null(strstr(l, "error=GF_ERR_TIMEOUT"));
	long ms = atol(strstr(l, "ms=") + 3);
	assert_true(ms >= 300 && ms < 3000);
	reap(&a, 5000);
	/* another engine loads a different layout into the fresh GMS */
	start_engine(&c, uri, "rw_or_ro", "--allocs 5");
	expect(&c, "committed generation=1", 5000);
	reap(&c, 5000);
	send_line(&b);
	l = expect(&b, "error=", 5000);
	assert_non_null(strstr(l, "error=GF_ERR_STALE_LAYOUT"));
	reap(&b, 5000);
	kill9(&g);
}

/* Decision 5 steps 1-5 with real processes and two GMS. */
static void test_partial_commit_processes(void **state)
{
	(void)state;
	char u0[300], u1[300];
	sock_uri(u0, sizeof(u0), "pc0");
	sock_uri(u1, sizeof(u1), "pc1");
	struct proc g0, g1, a0, a1, b0, b1;
	start_gmsd(&g0, u0);
	start_gmsd(&g1, u1);
	/* Engine A (loader): device 0 commits, device 1 is still loading when A dies. */
	start_engine(&a0, u0, "rw_or_ro", "--hold --seed 1");
	expect(&a0, "holding", 5000);
	start_engine(&a1, u1, "rw_or_ro", "--pause-before-commit --seed 2");
	expect(&a1, "loaded", 5000);
	/* Engine B (follower) */
	start_engine(&b0, u0, "ro", "--hold --seed 1 --timeout 20000");
	expect(&b0, "holding", 5000);
	start_engine(&b1, u1, "ro", "--hold --seed 2 --timeout 20000");
	usleep(100000);
	/* 1. A crashes */
	kill9(&a0);
	kill9(&a1);
	char *j = status(u0);
	assert_non_null(strstr(j, "\"state\":\"RO\"")); /* B0 still reads; the commit persisted */
	free(j);
	usleep(50000);
	j = status(u1);
	assert_non_null(strstr(j, "event=rw_abort"));
	assert_non_null(strstr(j, "\"waiters\":1")); /* 2. B1 keeps waiting */
	free(j);
	/* 3. A restarts: RO where committed, RW where empty */
	start_engine(&a0, u0, "rw_or_ro", "--seed 1");
	expect(&a0, "granted=RO", 5000);
	expect(&a0, "verified", 5000);
	start_engine(&a1, u1, "rw_or_ro", "--seed 2");
	expect(&a1, "granted=RW", 5000);
	/* 4. A commits device 1: B1 gets RO */
	expect(&a1, "committed generation=1", 5000);
	expect(&b1, "granted=RO", 5000);
	expect(&b1, "verified", 5000);
	expect(&b1, "holding", 5000);
	/* 5. B never restarted: the same processes hold both devices */
	assert_int_equal(waitpid(b0.pid, NULL, WNOHANG), 0);
	assert_int_equal(waitpid(b1.pid, NULL, WNOHANG), 0);
	j = status(u0);
	assert_non_null(strstr(j, "\"generation\":1")); /* device 0 was never reloaded */
	free(j);
	reap(&a0, 5000);
	reap(&a1, 5000);
	close(b0.in);
	close(b1.in);
	assert_int_equal(reap(&b0, 5000), 0);
	assert_int_equal(reap(&b1, 5000), 0);
	kill9(&g0);
	kill9(&g1);
}

/* The example entrypoint runs one gf-gmsd per device and exits when any of them dies. */
static pid_t first_child(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
	for (int i = 0; i < 500; i++) {
		FILE *f = fopen(path, "re");
		long c = 0;
		if (f) {
			if (fscanf(f, "%ld", &c) != 1)
				c = 0;
			fclose(f);
		}
		if (c > 0)
			return (pid_t)c;
		usleep(10000);
	}
	fail_msg("no child of %d", (int)pid);
	return 0;
}

static void test_entrypoint(void **state)
{
	(void)state;
	const char *script = getenv("GF_GMSD_ENTRYPOINT");
	if (!script)
		skip();
	const char *env[] = {"GF_GMSD", gmsd_bin, "GF_GMS_SOCKET_DIR", dir, "GF_GMS_BACKEND", backend, NULL};
	/* one device: its gf-gmsd is killed -> the entrypoint exits non-zero */
	struct proc e;
	char *argv[] = {"/bin/bash", (char *)script, "0", NULL};
	spawn(&e, argv, true, env);
	char uri[300];
	sock_uri(uri, sizeof(uri), "gms-0");
	expect(&e, "msg=\"ready\"", 10000);
	assert_int_equal(gf_gms_ping(uri, 1000, NULL), 0);
	pid_t g = first_child(e.pid);
	kill(g, SIGKILL);
	int st = reap(&e, 5000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	/* SIGTERM stops all cleanly with status 0 */
	spawn(&e, argv, true, env);
	expect(&e, "msg=\"ready\"", 10000);
	kill(e.pid, SIGTERM);
	st = reap(&e, 5000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_int_not_equal(gf_gms_ping(uri, 200, NULL), 0);
	/* the tier settings reach each gf-gmsd, one directory per device */
	char warm[400], cold[400], want[420];
	snprintf(warm, sizeof(warm), "%s/warm", dir);
	snprintf(cold, sizeof(cold), "%s/cold", dir);
	const char *tier_env[] = {"GF_GMSD", gmsd_bin, "GF_GMS_SOCKET_DIR", dir, "GF_GMS_BACKEND", backend,
				  "GF_GMS_WARM_DIR", warm, "GF_GMS_COLD_DIR", cold, "GF_GMS_MIN_RESIDENT", "10m",
				  "GF_GMS_PIN", "1", NULL};
	spawn(&e, argv, true, tier_env);
	expect(&e, "no tier to restore from", 10000); /* both tiers kept, both empty */
	expect(&e, "msg=\"ready\"", 10000);
	char path[64], args[4096] = {0};
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)first_child(e.pid));
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(args, 1, sizeof(args) - 1, f);
	fclose(f);
	for (size_t i = 0; i < n; i++)
		if (!args[i])
			args[i] = ' ';
	snprintf(want, sizeof(want), "--warm %s/gms-0 ", warm);
	assert_non_null(strstr(args, want));
	snprintf(want, sizeof(want), "--cold %s/gms-0 ", cold);
	assert_non_null(strstr(args, want));
	assert_non_null(strstr(args, "--min-resident 10m "));
	assert_non_null(strstr(args, "--pin "));
	assert_null(strstr(args, "--demote-below-free"));
	kill(e.pid, SIGTERM);
	st = reap(&e, 5000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	/* a device that cannot start takes the others down */
	char *argv2[] = {"/bin/bash", (char *)script, "0", "7", NULL};
	spawn(&e, argv2, true, env);
	st = reap(&e, 10000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	assert_int_not_equal(gf_gms_ping(uri, 200, NULL), 0);
}

static void test_gmsd_cli(void **state)
{
	(void)state;
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "%s --help >/dev/null", gmsd_bin);
	assert_int_equal(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s --version | grep -q libgpufailover", gmsd_bin);
	assert_int_equal(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s --listen unix:///tmp/x.sock --oom-retry 5parsecs 2>/dev/null", gmsd_bin);
	assert_int_equal(WEXITSTATUS(system(cmd)), 2);
	snprintf(cmd, sizeof(cmd), "%s --listen tcp://127.0.0.1:1 --backend host 2>/dev/null", gmsd_bin);
	assert_int_equal(WEXITSTATUS(system(cmd)), 1);
	snprintf(cmd, sizeof(cmd), "%s 2>/dev/null", gmsd_bin);
	assert_int_equal(WEXITSTATUS(system(cmd)), 2);
	assert_int_equal(gfctl("gms status"), 2);
	assert_int_equal(gfctl("gms frobnicate --gms unix:///x"), 2);
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	gmsd_bin = getenv("GF_GMSD");
	engine_bin = getenv("GF_GMS_ENGINE");
	gfctl_bin = getenv("GF_GFCTL");
	if (argc > 1)
		backend = argv[1];
	if (!gmsd_bin || !engine_bin || !gfctl_bin) {
		fprintf(stderr, "set GF_GMSD, GF_GMS_ENGINE and GF_GFCTL\n");
		return 1;
	}
	dir = tu_tmpdir();
	const struct CMUnitTest all[] = {
		cmocka_unit_test(test_race_one_loads),
		cmocka_unit_test(test_writer_killed_before_commit),
		cmocka_unit_test(test_gms_killed_while_mapped),
		cmocka_unit_test(test_gms_crash_during_sleep),
		cmocka_unit_test(test_partial_commit_processes),
		cmocka_unit_test(test_gmsd_cli),
		cmocka_unit_test(test_entrypoint),
	};
	/* With another backend (cuda over the test driver), one representative scenario. */
	int rc;
	if (strcmp(backend, "host")) {
		const struct CMUnitTest one[] = {cmocka_unit_test(test_race_one_loads)};
		rc = tu_run_group_tests(one, NULL, NULL);
	} else {
		rc = tu_run_group_tests(all, NULL, NULL);
	}
	gt_rmtree(dir);
	free(dir);
	return rc;
}
