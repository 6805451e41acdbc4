/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The work any lock server keeping this design's guarantees does between a
 * holder's death and the next grant, in plain C for the benchmarks'
 * baselines (bench-lock's minimal server, failover-floor's lock server):
 * the state file written durably the way gf-lockd writes it (a temp file
 * made ahead, write, fdatasync, rename, fsync of the directory), and a look
 * at whether the holder's process has exited.
 */
#ifndef GF_BENCH_MINLOCK_H
#define GF_BENCH_MINLOCK_H

#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
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

#endif
