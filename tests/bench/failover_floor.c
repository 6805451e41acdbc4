/* SPDX-License-Identifier: Apache-2.0 */
/*
 * failover-floor: the baseline of the failover protocol (meson benchmark(),
 * never a test). The least work a failover that keeps this design's
 * guarantees does between the lock server seeing the active engine's
 * process exit and the standby's first answer reaching a waiting client,
 * in plain C with no library, no wire protocol, no logging and no thread:
 *
 *   lock server   sees the holder's connection close, waits for its process
 *                 to exit (pidfd), tells the next waiter it is next (one
 *                 byte), writes the state file durably (minlock.h: a temp
 *                 file made ahead, write, fdatasync, rename, fsync of the
 *                 directory) and grants: one byte carrying the listening
 *                 socket the clients wait on (SCM_RIGHTS);
 *   memory service  answers a one-byte wake request on the session the
 *                 standby kept open (the read lock and the layout check);
 *   standby       slept with its weights fenced (moved to a parking range
 *                 by mremap, an inaccessible placeholder at their address)
 *                 and its KV memfd made ahead; told it is next, it sends
 *                 the wake request, reads the grant, maps the KV memfd,
 *                 reads the answer, moves the weights back, accepts the
 *                 waiting connection, runs the C engine's own model
 *                 (examples/c-engine/model.c, 4 x 256 x 256) over them and
 *                 answers in plain HTTP;
 *   client        libcurl with the demo's options (a new connection per
 *                 request), the answer's arrival stamped as the demo does.
 *
 * Each run starts fresh processes, as the demo does: the lock server, the
 * memory service, a primary that serves a client for 300 ms (the demo's
 * --short), a standby that slept as long, then SIGKILL of the primary. The
 * same weights (1 MiB), KV size (16 MiB) and request shape as
 * `gf-failover-demo --short`.
 *
 * usage: failover-floor [RUNS]  (default 1). One JSON line per run:
 * protocol_us (the client has the answer - exit seen) and each step's time
 * after the exit was seen; exit status 1 when a run saw no failover (no
 * answer from the primary before the kill, or none from the standby after
 * it). tests/bench/report.py interleaves it with the demo's runs and
 * reports the demo's protocol time against it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <curl/curl.h>
#include <xxhash.h>

#include "minlock.h"
#include "model.h"

#define KV_BYTES (16u << 20)
#define SERVE_BEFORE_KILL_MS 300
#define RUN_TIMEOUT_US (30 * 1000000LL)

/* Steps, stamped by whichever process does them, on one shared page. */
enum step {
	S_SEEN,      /* lock server: the holder's process has exited */
	S_NEXT_SENT, /* lock server: the standby told it is next */
	S_GRANTED,   /* lock server: state written, grant sent */
	S_NEXT_READ, /* standby */
	S_WAKE_SENT,
	S_GRANT_READ,
	S_KV_BACKED,
	S_ANSWER_READ,
	S_UNFENCED,
	S_ACCEPTED,
	S_MODEL_DONE,
	S_ANSWER_SENT,
	S_CLIENT_HAS_IT, /* the client */
	S_COUNT
};
static const char *const step_name[S_COUNT] = {
	"seen", "next_sent", "granted", "next_read", "wake_sent", "grant_read", "kv_backed",
	"answer_read", "unfenced", "accepted", "model_done", "answer_sent", "client_has_it",
};
struct shared {
	_Atomic int64_t t[S_COUNT];
};
static struct shared *sh;
static char dir[256];

static void stamp(enum step s)
{
	atomic_store(&sh->t[s], gf_now_us());
}

static void die(const char *what)
{
	fprintf(stderr, "failover-floor: %s: %s\n", what, strerror(errno));
	_exit(1);
}

/* A child that dies with the benchmark. */
static pid_t child(void)
{
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0)
		prctl(PR_SET_PDEATHSIG, SIGKILL);
	return pid;
}

static int unix_listen(const char *name)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (snprintf(a.sun_path, sizeof(a.sun_path), "%s/%s", dir, name) >= (int)sizeof(a.sun_path)) {
		errno = ENAMETOOLONG;
		die(name);
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 16) < 0)
		die(name);
	return fd;
}

static int unix_connect(const char *name)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	/* Its length was checked when it was bound (unix_listen()). */
	if (snprintf(a.sun_path, sizeof(a.sun_path), "%s/%s", dir, name) >= (int)sizeof(a.sun_path))
		die(name);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die(name);
	return fd;
}

