/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test helper for the etcd lock backend. Times are CLOCK_MONOTONIC in
 * microseconds (what Python's time.monotonic() reads), one line each.
 *   etcd-helper URI ID hold         acquire, start the watcher, then every
 *                                   20 ms "act" while gf_lock_is_held()
 *                                   says so; the loss hook prints "lost"
 *   etcd-helper URI ID once         one acquire with timeout 0: "granted"
 *                                   or "error NAME"
 *   etcd-helper URI ID proof        acquire, then the typed holder query
 *                                   with the grant's fence proof and with a
 *                                   forged one: "holder ID epoch N pid P
 *                                   proof V" each
 *   etcd-helper URI ID loop N MS    N times: acquire, hold up to MS ms
 *                                   (checking is_held), release; prints
 *                                   "granted" and "end" (last held check)
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpufailover.h"

static long long mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void on_lost(gf_lock *l, int err, const char *detail, void *ud)
{
	printf("lost epoch=%llu t=%lld detail=%s\n", (unsigned long long)gf_lock_epoch(l), mono_us(), detail);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	gf_lock *l;
	struct gf_lock_grant g;
	if (gf_lock_new(&l, argv[1], argv[2]) < 0) {
		fprintf(stderr, "etcd-helper: %s\n", gf_error_detail());
		return 1;
	}
	gf_lock_set_lost_fn(l, on_lost, NULL);
	if (!strcmp(argv[3], "hold")) {
		if (gf_lock_acquire(l, -1, &g) < 0 || gf_lock_start_watch(l) < 0) {
			fprintf(stderr, "etcd-helper: %s\n", gf_error_detail());
			return 1;
		}
		printf("granted id=%s epoch=%llu t=%lld\n", argv[2], (unsigned long long)g.epoch, mono_us());
		for (;;) {
			if (gf_lock_is_held(l))
				printf("act epoch=%llu t=%lld\n", (unsigned long long)g.epoch, mono_us());
			usleep(20000);
		}
	}
	if (!strcmp(argv[3], "once")) {
		int rc = gf_lock_acquire(l, 0, &g);
		if (rc == 0)
			printf("granted id=%s epoch=%llu t=%lld\n", argv[2], (unsigned long long)g.epoch, mono_us());
		else
			printf("error %s\n", gf_error_name(rc));
		gf_lock_free(l);
		return 0;
	}
	if (!strcmp(argv[3], "proof")) {
		struct gf_lock_proof p;
		if (gf_lock_acquire(l, 30000, &g) < 0 || gf_lock_grant_proof(&g, &p) < 0) {
			fprintf(stderr, "etcd-helper: %s\n", gf_error_detail());
			return 1;
		}
		printf("granted id=%s epoch=%llu t=%lld\n", argv[2], (unsigned long long)g.epoch, mono_us());
		for (int forged = 0; forged < 2; forged++) {
			p.token[0] ^= (uint8_t)forged;
			gf_lock_query *q;
			struct gf_lock_holder h;
			int rc = gf_lock_query_start(&q, argv[1], NULL, 0, &p, 10000);
			if (rc == 0) {
				struct pollfd pfd = { .fd = gf_lock_query_get_fd(q), .events = POLLIN };
				poll(&pfd, 1, 15000);
				rc = gf_lock_query_result(q, &h);
				gf_lock_query_free(q);
			}
			if (rc < 0) {
				fprintf(stderr, "etcd-helper: %s\n", gf_error_detail());
				return 1;
			}
			printf("holder %s epoch %llu pid %u proof %d\n", h.id, (unsigned long long)h.epoch, h.pid,
			       h.proof_valid);
		}
		gf_lock_free(l);
		return 0;
	}
	if (!strcmp(argv[3], "loop") && argc > 5) {
		int n = atoi(argv[4]), ms = atoi(argv[5]);
		unsigned seed = (unsigned)getpid();
		for (int i = 0; i < n; i++) {
			if (gf_lock_acquire(l, 60000, &g) < 0) {
				fprintf(stderr, "etcd-helper: %s\n", gf_error_detail());
				return 1;
			}
			long long t = mono_us(), last = t;
			printf("granted id=%s epoch=%llu t=%lld\n", argv[2], (unsigned long long)g.epoch, t);
			long long until = t + (long long)(rand_r(&seed) % (ms + 1)) * 1000;
			while (mono_us() < until && gf_lock_is_held(l)) {
				last = mono_us();
				usleep(1000);
			}
			if (gf_lock_is_held(l))
				last = mono_us();
			printf("end id=%s epoch=%llu t=%lld\n", argv[2], (unsigned long long)g.epoch, last);
			gf_lock_release(l);
		}
		gf_lock_free(l);
		return 0;
	}
	return 2;
}
