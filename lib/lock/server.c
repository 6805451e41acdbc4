/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock server core (seed 000, Decisions 4 and 8; DESIGN.md section 5).
 *
 * One epoll loop, non-blocking sockets, no thread per client: an idle
 * waiter costs one struct conn, its pidfd and the kernel's socket buffers.
 * The lock itself is: holder (a connection or nobody), a FIFO of waiters,
 * and three things that block grants: a holder's process that has not
 * exited yet (exit wait), a reconnect window after a restart, and a state
 * file that could not be written.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "lockint.h"
#include "wire.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

#define MAX_LISTEN 16
#define MAX_ALLOW_UID 64
/* How long a reply may wait for a peer's full receive buffer before the peer is dropped. */
#define SEND_DEADLINE_US 50000
/* Retry a failed state-file write this often, holding grants meanwhile. */
#define STORE_RETRY_US 1000000

enum ev_type { EV_LISTEN = 1, EV_CONN, EV_CONN_PIDFD, EV_STOP, EV_EXIT_PIDFD };

struct ev {
	enum ev_type type;
};

struct listener {
	struct ev ev;
	int fd;
	struct gf_uri uri;
};

enum conn_phase { PH_HELLO, PH_AUTH, PH_READY };
enum conn_role { R_NONE, R_WAITER, R_HOLDER };

struct conn {
	struct ev ev;
	struct ev pid_ev;          /* the holder's pidfd in epoll */
	int fd;
	int pidfd;                 /* -1 when unknown (TCP, pid 0, no pidfd support) */
	bool pid_watched;          /* pidfd is in epoll (as pid_ev) */
	bool tcp;
	enum conn_phase phase;
	enum conn_role role;
	uint32_t pid, uid;
	char id[GF_LOCK_ID_MAX];
	uint8_t challenge[32];
	int64_t handshake_deadline; /* monotonic; until PH_READY */
	int64_t wait_deadline;      /* monotonic; INT64_MAX: forever */
	int64_t since_wall;
	int64_t last_heard;
	int64_t next_hb;
	uint32_t seq;               /* seq of the pending acquire, echoed in the grant */
	struct conn *prev, *next;   /* all connections */
	struct conn *wprev, *wnext; /* waiters FIFO */
	struct gf_frame_reader rd;
};

struct gf_lockd {
	struct ev stop_ev;
	struct ev exit_ev;
	int epfd, stopfd;
	atomic_bool stopped;
	bool started;
	struct listener listeners[MAX_LISTEN];
	int nlisteners;
	bool any_tcp;
	char *state_path;
	int state_lock_fd;
	/* Kept open so a write does not resolve the path again (a grant's latency). */
	int state_dirfd;
	char *state_name, *state_tmpname;
	/* The next grant's session token, drawn while idle, not between a
	 * holder's exit and the next grant. */
	uint8_t next_token[GF_LOCK_TOKEN_LEN];
	bool next_token_ready;
	int64_t reconnect_window_ms, exit_wait_ms, heartbeat_ms, detect_ms, handshake_ms;
	uint32_t allow_uid[MAX_ALLOW_UID];
	int nallow;
	uint8_t *secret;
	size_t secret_len;
	int64_t started_at;

	struct conn *conns;
	struct conn *dead;         /* closed during this process() call, freed at its end */
	struct conn *whead, *wtail;
	size_t nwaiters;

	/* the lock */
	struct conn *holder;
	uint64_t epoch;            /* last epoch granted or on record */
	struct gf_lock_state rec;  /* what the state file says (or would) */
	int64_t granted_at_wall;
	/* exit wait: the released holder's process has not exited yet */
	int exit_pidfd;
	uint32_t exit_pid;
	char exit_id[GF_LOCK_ID_MAX];
	int64_t exit_deadline;
	/* reconnect window after a restart with a holder on record */
	bool window;
	int64_t window_deadline;
	struct gf_lock_state prev;
	/* a failed state-file write holds grants until this time */
	int64_t store_retry_at;
	/* d->rec says "released" but is not on disk yet: try_grant() either
	 * writes the next grant over it or writes it. A crash in between leaves
	 * the old holder on record, which only costs a reconnect window. */
	bool release_unsaved;

	/* the "released" log line, written after the next grant is sent */
	struct release_log {
		bool pending;
		char id[GF_LOCK_ID_MAX];
		uint64_t epoch;
		uint32_t pid;
		char why[200];
	} release_log;

	gf_Msg *msg; /* scratch message: gf_Msg is large */
};

#define CONN_OF(e, member) ((struct conn *)((char *)(e)-offsetof(struct conn, member)))

static void conn_close(gf_lockd *d, struct conn *c, const char *why);
static void try_grant(gf_lockd *d);
static void flush_release_log(gf_lockd *d);
static void free_dead(gf_lockd *d);

