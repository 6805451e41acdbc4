/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Lock benchmarks (meson benchmark(), never a test):
 *  1. handoff latency: SIGKILL the holder -> the blocked waiter's grant
 *     returns, in paired rounds, against two baselines measured in the same
 *     rounds with the same kill pattern:
 *       - flock(2): the kernel hands the lock over itself, with no server and
 *         nothing written;
 *       - a minimal lock server that does the same work as gf-lockd (the
 *         "relay" below: a plain C loop, not the library): it notices the
 *         holder's hangup, waits for the holder's process to exit, writes
 *         the state durably with the same steps (a temp file made ahead,
 *         write, fdatasync, rename, fsync of the directory) and tells the
 *         next waiter, without a wire protocol, tokens or proofs.
 *     Each round runs every mode's trials (the order rotates), so one slow
 *     stretch of a shared machine moves all sides; ratios are the median of
 *     the per-round ratios of medians, with their min and max. State files
 *     on /dev/shm (tmpfs).
 *     The killed holder's own exit is part of every hand-off, and it lasts
 *     longer the more pages the process has mapped (the exit unmaps them,
 *     and each fault of code maps up to 16 pages). A process that ran the
 *     lock client maps a few hundred pages of code more than one that only
 *     connected a socket or called flock(), and its death was seen 13-25 us
 *     later on the 2-vCPU test VM (a bare fork: 167 us from SIGKILL to its
 *     pidfd; after gf_lock_acquire(): 243 us), which no server can make up.
 *     So every contender, whatever its mode, first makes the same client
 *     request (a status request to gf-lockd): the holders die alike, and
 *     the modes differ in what their servers and waiters do.
 *  2. memory per idle waiter: server RSS and kernel slab growth with many
 *     connected waiters.
 * usage: bench-lock [TRIALS [WAITERS [ROUNDS]]]  (500 trials per mode over 7
 * rounds, 10000 waiters). Prints human lines and one JSON line.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "minlock.h"
#include "wire.h"

static char dir[256], uri[300], state[300], flock_path[300], relay_path[300];

enum mode { M_LOCK, M_FLOCK, M_RELAY, M_COUNT };
static const char *const mode_name[M_COUNT] = { "gf-lockd", "flock(2)", "minimal server" };
/* The relay writes one byte here each time it queues a waiter. */
static int relay_queued_fd = -1;

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

/*
 * The "minimal server" baseline, in plain C: one holder and a FIFO of
 * waiters on a unix socket; a grant is one byte. It does what gf-lockd must
 * do between a holder's death and the next grant (see the top of the file)
 * and nothing else.
 */
#define RELAY_MAX 64
enum { RT_LISTEN = 1, RT_HOLDER, RT_EXIT };
struct relay_peer {
	int fd, pidfd;
	pid_t pid;
};

/* The relay's address; its path was checked to fit at start. */
static struct sockaddr_un relay_addr(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	memcpy(a.sun_path, relay_path, strlen(relay_path) + 1);
	return a;
}

static void relay_watch(int ep, int fd, uint32_t events, uint64_t tag)
{
	struct epoll_event e = { .events = events, .data.u64 = tag };
	if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) < 0)
		_exit(1);
}

