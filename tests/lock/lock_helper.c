/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test helper: a lock holder that misbehaves on purpose.
 *   lock-helper URI ID fork-keep    hold, fork a child that keeps a dup of the
 *                                   lock socket open (no exec), print
 *                                   "child=PID", then wait to be killed
 *   lock-helper URI ID linger MS    hold, close the socket without releasing,
 *                                   stay alive MS more, print "exiting", exit
 *   lock-helper URI ID rank MS WHEN [fork-keep]
 *                                   a holder with one more rank: fork a child
 *                                   that outlives this process by MS, register
 *                                   it (WHEN: "before" the acquire or "after"
 *                                   the grant), print "rank=PID" (with
 *                                   fork-keep, also a child that keeps the
 *                                   socket open: "child=PID"), wait to be killed
 *   lock-helper URI ID add-pid-errors
 *                                   print what gf_lock_add_pid() answers to
 *                                   bad pids and too many, one "case=ERR" a line
 *   lock-helper URI ID rejoin GPU   on GPU: hold until a line on stdin,
 *                                   release, then wait again as a standby
 *                                   (the same process: its time Active is
 *                                   its own), print "waiting"; exit 73 when
 *                                   evicted
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpufailover.h"

/* A child that lives until its parent is gone, then @linger_ms more. */
static pid_t fork_rank(int linger_ms)
{
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid == 0) {
		while (getppid() == parent)
			usleep(10000);
		usleep((useconds_t)linger_ms * 1000);
		_exit(0);
	}
	return pid;
}

static const char *name(int rc)
{
	return rc == 0 ? "0" : gf_error_name(rc);
}

static int add_pid_errors(const char *uri, const char *id)
{
	gf_lock *l;
	if (gf_lock_new(&l, uri, id) < 0)
		return 1;
	printf("zero=%s\n", name(gf_lock_add_pid(l, 0)));
	printf("negative=%s\n", name(gf_lock_add_pid(l, -5)));
	pid_t dead = fork();
	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);
	printf("dead=%s\n", name(gf_lock_add_pid(l, dead)));
	printf("self=%s\n", name(gf_lock_add_pid(l, getpid())));
	pid_t kids[GF_LOCK_MAX_PIDS + 1];
	int rc = 0;
	for (int i = 0; i <= GF_LOCK_MAX_PIDS; i++) {
		kids[i] = fork();
		if (kids[i] == 0) {
			pause();
			_exit(0);
		}
		rc = gf_lock_add_pid(l, kids[i]);
		if (i == 0)
			printf("again=%s\n", name(gf_lock_add_pid(l, kids[0])));
		if (rc < 0 && i < GF_LOCK_MAX_PIDS)
			printf("unexpected=%s detail=%s\n", name(rc), gf_error_detail());
	}
	printf("toomany=%s\n", name(rc));
	/* One exits: its slot is free again. */
	kill(kids[0], SIGKILL);
	waitpid(kids[0], NULL, 0);
	printf("after_exit=%s\n", name(gf_lock_add_pid(l, kids[GF_LOCK_MAX_PIDS])));
	for (int i = 1; i <= GF_LOCK_MAX_PIDS; i++) {
		kill(kids[i], SIGKILL);
		waitpid(kids[i], NULL, 0);
	}
	gf_lock_free(l);
	gf_lock *t;
	if (gf_lock_new(&t, "tcp://127.0.0.1:1", id) < 0)
		return 1;
	printf("tcp=%s\n", name(gf_lock_add_pid(t, getppid())));
	gf_lock_free(t);
	if (gf_lock_new(&t, "etcd://127.0.0.1:1/gf/x", id) < 0)
		return 1;
	printf("etcd=%s\n", name(gf_lock_add_pid(t, getppid())));
	gf_lock_free(t);
	fflush(stdout);
	return 0;
}

/* A child that keeps the lock's socket open past this process's death
 * (dup drops close-on-exec and escapes the atfork handler); prints "child=PID". */
static void fork_keeper(gf_lock *l)
{
	int keep = dup(gf_lock_get_fd(l));
	pid_t pid = fork();
	if (pid == 0) {
		sleep(60);
		close(keep);
		_exit(0);
	}
	printf("child=%d\n", (int)pid);
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	if (!strcmp(argv[3], "add-pid-errors"))
		return add_pid_errors(argv[1], argv[2]);
	gf_lock *l;
	struct gf_lock_grant g;
	pid_t rank = 0;
	bool before = false;
	if (!strcmp(argv[3], "rank") && argc > 5) {
		rank = fork_rank(atoi(argv[4]));
		before = !strcmp(argv[5], "before");
	}
	const char *gpus[] = { argc > 4 ? argv[4] : "" };
	bool rejoin = !strcmp(argv[3], "rejoin") && argc > 4;
	if (gf_lock_new(&l, argv[1], argv[2]) < 0 || (rejoin && gf_lock_set_resources(l, gpus, 1, 0, 0) < 0) ||
	    (before && gf_lock_add_pid(l, rank) < 0) || gf_lock_acquire(l, -1, &g) < 0 ||
	    (rank && !before && gf_lock_add_pid(l, rank) < 0)) {
		fprintf(stderr, "lock-helper: %s\n", gf_error_detail());
		return 1;
	}
	printf("granted id=%s epoch=%llu\n", argv[2], (unsigned long long)g.epoch);
	fflush(stdout);
	if (!strcmp(argv[3], "fork-keep")) {
		fork_keeper(l);
		fflush(stdout);
		for (;;)
			pause();
	}
	if (rank) {
		printf("rank=%d\n", (int)rank);
		if (argc > 6 && !strcmp(argv[6], "fork-keep"))
			fork_keeper(l);
		fflush(stdout);
		for (;;)
			pause();
	}
	if (rejoin) {
		char line[16];
		if (!fgets(line, sizeof(line), stdin) || gf_lock_release(l) < 0) {
			fprintf(stderr, "lock-helper: %s\n", gf_error_detail());
			return 1;
		}
		printf("waiting\n");
		fflush(stdout);
		int rc = gf_lock_acquire(l, -1, &g);
		printf("acquire rc=%s\n", gf_error_name(rc) ? gf_error_name(rc) : "?");
		fflush(stdout);
		return rc == GF_ERR_EVICTED ? 73 : rc < 0 ? 1 : 0;
	}
	if (!strcmp(argv[3], "linger") && argc > 4) {
		close(gf_lock_get_fd(l));
		usleep((useconds_t)atoi(argv[4]) * 1000);
		printf("exiting\n");
		fflush(stdout);
		_exit(0);
	}
	return 2;
}
