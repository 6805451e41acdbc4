/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock server's policy (docs/design.md, decisions 4, 8 and 10)
 * on the shared server core (lib/wire/server.h), which owns the sockets,
 * the handshake and the loop.
 *
 * The lock itself is: holder (a connection or nobody), a FIFO of waiters,
 * and three things that block grants (grant.h): a holder's process that
 * has not exited yet (exit wait), a reconnect window after a restart, and a
 * state file that could not be written. Closes only record what changed;
 * the core's settle step grants.
 * Its connections' replies and FIFO are server_conn.c, its standby pool
 * server_pool.c, what it reports (status, readiness, metrics) server_report.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "server_int.h"

static void flush_release_log(gf_lockd *d);
static void on_message(void *ctx, struct gf_srv_peer *p, gf_Msg *m, int *fds, size_t nfds);
static void on_ready(void *ctx, struct gf_srv_peer *p);
static void on_close(void *ctx, struct gf_srv_peer *p, const char *why);
static int64_t next_deadline(void *ctx);
static void on_timer(void *ctx, int64_t now);
static void settle(void *ctx);

static void exit_watch_fired(void *ctx, struct gf_srv_watch *w)
{
	gf_lockd *d = ctx;
	struct exit_proc *x = (struct exit_proc *)((char *)w - offsetof(struct exit_proc, w));
	if (x->fd < 0 || d->exit_left == 0)
		return;
	gf_srv_watch_del(d->srv, x->fd);
	gf_close(x->fd);
	x->fd = -1;
	if (--d->exit_left == 0)
		lockd_end_exit_wait(d, d->nexit > 1 ? "every process of the holder exited" : "holder process exited");
	else
		gf_log(GF_LOG_DEBUG, "lock", "msg=\"a process of the released holder exited\" id=%s pid=%u left=%zu",
		       d->exit_id, x->pid, d->exit_left);
}

int gf_lockd_new(gf_lockd **out)
{
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL out");
	gf_lockd *d = calloc(1, sizeof(*d));
	if (!d)
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	d->state_lock_fd = -1;
	d->state_dirfd = -1;
	d->state_next_fd = -1;
	d->reconnect_window_ms = 10000;
	d->exit_wait_ms = 10000;
	d->heartbeat_ms = 1000;
	d->detect_ms = 6000;
	for (size_t i = 0; i < GF_ARRAY_SIZE(d->exitp); i++) {
		d->exitp[i].fd = -1;
		d->exitp[i].w.fn = exit_watch_fired;
	}
	static const struct gf_srv_handlers h = {
		.on_ready = on_ready,
		.on_message = on_message,
		.on_close = on_close,
		.next_deadline = next_deadline,
		.on_timer = on_timer,
		.settle = settle,
	};
	const struct gf_srv_config cfg = {
		.name = "lock",
		.component = gf_Component_COMPONENT_LOCK,
		.want_pidfd = true,
		.max_body = GF_LOCK_MAX_FRAME, /* lock messages are tiny: refuse more before allocating */
		.max_fds = GF_LSN_MAX, /* a reclaiming holder hands its listeners back */
		.backlog = 1024,
		.peer_data_size = sizeof(struct conn),
	};
	d->msg = gf_msg_new();
	int rc = d->msg ? gf_lsn_new(&d->lsn) : GF_ERR_NOMEM;
	rc = rc == 0 ? gf_srv_new(&d->srv, &cfg, &h, d) : gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	if (rc < 0) {
		gf_lockd_free(d);
		return rc;
	}
	char sid[64];
	snprintf(sid, sizeof(sid), "gf-lockd/%s", gf_version());
	gf_srv_set_server_id(d->srv, sid);
	gf_srv_set_tcp_timeout(d->srv, d->detect_ms);
	*out = d;
	return 0;
}

void gf_lockd_free(gf_lockd *d)
{
	if (!d)
		return;
	/* A holder on record stays on record: a restarted server opens its
	 * reconnect window for it instead of handing the lock to a waiter. */
	if (d->holder)
		d->holder->role = R_NONE;
	d->holder = NULL;
	gf_srv_free(d->srv);
	for (size_t i = 0; i < d->nexit; i++)
		gf_close(d->exitp[i].fd);
	gf_close(d->state_lock_fd);
	gf_close(d->state_next_fd);
	gf_close(d->state_dirfd);
	free(d->state_name);
	free(d->state_tmpname);
	free(d->state_path);
	gf_msg_free(d->msg);
	free(d->seen);
	gf_lsn_free(d->lsn);
	free(d->metrics);
	free(d);
}

