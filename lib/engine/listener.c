/* SPDX-License-Identifier: Apache-2.0 */
/* The listening sockets the lock carries, for the engine's serve step. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "common.h"
#include "engine_int.h"
#include "gpufailover/lock.h"

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
		*fd_out = fd;
		return 0;
	}
	return gf_err(GF_ERR_NOT_FOUND, "engine: the lock server carries no listener named '%s' (gf-lockd --listener %s=URI)",
		      name, name);
}
