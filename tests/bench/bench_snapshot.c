/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Snapshot and restore throughput on the host backend, per tier directory,
 * against a plain sequential copy of the same bytes to the same place in the
 * same run: a write loop from the same mapped memory into a file beside the
 * snapshot plus fsync (what a snapshot must at least do), and a read loop of
 * that file into a fresh memfd (what a restore must at least do: the host
 * backend's allocations are memfds). Each timed copy starts from the same
 * state (sync, then half a second for the disk), and neither side's figure
 * includes freeing its previous copy. Both reads start with the file out of
 * the page cache (where the file system has one to drop: on tmpfs, WARM,
 * the file is the memory), as a COLD restore after a reboot or on another
 * node reads it from the disk. Every round's times are in the JSON
 * line too: on a virtual disk they can swing several-fold between rounds.
 *
 * usage: bench-snapshot [TOTAL_MIB [NALLOCS [ROUNDS [DIR...]]]]
 *   defaults: 1024 MiB in 256 allocations, 3 rounds, WARM=/dev/shm and
 *   COLD=$TMPDIR (or /tmp). Prints a table, then one JSON line per directory.
 *   Reports; asserts no speed.
 */
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "gpufailover.h"
#include "snapshot.h"
#include "xfer.h"

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static int64_t median(int64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_i64);
	return v[n / 2];
}

static double gbps(uint64_t bytes, int64_t us)
{
	return us > 0 ? (double)bytes / 1e3 / (double)us : 0;
}

static void die(const char *what, int rc)
{
	fprintf(stderr, "bench-snapshot: %s: %s: %s\n", what, gf_error_name(rc), gf_error_detail());
	exit(1);
}

/* No dirty pages, and a moment for the disk to finish what the last copy
 * (and its deletions) queued, so each timed copy starts from the same state. */
/*
 * Memory the copy about to be timed will get in the state the one compared
 * with it got: touched and freed just before. In a VM that gives free memory
 * back to the host (free page reporting, as here), memory left free for a
 * while comes back only through the hypervisor's page faults, which cost
 * several times the copy itself and would land on whichever side ran after
 * the longer pause.
 */
static size_t prime_bytes;

