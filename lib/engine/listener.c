/* SPDX-License-Identifier: Apache-2.0 */
/* The listening sockets the lock carries, for the engine's serve step. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "engine_int.h"
#include "gpufailover/lock.h"

static bool same_socket(int fd, uint64_t dev, uint64_t ino)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino;
}

/* The datagram socket gf_engine_stop_accepting() points handed-out fds at,
 * made before the wait rather than on the way to serving. */
void gf_engine_listener_prepare(gf_engine *e)
{
	pthread_mutex_lock(&e->mu);
	if (e->lsn_dummy < 0)
		e->lsn_dummy = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	pthread_mutex_unlock(&e->mu);
}

/* Remember @fd; entries whose socket the caller has closed since are dropped to make room. */
static void remember(gf_engine *e, int fd)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return;
	pthread_mutex_lock(&e->mu);
	if (e->lsn_dummy < 0)
		e->lsn_dummy = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	size_t n = 0;
	for (size_t i = 0; i < e->nlsn_out; i++)
		if (same_socket(e->lsn_out[i].fd, e->lsn_out[i].dev, e->lsn_out[i].ino))
			e->lsn_out[n++] = e->lsn_out[i];
	if (n < sizeof(e->lsn_out) / sizeof(e->lsn_out[0]))
		e->lsn_out[n++] = (struct engine_lsn){ .fd = fd, .dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino };
	e->nlsn_out = n;
	pthread_mutex_unlock(&e->mu);
}

int gf_engine_listener(gf_engine *e, const char *name, int *fd_out)
{
	if (!e || !name || !fd_out)
		return gf_err(GF_ERR_INVALID_ARG, "engine: NULL argument");
	gf_lock *l = atomic_load(&e->lock);
	if (!l || !gf_lock_is_held(l))
		return gf_err(GF_ERR_STATE, "engine: listeners come with the lock's grant; not held");
	const struct gf_lock_listener *ls;
	size_t n;
	int rc = gf_lock_listeners(l, &ls, &n);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(ls[i].name, name) != 0)
			continue;
		int fd = fcntl(ls[i].fd, F_DUPFD_CLOEXEC, 3);
		if (fd < 0)
			return gf_err_errno(GF_ERR_IO, errno, "engine: dup of listener %s", name);
		remember(e, fd);
		*fd_out = fd;
		return 0;
	}
	return gf_err(GF_ERR_NOT_FOUND, "engine: the lock server carries no listener named '%s' (gf-lockd --listener %s=URI)",
		      name, name);
}

/*
 * The caller owns its duplicates and may be polling them on another thread,
 * so they are not closed (the number could be reused under it) but made to
 * point at a datagram socket: accept() on that number fails with EOPNOTSUPP
 * and poll() reports nothing to read, while the listening socket itself —
 * shared with the next holder — is left untouched.
 */
void gf_engine_stop_accepting(gf_engine *e)
{
	pthread_mutex_lock(&e->mu);
	int dummy = e->lsn_dummy;
	for (size_t i = 0; i < e->nlsn_out; i++) {
		const struct engine_lsn *s = &e->lsn_out[i];
		if (!same_socket(s->fd, s->dev, s->ino))
			continue;
		if (dummy < 0 || dup3(dummy, s->fd, O_CLOEXEC) < 0)
			/* The last resort: the caller's close may then hit a reused number, but nothing accepts. */
			close(s->fd);
	}
	e->nlsn_out = 0;
	pthread_mutex_unlock(&e->mu);
}

int gf_engine_may_accept(gf_engine *e)
{
	if (!e || atomic_load(&e->loss_called))
		return 0;
	int st = gf_engine_state(e);
	if (st != GF_ENGINE_WAKING && st != GF_ENGINE_ACTIVE)
		return 0;
	gf_lock *l = atomic_load(&e->lock);
	if (!l || !gf_lock_is_held(l))
		return 0;
	/* No connection: the client is reconnecting, and whether the grant
	 * survives is known only when the server answers the reclaim (new
	 * connections wait in the backlog meanwhile). A connection the server
	 * closed (a holder revoked while stopped, resumed before its watcher
	 * thread has read the EOF) is the same. */
	struct pollfd p = { .fd = gf_lock_get_fd(l), .events = POLLRDHUP };
	/* ... unless the server is down (listeners come only over unix
	 * sockets): nobody else can be granted until it returns, and then only
	 * this holder within its window (docs/design.md, decision 31). */
	if (p.fd < 0)
		return gf_lock_unreachable_ms(l) > 0;
	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
		return 0;
	return 1;
}