#define CHECK_CONFIG(d)                                                                   \
	do {                                                                              \
		if (!(d))                                                                 \
			return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL server");          \
		if (gf_srv_started((d)->srv))                                             \
			return gf_err(GF_ERR_STATE, "lockd: configure before gf_lockd_start()"); \
	} while (0)

int gf_lockd_add_listen(gf_lockd *d, const char *uri)
{
	CHECK_CONFIG(d);
	return gf_srv_add_listen(d->srv, uri, false);
}

int gf_lockd_add_listener(gf_lockd *d, const char *name, const char *uri)
{
	CHECK_CONFIG(d);
	return gf_lsn_add(d->lsn, name, uri);
}

int gf_lockd_add_listener_fd(gf_lockd *d, const char *name, int fd)
{
	CHECK_CONFIG(d);
	return gf_lsn_add_fd(d->lsn, name, fd);
}

int gf_lockd_set_state_file(gf_lockd *d, const char *path)
{
	CHECK_CONFIG(d);
	if (!path || !*path)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: empty state file path");
	char *p = strdup(path);
	if (!p)
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	free(d->state_path);
	d->state_path = p;
	return 0;
}

int gf_lockd_set_reconnect_window(gf_lockd *d, int64_t ms)
{
	CHECK_CONFIG(d);
	if (ms < 0 || ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: reconnect window %lldms outside 0..%lldms", (long long)ms,
			      (long long)GF_MAX_DURATION_MS);
	d->reconnect_window_ms = ms;
	return 0;
}

int gf_lockd_set_exit_wait_timeout(gf_lockd *d, int64_t ms)
{
	CHECK_CONFIG(d);
	if (ms < 0 || ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: exit-wait timeout %lldms outside 0..%lldms", (long long)ms,
			      (long long)GF_MAX_DURATION_MS);
	d->exit_wait_ms = ms;
	return 0;
}

int gf_lockd_add_allow_uid(gf_lockd *d, uint32_t uid)
{
	CHECK_CONFIG(d);
	return gf_srv_add_allow_uid(d->srv, uid);
}

int gf_lockd_set_secret(gf_lockd *d, const void *secret, size_t len)
{
	CHECK_CONFIG(d);
	return gf_srv_set_secret(d->srv, secret, len);
}

int gf_lockd_set_lease(gf_lockd *d, int64_t heartbeat_ms, int64_t detect_ms)
{
	CHECK_CONFIG(d);
	if (heartbeat_ms <= 0 || detect_ms <= 0 || detect_ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: heartbeat and detect timeout must be 1ms..%lldms",
			      (long long)GF_MAX_DURATION_MS);
	/* T_fence = T_detect/2 must still leave room for a heartbeat to arrive
	 * (T_fence >= 1.5 heartbeats), and the margin T_detect - T_fence covers
	 * one lost heartbeat plus scheduling delays. */
	if (detect_ms < 3 * heartbeat_ms)
		return gf_err(GF_ERR_INVALID_ARG,
			      "lockd: detect timeout %lldms must be at least 3 heartbeats (%lldms)",
			      (long long)detect_ms, (long long)(3 * heartbeat_ms));
	d->heartbeat_ms = heartbeat_ms;
	d->detect_ms = detect_ms;
	gf_srv_set_tcp_timeout(d->srv, detect_ms);
	return 0;
}

int gf_lockd_set_handshake_timeout(gf_lockd *d, int64_t ms)
{
	CHECK_CONFIG(d);
	return gf_srv_set_handshake_timeout(d->srv, ms);
}

/* ---- state ---- */

static const char *tok_short(const uint8_t *t, char *buf)
{
	gf_hex(t, 4, buf);
	return buf;
}

/* Create the next store's temp file now, off the grant's path (a grant
 * then writes, syncs and renames; creating the file was half its cost).
 * Best effort: without it the store creates the file itself. */
static void prepare_store(gf_lockd *d)
{
	if (d->state_path && d->state_next_fd < 0) {
		int fd = gf_lock_state_prepare(d->state_dirfd, d->state_tmpname);
		d->state_next_fd = fd >= 0 ? fd : -1;
	}
}

/* Persist d->rec. On failure grants stop until a retry succeeds. */
static int store(gf_lockd *d)
{
	if (!d->state_path)
		return 0;
	int rc = gf_lock_state_store_prepared(d->state_dirfd, d->state_name, d->state_tmpname, d->state_next_fd, &d->rec);
	d->state_next_fd = -1;
	if (rc < 0) {
		flush_release_log(d);
		gf_log(GF_LOG_ERR, "lock", "msg=\"cannot write the state file; holding grants\" path=%s error=\"%s\"",
		       d->state_path, gf_error_detail());
		d->store_failures++;
		d->store_retry_at = gf_now_us() + STORE_RETRY_US;
		return rc;
	}
	d->store_retry_at = 0;
	return 0;
}

static int load_state(gf_lockd *d)
{
	if (!d->state_path) {
		/* Without persistence, a restart must still not reuse epochs. */
		d->epoch = (uint64_t)gf_wall_us();
		gf_log(GF_LOG_WARN, "lock",
		       "msg=\"no state file configured: a restarted server cannot protect a live holder\" epoch_floor=%llu",
		       (unsigned long long)d->epoch);
		return 0;
	}
	char lockpath[4200];
	snprintf(lockpath, sizeof(lockpath), "%s.lock", d->state_path);
	/* The lock file outlives its server: there, an earlier server ran. */
	bool ran_before = access(lockpath, F_OK) == 0;
	d->state_lock_fd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (d->state_lock_fd < 0)
		return gf_err_errno(gf_errno_to_err(errno), errno, "lockd: open %s", lockpath);
	/* Held for the server's lifetime: two servers on one state file would
	 * each grant the lock. The kernel drops it when we die. */
	if (flock(d->state_lock_fd, LOCK_EX | LOCK_NB) < 0)
		return gf_err_errno(errno == EWOULDBLOCK ? GF_ERR_BUSY : GF_ERR_IO, errno,
				    "lockd: state file %s is in use by another lock server", d->state_path);
	int drc = gf_lock_state_open_dir(d->state_path, &d->state_dirfd, &d->state_name, &d->state_tmpname);
	if (drc < 0)
		return drc;
	struct gf_lock_state st;
	int rc = gf_lock_state_load(d->state_path, &st);
	if (rc < 0) {
		/* The wall clock in microseconds is above every epoch an earlier
		 * run of a correctly configured server handed out. */
		d->epoch = (uint64_t)gf_wall_us();
		gf_log(GF_LOG_ERR, "lock",
		       "msg=\"state file %s; no holder on record, epochs continue from the wall clock\" path=%s error=\"%s\" epoch_floor=%llu",
		       rc == GF_ERR_NOT_FOUND ? "missing" : "unreadable or corrupt", d->state_path,
		       gf_error_detail(), (unsigned long long)d->epoch);
		memset(&d->rec, 0, sizeof(d->rec));
		d->rec.epoch = d->epoch;
		/* A holder of the earlier run may still serve, and nobody can
		 * prove it: no grant for a quiet period as long as a reconnect
		 * window (decision 31). The holder's reclaim is refused (no record),
		 * so it ends itself meanwhile, and its listeners come free. */
		d->holder_may_listen = ran_before;
		if (ran_before && d->reconnect_window_ms > 0) {
			d->window = true;
			d->window_deadline = gf_now_us() + d->reconnect_window_ms * 1000;
			memset(&d->prev, 0, sizeof(d->prev));
			snprintf(d->prev.holder, sizeof(d->prev.holder), "%s", "(unknown: state file lost)");
			gf_log(GF_LOG_WARN, "lock", "msg=\"state file lost after an earlier run: no grant for a quiet period\" quiet_ms=%lld",
			       (long long)d->reconnect_window_ms);
		}
		return store(d) < 0 ? gf_err(GF_ERR_IO, "lockd: cannot write state file %s", d->state_path) : 0;
	}
	d->epoch = st.epoch;
	d->rec = st;
	if (st.has_holder && d->reconnect_window_ms > 0) {
		char t[9];
		d->window = true;
		d->window_deadline = gf_now_us() + d->reconnect_window_ms * 1000;
		d->prev = st;
		gf_log(GF_LOG_WARN, "lock",
		       "msg=\"holder on record: reconnect window open\" holder=%s epoch=%llu pid=%u token=%s window_ms=%lld",
		       st.holder, (unsigned long long)st.epoch, st.pid, tok_short(st.token, t),
		       (long long)d->reconnect_window_ms);
	} else if (st.has_holder) {
		d->holder_may_listen = true;
		gf_log(GF_LOG_WARN, "lock", "msg=\"holder on record presumed dead (no reconnect window)\" holder=%s epoch=%llu",
		       st.holder, (unsigned long long)st.epoch);
		d->rec.has_holder = false;
		if (store(d) < 0)
			return gf_err(GF_ERR_IO, "lockd: cannot write state file %s", d->state_path);
	} else {
		gf_log(GF_LOG_INFO, "lock", "msg=\"state file loaded\" epoch=%llu holder=none", (unsigned long long)st.epoch);
	}
	return 0;
}

int gf_lockd_start(gf_lockd *d)
{
	if (!d)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL server");
	if (gf_srv_started(d->srv))
		return gf_err(GF_ERR_STATE, "lockd: already started");
	int rc = load_state(d);
	if (rc < 0)
		return rc;
	/* A holder on record may still serve from the listeners: they come back with its reclaim. */
	rc = gf_lsn_open(d->lsn, d->window || d->holder_may_listen);
	if (rc < 0)
		return rc;
	/* Without a window to wait for, a busy listener is bound once its old holder lets go. */
	if (!d->window && gf_lsn_pending(d->lsn) > 0)
		d->lsn_retry_at = gf_now_us() + GF_LSN_RETRY_US;
	rc = gf_srv_start(d->srv);
	if (rc < 0)
		return rc;
	d->started_at = gf_now_us();
	return 0;
}

int gf_lockd_get_fd(const gf_lockd *d)
{
	return d ? gf_srv_get_fd(d->srv) : gf_err(GF_ERR_INVALID_ARG, "lockd: NULL server");
}

int gf_lockd_get_timeout_ms(const gf_lockd *d)
{
	return d ? gf_srv_get_timeout_ms(d->srv) : -1;
}

int gf_lockd_process(gf_lockd *d)
{
	if (!d)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL server");
	return gf_srv_process(d->srv, 0);
}

int gf_lockd_run(gf_lockd *d)
{
	if (!d)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL server");
	return gf_srv_run(d->srv);
}

void gf_lockd_stop(gf_lockd *d)
{
	if (d)
		gf_srv_stop(d->srv);
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

static int64_t next_deadline(void *ctx)
{
	const gf_lockd *d = ctx;
	int64_t t = INT64_MAX;
	if (d->window)
		t = min64(t, d->window_deadline);
	if (d->exit_left)
		t = min64(t, d->exit_deadline);
	if (d->store_retry_at)
		t = min64(t, d->store_retry_at);
	if (d->lsn_retry_at)
		t = min64(t, d->lsn_retry_at);
	if (d->prep_at)
		t = min64(t, d->prep_at);
	for (struct gf_srv_peer *p = gf_srv_next_peer(d->srv, NULL); p; p = gf_srv_next_peer(d->srv, p)) {
		const struct conn *c = p->data;
		if (c->role == R_WAITER)
			t = min64(t, c->wait_deadline);
		if (p->tcp && p->ready) {
			t = min64(t, c->next_hb);
			t = min64(t, p->last_heard + d->detect_ms * 1000);
		}
	}
	return t;
}

/* ---- connections ---- */

static bool pidfd_exited(int pidfd)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };
	return poll(&p, 1, 0) == 1;
}