/* ---- the lock server: FIFO of waiters, exit wait, durable state, grant with the listener ---- */

enum { T_LISTEN = 1, T_HOLDER, T_EXIT };

static void watch(int ep, int fd, uint32_t events, uint64_t tag)
{
	struct epoll_event e = { .events = events, .data.u64 = tag };
	if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) < 0)
		die("epoll_ctl");
}

/* One byte, 'g', with room for one fd (SCM_RIGHTS): the grant, as sent and as received. */
struct grant_msg {
	char g;
	struct iovec iov;
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh;
};

static struct msghdr *grant_msg(struct grant_msg *m)
{
	m->g = 'g';
	m->iov = (struct iovec){ &m->g, 1 };
	m->mh = (struct msghdr){ .msg_iov = &m->iov, .msg_iovlen = 1, .msg_control = m->u.buf,
				 .msg_controllen = sizeof(m->u.buf) };
	return &m->mh;
}

static int send_grant(int fd, int listener)
{
	struct grant_msg m;
	struct msghdr *mh = grant_msg(&m);
	struct cmsghdr *c = CMSG_FIRSTHDR(mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &listener, sizeof(int));
	return sendmsg(fd, mh, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

static void lock_main(int lfd, int listener)
{
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (dirfd < 0 || ep < 0)
		die("lock server");
	int tmpfd = relay_prepare(dirfd);
	struct {
		int fd, pidfd;
		pid_t pid;
	} holder = { -1, -1, 0 }, q[4];
	int qn = 0, exit_pidfd = -1;
	uint64_t epoch = 0;
	watch(ep, lfd, EPOLLIN, T_LISTEN);
	for (;;) {
		struct epoll_event ev;
		if (epoll_wait(ep, &ev, 1, -1) != 1)
			continue;
		bool release = false;
		if (ev.data.u64 == T_LISTEN) {
			int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
			struct ucred cr;
			socklen_t cl = sizeof(cr);
			if (cfd < 0 || getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || qn == 4)
				die("lock server: accept");
			q[qn].fd = cfd;
			q[qn].pid = cr.pid;
			if ((q[qn].pidfd = (int)syscall(SYS_pidfd_open, cr.pid, 0)) < 0)
				die("pidfd_open");
			qn++;
			release = holder.fd < 0 && exit_pidfd < 0;
		} else if (ev.data.u64 == T_HOLDER) {
			release = relay_holder_closed(ep, &holder.fd, &holder.pidfd, &exit_pidfd, T_EXIT);
		} else if (ev.data.u64 == T_EXIT) {
			epoll_ctl(ep, EPOLL_CTL_DEL, exit_pidfd, NULL);
			close(exit_pidfd);
			exit_pidfd = -1;
			release = true;
		}
		if (!release || qn == 0)
			continue;
		bool takeover = epoch > 0;
		if (takeover)
			stamp(S_SEEN);
		holder.fd = q[0].fd;
		holder.pidfd = q[0].pidfd;
		holder.pid = q[0].pid;
		memmove(q, q + 1, (size_t)--qn * sizeof(q[0]));
		char n = 'n';
		/* Told first, so that its wake-up overlaps the state write. */
		if (takeover && write(holder.fd, &n, 1) != 1)
			die("lock server: next");
		if (takeover)
			stamp(S_NEXT_SENT);
		if (relay_store(dirfd, &tmpfd, ++epoch, holder.pid) < 0 || send_grant(holder.fd, listener) < 0)
			die("lock server: grant");
		if (takeover)
			stamp(S_GRANTED);
		watch(ep, holder.fd, EPOLLIN | EPOLLRDHUP, T_HOLDER);
		tmpfd = relay_prepare(dirfd); /* the next store's temp file, off the path */
	}
}

/* ---- the memory service: one byte answered per wake request, on kept sessions ---- */

static void gms_main(int lfd, const uint8_t layout[16])
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("memory service");
	watch(ep, lfd, EPOLLIN, (uint64_t)lfd);
	for (;;) {
		struct epoll_event ev;
		if (epoll_wait(ep, &ev, 1, -1) != 1)
			continue;
		int fd = (int)ev.data.u64;
		if (fd == lfd) {
			int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
			if (cfd >= 0)
				watch(ep, cfd, EPOLLIN, (uint64_t)cfd);
			continue;
		}
		uint8_t req[17];
		ssize_t n = read(fd, req, sizeof(req));
		if (n <= 0) {
			epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
			close(fd);
			continue;
		}
		/* The reader's layout against the committed one: same, or refused. */
		char ok = n == 17 && !memcmp(req + 1, layout, 16) ? 'o' : 'x';
		if (write(fd, &ok, 1) != 1)
			die("memory service: answer");
	}
}

/* ---- an engine: the primary (granted at once) or the standby (parked, told it is next) ---- */

struct weights {
	int fd;
	size_t size;
	void *gen; /* the generated model, copied into the memfd once */
	struct model layout;
	uint8_t hash[16];
};

static int recv_grant(int fd, int *listener)
{
	struct grant_msg m;
	struct msghdr *mh = grant_msg(&m);
	m.g = 0;
	if (recvmsg(fd, mh, MSG_CMSG_CLOEXEC) != 1 || m.g != 'g')
		return -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(mh);
	if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int)))
		return -1;
	memcpy(listener, CMSG_DATA(c), sizeof(int));
	return 0;
}

