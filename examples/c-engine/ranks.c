/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ranks of gf-c-engine --ranks N (see ranks.h). The parent and each rank
 * talk in lines over a socketpair: the rank says "asleep" once its weights
 * are in the GMS and unmapped, the parent says "wake EPOCH", the rank answers
 * "awake CHECKSUM"; "error DETAIL" ends a rank. A rank ends when the parent's
 * end closes, or with the parent (PR_SET_PDEATHSIG); a GMS lost while it
 * serves ends it through its engine's loss policy.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <xxhash.h>

#include "ranks.h"

#define MAX_RANKS 16

struct rank {
	pid_t pid;
	int fd;
	bool reaped;
	char checksum[17];
};

struct ranks {
	int n; /* ranks, rank 0 (this process) included */
	struct rank r[MAX_RANKS];
	pthread_t watcher;
	bool watching;
	atomic_bool stopping;
	pthread_mutex_t mu;
	void (*on_death)(int rank, int status, void *ud);
	void *ud;
};

/* The last failure's detail (this process's calls come from one thread at a time). */
static char detail[512];

static int fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int rc, const char *fmt, ...)
{
	char buf[sizeof(detail)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	memcpy(detail, buf, sizeof(detail));
	return rc;
}

const char *ranks_error(void)
{
	return detail;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int fd, const char *fmt, ...)
{
	char line[600];
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (len < 0)
		return;
	if (len > (int)sizeof(line) - 2)
		len = (int)sizeof(line) - 2;
	line[len++] = '\n';
	for (int off = 0; off < len;) {
		ssize_t w = write(fd, line + off, (size_t)(len - off));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		off += (int)w;
	}
}

/* One line from @fd (without its newline) within @timeout_ms (< 0: no
 * bound). 0, or GF_ERR_CLOSED / GF_ERR_TIMEOUT / GF_ERR_IO. Lines are
 * short and one is answered before the next is asked, so one byte at a time
 * never reads past a line. */
static int read_line(int fd, char *buf, size_t len, int64_t timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	size_t n = 0;
	for (;;) {
		int wait = -1;
		if (deadline >= 0) {
			int64_t left = deadline - now_ms();
			if (left <= 0)
				return fail(GF_ERR_TIMEOUT, "no answer in time");
			wait = (int)left;
		}
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int rc = poll(&p, 1, wait);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0)
			return fail(GF_ERR_IO, "poll: %s", strerror(errno));
		if (rc == 0)
			continue;
		char c;
		ssize_t got = read(fd, &c, 1);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return fail(GF_ERR_CLOSED, "its connection closed (the rank is gone)");
		if (c == '\n') {
			buf[n] = '\0';
			return 0;
		}
		if (n + 1 < len)
			buf[n++] = c;
	}
}

/* XXH64 over every allocation of @gms, chained: the same bytes on every rank. */
static void checksum(gf_gms *gms, char out[17])
{
	uint64_t h = 0;
	for (size_t i = 0; i < gf_gms_alloc_count(gms); i++) {
		struct gf_gms_alloc_info a;
		if (gf_gms_alloc_at(gms, i, &a) == 0 && a.addr)
			h = XXH64((const void *)(uintptr_t)a.addr, a.size, h);
	}
	snprintf(out, 17, "%016" PRIx64, h);
}

static void __attribute__((noreturn)) rank_fail(int fd, const char *what, int rc)
{
	say(fd, "error %s: %s: %s", what, gf_error_name(rc) ? gf_error_name(rc) : "?", gf_error_detail());
	_exit(1);
}

/* Rank @i's share of the load: the rank engine has one device, index 0. */
struct rank_load {
	int rank;
	const struct ranks_config *cfg;
};

static int rank_load(gf_engine *e, int device, gf_gms *gms, void *userdata)
{
	(void)device;
	const struct rank_load *l = userdata;
	return l->cfg->load(e, l->rank, gms, l->cfg->load_ud);
}

