/* SPDX-License-Identifier: Apache-2.0 */
/* The server core shared by gf-lockd and gf-gmsd: see server.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "server.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

enum kind { K_STOP = 1, K_LISTEN, K_PEER, K_WATCH };

/* Wrong secrets per TCP source: a burst, then one guess per second. */
#define AUTH_SOURCES 256
#define AUTH_BURST 5
#define AUTH_REFILL_US 1000000

struct auth_source {
	uint8_t addr[16]; /* IPv4 addresses as ::ffff:a.b.c.d */
	int credit;
	int64_t at;       /* credit last refilled; 0: slot unused */
};
enum phase { PH_HELLO, PH_AUTH, PH_READY };

struct listener {
	int kind;
	int fd;
	struct gf_uri uri;
};

struct tcp_auth {
	uint8_t challenge[32];
	uint8_t source[16];      /* the remote address */
};

struct gf_srv_peer_priv {
	int kind;
	struct gf_srv_peer pub;
	int sock;                /* stays open until after settle */
	enum phase phase;
	bool closing;            /* closed, socket not torn down yet */
	bool want_write;
	int pidfd_errno;         /* why a wanted pidfd is missing (0: not for want of resources) */
	struct tcp_auth *tcp;    /* TCP peers only: an idle unix waiter does not pay for it */
	int64_t handshake_deadline;
	int64_t frame_started;   /* a frame is half read since then (0: none) */
	uint64_t backlog_round;  /* the round whose budget ran out with messages read ahead (epoll does not see them); 0: none */
	struct gf_frame_reader rd;
	struct gf_srv_peer_priv *prev, *next; /* open peers */
	struct gf_srv_peer_priv *lnext;       /* closing, then dead list */
	/* the component's per-peer data follows */
};

struct gf_srv {
	int stop_kind;
	struct gf_srv_config cfg;
	struct gf_srv_handlers h;
	void *ctx;
	char server_id[64];
	int epfd, stopfd;
	atomic_bool stopped;
	bool started;
	uint64_t round;          /* gf_srv_process() calls */
	bool backlog;            /* some peer has a backlog: the next round does not wait */
	struct listener listeners[GF_SRV_MAX_LISTEN];
	int nlisteners;
	bool any_tcp;
	uint32_t allow_uid[GF_SRV_MAX_ALLOW_UID];
	int nallow;
	uid_t self_uid;
	uint8_t *secret;
	size_t secret_len;
	int64_t handshake_ms;
	int64_t tcp_timeout_ms;
	size_t peer_size;        /* priv + the component's data, aligned */
	struct gf_srv_peer_priv *peers, *closing, *dead;
	uint32_t npeers;
	bool closed_in_event;
	int64_t paused_until;    /* listeners paused at the fd limit until then (0: listening) */
	int64_t last_accept_log;
	uint64_t accept_fail_quiet; /* failures not logged since the last line */
	uint64_t accept_paused, refused_no_pidfd, refused_auth_rate;
	struct auth_source auth[AUTH_SOURCES];
	int64_t last_auth_log, last_preauth_log, last_drop_log;
	uint64_t handshake_drops;
	uint64_t fd_limit;
	gf_Msg *in;
};

#define NAME(s) ((s)->cfg.name)

int gf_srv_new(struct gf_srv **out, const struct gf_srv_config *cfg, const struct gf_srv_handlers *h,
	       void *ctx)
{
	if (!out || !cfg || !h || !h->on_message || !h->on_close)
		return gf_err(GF_ERR_INVALID_ARG, "server core: NULL argument");
	struct gf_srv *s = calloc(1, sizeof(*s));
	if (!s)
		return gf_err(GF_ERR_NOMEM, "%s: out of memory", cfg->name);
	s->cfg = *cfg;
	if (!s->cfg.max_body || s->cfg.max_body > GF_FRAME_MAX_BODY)
		s->cfg.max_body = GF_FRAME_MAX_BODY;
	if (!s->cfg.backlog)
		s->cfg.backlog = 1024;
	s->h = *h;
	s->ctx = ctx;
	s->stop_kind = K_STOP;
	s->self_uid = geteuid();
	s->handshake_ms = GF_SRV_DEFAULT_HANDSHAKE_MS;
	/* The component's per-peer data lives right after the core's part. */
	s->peer_size = ((sizeof(struct gf_srv_peer_priv) + 15) & ~(size_t)15) + cfg->peer_data_size;
	snprintf(s->server_id, sizeof(s->server_id), "%s/%s", cfg->name, gf_version());
	s->in = gf_msg_new();
	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	s->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct epoll_event e = { .events = EPOLLIN, .data.ptr = &s->stop_kind };
	if (!s->in || s->epfd < 0 || s->stopfd < 0 || epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->stopfd, &e) < 0) {
		int rc = s->in ? gf_err_errno(GF_ERR_IO, errno, "%s: epoll/eventfd", cfg->name)
			       : gf_err(GF_ERR_NOMEM, "%s: out of memory", cfg->name);
		gf_srv_free(s);
		return rc;
	}
	*out = s;
	return 0;
}

