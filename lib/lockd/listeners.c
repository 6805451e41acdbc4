/* SPDX-License-Identifier: Apache-2.0 */
/* Listening sockets carried by the lock: see listeners.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"
#include "listeners.h"
#include "wire.h"

/* Connections that arrive between two holders wait here; the kernel clamps it to somaxconn. */
#define LSN_BACKLOG 4096

struct lsn {
	char name[GF_LSN_NAME_MAX];
	bool has_uri; /* false: inherited fd only */
	struct gf_uri uri;
	char uristr[300];
	int fd; /* -1: pending */
};

struct gf_lsn_set {
	struct lsn l[GF_LSN_MAX];
	size_t n;
};

int gf_lsn_new(struct gf_lsn_set **out)
{
	struct gf_lsn_set *s = calloc(1, sizeof(*s));
	if (!s)
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	*out = s;
	return 0;
}

void gf_lsn_free(struct gf_lsn_set *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		gf_close(s->l[i].fd);
	free(s);
}

static int check_name(const struct gf_lsn_set *s, const char *name)
{
	size_t len = name ? strlen(name) : 0;
	if (len == 0 || len >= GF_LSN_NAME_MAX)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: listener name must be 1..%d characters", GF_LSN_NAME_MAX - 1);
	for (const char *p = name; *p; p++) {
		char c = *p;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		      c == '_' || c == '-'))
			return gf_err(GF_ERR_INVALID_ARG, "lockd: listener name '%s': only letters, digits, '.', '_' and '-'",
				      name);
	}
	if (s->n >= GF_LSN_MAX)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: at most %d listeners", GF_LSN_MAX);
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->l[i].name, name))
			return gf_err(GF_ERR_INVALID_ARG, "lockd: listener '%s' given twice", name);
	return 0;
}

int gf_lsn_add(struct gf_lsn_set *s, const char *name, const char *uri)
{
	int rc = check_name(s, name);
	if (rc < 0)
		return rc;
	struct lsn *l = &s->l[s->n];
	if (!uri)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: listener '%s': NULL uri", name);
	rc = gf_uri_parse(uri, &l->uri);
	if (rc < 0)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: listener '%s': %s", name, gf_error_detail());
	snprintf(l->name, sizeof(l->name), "%s", name);
	gf_uri_format(&l->uri, l->uristr, sizeof(l->uristr));
	l->has_uri = true;
	l->fd = -1;
	s->n++;
	return 0;
}

static bool is_listening_stream(int fd)
{
	int v = 0;
	socklen_t len = sizeof(v);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) < 0 || !v)
		return false;
	len = sizeof(v);
	return getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) == 0 && v == SOCK_STREAM;
}

/*
 * Only the descriptor flag: O_NONBLOCK lives in the open file every holder's
 * copy shares, so changing it under a serving holder (one handing the socket
 * back after a restart, or one using a socket-activated fd) would turn its
 * accept() blocking or non-blocking behind its back.
 */
static int set_cloexec(int fd)
{
	return fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ? gf_err_errno(GF_ERR_IO, errno, "lockd: fcntl on a listener") : 0;
}

int gf_lsn_add_fd(struct gf_lsn_set *s, const char *name, int fd)
{
	int rc = check_name(s, name);
	if (rc < 0)
		return rc;
	if (fd < 0 || !is_listening_stream(fd))
		return gf_err(GF_ERR_INVALID_ARG, "lockd: listener '%s': fd %d is not a listening stream socket", name, fd);
	rc = set_cloexec(fd);
	if (rc < 0)
		return rc;
	struct lsn *l = &s->l[s->n++];
	snprintf(l->name, sizeof(l->name), "%s", name);
	snprintf(l->uristr, sizeof(l->uristr), "fd:%d", fd);
	l->has_uri = false;
	l->fd = fd;
	return 0;
}

size_t gf_lsn_count(const struct gf_lsn_set *s)
{
	return s ? s->n : 0;
}

size_t gf_lsn_pending(const struct gf_lsn_set *s)
{
	size_t n = 0;
	for (size_t i = 0; s && i < s->n; i++)
		n += s->l[i].fd < 0;
	return n;
}

static int open_one(struct lsn *l)
{
	int fd, rc = gf_uri_listen(&l->uri, LSN_BACKLOG, &fd);
	if (rc < 0)
		return rc;
	/* Ours alone yet: blocking, as documented, for holders that accept without poll(). */
	int fl = fcntl(fd, F_GETFL);
	rc = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 ? gf_err_errno(GF_ERR_IO, errno, "lockd: fcntl on a listener")
								 : 0;
	if (rc < 0) {
		gf_close(fd);
		return rc;
	}
	l->fd = fd;
	gf_log(GF_LOG_INFO, "lock", "msg=\"listener open\" name=%s uri=%s", l->name, l->uristr);
	return 0;
}