/* Rank @i's engine: a rank engine of rank 0's, on its own GMS. */
static int rank_engine(gf_engine **out, int i, const char *uri, const struct ranks_config *cfg)
{
	gf_engine *e;
	int rc = gf_engine_new(&e);
	if (rc)
		return rc;
	rc = gf_engine_set_rank(e, cfg->id, i);
	if (!rc)
		rc = gf_engine_add_gms(e, uri);
	if (!rc)
		rc = gf_engine_set_role(e, cfg->role);
	/* The host backend has one "device", the machine's memory: each rank
	 * differs by its GMS, not by a device index. */
	if (!rc)
		rc = gf_engine_set_backend(e, GF_MEM_HOST);
	if (!rc)
		rc = gf_engine_set_init_timeout(e, cfg->init_ms);
	if (!rc)
		rc = gf_engine_set_remap_timeout(e, cfg->remap_ms);
	if (!rc && cfg->waking_ms > 0)
		rc = gf_engine_set_waking_timeout(e, cfg->waking_ms);
	if (!rc)
		rc = gf_engine_set_private_bytes(e, cfg->kv_bytes);
	if (rc) {
		gf_engine_free(e);
		return rc;
	}
	*out = e;
	return 0;
}

/* The body of rank @i: never returns. */
static void __attribute__((noreturn)) rank_main(int i, int fd, pid_t parent, const char *uri,
						const struct ranks_config *cfg)
{
	/* A rank does not outlive the engine: the parent's death kills it
	 * (and if the parent died before this line, leave now). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	gf_engine *e;
	int rc = rank_engine(&e, i, uri, cfg);
	if (rc)
		rank_fail(fd, "configure the rank engine", rc);
	struct rank_load l = { .rank = i, .cfg = cfg };
	rc = gf_engine_init_weights(e, rank_load, &l);
	if (rc)
		rank_fail(fd, "load or import", rc);
	rc = gf_engine_sleep(e);
	if (rc)
		rank_fail(fd, "sleep", rc);
	say(fd, "asleep");
	char line[64];
	unsigned long long epoch = 0;
	if (read_line(fd, line, sizeof(line), -1) || sscanf(line, "wake %llu", &epoch) != 1)
		_exit(0); /* the engine ended before waking this rank */
	rc = gf_engine_wake_as_rank(e, epoch);
	if (rc)
		rank_fail(fd, "wake (memory gate)", rc);
	rc = gf_engine_wake_up(e);
	if (rc)
		rank_fail(fd, "wake", rc);
	rc = gf_engine_serve(e, NULL, NULL);
	if (rc)
		rank_fail(fd, "serve", rc);
	char sum[17];
	checksum(gf_engine_gms(e, 0), sum);
	say(fd, "awake %s", sum);
	/* Serving until the engine ends: its end of the pair closes. */
	while (read_line(fd, line, sizeof(line), -1) == 0)
		;
	_exit(0);
}

int ranks_start(struct ranks **out, int n, const char *const *gms_uri, const struct ranks_config *cfg)
{
	if (n < 2 || n > MAX_RANKS)
		return fail(GF_ERR_INVALID_ARG, "ranks: 2..%d ranks, not %d", MAX_RANKS, n);
	struct ranks *r = calloc(1, sizeof(*r));
	if (!r)
		return fail(GF_ERR_NOMEM, "ranks: out of memory");
	r->n = n;
	pthread_mutex_init(&r->mu, NULL);
	pid_t self = getpid();
	for (int i = 1; i < n; i++) {
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
			ranks_free(r);
			return fail(GF_ERR_IO, "ranks: socketpair: %s", strerror(errno));
		}
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0) {
			close(sv[0]);
			close(sv[1]);
			ranks_free(r);
			return fail(GF_ERR_IO, "ranks: fork: %s", strerror(errno));
		}
		if (pid == 0) {
			close(sv[0]);
			for (int k = 1; k < i; k++)
				close(r->r[k].fd);
			rank_main(i, sv[1], self, gms_uri[i], cfg);
		}
		close(sv[1]);
		r->r[i].pid = pid;
		r->r[i].fd = sv[0];
		char msg[400];
		snprintf(msg, sizeof(msg), "event=rank_started rank=%d pid=%ld gms=%s", i, (long)pid, gms_uri[i]);
		gf_log_stderr(GF_LOG_INFO, "c-engine", msg, (void *)"gf-c-engine");
	}
	*out = r;
	return 0;
}