static void free_list(struct gf_srv_peer_priv **head)
{
	while (*head) {
		struct gf_srv_peer_priv *p = *head;
		*head = p->lnext;
		free(p->tcp);
		free(p);
	}
}

static void teardown(struct gf_srv *s);

void gf_srv_free(struct gf_srv *s)
{
	if (!s)
		return;
	while (s->peers)
		gf_srv_close(s, &s->peers->pub, "server shutting down");
	teardown(s);
	free_list(&s->dead);
	for (int i = 0; i < s->nlisteners; i++) {
		if (s->listeners[i].fd >= 0 && s->listeners[i].uri.kind == GF_URI_UNIX)
			unlink(s->listeners[i].uri.path);
		gf_close(s->listeners[i].fd);
	}
	gf_close(s->epfd);
	gf_close(s->stopfd);
	if (s->secret)
		memset(s->secret, 0, s->secret_len);
	free(s->secret);
	gf_msg_free(s->in);
	free(s);
}

#define CHECK_CONFIG(s)                                                                          \
	do {                                                                                     \
		if ((s)->started)                                                                \
			return gf_err(GF_ERR_STATE, "%s: configure before start", NAME(s));      \
	} while (0)

int gf_srv_add_listen(struct gf_srv *s, const char *uri, bool unix_only)
{
	CHECK_CONFIG(s);
	if (!uri)
		return gf_err(GF_ERR_INVALID_ARG, "%s: NULL listen URI", NAME(s));
	if (s->nlisteners >= GF_SRV_MAX_LISTEN)
		return gf_err(GF_ERR_INVALID_ARG, "%s: at most %d listeners", NAME(s), GF_SRV_MAX_LISTEN);
	struct listener *l = &s->listeners[s->nlisteners];
	int rc = gf_uri_parse(uri, &l->uri);
	if (rc < 0)
		return rc;
	if (unix_only && l->uri.kind != GF_URI_UNIX)
		return gf_err(GF_ERR_INVALID_ARG, "%s listens on unix:// only (fds cannot cross hosts): %s",
			      NAME(s), uri);
	l->fd = -1;
	l->kind = K_LISTEN;
	s->any_tcp |= l->uri.kind == GF_URI_TCP;
	s->nlisteners++;
	return 0;
}

int gf_srv_add_allow_uid(struct gf_srv *s, uint32_t uid)
{
	CHECK_CONFIG(s);
	for (int i = 0; i < s->nallow; i++)
		if (s->allow_uid[i] == uid)
			return 0;
	if (s->nallow >= GF_SRV_MAX_ALLOW_UID)
		return gf_err(GF_ERR_TOO_BIG, "%s: at most %d allowed uids", NAME(s), GF_SRV_MAX_ALLOW_UID);
	s->allow_uid[s->nallow++] = uid;
	return 0;
}

int gf_srv_set_handshake_timeout(struct gf_srv *s, int64_t ms)
{
	CHECK_CONFIG(s);
	/* A day: far past any sane handshake, far below an overflow in microseconds. */
	if (ms <= 0 || ms > 86400000)
		return gf_err(GF_ERR_INVALID_ARG, "%s: handshake timeout must be 1ms..24h, got %lldms", NAME(s),
			      (long long)ms);
	s->handshake_ms = ms;
	return 0;
}

int gf_srv_set_secret(struct gf_srv *s, const void *secret, size_t len)
{
	CHECK_CONFIG(s);
	if (!secret || len == 0)
		return gf_err(GF_ERR_INVALID_ARG, "%s: empty secret", NAME(s));
	uint8_t *k = malloc(len);
	if (!k)
		return gf_err(GF_ERR_NOMEM, "%s: out of memory", NAME(s));
	memcpy(k, secret, len);
	if (s->secret)
		memset(s->secret, 0, s->secret_len);
	free(s->secret);
	s->secret = k;
	s->secret_len = len;
	return 0;
}

void gf_srv_set_server_id(struct gf_srv *s, const char *id)
{
	snprintf(s->server_id, sizeof(s->server_id), "%s", id);
}

void gf_srv_set_tcp_timeout(struct gf_srv *s, int64_t ms)
{
	s->tcp_timeout_ms = ms;
}

bool gf_srv_has_tcp(const struct gf_srv *s)
{
	return s->any_tcp;
}

