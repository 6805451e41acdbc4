/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock client: acquire, hold, watch, reconnect (seed 000, Decision 8).
 *
 * Threads: gf_lock_acquire() runs on the caller's thread and does its I/O
 * without holding the object's mutex, so gf_lock_interrupt() (an eventfd
 * write) can always reach it. Once held, either the caller drives
 * gf_lock_process() from its own loop or the watcher thread does; the
 * mutex serialises the two with the query functions.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "etcd.h"
#include "lockint.h"
#include "pool.h"
#include "wire.h"

#define RETRY_US 50000           /* between reconnect attempts */
#define ATTEMPT_US 1000000       /* one reconnect attempt (connect+handshake+reply) at most */
#define RELEASE_WAIT_US 1000000  /* wait for the server's Ok to an explicit release */

enum cstate { C_IDLE, C_WAITING, C_HELD, C_RECONNECTING, C_LOST };

struct gf_lock {
	pthread_mutex_t mu;
	struct gf_uri uri;
	char uristr[400];
	char id[GF_LOCK_ID_MAX];
	uint8_t *secret;
	size_t secret_len;
	int64_t reconnect_ms, hb_ms, fence_ms;
	int64_t eff_hb_ms, eff_fence_ms; /* after the server's advice at grant time */
	gf_lock_lost_fn lost_fn;
	void *lost_ud;
	struct gf_pool_decl decl; /* sent with every acquire */
	gf_lock_step_down_fn step_down_fn;
	void *step_down_ud;
	int fd;
	struct gf_frame_reader rd;
	_Atomic int state;
	struct gf_lock_grant grant;
	_Atomic uint64_t epoch;
	int intr_fd;
	int64_t last_heard, next_hb, reconnect_deadline, next_attempt;
	uint32_t seq;
	/*
	 * The watcher: one thread, started by gf_lock_prepare_watch() (the
	 * engine does it before waiting, so a wake creates no thread) or by the
	 * first gf_lock_start_watch(), and parked between holds. wmu guards
	 * the w_* flags; watch_stop_fd ends a watch loop.
	 */
	pthread_mutex_t wmu;
	pthread_cond_t wcond;
	pthread_t watcher;
	bool w_started, w_quit;
	bool watching; /* armed: the loop runs (or is about to) */
	bool w_active; /* the thread is inside the loop */
	int watch_stop_fd;
	gf_Msg *msg;
	struct gf_etcd *etcd; /* etcd:// and etcds:// URIs: every call goes there */
	struct gf_lock *lnext, *lprev;
	/* The listeners that came with the grant (unix only); ours, closed on release. */
	struct gf_lock_listener lsn[GF_LIMIT_LISTENERS];
	size_t nlsn;
};

/* ---- fork safety: a fork of the holder must never hold the lock ---- */

static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gf_lock *all_locks;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
	pthread_mutex_lock(&list_mu);
	for (struct gf_lock *l = all_locks; l; l = l->lnext)
		pthread_mutex_lock(&l->mu);
}

static void fork_parent(void)
{
	for (struct gf_lock *l = all_locks; l; l = l->lnext)
		pthread_mutex_unlock(&l->mu);
	pthread_mutex_unlock(&list_mu);
}

static void fork_child(void)
{
	/* The child shares the parent's connection: close our copy so that the
	 * lock is released when the parent dies, even if this child lives on.
	 * Threads do not survive fork, so neither does a watcher. */
	for (struct gf_lock *l = all_locks; l; l = l->lnext) {
		if (l->fd >= 0)
			close(l->fd);
		l->fd = -1;
		if (l->etcd)
			gf_etcd_forked(l->etcd);
		atomic_store(&l->state, C_IDLE);
		l->watching = l->w_active = l->w_started = false;
		pthread_mutex_init(&l->mu, NULL);
		pthread_mutex_init(&l->wmu, NULL);
		pthread_cond_init(&l->wcond, NULL);
	}
	pthread_mutex_init(&list_mu, NULL);
}

static void register_atfork(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

int gf_lock_new(gf_lock **out, const char *uri, const char *engine_id)
{
	if (!out || !uri || !engine_id)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL argument");
	int idrc = gf_id_check(engine_id, "lock");
	if (idrc < 0)
		return idrc;
	gf_lock *l = calloc(1, sizeof(*l));
	if (!l)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	int rc = gf_etcd_is_uri(uri) ? gf_etcd_new(&l->etcd, uri, engine_id) : gf_uri_parse(uri, &l->uri);
	if (rc < 0) {
		free(l);
		return rc;
	}
	l->msg = gf_msg_new();
	l->intr_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	l->watch_stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!l->msg || l->intr_fd < 0 || l->watch_stop_fd < 0) {
		rc = l->msg ? gf_err_errno(GF_ERR_IO, errno, "lock: eventfd") : gf_err(GF_ERR_NOMEM, "lock: out of memory");
		gf_close(l->intr_fd);
		gf_close(l->watch_stop_fd);
		gf_msg_free(l->msg);
		gf_etcd_free(l->etcd);
		free(l);
		return rc;
	}
	pthread_mutex_init(&l->mu, NULL);
	pthread_mutex_init(&l->wmu, NULL);
	pthread_cond_init(&l->wcond, NULL);
	gf_uri_format(&l->uri, l->uristr, sizeof(l->uristr));
	memcpy(l->id, engine_id, strlen(engine_id) + 1);
	l->fd = -1;
	l->reconnect_ms = 12000;
	l->hb_ms = 1000;
	l->fence_ms = 3000;
	gf_frame_reader_init(&l->rd, GF_LIMIT_LISTENERS);
	gf_frame_reader_set_max_body(&l->rd, GF_LOCK_MAX_FRAME);
	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&list_mu);
	l->lnext = all_locks;
	if (all_locks)
		all_locks->lprev = l;
	all_locks = l;
	pthread_mutex_unlock(&list_mu);
	*out = l;
	return 0;
}

