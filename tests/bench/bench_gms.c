/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GMS first map and wake benchmark (host backend, in-process server thread).
 *
 * For N allocations of S bytes and M metadata entries, each round times the
 * library and, in the same round, the raw work that reaches the same state:
 *
 *   map_all_us        gf_gms_map_all() with a fresh RO client (allocation
 *                     list, metadata, fds): mapped, page tables empty, like
 *   raw_us            the same N fds asked for and received over a unix
 *                     socket (one request byte, then gf_frame_send/recv,
 *                     253 per frame: one round trip, as the library's wake
 *                     makes) and mmapped read-only at fixed offsets of one
 *                     reservation.
 *   remap_us          the default wake (handles kept while asleep): page
 *                     tables ready to serve, no fault on first use, like
 *   raw_populated_us  raw_us plus MADV_POPULATE_READ of every mapping.
 *   remap_released_us the wake after gf_gms_set_keep_handles(0), then
 *                     gf_gms_prefault(): the list and every fd come over
 *                     the kept session, then the page tables are filled;
 *                     compared with raw_populated_us.
 *
 * The allocations' pages exist on both sides before any round (the writer
 * and the raw side fill them), so no side pays for allocating memory. The
 * raw sender thread answers each request at once from fds it holds ready,
 * so the raw figure holds the round trip and little sender-side work: a
 * lower bound. The raw side runs before the library in even rounds and
 * after it in odd ones.
 *
 * Per figure the JSON line has the median over the rounds and, per ratio,
 * the median of the per-round ratios (library / raw of the same round) with
 * their min and max: on a shared machine one slow round moves both sides of
 * a pair less than it moves two medians taken apart. Round trips must stay
 * 2 for map_all (connect + one bulk list) and 1 for a wake whatever N and M
 * are; the program fails otherwise.
 *
 * usage: bench-gms [-r ROUNDS] [N:M[:KIB] ...]  (default 9 rounds; KIB is
 * the allocation size in KiB, default the granularity). Without cases: the
 * small cases (4 KiB allocations) and 1 GiB in 256 x 4 MiB and 16 x 64 MiB.
 */
#include <fcntl.h>
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
#include "xfer.h"

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

/* Median, min and max of @v (sorted in place). */
static struct stat3 summarize(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), dcmp);
	struct stat3 s = {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v[0], v[n - 1]};
	return s;
}

/* The per-round ratios @a[k] / @b[k], summarized. */
static struct stat3 paired(const double *a, const double *b, int n)
{
	double *q = new_samples();
	for (int k = 0; k < n; k++)
		q[k] = b[k] > 0 ? a[k] / b[k] : 0;
	struct stat3 s = summarize(q, n);
	free(q);
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

/* The raw side: N memfds sent by a thread, received and mapped by the bench. */
struct raw {
	int sv[2];
	int *fds;
	size_t n, size;
	int frames; /* how many times the thread sends the N fds */
	pthread_t th;
	uint8_t *base;
	struct gf_frame_reader rd;
};

static void *raw_send(void *arg)
{
	struct raw *s = arg;
	uint8_t body[1] = {0};
	for (int r = 0; r < s->frames; r++) {
		char req;
		if (read(s->sv[0], &req, 1) != 1) /* the receiver asks, as a wake asks the GMS */
			exit(1);
		check(gf_frame_send(s->sv[0], body, sizeof(body), s->fds, s->n, INT64_MAX), "raw send");
	}
	return NULL;
}

static void raw_open(struct raw *s, size_t n, size_t size, int frames)
{
	*s = (struct raw){.n = n, .size = size, .frames = frames};
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s->sv) < 0)
		exit(1);
	s->fds = calloc(n, sizeof(int));
	for (size_t i = 0; i < n; i++) {
		s->fds[i] = memfd_create("raw", MFD_CLOEXEC);
		/* pages allocated now, as the GMS's are (the writer filled them) */
		if (s->fds[i] < 0 || ftruncate(s->fds[i], (off_t)size) < 0 || fallocate(s->fds[i], 0, 0, (off_t)size) < 0)
			exit(1);
	}
	s->base = mmap(NULL, n * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (s->base == MAP_FAILED)
		exit(1);
	gf_frame_reader_init(&s->rd, n);
	pthread_create(&s->th, NULL, raw_send, s);
}

