/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock's socket backend: gf-lockd's protocol over unix:// and tcp://
 * (docs/design.md, decision 8). Acquire, hold, heartbeat (tcp), reconnect and
 * reclaim after a server restart, the listeners that come with a grant, and
 * the one-shot requests. client.c is the façade over it (fork safety, the
 * watcher, the hooks); docs/protocol.md describes the messages.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backend.h"
#include "wire.h"

#define RETRY_US 50000           /* between reconnect attempts */
#define ATTEMPT_US 1000000       /* one reconnect attempt (connect+handshake+reply) at most */
/* After LockNext the grant follows once the server has written its state
 * file (tens of microseconds on tmpfs): the waiter polls without sleeping,
 * yielding its CPU, for at most this long, then blocks as before. */
#define NEXT_SPIN_US 2000
#define RELEASE_WAIT_US 1000000  /* wait for the server's Ok to an explicit release */

enum cstate { C_IDLE, C_WAITING, C_HELD, C_RECONNECTING, C_LOST };

struct sock {
	struct gf_uri uri;
	char uristr[400];
	uint8_t *secret;
	size_t secret_len;
	int64_t eff_hb_ms, eff_fence_ms; /* after the server's advice at grant time */
	int fd;
	struct gf_frame_reader rd;
	_Atomic int state;
	struct gf_lock_grant grant;
	_Atomic uint64_t epoch;
	int64_t last_heard, next_hb, reconnect_deadline, next_attempt;
	/* Since when the server has been found down (a connect refused: no
	 * process listens) without a connection since (0: not down), for
	 * gf_lock_unreachable_ms(); written by the connection's owner. */
	_Atomic int64_t unreachable_since;
	int64_t lost_at; /* when the held connection was lost */
	/* A unix holder past its reconnect time whose server is down: it keeps
	 * the lock and retries (docs/design.md, decision 31); logged once. */
	bool holding_on;
	uint32_t seq;
	gf_Msg *msg;
	/* The listeners that came with the grant (unix only); ours, closed on release. */
	struct gf_lock_listener lsn[GF_LIMIT_LISTENERS];
	size_t nlsn;
	bool takes_serving; /* the grant said the server relays readiness (LockServing) */
	/* The acquire asks for LockNext: a next hook was installed when it began
	 * (without one LockNext would only wake this thread ahead of its grant,
	 * and the server's send of it would be on the hand-off's path). */
	bool takes_next;
	/*
	 * Further processes of the engine (gf_lock_add_pid()), sent on every
	 * new connection. fd_mu guards them, the fd's value as other threads
	 * see it and every send a thread other than the connection's owner may
	 * interleave with (gf_lock_add_pid() sends from any thread): the owner
	 * (the acquiring thread, or the watcher under l->mu) changes s->fd and
	 * sends only with it held. Taken after l->mu, never the other way.
	 */
	pthread_mutex_t fd_mu;
	struct sock_pid {
		int fd; /* pidfd */
		int pid;
	} pids[GF_LOCK_MAX_PIDS];
	size_t npids;
	gf_Msg *pmsg; /* LockAddPids scratch, under fd_mu */
};

static void drop_conn(gf_lock *l)
{
	struct sock *s = l->priv;
	pthread_mutex_lock(&s->fd_mu);
	gf_close(s->fd);
	s->fd = -1;
	pthread_mutex_unlock(&s->fd_mu);
	gf_frame_reader_clear(&s->rd);
	gf_frame_reader_init(&s->rd, GF_LIMIT_LISTENERS);
	gf_frame_reader_set_max_body(&s->rd, GF_LOCK_MAX_FRAME);
}

static void drop_listeners(gf_lock *l)
{
	struct sock *s = l->priv;
	for (size_t i = 0; i < s->nlsn; i++)
		gf_close(s->lsn[i].fd);
	s->nlsn = 0;
}

/* A new grant's listeners replace the old ones; @fds are taken. */
static void take_listeners(gf_lock *l, const gf_LockGranted *g, int *fds, size_t nfds)
{
	struct sock *s = l->priv;
	drop_listeners(l);
	for (size_t i = 0; i < nfds; i++) {
		if (i < g->listeners_count && s->nlsn < GF_LIMIT_LISTENERS) {
			snprintf(s->lsn[s->nlsn].name, sizeof(s->lsn[s->nlsn].name), "%s", g->listeners[i]);
			s->lsn[s->nlsn++].fd = fds[i];
		} else {
			gf_close(fds[i]);
		}
	}
}

static bool is_tcp(const gf_lock *l)
{
	const struct sock *s = l->priv;
	return s->uri.kind == GF_URI_TCP;
}

/* Connect and handshake; on success s->fd is set. */
static int connect_once(gf_lock *l, int64_t deadline)
{
	struct sock *s = l->priv;
	int fd, rc = gf_uri_connect(&s->uri, deadline, &fd);
	if (rc < 0)
		return rc;
	if (is_tcp(l)) {
		/* Dead hosts and half-open connections; a stopped peer still
		 * answers keepalives, so the heartbeats and T_fence decide. */
		int one = 1, idle = 1, intvl = 1, cnt = 3;
		unsigned int uto = (unsigned int)l->fence_ms;
		setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
		setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
	}
	struct gf_frame_reader rd;
	gf_frame_reader_init(&rd, GF_LIMIT_LISTENERS);
	gf_frame_reader_set_max_body(&rd, GF_LOCK_MAX_FRAME);
	/* Every reader of this connection reads until nothing is left before
	 * it polls (or asks for no timeout): a grant that came with the
	 * "you are next" before it is taken with it, in one read. */
	gf_frame_reader_set_read_ahead(&rd);
	rc = gf_handshake_client(fd, &rd, gf_Component_COMPONENT_LOCK, l->id, s->secret, s->secret_len, deadline,
				 NULL);
	if (rc < 0) {
		gf_frame_reader_clear(&rd);
		gf_close(fd);
		return rc;
	}
	drop_conn(l);
	gf_frame_reader_clear(&s->rd);
	s->rd = rd;
	pthread_mutex_lock(&s->fd_mu);
	s->fd = fd;
	pthread_mutex_unlock(&s->fd_mu);
	s->last_heard = gf_now_us();
	s->next_hb = s->last_heard + l->hb_ms * 1000;
	atomic_store(&s->unreachable_since, 0);
	return 0;
}