int gf_lockd_new(gf_lockd **out)
{
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL out");
	gf_lockd *d = calloc(1, sizeof(*d));
	if (!d)
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	d->msg = gf_msg_new();
	d->epfd = epoll_create1(EPOLL_CLOEXEC);
	d->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	d->state_lock_fd = -1;
	d->state_dirfd = -1;
	d->exit_pidfd = -1;
	d->reconnect_window_ms = 10000;
	d->exit_wait_ms = 10000;
	d->heartbeat_ms = 1000;
	d->detect_ms = 6000;
	d->handshake_ms = 3000;
	d->stop_ev.type = EV_STOP;
	d->exit_ev.type = EV_EXIT_PIDFD;
	if (!d->msg || d->epfd < 0 || d->stopfd < 0) {
		int rc = d->msg ? gf_err_errno(GF_ERR_IO, errno, "lockd: epoll/eventfd")
				: gf_err(GF_ERR_NOMEM, "lockd: out of memory");
		gf_lockd_free(d);
		return rc;
	}
	struct epoll_event e = { .events = EPOLLIN, .data.ptr = &d->stop_ev };
	if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->stopfd, &e) < 0) {
		int rc = gf_err_errno(GF_ERR_IO, errno, "lockd: epoll_ctl");
		gf_lockd_free(d);
		return rc;
	}
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
	while (d->conns)
		conn_close(d, d->conns, "server shutting down");
	free_dead(d);
	for (int i = 0; i < d->nlisteners; i++) {
		if (d->listeners[i].fd >= 0 && d->listeners[i].uri.kind == GF_URI_UNIX)
			unlink(d->listeners[i].uri.path);
		gf_close(d->listeners[i].fd);
	}
	gf_close(d->exit_pidfd);
	gf_close(d->state_lock_fd);
	gf_close(d->state_dirfd);
	free(d->state_name);
	free(d->state_tmpname);
	gf_close(d->epfd);
	gf_close(d->stopfd);
	free(d->state_path);
	if (d->secret)
		memset(d->secret, 0, d->secret_len);
	free(d->secret);
	gf_msg_free(d->msg);
	free(d);
}

#define CHECK_CONFIG(d)                                                                   \
	do {                                                                              \
		if (!(d))                                                                 \
			return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL server");          \
		if ((d)->started)                                                         \
			return gf_err(GF_ERR_STATE, "lockd: configure before gf_lockd_start()"); \
	} while (0)

int gf_lockd_add_listen(gf_lockd *d, const char *uri)
{
	CHECK_CONFIG(d);
	if (d->nlisteners >= MAX_LISTEN)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: at most %d listeners", MAX_LISTEN);
	struct listener *l = &d->listeners[d->nlisteners];
	int rc = gf_uri_parse(uri, &l->uri);
	if (rc < 0)
		return rc;
	l->fd = -1;
	l->ev.type = EV_LISTEN;
	if (l->uri.kind == GF_URI_TCP)
		d->any_tcp = true;
	d->nlisteners++;
	return 0;
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
	if (ms < 0)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: negative reconnect window");
	d->reconnect_window_ms = ms;
	return 0;
}

int gf_lockd_set_exit_wait_timeout(gf_lockd *d, int64_t ms)
{
	CHECK_CONFIG(d);
	if (ms < 0)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: negative exit-wait timeout");
	d->exit_wait_ms = ms;
	return 0;
}

int gf_lockd_add_allow_uid(gf_lockd *d, uint32_t uid)
{
	CHECK_CONFIG(d);
	if (d->nallow >= MAX_ALLOW_UID)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: at most %d allowed uids", MAX_ALLOW_UID);
	d->allow_uid[d->nallow++] = uid;
	return 0;
}

int gf_lockd_set_secret(gf_lockd *d, const void *secret, size_t len)
{
	CHECK_CONFIG(d);
	if (!secret || len == 0)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: empty secret");
	uint8_t *s = malloc(len);
	if (!s)
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	memcpy(s, secret, len);
	free(d->secret);
	d->secret = s;
	d->secret_len = len;
	return 0;
}

int gf_lockd_set_lease(gf_lockd *d, int64_t heartbeat_ms, int64_t detect_ms)
{
	CHECK_CONFIG(d);
	if (heartbeat_ms <= 0 || detect_ms <= 0)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: heartbeat and detect timeout must be positive");
	/* T_fence = T_detect/2 must still leave room for a heartbeat to arrive
	 * (T_fence >= 1.5 heartbeats), and the margin T_detect - T_fence covers
	 * one lost heartbeat plus scheduling delays. */
	if (detect_ms < 3 * heartbeat_ms)
		return gf_err(GF_ERR_INVALID_ARG,
			      "lockd: detect timeout %lldms must be at least 3 heartbeats (%lldms)",
			      (long long)detect_ms, (long long)(3 * heartbeat_ms));
	d->heartbeat_ms = heartbeat_ms;
	d->detect_ms = detect_ms;
	return 0;
}

int gf_lockd_set_handshake_timeout(gf_lockd *d, int64_t ms)
{
	CHECK_CONFIG(d);
	if (ms <= 0)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: handshake timeout must be positive");
	d->handshake_ms = ms;
	return 0;
}

/* ---- state ---- */

static const char *tok_short(const uint8_t *t, char *buf)
{
	gf_hex(t, 4, buf);
	return buf;
}

/* Persist d->rec. On failure grants stop until a retry succeeds. */
static int store(gf_lockd *d)
{
	if (!d->state_path)
		return 0;
	int rc = gf_lock_state_store_at(d->state_dirfd, d->state_name, d->state_tmpname, &d->rec);
	if (rc < 0) {
		flush_release_log(d);
		gf_log(GF_LOG_ERR, "lock", "msg=\"cannot write the state file; holding grants\" path=%s error=\"%s\"",
		       d->state_path, gf_error_detail());
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
	if (d->started)
		return gf_err(GF_ERR_STATE, "lockd: already started");
	if (d->nlisteners == 0)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: no listen URI configured");
	if (d->any_tcp && !d->secret)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: a TCP listener needs a shared secret");
	int rc = load_state(d);
	if (rc < 0)
		return rc;
	for (int i = 0; i < d->nlisteners; i++) {
		struct listener *l = &d->listeners[i];
		rc = gf_uri_listen(&l->uri, 1024, &l->fd);
		if (rc < 0) {
			l->fd = -1;
			return rc;
		}
		struct epoll_event e = { .events = EPOLLIN, .data.ptr = &l->ev };
		if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, l->fd, &e) < 0)
			return gf_err_errno(GF_ERR_IO, errno, "lockd: epoll_ctl");
	}
	d->started = true;
	d->started_at = gf_now_us();
	return 0;
}

