/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Standby pool benchmark (meson benchmark(), never a test), with N standbys
 * (default 1,000) on one GPU:
 *  1. registration: connect + handshake + LockAcquire until the server lists
 *     all N waiters, per standby, with the pool declaration (GPU, memory, model)
 *     against plain waiters (today's acquire) measured in the same run;
 *  2. server memory per idle standby, both ways (RSS growth / N);
 *  3. time to evict: budget N on the GPU, one more standby registers, until
 *     the least recently Active one reads its GF_ERR_EVICTED; against a status
 *     round trip on the same server with the same N waiters.
 * Prints human lines and one JSON line.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "wire.h"

#define GPU "GPU-0a1b2c3d-0000-4000-8000-00000000000a"

static char dir[256], uri[300];

static int cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static pid_t start_server(uint32_t budget)
{
	int p[2];
	if (pipe(p) < 0)
		exit(1);
	pid_t pid = fork();
	if (pid == 0) {
		gf_lockd *d;
		if (gf_lockd_new(&d) < 0 || gf_lockd_add_listen(d, uri) < 0 ||
		    gf_lockd_set_max_standby_per_gpu(d, budget) < 0 || gf_lockd_start(d) < 0) {
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

static int waiter_count(void)
{
	char *json;
	if (gf_lock_status_json(uri, NULL, 0, 5000, &json) < 0)
		return -1;
	const char *p = strstr(json, "\"waiter_count\":");
	int n = p ? atoi(p + 15) : -1;
	free(json);
	return n;
}

/* Connect and handshake; the fd or -1. */
static int connect_peer(struct gf_uri *u)
{
	int fd;
	struct gf_frame_reader rd;
	gf_frame_reader_init(&rd, 0);
	if (gf_uri_connect(u, gf_deadline_from_ms(5000), &fd) < 0)
		return -1;
	int rc = gf_handshake_client(fd, &rd, gf_Component_COMPONENT_LOCK, "bench", NULL, 0, gf_deadline_from_ms(5000),
				     NULL);
	gf_frame_reader_clear(&rd);
	if (rc < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int send_acquire(gf_Msg *m, int fd, int i, int declare)
{
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_lock_acquire_tag;
	gf_LockAcquire *a = &m->body.lock_acquire;
	snprintf(a->engine_id, sizeof(a->engine_id), "standby-%d", i);
	a->timeout_ms = -1;
	if (declare) {
		a->gpus_count = 1;
		snprintf(a->gpus[0], sizeof(a->gpus[0]), "%s", GPU);
		a->wake_bytes = 8ull << 30;
		a->asleep_bytes = 1536ull << 20;
		snprintf(a->model, sizeof(a->model), "llama-3-8b");
	}
	return gf_msg_send(fd, m, NULL, 0, gf_deadline_from_ms(5000));
}

struct run {
	double reg_us, rss_bytes;
	int64_t evict_med, evict_p99, status_med, status_p99;
	int evictions;
};

/* N standbys (declared or plain) on a server with budget @budget; with @evictions, measure evictions after. */
static int run(int n, int declare, int evictions, struct run *out)
{
	pid_t server = start_server(declare ? (uint32_t)n : 0);
	struct gf_uri u;
	gf_uri_parse(uri, &u);
	gf_lock *holder;
	struct gf_lock_grant g;
	if (gf_lock_new(&holder, uri, "holder") < 0 || gf_lock_acquire(holder, 5000, &g) < 0) {
		fprintf(stderr, "bench: holder: %s\n", gf_error_detail());
		return -1;
	}
	int *fds = calloc((size_t)(n + evictions), sizeof(int));
	gf_Msg *m = gf_msg_new();
	usleep(100000);
	long rss0 = rss_kb(server);
	int64_t t0 = gf_now_us();
	for (int i = 0; i < n; i++) {
		fds[i] = connect_peer(&u);
		if (fds[i] < 0 || send_acquire(m, fds[i], i, declare) < 0) {
			fprintf(stderr, "bench: standby %d: %s\n", i, gf_error_detail());
			return -1;
		}
	}
	while (waiter_count() != n) {
		if (gf_now_us() - t0 > 120000000) {
			fprintf(stderr, "bench: standbys never all queued\n");
			return -1;
		}
		usleep(200);
	}
	out->reg_us = (double)(gf_now_us() - t0) / n;
	out->rss_bytes = (double)(rss_kb(server) - rss0) * 1024.0 / n;
	out->evictions = 0;
	if (evictions) {
		int64_t *ev = calloc((size_t)evictions, sizeof(int64_t)), *st = calloc((size_t)evictions, sizeof(int64_t));
		int probe = connect_peer(&u);
		struct gf_frame_reader rd;
		gf_frame_reader_init(&rd, 0);
		rd.max_body = GF_FRAME_MAX_BODY;
		for (int i = 0; i < evictions; i++) {
			/* Baseline: a status round trip on the same server. */
			memset(m, 0, sizeof(*m));
			m->which_body = gf_Msg_lock_status_request_tag;
			int64_t s0 = gf_now_us();
			if (gf_msg_send(probe, m, NULL, 0, gf_deadline_from_ms(5000)) < 0 ||
			    gf_msg_recv(&rd, probe, m, NULL, NULL, gf_deadline_from_ms(5000)) < 0)
				return -1;
			st[i] = gf_now_us() - s0;
			/* One more standby: the one waiting longest (never Active) is evicted. */
			int fd = connect_peer(&u);
			fds[n + i] = fd;
			int victim = fds[i];
			int64_t e0 = gf_now_us();
			if (fd < 0 || send_acquire(m, fd, n + i, 1) < 0)
				return -1;
			struct pollfd p = { .fd = victim, .events = POLLIN };
			if (poll(&p, 1, 10000) != 1)
				return -1;
			ev[i] = gf_now_us() - e0;
			struct gf_frame_reader vr;
			gf_frame_reader_init(&vr, 0);
			int rc = gf_msg_recv(&vr, victim, m, NULL, NULL, gf_deadline_from_ms(5000));
			gf_frame_reader_clear(&vr);
			if (rc < 0 || gf_msg_error_code(m) != GF_ERR_EVICTED) {
				fprintf(stderr, "bench: standby %d was not evicted: %s\n", i, gf_error_detail());
				return -1;
			}
			close(victim);
			fds[i] = -1;
			out->evictions++;
		}
		qsort(ev, (size_t)evictions, sizeof(*ev), cmp64);
		qsort(st, (size_t)evictions, sizeof(*st), cmp64);
		out->evict_med = ev[evictions / 2];
		out->evict_p99 = ev[(evictions * 99) / 100];
		out->status_med = st[evictions / 2];
		out->status_p99 = st[(evictions * 99) / 100];
		gf_frame_reader_clear(&rd);
		close(probe);
		free(ev);
		free(st);
	}
	for (int i = 0; i < n + evictions; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(fds);
	gf_msg_free(m);
	gf_lock_free(holder);
	kill(server, SIGKILL);
	waitpid(server, NULL, 0);
	return 0;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 1000;
	int evictions = argc > 2 ? atoi(argv[2]) : 200;
	if (n < 1 || evictions < 1 || evictions > n)
		return 2;
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
	if ((long)rl.rlim_cur < 2L * (n + evictions) + 200) {
		n = (int)((rl.rlim_cur - 200) / 2) - evictions;
		printf("RLIMIT_NOFILE is %ld: %d standbys\n", (long)rl.rlim_cur, n);
		if (n < evictions)
			return 1;
	}
	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(dir, sizeof(dir), "%s/gf-bench-pool-XXXXXX", base);
	if (!mkdtemp(dir))
		return 1;
	snprintf(uri, sizeof(uri), "unix://%s/lock.sock", dir);
	signal(SIGPIPE, SIG_IGN);
	struct run plain, pool;
	int ok = run(n, 0, 0, &plain) == 0 && run(n, 1, evictions, &pool) == 0;
	char path[400];
	snprintf(path, sizeof(path), "%s/lock.sock", dir);
	unlink(path);
	rmdir(dir);
	if (!ok)
		return 1;
	printf("%d standbys on one GPU\n", n);
	printf("  registration per standby: %.1f us declared, %.1f us plain (%.2fx)\n", pool.reg_us, plain.reg_us,
	       pool.reg_us / plain.reg_us);
	printf("  server memory per idle standby: %.0f bytes declared, %.0f bytes plain\n", pool.rss_bytes,
	       plain.rss_bytes);
	printf("  evict (one more registers -> the LRU standby reads GF_ERR_EVICTED), %d times: median %lld us, p99 %lld us\n",
	       pool.evictions, (long long)pool.evict_med, (long long)pool.evict_p99);
	printf("  status round trip, same server: median %lld us, p99 %lld us\n", (long long)pool.status_med,
	       (long long)pool.status_p99);
	printf("{\"bench\":\"pool\",\"standbys\":%d,\"evictions\":%d,\"reg_us_declared\":%.2f,\"reg_us_plain\":%.2f,"
	       "\"reg_ratio\":%.3f,\"rss_bytes_declared\":%.1f,\"rss_bytes_plain\":%.1f,\"evict_median_us\":%lld,"
	       "\"evict_p99_us\":%lld,\"status_median_us\":%lld,\"status_p99_us\":%lld,\"evict_vs_status\":%.3f}\n",
	       n, pool.evictions, pool.reg_us, plain.reg_us, pool.reg_us / plain.reg_us, pool.rss_bytes, plain.rss_bytes,
	       (long long)pool.evict_med, (long long)pool.evict_p99, (long long)pool.status_med, (long long)pool.status_p99,
	       (double)pool.evict_med / (double)(pool.status_med ? pool.status_med : 1));
	return 0;
}