/* Send LockAddPids with @n pidfds of s->pids from @first. With fd_mu held. */
static int send_pids(struct sock *s, size_t first, size_t n, int64_t deadline)
{
	while (n > 0) {
		size_t k = n < GF_LIMIT_LISTENERS ? n : GF_LIMIT_LISTENERS; /* the server takes 16 fds a message */
		int fds[GF_LIMIT_LISTENERS];
		for (size_t i = 0; i < k; i++)
			fds[i] = s->pids[first + i].fd;
		gf_Msg *m = s->pmsg;
		memset(m, 0, sizeof(*m));
		m->which_body = gf_Msg_lock_add_pids_tag;
		m->body.lock_add_pids.count = (uint32_t)k;
		int rc = gf_msg_send(s->fd, m, fds, k, deadline);
		if (rc < 0)
			return rc;
		first += k;
		n -= k;
	}
	return 0;
}

static int send_acquire(gf_lock *l, int64_t timeout_ms, bool reclaim, int64_t deadline)
{
	struct sock *s = l->priv;
	pthread_mutex_lock(&s->fd_mu);
	int rc = send_pids(s, 0, s->npids, deadline);
	pthread_mutex_unlock(&s->fd_mu);
	if (rc < 0)
		return rc;
	gf_Msg *m = s->msg;
	memset(m, 0, sizeof(*m));
	m->seq = ++s->seq;
	m->which_body = gf_Msg_lock_acquire_tag;
	snprintf(m->body.lock_acquire.engine_id, sizeof(m->body.lock_acquire.engine_id), "%s", l->id);
	m->body.lock_acquire.timeout_ms = timeout_ms;
	gf_LockAcquire *a = &m->body.lock_acquire;
	a->gpus_count = l->decl.ngpus;
	memcpy(a->gpus, l->decl.gpus, sizeof(a->gpus));
	a->wake_bytes = l->decl.wake_bytes;
	a->asleep_bytes = l->decl.asleep_bytes;
	a->pinned = l->decl.pinned;
	memcpy(a->model, l->decl.model, sizeof(a->model));
	a->reports_serving = l->reports_serving;
	a->takes_next = s->takes_next;
	a->serving = reclaim && l->serving;
	int fds[GF_LIMIT_LISTENERS];
	size_t nfds = 0;
	if (reclaim) {
		memcpy(m->body.lock_acquire.session_token.bytes, s->grant.session_token, GF_LOCK_TOKEN_LEN);
		m->body.lock_acquire.session_token.size = GF_LOCK_TOKEN_LEN;
		m->body.lock_acquire.epoch = s->grant.epoch;
		/* A restarted server could not bind the sockets we still listen on: hand them back. */
		for (; !is_tcp(l) && nfds < s->nlsn; nfds++) {
			snprintf(m->body.lock_acquire.listeners[nfds], sizeof(m->body.lock_acquire.listeners[nfds]), "%s",
				 s->lsn[nfds].name);
			fds[nfds] = s->lsn[nfds].fd;
		}
		m->body.lock_acquire.listeners_count = (pb_size_t)nfds;
	}
	pthread_mutex_lock(&s->fd_mu);
	rc = gf_msg_send(s->fd, m, fds, nfds, deadline);
	pthread_mutex_unlock(&s->fd_mu);
	return rc;
}

static void send_heartbeat(gf_lock *l)
{
	struct sock *s = l->priv;
	gf_Msg *m = s->msg;
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_heartbeat_tag;
	m->body.heartbeat.seq = (uint64_t)(gf_now_us() / 1000);
	/* A full send buffer means the server is not reading: T_fence decides. */
	gf_msg_send(s->fd, m, NULL, 0, gf_now_us() + 10000);
}

static void take_grant(gf_lock *l, const gf_LockGranted *g)
{
	struct sock *s = l->priv;
	s->grant.epoch = g->epoch;
	memset(s->grant.session_token, 0, sizeof(s->grant.session_token));
	memcpy(s->grant.session_token, g->session_token.bytes,
	       g->session_token.size < GF_LOCK_TOKEN_LEN ? g->session_token.size : GF_LOCK_TOKEN_LEN);
	s->grant.granted_at_us = g->granted_at_us;
	s->grant.reclaimed = g->reclaimed;
	s->grant.has_fence_proof = g->fence_proof.size == GF_LOCK_PROOF_LEN;
	memset(s->grant.fence_proof, 0, sizeof(s->grant.fence_proof));
	if (s->grant.has_fence_proof)
		memcpy(s->grant.fence_proof, g->fence_proof.bytes, GF_LOCK_PROOF_LEN);
	s->eff_hb_ms = g->heartbeat_ms > 0 && g->heartbeat_ms < l->hb_ms ? g->heartbeat_ms : l->hb_ms;
	s->eff_fence_ms = g->fence_ms > 0 && g->fence_ms < l->fence_ms ? g->fence_ms : l->fence_ms;
	s->takes_serving = g->takes_serving;
	atomic_store(&s->epoch, g->epoch);
	s->last_heard = gf_now_us();
	s->next_hb = s->last_heard + s->eff_hb_ms * 1000;
	atomic_store(&s->state, C_HELD);
}

