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
 *
 * The raw sender thread sends every repetition's frames as fast as the socket
 * takes them, ahead of the receiver, so the raw figure holds little
 * sender-side work: a lower bound rather than a twin of remap.
 *
 * remap_us is the wake as an engine does it: the reader kept its handles
 * while asleep (the default), so the wake maps them and receives no fd.
 * remap_released_us is the same wake after gf_gms_set_keep_handles(0): the
 * list and every fd come over the kept session, the path a wake takes when
 * the layout changed or the session was lost.
 *
 * Every figure is the median of the repetitions (9 by default; min and max
 * are printed too): map_all with a fresh RO client each time, remap after
 * unmap (unmap_us: the sleep itself), the raw work on a fresh receive each time. Optional arguments "N:M"
 * select cases and -r REPS changes the repetitions (e.g. to profile one case).
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

#define REPS_DEFAULT 9
#define REPS_MAX 1000

static int reps = REPS_DEFAULT;

/* reps is checked to be 1..REPS_MAX in main(); unsigned tells the compiler so. */
static double *new_samples(void)
{
	return calloc((unsigned)reps, sizeof(double));
}

struct stat3 {
	double med, min, max;
};

static int dcmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static struct stat3 summarize(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), dcmp);
	struct stat3 s = {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v[0], v[n - 1]};
	return s;
}

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
	for (int r = 0; r < reps; r++)
		check(gf_frame_send(s->sock, body, sizeof(body), s->fds, s->n, INT64_MAX), "raw send");
	return NULL;
}

/* The physical baseline: receive N fds and mmap each read-only into one reservation. */
static struct stat3 raw_us(size_t n, size_t gran)
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
	double *t = new_samples();
	for (int r = 0; r < reps; r++) {
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
		t[r] = (double)(gf_now_us() - t0);
		free(got);
		/* back to a bare reservation, as unmap() leaves it */
		mmap(base, n * gran, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	}
	pthread_join(th, NULL);
	gf_frame_reader_clear(&rd);
	munmap(base, n * gran);
	gf_close_fds(fds, n);
	free(fds);
	close(sv[0]);
	close(sv[1]);
	struct stat3 st = summarize(t, reps);
	free(t);
	return st;
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

	double *tm = new_samples(), *tr = new_samples(), *tf = new_samples();
	uint64_t map_all_rt = 0, remap_rt = 0, released_rt = 0;
	gf_gms *r;
	for (int k = 0; k < reps; k++) {
		check(gf_gms_connect(&r, srv.uri, mem, GF_GMS_RO, 5000), "connect RO");
		uint64_t rt0 = gf_gms_round_trips(r);
		int64_t t0 = gf_now_us();
		check(gf_gms_map_all(r), "map_all");
		tm[k] = (double)(gf_now_us() - t0);
		map_all_rt = gf_gms_round_trips(r) - rt0 + 1; /* + the connect */
		if (k + 1 < reps)
			gf_gms_free(r);
	}
	double *tu = new_samples();
	for (int k = 0; k < reps; k++) {
		int64_t t0 = gf_now_us();
		check(gf_gms_unmap(r), "unmap");
		tu[k] = (double)(gf_now_us() - t0);
		uint64_t before = gf_gms_round_trips(r);
		t0 = gf_now_us();
		check(gf_gms_remap(r, 5000), "remap");
		tr[k] = (double)(gf_now_us() - t0);
		remap_rt = gf_gms_round_trips(r) - before;
	}
	check(gf_gms_set_keep_handles(r, 0), "keep_handles");
	for (int k = 0; k < reps; k++) {
		check(gf_gms_unmap(r), "unmap");
		uint64_t before = gf_gms_round_trips(r);
		int64_t t0 = gf_now_us();
		check(gf_gms_remap(r, 5000), "remap");
		tf[k] = (double)(gf_now_us() - t0);
		released_rt = gf_gms_round_trips(r) - before;
	}
	gf_gms_free(r);
	gt_stop(&srv);
	struct stat3 raw = raw_us(n, gran), rm = summarize(tr, reps), ma = summarize(tm, reps), um = summarize(tu, reps),
		     rf = summarize(tf, reps);
	free(tm);
	free(tr);
	free(tf);
	free(tu);
	size_t frames = (n + GF_LIMIT_CHUNK_ALLOCS_WITH_META - 1) / GF_LIMIT_CHUNK_ALLOCS_WITH_META > (m + 31) / 32
				? (n + GF_LIMIT_CHUNK_ALLOCS_WITH_META - 1) / GF_LIMIT_CHUNK_ALLOCS_WITH_META
				: (m + 31) / 32;
	printf("{\"bench\":\"gms_remap\",\"allocations\":%zu,\"metadata\":%zu,\"granularity\":%zu,"
	       "\"remap_round_trips\":%llu,\"map_all_round_trips\":%llu,\"map_all_reply_chunks\":%zu,"
	       "\"remap_us\":%.1f,\"map_all_us\":%.1f,\"raw_fd_recv_mmap_us\":%.1f,\"remap_vs_raw\":%.2f,"
	       "\"reps\":%d,\"remap_min_us\":%.1f,\"remap_max_us\":%.1f,\"map_all_min_us\":%.1f,"
	       "\"map_all_max_us\":%.1f,\"raw_min_us\":%.1f,\"raw_max_us\":%.1f,\"unmap_us\":%.1f,"
	       "\"remap_released_us\":%.1f,\"remap_released_vs_raw\":%.2f,\"remap_released_round_trips\":%llu}\n",
	       n, m, gran, (unsigned long long)remap_rt, (unsigned long long)map_all_rt, frames ? frames : 1, rm.med,
	       ma.med, raw.med, raw.med > 0 ? rm.med / raw.med : 0.0, reps, rm.min, rm.max, ma.min, ma.max, raw.min,
	       raw.max, um.med, rf.med, raw.med > 0 ? rf.med / raw.med : 0.0, (unsigned long long)released_rt);
	fflush(stdout);
	/* map_all: connect + one bulk list; remap over the kept session: one
	 * GmsConnect that brings the list, whatever N and M */
	return remap_rt == 1 && released_rt == 1 && map_all_rt == 2 ? 0 : 1;
}

