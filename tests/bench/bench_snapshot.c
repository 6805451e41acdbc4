/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Snapshot and restore throughput on the host backend, per tier directory,
 * against baselines that do the same work with the same primitive, in the
 * same run, paired per round:
 *
 *   snapshot   tiers_snapshot_write_from() of the allocations, from one
 *              read-only mapping of them whose page tables are filled, as
 *              the GMS's tier worker keeps it: writes data.bin with O_DIRECT
 *              on a disk (COLD) and through tmpfs (WARM), then fsync, while
 *              its helper thread hashes up to 8 chunks behind.
 *   copy       the same: a write loop from the same populated mapping in
 *              the same chunks, O_DIRECT where the snapshot uses it, fsync;
 *              no checksum.
 *   copy+hash  the copy, then XXH3 of every allocation (the library's
 *              hasher, waited for): "copy, then xxhsum".
 *   restore    tiers_snapshot_restore(): fresh allocations (memfds) filled
 *              from data.bin: its helper thread reads each 1 MiB piece and
 *              hashes it, the calling thread pwrites that same buffer.
 *   splice     the same file spliced into as many fresh memfds, no checksum.
 *   splice+hash  the splice, then XXH3 of each memfd through a fresh mapping.
 *
 * Each timed copy starts from the same state (sync, half a second for the
 * disk, memory primed); the reads start with data.bin out of the page cache
 * where the file system has one (COLD), as after a reboot. The three sides
 * run in an order that rotates every round. Ratios are throughput ratios
 * (baseline time / library time): the median of the per-round ratios with
 * their min and max, so a slow round moves both sides of its pair.
 * The read sides' CPU time (every thread, user + system, over the span
 * timed) is in the JSON too (restore_vs_splice_cpu: splice CPU / restore
 * CPU): what the verification costs, moved less by other load on the
 * machine than the wall clock is.
 *
 * usage: bench-snapshot [TOTAL_MIB [NALLOCS [ROUNDS [DIR...]]]]
 *   defaults: 1024 MiB in 256 allocations, 7 rounds, WARM=/dev/shm and
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
#include <sys/resource.h>
#include <unistd.h>

#include "common.h"
#include "gpufailover.h"
#include "hasher.h"
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

/* CPU time of every thread of this process so far (user + system), in µs:
 * what a side costs whatever else runs on the machine. */