static void drop_conn(gf_lock *l)
{
	gf_close(l->fd);
	l->fd = -1;
	gf_frame_reader_clear(&l->rd);
	gf_frame_reader_init(&l->rd, GF_LIMIT_LISTENERS);
	gf_frame_reader_set_max_body(&l->rd, GF_LOCK_MAX_FRAME);
}

static void drop_listeners(gf_lock *l)
{
	for (size_t i = 0; i < l->nlsn; i++)
		gf_close(l->lsn[i].fd);
	l->nlsn = 0;
}

/* A new grant's listeners replace the old ones; @fds are taken. */
static void take_listeners(gf_lock *l, const gf_LockGranted *g, int *fds, size_t nfds)
{
	drop_listeners(l);
	for (size_t i = 0; i < nfds; i++) {
		if (i < g->listeners_count && l->nlsn < GF_LIMIT_LISTENERS) {
			snprintf(l->lsn[l->nlsn].name, sizeof(l->lsn[l->nlsn].name), "%s", g->listeners[i]);
			l->lsn[l->nlsn++].fd = fds[i];
		} else {
			gf_close(fds[i]);
		}
	}
}

void gf_lock_free(gf_lock *l)
{
	if (!l)
		return;
	gf_lock_stop_watch(l);
	pthread_mutex_lock(&l->wmu);
	bool started = l->w_started;
	l->w_quit = true;
	pthread_cond_broadcast(&l->wcond);
	pthread_mutex_unlock(&l->wmu);
	if (started)
		pthread_join(l->watcher, NULL);
	pthread_mutex_lock(&list_mu);
	if (l->lprev)
		l->lprev->lnext = l->lnext;
	else
		all_locks = l->lnext;
	if (l->lnext)
		l->lnext->lprev = l->lprev;
	pthread_mutex_unlock(&list_mu);
	drop_conn(l);
	drop_listeners(l);
	gf_etcd_free(l->etcd);
	gf_frame_reader_clear(&l->rd);
	gf_close(l->intr_fd);
	gf_close(l->watch_stop_fd);
	if (l->secret)
		memset(l->secret, 0, l->secret_len);
	free(l->secret);
	gf_msg_free(l->msg);
	pthread_cond_destroy(&l->wcond);
	pthread_mutex_destroy(&l->wmu);
	pthread_mutex_destroy(&l->mu);
	free(l);
}

int gf_lock_set_reconnect_timeout(gf_lock *l, int64_t ms)
{
	if (!l || ms < 0 || ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "lock: reconnect timeout outside 0..a year");
	pthread_mutex_lock(&l->mu);
	l->reconnect_ms = ms;
	pthread_mutex_unlock(&l->mu);
	if (l->etcd)
		return gf_etcd_set_reconnect_timeout(l->etcd, ms);
	return 0;
}

int gf_lock_set_secret(gf_lock *l, const void *secret, size_t len)
{
	if (!l || !secret || len == 0)
		return gf_err(GF_ERR_INVALID_ARG, "lock: empty secret");
	if (l->etcd)
		return gf_etcd_set_password(l->etcd, secret, len);
	uint8_t *s = malloc(len);
	if (!s)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	memcpy(s, secret, len);
	pthread_mutex_lock(&l->mu);
	free(l->secret);
	l->secret = s;
	l->secret_len = len;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int gf_lock_set_lease(gf_lock *l, int64_t heartbeat_ms, int64_t fence_ms)
{
	if (!l || heartbeat_ms <= 0 || fence_ms <= heartbeat_ms || fence_ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "lock: lease needs 0 < heartbeat < fence <= a year");
	pthread_mutex_lock(&l->mu);
	l->hb_ms = heartbeat_ms;
	l->fence_ms = fence_ms;
	pthread_mutex_unlock(&l->mu);
	/* The TCP fields above stay unused on etcd. */
	if (l->etcd)
		return gf_etcd_set_lease(l->etcd, heartbeat_ms, fence_ms);
	return 0;
}

void gf_lock_set_lost_fn(gf_lock *l, gf_lock_lost_fn fn, void *userdata)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->lost_fn = fn;
	l->lost_ud = userdata;
	pthread_mutex_unlock(&l->mu);
}