/* Sleep until @until_us or an interrupt; true if interrupted. */
static bool nap(gf_lock *l, int64_t until_us)
{
	struct pollfd p = { .fd = l->intr_fd, .events = POLLIN };
	if (poll(&p, 1, gf_poll_timeout_ms(until_us)) > 0)
		return gf_lock_interrupted(l);
	return false;
}

/* Tells the next hook (gf_lock_set_next_fn()) that this waiter is next, or no longer. */
static void tell_next(gf_lock *l, int next, const gf_LockNext *n)
{
	pthread_mutex_lock(&l->mu);
	gf_lock_next_fn fn = l->next_fn;
	void *ud = l->next_ud;
	pthread_mutex_unlock(&l->mu);
	if (!fn)
		return;
	struct gf_lock_proof proof = { .epoch = 0 };
	if (next && n && n->epoch && n->fence_proof.size == GF_LOCK_PROOF_LEN) {
		proof.epoch = n->epoch;
		memcpy(proof.token, n->fence_proof.bytes, GF_LOCK_PROOF_LEN);
	}
	fn(l, next, proof.epoch ? &proof : NULL, ud);
}

/* A waiter told it was next and then not granted (the connection broke, or the acquire ends) is no longer so. */
static void no_longer_next(gf_lock *l, bool *told)
{
	if (!*told)
		return;
	*told = false;
	tell_next(l, 0, NULL);
}

/*
 * An acquire is a small state machine over named steps: connect (and send
 * the acquire), wait (poll, heartbeats, a silent TCP server), read (the
 * server's answers), until granted or failed. The deadline is checked before
 * every connect and every wait.
 */
enum acq_step { ACQ_CONNECT, ACQ_WAIT, ACQ_READ, ACQ_GRANTED, ACQ_FAILED };

struct acquiring {
	bool once;                  /* timeout 0: ask once */
	int64_t deadline;
	int64_t unreachable_since;  /* when the server was last lost (-1: reachable) */
	bool queued;                /* the server took this acquire once: a unix waiter keeps its place */
	bool said_holding_on;       /* ... and said so once, past the reconnect time */
	int64_t spin_until;         /* told LockNext: poll without sleeping until then */
	bool told_next;             /* the next hook was told 1 and not yet 0 */
	struct pollfd p[2];         /* the wait's poll, read by the read step */
	int rc;                     /* why it failed */
};

static enum acq_step acq_failed(struct acquiring *a, int rc)
{
	a->rc = rc;
	return ACQ_FAILED;
}

/* Connect (within the reconnect budget) and send the acquire. */
static enum acq_step acq_connect(gf_lock *l, struct acquiring *a)
{
	struct sock *s = l->priv;
	int64_t now = gf_now_us();
	if (a->unreachable_since < 0)
		a->unreachable_since = now;
	/* A unix waiter that was in line stays a waiter through a server
	 * outage: nobody can be granted while the only server is down, and
	 * the line forms again when it returns (decision 31). */
	int64_t give_up = a->queued && !is_tcp(l) ? INT64_MAX : a->unreachable_since + l->reconnect_ms * 1000;
	if (give_up == INT64_MAX && !a->said_holding_on && now - a->unreachable_since >= l->reconnect_ms * 1000) {
		a->said_holding_on = true;
		gf_log(GF_LOG_ERR, "lock",
		       "msg=\"lock server unreachable past the reconnect time; still waiting (unix: nobody can be granted meanwhile)\" id=%s unreachable_ms=%lld",
		       l->id, (long long)((now - a->unreachable_since) / 1000));
	}
	int64_t d = a->deadline < give_up ? a->deadline : give_up;
	if (d > now + ATTEMPT_US)
		d = now + ATTEMPT_US;
	int rc = connect_once(l, d);
	if (rc == GF_ERR_UNREACHABLE && atomic_load(&s->unreachable_since) == 0)
		atomic_store(&s->unreachable_since, a->unreachable_since);
	if (rc == GF_ERR_PERMISSION || rc == GF_ERR_VERSION || rc == GF_ERR_INVALID_ARG)
		return acq_failed(a, rc);
	if (rc == 0) {
		int64_t left = a->deadline == INT64_MAX ? -1 : (a->deadline - gf_now_us()) / 1000;
		if (a->once || (left < 0 && a->deadline != INT64_MAX))
			left = 0;
		rc = send_acquire(l, left, false, gf_now_us() + ATTEMPT_US);
		if (rc == 0) {
			a->unreachable_since = -1;
			a->queued = true;
			return ACQ_WAIT;
		}
		drop_conn(l);
	}
	if (gf_now_us() >= give_up)
		return acq_failed(a, gf_err(GF_ERR_UNREACHABLE, "lock %s: server %s not reachable for %lldms (%s)", l->id,
					    s->uristr, (long long)l->reconnect_ms, gf_error_detail()));
	int64_t until = gf_now_us() + RETRY_US;
	if (nap(l, until < a->deadline ? until : a->deadline))
		return acq_failed(a, gf_err(GF_ERR_INTERRUPTED, "lock %s: acquire interrupted", l->id));
	return ACQ_CONNECT;
}

