/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GMS remap benchmark (host backend, in-process server thread).
 *
 * For N allocations and M metadata entries: time gf_gms_remap() (wake) and
 * count its request/reply round trips, next to the raw work measured in the
 * same run: the same N fds received over a unix socket (gf_frame_send/recv,
 * 253 per frame) and mmapped read-only at fixed offsets of one reservation.
 * Prints one JSON line per case. Round trips must stay 2 (connect + one bulk
 * list) whatever N and M are; the program fails otherwise.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../gms/gmstest.h"
#include "gms_internal.h"
#include "testutil.h"
#include "wire.h"

#define REPS 5

static int check(int rc, const char *what)
{
	if (rc < 0) {
		fprintf(stderr, "bench_gms: %s: %s: %s\n", what, gf_error_name(rc), gf_error_detail());
		exit(1);
	}
	return rc;
}

struct raw_sender {
	int sock;
	int *fds;
	size_t n;
};

static void *raw_send(void *arg)
{
	struct raw_sender *s = arg;
	uint8_t body[1] = {0};
	for (int r = 0; r < REPS; r++)
		check(gf_frame_send(s->sock, body, sizeof(body), s->fds, s->n, INT64_MAX), "raw send");
	return NULL;
}

/* The physical baseline: receive N fds and mmap each read-only into one reservation. */
static double raw_us(size_t n, size_t gran)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		exit(1);
	int *fds = calloc(n, sizeof(int));
	for (size_t i = 0; i < n; i++) {
		fds[i] = memfd_create("raw", MFD_CLOEXEC);
		if (fds[i] < 0 || ftruncate(fds[i], (off_t)gran) < 0)
			exit(1);
	}
	struct raw_sender s = {sv[0], fds, n};
	pthread_t th;
	pthread_create(&th, NULL, raw_send, &s);
	uint8_t *base = mmap(NULL, n * gran, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	struct gf_frame_reader rd;
	gf_frame_reader_init(&rd, n);
	double best = 1e30;
	for (int r = 0; r < REPS; r++) {
		int64_t t0 = gf_now_us();
		check(gf_frame_recv(&rd, sv[1], INT64_MAX), "raw recv");
		int *got;
		size_t ng;
		gf_frame_reader_take_fds(&rd, &got, &ng);
		for (size_t i = 0; i < ng; i++) {
			if (mmap(base + i * gran, gran, PROT_READ, MAP_SHARED | MAP_FIXED, got[i], 0) == MAP_FAILED)
				exit(1);
			close(got[i]);
		}
		double dt = (double)(gf_now_us() - t0);
		free(got);
		/* back to a bare reservation, as unmap() leaves it */
		mmap(base, n * gran, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
		if (dt < best)
			best = dt;
	}
	pthread_join(th, NULL);
	gf_frame_reader_clear(&rd);
	munmap(base, n * gran);
	gf_close_fds(fds, n);
	free(fds);
	close(sv[0]);
	close(sv[1]);
	return best;
}

static int run_case(const char *dir, gf_mem *mem, size_t n, size_t m)
{
	struct gt_server srv;
	char name[64];
	snprintf(name, sizeof(name), "bench-%zu-%zu", n, m);
	check(gt_start(&srv, dir, name, 0), "start server");
	size_t gran, rec;
	check(gf_mem_granularity(mem, &gran, &rec), "granularity");

	gf_gms *w;
	check(gf_gms_connect(&w, srv.uri, mem, GF_GMS_RW, 5000), "connect RW");
	for (size_t i = 0; i < n; i++)
		check(gf_gms_allocate(w, gran, "t", NULL), "allocate");
	char value[64];
	memset(value, 'v', sizeof(value));
	for (size_t k = 0; k < m; k++) {
		char key[96];
		snprintf(key, sizeof(key), "model.layers.%zu.mlp.weight", k);
		check(gf_gms_put_meta(w, key, 1 + k % n, 0, value, sizeof(value)), "put_meta");
	}
	check(gf_gms_commit(w, NULL), "commit");
	gf_gms_free(w); /* the layout stays COMMITTED */

	gf_gms *r;
	check(gf_gms_connect(&r, srv.uri, mem, GF_GMS_RO, 5000), "connect RO");
	uint64_t rt0 = gf_gms_round_trips(r);
	int64_t t0 = gf_now_us();
	check(gf_gms_map_all(r), "map_all");
	double map_all_us = (double)(gf_now_us() - t0);
	uint64_t map_all_rt = gf_gms_round_trips(r) - rt0 + 1; /* + the connect */
	double best = 1e30;
	uint64_t remap_rt = 0;
	for (int k = 0; k < REPS; k++) {
		check(gf_gms_unmap(r), "unmap");
		uint64_t before = gf_gms_round_trips(r);
		t0 = gf_now_us();
		check(gf_gms_remap(r, 5000), "remap");
		double dt = (double)(gf_now_us() - t0);
		remap_rt = gf_gms_round_trips(r) - before;
		if (dt < best)
			best = dt;
	}
	gf_gms_free(r);
	gt_stop(&srv);
	double raw = raw_us(n, gran);
	size_t frames = (n + 63) / 64 > (m + 31) / 32 ? (n + 63) / 64 : (m + 31) / 32;
	printf("{\"bench\":\"gms_remap\",\"allocations\":%zu,\"metadata\":%zu,\"granularity\":%zu,"
	       "\"remap_round_trips\":%llu,\"map_all_round_trips\":%llu,\"map_all_reply_chunks\":%zu,"
	       "\"remap_us\":%.1f,\"map_all_us\":%.1f,\"raw_fd_recv_mmap_us\":%.1f,\"remap_vs_raw\":%.2f}\n",
	       n, m, gran, (unsigned long long)remap_rt, (unsigned long long)map_all_rt, frames ? frames : 1, best,
	       map_all_us, raw, raw > 0 ? best / raw : 0.0);
	fflush(stdout);
	/* connect + one bulk list, whatever N and M */
	return remap_rt == 2 && map_all_rt == 2 ? 0 : 1;
}

int main(void)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = rl.rlim_max; /* 1000 allocations: server, client and baseline each hold N fds */
	setrlimit(RLIMIT_NOFILE, &rl);
	char *dir = tu_tmpdir();
	gf_mem *mem;
	check(gf_mem_open(&mem, GF_MEM_HOST, 0), "mem_open");
	static const size_t cases[][2] = {{1, 0}, {10, 100}, {100, 1000}, {1000, 10000}};
	int bad = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		bad |= run_case(dir, mem, cases[i][0], cases[i][1]);
	gf_mem_free(mem);
	if (bad)
		fprintf(stderr, "bench_gms: round trips grew with N or M\n");
	return bad;
}
