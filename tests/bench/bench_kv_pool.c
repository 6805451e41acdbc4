/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The KV memory of a wake on the host backend, two ways in the same run and
 * of the same size, in paired rounds (order alternating):
 *  - pool: the GMS's KV pool (docs/gms.md, "The KV pool"): gf_gms_kv_map()
 *    (one round trip; the GMS asks the lock server), then the pool's memfd
 *    mapped over the reserved region (gf_mem_region_back_fd()) and its page
 *    tables filled for writing: the pages exist, nothing is zeroed;
 *  - fresh: the engine's own memory (gf_mem_region_back()) with its page
 *    tables filled for writing: the kernel zero-fills every page.
 * Both end with the whole region writable without a page fault, which is
 * what a KV cache needs before its first step. A real gf-lockd and gf-gmsd
 * in threads of this process. Prints a table, then one JSON line.
 * Reports; asserts no speed. Usage: bench-kv-pool [MiB [rounds]].
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gpufailover.h"

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

static double median_us(const int64_t *in, int n)
{
	int64_t v[64];
	memcpy(v, in, (size_t)n * sizeof(*v));
	qsort(v, (size_t)n, sizeof(*v), cmp_i64);
	return (n % 2 ? (double)v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0) / 1000.0;
}

/* Page tables filled for writing: one call where the kernel can, else a touch per page (keeping the bytes). */
static void populate(uint8_t *p, size_t size)
{
#ifdef MADV_POPULATE_WRITE
	if (madvise(p, size, MADV_POPULATE_WRITE) == 0)
		return;
#endif
	long page = sysconf(_SC_PAGESIZE);
	for (size_t i = 0; i < size; i += (size_t)page)
		((volatile uint8_t *)p)[i] = ((volatile uint8_t *)p)[i];
}

static void *run_lockd(void *d)
{
	gf_lockd_run(d);
	return NULL;
}

static void *run_gmsd(void *d)
{
	gf_gmsd_run(d);
	return NULL;
}