/* Wait for the server's answer, an interrupt or the deadline; keep a TCP connection's heartbeats. */
static enum acq_step acq_wait(gf_lock *l, struct acquiring *a)
{
	struct sock *s = l->priv;
	a->p[0] = (struct pollfd){ .fd = s->fd, .events = POLLIN };
	a->p[1] = (struct pollfd){ .fd = l->intr_fd, .events = POLLIN };
	int64_t wake = a->deadline;
	if (is_tcp(l)) {
		if (s->next_hb < wake)
			wake = s->next_hb;
		if (s->last_heard + l->fence_ms * 1000 < wake)
			wake = s->last_heard + l->fence_ms * 1000;
	}
	if (gf_frame_reader_buffered(&s->rd))
		return ACQ_READ;
	bool spin = a->spin_until && gf_now_us() < a->spin_until;
	int n = poll(a->p, 2, spin ? 0 : gf_poll_timeout_ms(wake));
	if (n == 0 && spin) {
		sched_yield(); /* the server may be waiting for this CPU */
		return ACQ_WAIT;
	}
	if (n < 0 && errno != EINTR)
		return acq_failed(a, gf_err_errno(GF_ERR_IO, errno, "lock: poll"));
	if (n > 0 && (a->p[1].revents & POLLIN) && gf_lock_interrupted(l))
		return acq_failed(a, gf_err(GF_ERR_INTERRUPTED, "lock %s: acquire interrupted", l->id));
	int64_t now = gf_now_us();
	if (is_tcp(l)) {
		if (now - s->last_heard >= l->fence_ms * 1000) {
			/* A silent TCP server: reconnect and keep waiting. */
			drop_conn(l);
			a->spin_until = 0;
			no_longer_next(l, &a->told_next);
			return ACQ_CONNECT;
		}
		if (now >= s->next_hb) {
			send_heartbeat(l);
			s->next_hb = now + l->hb_ms * 1000;
		}
	}
	return n > 0 && a->p[0].revents ? ACQ_READ : ACQ_WAIT;
}

/* Read what the server sent: the grant, a refusal, "you are next", its heartbeats. */
static enum acq_step acq_read(gf_lock *l, struct acquiring *a)
{
	struct sock *s = l->priv;
	for (;;) {
		int *fds = NULL;
		size_t nfds = 0;
		int r = gf_msg_try_recv(&s->rd, s->fd, s->msg, &fds, &nfds);
		if (r == GF_ERR_AGAIN)
			return ACQ_WAIT;
		if (r < 0) {
			/* The server went away: a waiter reconnects and keeps waiting,
			 * and is not next any more (it queues again). */
			gf_log(GF_LOG_INFO, "lock", "msg=\"server connection lost while waiting; reconnecting\" id=%s", l->id);
			drop_conn(l);
			a->spin_until = 0;
			no_longer_next(l, &a->told_next);
			return ACQ_CONNECT;
		}
		s->last_heard = gf_now_us();
		gf_Msg *m = s->msg;
		if (m->which_body == gf_Msg_lock_granted_tag) {
			take_listeners(l, &m->body.lock_granted, fds, nfds);
			free(fds);
			take_grant(l, &m->body.lock_granted);
			return ACQ_GRANTED;
		}
		gf_close_fds(fds, nfds);
		free(fds);
		if (m->which_body == gf_Msg_error_tag)
			return acq_failed(a, gf_msg_error_code(m));
		if (m->which_body == gf_Msg_lock_next_tag) {
			tell_next(l, 1, &m->body.lock_next);
			a->told_next = true;
			a->spin_until = gf_now_us() + NEXT_SPIN_US;
		}
		/* Answer the server's heartbeats: a waiter does not know the
		 * server's interval before its grant, this keeps pace with it. */
		if (m->which_body == gf_Msg_heartbeat_tag && is_tcp(l)) {
			send_heartbeat(l);
			s->next_hb = gf_now_us() + l->hb_ms * 1000;
		}
	}
}

static int sock_acquire(gf_lock *l, int64_t timeout_ms, struct gf_lock_grant *grant)
{
	struct sock *s = l->priv;
	int st = atomic_load(&s->state);
	if (st == C_HELD || st == C_RECONNECTING)
		return gf_err(GF_ERR_STATE, "lock %s: already held", l->id);
	if (st == C_WAITING)
		return gf_err(GF_ERR_STATE, "lock %s: an acquire is already in progress", l->id);
	atomic_store(&s->state, C_WAITING);
	drop_listeners(l);
	pthread_mutex_lock(&l->mu);
	l->serving = false;
	s->takes_next = l->next_fn != NULL;
	pthread_mutex_unlock(&l->mu);
	/* 0 means ask once: one connection attempt, and the server answers the
	 * acquire at once (granted, or timed out when the lock is held). */
	struct acquiring a = { .once = timeout_ms == 0, .unreachable_since = -1 };
	a.deadline = a.once ? gf_now_us() + ATTEMPT_US : gf_deadline_from_ms(timeout_ms);
	enum acq_step step = s->fd < 0 ? ACQ_CONNECT : ACQ_WAIT;
	while (step != ACQ_GRANTED && step != ACQ_FAILED) {
		if (step != ACQ_READ && gf_now_us() >= a.deadline) {
			acq_failed(&a, a.once ? gf_err(GF_ERR_TIMEOUT, "lock %s: no answer to a single try within %dms", l->id,
						      ATTEMPT_US / 1000)
					      : gf_err(GF_ERR_TIMEOUT, "lock %s: not granted within %lldms", l->id,
						       (long long)timeout_ms));
			break;
		}
		step = step == ACQ_CONNECT ? acq_connect(l, &a) : step == ACQ_WAIT ? acq_wait(l, &a) : acq_read(l, &a);
	}
	if (step == ACQ_GRANTED) {
		if (grant)
			*grant = s->grant;
		return 0;
	}
	no_longer_next(l, &a.told_next);
	drop_conn(l);
	atomic_store(&s->unreachable_since, 0);
	atomic_store(&s->state, C_IDLE);
	return a.rc;
}