bool gf_srv_started(const struct gf_srv *s)
{
	return s->started;
}

static void raise_nofile(struct gf_srv *s)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t was = rl.rlim_cur;
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
			gf_log(GF_LOG_INFO, NAME(s), "msg=\"raised the fd limit\" from=%llu to=%llu",
			       (unsigned long long)was, (unsigned long long)rl.rlim_cur);
		else
			getrlimit(RLIMIT_NOFILE, &rl);
	}
	s->fd_limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}

int gf_srv_start(struct gf_srv *s)
{
	if (s->started)
		return gf_err(GF_ERR_STATE, "%s: already started", NAME(s));
	if (s->nlisteners == 0)
		return gf_err(GF_ERR_INVALID_ARG, "%s: no listen URI configured", NAME(s));
	if (s->any_tcp && !s->secret)
		return gf_err(GF_ERR_INVALID_ARG, "%s: a TCP listener needs a shared secret", NAME(s));
	raise_nofile(s);
	for (int i = 0; i < s->nlisteners; i++) {
		struct listener *l = &s->listeners[i];
		int rc = gf_uri_listen(&l->uri, s->cfg.backlog, &l->fd);
		if (rc < 0) {
			l->fd = -1;
			return rc;
		}
		struct epoll_event e = { .events = EPOLLIN, .data.ptr = &l->kind };
		if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, l->fd, &e) < 0)
			return gf_err_errno(GF_ERR_IO, errno, "%s: epoll_ctl", NAME(s));
	}
	s->started = true;
	return 0;
}

int gf_srv_get_fd(const struct gf_srv *s)
{
	return s->epfd;
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

static int64_t next_deadline(const struct gf_srv *s)
{
	int64_t t = s->h.next_deadline ? s->h.next_deadline(s->ctx) : INT64_MAX;
	if (s->paused_until)
		t = min64(t, s->paused_until);
	for (const struct gf_srv_peer_priv *p = s->peers; p; p = p->next) {
		if (p->phase != PH_READY)
			t = min64(t, p->handshake_deadline);
		if (p->frame_started)
			t = min64(t, p->frame_started + s->handshake_ms * 1000);
	}
	return t;
}

int gf_srv_get_timeout_ms(const struct gf_srv *s)
{
	if (s->backlog)
		return 0;
	int64_t t = next_deadline(s);
	if (t == INT64_MAX)
		return -1;
	int64_t left = t - gf_now_us();
	if (left <= 0)
		return 0;
	return (int)min64((left + 999) / 1000, 1 << 30);
}

/* ---- peers ---- */

static struct gf_srv_peer_priv *priv_of(struct gf_srv_peer *p)
{
	return p->priv;
}

struct gf_srv_peer *gf_srv_next_peer(struct gf_srv *s, struct gf_srv_peer *prev)
{
	struct gf_srv_peer_priv *p = prev ? priv_of(prev)->next : s->peers;
	return p ? &p->pub : NULL;
}

void gf_srv_close(struct gf_srv *s, struct gf_srv_peer *pub, const char *why)
{
	struct gf_srv_peer_priv *p = priv_of(pub);
	if (p->closing || pub->fd < 0)
		return;
	p->closing = true;
	pub->fd = -1;
	if (p->prev)
		p->prev->next = p->next;
	else
		s->peers = p->next;
	if (p->next)
		p->next->prev = p->prev;
	p->prev = p->next = NULL;
	s->npeers--;
	p->lnext = s->closing;
	s->closing = p;
	s->closed_in_event = true;
	s->h.on_close(s->ctx, pub, why);
	gf_log(GF_LOG_DEBUG, NAME(s), "msg=\"connection closed\" id=%s pid=%u reason=\"%s\"", pub->id, pub->pid,
	       why);
}

/* Sockets of closed peers go after settle, off the hand-off path; the memory at the end of the round. */
static void teardown(struct gf_srv *s)
{
	while (s->closing) {
		struct gf_srv_peer_priv *p = s->closing;
		s->closing = p->lnext;
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, p->sock, NULL);
		gf_close(p->sock);
		p->sock = -1;
		if (p->pub.pidfd >= 0) {
			/* Removed explicitly: a forked copy of the fd would keep it in epoll. */
			epoll_ctl(s->epfd, EPOLL_CTL_DEL, p->pub.pidfd, NULL);
			gf_close(p->pub.pidfd);
			p->pub.pidfd = -1;
		}
		gf_frame_reader_clear(&p->rd);
		p->lnext = s->dead;
		s->dead = p;
	}
}

static void settle(struct gf_srv *s)
{
	/* A close during settle (a grant that could not be sent) may free the
	 * lock again: settle until nothing more closed. Each pass closes at
	 * least one peer or ends. */
	do {
		s->closed_in_event = false;
		if (s->h.settle)
			s->h.settle(s->ctx);
	} while (s->closed_in_event);
	teardown(s);
}