static int die(const char *what)
{
	fprintf(stderr, "bench_kv_pool: %s: %s\n", what, gf_error_detail());
	return 1;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 1024;
	int rounds = argc > 2 ? atoi(argv[2]) : 7;
	if (mib == 0 || rounds < 1 || rounds > 64) {
		fprintf(stderr, "usage: %s [MiB [rounds 1..64]]\n", argv[0]);
		return 2;
	}
	size_t size = mib << 20;
	char dir[] = "/tmp/gf-bench-kv-XXXXXX";
	if (!mkdtemp(dir))
		return 1;
	char lock_uri[300], gms_uri[300];
	snprintf(lock_uri, sizeof(lock_uri), "unix://%s/lock.sock", dir);
	snprintf(gms_uri, sizeof(gms_uri), "unix://%s/gms.sock", dir);
	gf_lockd *ld;
	gf_gmsd *gd;
	pthread_t lt, gt;
	if (gf_lockd_new(&ld) || gf_lockd_add_listen(ld, lock_uri) || gf_lockd_start(ld))
		return die("lock server");
	pthread_create(&lt, NULL, run_lockd, ld);
	if (gf_gmsd_new(&gd) || gf_gmsd_add_listen(gd, gms_uri) || gf_gmsd_set_backend(gd, GF_MEM_HOST) ||
	    gf_gmsd_set_lock(gd, lock_uri, NULL, 0) || gf_gmsd_start(gd))
		return die("GMS");
	pthread_create(&gt, NULL, run_gmsd, gd);

	gf_mem *mem;
	gf_gms *g;
	gf_lock *lock;
	struct gf_lock_grant grant;
	struct gf_lock_proof proof;
	uint64_t id;
	if (gf_mem_open(&mem, GF_MEM_HOST, 0))
		return die("memory");
	/* Weights committed first, so the KV client connects as a reader, as an engine does. */
	if (gf_gms_connect(&g, gms_uri, mem, GF_GMS_RW, 5000, NULL) || gf_gms_allocate(g, 4096, "w", &id) ||
	    gf_gms_commit(g, NULL))
		return die("weights");
	if (gf_lock_new(&lock, lock_uri, "bench") || gf_lock_acquire(lock, 5000, &grant) ||
	    gf_lock_grant_proof(&grant, &proof))
		return die("lock");
	gf_mem_region *pool_r, *fresh_r;
	if (gf_mem_region_reserve(&pool_r, mem, size) || gf_mem_region_reserve(&fresh_r, mem, size))
		return die("reserve");
	const uint8_t layout[16] = { 1 };
	/* The first holder: creates the pool and writes all of it once, as a serving engine fills its cache. */
	int fd;
	if (gf_gms_kv_map(g, &proof, gf_mem_region_size(pool_r), 1 << 20, layout, 0, &fd, NULL) ||
	    gf_mem_region_back_fd(pool_r, fd))
		return die("first map");
	close(fd);
	memset((void *)(uintptr_t)gf_mem_region_addr(pool_r), 0x5a, size);
	gf_mem_region_release(pool_r);

	int64_t pool_ns[64], fresh_ns[64], map_ns[64];
	printf("%-6s %12s %12s %12s\n", "round", "pool_us", "kv_map_us", "fresh_us");
	for (int r = 0; r < rounds; r++) {
		for (int k = 0; k < 2; k++) {
			bool pool = (k == 0) == (r % 2 == 0);
			int64_t t0 = now_ns();
			if (pool) {
				if (gf_gms_kv_map(g, &proof, gf_mem_region_size(pool_r), 1 << 20, layout, 0, &fd, NULL))
					return die("map");
				map_ns[r] = now_ns() - t0;
				if (gf_mem_region_back_fd(pool_r, fd))
					return die("back_fd");
				close(fd);
				populate((uint8_t *)(uintptr_t)gf_mem_region_addr(pool_r), size);
				pool_ns[r] = now_ns() - t0;
				if (((volatile uint8_t *)(uintptr_t)gf_mem_region_addr(pool_r))[size - 1] != 0x5a)
					return die("the pool lost its content");
				gf_mem_region_release(pool_r);
			} else {
				if (gf_mem_region_back(fresh_r))
					return die("back");
				populate((uint8_t *)(uintptr_t)gf_mem_region_addr(fresh_r), size);
				fresh_ns[r] = now_ns() - t0;
				gf_mem_region_release(fresh_r);
			}
		}
		printf("%-6d %12.0f %12.0f %12.0f\n", r, pool_ns[r] / 1e3, map_ns[r] / 1e3, fresh_ns[r] / 1e3);
	}
	double pool_med = median_us(pool_ns, rounds), fresh_med = median_us(fresh_ns, rounds),
	       map_med = median_us(map_ns, rounds);
	/* The ratio is the median of the per-round ratios: each pair saw the same load. */
	int64_t ratios[64];
	for (int r = 0; r < rounds; r++)
		ratios[r] = (int64_t)(1e6 * (double)pool_ns[r] / (double)fresh_ns[r]);
	double ratio = median_us(ratios, rounds) / 1e3;
	printf("{\"bench\":\"kv_pool_wake\",\"backend\":\"host\",\"bytes\":%zu,\"rounds\":%d,\"pool_median_us\":%.1f,"
	       "\"kv_map_median_us\":%.1f,\"fresh_median_us\":%.1f,\"ratio\":%.4f}\n",
	       size, rounds, pool_med, map_med, fresh_med, ratio);
	gf_mem_region_free(pool_r);
	gf_mem_region_free(fresh_r);
	gf_gms_free(g);
	gf_lock_free(lock);
	gf_gmsd_stop(gd);
	pthread_join(gt, NULL);
	gf_gmsd_free(gd);
	gf_lockd_stop(ld);
	pthread_join(lt, NULL);
	gf_lockd_free(ld);
	gf_mem_free(mem);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_kv_pool: could not remove %s\n", dir);
	return 0;
}
