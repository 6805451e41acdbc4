/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Lock benchmarks (meson benchmark(), never a test):
 *  1. handoff latency: SIGKILL the holder -> the blocked waiter's grant
 *     returns, over many trials, against a flock(2) baseline measured in the
 *     same run with the same kill pattern. State file on /dev/shm (tmpfs).
 *  2. memory per idle waiter: server RSS and kernel slab growth with many
 *     connected waiters.
 * Prints human lines and one JSON line.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "wire.h"

static char dir[256], uri[300], state[300], flock_path[300];

static int cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static pid_t start_server(void)
{
	int p[2];
	if (pipe(p) < 0)
		exit(1);
	pid_t pid = fork();
	if (pid == 0) {
		gf_lockd *d;
		if (gf_lockd_new(&d) < 0 || gf_lockd_add_listen(d, uri) < 0 || gf_lockd_set_state_file(d, state) < 0 ||
		    gf_lockd_start(d) < 0) {
			fprintf(stderr, "bench: server: %s\n", gf_error_detail());
			_exit(1);
		}
		char c = 'r';
		if (write(p[1], &c, 1) != 1)
			_exit(1);
		gf_lockd_run(d);
		_exit(0);
	}
	close(p[1]);
	char c;
	if (read(p[0], &c, 1) != 1) {
		fprintf(stderr, "bench: server failed to start\n");
		exit(1);
	}
	close(p[0]);
	return pid;
}

/* A contender child: acquires (gf_lock or flock), reports the monotonic
 * time of the grant through @wfd, then waits to be killed. */
static pid_t contender(int use_flock, int wfd, int id)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	int64_t t;
	if (use_flock) {
		int fd = open(flock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0 || flock(fd, LOCK_EX) < 0)
			_exit(1);
	} else {
		char name[32];
		snprintf(name, sizeof(name), "w%d", id);
		gf_lock *l;
		struct gf_lock_grant g;
		if (gf_lock_new(&l, uri, name) < 0 || gf_lock_acquire(l, -1, &g) < 0) {
			fprintf(stderr, "bench: acquire: %s\n", gf_error_detail());
			_exit(1);
		}
	}
	t = gf_now_us();
	if (write(wfd, &t, sizeof(t)) != sizeof(t))
		_exit(1);
	for (;;)
		pause();
}

static int flock_waiter_blocked(void)
{
	FILE *f = fopen("/proc/locks", "r");
	char line[256];
	int n = 0;
	while (f && fgets(line, sizeof(line), f))
		if (strstr(line, "->") && strstr(line, "FLOCK"))
			n++;
	if (f)
		fclose(f);
	return n > 0;
}

static int lock_waiter_queued(int n)
{
	char *json;
	if (gf_lock_status_json(uri, NULL, 0, 1000, &json) < 0)
		return 0;
	char want[64];
	snprintf(want, sizeof(want), "\"waiter_count\":%d", n);
	int ok = strstr(json, want) != NULL;
	free(json);
	return ok;
}

static int read_time(int fd, int64_t *t)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, 10000) != 1)
		return -1;
	return read(fd, t, sizeof(*t)) == sizeof(*t) ? 0 : -1;
}

/* @trials handoffs; fills @lat (microseconds). */
static int handoffs(int use_flock, int trials, int64_t *lat)
{
	int p[2];
	if (pipe(p) < 0)
		return -1;
	int64_t t;
	pid_t holder = contender(use_flock, p[1], 0);
	if (read_time(p[0], &t) < 0)
		return -1;
	for (int i = 0; i < trials; i++) {
		pid_t waiter = contender(use_flock, p[1], i + 1);
		int64_t give_up = gf_now_us() + 5000000;
		while (!(use_flock ? flock_waiter_blocked() : lock_waiter_queued(1))) {
			if (gf_now_us() > give_up) {
				fprintf(stderr, "bench: waiter never queued\n");
				return -1;
			}
			usleep(200);
		}
		int64_t t0 = gf_now_us();
		kill(holder, SIGKILL);
		if (read_time(p[0], &t) < 0) {
			fprintf(stderr, "bench: waiter not granted\n");
			return -1;
		}
		lat[i] = t - t0;
		waitpid(holder, NULL, 0);
		holder = waiter;
	}
	kill(holder, SIGKILL);
	waitpid(holder, NULL, 0);
	close(p[0]);
	close(p[1]);
	return 0;
}

static long rss_kb(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	long v = -1;
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			v = atol(line + 6);
	if (f)
		fclose(f);
	return v;
}

static long meminfo_kb(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long v = -1;
	size_t kl = strlen(key);
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, key, kl) && line[kl] == ':')
			v = atol(line + kl + 1);
	if (f)
		fclose(f);
	return v;
}

/* A child that opens @n waiter connections and waits to be killed. */
static pid_t idle_waiters(int n, int wfd)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	struct gf_uri u;
	gf_uri_parse(uri, &u);
	gf_Msg *m = gf_msg_new();
	for (int i = 0; i < n; i++) {
		int fd;
		struct gf_frame_reader rd;
		gf_frame_reader_init(&rd, 0);
		if (gf_uri_connect(&u, gf_deadline_from_ms(5000), &fd) < 0 ||
		    gf_handshake_client(fd, &rd, gf_Component_COMPONENT_LOCK, "idle", NULL, 0, gf_deadline_from_ms(5000),
					NULL) < 0) {
			fprintf(stderr, "bench: idle waiter %d: %s\n", i, gf_error_detail());
			_exit(1);
		}
		gf_frame_reader_clear(&rd);
		memset(m, 0, sizeof(*m));
		m->which_body = gf_Msg_lock_acquire_tag;
		snprintf(m->body.lock_acquire.engine_id, sizeof(m->body.lock_acquire.engine_id), "idle-%d", i);
		m->body.lock_acquire.timeout_ms = -1;
		if (gf_msg_send(fd, m, NULL, 0, gf_deadline_from_ms(5000)) < 0)
			_exit(1);
	}
	char c = 'd';
	if (write(wfd, &c, 1) != 1)
		_exit(1);
	for (;;)
		pause();
}