int gf_srv_send_raw(struct gf_srv *s, struct gf_srv_peer *pub, const void *body, size_t len, const int *fds,
		    size_t nfds)
{
	if (pub->fd < 0)
		return gf_err(GF_ERR_CLOSED, "%s: peer %s is closed", NAME(s), pub->id);
	int rc = gf_frame_send(pub->fd, body, len, fds, nfds, gf_now_us() + GF_SRV_SEND_DEADLINE_US);
	if (rc < 0) {
		char why[256];
		snprintf(why, sizeof(why), "send failed: %s", gf_error_detail());
		gf_log(GF_LOG_WARN, NAME(s), "msg=\"dropping connection\" id=%s pid=%u error=\"%s\"", pub->id,
		       pub->pid, why);
		gf_srv_close(s, pub, why);
	}
	return rc;
}

int gf_srv_send(struct gf_srv *s, struct gf_srv_peer *pub, const gf_Msg *m, const int *fds, size_t nfds)
{
	if (pub->fd < 0)
		return gf_err(GF_ERR_CLOSED, "%s: peer %s is closed", NAME(s), pub->id);
	uint8_t *buf;
	size_t len;
	int rc = gf_msg_encode(m, &buf, &len);
	if (rc < 0)
		return rc;
	rc = gf_srv_send_raw(s, pub, buf, len, fds, nfds);
	free(buf);
	return rc;
}

int gf_srv_send_error(struct gf_srv *s, struct gf_srv_peer *pub, uint32_t seq, int code, const char *detail,
		      bool close_after)
{
	gf_Msg *m = gf_msg_new();
	if (!m) {
		gf_srv_close(s, pub, "out of memory");
		return GF_ERR_NOMEM;
	}
	m->seq = seq;
	gf_msg_set_error(m, code, detail);
	int rc = gf_srv_send(s, pub, m, NULL, 0);
	gf_msg_free(m);
	if (close_after)
		gf_srv_close(s, pub, detail);
	return rc < 0 ? rc : 0;
}

void gf_srv_want_write(struct gf_srv *s, struct gf_srv_peer *pub, bool on)
{
	struct gf_srv_peer_priv *p = priv_of(pub);
	if (pub->fd < 0 || p->want_write == on)
		return;
	p->want_write = on;
	struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0), .data.ptr = &p->kind };
	epoll_ctl(s->epfd, EPOLL_CTL_MOD, p->sock, &e);
}

static int watch(struct gf_srv *s, int op, int fd, struct gf_srv_watch *w)
{
	w->kind_ = K_WATCH;
	struct epoll_event e = { .events = EPOLLIN, .data.ptr = w };
	if (epoll_ctl(s->epfd, op, fd, &e) < 0)
		return gf_err_errno(GF_ERR_IO, errno, "%s: epoll_ctl", NAME(s));
	return 0;
}

int gf_srv_watch_add(struct gf_srv *s, int fd, struct gf_srv_watch *w)
{
	return watch(s, EPOLL_CTL_ADD, fd, w);
}

int gf_srv_watch_mod(struct gf_srv *s, int fd, struct gf_srv_watch *w)
{
	return watch(s, EPOLL_CTL_MOD, fd, w);
}

void gf_srv_watch_del(struct gf_srv *s, int fd)
{
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
}

void gf_srv_stats(const struct gf_srv *s, struct gf_srv_stats *out)
{
	out->fd_limit = s->fd_limit;
	out->connections = s->npeers;
	out->accept_paused = s->accept_paused;
	out->refused_no_pidfd = s->refused_no_pidfd;
	out->refused_auth_rate = s->refused_auth_rate;
}

/* ---- accept ---- */

static int open_pidfd(int fd, uint32_t pid, int *err)
{
	int pfd = -1;
	socklen_t sl = sizeof(pfd);
	/* SO_PEERPIDFD (Linux 6.5) names the connecting process without a pid-reuse race. */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &sl) == 0 && pfd >= 0) {
		fcntl(pfd, F_SETFD, FD_CLOEXEC);
		return pfd;
	}
	*err = errno;
	if (pid == 0)
		return -1;
	pfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0); /* pidfds are always close-on-exec */
	if (pfd < 0)
		*err = errno;
	return pfd;
}

static void pause_listeners(struct gf_srv *s, bool pause)
{
	for (int i = 0; i < s->nlisteners; i++) {
		struct epoll_event e = { .events = pause ? 0 : EPOLLIN, .data.ptr = &s->listeners[i].kind };
		epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->listeners[i].fd, &e);
	}
}