int gf_lock_set_resources(gf_lock *l, const char *const *gpus, size_t ngpus, uint64_t wake_bytes,
			  uint64_t asleep_bytes)
{
	if (!l || (ngpus && !gpus))
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL argument");
	if (ngpus > GF_POOL_MAX_GPUS)
		return gf_err(GF_ERR_INVALID_ARG, "lock: %zu GPUs declared, at most %d", ngpus, GF_POOL_MAX_GPUS);
	struct gf_pool_decl d = { .ngpus = 0 };
	for (size_t i = 0; i < ngpus; i++) {
		if (!gpus[i] || !gf_pool_uuid_parse(gpus[i], d.gpus[d.ngpus]))
			return gf_err(GF_ERR_INVALID_ARG,
				      "lock: GPU \"%.60s\" is not a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
				      gpus[i] ? gpus[i] : "(null)");
		if (gf_pool_on_gpu(&d, d.gpus[d.ngpus]))
			return gf_err(GF_ERR_INVALID_ARG, "lock: GPU %s declared twice", d.gpus[d.ngpus]);
		d.ngpus++;
	}
	pthread_mutex_lock(&l->mu);
	memcpy(l->decl.gpus, d.gpus, sizeof(d.gpus));
	l->decl.ngpus = d.ngpus;
	l->decl.wake_bytes = wake_bytes;
	l->decl.asleep_bytes = asleep_bytes;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int gf_lock_set_pinned(gf_lock *l, int pinned)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	pthread_mutex_lock(&l->mu);
	l->decl.pinned = pinned != 0;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int gf_lock_set_model(gf_lock *l, const char *model)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	if (model && *model) {
		int rc = gf_id_check(model, "lock model");
		if (rc < 0)
			return rc;
	}
	pthread_mutex_lock(&l->mu);
	snprintf(l->decl.model, sizeof(l->decl.model), "%s", model ? model : "");
	pthread_mutex_unlock(&l->mu);
	return 0;
}

void gf_lock_set_step_down_fn(gf_lock *l, gf_lock_step_down_fn fn, void *userdata)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->step_down_fn = fn;
	l->step_down_ud = userdata;
	pthread_mutex_unlock(&l->mu);
}

static bool is_tcp(const gf_lock *l)
{
	return l->uri.kind == GF_URI_TCP;
}

/* Connect and handshake; on success l->fd is set. */
static int connect_once(gf_lock *l, int64_t deadline)
{
	int fd, rc = gf_uri_connect(&l->uri, deadline, &fd);
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
	rc = gf_handshake_client(fd, &rd, gf_Component_COMPONENT_LOCK, l->id, l->secret, l->secret_len, deadline,
				 NULL);
	if (rc < 0) {
		gf_frame_reader_clear(&rd);
		gf_close(fd);
		return rc;
	}
	drop_conn(l);
	gf_frame_reader_clear(&l->rd);
	l->rd = rd;
	l->fd = fd;
	l->last_heard = gf_now_us();
	l->next_hb = l->last_heard + l->hb_ms * 1000;
	return 0;
}

static int send_acquire(gf_lock *l, int64_t timeout_ms, bool reclaim, int64_t deadline)
{
	gf_Msg *m = l->msg;
	memset(m, 0, sizeof(*m));
	m->seq = ++l->seq;
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
	int fds[GF_LIMIT_LISTENERS];
	size_t nfds = 0;
	if (reclaim) {
		memcpy(m->body.lock_acquire.session_token.bytes, l->grant.session_token, GF_LOCK_TOKEN_LEN);
		m->body.lock_acquire.session_token.size = GF_LOCK_TOKEN_LEN;
		m->body.lock_acquire.epoch = l->grant.epoch;
		/* A restarted server could not bind the sockets we still listen on: hand them back. */
		for (; !is_tcp(l) && nfds < l->nlsn; nfds++) {
			snprintf(m->body.lock_acquire.listeners[nfds], sizeof(m->body.lock_acquire.listeners[nfds]), "%s",
				 l->lsn[nfds].name);
			fds[nfds] = l->lsn[nfds].fd;
		}
		m->body.lock_acquire.listeners_count = (pb_size_t)nfds;
	}
	return gf_msg_send(l->fd, m, fds, nfds, deadline);
}

static void send_heartbeat(gf_lock *l)
{
	gf_Msg *m = l->msg;
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_heartbeat_tag;
	m->body.heartbeat.seq = (uint64_t)(gf_now_us() / 1000);
	/* A full send buffer means the server is not reading: T_fence decides. */
	gf_msg_send(l->fd, m, NULL, 0, gf_now_us() + 10000);
}