/* One raw receive: the fds, mmapped read-only, and with @populate the page tables filled. */
static double raw_once(struct raw *s, bool populate)
{
	int64_t t0 = gf_now_us();
	char req = 'r';
	if (write(s->sv[1], &req, 1) != 1)
		exit(1);
	check(gf_frame_recv(&s->rd, s->sv[1], INT64_MAX), "raw recv");
	int *got;
	size_t ng;
	gf_frame_reader_take_fds(&s->rd, &got, &ng);
	for (size_t i = 0; i < ng; i++) {
		uint8_t *at = s->base + i * s->size;
		if (mmap(at, s->size, PROT_READ, MAP_SHARED | MAP_FIXED, got[i], 0) == MAP_FAILED)
			exit(1);
		close(got[i]);
		if (populate)
			gf_mem_populate((uint64_t)(uintptr_t)at, s->size, false);
	}
	double us = (double)(gf_now_us() - t0);
	free(got);
	/* back to a bare reservation, as unmap() leaves it */
	mmap(s->base, s->n * s->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	return us;
}

static void raw_close(struct raw *s)
{
	pthread_join(s->th, NULL);
	gf_frame_reader_clear(&s->rd);
	munmap(s->base, s->n * s->size);
	gf_close_fds(s->fds, s->n);
	free(s->fds);
	close(s->sv[0]);
	close(s->sv[1]);
}

static int run_case(const char *dir, gf_mem *mem, size_t n, size_t m, size_t size)
{
	struct gt_server srv;
	char name[64];
	snprintf(name, sizeof(name), "bench-%zu-%zu", n, m);
	check(gt_start(&srv, dir, name, 0), "start server");
	size_t gran, rec;
	check(gf_mem_granularity(mem, &gran, &rec), "granularity");
	size = size ? (size + gran - 1) / gran * gran : gran;

	gf_gms *w;
	check(gf_gms_connect(&w, srv.uri, mem, GF_GMS_RW, 5000, NULL), "connect RW");
	for (size_t i = 0; i < n; i++) {
		struct gf_gms_alloc_info ai;
		check(gf_gms_allocate(w, size, "t", NULL), "allocate");
		check(gf_gms_alloc_at(w, i, &ai), "alloc_at");
		memset((void *)(uintptr_t)ai.addr, (int)(i & 0xff), size);
	}
	char value[64];
	memset(value, 'v', sizeof(value));
	for (size_t k = 0; k < m; k++) {
		char key[96];
		snprintf(key, sizeof(key), "model.layers.%zu.mlp.weight", k);
		check(gf_gms_put_meta(w, key, 1 + k % n, 0, value, sizeof(value)), "put_meta");
	}
	check(gf_gms_commit(w, NULL), "commit");
	gf_gms_free(w); /* the layout stays COMMITTED */

	struct raw raw;
	raw_open(&raw, n, size, 2 * reps);
	double *tm = new_samples(), *tr = new_samples(), *tf = new_samples(), *tu = new_samples(),
	       *traw = new_samples(), *tpop = new_samples();
	uint64_t map_all_rt = 0, remap_rt = 0, released_rt = 0;
	for (int k = 0; k < reps; k++) {
		if (k % 2 == 0) {
			traw[k] = raw_once(&raw, false);
			tpop[k] = raw_once(&raw, true);
		}
		gf_gms *r;
		check(gf_gms_connect(&r, srv.uri, mem, GF_GMS_RO, 5000, NULL), "connect RO");
		uint64_t rt0 = gf_gms_round_trips(r);
		int64_t t0 = gf_now_us();
		check(gf_gms_map_all(r), "map_all");
		tm[k] = (double)(gf_now_us() - t0);
		map_all_rt = gf_gms_round_trips(r) - rt0 + 1; /* + the connect */

		t0 = gf_now_us();
		check(gf_gms_unmap(r), "unmap");
		tu[k] = (double)(gf_now_us() - t0);
		uint64_t before = gf_gms_round_trips(r);
		t0 = gf_now_us();
		check(gf_gms_remap(r, 5000), "remap");
		tr[k] = (double)(gf_now_us() - t0);
		remap_rt = gf_gms_round_trips(r) - before;

		check(gf_gms_set_keep_handles(r, 0), "keep_handles");
		check(gf_gms_unmap(r), "unmap");
		before = gf_gms_round_trips(r);
		t0 = gf_now_us();
		check(gf_gms_remap(r, 5000), "remap");
		check(gf_gms_prefault(r), "prefault");
		tf[k] = (double)(gf_now_us() - t0);
		released_rt = gf_gms_round_trips(r) - before;
		gf_gms_free(r);
		if (k % 2) {
			traw[k] = raw_once(&raw, false);
			tpop[k] = raw_once(&raw, true);
		}
	}
	raw_close(&raw);
	gt_stop(&srv);
	struct stat3 pm = paired(tm, traw, reps), pr = paired(tr, tpop, reps), pf = paired(tf, tpop, reps);
	struct stat3 ma = summarize(tm, reps), rm = summarize(tr, reps), rf = summarize(tf, reps),
		     um = summarize(tu, reps), rw = summarize(traw, reps), rp = summarize(tpop, reps);
	free(tm);
	free(tr);
	free(tf);
	free(tu);
	free(traw);
	free(tpop);
	printf("{\"bench\":\"gms_remap\",\"allocations\":%zu,\"metadata\":%zu,\"alloc_bytes\":%zu,\"granularity\":%zu,"
	       "\"rounds\":%d,\"map_all_round_trips\":%llu,\"remap_round_trips\":%llu,"
	       "\"remap_released_round_trips\":%llu,"
	       "\"map_all_us\":%.1f,\"raw_us\":%.1f,\"map_all_vs_raw\":%.3f,\"map_all_vs_raw_min\":%.3f,"
	       "\"map_all_vs_raw_max\":%.3f,"
	       "\"remap_us\":%.1f,\"raw_populated_us\":%.1f,\"remap_vs_raw\":%.3f,\"remap_vs_raw_min\":%.3f,"
	       "\"remap_vs_raw_max\":%.3f,"
	       "\"remap_released_us\":%.1f,\"remap_released_vs_raw\":%.3f,\"remap_released_vs_raw_min\":%.3f,"
	       "\"remap_released_vs_raw_max\":%.3f,"
	       "\"unmap_us\":%.1f,\"map_all_min_us\":%.1f,\"map_all_max_us\":%.1f,\"remap_min_us\":%.1f,"
	       "\"remap_max_us\":%.1f,\"raw_min_us\":%.1f,\"raw_max_us\":%.1f}\n",
	       n, m, size, gran, reps, (unsigned long long)map_all_rt, (unsigned long long)remap_rt,
	       (unsigned long long)released_rt, ma.med, rw.med, pm.med, pm.min, pm.max, rm.med, rp.med, pr.med, pr.min,
	       pr.max, rf.med, pf.med, pf.min, pf.max, um.med, ma.min, ma.max, rm.min, rm.max, rw.min, rw.max);
	fflush(stdout);
	/* map_all: connect + one bulk list; remap over the kept session: one
	 * GmsConnect that brings the list, whatever N and M */
	return remap_rt == 1 && released_rt == 1 && map_all_rt == 2 ? 0 : 1;
}

int main(int argc, char **argv)
{
	size_t sel[16][3], nsel = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-r") && i + 1 < argc) {
			reps = atoi(argv[++i]);
			if (reps < 1 || reps > REPS_MAX) {
				fprintf(stderr, "bench_gms: -r takes 1..%d\n", REPS_MAX);
				return 2;
			}
			continue;
		}
		size_t kib = 0;
		int got = nsel < 16 ? sscanf(argv[i], "%zu:%zu:%zu", &sel[nsel][0], &sel[nsel][1], &kib) : 0;
		if (got < 2 || sel[nsel][0] == 0) {
			fprintf(stderr, "usage: bench-gms [-r ROUNDS] [N:M[:KIB] ...]\n");
			return 2;
		}
		sel[nsel++][2] = kib << 10;
	}
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = rl.rlim_max; /* 1000 allocations: server, client and baseline each hold N fds */
	setrlimit(RLIMIT_NOFILE, &rl);
	char *dir = tu_tmpdir();
	gf_mem *mem;
	check(gf_mem_open(&mem, GF_MEM_HOST, 0), "mem_open");
	/* small allocations (one granule), then 1 GiB of weights at real shapes */
	static const size_t cases[][3] = {{1, 0, 0},       {10, 100, 0},		  {100, 1000, 0},
					  {1000, 10000, 0}, {256, 1000, 4u << 20}, {16, 1000, 64u << 20}};
	int bad = 0;
	if (nsel)
		for (size_t i = 0; i < nsel; i++)
			bad |= run_case(dir, mem, sel[i][0], sel[i][1], sel[i][2]);
	else
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
			bad |= run_case(dir, mem, cases[i][0], cases[i][1], cases[i][2]);
	gf_mem_free(mem);
	gt_rmtree(dir);
	free(dir);
	if (bad)
		fprintf(stderr, "bench_gms: round trips grew with N or M\n");
	return bad;
}