/* Called with l->mu held. */
static int become_lost(gf_lock *l, const char *why, struct gf_lock_news *news)
{
	struct sock *s = l->priv;
	drop_conn(l);
	atomic_store(&s->state, C_LOST);
	news->lost = true;
	snprintf(news->detail, sizeof(news->detail), "lock %s epoch %llu lost: %s", l->id, (unsigned long long)s->grant.epoch, why);
	gf_log(GF_LOG_ERR, "lock", "msg=\"lock lost\" id=%s epoch=%llu reason=\"%s\"", l->id,
	       (unsigned long long)s->grant.epoch, why);
	return GF_ERR_LOCK_LOST;
}

static void start_reconnect(gf_lock *l, const char *why)
{
	struct sock *s = l->priv;
	int64_t now = gf_now_us();
	drop_conn(l);
	atomic_store(&s->state, C_RECONNECTING);
	s->reconnect_deadline = now + l->reconnect_ms * 1000;
	/* On TCP the lease decides: past T_fence the server may have re-granted. */
	if (is_tcp(l) && s->last_heard + s->eff_fence_ms * 1000 < s->reconnect_deadline)
		s->reconnect_deadline = s->last_heard + s->eff_fence_ms * 1000;
	s->next_attempt = now;
	s->holding_on = false;
	s->lost_at = now;
	gf_log(GF_LOG_WARN, "lock", "msg=\"lock server connection lost; reconnecting\" id=%s epoch=%llu reason=\"%s\" reconnect_ms=%lld",
	       l->id, (unsigned long long)s->grant.epoch, why, (long long)((s->reconnect_deadline - now) / 1000));
}

/* One reclaim attempt. 1: held again, 0: try later, <0: lost for good. */
static int reclaim_once(gf_lock *l)
{
	struct sock *s = l->priv;
	int64_t d = gf_now_us() + ATTEMPT_US;
	if (!s->holding_on && d > s->reconnect_deadline)
		d = s->reconnect_deadline;
	int rc = connect_once(l, d);
	if (rc == GF_ERR_PERMISSION || rc == GF_ERR_VERSION)
		return rc;
	/* Refused or no socket: no server runs. Anything else (a full backlog,
	 * no handshake) is a server that is up and not answering us. */
	if (rc == GF_ERR_UNREACHABLE) {
		if (atomic_load(&s->unreachable_since) == 0)
			atomic_store(&s->unreachable_since, s->lost_at);
	} else if (rc < 0) {
		atomic_store(&s->unreachable_since, 0);
	}
	if (rc < 0)
		return 0;
	rc = send_acquire(l, 0, true, d);
	int *fds = NULL;
	size_t nfds = 0;
	if (rc == 0)
		rc = gf_msg_recv(&s->rd, s->fd, s->msg, &fds, &nfds, d);
	/* The listeners we kept are the same sockets (handed back, or still busy
	 * for the server): the engine goes on serving from the fds it has. */
	gf_close_fds(fds, nfds);
	free(fds);
	if (rc < 0) {
		drop_conn(l);
		return 0;
	}
	if (s->msg->which_body == gf_Msg_lock_granted_tag && s->msg->body.lock_granted.epoch == s->grant.epoch) {
		take_grant(l, &s->msg->body.lock_granted);
		gf_log(GF_LOG_INFO, "lock", "msg=\"lock regained after server restart\" id=%s epoch=%llu", l->id,
		       (unsigned long long)s->grant.epoch);
		return 1;
	}
	rc = gf_msg_error_code(s->msg);
	drop_conn(l);
	/* A server that cannot persist yet is worth another try. */
	if (rc == GF_ERR_IO)
		return 0;
	return rc < 0 ? rc : GF_ERR_PROTOCOL;
}

static int sock_process(gf_lock *l, struct gf_lock_news *news)
{
	struct sock *s = l->priv;
	int rc = 0;
	int64_t now = gf_now_us();
	int st = atomic_load(&s->state);
	if (st == C_LOST)
		return gf_err(GF_ERR_LOCK_LOST, "lock %s: lost", l->id);
	if (st == C_HELD) {
		/* Check the lease before reading: data that queued up while this
		 * process was stopped does not make the past silence go away. */
		if (is_tcp(l) && now - s->last_heard >= s->eff_fence_ms * 1000)
			return become_lost(l, "no word from the server for T_fence", news);
		for (;;) {
			int r = gf_msg_try_recv(&s->rd, s->fd, s->msg, NULL, NULL);
			if (r == GF_ERR_AGAIN)
				break;
			if (r < 0) {
				start_reconnect(l, r == GF_ERR_CLOSED ? "connection closed" : gf_error_detail());
				break;
			}
			s->last_heard = gf_now_us();
			if (s->msg->which_body == gf_Msg_error_tag) {
				gf_msg_error_code(s->msg);
				start_reconnect(l, gf_error_detail());
				break;
			}
			if (s->msg->which_body == gf_Msg_lock_step_down_tag &&
			    s->msg->body.lock_step_down.epoch == s->grant.epoch) {
				gf_log(GF_LOG_INFO, "lock", "msg=\"asked to step down (planned switchover)\" id=%s epoch=%llu",
				       l->id, (unsigned long long)s->grant.epoch);
				news->step_down = s->grant.epoch;
			}
		}
		if (atomic_load(&s->state) == C_HELD && is_tcp(l) && now >= s->next_hb) {
			send_heartbeat(l);
			s->next_hb = now + s->eff_hb_ms * 1000;
		}
	}
	if (atomic_load(&s->state) == C_RECONNECTING) {
		now = gf_now_us();
		bool past = now >= s->reconnect_deadline, down = atomic_load(&s->unreachable_since) != 0;
		/* unix, the server down (no process listens): nobody else can be
		 * granted meanwhile, and a restarted server opens the reconnect
		 * window for this holder; so it keeps the lock and keeps trying.
		 * A server that is up and does not take it back may be granting
		 * others: the reconnect time ends it, as on tcp. */
		if (past && (is_tcp(l) || !down))
			return become_lost(l, "server not regained within the reconnect time", news);
		if (past && !s->holding_on) {
			s->holding_on = true;
			gf_log(GF_LOG_ERR, "lock",
			       "msg=\"lock server unreachable past the reconnect time; holding on (unix: nobody else can be granted meanwhile)\" id=%s epoch=%llu unreachable_ms=%lld",
			       l->id, (unsigned long long)s->grant.epoch,
			       (long long)((now - atomic_load(&s->unreachable_since)) / 1000));
		}
		if (now >= s->next_attempt) {
			int r = reclaim_once(l);
			if (r < 0) {
				char why[300];
				snprintf(why, sizeof(why), "reclaim refused: %s", gf_error_detail());
				return become_lost(l, why, news);
			}
			if (r == 0)
				s->next_attempt = gf_now_us() + RETRY_US;
		}
	}
	return rc;
}