static void accept_failed(struct gf_srv *s, int errnum)
{
	int64_t now = gf_now_us();
	bool out_of_fds = errnum == EMFILE || errnum == ENFILE || errnum == ENOBUFS || errnum == ENOMEM;
	if (out_of_fds) {
		/* The pending connection stays in the backlog: rest instead of spinning on it. */
		pause_listeners(s, true);
		s->paused_until = now + GF_SRV_ACCEPT_PAUSE_US;
		s->accept_paused++;
	}
	if (now - s->last_accept_log >= GF_SRV_LOG_EVERY_US || !s->last_accept_log) {
		gf_log(GF_LOG_WARN, NAME(s),
		       "msg=\"accept failed\" error=\"%s\" connections=%u fd_limit=%llu suppressed=%llu%s", strerror(errnum),
		       s->npeers, (unsigned long long)s->fd_limit, (unsigned long long)s->accept_fail_quiet,
		       out_of_fds ? " action=\"listeners paused\"" : "");
		s->last_accept_log = now;
		s->accept_fail_quiet = 0;
	} else {
		s->accept_fail_quiet++;
	}
}

static void source_of(const struct sockaddr_storage *sa, uint8_t out[16])
{
	memset(out, 0, 16);
	if (sa->ss_family == AF_INET6) {
		memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	} else if (sa->ss_family == AF_INET) {
		out[10] = out[11] = 0xff;
		memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	}
}

/* The source's slot, refilled to now; NULL when unknown and !@create. */
static struct auth_source *auth_source(struct gf_srv *s, const uint8_t addr[16], bool create, int64_t now)
{
	struct auth_source *oldest = &s->auth[0];
	for (int i = 0; i < AUTH_SOURCES; i++) {
		struct auth_source *a = &s->auth[i];
		if (a->at && !memcmp(a->addr, addr, 16)) {
			int64_t earned = (now - a->at) / AUTH_REFILL_US;
			if (earned > 0) {
				a->credit = (int)(a->credit + earned > AUTH_BURST ? AUTH_BURST : a->credit + earned);
				a->at += earned * AUTH_REFILL_US;
			}
			return a;
		}
		if (a->at < oldest->at)
			oldest = a;
	}
	if (!create)
		return NULL;
	memcpy(oldest->addr, addr, 16);
	oldest->credit = AUTH_BURST;
	oldest->at = now;
	return oldest;
}

/* TCP connections from @source not authenticated yet. */
static int preauth_from(const struct gf_srv *s, const uint8_t source[16])
{
	int n = 0;
	for (const struct gf_srv_peer_priv *p = s->peers; p; p = p->next)
		n += p->tcp && p->phase != PH_READY && !p->closing && !memcmp(p->tcp->source, source, 16);
	return n;
}