static void take_grant(gf_lock *l, const gf_LockGranted *g)
{
	l->grant.epoch = g->epoch;
	memset(l->grant.session_token, 0, sizeof(l->grant.session_token));
	memcpy(l->grant.session_token, g->session_token.bytes,
	       g->session_token.size < GF_LOCK_TOKEN_LEN ? g->session_token.size : GF_LOCK_TOKEN_LEN);
	l->grant.granted_at_us = g->granted_at_us;
	l->grant.reclaimed = g->reclaimed;
	l->eff_hb_ms = g->heartbeat_ms > 0 && g->heartbeat_ms < l->hb_ms ? g->heartbeat_ms : l->hb_ms;
	l->eff_fence_ms = g->fence_ms > 0 && g->fence_ms < l->fence_ms ? g->fence_ms : l->fence_ms;
	atomic_store(&l->epoch, g->epoch);
	l->last_heard = gf_now_us();
	l->next_hb = l->last_heard + l->eff_hb_ms * 1000;
	atomic_store(&l->state, C_HELD);
}

static bool interrupted(gf_lock *l)
{
	uint64_t v;
	return read(l->intr_fd, &v, sizeof(v)) == sizeof(v);
}

/* Sleep until @until_us or an interrupt; true if interrupted. */
static bool nap(gf_lock *l, int64_t until_us)
{
	struct pollfd p = { .fd = l->intr_fd, .events = POLLIN };
	if (poll(&p, 1, gf_poll_timeout_ms(until_us)) > 0)
		return interrupted(l);
	return false;
}

int gf_lock_acquire(gf_lock *l, int64_t timeout_ms, struct gf_lock_grant *grant)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	if (l->etcd)
		return gf_etcd_acquire(l->etcd, timeout_ms, grant, l->intr_fd);
	int st = atomic_load(&l->state);
	if (st == C_HELD || st == C_RECONNECTING)
		return gf_err(GF_ERR_STATE, "lock %s: already held", l->id);
	if (st == C_WAITING)
		return gf_err(GF_ERR_STATE, "lock %s: an acquire is already in progress", l->id);
	atomic_store(&l->state, C_WAITING);
	drop_listeners(l);
	/* 0 means ask once: one connection attempt, and the server answers the
	 * acquire at once (granted, or timed out when the lock is held). */
	const bool once = timeout_ms == 0;
	const int64_t deadline = once ? gf_now_us() + ATTEMPT_US : gf_deadline_from_ms(timeout_ms);
	int64_t unreachable_since = -1; /* when the server was last lost */
	int rc;
	for (;;) {
		int64_t now = gf_now_us();
		if (now >= deadline) {
			rc = once ? gf_err(GF_ERR_TIMEOUT, "lock %s: no answer to a single try within %dms", l->id,
					   ATTEMPT_US / 1000)
				  : gf_err(GF_ERR_TIMEOUT, "lock %s: not granted within %lldms", l->id, (long long)timeout_ms);
			break;
		}
		if (l->fd < 0) {
			if (unreachable_since < 0)
				unreachable_since = now;
			int64_t give_up = unreachable_since + l->reconnect_ms * 1000;
			int64_t d = deadline < give_up ? deadline : give_up;
			if (d > now + ATTEMPT_US)
				d = now + ATTEMPT_US;
			rc = connect_once(l, d);
			if (rc == GF_ERR_PERMISSION || rc == GF_ERR_VERSION || rc == GF_ERR_INVALID_ARG)
				break;
			if (rc == 0) {
				int64_t left = deadline == INT64_MAX ? -1 : (deadline - gf_now_us()) / 1000;
				if (once || (left < 0 && deadline != INT64_MAX))
					left = 0;
				rc = send_acquire(l, left, false,
						  gf_now_us() + ATTEMPT_US);
				if (rc == 0) {
					unreachable_since = -1;
					continue;
				}
				drop_conn(l);
			}
			if (gf_now_us() >= give_up) {
				rc = gf_err(GF_ERR_UNREACHABLE, "lock %s: server %s not reachable for %lldms (%s)", l->id,
					    l->uristr, (long long)l->reconnect_ms, gf_error_detail());
				break;
			}
			int64_t until = gf_now_us() + RETRY_US;
			if (nap(l, until < deadline ? until : deadline)) {
				rc = gf_err(GF_ERR_INTERRUPTED, "lock %s: acquire interrupted", l->id);
				break;
			}
			continue;
		}
		struct pollfd p[2] = { { .fd = l->fd, .events = POLLIN }, { .fd = l->intr_fd, .events = POLLIN } };
		int64_t wake = deadline;
		if (is_tcp(l)) {
			if (l->next_hb < wake)
				wake = l->next_hb;
			if (l->last_heard + l->fence_ms * 1000 < wake)
				wake = l->last_heard + l->fence_ms * 1000;
		}
		int n = poll(p, 2, gf_poll_timeout_ms(wake));
		if (n < 0 && errno != EINTR) {
			rc = gf_err_errno(GF_ERR_IO, errno, "lock: poll");
			break;
		}
		if (n > 0 && (p[1].revents & POLLIN) && interrupted(l)) {
			rc = gf_err(GF_ERR_INTERRUPTED, "lock %s: acquire interrupted", l->id);
			break;
		}
		now = gf_now_us();
		if (is_tcp(l)) {
			if (now - l->last_heard >= l->fence_ms * 1000) {
				/* A silent TCP server: reconnect and keep waiting. */
				drop_conn(l);
				continue;
			}
			if (now >= l->next_hb) {
				send_heartbeat(l);
				l->next_hb = now + l->hb_ms * 1000;
			}
		}
		if (n <= 0 || !p[0].revents)
			continue;
		bool granted = false, lost_conn = false;
		rc = 0;
		for (;;) {
			int *fds = NULL;
			size_t nfds = 0;
			int r = gf_msg_try_recv(&l->rd, l->fd, l->msg, &fds, &nfds);
			if (r == GF_ERR_AGAIN)
				break;
			if (r < 0) {
				lost_conn = true;
				break;
			}
			l->last_heard = gf_now_us();
			gf_Msg *m = l->msg;
			if (m->which_body == gf_Msg_lock_granted_tag) {
				take_listeners(l, &m->body.lock_granted, fds, nfds);
				free(fds);
				take_grant(l, &m->body.lock_granted);
				granted = true;
				break;
			}
			gf_close_fds(fds, nfds);
			free(fds);
			if (m->which_body == gf_Msg_error_tag) {
				rc = gf_msg_error_code(m);
				break;
			}
			/* Answer the server's heartbeats: a waiter does not know the
			 * server's interval before its grant, this keeps pace with it. */
			if (m->which_body == gf_Msg_heartbeat_tag && is_tcp(l)) {
				send_heartbeat(l);
				l->next_hb = gf_now_us() + l->hb_ms * 1000;
			}
		}
		if (granted) {
			if (grant)
				*grant = l->grant;
			return 0;
		}
		if (rc < 0)
			break;
		if (lost_conn) {
			/* The server went away: a waiter reconnects and keeps waiting. */
			gf_log(GF_LOG_INFO, "lock", "msg=\"server connection lost while waiting; reconnecting\" id=%s", l->id);
			drop_conn(l);
		}
	}
	drop_conn(l);
	atomic_store(&l->state, C_IDLE);
	return rc;
}