int gf_lsn_open(struct gf_lsn_set *s, bool holder_may_have_them)
{
	for (size_t i = 0; i < s->n; i++) {
		struct lsn *l = &s->l[i];
		if (l->fd >= 0)
			continue;
		int rc = open_one(l);
		if (rc == GF_ERR_BUSY && holder_may_have_them) {
			gf_log(GF_LOG_WARN, "lock",
			       "msg=\"listener busy: waiting for the holder on record to hand it back\" name=%s uri=%s",
			       l->name, l->uristr);
			continue;
		}
		if (rc < 0)
			return gf_err(rc, "lockd: listener '%s': %s", l->name, gf_error_detail());
	}
	return 0;
}

int gf_lsn_retry(struct gf_lsn_set *s)
{
	int left = 0;
	for (size_t i = 0; i < s->n; i++) {
		struct lsn *l = &s->l[i];
		if (l->fd >= 0)
			continue;
		if (open_one(l) < 0) {
			gf_log(GF_LOG_ERR, "lock", "msg=\"listener still cannot be opened; retrying\" name=%s uri=%s error=\"%s\"",
			       l->name, l->uristr, gf_error_detail());
			left++;
		}
	}
	return left;
}

/* Does @fd listen where @l is configured? (A reclaiming holder must not plant another socket.) */
static bool same_address(const struct lsn *l, int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	if (!is_listening_stream(fd) || getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
		return false;
	if (l->uri.kind == GF_URI_UNIX) {
		const struct sockaddr_un *su = (const struct sockaddr_un *)&ss;
		return ss.ss_family == AF_UNIX && !strcmp(su->sun_path, l->uri.path);
	}
	char host[NI_MAXHOST], port[NI_MAXSERV];
	if (getnameinfo((struct sockaddr *)&ss, len, host, sizeof(host), port, sizeof(port),
			NI_NUMERICHOST | NI_NUMERICSERV))
		return false;
	if ((unsigned)atoi(port) != l->uri.port)
		return false;
	/* The configured host may be a name: compare with what it resolves to. */
	struct addrinfo hints = { .ai_family = ss.ss_family, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *res;
	if (getaddrinfo(l->uri.host, NULL, &hints, &res))
		return false;
	bool same = false;
	for (struct addrinfo *a = res; a && !same; a = a->ai_next) {
		char h2[NI_MAXHOST];
		if (!getnameinfo(a->ai_addr, a->ai_addrlen, h2, sizeof(h2), NULL, 0, NI_NUMERICHOST))
			same = !strcmp(h2, host);
	}
	freeaddrinfo(res);
	return same;
}

void gf_lsn_adopt(struct gf_lsn_set *s, const gf_LockAcquire *a, int *fds, size_t nfds)
{
	for (size_t k = 0; k < nfds; k++) {
		const char *name = k < a->listeners_count ? a->listeners[k] : "";
		struct lsn *l = NULL;
		for (size_t i = 0; i < s->n; i++)
			if (!strcmp(s->l[i].name, name))
				l = &s->l[i];
		if (l && l->fd < 0 && l->has_uri && same_address(l, fds[k]) && set_cloexec(fds[k]) == 0) {
			l->fd = fds[k];
			fds[k] = -1;
			gf_log(GF_LOG_INFO, "lock", "msg=\"listener handed back by the holder\" name=%s uri=%s", l->name,
			       l->uristr);
		}
		gf_close(fds[k]);
		fds[k] = -1;
	}
}

size_t gf_lsn_fill_grant(const struct gf_lsn_set *s, gf_LockGranted *g, int *fds)
{
	size_t n = 0;
	for (size_t i = 0; s && i < s->n; i++) {
		if (s->l[i].fd < 0)
			continue;
		snprintf(g->listeners[n], sizeof(g->listeners[n]), "%s", s->l[i].name);
		fds[n++] = s->l[i].fd;
	}
	g->listeners_count = (pb_size_t)n;
	return n;
}

void gf_lsn_fill_status(const struct gf_lsn_set *s, gf_LockStatus *st)
{
	for (size_t i = 0; s && i < s->n; i++)
		snprintf(st->listeners[i], sizeof(st->listeners[i]), "%s=%s", s->l[i].name, s->l[i].uristr);
	st->listeners_count = (pb_size_t)(s ? s->n : 0);
	st->listeners_pending = (uint32_t)gf_lsn_pending(s);
}