int gf_lockd_get_fd(const gf_lockd *d)
{
	return d ? d->epfd : -1;
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

static int64_t next_deadline(const gf_lockd *d)
{
	int64_t t = INT64_MAX;
	if (d->window)
		t = min64(t, d->window_deadline);
	if (d->exit_pidfd >= 0)
		t = min64(t, d->exit_deadline);
	if (d->store_retry_at)
		t = min64(t, d->store_retry_at);
	for (const struct conn *c = d->conns; c; c = c->next) {
		if (c->phase != PH_READY)
			t = min64(t, c->handshake_deadline);
		if (c->role == R_WAITER)
			t = min64(t, c->wait_deadline);
		if (c->tcp && c->phase == PH_READY) {
			t = min64(t, c->next_hb);
			t = min64(t, c->last_heard + d->detect_ms * 1000);
		}
	}
	return t;
}

int gf_lockd_get_timeout_ms(const gf_lockd *d)
{
	if (!d)
		return -1;
	int64_t t = next_deadline(d);
	if (t == INT64_MAX)
		return -1;
	int64_t left = t - gf_now_us();
	if (left <= 0)
		return 0;
	return (int)min64((left + 999) / 1000, 1 << 30);
}

/* ---- connections ---- */

static int reply(gf_lockd *d, struct conn *c, gf_Msg *m)
{
	int rc = gf_msg_send(c->fd, m, NULL, 0, gf_now_us() + SEND_DEADLINE_US);
	if (rc < 0)
		gf_log(GF_LOG_DEBUG, "lock", "msg=\"send failed\" peer=%s error=\"%s\"", c->id, gf_error_detail());
	return rc;
}

/* Send an error; the connection stays unless @close_after. Returns -1 if @c was closed. */
static int reply_error(gf_lockd *d, struct conn *c, int code, const char *detail, bool close_after)
{
	gf_Msg *m = d->msg;
	memset(m, 0, sizeof(*m));
	m->seq = c->seq;
	gf_msg_set_error(m, code, detail);
	if (reply(d, c, m) < 0 || close_after) {
		conn_close(d, c, detail);
		return -1;
	}
	return 0;
}

static void waiter_unlink(gf_lockd *d, struct conn *c)
{
	if (c->role != R_WAITER)
		return;
	if (c->wprev)
		c->wprev->wnext = c->wnext;
	else
		d->whead = c->wnext;
	if (c->wnext)
		c->wnext->wprev = c->wprev;
	else
		d->wtail = c->wprev;
	c->wprev = c->wnext = NULL;
	c->role = R_NONE;
	d->nwaiters--;
}

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
	}
}

static void flush_release_log(gf_lockd *d)
{
	struct release_log *r = &d->release_log;
	if (!r->pending)
		return;
	r->pending = false;
	gf_log(GF_LOG_INFO, "lock", "msg=\"released\" id=%s epoch=%llu pid=%u reason=\"%s\"", r->id,
	       (unsigned long long)r->epoch, r->pid, r->why);
}

static void end_exit_wait(gf_lockd *d, const char *why)
{
	epoll_ctl(d->epfd, EPOLL_CTL_DEL, d->exit_pidfd, NULL);
	gf_close(d->exit_pidfd);
	d->exit_pidfd = -1;
	finish_release(d, why);
}

/*
 * The holder's connection is going away (closed, released, lost, or its
 * process exited). Unless it released on purpose or its process is known
 * to be gone, wait for its process to exit before the next grant.
 */