int main(int argc, char **argv)
{
	int trials = argc > 1 ? atoi(argv[1]) : 500;
	int want_waiters = argc > 2 ? atoi(argv[2]) : 10000;
	if (trials < 1)
		trials = 500;
	signal(SIGPIPE, SIG_IGN);
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
	getrlimit(RLIMIT_NOFILE, &rl);
	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	snprintf(dir, sizeof(dir), "%s/gf-bench-XXXXXX", base);
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(uri, sizeof(uri), "unix://%s/lock.sock", dir);
	snprintf(state, sizeof(state), "%s/state.json", dir);
	snprintf(flock_path, sizeof(flock_path), "%s/flock", dir);

	pid_t server = start_server();
	int64_t *lat = calloc((size_t)trials, sizeof(int64_t)), *base_lat = calloc((size_t)trials, sizeof(int64_t));
	if (handoffs(0, trials, lat) < 0 || handoffs(1, trials, base_lat) < 0) {
		kill(server, SIGKILL);
		return 1;
	}
	qsort(lat, (size_t)trials, sizeof(int64_t), cmp64);
	qsort(base_lat, (size_t)trials, sizeof(int64_t), cmp64);
	int64_t med = lat[trials / 2], p99 = lat[(trials * 99) / 100 < trials ? (trials * 99) / 100 : trials - 1];
	int64_t bmed = base_lat[trials / 2],
		bp99 = base_lat[(trials * 99) / 100 < trials ? (trials * 99) / 100 : trials - 1];
	printf("handoff SIGKILL holder -> waiter granted, %d trials, state file on %s\n", trials, base);
	printf("  gf-lockd : median %lld us, p99 %lld us\n", (long long)med, (long long)p99);
	printf("  flock(2) : median %lld us, p99 %lld us\n", (long long)bmed, (long long)bp99);
	printf("  ratio    : median %.2fx, p99 %.2fx\n", (double)med / (double)(bmed ? bmed : 1),
	       (double)p99 / (double)(bp99 ? bp99 : 1));

	/* The server needs two fds per waiter (socket + pidfd), the client one. */
	long limit = (long)rl.rlim_cur;
	int n = want_waiters;
	if ((long)n * 2 + 200 > limit) {
		n = (int)((limit - 200) / 2);
		printf("memory: RLIMIT_NOFILE is %ld, scaling %d waiters down to %d\n", limit, want_waiters, n);
	}
	int p[2];
	if (pipe(p) < 0)
		return 1;
	pid_t holder = contender(0, p[1], 0);
	int64_t t;
	read_time(p[0], &t);
	usleep(100000);
	long rss0 = rss_kb(server), slab0 = meminfo_kb("Slab");
	int64_t t_start = gf_now_us();
	pid_t idle = idle_waiters(n, p[1]);
	char c;
	struct pollfd pp = { .fd = p[0], .events = POLLIN };
	int ok = poll(&pp, 1, 120000) == 1 && read(p[0], &c, 1) == 1;
	while (ok && !lock_waiter_queued(n) && gf_now_us() - t_start < 60000000)
		usleep(10000);
	long rss1 = rss_kb(server), slab1 = meminfo_kb("Slab");
	double per_rss = ok ? (double)(rss1 - rss0) * 1024.0 / n : -1;
	double per_slab = ok ? (double)(slab1 - slab0) * 1024.0 / n : -1;
	printf("memory per idle waiter (%d waiters): server RSS %.0f bytes, kernel slab %.0f bytes (system-wide, noisy)\n", n,
	       per_rss, per_slab);
	printf("{\"bench\":\"lock\",\"trials\":%d,\"handoff_median_us\":%lld,\"handoff_p99_us\":%lld,"
	       "\"flock_median_us\":%lld,\"flock_p99_us\":%lld,\"ratio_median\":%.3f,\"ratio_p99\":%.3f,"
	       "\"idle_waiters\":%d,\"idle_waiters_requested\":%d,\"rss_bytes_per_waiter\":%.1f,"
	       "\"slab_bytes_per_waiter\":%.1f,\"state_dir\":\"%s\"}\n",
	       trials, (long long)med, (long long)p99, (long long)bmed, (long long)bp99,
	       (double)med / (double)(bmed ? bmed : 1), (double)p99 / (double)(bp99 ? bp99 : 1), n, want_waiters, per_rss,
	       per_slab, base);
	kill(idle, SIGKILL);
	kill(holder, SIGKILL);
	kill(server, SIGKILL);
	waitpid(idle, NULL, 0);
	waitpid(holder, NULL, 0);
	waitpid(server, NULL, 0);
	char path[400];
	snprintf(path, sizeof(path), "%s/lock.sock", dir);
	unlink(path);
	unlink(state);
	snprintf(path, sizeof(path), "%s.lock", state);
	unlink(path);
	unlink(flock_path);
	rmdir(dir);
	free(lat);
	free(base_lat);
	return ok ? 0 : 1;
}