/* The model's tensors, rebased from the generated buffer onto the mapping at @base. */
static void rebase(struct model *dst, const struct weights *w, const void *base)
{
	*dst = w->layout;
	dst->t = malloc(w->layout.n * sizeof(*dst->t));
	if (!dst->t)
		die("malloc");
	for (size_t i = 0; i < w->layout.n; i++) {
		dst->t[i] = w->layout.t[i];
		dst->t[i].data = (const char *)base + ((const char *)w->layout.t[i].data - (const char *)w->gen);
	}
}

/* Read one request, answer it as gf-c-engine's /infer does (model, XXH64, JSON). */
static void answer(int c, const struct model *m, char id, uint64_t epoch, bool first)
{
	char req[2048];
	size_t got = 0;
	while (got < sizeof(req) - 1) {
		ssize_t n = read(c, req + got, sizeof(req) - 1 - got);
		if (n <= 0)
			return;
		got += (size_t)n;
		req[got] = 0;
		if (strstr(req, "\r\n\r\n"))
			break;
	}
	const char *s = strstr(req, "seed=");
	uint64_t seed = s ? strtoull(s + 5, NULL, 10) : 0;
	float *out;
	size_t len;
	if (model_infer(m, seed, &out, &len))
		die("model");
	if (first)
		stamp(S_MODEL_DONE);
	char body[512], head[256];
	int bl = snprintf(body, sizeof(body), "{\"result\":[%g,%g,%g,%g,%g,%g,%g,%g],\"checksum\":\"%016llx\","
			  "\"epoch\":%" PRIu64 ",\"engine\":\"engine-%c\",\"seed\":%" PRIu64 ",\"dim\":%zu}",
			  out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7],
			  (unsigned long long)XXH64(out, len * sizeof(float), 0), epoch, id, seed, len);
	free(out);
	int hl = snprintf(head, sizeof(head), "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
			  "Content-Length: %d\r\nConnection: close\r\n\r\n", bl);
	struct iovec iov[2] = { { head, (size_t)hl }, { body, (size_t)bl } };
	if (writev(c, iov, 2) < 0)
		return;
	if (first)
		stamp(S_ANSWER_SENT);
}