static void holder_gone(gf_lockd *d, struct conn *c, const char *why, bool wait_exit)
{
	d->holder = NULL;
	c->role = R_NONE;
	if (wait_exit && c->pidfd >= 0 && d->exit_wait_ms > 0 && !pidfd_exited_soon(c->pidfd)) {
		d->exit_pidfd = c->pidfd;
		c->pidfd = -1;
		d->exit_pid = c->pid;
		snprintf(d->exit_id, sizeof(d->exit_id), "%s", c->id);
		d->exit_deadline = gf_now_us() + d->exit_wait_ms * 1000;
		/* The holder's pidfd is normally in epoll already: retarget it
		 * (one syscall) instead of removing and adding it again. */
		struct epoll_event e = { .events = EPOLLIN, .data.ptr = &d->exit_ev };
		int erc = epoll_ctl(d->epfd, c->pid_watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, d->exit_pidfd, &e);
		c->pid_watched = false;
		if (erc < 0) {
			gf_log(GF_LOG_WARN, "lock", "msg=\"cannot watch the holder's process; releasing on socket close\" error=\"%s\"",
			       strerror(errno));
			end_exit_wait(d, why);
			return;
		}
		gf_log(GF_LOG_INFO, "lock", "msg=\"holder disconnected; waiting for its process to exit\" id=%s epoch=%llu pid=%u reason=\"%s\"",
		       c->id, (unsigned long long)d->epoch, c->pid, why);
		return;
	}
	/* A closing connection's pidfd leaves epoll in conn_close(), after the next grant. */
	if (c->pid_watched && c->fd >= 0) {
		epoll_ctl(d->epfd, EPOLL_CTL_DEL, c->pidfd, NULL);
		c->pid_watched = false;
	}
	finish_release(d, why);
}

static void conn_close(gf_lockd *d, struct conn *c, const char *why)
{
	bool was_holder = c->role == R_HOLDER;
	int fd = c->fd;
	waiter_unlink(d, c);
	c->fd = -1;
	if (was_holder)
		holder_gone(d, c, why, true);
	if (c->prev)
		c->prev->next = c->next;
	else
		d->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	/* Events for @c may still be pending in this epoll batch. */
	c->next = d->dead;
	d->dead = c;
	/* The next grant first: tearing down the old holder's socket is not
	 * on the handoff's path. No epoll_wait runs in between. */
	if (was_holder)
		try_grant(d);
	epoll_ctl(d->epfd, EPOLL_CTL_DEL, fd, NULL);
	gf_close(fd);
	/* Removed explicitly: a forked copy of the fd would keep it in epoll. */
	if (c->pid_watched)
		epoll_ctl(d->epfd, EPOLL_CTL_DEL, c->pidfd, NULL);
	c->pid_watched = false;
	gf_close(c->pidfd);
	c->pidfd = -1;
	gf_frame_reader_clear(&c->rd);
	gf_log(GF_LOG_DEBUG, "lock", "msg=\"connection closed\" id=%s pid=%u reason=\"%s\"", c->id, c->pid, why);
}

static int open_pidfd(int fd, uint32_t pid)
{
	int pfd = -1;
	socklen_t sl = sizeof(pfd);
	/* SO_PEERPIDFD (Linux 6.5) names the connecting process without a pid-reuse race. */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &sl) == 0 && pfd >= 0) {
		fcntl(pfd, F_SETFD, FD_CLOEXEC);
		return pfd;
	}
	if (pid == 0)
		return -1;
	pfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
	return pfd; /* pidfds are always close-on-exec */
}

/* Accept one connection; false when the backlog is empty (or accept fails), so the caller stops. */
static bool accept_one(gf_lockd *d, struct listener *l)
{
	int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0) {
		if (errno == EINTR || errno == ECONNABORTED)
			return true;
		if (errno != EAGAIN)
			gf_log(GF_LOG_WARN, "lock", "msg=\"accept failed\" error=\"%s\"", strerror(errno));
		return false;
	}
	struct conn *c = calloc(1, sizeof(*c));
	if (!c) {
		gf_close(fd);
		return false;
	}
	c->ev.type = EV_CONN;
	c->pid_ev.type = EV_CONN_PIDFD;
	c->fd = fd;
	c->pidfd = -1;
	c->tcp = l->uri.kind == GF_URI_TCP;
	c->handshake_deadline = gf_now_us() + d->handshake_ms * 1000;
	c->last_heard = gf_now_us();
	snprintf(c->id, sizeof(c->id), "?");
	gf_frame_reader_init(&c->rd, 0);
	c->rd.max_body = GF_LOCK_MAX_FRAME;
	if (c->tcp) {
		int one = 1, idle = 1, intvl = 1, cnt = 3;
		unsigned int uto = (unsigned int)d->detect_ms;
		setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
		setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	} else {
		struct ucred cr;
		socklen_t sl = sizeof(cr);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &sl) == 0) {
			c->pid = (uint32_t)cr.pid;
			c->uid = (uint32_t)cr.uid;
		}
		c->pidfd = open_pidfd(fd, c->pid);
	}
	c->next = d->conns;
	if (d->conns)
		d->conns->prev = c;
	d->conns = c;
	struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = &c->ev };
	if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, fd, &e) < 0)
		conn_close(d, c, "epoll_ctl failed");
	return true;
}