int ranks_pid(const struct ranks *r, int i)
{
	return r && i > 0 && i < r->n ? (int)r->r[i].pid : 0;
}

int ranks_count(const struct ranks *r)
{
	return r ? r->n : 1;
}

const char *ranks_checksum(const struct ranks *r, int i)
{
	return r && i > 0 && i < r->n ? r->r[i].checksum : "";
}

/* Rank @i's next line, which must start with @want. */
static int expect(struct ranks *r, int i, const char *want, int64_t timeout_ms, char *line, size_t len)
{
	int rc = read_line(r->r[i].fd, line, len, timeout_ms);
	if (rc) {
		char why[sizeof(detail)];
		memcpy(why, detail, sizeof(why));
		return fail(rc, "rank %d: %s", i, why);
	}
	if (strncmp(line, want, strlen(want)) != 0)
		return fail(GF_ERR_STATE, "rank %d: %.500s", i, line);
	return 0;
}

int ranks_wait_asleep(struct ranks *r)
{
	char line[600];
	for (int i = 1; i < r->n; i++) {
		int rc = expect(r, i, "asleep", -1, line, sizeof(line));
		if (rc)
			return rc;
	}
	return 0;
}

int ranks_wake(struct ranks *r, uint64_t epoch, int64_t timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;
	char line[600];
	for (int i = 1; i < r->n; i++)
		say(r->r[i].fd, "wake %" PRIu64, epoch);
	for (int i = 1; i < r->n; i++) {
		int64_t left = deadline - now_ms();
		int rc = expect(r, i, "awake ", left > 0 ? left : 0, line, sizeof(line));
		if (rc)
			return rc;
		snprintf(r->r[i].checksum, sizeof(r->r[i].checksum), "%.16s", line + 6);
	}
	return 0;
}

static void kill_all(struct ranks *r)
{
	for (int i = 1; i < r->n; i++)
		if (r->r[i].pid > 0 && !r->r[i].reaped)
			kill(r->r[i].pid, SIGKILL);
}

static void *watch_main(void *arg)
{
	struct ranks *r = arg;
	for (;;) {
		int status;
		pid_t pid = waitpid(-1, &status, 0);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid < 0)
			return NULL; /* no child left */
		int rank = -1;
		pthread_mutex_lock(&r->mu);
		for (int i = 1; i < r->n; i++)
			if (r->r[i].pid == pid) {
				r->r[i].reaped = true;
				rank = i;
			}
		pthread_mutex_unlock(&r->mu);
		if (rank < 0 || atomic_load(&r->stopping))
			continue;
		/* One rank is gone: the engine cannot serve a part of the
		 * model, so all of it goes, the other ranks first. */
		kill_all(r);
		r->on_death(rank, status, r->ud);
		return NULL;
	}
}

int ranks_watch(struct ranks *r, void (*fn)(int rank, int status, void *ud), void *ud)
{
	r->on_death = fn;
	r->ud = ud;
	if (pthread_create(&r->watcher, NULL, watch_main, r) != 0)
		return fail(GF_ERR_NOMEM, "ranks: cannot start the watcher thread");
	r->watching = true;
	return 0;
}

void ranks_free(struct ranks *r)
{
	if (!r)
		return;
	atomic_store(&r->stopping, true);
	pthread_mutex_lock(&r->mu);
	kill_all(r);
	pthread_mutex_unlock(&r->mu);
	if (r->watching) {
		pthread_join(r->watcher, NULL); /* it returns once no child is left */
	} else {
		for (int i = 1; i < r->n; i++)
			if (r->r[i].pid > 0)
				waitpid(r->r[i].pid, NULL, 0);
	}
	for (int i = 1; i < r->n; i++)
		if (r->r[i].fd > 0)
			close(r->r[i].fd);
	pthread_mutex_destroy(&r->mu);
	free(r);
}