/* Called with l->mu held. */
static int become_lost(gf_lock *l, const char *why, char *detail, size_t dlen)
{
	drop_conn(l);
	atomic_store(&l->state, C_LOST);
	snprintf(detail, dlen, "lock %s epoch %llu lost: %s", l->id, (unsigned long long)l->grant.epoch, why);
	gf_log(GF_LOG_ERR, "lock", "msg=\"lock lost\" id=%s epoch=%llu reason=\"%s\"", l->id,
	       (unsigned long long)l->grant.epoch, why);
	return GF_ERR_LOCK_LOST;
}

static void start_reconnect(gf_lock *l, const char *why)
{
	int64_t now = gf_now_us();
	drop_conn(l);
	atomic_store(&l->state, C_RECONNECTING);
	l->reconnect_deadline = now + l->reconnect_ms * 1000;
	/* On TCP the lease decides: past T_fence the server may have re-granted. */
	if (is_tcp(l) && l->last_heard + l->eff_fence_ms * 1000 < l->reconnect_deadline)
		l->reconnect_deadline = l->last_heard + l->eff_fence_ms * 1000;
	l->next_attempt = now;
	gf_log(GF_LOG_WARN, "lock", "msg=\"lock server connection lost; reconnecting\" id=%s epoch=%llu reason=\"%s\" reconnect_ms=%lld",
	       l->id, (unsigned long long)l->grant.epoch, why, (long long)((l->reconnect_deadline - now) / 1000));
}

/* One reclaim attempt. 1: held again, 0: try later, <0: lost for good. */
static int reclaim_once(gf_lock *l)
{
	int64_t d = gf_now_us() + ATTEMPT_US;
	if (d > l->reconnect_deadline)
		d = l->reconnect_deadline;
	int rc = connect_once(l, d);
	if (rc == GF_ERR_PERMISSION || rc == GF_ERR_VERSION)
		return rc;
	if (rc < 0)
		return 0;
	rc = send_acquire(l, 0, true, d);
	int *fds = NULL;
	size_t nfds = 0;
	if (rc == 0)
		rc = gf_msg_recv(&l->rd, l->fd, l->msg, &fds, &nfds, d);
	/* The listeners we kept are the same sockets (handed back, or still busy
	 * for the server): the engine goes on serving from the fds it has. */
	gf_close_fds(fds, nfds);
	free(fds);
	if (rc < 0) {
		drop_conn(l);
		return 0;
	}
	if (l->msg->which_body == gf_Msg_lock_granted_tag && l->msg->body.lock_granted.epoch == l->grant.epoch) {
		take_grant(l, &l->msg->body.lock_granted);
		gf_log(GF_LOG_INFO, "lock", "msg=\"lock regained after server restart\" id=%s epoch=%llu", l->id,
		       (unsigned long long)l->grant.epoch);
		return 1;
	}
	rc = gf_msg_error_code(l->msg);
	drop_conn(l);
	/* A server that cannot persist yet is worth another try. */
	if (rc == GF_ERR_IO)
		return 0;
	return rc < 0 ? rc : GF_ERR_PROTOCOL;
}