static int sock_release(gf_lock *l)
{
	struct sock *s = l->priv;
	pthread_mutex_lock(&l->mu);
	int st = atomic_load(&s->state), rc = 0;
	if (st == C_HELD && s->fd >= 0) {
		gf_Msg *m = s->msg;
		memset(m, 0, sizeof(*m));
		m->seq = ++s->seq;
		m->which_body = gf_Msg_lock_release_tag;
		int64_t d = gf_now_us() + RELEASE_WAIT_US;
		/* Wait for the Ok so the server released on purpose (no exit wait);
		 * heartbeats may arrive first. */
		pthread_mutex_lock(&s->fd_mu);
		int src = gf_msg_send(s->fd, m, NULL, 0, d);
		pthread_mutex_unlock(&s->fd_mu);
		if (src == 0) {
			while (gf_msg_recv(&s->rd, s->fd, m, NULL, NULL, d) == 0 && m->which_body == gf_Msg_heartbeat_tag)
				;
		}
	} else if (st != C_HELD && st != C_RECONNECTING) {
		rc = gf_err(GF_ERR_STATE, "lock %s: not held", l->id);
	}
	drop_conn(l);
	drop_listeners(l);
	atomic_store(&s->unreachable_since, 0);
	atomic_store(&s->state, C_IDLE);
	pthread_mutex_unlock(&l->mu);
	return rc;
}

static int sock_serving(gf_lock *l)
{
	struct sock *s = l->priv;
	int rc = 0;
	pthread_mutex_lock(&l->mu);
	int st = atomic_load(&s->state);
	if (st != C_HELD && st != C_RECONNECTING) {
		rc = gf_err(GF_ERR_STATE, "lock %s: serving: not held", l->id);
	} else {
		l->serving = true;
		/* Reconnecting: the reclaim says so. An older server takes no LockServing. */
		if (st == C_HELD && s->takes_serving && s->fd >= 0) {
			gf_Msg *m = s->msg;
			memset(m, 0, sizeof(*m));
			m->which_body = gf_Msg_lock_serving_tag;
			m->body.lock_serving.epoch = s->grant.epoch;
			pthread_mutex_lock(&s->fd_mu);
			rc = gf_msg_send(s->fd, m, NULL, 0, gf_now_us() + 10000);
			pthread_mutex_unlock(&s->fd_mu);
		}
	}
	pthread_mutex_unlock(&l->mu);
	return rc;
}

/* Forget registered processes that exited (they free their slot). With fd_mu held. */
static void prune_pids(struct sock *s)
{
	size_t keep = 0;
	for (size_t i = 0; i < s->npids; i++) {
		struct pollfd p = { .fd = s->pids[i].fd, .events = POLLIN };
		if (poll(&p, 1, 0) == 1)
			gf_close(s->pids[i].fd);
		else
			s->pids[keep++] = s->pids[i];
	}
	s->npids = keep;
}

static int sock_add_pid(gf_lock *l, int pid)
{
	struct sock *s = l->priv;
	if (is_tcp(l))
		return gf_err(GF_ERR_NOT_SUPPORTED,
			      "lock %s: add_pid: a pidfd cannot cross hosts; over tcp:// the lease fences (docs/lock.md)", l->id);
	if (pid == (int)getpid())
		return 0; /* the connection's own process is always waited for */
	int rc = 0;
	pthread_mutex_lock(&s->fd_mu);
	prune_pids(s);
	for (size_t i = 0; i < s->npids; i++)
		if (s->pids[i].pid == pid)
			goto out;
	if (s->npids >= GF_LOCK_MAX_PIDS) {
		rc = gf_err(GF_ERR_TOO_BIG, "lock %s: add_pid: %d live processes are registered already, the most one lock takes",
			    l->id, GF_LOCK_MAX_PIDS);
		goto out;
	}
	int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
	if (fd < 0) {
		rc = errno == ESRCH    ? gf_err(GF_ERR_NOT_FOUND, "lock %s: add_pid: no process %d (it exited, or never was)", l->id, pid)
		     : errno == ENOSYS ? gf_err(GF_ERR_NOT_SUPPORTED, "lock %s: add_pid: pidfd_open is not available (Linux 5.3 or later)", l->id)
				       : gf_err_errno(GF_ERR_IO, errno, "lock %s: add_pid: pidfd_open(%d)", l->id, pid);
		goto out;
	}
	s->pids[s->npids].fd = fd;
	s->pids[s->npids].pid = pid;
	s->npids++;
	/* Connected (waiting, holding or reclaiming): the server has it before
	 * whatever this connection says next, its hang-up included. A failed
	 * send means the connection is going: the next one carries it. */
	if (s->fd >= 0 && send_pids(s, s->npids - 1, 1, gf_now_us() + ATTEMPT_US) < 0)
		gf_log(GF_LOG_DEBUG, "lock", "msg=\"registering a process: send failed, the next connection carries it\" id=%s pid=%d error=\"%s\"",
		       l->id, pid, gf_error_detail());
out:
	pthread_mutex_unlock(&s->fd_mu);
	return rc;
}