/* Accept one connection; false when the caller should stop for this round. */
static bool accept_one(struct gf_srv *s, struct listener *l)
{
	struct sockaddr_storage sa;
	socklen_t salen = sizeof(sa);
	int fd = accept4(l->fd, (struct sockaddr *)&sa, &salen, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0) {
		if (errno == EINTR || errno == ECONNABORTED)
			return true;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			accept_failed(s, errno);
		return false;
	}
	uint8_t source[16] = {0};
	if (l->uri.kind == GF_URI_TCP) {
		source_of(&sa, source);
		int64_t now = gf_now_us();
		struct auth_source *a = auth_source(s, source, false, now);
		if (a && a->credit <= 0) {
			/* Guessing the secret: no handshake, no challenge, until credit returns. */
			s->refused_auth_rate++;
			if (now - s->last_auth_log >= GF_SRV_LOG_EVERY_US) {
				gf_log(GF_LOG_WARN, NAME(s), "msg=\"refusing a source that sent wrong secrets\" refused_total=%llu",
				       (unsigned long long)s->refused_auth_rate);
				s->last_auth_log = now;
			}
			gf_close(fd);
			return true;
		}
		if (preauth_from(s, source) >= GF_SRV_PREAUTH_PER_SOURCE) {
			s->refused_auth_rate++;
			if (now - s->last_preauth_log >= GF_SRV_LOG_EVERY_US) {
				gf_log(GF_LOG_WARN, NAME(s),
				       "msg=\"refusing a source with too many connections in the handshake\" limit=%d refused_total=%llu",
				       GF_SRV_PREAUTH_PER_SOURCE, (unsigned long long)s->refused_auth_rate);
				s->last_preauth_log = now;
			}
			gf_close(fd);
			return true;
		}
	}
	struct gf_srv_peer_priv *p = calloc(1, s->peer_size);
	if (!p) {
		gf_close(fd);
		return false;
	}
	if (l->uri.kind == GF_URI_TCP) {
		p->tcp = malloc(sizeof(*p->tcp));
		if (!p->tcp) {
			free(p);
			gf_close(fd);
			return false;
		}
		memcpy(p->tcp->source, source, sizeof(source));
	}
	p->kind = K_PEER;
	p->sock = fd;
	p->pub.priv = p;
	p->pub.fd = fd;
	p->pub.pidfd = -1;
	p->pub.tcp = l->uri.kind == GF_URI_TCP;
	p->pub.data = (char *)p + ((sizeof(*p) + 15) & ~(size_t)15);
	p->pub.last_heard = gf_now_us();
	p->handshake_deadline = p->pub.last_heard + s->handshake_ms * 1000;
	snprintf(p->pub.id, sizeof(p->pub.id), "?");
	gf_frame_reader_init(&p->rd, s->cfg.max_fds);
	gf_frame_reader_set_max_body(&p->rd, s->cfg.max_body);
	/* A request's header and body in one read (the loop reads until
	 * nothing is left, or keeps a backlog of what it read ahead). */
	gf_frame_reader_set_read_ahead(&p->rd);
	if (p->pub.tcp) {
		int one = 1, idle = 1, intvl = 1, cnt = 3;
		setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
		if (s->tcp_timeout_ms > 0) {
			unsigned int uto = (unsigned int)s->tcp_timeout_ms;
			setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	} else {
		struct ucred cr;
		socklen_t sl = sizeof(cr);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &sl) == 0) {
			p->pub.pid = (uint32_t)cr.pid;
			p->pub.uid = (uint32_t)cr.uid;
		} else {
			p->pub.uid = UINT32_MAX; /* unknown: never on an allow list by accident */
		}
		if (s->cfg.want_pidfd) {
			int err = 0;
			p->pub.pidfd = open_pidfd(fd, p->pub.pid, &err);
			if (p->pub.pidfd < 0 && (err == EMFILE || err == ENFILE || err == ENOMEM))
				p->pidfd_errno = err;
		}
	}
	p->next = s->peers;
	if (s->peers)
		s->peers->prev = p;
	s->peers = p;
	s->npeers++;
	struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = &p->kind };
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &e) < 0)
		gf_srv_close(s, &p->pub, "epoll_ctl failed");
	return true;
}

/* ---- handshake ---- */

static bool uid_allowed(const struct gf_srv *s, uint32_t uid)
{
	if (s->nallow == 0)
		return uid == s->self_uid || uid == 0;
	for (int i = 0; i < s->nallow; i++)
		if (s->allow_uid[i] == uid)
			return true;
	return false;
}

static const char *component_text(const struct gf_srv *s)
{
	return s->cfg.component == gf_Component_COMPONENT_LOCK ? "lock server" : "GPU memory service";
}

static void become_ready(struct gf_srv *s, struct gf_srv_peer_priv *p)
{
	p->phase = PH_READY;
	p->pub.ready = true;
	if (s->h.on_ready)
		s->h.on_ready(s->ctx, &p->pub);
}