int gf_lock_process(gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	char detail[512] = "";
	int rc = 0;
	uint64_t step_down = 0;
	if (l->etcd) {
		bool newly;
		pthread_mutex_lock(&l->mu);
		rc = gf_etcd_process(l->etcd, &newly, detail, sizeof(detail));
		gf_lock_lost_fn fn = newly ? l->lost_fn : NULL;
		void *ud = l->lost_ud;
		pthread_mutex_unlock(&l->mu);
		if (fn)
			fn(l, GF_ERR_LOCK_LOST, detail, ud);
		return newly ? gf_err(GF_ERR_LOCK_LOST, "%s", detail) : rc;
	}
	pthread_mutex_lock(&l->mu);
	int64_t now = gf_now_us();
	int st = atomic_load(&l->state);
	if (st == C_LOST) {
		pthread_mutex_unlock(&l->mu);
		return gf_err(GF_ERR_LOCK_LOST, "lock %s: lost", l->id);
	}
	if (st == C_HELD) {
		/* Check the lease before reading: data that queued up while this
		 * process was stopped does not make the past silence go away. */
		if (is_tcp(l) && now - l->last_heard >= l->eff_fence_ms * 1000) {
			rc = become_lost(l, "no word from the server for T_fence", detail, sizeof(detail));
			goto out;
		}
		for (;;) {
			int r = gf_msg_try_recv(&l->rd, l->fd, l->msg, NULL, NULL);
			if (r == GF_ERR_AGAIN)
				break;
			if (r < 0) {
				start_reconnect(l, r == GF_ERR_CLOSED ? "connection closed" : gf_error_detail());
				break;
			}
			l->last_heard = gf_now_us();
			if (l->msg->which_body == gf_Msg_error_tag) {
				gf_msg_error_code(l->msg);
				start_reconnect(l, gf_error_detail());
				break;
			}
			if (l->msg->which_body == gf_Msg_lock_step_down_tag &&
			    l->msg->body.lock_step_down.epoch == l->grant.epoch) {
				gf_log(GF_LOG_INFO, "lock", "msg=\"asked to step down (planned switchover)\" id=%s epoch=%llu",
				       l->id, (unsigned long long)l->grant.epoch);
				step_down = l->grant.epoch;
			}
		}
		if (atomic_load(&l->state) == C_HELD && is_tcp(l) && now >= l->next_hb) {
			send_heartbeat(l);
			l->next_hb = now + l->eff_hb_ms * 1000;
		}
	}
	if (atomic_load(&l->state) == C_RECONNECTING) {
		now = gf_now_us();
		if (now >= l->reconnect_deadline) {
			rc = become_lost(l, "server not regained within the reconnect time", detail, sizeof(detail));
			goto out;
		}
		if (now >= l->next_attempt) {
			int r = reclaim_once(l);
			if (r < 0) {
				char why[300];
				snprintf(why, sizeof(why), "reclaim refused: %s", gf_error_detail());
				rc = become_lost(l, why, detail, sizeof(detail));
				goto out;
			}
			if (r == 0)
				l->next_attempt = gf_now_us() + RETRY_US;
		}
	}
out:;
	gf_lock_lost_fn fn = l->lost_fn;
	void *ud = l->lost_ud;
	gf_lock_step_down_fn sfn = l->step_down_fn;
	void *sud = l->step_down_ud;
	pthread_mutex_unlock(&l->mu);
	if (step_down && rc == 0 && sfn)
		sfn(l, step_down, sud);
	else if (step_down && rc == 0)
		gf_log(GF_LOG_WARN, "lock", "msg=\"step-down request ignored: no hook installed\" id=%s", l->id);
	if (rc == GF_ERR_LOCK_LOST) {
		if (fn)
			fn(l, GF_ERR_LOCK_LOST, detail, ud);
		return gf_err(GF_ERR_LOCK_LOST, "%s", detail);
	}
	return 0;
}

int gf_lock_release(gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	gf_lock_stop_watch(l);
	if (l->etcd)
		return gf_etcd_release(l->etcd);
	pthread_mutex_lock(&l->mu);
	int st = atomic_load(&l->state), rc = 0;
	if (st == C_HELD && l->fd >= 0) {
		gf_Msg *m = l->msg;
		memset(m, 0, sizeof(*m));
		m->seq = ++l->seq;
		m->which_body = gf_Msg_lock_release_tag;
		int64_t d = gf_now_us() + RELEASE_WAIT_US;
		/* Wait for the Ok so the server released on purpose (no exit wait);
		 * heartbeats may arrive first. */
		if (gf_msg_send(l->fd, m, NULL, 0, d) == 0) {
			while (gf_msg_recv(&l->rd, l->fd, m, NULL, NULL, d) == 0 && m->which_body == gf_Msg_heartbeat_tag)
				;
		}
	} else if (st != C_HELD && st != C_RECONNECTING) {
		rc = gf_err(GF_ERR_STATE, "lock %s: not held", l->id);
	}
	drop_conn(l);
	drop_listeners(l);
	atomic_store(&l->state, C_IDLE);
	pthread_mutex_unlock(&l->mu);
	return rc;
}

