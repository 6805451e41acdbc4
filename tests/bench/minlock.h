/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The work any lock server keeping this design's guarantees does between a
 * holder's death and the next grant, in plain C for the benchmarks'
 * baselines (bench-lock's minimal server, failover-floor's lock server):
 * the state file written durably the way gf-lockd writes it (a temp file
 * made ahead, write, fdatasync, rename, fsync of the directory), and the
 * wait for a holder's process to exit once its connection closed.
 */
#ifndef GF_BENCH_MINLOCK_H
#define GF_BENCH_MINLOCK_H

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/types.h>
#include <unistd.h>

#include "common.h"

/* The next store's temp file, made ahead (off the grant's path). */
static inline int relay_prepare(int dirfd)
{
	return openat(dirfd, "relay.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
}

/* Write @epoch and @pid's record durably; *@tmpfd is used and closed. */
static inline int relay_store(int dirfd, int *tmpfd, uint64_t epoch, pid_t pid)
{
	char text[256];
	int n = snprintf(text, sizeof(text), "{\"version\":1,\"holder\":\"w%d\",\"epoch\":%llu,\"pid\":%d,\"granted_at_us\":%lld}\n",
			 (int)pid, (unsigned long long)epoch, (int)pid, (long long)gf_wall_us());
	if (*tmpfd < 0 && (*tmpfd = relay_prepare(dirfd)) < 0)
		return -1;
	int rc = write(*tmpfd, text, (size_t)n) == n && fdatasync(*tmpfd) == 0 ? 0 : -1;
	close(*tmpfd);
	*tmpfd = -1;
	if (rc == 0 && (renameat(dirfd, "relay.tmp", dirfd, "relay.state") < 0 || fsync(dirfd) < 0))
		rc = -1;
	return rc;
}

static inline bool relay_exited(int pidfd)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };
	return poll(&p, 1, 0) == 1;
}

/*
 * The holder's connection closed (it never sends: readable means closed).
 * Closes *@fd; true when its process has exited (*@pidfd closed too), else
 * false with the pidfd moved to *@exit_pidfd and watched in @ep under
 * @exit_tag. Either way *@fd and *@pidfd are -1 after.
 */
static inline bool relay_holder_closed(int ep, int *fd, int *pidfd, int *exit_pidfd, uint64_t exit_tag)
{
	epoll_ctl(ep, EPOLL_CTL_DEL, *fd, NULL);
	close(*fd);
	*fd = -1;
	int64_t until = gf_now_us() + 200; /* its exit is a few microseconds behind its close */
	while (!relay_exited(*pidfd) && gf_now_us() < until)
		sched_yield();
	bool gone = relay_exited(*pidfd);
	if (gone) {
		close(*pidfd);
	} else {
		struct epoll_event e = { .events = EPOLLIN, .data.u64 = exit_tag };
		*exit_pidfd = *pidfd;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, *exit_pidfd, &e) < 0)
			_exit(1);
	}
	*pidfd = -1;
	return gone;
}

#endif