static int sock_listeners(const gf_lock *l, const struct gf_lock_listener **out, size_t *n)
{
	const struct sock *s = l->priv;
	if (is_tcp(l))
		return gf_err(GF_ERR_NOT_SUPPORTED,
			      "lock %s: listeners travel as file descriptors, over unix:// lock servers only", l->id);
	int st = atomic_load(&s->state);
	if (st != C_HELD && st != C_RECONNECTING)
		return gf_err(GF_ERR_STATE, "lock %s: listeners come with a grant; not held", l->id);
	*out = s->lsn;
	*n = s->nlsn;
	return 0;
}

static int sock_is_held(const gf_lock *l)
{
	const struct sock *s = l->priv;
	int st = atomic_load(&s->state);
	return st == C_HELD || st == C_RECONNECTING;
}

static uint64_t sock_epoch(const gf_lock *l)
{
	const struct sock *s = l->priv;
	return atomic_load(&s->epoch);
}

static int64_t sock_unreachable_ms(const gf_lock *l)
{
	const struct sock *s = l->priv;
	int64_t since = atomic_load(&s->unreachable_since);
	return since ? (gf_now_us() - since) / 1000 : 0;
}

static int sock_get_fd(gf_lock *l)
{
	struct sock *s = l->priv;
	return atomic_load(&s->state) == C_HELD ? s->fd : -1;
}

static int64_t sock_fence_ms(const gf_lock *l)
{
	const struct sock *s = l->priv;
	if (!is_tcp(l))
		return 0;
	return s->eff_fence_ms > 0 ? s->eff_fence_ms : l->fence_ms;
}

static int sock_get_timeout_ms(gf_lock *l)
{
	struct sock *s = l->priv;
	int64_t t = INT64_MAX;
	int st = atomic_load(&s->state);
	if (st == C_HELD && gf_frame_reader_buffered(&s->rd))
		return 0; /* messages read with the grant, not announced by the fd */
	if (st == C_HELD && is_tcp(l)) {
		t = s->next_hb;
		if (s->last_heard + s->eff_fence_ms * 1000 < t)
			t = s->last_heard + s->eff_fence_ms * 1000;
	} else if (st == C_RECONNECTING) {
		t = s->holding_on || s->next_attempt < s->reconnect_deadline ? s->next_attempt : s->reconnect_deadline;
	}
	if (t == INT64_MAX)
		return -1;
	int64_t left = t - gf_now_us();
	return left <= 0 ? 0 : (int)((left + 999) / 1000);
}

/* The child shares the parent's connection: close our copy so that the lock
 * is released when the parent dies, even if this child lives on. */
static void sock_forked(gf_lock *l)
{
	struct sock *s = l->priv;
	/* Another thread of the parent may have held it at the fork. */
	pthread_mutex_init(&s->fd_mu, NULL);
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	/* The processes registered are the parent's engine's, not this child's. */
	for (size_t i = 0; i < s->npids; i++)
		close(s->pids[i].fd);
	s->npids = 0;
	atomic_store(&s->state, C_IDLE);
}

static bool sock_matches(const char *uri)
{
	(void)uri;
	return true;
}

static int sock_open(gf_lock *l, const char *uri)
{
	struct sock *s = calloc(1, sizeof(*s));
	if (!s)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	int rc = gf_uri_parse(uri, &s->uri);
	if (rc < 0) {
		free(s);
		return rc;
	}
	s->msg = gf_msg_new();
	s->pmsg = gf_msg_new();
	if (!s->msg || !s->pmsg) {
		gf_msg_free(s->msg);
		gf_msg_free(s->pmsg);
		free(s);
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	}
	pthread_mutex_init(&s->fd_mu, NULL);
	gf_uri_format(&s->uri, s->uristr, sizeof(s->uristr));
	s->fd = -1;
	gf_frame_reader_init(&s->rd, GF_LIMIT_LISTENERS);
	gf_frame_reader_set_max_body(&s->rd, GF_LOCK_MAX_FRAME);
	l->priv = s;
	return 0;
}

static void sock_free(gf_lock *l)
{
	struct sock *s = l->priv;
	drop_conn(l);
	drop_listeners(l);
	gf_frame_reader_clear(&s->rd);
	if (s->secret)
		memset(s->secret, 0, s->secret_len);
	free(s->secret);
	gf_msg_free(s->msg);
	gf_msg_free(s->pmsg);
	for (size_t i = 0; i < s->npids; i++)
		gf_close(s->pids[i].fd);
	pthread_mutex_destroy(&s->fd_mu);
	free(s);
	l->priv = NULL;
}