static bool uid_allowed(const gf_lockd *d, uint32_t uid)
{
	if (d->nallow == 0)
		return true;
	for (int i = 0; i < d->nallow; i++)
		if (d->allow_uid[i] == uid)
			return true;
	return false;
}

static void fill_status(gf_lockd *d, gf_LockStatus *s)
{
	int64_t now = gf_now_us();
	memset(s, 0, sizeof(*s));
	if (d->holder) {
		snprintf(s->holder, sizeof(s->holder), "%s", d->holder->id);
		s->holder_pid = d->holder->pid;
	}
	s->epoch = d->epoch;
	s->granted_at_us = d->holder ? d->granted_at_wall : 0;
	for (struct conn *w = d->whead; w && s->waiters_count < GF_ARRAY_SIZE(s->waiters); w = w->wnext) {
		gf_LockWaiter *o = &s->waiters[s->waiters_count++];
		snprintf(o->engine_id, sizeof(o->engine_id), "%s", w->id);
		o->since_us = w->since_wall;
		o->pid = w->pid;
	}
	s->waiter_count = (uint32_t)d->nwaiters;
	s->reconnect_window = d->window;
	if (d->window) {
		s->reconnect_window_left_ms = (d->window_deadline - now) / 1000;
		snprintf(s->previous_holder, sizeof(s->previous_holder), "%s", d->prev.holder);
	}
	s->exit_wait = d->exit_pidfd >= 0;
	s->uptime_ms = d->started ? (now - d->started_at) / 1000 : 0;
}

int gf_lockd_status_json(gf_lockd *d, char **json)
{
	if (!d || !json)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL argument");
	gf_LockStatus *s = malloc(sizeof(*s));
	if (!s)
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	fill_status(d, s);
	int rc = gf_lock_status_to_json(s, json);
	free(s);
	return rc;
}

/* Grant to @c: persist first, then tell the client. */
static int grant(gf_lockd *d, struct conn *c, bool reclaimed)
{
	struct gf_lock_state old = d->rec;
	if (!reclaimed) {
		d->rec.epoch = d->epoch + 1;
		if (d->next_token_ready)
			memcpy(d->rec.token, d->next_token, sizeof(d->rec.token));
		else
			gf_random_bytes(d->rec.token, sizeof(d->rec.token));
		d->next_token_ready = false;
	}
	d->rec.has_holder = true;
	snprintf(d->rec.holder, sizeof(d->rec.holder), "%s", c->id);
	d->rec.pid = c->pid;
	d->rec.granted_at_us = gf_wall_us();
	if (store(d) < 0) {
		d->rec = old;
		return GF_ERR_IO;
	}
	d->release_unsaved = false;
	d->epoch = d->rec.epoch;
	d->granted_at_wall = d->rec.granted_at_us;
	waiter_unlink(d, c);
	c->role = R_HOLDER;
	d->holder = c;
	gf_Msg *m = d->msg;
	memset(m, 0, sizeof(*m));
	m->seq = c->seq;
	m->which_body = gf_Msg_lock_granted_tag;
	m->body.lock_granted.epoch = d->epoch;
	m->body.lock_granted.session_token.size = GF_LOCK_TOKEN_LEN;
	memcpy(m->body.lock_granted.session_token.bytes, d->rec.token, GF_LOCK_TOKEN_LEN);
	m->body.lock_granted.granted_at_us = d->granted_at_wall;
	m->body.lock_granted.reclaimed = reclaimed;
	if (c->tcp) {
		m->body.lock_granted.heartbeat_ms = d->heartbeat_ms;
		m->body.lock_granted.fence_ms = d->detect_ms / 2;
	}
	/* Logging and watching the new holder's process wait until the grant
	 * is on its way: the pidfd is level-triggered, an exit in between is
	 * still reported. */
	int sent = reply(d, c, m);
	flush_release_log(d);
	gf_log(GF_LOG_INFO, "lock", "msg=\"%s\" id=%s epoch=%llu pid=%u transport=%s", reclaimed ? "reclaimed" : "granted",
	       c->id, (unsigned long long)d->epoch, c->pid, c->tcp ? "tcp" : "unix");
	if (sent < 0) {
		conn_close(d, c, "grant could not be sent");
		return 0;
	}
	if (c->pidfd >= 0) {
		struct epoll_event e = { .events = EPOLLIN, .data.ptr = &c->pid_ev };
		c->pid_watched = epoll_ctl(d->epfd, EPOLL_CTL_ADD, c->pidfd, &e) == 0;
	}
	return 0;
}