static int64_t cpu_us(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) < 0)
		return 0;
	return (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
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

struct shape {
	gf_mem *m;
	gf_mem_alloc **allocs;
	size_t n, each;
};

/* A fresh read-only mapping of every allocation, back to back (as the snapshot makes its own). */
static gf_mem_va *map_fresh(const struct shape *sh)
{
	struct gf_mem_mapping *maps = calloc(sh->n, sizeof(*maps));
	gf_mem_va *va;
	int rc = gf_mem_reserve(&va, sh->m, sh->each * sh->n, 0);
	for (size_t i = 0; i < sh->n; i++)
		maps[i] = (struct gf_mem_mapping){.offset = i * sh->each, .alloc = sh->allocs[i]};
	if (rc < 0 || (rc = gf_mem_map_many(va, maps, sh->n, GF_MEM_READ)) < 0)
		die("map", rc);
	free(maps);
	return va;
}

/* Each allocation's XXH3 over @p, with the library's hasher (waited for). */
static void hash_each(struct tiers_hasher *h, const uint8_t *p, size_t n, size_t each)
{
	for (size_t i = 0; i < n; i++) {
		tiers_hasher_reset(h);
		for (size_t off = 0; off < each; off += GF_MEM_XFER_CHUNK)
			tiers_hasher_submit(h, p + i * each + off, each - off < GF_MEM_XFER_CHUNK ? each - off : GF_MEM_XFER_CHUNK);
		(void)tiers_hasher_digest(h);
	}
}

/* Baseline write: the populated mapping @p of the allocations into a new
 * file in the snapshot's chunks, O_DIRECT off tmpfs like the snapshot,
 * fsync; with @h, then every allocation hashed. Like the snapshot's figure
 * it excludes freeing the previous copy (unlinked before the clock starts). */
static int64_t plain_write(const char *path, const struct shape *sh, const uint8_t *p, struct tiers_hasher *h)
{
	unlink(path);
	settle();
	int64_t t0 = gf_now_us();
	size_t n = sh->n * sh->each;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	struct statfs sfs;
	if (fd < 0)
		return -1;
	if (fstatfs(fd, &sfs) == 0 && sfs.f_type != TMPFS_MAGIC)
		(void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_DIRECT);
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
	if (h)
		hash_each(h, p, sh->n, sh->each);
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

/* Baseline read: @path spliced into @sh->n fresh memfds of @sh->each bytes
 * (the restore's allocations on this backend) through a 1 MiB pipe, as the
 * restore does; with @h, then each memfd hashed through a fresh mapping.
 * Freeing the memfds is not timed (nor is it on the restore's side), and
 * its CPU time over the same span goes to *@cpu. */
static int64_t plain_read(const char *path, const struct shape *sh, struct tiers_hasher *h, int64_t *cpu)
{
	int *mfd = calloc(sh->n, sizeof(int));
	int pp[2];
	int64_t c0 = cpu_us();
	int64_t t0 = gf_now_us();
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || pipe2(pp, O_CLOEXEC) < 0)
		return -1;
	fcntl(pp[1], F_SETPIPE_SZ, 1 << 20);
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	loff_t in = 0;
	for (size_t i = 0; i < sh->n; i++) {
		mfd[i] = memfd_create("gf-bench-plain", MFD_CLOEXEC);
		if (mfd[i] < 0 || ftruncate(mfd[i], (off_t)sh->each) < 0)
			return -1;
		loff_t out = 0;
		for (size_t left = sh->each; left;) {
			size_t c = left < GF_MEM_XFER_CHUNK ? left : GF_MEM_XFER_CHUNK;
			(void)posix_fadvise(fd, in, (off_t)(2 * c), POSIX_FADV_WILLNEED);
			ssize_t r = splice(fd, &in, pp[1], NULL, c, SPLICE_F_MOVE);
			if (r <= 0)
				return -1;
			for (ssize_t held = r; held > 0;) {
				ssize_t w = splice(pp[0], NULL, mfd[i], &out, (size_t)held, SPLICE_F_MOVE);
				if (w <= 0)
					return -1;
				held -= w;
			}
			left -= (size_t)r;
		}
		if (h) {
			uint8_t *q = mmap(NULL, sh->each, PROT_READ, MAP_SHARED, mfd[i], 0);
			if (q == MAP_FAILED)
				return -1;
			hash_each(h, q, 1, sh->each);
			munmap(q, sh->each);
		}
	}
	int64_t us = gf_now_us() - t0;
	*cpu = cpu_us() - c0;
	close(fd);
	close(pp[0]);
	close(pp[1]);
	gf_close_fds(mfd, sh->n);
	free(mfd);
	return us;
}

struct ratio3 {
	double med, min, max;
};

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Throughput ratios base[r] / lib[r] per round: median, min, max. */
static struct ratio3 paired(const int64_t *lib, const int64_t *base, int n)
{
	double q[99];
	for (int r = 0; r < n; r++)
		q[r] = lib[r] > 0 ? (double)base[r] / (double)lib[r] : 0;
	qsort(q, (size_t)n, sizeof(*q), cmp_d);
	return (struct ratio3){n % 2 ? q[n / 2] : (q[n / 2 - 1] + q[n / 2]) / 2, q[0], q[n - 1]};
}

static void series(char *out, size_t cap, const int64_t *v, int n)
{
	size_t at = 0;
	out[0] = 0;
	for (int r = 0; r < n && at < cap; r++)
		at += (size_t)snprintf(out + at, cap - at, "%s%lld", r ? "," : "", (long long)v[r]);
}

int main(int argc, char **argv)
{
	size_t total = (size_t)(argc > 1 ? atol(argv[1]) : 1024) << 20;
	size_t nallocs = argc > 2 ? (size_t)atol(argv[2]) : 256;
	int rounds = argc > 3 ? atoi(argv[3]) : 7;
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
	struct tiers_manifest *mf = tiers_manifest_new();
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
	/* Filled: every side reads one populated read-only mapping, as the tier worker keeps it. */
	gf_mem_va_free(va);
	struct shape sh0 = {.m = m, .allocs = allocs, .n = nallocs, .each = each};
	gf_mem_va *src_va = map_fresh(&sh0);
	const uint8_t *src = (const uint8_t *)(uintptr_t)gf_mem_va_addr(src_va);
	gf_mem_populate((uint64_t)(uintptr_t)src, each * nallocs, false);
	tiers_manifest_layout_hash(mf, mf->layout_hash);
	prime_bytes = bytes + bytes / 4; /* the copy plus its page cache and metadata */
	struct shape sh = {.m = m, .allocs = allocs, .n = nallocs, .each = each};
	struct tiers_hasher *h;
	if ((rc = tiers_hasher_new(&h)) < 0)
		die("hasher", rc);

	printf("%-16s %6s %5s %9s %8s %13s %18s %18s\n", "tier dir", "MiB", "allocs", "op", "lib GB/s", "base GB/s",
	       "vs copy (min-max)", "vs copy+hash");
	for (int d = 0; d < ndirs; d++) {
		char snap[1024], plain[1024], data[1100];
		snprintf(snap, sizeof(snap), "%s/gf-bench-snapshot-%ld", dirs[d], (long)getpid());
		snprintf(plain, sizeof(plain), "%s/gf-bench-plain-%ld", dirs[d], (long)getpid());
		snprintf(data, sizeof(data), "%s/%s", snap, TIERS_SNAP_DATA);
		int64_t sw[99], pw[99], hw[99], sr[99], pr[99], hr[99], csr[99], cpr[99], chr_[99];
		for (int r = 0; r < rounds; r++) {
			/* The three sides in an order that rotates every round, so none
			 * always runs first after the pause or on the warmer cache; each
			 * starts with no dirty pages left by the one before. */
			for (int k = 0; k < 3; k++) {
				int side = (k + r) % 3;
				struct tiers_snap_stats st;
				if (side == 0) {
					settle();
					if ((rc = tiers_snapshot_write_from(snap, m, mf, allocs, (uint64_t)(uintptr_t)src, &st)) < 0)
						die("snapshot", rc);
					sw[r] = st.elapsed_us;
				} else {
					int64_t *t = side == 1 ? pw : hw;
					t[r] = plain_write(plain, &sh, src, side == 1 ? NULL : h);
				}
			}
			for (int k = 0; k < 3; k++) {
				int side = (k + r) % 3;
				drop_cache(data);
				settle();
				if (side == 0) {
					struct tiers_snap_stats st;
					struct tiers_manifest *back;
					gf_mem_alloc **got;
					int64_t c0 = cpu_us();
					if ((rc = tiers_snapshot_restore(snap, m, &back, &got, &st)) < 0)
						die("restore", rc);
					csr[r] = cpu_us() - c0;
					sr[r] = st.elapsed_us;
					tiers_snapshot_restored_free(back, got);
				} else {
					int64_t *t = side == 1 ? pr : hr;
					t[r] = plain_read(data, &sh, side == 1 ? NULL : h, side == 1 ? &cpr[r] : &chr_[r]);
				}
			}
			if (pw[r] < 0 || hw[r] < 0 || pr[r] < 0 || hr[r] < 0) {
				fprintf(stderr, "bench-snapshot: plain copy in %s failed\n", dirs[d]);
				return 1;
			}
		}
		struct ratio3 rcpu = paired(csr, cpr, rounds);
		struct ratio3 wc = paired(sw, pw, rounds), wh = paired(sw, hw, rounds), rc_ = paired(sr, pr, rounds),
			      rh = paired(sr, hr, rounds);
		char per[6][99 * 12];
		const int64_t *all[6] = {sw, pw, hw, sr, pr, hr};
		for (int k = 0; k < 6; k++)
			series(per[k], sizeof(per[k]), all[k], rounds);
		int64_t msw = median(sw, rounds), mpw = median(pw, rounds), mhw = median(hw, rounds),
			msr = median(sr, rounds), mpr = median(pr, rounds), mhr = median(hr, rounds);
		printf("%-16s %6zu %5zu %9s %8.2f %6.2f/%6.2f %6.2f (%.2f-%.2f) %6.2f (%.2f-%.2f)\n", dirs[d], bytes >> 20,
		       nallocs, "snapshot", gbps(bytes, msw), gbps(bytes, mpw), gbps(bytes, mhw), wc.med, wc.min, wc.max,
		       wh.med, wh.min, wh.max);
		printf("%-16s %6zu %5zu %9s %8.2f %6.2f/%6.2f %6.2f (%.2f-%.2f) %6.2f (%.2f-%.2f)\n", dirs[d], bytes >> 20,
		       nallocs, "restore", gbps(bytes, msr), gbps(bytes, mpr), gbps(bytes, mhr), rc_.med, rc_.min, rc_.max,
		       rh.med, rh.min, rh.max);
		printf("{\"dir\": \"%s\", \"bytes\": %zu, \"allocations\": %zu, \"rounds\": %d, "
		       "\"snapshot_us\": %lld, \"copy_write_us\": %lld, \"copy_hash_write_us\": %lld, "
		       "\"restore_us\": %lld, \"splice_read_us\": %lld, \"splice_hash_read_us\": %lld, "
		       "\"snapshot_vs_copy\": %.3f, \"snapshot_vs_copy_min\": %.3f, \"snapshot_vs_copy_max\": %.3f, "
		       "\"snapshot_vs_copy_hash\": %.3f, \"snapshot_vs_copy_hash_min\": %.3f, \"snapshot_vs_copy_hash_max\": %.3f, "
		       "\"restore_vs_splice\": %.3f, \"restore_vs_splice_min\": %.3f, \"restore_vs_splice_max\": %.3f, "
		       "\"restore_vs_splice_hash\": %.3f, \"restore_vs_splice_hash_min\": %.3f, \"restore_vs_splice_hash_max\": %.3f, "
		       "\"snapshot_rounds_us\": [%s], \"copy_write_rounds_us\": [%s], \"copy_hash_write_rounds_us\": [%s], "
		       "\"restore_rounds_us\": [%s], \"splice_read_rounds_us\": [%s], \"splice_hash_read_rounds_us\": [%s], "
		       "\"restore_cpu_us\": %lld, \"splice_read_cpu_us\": %lld, "
		       "\"splice_hash_read_cpu_us\": %lld, \"restore_vs_splice_cpu\": %.3f, \"restore_vs_splice_cpu_min\": %.3f, "
		       "\"restore_vs_splice_cpu_max\": %.3f}\n",
		       dirs[d], bytes, nallocs, rounds, (long long)msw, (long long)mpw, (long long)mhw, (long long)msr,
		       (long long)mpr, (long long)mhr, wc.med, wc.min, wc.max, wh.med, wh.min, wh.max, rc_.med, rc_.min,
		       rc_.max, rh.med, rh.min, rh.max, per[0], per[1], per[2], per[3], per[4], per[5], (long long)median(csr, rounds),
		       (long long)median(cpr, rounds), (long long)median(chr_, rounds), rcpu.med, rcpu.min, rcpu.max);
		fflush(stdout);
		char cmd[2200];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", snap, plain);
		if (system(cmd) != 0)
			fprintf(stderr, "bench-snapshot: could not remove %s\n", snap);
	}
	tiers_hasher_free(h);
	gf_mem_va_free(src_va);
	for (size_t i = 0; i < nallocs; i++)
		gf_mem_alloc_free(allocs[i]);
	free(allocs);
	free(maps);
	tiers_manifest_free(mf);
	gf_mem_free(m);
	return 0;
}