static int sock_set_secret(gf_lock *l, const void *secret, size_t len)
{
	struct sock *s = l->priv;
	uint8_t *b = malloc(len);
	if (!b)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	memcpy(b, secret, len);
	pthread_mutex_lock(&l->mu);
	if (s->secret)
		memset(s->secret, 0, s->secret_len);
	free(s->secret);
	s->secret = b;
	s->secret_len = len;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

/* ---- one-shot requests ---- */

static int oneshot(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, int *fd_out,
		   struct gf_frame_reader *rd)
{
	/* -1 on every error path, so callers never see an unset fd. */
	*fd_out = -1;
	struct gf_uri u;
	int rc = gf_uri_parse(uri, &u);
	if (rc < 0)
		return rc;
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	int fd;
	rc = gf_uri_connect(&u, deadline, &fd);
	if (rc < 0)
		return rc == GF_ERR_PERMISSION ? rc : gf_err(GF_ERR_UNREACHABLE, "%s", gf_error_detail());
	gf_frame_reader_init(rd, 0);
	rd->max_body = GF_FRAME_MAX_BODY;
	rc = gf_handshake_client(fd, rd, gf_Component_COMPONENT_LOCK, "gfctl", secret, secret_len, deadline, NULL);
	if (rc < 0) {
		if (rc == GF_ERR_CLOSED)
			rc = gf_err(GF_ERR_UNREACHABLE, "%s", gf_error_detail());
		gf_frame_reader_clear(rd);
		gf_close(fd);
		return rc;
	}
	*fd_out = fd;
	return 0;
}

static int sock_ping(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms)
{
	struct gf_frame_reader rd;
	int fd, rc = oneshot(uri, secret, secret_len, timeout_ms, &fd, &rd);
	if (rc < 0)
		return rc;
	gf_frame_reader_clear(&rd);
	gf_close(fd);
	return 0;
}

/*
 * One request on a connection of its own (status, readiness, admin): send
 * @m (filled by the caller; seq set here) and wait for the reply @want (an
 * Error reply becomes its code). @m then holds the reply.
 */
static int sock_call(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, gf_Msg *m,
		     pb_size_t want, const char *what)
{
	struct gf_frame_reader rd;
	int fd, rc = oneshot(uri, secret, secret_len, timeout_ms, &fd, &rd);
	if (rc < 0)
		return rc;
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	m->seq = 1;
	rc = gf_msg_send(fd, m, NULL, 0, deadline);
	while (rc == 0) {
		rc = gf_msg_recv(&rd, fd, m, NULL, NULL, deadline);
		if (rc < 0 || (rc = gf_msg_error_code(m)) < 0)
			break;
		if (m->which_body == want)
			break;
		if (m->which_body != gf_Msg_heartbeat_tag)
			rc = gf_err(GF_ERR_PROTOCOL, "%s: unexpected reply %s", what, gf_msg_name(m));
	}
	gf_frame_reader_clear(&rd);
	gf_close(fd);
	return rc;
}

/* A status request, with the fence proof to check when there is one. */
static int status_call(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms,
		       const struct gf_lock_proof *proof, gf_Msg **reply)
{
	gf_Msg *m = gf_msg_new();
	if (!m)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	m->which_body = gf_Msg_lock_status_request_tag;
	if (proof && proof->epoch) {
		m->body.lock_status_request.proof_epoch = proof->epoch;
		m->body.lock_status_request.proof.size = GF_LOCK_PROOF_LEN;
		memcpy(m->body.lock_status_request.proof.bytes, proof->token, GF_LOCK_PROOF_LEN);
	}
	int rc = sock_call(uri, secret, secret_len, timeout_ms, m, gf_Msg_lock_status_tag, "status");
	if (rc < 0) {
		gf_msg_free(m);
		return rc;
	}
	*reply = m;
	return 0;
}

static int sock_status_json(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, char **json)
{
	gf_Msg *m = NULL;
	int rc = status_call(uri, secret, secret_len, timeout_ms, NULL, &m);
	if (rc < 0)
		return rc;
	rc = gf_lock_status_to_json(&m->body.lock_status, json);
	gf_msg_free(m);
	return rc;
}

static int sock_holder(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms,
		       const struct gf_lock_proof *proof, struct gf_lock_holder *out)
{
	gf_Msg *m = NULL;
	int rc = status_call(uri, secret, secret_len, timeout_ms, proof, &m);
	if (rc < 0)
		return rc;
	const gf_LockStatus *st = &m->body.lock_status;
	memset(out, 0, sizeof(*out));
	if (st->holder[0]) {
		snprintf(out->id, sizeof(out->id), "%s", st->holder);
		out->epoch = st->epoch;
		out->pid = st->holder_pid;
		out->proof_valid = st->proof_valid;
	}
	gf_msg_free(m);
	return 0;
}

const struct gf_lock_backend gf_lock_socket_backend = {
	.name = "socket",
	.matches = sock_matches,
	.open = sock_open,
	.free = sock_free,
	.set_secret = sock_set_secret,
	.acquire = sock_acquire,
	.release = sock_release,
	.serving = sock_serving,
	.add_pid = sock_add_pid,
	.process = sock_process,
	.get_fd = sock_get_fd,
	.get_timeout_ms = sock_get_timeout_ms,
	.fence_ms = sock_fence_ms,
	.unreachable_ms = sock_unreachable_ms,
	.epoch = sock_epoch,
	.is_held = sock_is_held,
	.listeners = sock_listeners,
	.forked = sock_forked,
	.ping = sock_ping,
	.status_json = sock_status_json,
	.holder = sock_holder,
	.call = sock_call,
};