static void try_grant(gf_lockd *d)
{
	while (!d->holder && d->exit_pidfd < 0 && !d->window && !d->store_retry_at && d->whead) {
		struct conn *c = d->whead;
		/* A waiter whose process is gone (a forked child may hold its
		 * socket) must not become the holder. */
		if (c->pidfd >= 0 && pidfd_exited(c->pidfd)) {
			conn_close(d, c, "waiter's process exited");
			continue;
		}
		if (grant(d, c, false) < 0)
			return; /* store() wrote the pending release line */
	}
	flush_release_log(d);
	if (d->release_unsaved && !d->holder && store(d) == 0)
		d->release_unsaved = false;
}

/* Engine ids end up in key=value log lines and JSON: keep them printable and unquoted. */
static bool id_ok(const char *id)
{
	for (const unsigned char *p = (const unsigned char *)id; *p; p++)
		if (*p <= ' ' || *p == '"' || *p == '\\' || *p == '=' || *p >= 0x7f)
			return false;
	return *id != '\0';
}

static void handle_acquire(gf_lockd *d, struct conn *c, const gf_LockAcquire *a)
{
	if (c->role != R_NONE) {
		reply_error(d, c, GF_ERR_STATE, c->role == R_HOLDER ? "this connection already holds the lock"
								     : "this connection is already waiting", false);
		return;
	}
	if (!id_ok(a->engine_id)) {
		reply_error(d, c, GF_ERR_INVALID_ARG,
			    "acquire: engine id must be non-empty printable ASCII without spaces, quotes, '\\' or '='", false);
		return;
	}
	snprintf(c->id, sizeof(c->id), "%s", a->engine_id);
	bool token_ok = a->session_token.size == GF_LOCK_TOKEN_LEN &&
			!memcmp(a->session_token.bytes, d->rec.token, GF_LOCK_TOKEN_LEN) && a->epoch == d->rec.epoch;
	if (a->session_token.size > 0 && d->holder && d->holder != c && token_ok) {
		/* The holder reconnected while its old connection still looks
		 * alive here (a half-open TCP connection): the token proves it is
		 * the same grant, so the new connection takes over, same epoch. */
		struct conn *old = d->holder;
		gf_log(GF_LOG_WARN, "lock", "msg=\"holder reconnected over a stale connection; moving the grant\" id=%s epoch=%llu",
		       c->id, (unsigned long long)d->epoch);
		if (old->pid_watched)
			epoll_ctl(d->epfd, EPOLL_CTL_DEL, old->pidfd, NULL);
		old->pid_watched = false;
		old->role = R_NONE;
		d->holder = NULL;
		conn_close(d, old, "replaced by the holder's new connection");
		if (grant(d, c, true) < 0)
			reply_error(d, c, GF_ERR_IO, "server cannot persist the grant", false);
		return;
	}
	if (a->session_token.size > 0) {
		/* A reclaim: only the holder on record, proving itself with its
		 * token, during the reconnect window. Never queued. */
		if (d->window && token_ok) {
			d->window = false;
			if (grant(d, c, true) < 0) {
				d->window = true;
				reply_error(d, c, GF_ERR_IO, "server cannot persist the grant", false);
				return;
			}
			return;
		}
		gf_log(GF_LOG_WARN, "lock", "msg=\"reclaim refused\" id=%s epoch=%llu window=%d", c->id,
		       (unsigned long long)a->epoch, d->window);
		reply_error(d, c, GF_ERR_LOCK_LOST, d->window ? "reclaim refused: session token or epoch does not match the holder on record"
							      : "reclaim refused: no reconnect window is open, the grant is gone",
			    false);
		return;
	}
	c->role = R_WAITER;
	c->since_wall = gf_wall_us();
	c->wait_deadline = a->timeout_ms < 0 ? INT64_MAX : gf_now_us() + a->timeout_ms * 1000;
	c->wprev = d->wtail;
	c->wnext = NULL;
	if (d->wtail)
		d->wtail->wnext = c;
	else
		d->whead = c;
	d->wtail = c;
	d->nwaiters++;
	gf_log(GF_LOG_DEBUG, "lock", "msg=\"waiting\" id=%s pid=%u waiters=%zu", c->id, c->pid, d->nwaiters);
	try_grant(d);
}