int main(int argc, char **argv)
{
	size_t sel[16][2], nsel = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-r") && i + 1 < argc) {
			reps = atoi(argv[++i]);
			if (reps < 1 || reps > REPS_MAX) {
				fprintf(stderr, "bench_gms: -r takes 1..%d\n", REPS_MAX);
				return 2;
			}
		} else if (nsel < 16 && sscanf(argv[i], "%zu:%zu", &sel[nsel][0], &sel[nsel][1]) == 2 &&
			   sel[nsel][0] > 0) {
			nsel++;
		} else {
			fprintf(stderr, "usage: bench-gms [-r REPS] [N:M ...]\n");
			return 2;
		}
	}
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = rl.rlim_max; /* 1000 allocations: server, client and baseline each hold N fds */
	setrlimit(RLIMIT_NOFILE, &rl);
	char *dir = tu_tmpdir();
	gf_mem *mem;
	check(gf_mem_open(&mem, GF_MEM_HOST, 0), "mem_open");
	static const size_t cases[][2] = {{1, 0}, {10, 100}, {100, 1000}, {1000, 10000}};
	int bad = 0;
	if (nsel)
		for (size_t i = 0; i < nsel; i++)
			bad |= run_case(dir, mem, sel[i][0], sel[i][1]);
	else
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
			bad |= run_case(dir, mem, cases[i][0], cases[i][1]);
	gf_mem_free(mem);
	gt_rmtree(dir);
	free(dir);
	if (bad)
		fprintf(stderr, "bench_gms: round trips grew with N or M\n");
	return bad;
}