static void engine_main(const struct weights *w, char id, bool standby, int ready)
{
	/* Imported and mapped read-only, page tables filled, as a kept-handles wake leaves them. */
	uint8_t *at = mmap(NULL, w->size, PROT_READ, MAP_SHARED | MAP_POPULATE, w->fd, 0);
	int kv = memfd_create("kv", MFD_CLOEXEC); /* made ahead: it holds no memory until mapped and touched */
	if (at == MAP_FAILED || kv < 0 || ftruncate(kv, KV_BYTES) < 0)
		die("engine: weights");
	struct model m;
	rebase(&m, w, at);
	float *out;
	size_t len;
	if (model_infer(&m, 0, &out, &len)) /* warm: the first real answer runs warm code */
		die("engine: warm-up");
	free(out);
	uint8_t *park = NULL;
	if (standby) {
		/* Asleep: the weights fenced (moved away; a placeholder faults a stale pointer). */
		park = mmap(NULL, w->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (park == MAP_FAILED ||
		    mremap(at, w->size, w->size, MREMAP_MAYMOVE | MREMAP_FIXED, park) == MAP_FAILED ||
		    mmap(at, w->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
			die("engine: park");
	}
	int gms = unix_connect("gms.sock"), lock = unix_connect("lock.sock");
	char r = 'r';
	if (write(ready, &r, 1) != 1)
		die("engine: ready");
	uint8_t req[17] = { 'w' };
	memcpy(req + 1, w->hash, 16);
	char b;
	if (standby) {
		if (read(lock, &b, 1) != 1 || b != 'n')
			die("engine: next");
		stamp(S_NEXT_READ);
	}
	/* The wake's request goes out before the grant is read: the answer overlaps it. */
	if (write(gms, req, sizeof(req)) != sizeof(req))
		die("engine: wake request");
	if (standby)
		stamp(S_WAKE_SENT);
	int listener;
	if (recv_grant(lock, &listener) < 0)
		die("engine: grant");
	if (standby)
		stamp(S_GRANT_READ);
	void *kvm = mmap(NULL, KV_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, kv, 0);
	if (kvm == MAP_FAILED)
		die("engine: KV");
	if (standby)
		stamp(S_KV_BACKED);
	if (read(gms, &b, 1) != 1 || b != 'o')
		die("engine: wake refused");
	if (standby) {
		stamp(S_ANSWER_READ);
		if (mremap(park, w->size, w->size, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED)
			die("engine: unfence");
		stamp(S_UNFENCED);
	}
	for (bool first = standby;; first = false) {
		int c = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			die("engine: accept");
		}
		if (first)
			stamp(S_ACCEPTED);
		answer(c, &m, id, standby ? 2 : 1, first);
		close(c);
	}
}

/* ---- the client: libcurl, a new connection per request, as the demo's ---- */

struct client {
	int port;
	atomic_bool stop;
	atomic_int answers_a, answers_b;
};

struct body {
	char data[2048];
	size_t len;
	int64_t arrived_us; /* when the last bytes of the body came in, as the demo stamps it */
};

static size_t collect(char *p, size_t sz, size_t n, void *ud)
{
	struct body *b = ud;
	size_t k = sz * n;
	if (b->len + k >= sizeof(b->data))
		k = sizeof(b->data) - b->len - 1;
	memcpy(b->data + b->len, p, k);
	b->len += k;
	b->data[b->len] = '\0';
	b->arrived_us = gf_now_us();
	return sz * n;
}

static void *client_main(void *arg)
{
	struct client *c = arg;
	CURL *h = curl_easy_init();
	if (!h)
		die("curl_easy_init");
	curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
	curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 30000L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	for (uint64_t n = 0; !atomic_load(&c->stop); n++) {
		char url[128];
		snprintf(url, sizeof(url), "http://127.0.0.1:%d/infer?seed=%" PRIu64, c->port, n % 8);
		struct body b = { .len = 0 };
		curl_easy_setopt(h, CURLOPT_URL, url);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
		long code = 0;
		CURLcode res = curl_easy_perform(h);
		if (res == CURLE_OK)
			curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
		if (code != 200 || !strstr(b.data, "\"checksum\"")) {
			if (res == CURLE_COULDNT_CONNECT)
				usleep(200);
			continue; /* broken in flight by the kill: retried at once */
		}
		if (strstr(b.data, "\"engine\":\"engine-b\"")) {
			if (atomic_fetch_add(&c->answers_b, 1) == 0)
				atomic_store(&sh->t[S_CLIENT_HAS_IT], b.arrived_us);
		} else {
			atomic_fetch_add(&c->answers_a, 1);
		}
	}
	curl_easy_cleanup(h);
	return NULL;
}

/* ---- one run ---- */

static void wait_ready(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char r;
	if (poll(&p, 1, 10000) != 1 || read(fd, &r, 1) != 1) {
		errno = ETIMEDOUT;
		die("a process did not come up");
	}
}

static void reap(pid_t *pids, int n)
{
	for (int i = 0; i < n; i++)
		if (pids[i] > 0) {
			kill(pids[i], SIGKILL);
			waitpid(pids[i], NULL, 0);
		}
}

static void remove_dir(void)
{
	static const char *const names[] = { "lock.sock", "gms.sock", "relay.tmp", "relay.state" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char p[400];
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		unlink(p);
	}
	rmdir(dir);
}

static int run_once(int run, const struct weights *w)
{
	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(dir, sizeof(dir), "%s/gf-floor-XXXXXX", base);
	if (!mkdtemp(dir))
		die("mkdtemp");
	for (int i = 0; i < S_COUNT; i++)
		atomic_store(&sh->t[i], 0);
	/* The clients' port, owned by the lock server and handed over with each grant. */
	int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof(a);
	if (listener < 0 || bind(listener, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(listener, 128) < 0 ||
	    getsockname(listener, (struct sockaddr *)&a, &al) < 0)
		die("listener");
	int lfd = unix_listen("lock.sock"), gfd = unix_listen("gms.sock");
	int ready[2];
	if (pipe2(ready, O_CLOEXEC) < 0)
		die("pipe");
	pid_t pids[4] = { 0 };
	if ((pids[0] = child()) == 0)
		lock_main(lfd, listener);
	if ((pids[1] = child()) == 0)
		gms_main(gfd, w->hash);
	close(lfd);
	close(gfd);
	close(listener);
	if ((pids[2] = child()) == 0)
		engine_main(w, 'a', false, ready[1]);
	wait_ready(ready[0]);
	if ((pids[3] = child()) == 0)
		engine_main(w, 'b', true, ready[1]);
	wait_ready(ready[0]);
	struct client cl = { .port = ntohs(a.sin_port) };
	pthread_t th;
	if (pthread_create(&th, NULL, client_main, &cl))
		die("pthread_create");
	usleep(SERVE_BEFORE_KILL_MS * 1000);
	kill(pids[2], SIGKILL);
	waitpid(pids[2], NULL, 0);
	pids[2] = 0;
	int64_t end = gf_now_us() + RUN_TIMEOUT_US;
	/* Looked at every 10 ms, as the demo looks: a busier waiter would keep a CPU awake for the others. */
	while (atomic_load(&cl.answers_b) < 1 && gf_now_us() < end)
		usleep(10000);
	atomic_store(&cl.stop, true);
	pthread_join(th, NULL);
	reap(pids, 4);
	close(ready[0]);
	close(ready[1]);
	remove_dir();
	int64_t seen = atomic_load(&sh->t[S_SEEN]), has = atomic_load(&sh->t[S_CLIENT_HAS_IT]);
	if (!seen || !has || atomic_load(&cl.answers_a) < 1) {
		fprintf(stderr, "failover-floor: run %d: no failover seen (answers before %d, after %d)\n", run,
			atomic_load(&cl.answers_a), atomic_load(&cl.answers_b));
		return -1;
	}
	printf("{\"bench\":\"failover_floor\",\"run\":%d,\"protocol_us\":%" PRId64 ",\"steps_us\":{", run, has - seen);
	for (int i = 1; i < S_COUNT; i++) {
		int64_t t = atomic_load(&sh->t[i]);
		printf("%s\"%s\":%" PRId64, i > 1 ? "," : "", step_name[i], t ? t - seen : -1);
	}
	printf("}}\n");
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	char *end;
	long runs = argc > 1 ? strtol(argv[1], &end, 10) : 1;
	if (argc > 2 || (argc > 1 && (*end || runs < 1 || runs > 100000))) {
		fprintf(stderr, "usage: failover-floor [RUNS]  (RUNS 1..100000, default 1)\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		die("curl_global_init");
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		die("mmap");
	/* The weights, as the GMS holds them: one memfd with the C engine's generated model. */
	struct weights w = { .fd = memfd_create("weights", MFD_CLOEXEC) };
	if (w.fd < 0 || model_generate(&w.layout, 4, 256, &w.gen))
		die("weights");
	for (size_t i = 0; i < w.layout.n; i++)
		w.size = (size_t)((const char *)w.layout.t[i].data - (const char *)w.gen) + w.layout.t[i].nbytes > w.size
				 ? (size_t)((const char *)w.layout.t[i].data - (const char *)w.gen) + w.layout.t[i].nbytes
				 : w.size;
	size_t bytes = w.size;
	w.size = (w.size + 4095) / 4096 * 4096;
	if (ftruncate(w.fd, (off_t)w.size) < 0 || pwrite(w.fd, w.gen, bytes, 0) != (ssize_t)bytes)
		die("weights");
	/* The layout's identity (structure, not bytes), as the GMS compares it. */
	XXH128_hash_t h = XXH3_128bits(&w.size, sizeof(w.size));
	memcpy(w.hash, &h, sizeof(w.hash));
	int failed = 0;
	for (int r = 0; r < runs; r++)
		failed |= run_once(r, &w) < 0;
	model_clear(&w.layout);
	free(w.gen);
	close(w.fd);
	munmap(sh, sizeof(*sh));
	curl_global_cleanup();
	return failed;
}