/*
 * A process that was killed closes its files before it is reaped: the
 * socket's hangup often wakes us a few microseconds before its pidfd turns
 * readable. Looking again for a short, bounded moment (yielding the CPU to
 * the exiting process) saves a second epoll round and wake-up on most
 * handoffs; a holder that is really still alive costs this once.
 */
#define EXIT_SPIN_US 200
/* How long after a grant the next grant's token, proof and temp file wait. */
#define PREP_DELAY_US 5000
static bool pidfd_exited_soon(int pidfd)
{
	int64_t until = gf_now_us() + EXIT_SPIN_US;
	for (;;) {
		if (pidfd_exited(pidfd))
			return true;
		if (gf_now_us() >= until)
			return false;
		sched_yield();
	}
}

static void finish_release(gf_lockd *d, const char *why)
{
	uint32_t pid = d->rec.pid;
	d->rec.has_holder = false;
	d->rec.pid = 0;
	d->release_unsaved = true;
	/* Logged once the next grant is sent (or none can be): with a log
	 * function installed (gf-lockd: stderr) the line is a write(2) that
	 * need not delay the next holder. Same order, same content. */
	if (gf_log_enabled(GF_LOG_INFO)) {
		struct release_log *r = &d->release_log;
		r->pending = true;
		snprintf(r->id, sizeof(r->id), "%s", d->rec.holder);
		r->epoch = d->rec.epoch;
		r->pid = pid;
		snprintf(r->why, sizeof(r->why), "%s", why);
		r->seen_us = gf_now_us();
	}
}

static void flush_release_log(gf_lockd *d)
{
	struct release_log *r = &d->release_log;
	if (!r->pending)
		return;
	r->pending = false;
	gf_log(GF_LOG_INFO, "lock", "msg=\"released\" id=%s epoch=%llu pid=%u reason=\"%s\" seen_mono_us=%lld", r->id,
	       (unsigned long long)r->epoch, r->pid, r->why, (long long)r->seen_us);
}

/* The release's line, then the grant's: same order and content as when
 * they were written at the grant, only after the new holder ran. */
static void flush_grant_log(gf_lockd *d)
{
	flush_release_log(d);
	struct grant_log *g = &d->grant_log;
	if (!g->pending)
		return;
	g->pending = false;
	const char *what = g->reclaimed ? "reclaimed" : "granted";
	gf_log(GF_LOG_INFO, "lock", "event=%s msg=\"%s\" id=%s epoch=%llu pid=%u transport=%s send_mono_us=%lld", what,
	       what, g->id, (unsigned long long)g->epoch, g->pid, g->tcp ? "tcp" : "unix", (long long)g->send_at);
}

void lockd_end_exit_wait(gf_lockd *d, const char *why)
{
	for (size_t i = 0; i < d->nexit; i++) {
		struct exit_proc *x = &d->exitp[i];
		if (x->fd >= 0) {
			gf_srv_watch_del(d->srv, x->fd);
			gf_close(x->fd);
			x->fd = -1;
		}
	}
	d->nexit = 0;
	d->exit_left = 0;
	finish_release(d, why);
}

static void close_pids(struct conn *c)
{
	for (size_t i = 0; i < c->npids; i++)
		gf_close(c->pids[i].fd);
	free(c->pids);
	c->pids = NULL;
	c->npids = 0;
}

/* Add @fd (taken) to the exit wait unless its process is gone already; false when it could not be watched. */
static bool exit_wait_add(gf_lockd *d, int fd, uint32_t pid, bool in_loop)
{
	if (pidfd_exited(fd)) {
		if (in_loop)
			gf_srv_watch_del(d->srv, fd);
		gf_close(fd);
		return true;
	}
	struct exit_proc *x = &d->exitp[d->nexit];
	int rc = in_loop ? gf_srv_watch_mod(d->srv, fd, &x->w) : gf_srv_watch_add(d->srv, fd, &x->w);
	if (rc < 0) {
		if (in_loop)
			gf_srv_watch_del(d->srv, fd);
		gf_close(fd);
		return false;
	}
	x->fd = fd;
	x->pid = pid;
	d->nexit++;
	d->exit_left++;
	return true;
}

/*
 * The holder's connection is going away (closed, released, lost, or its
 * process exited). Unless it released on purpose (or was revoked), the next
 * grant waits until its process and every process it registered
 * (LockAddPids: the engine's other ranks) have exited.
 */
void lockd_holder_gone(gf_lockd *d, struct conn *c, const char *why, enum exit_wait_mode mode)
{
	struct gf_srv_peer *p = c->peer;
	lockd_pool_active_now(d, c);
	d->holder = NULL;
	c->role = R_NONE;
	bool self = mode == WAIT_ALL && p->pidfd >= 0 && !pidfd_exited_soon(p->pidfd);
	if (mode == WAIT_NONE || d->exit_wait_ms == 0 || (!self && c->npids == 0)) {
		/* A closing connection's pidfd leaves the loop with its socket, after the next grant. */
		if (c->pid_watched && p->fd >= 0) {
			gf_srv_watch_del(d->srv, p->pidfd);
			c->pid_watched = false;
		}
		close_pids(c);
		finish_release(d, why);
		return;
	}
	d->nexit = d->exit_left = 0;
	d->exit_pid = p->pid;
	snprintf(d->exit_id, sizeof(d->exit_id), "%s", c->peer->id);
	d->exit_deadline = gf_now_us() + d->exit_wait_ms * 1000;
	bool watched = true;
	if (self) {
		int fd = p->pidfd;
		p->pidfd = -1;
		/* The holder's pidfd is normally in the loop already: retarget it
		 * (one syscall) instead of removing and adding it again. */
		watched = exit_wait_add(d, fd, p->pid, c->pid_watched);
		c->pid_watched = false;
	} else if (c->pid_watched && p->fd >= 0) {
		gf_srv_watch_del(d->srv, p->pidfd);
		c->pid_watched = false;
	}
	for (size_t i = 0; i < c->npids; i++) {
		watched = exit_wait_add(d, c->pids[i].fd, c->pids[i].pid, false) && watched;
		c->pids[i].fd = -1;
	}
	close_pids(c);
	if (!watched) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"cannot watch the holder's processes; releasing on socket close\" error=\"%s\"",
		       gf_error_detail());
		lockd_end_exit_wait(d, why);
		return;
	}
	if (d->exit_left == 0) {
		lockd_end_exit_wait(d, why);
		return;
	}
	char pids[128] = "";
	size_t off = 0;
	for (size_t i = 0; i < d->nexit && off < sizeof(pids) - 12; i++)
		if (d->exitp[i].fd >= 0)
			off += (size_t)snprintf(pids + off, sizeof(pids) - off, "%s%u", off ? "," : "", d->exitp[i].pid);
	gf_log(GF_LOG_INFO, "lock",
	       "msg=\"holder disconnected; waiting for its %s to exit\" id=%s epoch=%llu pid=%u processes=%zu pids=%s reason=\"%s\"",
	       d->exit_left == 1 ? "process" : "processes", c->peer->id, (unsigned long long)d->epoch, p->pid,
	       d->exit_left, pids, why);
}