/* Handle one message; returns -1 when @c was closed. */
static int handle_msg(gf_lockd *d, struct conn *c, gf_Msg *m)
{
	c->last_heard = gf_now_us();
	if (c->phase == PH_HELLO) {
		int hrc = gf_handshake_check_hello(m, gf_Component_COMPONENT_LOCK);
		if (hrc < 0) {
			char det[256];
			snprintf(det, sizeof(det), "%s", gf_error_detail());
			return reply_error(d, c, hrc, det, true);
		}
		snprintf(c->id, sizeof(c->id), "%s", id_ok(m->body.hello.peer_id) ? m->body.hello.peer_id : "?");
		if (!c->tcp && !uid_allowed(d, c->uid)) {
			char det[128];
			snprintf(det, sizeof(det), "uid %u is not allowed to use this lock server", c->uid);
			gf_log(GF_LOG_WARN, "lock", "msg=\"peer refused\" uid=%u pid=%u", c->uid, c->pid);
			return reply_error(d, c, GF_ERR_PERMISSION, det, true);
		}
		memset(m, 0, sizeof(*m));
		m->which_body = gf_Msg_welcome_tag;
		m->body.welcome.version = GF_PROTOCOL_VERSION;
		m->body.welcome.component = gf_Component_COMPONENT_LOCK;
		snprintf(m->body.welcome.server_id, sizeof(m->body.welcome.server_id), "gf-lockd/%s", gf_version());
		if (c->tcp) {
			gf_random_bytes(c->challenge, sizeof(c->challenge));
			memcpy(m->body.welcome.challenge.bytes, c->challenge, sizeof(c->challenge));
			m->body.welcome.challenge.size = sizeof(c->challenge);
			c->phase = PH_AUTH;
		} else {
			c->phase = PH_READY;
		}
		if (reply(d, c, m) < 0) {
			conn_close(d, c, "welcome could not be sent");
			return -1;
		}
		c->next_hb = gf_now_us() + d->heartbeat_ms * 1000;
		return 0;
	}
	if (c->phase == PH_AUTH) {
		if (m->which_body != gf_Msg_auth_tag ||
		    !gf_auth_verify(d->secret, d->secret_len, c->challenge, sizeof(c->challenge),
				    m->body.auth.mac.bytes, m->body.auth.mac.size)) {
			gf_log(GF_LOG_WARN, "lock", "msg=\"authentication failed\" id=%s", c->id);
			return reply_error(d, c, GF_ERR_PERMISSION, "authentication failed: wrong shared secret", true);
		}
		memset(m, 0, sizeof(*m));
		m->which_body = gf_Msg_auth_ok_tag;
		c->phase = PH_READY;
		if (reply(d, c, m) < 0) {
			conn_close(d, c, "auth_ok could not be sent");
			return -1;
		}
		return 0;
	}
	c->seq = m->seq;
	switch (m->which_body) {
	case gf_Msg_lock_acquire_tag: {
		gf_LockAcquire a = m->body.lock_acquire;
		handle_acquire(d, c, &a);
		return c->fd < 0 ? -1 : 0;
	}
	case gf_Msg_lock_release_tag:
		if (c->role == R_HOLDER) {
			gf_log(GF_LOG_INFO, "lock", "msg=\"explicit release\" id=%s epoch=%llu pid=%u", c->id,
			       (unsigned long long)d->epoch, c->pid);
			holder_gone(d, c, "explicit release", false);
		} else {
			waiter_unlink(d, c);
		}
		memset(m, 0, sizeof(*m));
		m->seq = c->seq;
		m->which_body = gf_Msg_ok_tag;
		reply(d, c, m);
		try_grant(d);
		return 0;
	case gf_Msg_lock_status_request_tag: {
		uint32_t seq = c->seq;
		memset(m, 0, sizeof(*m));
		m->seq = seq;
		m->which_body = gf_Msg_lock_status_tag;
		fill_status(d, &m->body.lock_status);
		if (reply(d, c, m) < 0) {
			conn_close(d, c, "status could not be sent");
			return -1;
		}
		return 0;
	}
	case gf_Msg_heartbeat_tag:
		return 0;
	default: {
		char det[96];
		snprintf(det, sizeof(det), "unexpected message %s on a lock connection", gf_msg_name(m));
		return reply_error(d, c, GF_ERR_PROTOCOL, det, true);
	}
	}
}

static void conn_readable(gf_lockd *d, struct conn *c)
{
	for (;;) {
		int rc = gf_frame_reader_feed(&c->rd, c->fd);
		if (rc == GF_ERR_AGAIN)
			return;
		if (rc < 0) {
			char why[200];
			snprintf(why, sizeof(why), "%s", rc == GF_ERR_CLOSED ? "connection closed" : gf_error_detail());
			if (rc != GF_ERR_CLOSED)
				gf_log(GF_LOG_WARN, "lock", "msg=\"dropping connection\" id=%s pid=%u error=\"%s\"", c->id,
				       c->pid, why);
			conn_close(d, c, why);
			return;
		}
		if (gf_msg_decode(c->rd.body, c->rd.msg_len, d->msg) < 0) {
			gf_log(GF_LOG_WARN, "lock", "msg=\"dropping connection: undecodable message\" id=%s error=\"%s\"",
			       c->id, gf_error_detail());
			conn_close(d, c, "undecodable message");
			return;
		}
		if (handle_msg(d, c, d->msg) < 0)
			return;
	}
}

static void send_heartbeat(gf_lockd *d, struct conn *c)
{
	gf_Msg *m = d->msg;
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_heartbeat_tag;
	m->body.heartbeat.seq = (uint64_t)(gf_now_us() / 1000);
	if (reply(d, c, m) < 0)
		conn_close(d, c, "heartbeat could not be sent");
}