int gf_lock_listeners(const gf_lock *l, const struct gf_lock_listener **out, size_t *n)
{
	if (!l || !out || !n)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL argument");
	if (is_tcp(l) || l->etcd)
		return gf_err(GF_ERR_NOT_SUPPORTED,
			      "lock %s: listeners travel as file descriptors, over unix:// lock servers only", l->id);
	int st = atomic_load(&((gf_lock *)l)->state);
	if (st != C_HELD && st != C_RECONNECTING)
		return gf_err(GF_ERR_STATE, "lock %s: listeners come with a grant; not held", l->id);
	*out = l->lsn;
	*n = l->nlsn;
	return 0;
}

void gf_lock_interrupt(gf_lock *l)
{
	if (!l)
		return;
	uint64_t one = 1;
	ssize_t r = write(l->intr_fd, &one, sizeof(one));
	(void)r;
}

int gf_lock_is_held(const gf_lock *l)
{
	if (!l)
		return 0;
	if (l->etcd)
		return gf_etcd_is_held(l->etcd);
	int st = atomic_load(&((gf_lock *)l)->state);
	return st == C_HELD || st == C_RECONNECTING;
}

uint64_t gf_lock_epoch(const gf_lock *l)
{
	if (l && l->etcd)
		return gf_etcd_epoch(l->etcd);
	return l ? atomic_load(&((gf_lock *)l)->epoch) : 0;
}

int gf_lock_get_fd(const gf_lock *l)
{
	if (!l)
		return -1;
	if (l->etcd)
		return gf_etcd_get_fd(l->etcd);
	pthread_mutex_lock(&((gf_lock *)l)->mu);
	int fd = atomic_load(&((gf_lock *)l)->state) == C_HELD ? l->fd : -1;
	pthread_mutex_unlock(&((gf_lock *)l)->mu);
	return fd;
}

int gf_lock_get_events(const gf_lock *l)
{
	(void)l;
	return POLLIN;
}

int gf_lock_get_timeout_ms(const gf_lock *l)
{
	if (!l)
		return -1;
	if (l->etcd)
		return gf_etcd_get_timeout_ms(l->etcd);
	gf_lock *m = (gf_lock *)l;
	pthread_mutex_lock(&m->mu);
	int64_t t = INT64_MAX;
	int st = atomic_load(&m->state);
	if (st == C_HELD && is_tcp(m)) {
		t = m->next_hb;
		if (m->last_heard + m->eff_fence_ms * 1000 < t)
			t = m->last_heard + m->eff_fence_ms * 1000;
	} else if (st == C_RECONNECTING) {
		t = m->next_attempt < m->reconnect_deadline ? m->next_attempt : m->reconnect_deadline;
	}
	pthread_mutex_unlock(&m->mu);
	if (t == INT64_MAX)
		return -1;
	int64_t left = t - gf_now_us();
	return left <= 0 ? 0 : (int)((left + 999) / 1000);
}

/* One hold's watch: runs the process loop until stopped or no longer held. */
static void watch_loop(gf_lock *l)
{
	for (;;) {
		if (!gf_lock_is_held(l)) {
			/* An etcd holder stops counting as held at T_fence, before
			 * anything was read: let process() report it. */
			if (l->etcd)
				gf_lock_process(l);
			break;
		}
		struct pollfd p[2] = { { .fd = gf_lock_get_fd(l), .events = POLLIN },
				       { .fd = l->watch_stop_fd, .events = POLLIN } };
		int n = poll(p, 2, gf_lock_get_timeout_ms(l));
		if (n > 0 && (p[1].revents & POLLIN))
			break;
		if (gf_lock_process(l) == GF_ERR_LOCK_LOST)
			break;
	}
}

static void *watch_main(void *arg)
{
	gf_lock *l = arg;
	pthread_mutex_lock(&l->wmu);
	for (;;) {
		while (!l->watching && !l->w_quit)
			pthread_cond_wait(&l->wcond, &l->wmu);
		if (l->w_quit)
			break;
		l->w_active = true;
		pthread_mutex_unlock(&l->wmu);
		watch_loop(l);
		pthread_mutex_lock(&l->wmu);
		l->w_active = false;
		l->watching = false;
		pthread_cond_broadcast(&l->wcond);
	}
	pthread_mutex_unlock(&l->wmu);
	return NULL;
}

/* Called with wmu held. */
static int start_watcher_locked(gf_lock *l)
{
	if (l->w_started)
		return 0;
	int e = pthread_create(&l->watcher, NULL, watch_main, l);
	if (e)
		return gf_err_errno(GF_ERR_IO, e, "lock: pthread_create");
	l->w_started = true;
	return 0;
}

int gf_lock_prepare_watch(gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	pthread_mutex_lock(&l->wmu);
	int rc = start_watcher_locked(l);
	pthread_mutex_unlock(&l->wmu);
	return rc;
}