static void on_close(void *ctx, struct gf_srv_peer *p, const char *why)
{
	gf_lockd *d = ctx;
	struct conn *c = p->data;
	if (!c->peer)
		return; /* never finished its handshake */
	lockd_waiter_unlink(d, c);
	if (c->role == R_HOLDER)
		lockd_holder_gone(d, c, why, WAIT_ALL);
	close_pids(c);
	c->pid_watched = false; /* the core removes the pidfd with the socket */
	free(c->decl);
	c->decl = NULL;
}

/* Is the fence proof a status request carries the current holder's (gf_lock_grant_proof())? */
static bool proof_valid(gf_lockd *d, const gf_LockStatusRequest *r)
{
	if (!d->holder || !d->rec.has_holder || r->proof_epoch != d->rec.epoch || r->proof.size != GF_LOCK_PROOF_LEN)
		return false;
	struct gf_lock_grant g = { .epoch = d->rec.epoch };
	memcpy(g.session_token, d->rec.token, sizeof(g.session_token));
	struct gf_lock_proof want;
	return gf_lock_grant_proof(&g, &want) == 0 && CRYPTO_memcmp(want.token, r->proof.bytes, GF_LOCK_PROOF_LEN) == 0;
}

void lockd_fill_status(gf_lockd *d, gf_LockStatus *s)
{
	int64_t now = gf_now_us();
	memset(s, 0, sizeof(*s));
	if (d->holder) {
		snprintf(s->holder, sizeof(s->holder), "%s", d->holder->peer->id);
		s->holder_pid = d->holder->peer->pid;
	}
	s->epoch = d->epoch;
	s->granted_at_us = d->holder ? d->granted_at_wall : 0;
	for (struct conn *w = d->whead; w && s->waiters_count < GF_ARRAY_SIZE(s->waiters); w = w->wnext) {
		gf_LockWaiter *o = &s->waiters[s->waiters_count++];
		snprintf(o->engine_id, sizeof(o->engine_id), "%s", w->peer->id);
		o->since_us = w->since_wall;
		o->pid = w->peer->pid;
	}
	s->waiter_count = (uint32_t)d->nwaiters;
	s->reconnect_window = d->window;
	if (d->window) {
		s->reconnect_window_left_ms = (d->window_deadline - now) / 1000;
		snprintf(s->previous_holder, sizeof(s->previous_holder), "%s", d->prev.holder);
	}
	s->exit_wait = d->exit_left > 0;
	s->exit_wait_processes = (uint32_t)d->exit_left;
	for (size_t i = 0; i < d->nexit && s->exit_wait_pids_count < GF_ARRAY_SIZE(s->exit_wait_pids); i++)
		if (d->exitp[i].fd >= 0)
			s->exit_wait_pids[s->exit_wait_pids_count++] = d->exitp[i].pid;
	s->state_write_failing = d->store_retry_at != 0;
	s->state_write_failures = d->store_failures;
	s->uptime_ms = gf_srv_started(d->srv) ? (now - d->started_at) / 1000 : 0;
	struct gf_srv_stats st;
	gf_srv_stats(d->srv, &st);
	s->connections = st.connections;
	s->fd_limit = st.fd_limit;
	s->refused_no_pidfd = st.refused_no_pidfd;
	s->accept_paused = st.accept_paused;
	s->refused_auth_rate = st.refused_auth_rate;
	lockd_pool_fill_status(d, s);
	gf_lsn_fill_status(d->lsn, s);
	s->step_down_requested = d->holder && d->step_down_epoch == d->epoch;
	if (d->holder && d->holder->reports_serving)
		s->holder_serving = d->holder->serving ? 2 : 1;
}