static void relay_main(int lfd, int qfd)
{
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (dirfd < 0 || ep < 0)
		_exit(1);
	int tmpfd = relay_prepare(dirfd);
	struct relay_peer holder = { -1, -1, 0 }, q[RELAY_MAX];
	int qhead = 0, qn = 0, exit_pidfd = -1;
	uint64_t epoch = 0;
	relay_watch(ep, lfd, EPOLLIN, RT_LISTEN);
	for (;;) {
		struct epoll_event evs[8];
		int n = epoll_wait(ep, evs, 8, -1);
		for (int i = 0; i < n; i++) {
			bool release = false;
			if (evs[i].data.u64 == RT_LISTEN) {
				int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
				struct ucred cr;
				socklen_t cl = sizeof(cr);
				if (cfd < 0 || getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || qn == RELAY_MAX)
					_exit(1);
				struct relay_peer w = { cfd, (int)syscall(SYS_pidfd_open, cr.pid, 0), cr.pid };
				if (w.pidfd < 0)
					_exit(1);
				q[(qhead + qn++) % RELAY_MAX] = w;
				if (holder.fd >= 0 || exit_pidfd >= 0) {
					char c = 'q';
					if (write(qfd, &c, 1) != 1)
						_exit(1);
				} else {
					release = true;
				}
			} else if (evs[i].data.u64 == RT_HOLDER) {
				release = relay_holder_closed(ep, &holder.fd, &holder.pidfd, &exit_pidfd, RT_EXIT);
			} else if (evs[i].data.u64 == RT_EXIT) {
				epoll_ctl(ep, EPOLL_CTL_DEL, exit_pidfd, NULL);
				close(exit_pidfd);
				exit_pidfd = -1;
				release = true;
			}
			if (release && qn > 0) {
				holder = q[qhead];
				qhead = (qhead + 1) % RELAY_MAX;
				qn--;
				char g = 'g';
				if (relay_store(dirfd, &tmpfd, ++epoch, holder.pid) < 0 || write(holder.fd, &g, 1) != 1)
					_exit(1);
				/* As gf-lockd does: the woken waiter most likely shares this
				 * CPU (a unix socket's wake-up is a sync one), so it runs
				 * before the next temp file is made, not after. */
				sched_yield();
				relay_watch(ep, holder.fd, EPOLLIN | EPOLLRDHUP, RT_HOLDER);
				tmpfd = relay_prepare(dirfd); /* the next store's temp file, off the path */
			}
		}
	}
}

static pid_t start_relay(void)
{
	int p[2], q[2];
	if (strlen(relay_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		fprintf(stderr, "bench: %s: path too long for a unix socket\n", relay_path);
		exit(1);
	}
	struct sockaddr_un a = relay_addr();
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (pipe(p) < 0 || pipe(q) < 0 || lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    listen(lfd, 128) < 0)
		exit(1);
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		close(q[0]);
		close(p[1]);
		relay_main(lfd, q[1]);
	}
	close(lfd);
	close(p[0]);
	close(p[1]);
	close(q[1]);
	relay_queued_fd = q[0];
	return pid;
}

/* A contender child: uses the lock client once (every mode alike, see the
 * top), acquires (gf_lock, flock or the relay), reports the monotonic time
 * of the grant through @wfd, then waits to be killed. */
static pid_t contender(enum mode mode, int wfd, int id)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	int64_t t;
	char *status;
	if (gf_lock_status_json(uri, NULL, 0, 5000, &status) < 0) {
		fprintf(stderr, "bench: status: %s\n", gf_error_detail());
		_exit(1);
	}
	free(status);
	if (mode == M_FLOCK) {
		int fd = open(flock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0 || flock(fd, LOCK_EX) < 0)
			_exit(1);
	} else if (mode == M_RELAY) {
		struct sockaddr_un a = relay_addr();
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		char g;
		if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || read(fd, &g, 1) != 1)
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

static int relay_waiter_queued(void)
{
	struct pollfd p = { .fd = relay_queued_fd, .events = POLLIN };
	char c;
	return poll(&p, 1, 0) == 1 && read(relay_queued_fd, &c, 1) == 1;
}

static int read_time(int fd, int64_t *t)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, 10000) != 1)
		return -1;
	return read(fd, t, sizeof(*t)) == sizeof(*t) ? 0 : -1;
}