static void handshake(struct gf_srv *s, struct gf_srv_peer_priv *p, gf_Msg *m)
{
	struct gf_srv_peer *pub = &p->pub;
	char det[256];
	if (p->phase == PH_AUTH) {
		if (m->which_body != gf_Msg_auth_tag ||
		    !gf_auth_verify(s->secret, s->secret_len, p->tcp->challenge, sizeof(p->tcp->challenge), m->body.auth.mac.bytes,
				    m->body.auth.mac.size)) {
			gf_log(GF_LOG_WARN, NAME(s), "msg=\"authentication failed\" id=%s", pub->id);
			struct auth_source *a = auth_source(s, p->tcp->source, true, gf_now_us());
			a->credit--;
			gf_srv_send_error(s, pub, m->seq, GF_ERR_PERMISSION, "authentication failed: wrong shared secret",
					  true);
			return;
		}
		uint32_t seq = m->seq;
		memset(m, 0, sizeof(*m));
		m->seq = seq;
		m->which_body = gf_Msg_auth_ok_tag;
		if (gf_srv_send(s, pub, m, NULL, 0) == 0)
			become_ready(s, p);
		return;
	}
	int rc = gf_handshake_check_hello(m, s->cfg.component);
	if (rc < 0) {
		snprintf(det, sizeof(det), "%s", gf_error_detail());
		gf_srv_send_error(s, pub, m->seq, rc, det, true);
		return;
	}
	/* The same id rule everywhere: a newline or invalid UTF-8 in an id would forge log lines or hide events. */
	snprintf(pub->id, sizeof(pub->id), "%s", gf_id_valid(m->body.hello.peer_id) ? m->body.hello.peer_id : "?");
	if (!pub->tcp && !uid_allowed(s, pub->uid)) {
		gf_log(GF_LOG_WARN, NAME(s), "msg=\"peer refused\" reason=\"uid not allowed\" uid=%u pid=%u", pub->uid,
		       pub->pid);
		snprintf(det, sizeof(det), "uid %u is not allowed to use this %s", pub->uid, component_text(s));
		gf_srv_send_error(s, pub, m->seq, GF_ERR_PERMISSION, det, true);
		return;
	}
	if (p->pidfd_errno) {
		s->refused_no_pidfd++;
		gf_log(GF_LOG_WARN, NAME(s), "msg=\"peer refused\" reason=\"no pidfd\" id=%s pid=%u error=\"%s\"", pub->id,
		       pub->pid, strerror(p->pidfd_errno));
		snprintf(det, sizeof(det),
			 "the %s cannot watch this process (pidfd: %s); connection refused, retry later",
			 component_text(s), strerror(p->pidfd_errno));
		gf_srv_send_error(s, pub, m->seq, GF_ERR_BUSY, det, true);
		return;
	}
	uint32_t seq = m->seq;
	uint8_t client_challenge[GF_LIMIT_CHALLENGE];
	pb_size_t m_challenge_len = m->body.hello.challenge.size;
	memcpy(client_challenge, m->body.hello.challenge.bytes, m_challenge_len);
	memset(m, 0, sizeof(*m));
	m->seq = seq;
	m->which_body = gf_Msg_welcome_tag;
	m->body.welcome.version = GF_PROTOCOL_VERSION;
	m->body.welcome.component = s->cfg.component;
	snprintf(m->body.welcome.server_id, sizeof(m->body.welcome.server_id), "%s", s->server_id);
	if (pub->tcp && gf_random_bytes(p->tcp->challenge, sizeof(p->tcp->challenge)) < 0) {
		/* A challenge that is not random would let a recorded answer be
		 * replayed: refuse the connection rather than weaken the check. */
		gf_log(GF_LOG_ERR, NAME(s), "msg=\"peer refused\" reason=\"no random challenge\" id=%s detail=\"%s\"",
		       pub->id, gf_error_detail());
		gf_srv_send_error(s, pub, seq, GF_ERR_BUSY,
				  "the server cannot draw a random challenge now; connection refused, retry later", true);
		return;
	}
	if (pub->tcp) {
		pb_size_t clen = m_challenge_len;
		memcpy(m->body.welcome.challenge.bytes, p->tcp->challenge, sizeof(p->tcp->challenge));
		m->body.welcome.challenge.size = sizeof(p->tcp->challenge);
		/* Mutual: the client checks this before it answers our challenge. */
		if (clen > 0 && gf_auth_server_proof(s->secret, s->secret_len, client_challenge, clen,
						     m->body.welcome.proof.bytes) == 0)
			m->body.welcome.proof.size = 32;
	}
	if (gf_srv_send(s, pub, m, NULL, 0) < 0)
		return;
	if (pub->tcp)
		p->phase = PH_AUTH;
	else
		become_ready(s, p);
}

/* ---- reading ---- */

static void peer_readable(struct gf_srv *s, struct gf_srv_peer_priv *p)
{
	struct gf_srv_peer *pub = &p->pub;
	p->backlog_round = 0;
	for (int n = 0; n < GF_SRV_MSGS_PER_ROUND && pub->fd >= 0; n++) {
		gf_Msg *m = s->in;
		int *fds = NULL;
		size_t nfds = 0;
		int rc = gf_msg_try_recv(&p->rd, p->sock, m, &fds, &nfds);
		if (rc == GF_ERR_AGAIN) {
			if (!p->frame_started && gf_frame_reader_partial(&p->rd))
				p->frame_started = gf_now_us();
			return;
		}
		if (rc < 0) {
			char why[256];
			snprintf(why, sizeof(why), "%s", rc == GF_ERR_CLOSED ? "connection closed" : gf_error_detail());
			if (rc == GF_ERR_CLOSED || rc == GF_ERR_IO) {
				gf_srv_close(s, pub, why);
			} else {
				gf_log(GF_LOG_WARN, NAME(s), "msg=\"dropping connection\" id=%s pid=%u error=\"%s\"", pub->id,
				       pub->pid, why);
				gf_srv_send_error(s, pub, 0, rc, why, true);
			}
			return;
		}
		p->frame_started = 0;
		pub->last_heard = gf_now_us();
		if (p->phase != PH_READY) {
			gf_close_fds(fds, nfds);
			free(fds);
			handshake(s, p, m);
			continue;
		}
		s->h.on_message(s->ctx, pub, m, fds, nfds);
	}
	/* The budget is spent: epoll reports the rest next round, after the
	 * others, and the next round looks at what was read ahead. */
	if (pub->fd >= 0 && gf_frame_reader_buffered(&p->rd)) {
		p->backlog_round = s->round;
		s->backlog = true;
	}
}