/* Grant to @c: persist first, then tell the client. */
static int grant(gf_lockd *d, struct conn *c, bool reclaimed)
{
	struct gf_srv_peer *p = c->peer;
	struct gf_lock_state old = d->rec;
	struct gf_lock_proof ahead = { .epoch = 0 }; /* the proof made with the token taken, if any */
	if (!reclaimed) {
		if (!gf_lock_next_epoch(d->epoch, &d->rec.epoch)) {
			if (!d->epochs_exhausted)
				gf_log(GF_LOG_ERR, "lock", "msg=\"epochs exhausted: no grant past INT64_MAX\" epoch=%llu",
				       (unsigned long long)d->epoch);
			d->epochs_exhausted = true;
			return GF_ERR_STATE;
		}
		if (d->next_token_ready) {
			memcpy(d->rec.token, d->next_token, sizeof(d->rec.token));
			ahead = d->next_proof;
		} else if (gf_random_bytes(d->rec.token, sizeof(d->rec.token)) < 0) {
			/* No grant without a token nobody can guess: hold grants and
			 * retry as after a failed state write. */
			gf_log(GF_LOG_ERR, "lock", "msg=\"no session token; holding grants\" error=\"%s\"",
			       gf_error_detail());
			d->rec = old;
			d->store_retry_at = gf_now_us() + STORE_RETRY_US;
			return GF_ERR_IO;
		}
		d->next_token_ready = false;
		d->next_proof.epoch = 0;
		if (c->takes_next) {
			/* Told now, with the grant's epoch and proof, the waiter wakes
			 * (and starts what needs no lock) while the state is written
			 * below instead of after: its wake-up leaves the failover's path. */
			gf_Msg *n = d->msg;
			gf_msg_start(n, gf_Msg_lock_next_tag);
			n->seq = c->seq;
			n->body.lock_next.epoch = d->rec.epoch;
			if (ahead.epoch == d->rec.epoch) {
				n->body.lock_next.fence_proof.size = GF_LOCK_PROOF_LEN;
				memcpy(n->body.lock_next.fence_proof.bytes, ahead.token, GF_LOCK_PROOF_LEN);
			}
			if (gf_srv_send(d->srv, p, n, NULL, 0) < 0) {
				/* The send closed it (on_close ran): the next waiter goes.
				 * The token stays unused; a new one is drawn for the next grant. */
				d->rec = old;
				return GF_ERR_CLOSED;
			}
		}
	}
	d->rec.has_holder = true;
	snprintf(d->rec.holder, sizeof(d->rec.holder), "%s", c->peer->id);
	d->rec.pid = p->pid;
	d->rec.granted_at_us = gf_wall_us();
	if (store(d) < 0) {
		d->rec = old;
		return GF_ERR_IO;
	}
	d->release_unsaved = false;
	d->epoch = d->rec.epoch;
	d->granted_at_wall = d->rec.granted_at_us;
	lockd_waiter_unlink(d, c);
	c->role = R_HOLDER;
	d->holder = c;
	lockd_pool_active_now(d, c);
	gf_Msg *m = d->msg;
	gf_msg_start(m, gf_Msg_lock_granted_tag);
	m->seq = c->seq;
	m->body.lock_granted.epoch = d->epoch;
	m->body.lock_granted.session_token.size = GF_LOCK_TOKEN_LEN;
	memcpy(m->body.lock_granted.session_token.bytes, d->rec.token, GF_LOCK_TOKEN_LEN);
	m->body.lock_granted.granted_at_us = d->granted_at_wall;
	m->body.lock_granted.reclaimed = reclaimed;
	m->body.lock_granted.takes_serving = true;
	/* The holder's fence proof goes with the grant: made ahead for a new
	 * grant, computed now for a reclaim (not on a failover's path). */
	struct gf_lock_proof proof = ahead;
	if (proof.epoch != d->epoch) {
		struct gf_lock_grant g = { .epoch = d->epoch };
		memcpy(g.session_token, d->rec.token, sizeof(g.session_token));
		if (gf_lock_grant_proof(&g, &proof) < 0)
			proof.epoch = 0;
	}
	if (proof.epoch == d->epoch) {
		m->body.lock_granted.fence_proof.size = GF_LOCK_PROOF_LEN;
		memcpy(m->body.lock_granted.fence_proof.bytes, proof.token, GF_LOCK_PROOF_LEN);
	}
	int lfds[GF_LSN_MAX];
	size_t nl = 0;
	if (p->tcp) {
		m->body.lock_granted.heartbeat_ms = d->heartbeat_ms;
		m->body.lock_granted.fence_ms = d->detect_ms / 2;
	} else {
		nl = gf_lsn_fill_grant(d->lsn, &m->body.lock_granted, lfds);
	}
	/* Logging and watching the new holder's process wait until the grant
	 * is on its way: the pidfd is level-triggered, an exit in between is
	 * still reported. A failed send closes the connection (on_close). */
	/* When the grant is handed to the socket: sendmsg wakes the new holder,
	 * which may run before this thread does again. */
	int64_t send_at = gf_now_us();
	int sent = gf_srv_send(d->srv, c->peer, m, lfds, nl);
	if (gf_log_enabled(GF_LOG_INFO)) {
		flush_grant_log(d); /* an earlier grant's line not yet written */
		struct grant_log *gl = &d->grant_log;
		gl->pending = true;
		gl->reclaimed = reclaimed;
		gl->tcp = p->tcp;
		snprintf(gl->id, sizeof(gl->id), "%s", c->peer->id);
		gl->epoch = d->epoch;
		gl->pid = p->pid;
		gl->send_at = send_at;
	}
	if (sent == 0 && p->pidfd >= 0)
		c->pid_watched = gf_srv_watch_add(d->srv, p->pidfd, &c->pid_watch) == 0;
	return 0;
}

/* The core's settle step: after every event, grant whoever may go now. */
static void settle(void *ctx)
{
	gf_lockd *d = ctx;
	bool granted = false;
	for (;;) {
		struct gf_lock_gate g = {
			.has_holder = d->holder != NULL,
			.exit_wait = d->exit_left > 0,
			.window = d->window,
			.store_failed = d->store_retry_at != 0,
			.has_waiter = d->whead != NULL,
		};
		if (!gf_lock_may_grant(&g))
			break;
		struct conn *c = d->whead;
		/* A waiter whose process is gone (a forked child may hold its
		 * socket) must not become the holder. */
		if (c->peer->pidfd >= 0 && pidfd_exited(c->peer->pidfd)) {
			gf_srv_close(d->srv, c->peer, "waiter's process exited");
			continue;
		}
		int grc = grant(d, c, false);
		if (grc == GF_ERR_STATE) {
			/* No epoch left: waiting would be forever, say so now. */
			lockd_waiter_unlink(d, c);
			lockd_reply_error(d, c, GF_ERR_STATE, "no epoch left to grant: the lock's epochs reached INT64_MAX", false);
			continue;
		}
		if (grc == GF_ERR_CLOSED)
			continue; /* gone while being told: no longer a waiter */
		if (grc < 0)
			break; /* store() wrote the pending release line */
		granted = true;
	}
	/* The new holder was woken on this CPU, most likely (a unix socket's
	 * wakeup is a sync one): let it run now rather than after the
	 * bookkeeping below and the old holder's teardown, none of which is
	 * urgent. The failover's protocol time waits on it. */
	if (granted) {
		sched_yield();
		d->prep_at = gf_now_us() + PREP_DELAY_US;
	}
	flush_grant_log(d);
	if (d->release_unsaved && !d->holder && store(d) == 0)
		d->release_unsaved = false;
	/* Ready for the next grant: its token, its proof and its state file's
	 * temp file. Not right after a grant: that work (an HMAC and a file
	 * created, about 80 us on a cold CPU) would take a CPU from the new
	 * holder and its memory service while they wake. It waits PREP_DELAY_US,
	 * or until a waiter queues (acquire); a grant that comes before it is
	 * done draws and computes them itself. */
	if (d->prep_at && gf_now_us() < d->prep_at)
		return;
	d->prep_at = 0;
	if (!d->next_token_ready && gf_random_bytes(d->next_token, sizeof(d->next_token)) == 0)
		d->next_token_ready = true;
	uint64_t next_epoch;
	if (d->next_token_ready && d->next_proof.epoch == 0 && gf_lock_next_epoch(d->epoch, &next_epoch)) {
		struct gf_lock_grant g = { .epoch = next_epoch };
		memcpy(g.session_token, d->next_token, sizeof(g.session_token));
		if (gf_lock_grant_proof(&g, &d->next_proof) < 0)
			d->next_proof.epoch = 0;
	}
	prepare_store(d);
}

/* Listeners still pending once no holder can hand them back are bound afresh, retried while busy. */
static void schedule_listener_retry(gf_lockd *d)
{
	if (!d->window && gf_lsn_pending(d->lsn) > 0 && gf_lsn_retry(d->lsn) > 0)
		d->lsn_retry_at = gf_now_us() + GF_LSN_RETRY_US;
	else
		d->lsn_retry_at = 0;
}

