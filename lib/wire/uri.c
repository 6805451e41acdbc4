/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

int gf_uri_parse(const char *text, struct gf_uri *out)
{
	struct gf_uri u;
	memset(&u, 0, sizeof(u));
	if (!text || !out)
		return gf_err(GF_ERR_INVALID_ARG, "uri: NULL argument");
	if (!strncmp(text, "unix://", 7)) {
		const char *p = text + 7;
		if (*p != '/')
			return gf_err(GF_ERR_INVALID_ARG,
				      "uri '%s': a unix URI needs an absolute path (unix:///run/gf/lock.sock)", text);
		if (strlen(p) >= sizeof(u.path))
			return gf_err(GF_ERR_INVALID_ARG, "uri '%s': socket path longer than %zu bytes", text,
				      sizeof(u.path) - 1);
		if (p[1] == '\0')
			return gf_err(GF_ERR_INVALID_ARG, "uri '%s': empty socket path", text);
		u.kind = GF_URI_UNIX;
		strcpy(u.path, p);
	} else if (!strncmp(text, "tcp://", 6)) {
		const char *h = text + 6, *hend, *colon;
		if (*h == '[') {
			hend = strchr(h, ']');
			if (!hend)
				return gf_err(GF_ERR_INVALID_ARG, "uri '%s': missing ']' after IPv6 address", text);
			colon = hend + 1;
			h++;
			if (*colon != ':')
				return gf_err(GF_ERR_INVALID_ARG, "uri '%s': expected ':PORT' after ']'", text);
		} else {
			colon = strrchr(h, ':');
			if (!colon)
				return gf_err(GF_ERR_INVALID_ARG, "uri '%s': expected tcp://HOST:PORT", text);
			hend = colon;
			if (memchr(h, ':', (size_t)(hend - h)))
				return gf_err(GF_ERR_INVALID_ARG, "uri '%s': write IPv6 addresses as [addr]:port",
					      text);
		}
		size_t hl = (size_t)(hend - h);
		if (hl == 0)
			return gf_err(GF_ERR_INVALID_ARG, "uri '%s': empty host", text);
		if (hl >= sizeof(u.host))
			return gf_err(GF_ERR_INVALID_ARG, "uri '%s': host too long", text);
		for (const char *c = h; c < hend; c++)
			if (*c == '/' || *c == '@' || *c == ' ')
				return gf_err(GF_ERR_INVALID_ARG, "uri '%s': invalid character in host", text);
		const char *pp = colon + 1;
		unsigned long port = 0;
		if (!*pp)
			return gf_err(GF_ERR_INVALID_ARG, "uri '%s': missing port", text);
		for (; *pp; pp++) {
			if (*pp < '0' || *pp > '9')
				return gf_err(GF_ERR_INVALID_ARG, "uri '%s': port must be a number", text);
			port = port * 10 + (unsigned long)(*pp - '0');
			if (port > 65535)
				return gf_err(GF_ERR_INVALID_ARG, "uri '%s': port out of range 1-65535", text);
		}
		if (port == 0)
			return gf_err(GF_ERR_INVALID_ARG, "uri '%s': port out of range 1-65535", text);
		u.kind = GF_URI_TCP;
		memcpy(u.host, h, hl);
		u.port = (uint16_t)port;
	} else {
		return gf_err(GF_ERR_INVALID_ARG,
			      "uri '%s': unknown scheme (use unix:///path or tcp://host:port; "
			      "a lock also takes etcd://host:port/prefix/name or etcds://)",
			      text);
	}
	*out = u;
	return 0;
}

void gf_uri_format(const struct gf_uri *u, char *buf, size_t len)
{
	if (u->kind == GF_URI_UNIX)
		snprintf(buf, len, "unix://%s", u->path);
	else if (strchr(u->host, ':'))
		snprintf(buf, len, "tcp://[%s]:%u", u->host, u->port);
	else
		snprintf(buf, len, "tcp://%s:%u", u->host, u->port);
}

static int wait_connected(int fd, int64_t deadline_us, const char *name)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int n = poll(&p, 1, gf_poll_timeout_ms(deadline_us));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return gf_err_errno(GF_ERR_IO, errno, "connect %s: poll", name);
		if (n == 0)
			return gf_err(GF_ERR_TIMEOUT, "connect %s: timed out", name);
		int soerr = 0;
		socklen_t sl = sizeof(soerr);
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
		if (soerr)
			return gf_err_errno(GF_ERR_UNREACHABLE, soerr, "connect %s", name);
		return 0;
	}
}

