/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Import + map of N allocations on the host backend, against the raw system
 * calls that work amounts to (dup + fstat per fd, one PROT_NONE reservation,
 * one MAP_FIXED mmap per allocation), measured in the same run on the same
 * fds. Prints a table, then one JSON line. Reports; asserts no speed.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "gpufailover.h"

/* Nanoseconds: one import + map is a few microseconds. */
static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static double median_us(int64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_i64);
	return (n % 2 ? (double)v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0) / 1000.0;
}

/* The library: import every fd, reserve, map all in one call. */
static int64_t run_lib(gf_mem *m, const int *fds, int n, size_t size)
{
	gf_mem_alloc **a = calloc((size_t)n, sizeof(*a));
	struct gf_mem_mapping *maps = calloc((size_t)n, sizeof(*maps));
	gf_mem_va *va = NULL;
	if (!a || !maps)
		return -1;
	int64_t t0 = now_ns();
	for (int i = 0; i < n; i++) {
		if (gf_mem_import(&a[i], m, fds[i], size) < 0)
			return -1;
		maps[i] = (struct gf_mem_mapping){ (size_t)i * size, a[i] };
	}
	if (gf_mem_reserve(&va, m, (size_t)n * size, 0) < 0 || gf_mem_map_many(va, maps, (size_t)n, GF_MEM_READ) < 0)
		return -1;
	int64_t dt = now_ns() - t0;
	gf_mem_va_free(va);
	for (int i = 0; i < n; i++)
		gf_mem_alloc_free(a[i]);
	free(a);
	free(maps);
	return dt;
}

/* The same work as bare system calls. */
static int64_t run_raw(const int *fds, int n, size_t size)
{
	int *own = calloc((size_t)n, sizeof(*own));
	if (!own)
		return -1;
	int64_t t0 = now_ns();
	for (int i = 0; i < n; i++) {
		struct stat st;
		own[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
		if (own[i] < 0 || fstat(own[i], &st) < 0 || (size_t)st.st_size != size)
			return -1;
	}
	uint8_t *base = mmap(NULL, (size_t)n * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		return -1;
	for (int i = 0; i < n; i++)
		if (mmap(base + (size_t)i * size, size, PROT_READ, MAP_FIXED | MAP_SHARED, own[i], 0) == MAP_FAILED)
			return -1;
	int64_t dt = now_ns() - t0;
	munmap(base, (size_t)n * size);
	for (int i = 0; i < n; i++)
		close(own[i]);
	free(own);
	return dt;
}

int main(void)
{
	static const int ns[] = { 1, 16, 256, 1000 };
	enum { NN = sizeof(ns) / sizeof(ns[0]) };
	double lib_med[NN], raw_med[NN];
	int reps_used[NN];
	struct rlimit rl;
	/* N=1000 holds ~2000 fds at once (exported + imported). */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	gf_mem *m = NULL;
	if (gf_mem_open(&m, GF_MEM_HOST, 0) < 0) {
		fprintf(stderr, "bench_mem: gf_mem_open(host): %s\n", gf_error_detail());
		return 1;
	}
	size_t size;
	gf_mem_granularity(m, &size, NULL);
	printf("%-6s %-6s %14s %14s %8s\n", "N", "reps", "lib_median_us", "raw_median_us", "ratio");
	for (int k = 0; k < NN; k++) {
		int n = ns[k], reps = n >= 256 ? 21 : 201;
		int *fds = calloc((size_t)n, sizeof(*fds));
		int64_t *tl = calloc((size_t)reps, sizeof(*tl)), *tr = calloc((size_t)reps, sizeof(*tr));
		if (!fds || !tl || !tr)
			return 1;
		for (int i = 0; i < n; i++) {
			gf_mem_alloc *a;
			if (gf_mem_create(&a, m, size) < 0 || gf_mem_export(a, &fds[i]) < 0) {
				fprintf(stderr, "bench_mem: create/export %d: %s\n", i, gf_error_detail());
				return 1;
			}
			gf_mem_alloc_free(a); /* the exported fd keeps the memfd */
		}
		/* Interleaved so drift (frequency, other load) hits both alike. */
		for (int r = 0; r < reps; r++) {
			tl[r] = run_lib(m, fds, n, size);
			tr[r] = run_raw(fds, n, size);
			if (tl[r] < 0 || tr[r] < 0) {
				fprintf(stderr, "bench_mem: N=%d failed: %s\n", n, gf_error_detail());
				return 1;
			}
		}
		lib_med[k] = median_us(tl, reps);
		raw_med[k] = median_us(tr, reps);
		reps_used[k] = reps;
		printf("%-6d %-6d %14.2f %14.2f %8.2f\n", n, reps, lib_med[k], raw_med[k],
		       raw_med[k] > 0 ? lib_med[k] / raw_med[k] : 0.0);
		for (int i = 0; i < n; i++)
			close(fds[i]);
		free(fds);
		free(tl);
		free(tr);
	}
	printf("{\"bench\":\"mem_import_map\",\"backend\":\"host\",\"alloc_bytes\":%zu,\"results\":[", size);
	for (int k = 0; k < NN; k++)
		printf("%s{\"n\":%d,\"reps\":%d,\"lib_median_us\":%.2f,\"raw_median_us\":%.2f,\"ratio\":%.3f}",
		       k ? "," : "", ns[k], reps_used[k], lib_med[k], raw_med[k],
		       raw_med[k] > 0 ? lib_med[k] / raw_med[k] : 0.0);
	printf("]}\n");
	gf_mem_free(m);
	return 0;
}