static void handle_acquire(gf_lockd *d, struct conn *c, const gf_LockAcquire *a, int *fds, size_t nfds)
{
	bool token_ok = d->rec.has_holder && a->session_token.size == GF_LOCK_TOKEN_LEN &&
			!memcmp(a->session_token.bytes, d->rec.token, GF_LOCK_TOKEN_LEN) && a->epoch == d->rec.epoch;
	struct gf_lock_acquire_in in = {
		.is_holder = c->role == R_HOLDER,
		.is_waiter = c->role == R_WAITER,
		.id_valid = gf_id_valid(a->engine_id),
		.has_token = a->session_token.size > 0,
		.token_matches = token_ok,
		.other_holder = d->holder && d->holder != c,
		.window = d->window,
	};
	enum gf_lock_acquire_decision dec = gf_lock_decide_acquire(&in);
	if (dec == GF_LOCK_REFUSE_HOLDER || dec == GF_LOCK_REFUSE_WAITER) {
		lockd_reply_error(d, c, GF_ERR_STATE, dec == GF_LOCK_REFUSE_HOLDER ? "this connection already holds the lock"
									  : "this connection is already waiting", false);
		return;
	}
	if (dec == GF_LOCK_REFUSE_ID) {
		lockd_reply_error(d, c, GF_ERR_INVALID_ARG,
			    "acquire: engine id must be 1..127 bytes of printable ASCII without spaces, quotes, '\\' or '='", false);
		return;
	}
	int prc = lockd_pool_take_decl(d, c, a);
	if (prc < 0) {
		lockd_reply_error(d, c, prc, gf_error_detail(), false);
		return;
	}
	snprintf(c->peer->id, sizeof(c->peer->id), "%s", a->engine_id);
	switch (dec) {
	case GF_LOCK_TAKEOVER: {
		/* The holder reconnected while its old connection still looks
		 * alive here (a half-open TCP connection): the token proves it is
		 * the same grant, so the new connection takes over, same epoch. */
		struct conn *old = d->holder;
		gf_log(GF_LOG_WARN, "lock", "msg=\"holder reconnected over a stale connection; moving the grant\" id=%s epoch=%llu",
		       c->peer->id, (unsigned long long)d->epoch);
		if (old->pid_watched)
			gf_srv_watch_del(d->srv, old->peer->pidfd);
		old->pid_watched = false;
		old->role = R_NONE;
		d->holder = NULL;
		gf_srv_close(d->srv, old->peer, "replaced by the holder's new connection");
		if (grant(d, c, true) < 0)
			lockd_reply_error(d, c, GF_ERR_IO, "server cannot persist the grant", false);
		return;
	}
	case GF_LOCK_RECLAIM:
		gf_lsn_adopt(d->lsn, a, fds, nfds);
		d->window = false;
		schedule_listener_retry(d);
		if (grant(d, c, true) < 0) {
			d->window = true;
			lockd_reply_error(d, c, GF_ERR_IO, "server cannot persist the grant", false);
		}
		return;
	case GF_LOCK_REFUSE_MISMATCH:
	case GF_LOCK_REFUSE_NO_WINDOW:
		gf_log(GF_LOG_WARN, "lock", "msg=\"reclaim refused\" id=%s epoch=%llu window=%d", c->peer->id,
		       (unsigned long long)a->epoch, d->window);
		lockd_reply_error(d, c, GF_ERR_LOCK_LOST, dec == GF_LOCK_REFUSE_MISMATCH
							    ? "reclaim refused: session token or epoch does not match the holder on record"
							    : "reclaim refused: no reconnect window is open, the grant is gone",
			    false);
		return;
	default:
		break;
	}
	c->role = R_WAITER;
	c->since_wall = gf_wall_us();
	c->wait_deadline = a->timeout_ms < 0 ? INT64_MAX : gf_deadline_from_ms(a->timeout_ms);
	c->wprev = d->wtail;
	c->wnext = NULL;
	if (d->wtail)
		d->wtail->wnext = c;
	else
		d->whead = c;
	d->wtail = c;
	d->nwaiters++;
	/* A waiter that may be granted next: the next grant's token, proof
	 * and temp file are made now (in this event's settle), not later. */
	d->prep_at = 0;
	gf_log(GF_LOG_DEBUG, "lock", "msg=\"waiting\" id=%s pid=%u waiters=%zu", c->peer->id, c->peer->pid, d->nwaiters);
	lockd_pool_registered(d, c);
}

static void holder_pid_fired(void *ctx, struct gf_srv_watch *w)
{
	gf_lockd *d = ctx;
	struct conn *c = (struct conn *)((char *)w - offsetof(struct conn, pid_watch));
	if (c->peer->fd >= 0 && c == d->holder) {
		gf_log(GF_LOG_INFO, "lock", "msg=\"holder's process exited while its socket is still open\" id=%s pid=%u",
		       c->peer->id, c->peer->pid);
		lockd_holder_gone(d, c, "holder process exited", WAIT_RANKS);
		gf_srv_close(d->srv, c->peer, "holder process exited");
	}
}

static void on_ready(void *ctx, struct gf_srv_peer *p)
{
	gf_lockd *d = ctx;
	struct conn *c = p->data;
	c->peer = p;
	c->pid_watch.fn = holder_pid_fired;
	c->next_hb = gf_now_us() + d->heartbeat_ms * 1000;
	c->hb_credit = HB_BURST;
	c->hb_credit_at = gf_now_us();
}

/* Heartbeats are the TCP lease: a unix peer has no use for them, a TCP peer sends about one per interval. */
static bool heartbeat_ok(gf_lockd *d, struct conn *c)
{
	if (!c->peer->tcp)
		return false;
	int64_t now = gf_now_us();
	int64_t pace_us = min64(d->heartbeat_ms * 1000 / 8, 10000);
	if (pace_us < 1)
		pace_us = 1;
	int64_t earned = (now - c->hb_credit_at) / pace_us;
	if (earned > 0) {
		c->hb_credit = (int)min64(HB_BURST, c->hb_credit + earned);
		c->hb_credit_at = now;
	}
	return c->hb_credit-- > 0;
}

/* The pid a pidfd refers to (its fdinfo), 0 when it cannot be told. */
static uint32_t pidfd_pid(int fd)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	int f = open(path, O_RDONLY | O_CLOEXEC);
	if (f < 0)
		return 0;
	ssize_t n = read(f, buf, sizeof(buf) - 1);
	close(f);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	const char *l = strstr(buf, "\nPid:");
	long v = l ? strtol(l + 6, NULL, 10) : 0;
	return v > 0 && v <= INT32_MAX ? (uint32_t)v : 0;
}

/* Is @fd a pidfd (of a live process, or one that exited: *@exited)? pidfd_send_signal() with
 * signal 0 sends nothing, and fails with EBADF on any other kind of fd. */
static bool is_pidfd(int fd, bool *exited)
{
	*exited = false;
	if (syscall(SYS_pidfd_send_signal, fd, 0, NULL, 0) == 0 || errno == EPERM)
		return true;
	if (errno == ESRCH) {
		*exited = true;
		return true;
	}
	return false;
}

/*
 * LockAddPids: further processes of the peer's engine, each a pidfd (taken
 * here). Bounded per connection; a peer that sends something else than a
 * pidfd, or more than the client library ever sends, is dropped. Processes
 * that exited are let go at once: there is nothing to wait for.
 */
static void handle_add_pids(gf_lockd *d, struct conn *c, int *fds, size_t nfds)
{
	size_t keep = 0;
	for (size_t i = 0; i < c->npids; i++) {
		if (pidfd_exited(c->pids[i].fd))
			gf_close(c->pids[i].fd);
		else
			c->pids[keep++] = c->pids[i];
	}
	c->npids = keep;
	for (size_t i = 0; i < nfds; i++) {
		bool exited;
		if (!is_pidfd(fds[i], &exited)) {
			gf_close_fds(fds + i, nfds - i);
			gf_log(GF_LOG_WARN, "lock", "msg=\"dropping connection: LockAddPids with an fd that is not a pidfd\" id=%s pid=%u",
			       c->peer->id, c->peer->pid);
			lockd_reply_error(d, c, GF_ERR_PROTOCOL, "LockAddPids: every fd must be a pidfd", true);
			return;
		}
		uint32_t pid = exited ? 0 : pidfd_pid(fds[i]);
		bool known = pid != 0 && pid == c->peer->pid;
		for (size_t k = 0; pid != 0 && k < c->npids && !known; k++)
			known = c->pids[k].pid == pid;
		if (exited || known) {
			gf_close(fds[i]);
			continue;
		}
		if (c->npids >= GF_LOCK_MAX_PIDS) {
			gf_close_fds(fds + i, nfds - i);
			char det[120];
			snprintf(det, sizeof(det), "LockAddPids: more than %d processes registered with one connection",
				 GF_LOCK_MAX_PIDS);
			gf_log(GF_LOG_WARN, "lock", "msg=\"dropping connection: too many registered processes\" id=%s pid=%u max=%d",
			       c->peer->id, c->peer->pid, GF_LOCK_MAX_PIDS);
			lockd_reply_error(d, c, GF_ERR_TOO_BIG, det, true);
			return;
		}
		if (!c->pids && !(c->pids = calloc(GF_LOCK_MAX_PIDS, sizeof(*c->pids)))) {
			gf_close_fds(fds + i, nfds - i);
			lockd_reply_error(d, c, GF_ERR_NOMEM, "LockAddPids: out of memory", true);
			return;
		}
		c->pids[c->npids++] = (struct reg_pid){ .fd = fds[i], .pid = pid };
		gf_log(GF_LOG_DEBUG, "lock", "msg=\"process registered\" id=%s pid=%u process=%u registered=%zu", c->peer->id,
		       c->peer->pid, pid, c->npids);
	}
}