static void prime(void)
{
	if (!prime_bytes)
		return;
	uint8_t *q = mmap(NULL, prime_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (q == MAP_FAILED)
		return;
	gf_mem_populate((uint64_t)(uintptr_t)q, prime_bytes, true);
	for (size_t i = 0; i < prime_bytes; i += 4096)
		q[i] = 1; /* where MADV_POPULATE_WRITE is missing */
	munmap(q, prime_bytes);
}

static void settle(void)
{
	sync();
	usleep(500000);
	prime();
}

/* Baseline write: the mapped bytes into a new file with a plain write loop,
 * then fsync. Like the snapshot's figure, it excludes freeing the previous
 * copy (unlinked before the clock starts). */
static int64_t plain_write(const char *path, const uint8_t *p, size_t n)
{
	unlink(path);
	settle();
	int64_t t0 = gf_now_us();
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	for (size_t off = 0; off < n;) {
		size_t c = n - off < GF_MEM_XFER_CHUNK ? n - off : GF_MEM_XFER_CHUNK;
		ssize_t w = write(fd, p + off, c);
		if (w <= 0) {
			close(fd);
			return -1;
		}
		off += (size_t)w;
	}
	fsync(fd);
	close(fd);
	return gf_now_us() - t0;
}

/* Drops @path's pages from the page cache (written back first). Not on
 * tmpfs, where they are the file. */
static void drop_cache(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct statfs sfs;
	if (fd < 0)
		return;
	if (fstatfs(fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC) {
		close(fd);
		return;
	}
	fdatasync(fd);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
}

/* Baseline read: that file with a plain read loop into fresh memory of the
 * kind a restore fills on this backend (one memfd, shared mapping). */
static int64_t plain_read(const char *path, size_t n)
{
	int64_t t0 = gf_now_us();
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int mfd = memfd_create("gf-bench-plain", MFD_CLOEXEC);
	if (fd < 0 || mfd < 0 || ftruncate(mfd, (off_t)n) < 0)
		return -1;
	uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	close(mfd);
	if (p == MAP_FAILED)
		return -1;
	for (size_t off = 0; off < n;) {
		size_t c = n - off < GF_MEM_XFER_CHUNK ? n - off : GF_MEM_XFER_CHUNK;
		ssize_t r = read(fd, p + off, c);
		if (r <= 0)
			break;
		off += (size_t)r;
	}
	close(fd);
	munmap(p, n);
	return gf_now_us() - t0;
}

int main(int argc, char **argv)
{
	size_t total = (size_t)(argc > 1 ? atol(argv[1]) : 1024) << 20;
	size_t nallocs = argc > 2 ? (size_t)atol(argv[2]) : 256;
	int rounds = argc > 3 ? atoi(argv[3]) : 3;
	const char *tmp = getenv("TMPDIR");
	const char *defaults[] = { "/dev/shm", tmp && *tmp ? tmp : "/tmp" };
	const char *const *dirs = argc > 4 ? (const char *const *)argv + 4 : defaults;
	int ndirs = argc > 4 ? argc - 4 : 2;
	if (!total || !nallocs || rounds < 1 || rounds > 99) {
		fprintf(stderr, "usage: %s [TOTAL_MIB [NALLOCS [ROUNDS [DIR...]]]]\n", argv[0]);
		return 2;
	}

	gf_mem *m;
	size_t g, rec;
	int rc = gf_mem_open(&m, GF_MEM_HOST, 0);
	if (rc < 0 || (rc = gf_mem_granularity(m, &g, &rec)) < 0)
		die("open host backend", rc);
	size_t each = (total / nallocs + g - 1) / g * g;
	struct gms_manifest *mf = gms_manifest_new();
	gf_mem_alloc **allocs = calloc(nallocs, sizeof(*allocs));
	struct gf_mem_mapping *maps = calloc(nallocs, sizeof(*maps));
	mf->allocs = calloc(nallocs, sizeof(*mf->allocs));
	mf->nallocs = nallocs;
	gf_mem_va *va;
	for (size_t i = 0; i < nallocs; i++) {
		if ((rc = gf_mem_create(&allocs[i], m, each)) < 0)
			die("create", rc);
		mf->allocs[i].id = i + 1;
		mf->allocs[i].size = each;
		snprintf(mf->allocs[i].tag, sizeof(mf->allocs[i].tag), "w%zu", i);
		maps[i] = (struct gf_mem_mapping){ .offset = i * each, .alloc = allocs[i] };
	}
	if ((rc = gf_mem_reserve(&va, m, each * nallocs, 0)) < 0 || (rc = gf_mem_map_many(va, maps, nallocs, GF_MEM_READWRITE)) < 0)
		die("map", rc);
	uint8_t *p = (uint8_t *)(uintptr_t)gf_mem_va_addr(va);
	size_t bytes = each * nallocs;
	/* Incompressible-looking bytes: nothing on the path may shortcut zeros. */
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; i + 8 <= bytes; i += 8) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
	gms_manifest_layout_hash(mf, mf->layout_hash);
	prime_bytes = bytes + bytes / 4; /* the copy plus its page cache and metadata */

	printf("%-24s %10s %12s %12s %12s %8s\n", "tier dir", "MiB", "op", "lib GB/s", "plain GB/s", "ratio");
	for (int d = 0; d < ndirs; d++) {
		char snap[1024], plain[1024];
		snprintf(snap, sizeof(snap), "%s/gf-bench-snapshot-%ld", dirs[d], (long)getpid());
		snprintf(plain, sizeof(plain), "%s/gf-bench-plain-%ld", dirs[d], (long)getpid());
		int64_t sw[99], pw[99], sr[99], pr[99];
		for (int r = 0; r < rounds; r++) {
			/* Alternate the order so neither side always gets the warmer cache,
			 * and start each timed copy with no dirty pages left by the one
			 * before (sync, untimed): on a disk, write-back of the previous
			 * gigabyte otherwise lands on whichever copy runs second. */
			struct gms_snap_stats st;
			if (r % 2)
				pw[r] = plain_write(plain, p, bytes);
			settle();
			if ((rc = gms_snapshot_write(snap, m, mf, allocs, &st)) < 0)
				die("snapshot", rc);
			sw[r] = st.elapsed_us;
			if (!(r % 2))
				pw[r] = plain_write(plain, p, bytes);
			settle();

			struct gms_manifest *back;
			gf_mem_alloc **got;
			char data[1100];
			snprintf(data, sizeof(data), "%s/%s", snap, GMS_SNAP_DATA);
			drop_cache(data);
			drop_cache(plain);
			prime();
			if (r % 2) {
				pr[r] = plain_read(plain, bytes);
				prime();
			}
			if ((rc = gms_snapshot_restore(snap, m, &back, &got, &st)) < 0)
				die("restore", rc);
			sr[r] = st.elapsed_us;
			gms_snapshot_restored_free(back, got);
			if (!(r % 2)) {
				prime();
				pr[r] = plain_read(plain, bytes);
			}
			if (pw[r] < 0 || pr[r] < 0) {
				fprintf(stderr, "bench-snapshot: plain copy in %s failed\n", dirs[d]);
				return 1;
			}
		}
		char per[4][99 * 12];
		const int64_t *series[4] = {sw, pw, sr, pr};
		for (int k = 0; k < 4; k++) {
			size_t at = 0;
			for (int r = 0; r < rounds; r++)
				at += (size_t)snprintf(per[k] + at, sizeof(per[k]) - at, "%s%lld", r ? "," : "", (long long)series[k][r]);
		}
		int64_t msw = median(sw, rounds), mpw = median(pw, rounds), msr = median(sr, rounds), mpr = median(pr, rounds);
		printf("%-24s %10zu %12s %12.2f %12.2f %8.2f\n", dirs[d], bytes >> 20, "snapshot", gbps(bytes, msw),
		       gbps(bytes, mpw), (double)mpw / (double)msw);
		printf("%-24s %10zu %12s %12.2f %12.2f %8.2f\n", dirs[d], bytes >> 20, "restore", gbps(bytes, msr),
		       gbps(bytes, mpr), (double)mpr / (double)msr);
		printf("{\"dir\": \"%s\", \"bytes\": %zu, \"allocations\": %zu, \"rounds\": %d, "
		       "\"snapshot_us\": %lld, \"plain_write_us\": %lld, \"restore_us\": %lld, \"plain_read_us\": %lld, "
		       "\"snapshot_gbps\": %.3f, \"plain_write_gbps\": %.3f, \"restore_gbps\": %.3f, \"plain_read_gbps\": %.3f, "
		       "\"snapshot_ratio\": %.3f, \"restore_ratio\": %.3f, \"snapshot_rounds_us\": [%s], "
		       "\"plain_write_rounds_us\": [%s], \"restore_rounds_us\": [%s], \"plain_read_rounds_us\": [%s]}\n",
		       dirs[d], bytes, nallocs, rounds, (long long)msw, (long long)mpw, (long long)msr, (long long)mpr,
		       gbps(bytes, msw), gbps(bytes, mpw), gbps(bytes, msr), gbps(bytes, mpr), (double)mpw / (double)msw,
		       (double)mpr / (double)msr, per[0], per[1], per[2], per[3]);
		fflush(stdout);
		char cmd[2200];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", snap, plain);
		if (system(cmd) != 0)
			fprintf(stderr, "bench-snapshot: could not remove %s\n", snap);
	}
	gf_mem_va_free(va);
	for (size_t i = 0; i < nallocs; i++)
		gf_mem_alloc_free(allocs[i]);
	free(allocs);
	free(maps);
	gms_manifest_free(mf);
	gf_mem_free(m);
	return 0;
}
