/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test helper: a lock holder that misbehaves on purpose.
 *   lock-helper URI ID fork-keep    hold, fork a child that keeps a dup of the
 *                                   lock socket open (no exec), print
 *                                   "child=PID", then wait to be killed
 *   lock-helper URI ID linger MS    hold, close the socket without releasing,
 *                                   stay alive MS more, print "exiting", exit
 *   lock-helper URI ID rejoin GPU   on GPU: hold until a line on stdin,
 *                                   release, then wait again as a standby
 *                                   (the same process: its time Active is
 *                                   its own), print "waiting"; exit 73 when
 *                                   evicted
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpufailover.h"

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	gf_lock *l;
	struct gf_lock_grant g;
	const char *gpus[] = { argc > 4 ? argv[4] : "" };
	bool rejoin = !strcmp(argv[3], "rejoin") && argc > 4;
	if (gf_lock_new(&l, argv[1], argv[2]) < 0 || (rejoin && gf_lock_set_resources(l, gpus, 1, 0, 0) < 0) ||
	    gf_lock_acquire(l, -1, &g) < 0) {
		fprintf(stderr, "lock-helper: %s\n", gf_error_detail());
		return 1;
	}
	printf("granted id=%s epoch=%llu\n", argv[2], (unsigned long long)g.epoch);
	fflush(stdout);
	if (!strcmp(argv[3], "fork-keep")) {
		int keep = dup(gf_lock_get_fd(l)); /* dup drops close-on-exec and escapes the atfork handler */
		pid_t pid = fork();
		if (pid == 0) {
			sleep(60);
			close(keep);
			_exit(0);
		}
		printf("child=%d\n", (int)pid);
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