/*
 * An admin drops the grant of @epoch: the holder will not die (uninterruptible
 * sleep keeps its process and socket) or its socket outlived it. Naming the
 * epoch makes a late or repeated request harmless: it revokes nothing once
 * the next waiter holds the lock.
 */
static void handle_revoke(gf_lockd *d, struct conn *c, uint64_t epoch)
{
	struct gf_srv_peer *p = c->peer;
	char det[200];
	if (!lockd_is_admin(p)) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"revoke refused: not an admin uid\" id=%s uid=%u", p->id, p->uid);
		lockd_reply_error(d, c, GF_ERR_PERMISSION, "revoke: only root or the server's own uid may revoke", false);
		return;
	}
	if (d->holder && d->epoch == epoch) {
		struct conn *h = d->holder;
		gf_log(GF_LOG_WARN, "lock", "msg=\"revoked\" id=%s epoch=%llu pid=%u by=%s", h->peer->id,
		       (unsigned long long)epoch, h->peer->pid, p->id);
		/* No exit wait: the process is presumed unkillable, which is why
		 * it is revoked. Closing its connection makes any later request
		 * of it fail, and its reclaim is refused (new token, no window). */
		/* Hung up now, before the next grant goes out (the socket itself
		 * is closed after it): a revoked holder that resumes sees the
		 * hang-up before it accepts from a carried listener again. */
		shutdown(h->peer->fd, SHUT_RDWR);
		lockd_holder_gone(d, h, "revoked", WAIT_NONE);
		gf_srv_close(d->srv, h->peer, "revoked");
	} else if (!d->holder && d->exit_left > 0 && d->epoch == epoch) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"revoked during the exit wait\" id=%s epoch=%llu pid=%u by=%s",
		       d->exit_id, (unsigned long long)epoch, d->exit_pid, p->id);
		lockd_end_exit_wait(d, "revoked during the exit wait");
	} else {
		snprintf(det, sizeof(det), "revoke: epoch %llu is not the current grant (current %llu, %s)",
			 (unsigned long long)epoch, (unsigned long long)d->epoch, d->holder ? "held" : "free");
		lockd_reply_error(d, c, GF_ERR_STATE, det, false);
		return;
	}
	memset(d->msg, 0, sizeof(*d->msg));
	d->msg->seq = c->seq;
	d->msg->which_body = gf_Msg_ok_tag;
	lockd_reply(d, c, d->msg);
}

/*
 * Planned switchover: the holder is asked to step down (stop accepting,
 * drain, release); the lock's FIFO then grants the first waiter as usual.
 * Without a waiter nobody would serve afterwards, so that is refused.
 */
static void handle_switchover(gf_lockd *d, struct conn *c, uint64_t epoch)
{
	struct gf_srv_peer *p = c->peer;
	char det[200];
	if (!lockd_is_admin(p)) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"switchover refused: not an admin uid\" id=%s uid=%u", p->id, p->uid);
		lockd_reply_error(d, c, GF_ERR_PERMISSION, "switchover: only root or the server's own uid may ask", false);
		return;
	}
	if (!d->holder || (epoch && epoch != d->epoch)) {
		snprintf(det, sizeof(det), "switchover: epoch %llu does not hold the lock (current %llu, %s)",
			 (unsigned long long)epoch, (unsigned long long)d->epoch, d->holder ? "held" : "free");
		lockd_reply_error(d, c, GF_ERR_STATE, det, false);
		return;
	}
	if (!d->whead) {
		lockd_reply_error(d, c, GF_ERR_STATE, "switchover: no standby is waiting for the lock", false);
		return;
	}
	struct conn *h = d->holder;
	gf_Msg *m = d->msg;
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_lock_step_down_tag;
	m->body.lock_step_down.epoch = d->epoch;
	if (lockd_reply(d, h, m) < 0) {
		lockd_reply_error(d, c, GF_ERR_UNREACHABLE, "switchover: the holder's connection failed", false);
		return;
	}
	d->step_down_epoch = d->epoch;
	gf_log(GF_LOG_INFO, "lock", "msg=\"switchover: holder asked to step down\" id=%s epoch=%llu next=%s by=%s",
	       h->peer->id, (unsigned long long)d->epoch, d->whead->peer->id, p->id);
	memset(m, 0, sizeof(*m));
	m->seq = c->seq;
	m->which_body = gf_Msg_ok_tag;
	lockd_reply(d, c, m);
}

/*
 * An admin evicts one named standby, as the budget would: its acquire ends
 * with GF_ERR_EVICTED. Only waiters: the holder is revoked, not evicted.
 */
static void handle_evict(gf_lockd *d, struct conn *c, const char *id)
{
	struct gf_srv_peer *p = c->peer;
	char det[300];
	if (!lockd_is_admin(p)) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"evict refused: not an admin uid\" id=%s uid=%u", p->id, p->uid);
		lockd_reply_error(d, c, GF_ERR_PERMISSION, "evict: only root or the server's own uid may evict", false);
		return;
	}
	struct conn *v = d->whead;
	while (v && strcmp(v->peer->id, id))
		v = v->wnext;
	if (!v) {
		snprintf(det, sizeof(det), "evict: no standby \"%.127s\" is waiting%s", id,
			 d->holder && !strcmp(d->holder->peer->id, id) ? " (it holds the lock: revoke it instead)" : "");
		lockd_reply_error(d, c, GF_ERR_STATE, det, false);
		return;
	}
	gf_log(GF_LOG_WARN, "lock", "msg=\"evicted\" id=%s pid=%u by=%s reason=\"evicted by an admin\"", v->peer->id,
	       v->peer->pid, p->id);
	d->evicted++;
	lockd_waiter_unlink(d, v);
	snprintf(det, sizeof(det), "evicted from the standby pool by an admin (%.127s)", p->id);
	lockd_reply_error(d, v, GF_ERR_EVICTED, det, true);
	memset(d->msg, 0, sizeof(*d->msg));
	d->msg->seq = c->seq;
	d->msg->which_body = gf_Msg_ok_tag;
	lockd_reply(d, c, d->msg);
}