int gf_lock_start_watch(gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	if (!gf_lock_is_held(l))
		return gf_err(GF_ERR_STATE, "lock %s: not held", l->id);
	pthread_mutex_lock(&l->wmu);
	int rc = 0;
	if (l->watching || l->w_active) {
		rc = gf_err(GF_ERR_STATE, "lock %s: watcher already running", l->id);
	} else if ((rc = start_watcher_locked(l)) == 0) {
		uint64_t v;
		while (read(l->watch_stop_fd, &v, sizeof(v)) > 0)
			; /* a stop meant for an earlier hold */
		l->watching = true;
		pthread_cond_broadcast(&l->wcond);
	}
	pthread_mutex_unlock(&l->wmu);
	return rc;
}

void gf_lock_stop_watch(gf_lock *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->wmu);
	if (l->watching || l->w_active) {
		l->watching = false;
		uint64_t one = 1;
		ssize_t r = write(l->watch_stop_fd, &one, sizeof(one));
		(void)r;
		/* The loop ends before this returns: after it, no hook runs (unless this is the hook). */
		while (l->w_active && !pthread_equal(pthread_self(), l->watcher))
			pthread_cond_wait(&l->wcond, &l->wmu);
	}
	pthread_mutex_unlock(&l->wmu);
}

/* ---- one-shot queries ---- */

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

int gf_lock_ping(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms)
{
	if (gf_etcd_is_uri(uri))
		return gf_etcd_ping(uri, secret, secret_len, timeout_ms);
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
static int oneshot_call(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, gf_Msg *m,
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

/* A request whose body is only its tag (and an epoch for the admin ones). */
static int simple_call(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, pb_size_t tag,
		       uint64_t epoch, pb_size_t want, const char *what, gf_Msg **reply)
{
	/* etcd holds no server of ours to ask: readiness and admin requests are
	 * this lock server's (status has its own etcd path). */
	if (gf_etcd_is_uri(uri))
		return gf_err(GF_ERR_NOT_SUPPORTED, "%s: not available on etcd:// locks (only on gf-lockd)", what);
	gf_Msg *m = gf_msg_new();
	if (!m)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	m->which_body = tag;
	if (tag == gf_Msg_lock_revoke_tag)
		m->body.lock_revoke.epoch = epoch;
	else if (tag == gf_Msg_lock_switchover_tag)
		m->body.lock_switchover.epoch = epoch;
	int rc = oneshot_call(uri, secret, secret_len, timeout_ms, m, want, what);
	if (rc == 0 && reply)
		*reply = m;
	else
		gf_msg_free(m);
	return rc;
}

int gf_lock_status_json(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, char **json)
{
	if (!json)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL json");
	if (gf_etcd_is_uri(uri))
		return gf_etcd_status_json(uri, secret, secret_len, timeout_ms, json);
	gf_Msg *m;
	int rc = simple_call(uri, secret, secret_len, timeout_ms, gf_Msg_lock_status_request_tag, 0,
			     gf_Msg_lock_status_tag, "status", &m);
	if (rc < 0)
		return rc;
	rc = gf_lock_status_to_json(&m->body.lock_status, json);
	gf_msg_free(m);
	return rc;
}

int gf_lock_ready_for(const char *uri, const void *secret, size_t secret_len, const char *const *gpus,
		      size_t ngpus, const char *model, int64_t timeout_ms, char **json)
{
	if (ngpus && !gpus)
		return gf_err(GF_ERR_INVALID_ARG, "lock ready: NULL GPU list");
	/* A malformed query is refused before connecting. */
	gf_LockStatus *empty = calloc(1, sizeof(*empty));
	if (!empty)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	int rc = gf_lock_ready_from_status(empty, gpus, ngpus, model, NULL);
	free(empty);
	if (rc < 0)
		return rc;
	gf_Msg *m;
	rc = simple_call(uri, secret, secret_len, timeout_ms, gf_Msg_lock_status_request_tag, 0, gf_Msg_lock_status_tag,
			 "ready", &m);
	if (rc < 0)
		return rc;
	rc = gf_lock_ready_from_status(&m->body.lock_status, gpus, ngpus, model, json);
	gf_msg_free(m);
	return rc;
}

int gf_lock_switchover(const char *uri, const void *secret, size_t secret_len, uint64_t epoch, int64_t timeout_ms)
{
	return simple_call(uri, secret, secret_len, timeout_ms, gf_Msg_lock_switchover_tag, epoch, gf_Msg_ok_tag,
			   "switchover", NULL);
}

int gf_lock_revoke(const char *uri, const void *secret, size_t secret_len, uint64_t epoch, int64_t timeout_ms)
{
	if (epoch == 0)
		return gf_err(GF_ERR_INVALID_ARG, "lock revoke: epoch 0 names no grant");
	return simple_call(uri, secret, secret_len, timeout_ms, gf_Msg_lock_revoke_tag, epoch, gf_Msg_ok_tag, "revoke",
			   NULL);
}