/* ---- the loop ---- */

static void core_timers(struct gf_srv *s, int64_t now)
{
	if (s->paused_until && now >= s->paused_until) {
		s->paused_until = 0;
		pause_listeners(s, false);
	}
	struct gf_srv_peer_priv *p = s->peers, *next;
	for (; p; p = next) {
		next = p->next;
		if (p->phase != PH_READY && now >= p->handshake_deadline) {
			/* One line per interval: silent connections come by the hundred. */
			s->handshake_drops++;
			if (now - s->last_drop_log >= GF_SRV_LOG_EVERY_US) {
				gf_log(GF_LOG_WARN, NAME(s),
				       "msg=\"dropping connection: handshake not completed in time\" pid=%u dropped_total=%llu",
				       p->pub.pid, (unsigned long long)s->handshake_drops);
				s->last_drop_log = now;
			}
			gf_srv_close(s, &p->pub, "handshake timeout");
		} else if (p->frame_started && now - p->frame_started >= s->handshake_ms * 1000) {
			gf_log(GF_LOG_WARN, NAME(s), "msg=\"dropping connection: frame not completed in time\" id=%s pid=%u",
			       p->pub.id, p->pub.pid);
			gf_srv_close(s, &p->pub, "half a frame, then silence");
		}
	}
}

int gf_srv_process(struct gf_srv *s, int timeout_ms)
{
	if (!s->started)
		return gf_err(GF_ERR_STATE, "%s: not started", NAME(s));
	struct epoll_event evs[64];
	bool backlog = s->backlog;
	s->backlog = false;
	s->round++;
	int n = epoll_wait(s->epfd, evs, GF_ARRAY_SIZE(evs), backlog ? 0 : timeout_ms);
	if (n < 0 && errno != EINTR) {
		s->backlog = backlog;
		return gf_err_errno(GF_ERR_IO, errno, "%s: epoll_wait", NAME(s));
	}
	for (int i = 0; i < n; i++) {
		int *kind = evs[i].data.ptr;
		switch (*kind) {
		case K_STOP: {
			uint64_t v;
			if (read(s->stopfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				return gf_err_errno(GF_ERR_IO, errno, "%s: read stop eventfd", NAME(s));
			break;
		}
		case K_LISTEN:
			for (int k = 0; k < 64 && !s->paused_until; k++)
				if (!accept_one(s, (struct listener *)kind))
					break;
			break;
		case K_PEER: {
			struct gf_srv_peer_priv *p = (struct gf_srv_peer_priv *)kind;
			if (p->pub.fd < 0)
				break;
			if ((evs[i].events & EPOLLOUT) && p->want_write && s->h.on_writable)
				s->h.on_writable(s->ctx, &p->pub);
			if (p->pub.fd >= 0 && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)))
				peer_readable(s, p);
			break;
		}
		case K_WATCH: {
			struct gf_srv_watch *w = (struct gf_srv_watch *)kind;
			w->fn(s->ctx, w);
			break;
		}
		}
		settle(s);
	}
	/* The backlogs of the rounds before, of peers epoll did not bring up in
	 * this one. From the head again after each: a peer's messages may close
	 * others (unlinked, their next gone). */
	for (struct gf_srv_peer_priv *p = backlog ? s->peers : NULL; p;) {
		if (!p->backlog_round || p->backlog_round == s->round) {
			p = p->next;
			continue;
		}
		if (p->pub.fd >= 0)
			peer_readable(s, p);
		else
			p->backlog_round = 0;
		settle(s);
		p = s->peers;
	}
	int64_t now = gf_now_us();
	core_timers(s, now);
	if (s->h.on_timer)
		s->h.on_timer(s->ctx, now);
	settle(s);
	free_list(&s->dead);
	return atomic_load(&s->stopped) ? 1 : 0;
}

int gf_srv_run(struct gf_srv *s)
{
	if (!s->started)
		return gf_err(GF_ERR_STATE, "%s: not started", NAME(s));
	/* epoll_wait blocks and collects in one syscall what poll + a
	 * zero-timeout epoll_wait would do in two. */
	while (!atomic_load(&s->stopped)) {
		int rc = gf_srv_process(s, gf_srv_get_timeout_ms(s));
		if (rc < 0)
			return rc;
	}
	return 0;
}

void gf_srv_stop(struct gf_srv *s)
{
	atomic_store(&s->stopped, true);
	uint64_t one = 1;
	ssize_t r = write(s->stopfd, &one, sizeof(one));
	(void)r;
}