static void on_message(void *ctx, struct gf_srv_peer *p, gf_Msg *m, int *fds, size_t nfds)
{
	gf_lockd *d = ctx;
	struct conn *c = p->data;
	c->seq = m->seq;
	/* Fds come only with a reclaim (a LockAcquire with a session token),
	 * one per listener it names; anywhere else they are a protocol error. */
	bool fds_ok = m->which_body == gf_Msg_lock_acquire_tag && m->body.lock_acquire.session_token.size > 0 &&
		      nfds <= m->body.lock_acquire.listeners_count;
	/* LockAddPids carries exactly the pidfds it counts, at least one. */
	bool add_pids = m->which_body == gf_Msg_lock_add_pids_tag;
	if (add_pids && (nfds == 0 || nfds != m->body.lock_add_pids.count)) {
		gf_close_fds(fds, nfds);
		free(fds);
		lockd_reply_error(d, c, GF_ERR_PROTOCOL, "LockAddPids: the pidfds that come with it must match its count", true);
		return;
	}
	if (add_pids) {
		handle_add_pids(d, c, fds, nfds);
		free(fds);
		return;
	}
	if (nfds > 0 && !fds_ok) {
		gf_close_fds(fds, nfds);
		free(fds);
		gf_log(GF_LOG_WARN, "lock", "msg=\"dropping connection: file descriptors with a message that takes none\" id=%s pid=%u nfds=%zu",
		       p->id, p->pid, nfds);
		lockd_reply_error(d, c, GF_ERR_PROTOCOL, "file descriptors sent with a message that takes none", true);
		return;
	}
	if (m->which_body == gf_Msg_lock_acquire_tag) {
		/* Only a reclaim hands listeners back; every fd not adopted is closed. */
		gf_LockAcquire a = m->body.lock_acquire;
		handle_acquire(d, c, &a, fds, nfds);
	}
	gf_close_fds(fds, nfds);
	free(fds);
	switch (m->which_body) {
	case gf_Msg_lock_acquire_tag:
		return;
	case gf_Msg_lock_release_tag:
		if (c->role == R_HOLDER) {
			gf_log(GF_LOG_INFO, "lock", "msg=\"explicit release\" id=%s epoch=%llu pid=%u", c->peer->id,
			       (unsigned long long)d->epoch, p->pid);
			lockd_holder_gone(d, c, "explicit release", WAIT_NONE);
		} else {
			lockd_waiter_unlink(d, c);
		}
		memset(d->msg, 0, sizeof(*d->msg));
		d->msg->seq = c->seq;
		d->msg->which_body = gf_Msg_ok_tag;
		lockd_reply(d, c, d->msg);
		return;
	case gf_Msg_lock_status_request_tag: {
		bool proof_ok = proof_valid(d, &m->body.lock_status_request);
		memset(d->msg, 0, sizeof(*d->msg));
		d->msg->seq = c->seq;
		d->msg->which_body = gf_Msg_lock_status_tag;
		lockd_fill_status(d, &d->msg->body.lock_status);
		d->msg->body.lock_status.proof_valid = proof_ok;
		lockd_reply(d, c, d->msg);
		return;
	}
	case gf_Msg_lock_revoke_tag:
		handle_revoke(d, c, m->body.lock_revoke.epoch);
		return;
	case gf_Msg_lock_switchover_tag:
		handle_switchover(d, c, m->body.lock_switchover.epoch);
		return;
	case gf_Msg_lock_serving_tag:
		/* No answer: a late report of an earlier grant is simply ignored. */
		if (c->role == R_HOLDER && m->body.lock_serving.epoch == d->epoch && !c->serving) {
			c->serving = true;
			gf_log(GF_LOG_INFO, "lock", "msg=\"holder serving\" id=%s epoch=%llu", p->id,
			       (unsigned long long)d->epoch);
		}
		return;
	case gf_Msg_lock_evict_tag:
		handle_evict(d, c, m->body.lock_evict.engine_id);
		return;
	case gf_Msg_heartbeat_tag:
		if (!heartbeat_ok(d, c)) {
			gf_log(GF_LOG_WARN, "lock", "msg=\"dropping connection: heartbeat flood\" id=%s pid=%u transport=%s",
			       c->peer->id, p->pid, p->tcp ? "tcp" : "unix");
			lockd_reply_error(d, c, GF_ERR_PROTOCOL,
				    p->tcp ? "heartbeats faster than the lease needs" : "heartbeats are for TCP connections only",
				    true);
		}
		return;
	default: {
		char det[96];
		snprintf(det, sizeof(det), "unexpected message %s on a lock connection", gf_msg_name(m));
		lockd_reply_error(d, c, GF_ERR_PROTOCOL, det, true);
		return;
	}
	}
}

static void send_heartbeat(gf_lockd *d, struct conn *c)
{
	gf_Msg *m = d->msg;
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_heartbeat_tag;
	m->body.heartbeat.seq = (uint64_t)(gf_now_us() / 1000);
	lockd_reply(d, c, m);
}

static void on_timer(void *ctx, int64_t now)
{
	gf_lockd *d = ctx;
	if (d->window && now >= d->window_deadline) {
		char t[9];
		d->window = false;
		gf_log(GF_LOG_WARN, "lock", "msg=\"reconnect window expired: previous holder presumed dead\" holder=%s epoch=%llu token=%s",
		       d->prev.holder, (unsigned long long)d->prev.epoch, tok_short(d->prev.token, t));
		d->rec.has_holder = false;
		d->release_unsaved = true;
		schedule_listener_retry(d);
	}
	if (d->lsn_retry_at && now >= d->lsn_retry_at)
		schedule_listener_retry(d);
	if (d->exit_left > 0 && now >= d->exit_deadline) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"released holder's processes still alive after the exit-wait timeout; granting anyway\" id=%s pid=%u processes=%zu",
		       d->exit_id, d->exit_pid, d->exit_left);
		lockd_end_exit_wait(d, "exit-wait timeout");
	}
	if (d->store_retry_at && now >= d->store_retry_at)
		d->store_retry_at = 0; /* settle retries the write */
	struct gf_srv_peer *p = gf_srv_next_peer(d->srv, NULL), *next;
	for (; p; p = next) {
		next = gf_srv_next_peer(d->srv, p);
		struct conn *c = p->data;
		if (!p->ready)
			continue;
		if (c->role == R_WAITER && now >= c->wait_deadline) {
			lockd_waiter_unlink(d, c);
			lockd_reply_error(d, c, GF_ERR_TIMEOUT, "acquire timed out", false);
			continue;
		}
		if (p->tcp) {
			if (now - p->last_heard >= d->detect_ms * 1000) {
				gf_log(GF_LOG_WARN, "lock", "msg=\"peer silent for T_detect; dropping\" id=%s role=%s detect_ms=%lld",
				       c->peer->id, c->role == R_HOLDER ? "holder" : "other", (long long)d->detect_ms);
				gf_srv_close(d->srv, p, "lease expired (T_detect)");
				continue;
			}
			if (now >= c->next_hb) {
				c->next_hb = now + d->heartbeat_ms * 1000;
				send_heartbeat(d, c);
			}
		}
	}
}

/* ---- the standby pool (pool.h has the rules) ---- */

int gf_lockd_set_max_standby_per_gpu(gf_lockd *d, uint32_t n)
{
	CHECK_CONFIG(d);
	d->pool.max_standby_per_gpu = n;
	return 0;
}

int gf_lockd_set_min_standby_age(gf_lockd *d, int64_t ms)
{
	CHECK_CONFIG(d);
	if (ms < 0 || ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: min standby age %lldms outside 0..%lldms", (long long)ms,
			      (long long)GF_MAX_DURATION_MS);
	d->pool.min_standby_age_us = ms * 1000;
	return 0;
}