/* @trials handoffs; fills @lat (microseconds). */
static int handoffs(enum mode mode, int trials, int64_t *lat)
{
	int p[2];
	if (pipe(p) < 0)
		return -1;
	int64_t t;
	pid_t holder = contender(mode, p[1], 0);
	if (read_time(p[0], &t) < 0)
		return -1;
	for (int i = 0; i < trials; i++) {
		pid_t waiter = contender(mode, p[1], i + 1);
		int64_t give_up = gf_now_us() + 5000000;
		while (!(mode == M_FLOCK ? flock_waiter_blocked()
			 : mode == M_RELAY ? relay_waiter_queued()
					   : lock_waiter_queued(1))) {
			if (gf_now_us() > give_up) {
				fprintf(stderr, "bench: %s: waiter never queued\n", mode_name[mode]);
				return -1;
			}
			usleep(200);
		}
		int64_t t0 = gf_now_us();
		kill(holder, SIGKILL);
		if (read_time(p[0], &t) < 0) {
			fprintf(stderr, "bench: %s: waiter not granted\n", mode_name[mode]);
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

static int64_t median64(int64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(int64_t), cmp64);
	return v[n / 2];
}

static int64_t p99_64(int64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(int64_t), cmp64);
	int i = (n * 99) / 100;
	return v[i < n ? i : n - 1];
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median, min and max of @n per-round ratios (sorts @r). */
static void ratio_stats(double *r, int n, double out[3])
{
	qsort(r, (size_t)n, sizeof(double), cmpd);
	out[0] = n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2;
	out[1] = r[0];
	out[2] = r[n - 1];
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

/* Everything the servers made, their temp files too, then the directory. */
static void remove_dir(void)
{
	static const char *const made[] = { "lock.sock", "state.json", "state.json.tmp", "state.json.lock",
					    "flock",     "relay.sock", "relay.state",    "relay.tmp" };
	for (size_t i = 0; i < sizeof(made) / sizeof(made[0]); i++) {
		char path[400];
		snprintf(path, sizeof(path), "%s/%s", dir, made[i]);
		unlink(path);
	}
	if (rmdir(dir) < 0)
		fprintf(stderr, "bench: %s left behind: %s\n", dir, strerror(errno));
}

int main(int argc, char **argv)
{
	int trials = argc > 1 ? atoi(argv[1]) : 500;
	int want_waiters = argc > 2 ? atoi(argv[2]) : 10000;
	int rounds = argc > 3 ? atoi(argv[3]) : 7;
	if (trials < 1)
		trials = 500;
	if (rounds < 1)
		rounds = 7;
	if (rounds > trials)
		rounds = trials;
	int per = trials / rounds; /* kills per mode per round */
	trials = per * rounds;
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
	snprintf(relay_path, sizeof(relay_path), "%s/relay.sock", dir);

	pid_t server = start_server();
	pid_t relay = start_relay();
	int64_t *lat[M_COUNT], *all[M_COUNT];
	double *ratio_flock = calloc((size_t)rounds, sizeof(double)), *ratio_relay = calloc((size_t)rounds, sizeof(double)),
	       *relay_flock = calloc((size_t)rounds, sizeof(double));
	for (int k = 0; k < M_COUNT; k++) {
		lat[k] = calloc((size_t)per, sizeof(int64_t));
		all[k] = calloc((size_t)trials, sizeof(int64_t));
	}
	int hrc = 0;
	for (int r = 0; r < rounds && hrc == 0; r++) {
		int64_t med[M_COUNT];
		for (int j = 0; j < M_COUNT && hrc == 0; j++) {
			enum mode k = (enum mode)((r + j) % M_COUNT); /* the order rotates round by round */
			hrc = handoffs(k, per, lat[k]);
			memcpy(all[k] + (size_t)r * per, lat[k], (size_t)per * sizeof(int64_t));
			med[k] = median64(lat[k], per);
		}
		if (hrc == 0) {
			ratio_flock[r] = (double)med[M_LOCK] / (double)(med[M_FLOCK] ? med[M_FLOCK] : 1);
			ratio_relay[r] = (double)med[M_LOCK] / (double)(med[M_RELAY] ? med[M_RELAY] : 1);
			relay_flock[r] = (double)med[M_RELAY] / (double)(med[M_FLOCK] ? med[M_FLOCK] : 1);
		}
	}
	if (hrc < 0) {
		kill(server, SIGKILL);
		kill(relay, SIGKILL);
		waitpid(server, NULL, 0);
		waitpid(relay, NULL, 0);
		remove_dir();
		return 1;
	}
	int64_t med = median64(all[M_LOCK], trials), p99 = p99_64(all[M_LOCK], trials);
	int64_t bmed = median64(all[M_FLOCK], trials), bp99 = p99_64(all[M_FLOCK], trials);
	int64_t rmed = median64(all[M_RELAY], trials), rp99 = p99_64(all[M_RELAY], trials);
	double rf[3], rr[3], fl[3];
	ratio_stats(ratio_flock, rounds, rf);
	ratio_stats(ratio_relay, rounds, rr);
	ratio_stats(relay_flock, rounds, fl);
	printf("handoff SIGKILL holder -> waiter granted, %d trials per side in %d paired rounds, state files on %s\n",
	       trials, rounds, base);
	printf("  gf-lockd       : median %lld us, p99 %lld us\n", (long long)med, (long long)p99);
	printf("  flock(2)       : median %lld us, p99 %lld us\n", (long long)bmed, (long long)bp99);
	printf("  minimal server : median %lld us, p99 %lld us (same exit wait and state write, no protocol)\n",
	       (long long)rmed, (long long)rp99);
	printf("  gf-lockd / flock(2)       : %.2fx [%.2f-%.2f] (median of per-round ratios [min-max]), p99 %.2fx\n", rf[0],
	       rf[1], rf[2], (double)p99 / (double)(bp99 ? bp99 : 1));
	printf("  gf-lockd / minimal server : %.2fx [%.2f-%.2f], p99 %.2fx\n", rr[0], rr[1], rr[2],
	       (double)p99 / (double)(rp99 ? rp99 : 1));
	printf("  minimal server / flock(2) : %.2fx [%.2f-%.2f] (what a server and its state write cost by themselves)\n",
	       fl[0], fl[1], fl[2]);

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
	pid_t holder = contender(M_LOCK, p[1], 0);
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
	printf("{\"bench\":\"lock\",\"trials\":%d,\"rounds\":%d,\"handoff_median_us\":%lld,\"handoff_p99_us\":%lld,"
	       "\"flock_median_us\":%lld,\"flock_p99_us\":%lld,\"ratio_median\":%.3f,\"ratio_min\":%.3f,"
	       "\"ratio_max\":%.3f,\"ratio_p99\":%.3f,\"relay_median_us\":%lld,\"relay_p99_us\":%lld,"
	       "\"relay_ratio_median\":%.3f,\"relay_ratio_min\":%.3f,\"relay_ratio_max\":%.3f,"
	       "\"relay_vs_flock_median\":%.3f,\"relay_vs_flock_min\":%.3f,\"relay_vs_flock_max\":%.3f,"
	       "\"idle_waiters\":%d,\"idle_waiters_requested\":%d,\"rss_bytes_per_waiter\":%.1f,"
	       "\"slab_bytes_per_waiter\":%.1f,\"state_dir\":\"%s\"}\n",
	       trials, rounds, (long long)med, (long long)p99, (long long)bmed, (long long)bp99, rf[0], rf[1], rf[2],
	       (double)p99 / (double)(bp99 ? bp99 : 1), (long long)rmed, (long long)rp99, rr[0], rr[1], rr[2], fl[0],
	       fl[1], fl[2], n, want_waiters, per_rss, per_slab, base);
	kill(idle, SIGKILL);
	kill(holder, SIGKILL);
	kill(server, SIGKILL);
	kill(relay, SIGKILL);
	waitpid(idle, NULL, 0);
	waitpid(holder, NULL, 0);
	waitpid(server, NULL, 0);
	waitpid(relay, NULL, 0);
	remove_dir();
	for (int k = 0; k < M_COUNT; k++) {
		free(lat[k]);
		free(all[k]);
	}
	free(ratio_flock);
	free(ratio_relay);
	free(relay_flock);
	return ok ? 0 : 1;
}