static void tcp_tune(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int gf_uri_connect(const struct gf_uri *u, int64_t deadline_us, int *out_fd)
{
	char name[400];
	gf_uri_format(u, name, sizeof(name));
	if (u->kind == GF_URI_UNIX) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		strcpy(sa.sun_path, u->path);
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return gf_err_errno(GF_ERR_IO, errno, "socket");
		int r;
		do
			r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
		while (r < 0 && errno == EINTR);
		if (r < 0 && errno == EAGAIN) {
			/* Listen backlog full: the server is alive but busy. */
			gf_close(fd);
			return gf_err(GF_ERR_BUSY, "connect %s: server backlog full", name);
		}
		if (r < 0) {
			int e = errno;
			gf_close(fd);
			return gf_err_errno(e == EACCES ? GF_ERR_PERMISSION : GF_ERR_UNREACHABLE, e, "connect %s",
					    name);
		}
		*out_fd = fd;
		return 0;
	}
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res, *ai;
	char port[8];
	snprintf(port, sizeof(port), "%u", u->port);
	int g = getaddrinfo(u->host, port, &hints, &res);
	if (g)
		return gf_err(GF_ERR_UNREACHABLE, "connect %s: %s", name, gai_strerror(g));
	int rc = gf_err(GF_ERR_UNREACHABLE, "connect %s: no address", name);
	for (ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (fd < 0) {
			rc = gf_err_errno(GF_ERR_IO, errno, "socket");
			continue;
		}
		tcp_tune(fd);
		int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
		if (r < 0 && errno != EINPROGRESS && errno != EINTR) {
			rc = gf_err_errno(GF_ERR_UNREACHABLE, errno, "connect %s", name);
			gf_close(fd);
			continue;
		}
		if (r < 0) {
			rc = wait_connected(fd, deadline_us, name);
			if (rc < 0) {
				gf_close(fd);
				continue;
			}
		}
		freeaddrinfo(res);
		*out_fd = fd;
		return 0;
	}
	freeaddrinfo(res);
	return rc;
}

/* A socket file whose server is gone refuses connections: safe to replace.
 * One that still accepts belongs to a live server and must not be stolen. */
static int remove_stale_socket(const char *path)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : gf_err_errno(GF_ERR_IO, errno, "stat %s", path);
	if (!S_ISSOCK(st.st_mode))
		return gf_err(GF_ERR_BUSY, "listen %s: exists and is not a socket", path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return gf_err_errno(GF_ERR_IO, errno, "socket");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	strcpy(sa.sun_path, path);
	int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	gf_close(fd);
	if (r == 0)
		return gf_err(GF_ERR_BUSY, "listen unix://%s: another server is already listening", path);
	if (e != ECONNREFUSED)
		return gf_err_errno(GF_ERR_BUSY, e, "listen unix://%s: probing the existing socket", path);
	if (unlink(path) < 0 && errno != ENOENT)
		return gf_err_errno(GF_ERR_IO, errno, "unlink stale socket %s", path);
	return 0;
}

int gf_uri_listen(const struct gf_uri *u, int backlog, int *out_fd)
{
	char name[400];
	gf_uri_format(u, name, sizeof(name));
	if (u->kind == GF_URI_UNIX) {
		int rc = remove_stale_socket(u->path);
		if (rc < 0)
			return rc;
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return gf_err_errno(GF_ERR_IO, errno, "socket");
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		strcpy(sa.sun_path, u->path);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, backlog) < 0) {
			int e = errno;
			gf_close(fd);
			return gf_err_errno(gf_errno_to_err(e) == GF_ERR_PERMISSION ? GF_ERR_PERMISSION : GF_ERR_IO,
					    e, "listen %s", name);
		}
		*out_fd = fd;
		return 0;
	}
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE },
			*res;
	char port[8];
	snprintf(port, sizeof(port), "%u", u->port);
	int g = getaddrinfo(u->host, port, &hints, &res);
	if (g)
		return gf_err(GF_ERR_INVALID_ARG, "listen %s: %s", name, gai_strerror(g));
	int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		freeaddrinfo(res);
		return gf_err_errno(GF_ERR_IO, errno, "socket");
	}
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, backlog) < 0) {
		int e = errno;
		freeaddrinfo(res);
		gf_close(fd);
		return gf_err_errno(e == EADDRINUSE ? GF_ERR_BUSY : GF_ERR_IO, e, "listen %s", name);
	}
	freeaddrinfo(res);
	*out_fd = fd;
	return 0;
}