static void run_timers(gf_lockd *d)
{
	int64_t now = gf_now_us();
	if (d->window && now >= d->window_deadline) {
		char t[9];
		d->window = false;
		gf_log(GF_LOG_WARN, "lock", "msg=\"reconnect window expired: previous holder presumed dead\" holder=%s epoch=%llu token=%s",
		       d->prev.holder, (unsigned long long)d->prev.epoch, tok_short(d->prev.token, t));
		d->rec.has_holder = false;
		d->release_unsaved = true;
	}
	if (d->exit_pidfd >= 0 && now >= d->exit_deadline) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"released holder's process still alive after the exit-wait timeout; granting anyway\" id=%s pid=%u",
		       d->exit_id, d->exit_pid);
		end_exit_wait(d, "exit-wait timeout");
	}
	if (d->store_retry_at && now >= d->store_retry_at)
		d->store_retry_at = 0; /* try_grant below retries the write */
	struct conn *c = d->conns, *next;
	for (; c; c = next) {
		next = c->next;
		if (c->phase != PH_READY && now >= c->handshake_deadline) {
			gf_log(GF_LOG_WARN, "lock", "msg=\"dropping connection: handshake not completed in time\" pid=%u", c->pid);
			conn_close(d, c, "handshake timeout");
			continue;
		}
		if (c->role == R_WAITER && now >= c->wait_deadline) {
			waiter_unlink(d, c);
			reply_error(d, c, GF_ERR_TIMEOUT, "acquire timed out", false);
			continue;
		}
		if (c->tcp && c->phase == PH_READY) {
			if (now - c->last_heard >= d->detect_ms * 1000) {
				gf_log(GF_LOG_WARN, "lock", "msg=\"peer silent for T_detect; dropping\" id=%s role=%s detect_ms=%lld",
				       c->id, c->role == R_HOLDER ? "holder" : "other", (long long)d->detect_ms);
				conn_close(d, c, "lease expired (T_detect)");
				continue;
			}
			if (now >= c->next_hb) {
				c->next_hb = now + d->heartbeat_ms * 1000;
				send_heartbeat(d, c);
			}
		}
	}
	try_grant(d);
}

static void free_dead(gf_lockd *d)
{
	while (d->dead) {
		struct conn *c = d->dead;
		d->dead = c->next;
		free(c);
	}
}

/* One round: wait up to @timeout_ms for events (0: poll), handle them and the timers. */
static int process_round(gf_lockd *d, int timeout_ms)
{
	struct epoll_event evs[64];
	int n = epoll_wait(d->epfd, evs, GF_ARRAY_SIZE(evs), timeout_ms);
	if (n < 0 && errno != EINTR)
		return gf_err_errno(GF_ERR_IO, errno, "lockd: epoll_wait");
	for (int i = 0; i < n; i++) {
		struct ev *e = evs[i].data.ptr;
		switch (e->type) {
		case EV_STOP: {
			uint64_t v;
			if (read(d->stopfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				return gf_err_errno(GF_ERR_IO, errno, "lockd: read stop eventfd");
			break;
		}
		case EV_LISTEN:
			for (int k = 0; k < 64; k++)
				if (!accept_one(d, (struct listener *)e))
					break;
			break;
		case EV_CONN: {
			struct conn *c = (struct conn *)e;
			if (c->fd >= 0)
				conn_readable(d, c);
			break;
		}
		case EV_CONN_PIDFD: {
			struct conn *c = CONN_OF(e, pid_ev);
			if (c->fd >= 0 && c == d->holder) {
				gf_log(GF_LOG_INFO, "lock", "msg=\"holder's process exited while its socket is still open\" id=%s pid=%u",
				       c->id, c->pid);
				holder_gone(d, c, "holder process exited", false);
				conn_close(d, c, "holder process exited");
			}
			break;
		}
		case EV_EXIT_PIDFD:
			if (d->exit_pidfd >= 0)
				end_exit_wait(d, "holder process exited");
			break;
		}
	}
	run_timers(d);
	flush_release_log(d);
	free_dead(d);
	if (!d->next_token_ready && gf_random_bytes(d->next_token, sizeof(d->next_token)) == 0)
		d->next_token_ready = true;
	return atomic_load(&d->stopped) ? 1 : 0;
}

int gf_lockd_process(gf_lockd *d)
{
	if (!d)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL server");
	if (!d->started)
		return gf_err(GF_ERR_STATE, "lockd: not started");
	return process_round(d, 0);
}

int gf_lockd_run(gf_lockd *d)
{
	if (!d)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL server");
	if (!d->started)
		return gf_err(GF_ERR_STATE, "lockd: not started");
	/* epoll_wait blocks and collects in one syscall what poll + a
	 * zero-timeout epoll_wait did in two. */
	while (!atomic_load(&d->stopped)) {
		int rc = process_round(d, gf_lockd_get_timeout_ms(d));
		if (rc < 0)
			return rc;
	}
	return 0;
}

void gf_lockd_stop(gf_lockd *d)
{
	if (!d)
		return;
	atomic_store(&d->stopped, true);
	uint64_t one = 1;
	ssize_t r = write(d->stopfd, &one, sizeof(one));
	(void)r;
}
