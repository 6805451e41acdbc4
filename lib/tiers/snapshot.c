/* SPDX-License-Identifier: Apache-2.0 */
/* Snapshot directories: crash-consistent writer, checking reader, verified restore (snapshot.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <xxhash.h>

#include "common.h"
#include "hasher.h"
#include "mem_int.h"
#include "snapshot.h"
#include "xfer.h"

/* errno → error code for file operations: the generic mapping calls ENOENT "unreachable". */
static int file_err(int e, const char *fmt, const char *path)
{
	int code = e == EACCES || e == EPERM ? GF_ERR_PERMISSION
		   : e == ENOENT		 ? GF_ERR_NOT_FOUND
		   : e == ENOMEM		 ? GF_ERR_NOMEM
					 : GF_ERR_IO;
	return gf_err_errno(code, e, fmt, path);
}

static int64_t wall_ms(void)
{
	return gf_wall_us() / 1000;
}

/* Split @dir into its parent (for the temporary and the rename) and its last component. */
static int split_dir(const char *dir, char *parent, size_t plen, char *base, size_t blen)
{
	char a[4096], b[4096];
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	if (n == 0 || n >= sizeof(a))
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: directory path empty or too long");
	memcpy(a, dir, n);
	a[n] = 0;
	memcpy(b, a, n + 1);
	const char *bn = basename(a), *dn = dirname(b);
	if (!strcmp(bn, "/") || !strcmp(bn, ".") || !strcmp(bn, ".."))
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: \"%s\" cannot be a snapshot directory", dir);
	if ((size_t)snprintf(parent, plen, "%s", dn) >= plen || (size_t)snprintf(base, blen, "%s", bn) >= blen)
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: directory path too long");
	return 0;
}

/* Remove a snapshot-shaped directory (our two files, then the directory). Best effort. */
static void remove_snapshot_dir(int parentfd, const char *name)
{
	int fd = openat(parentfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (fd >= 0) {
		unlinkat(fd, TIERS_SNAP_MANIFEST, 0);
		unlinkat(fd, TIERS_SNAP_DATA, 0);
		close(fd);
	}
	unlinkat(parentfd, name, AT_REMOVEDIR);
}

/* Temporaries of writers that died (SIGKILL, power loss) would pile up: remove those whose pid is gone. */
static void remove_stale_temps(int parentfd, const char *base)
{
	int fd = dup(parentfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		gf_close(fd);
		return;
	}
	char prefix[300];
	snprintf(prefix, sizeof(prefix), ".%s.tmp-", base);
	size_t pl = strlen(prefix);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, pl) != 0)
			continue;
		long pid = strtol(e->d_name + pl, NULL, 10);
		if (pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM))
			continue;
		gf_log(GF_LOG_INFO, "gms", "snapshot=%s msg=\"removing the temporary of a writer that died\" tmp=%s", base,
		       e->d_name);
		remove_snapshot_dir(parentfd, e->d_name);
	}
	closedir(d);
}

static int write_all(int fd, const void *buf, size_t n, const char *path)
{
	const uint8_t *p = buf;
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		/* A direct write the device cannot take as it is (alignment):
		 * the rest goes through the page cache. */
		int fl;
		if (w < 0 && errno == EINVAL && (fl = fcntl(fd, F_GETFL)) >= 0 && (fl & O_DIRECT) &&
		    fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0)
			continue;
		if (w < 0 && (errno == ENOSPC || errno == EDQUOT))
			return gf_err_errno(GF_ERR_IO, errno, "snapshot: write %s: no space left", path);
		if (w < 0)
			return file_err(errno, "snapshot: write %s", path);
		if (w == 0)
			return gf_err_errno(GF_ERR_IO, ENOSPC, "snapshot: write %s: no space left", path);
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

struct hash_io {
	int fd;
	const char *path;
	struct tiers_hasher *h;
	uint64_t file_off; /* restore: where the next read starts */
};

static int sink_write(void *ud, const void *buf, size_t n)
{
	struct hash_io *io = ud;
	/* Hash on the helper thread while this thread writes the same bytes;
	 * both are done before the buffer goes back to the transfer. */
	tiers_hasher_submit(io->h, buf, n);
	int rc = write_all(io->fd, buf, n, io->path);
	tiers_hasher_wait(io->h);
	return rc;
}

/* Map @n allocations back to back in one reservation of @total bytes with @access. */
static int map_all(gf_mem *m, gf_mem_alloc *const *allocs, size_t n, uint64_t total, int access, gf_mem_va **out)
{
	gf_mem_va *va = NULL;
	struct gf_mem_mapping *maps = calloc(n ? n : 1, sizeof(*maps));
	if (!maps)
		return gf_err(GF_ERR_NOMEM, "snapshot: out of memory");
	int rc = gf_mem_reserve(&va, m, total ? total : 1, 0);
	size_t at = 0;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		maps[i] = (struct gf_mem_mapping){ .offset = at, .alloc = allocs[i] };
		at += gf_mem_alloc_size(allocs[i]);
	}
	if (rc == 0 && n)
		rc = gf_mem_map_many(va, maps, n, access);
	free(maps);
	if (rc < 0) {
		gf_mem_va_free(va);
		return rc;
	}
	*out = va;
	return 0;
}

static int fill_identity(gf_mem *m, struct tiers_manifest *mf)
{
	size_t gmin, grec;
	int rc = gf_mem_granularity(m, &gmin, &grec);
	if (rc == 0)
		rc = gf_mem_device_uuid(m, mf->device_uuid, sizeof(mf->device_uuid));
	if (rc < 0)
		return rc;
	snprintf(mf->backend, sizeof(mf->backend), "%s", gf_mem_kind_name(gf_mem_kind(m)));
	mf->version = TIERS_SNAP_VERSION;
	mf->granularity = gmin;
	mf->created_unix_ms = wall_ms();
	return 0;
}

/*
 * Host memory is addressable where it is mapped, so the data file is
 * written straight from the mapping. The helper thread runs one chunk
 * ahead: it faults in the next chunk's page tables and hashes it while this
 * thread writes the chunk before, so the writes find their pages mapped and
 * neither the faults nor the hash add to the copy's time.
 */
/* Every allocation of @mf in chunks of at most GF_MEM_XFER_CHUNK, in data
 * file order: @fn gets the allocation's index, the chunk's address in the
 * mapping at @base, its offset in the allocation and length, and whether it
 * is the allocation's last. Stops at the first error. */
typedef int (*chunk_fn)(void *ud, size_t i, const uint8_t *p, uint64_t off, size_t n, bool last);
static int each_chunk(const struct tiers_manifest *mf, uint64_t base, chunk_fn fn, void *ud)
{
	int rc = 0;
	for (size_t i = 0; rc == 0 && i < mf->nallocs; i++) {
		const uint8_t *p = (const uint8_t *)(uintptr_t)(base + mf->allocs[i].offset);
		for (uint64_t off = 0; rc == 0 && off < mf->allocs[i].size; off += GF_MEM_XFER_CHUNK) {
			uint64_t left = mf->allocs[i].size - off;
			size_t n = left < GF_MEM_XFER_CHUNK ? (size_t)left : GF_MEM_XFER_CHUNK;
			rc = fn(ud, i, p + off, off, n, n == left);
		}
	}
	return rc;
}

struct write_ahead {
	int fd;
	const char *path;
	struct tiers_manifest *mf;
	struct tiers_hasher *h;
	const uint8_t *prev; /* the chunk handed to the hasher before this one */
	size_t prev_n;
};

static int write_chunk(void *ud, size_t i, const uint8_t *p, uint64_t off, size_t n, bool last)
{
	(void)off;
	struct write_ahead *w = ud;
	/* Returns once the previous chunk is hashed (and so mapped). */
	tiers_hasher_submit_ex(w->h, p, n, true, last ? &w->mf->allocs[i].xxh3 : NULL);
	int rc = w->prev ? write_all(w->fd, w->prev, w->prev_n, w->path) : 0;
	w->prev = p;
	w->prev_n = n;
	return rc;
}

static int write_host(int fd, const char *path, uint64_t base, struct tiers_manifest *mf, struct tiers_hasher *h)
{
	struct write_ahead w = {.fd = fd, .path = path, .mf = mf, .h = h};
	int rc = each_chunk(mf, base, write_chunk, &w);
	tiers_hasher_wait(h);
	if (rc == 0 && w.prev)
		rc = write_all(fd, w.prev, w.prev_n, path);
	return rc;
}

/*
 * From a mapping whose page tables are already filled (the GMS keeps one of
 * the committed layout): nothing to fault in, so each chunk is written at
 * once and queued for the hasher, which may fall up to TIERS_HASHER_QUEUE
 * chunks behind the writes (a busy second core delays the end, not every
 * write).
 */
static int queue_chunk(void *ud, size_t i, const uint8_t *p, uint64_t off, size_t n, bool last)
{
	(void)off;
	struct write_ahead *w = ud;
	tiers_hasher_queue(w->h, p, n, false, last ? &w->mf->allocs[i].xxh3 : NULL);
	return write_all(w->fd, p, n, w->path);
}

static int write_populated(int fd, const char *path, uint64_t base, struct tiers_manifest *mf, struct tiers_hasher *h)
{
	struct write_ahead w = {.fd = fd, .path = path, .mf = mf, .h = h};
	int rc = each_chunk(mf, base, queue_chunk, &w);
	tiers_hasher_wait(h);
	return rc;
}

/* Write both files into the open temporary directory @tfd; from @src when not 0 (host: a populated mapping). */
static int write_files(int tfd, const char *tmpname, gf_mem *m, struct tiers_manifest *mf, gf_mem_alloc *const *allocs,
		       uint64_t src)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", tmpname, TIERS_SNAP_DATA);
	int fd = openat(tfd, TIERS_SNAP_DATA, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return file_err(errno, "snapshot: create %s", path);
	/* A file system that clearly cannot hold the data fails here, before any
	 * copy. (Not fallocate: on tmpfs, the WARM tier, it zeroes every page
	 * the copy then overwrites.) A write that still runs out is caught too. */
	int rc = 0;
	struct statvfs vfs;
	if (fstatvfs(fd, &vfs) == 0 && vfs.f_blocks && (uint64_t)vfs.f_bavail * vfs.f_frsize < mf->total_bytes)
		rc = gf_err(GF_ERR_IO, "snapshot: %s: no space left on device: %" PRIu64 " bytes needed, %" PRIu64 " available",
			    path, mf->total_bytes, (uint64_t)vfs.f_bavail * vfs.f_frsize);
	/* On disk (COLD) the data skips the page cache. A snapshot is written
	 * once and read back only by a restore, often after the cache is gone;
	 * copying 1 GiB into the cache first cost 1.1 to 3.4 s here (page
	 * allocation, dirty throttling) against 0.55 s direct, and evicted the
	 * host's working set. fsync still makes it durable. tmpfs (WARM) keeps
	 * its copy in memory either way, so it stays buffered; where the flag is
	 * refused, or a write is not aligned (write_all), the copy is buffered. */
	struct statfs sfs;
	int fl = fcntl(fd, F_GETFL);
	if (rc == 0 && fstatfs(fd, &sfs) == 0 && sfs.f_type != TMPFS_MAGIC && fl >= 0)
		(void)fcntl(fd, F_SETFL, fl | O_DIRECT);
	gf_mem_va *va = NULL;
	gf_mem_xfer *x = NULL;
	struct tiers_hasher *h = NULL;
	if (rc == 0)
		rc = tiers_hasher_new(&h);
	if (rc == 0)
		rc = gf_mem_xfer_new(m, 0, &x);
	if (rc == 0 && (!src || gf_mem_xfer_staged(x)))
		rc = map_all(m, allocs, mf->nallocs, mf->total_bytes, GF_MEM_READ, &va);
	uint64_t at = 0;
	if (rc == 0 && src && !gf_mem_xfer_staged(x))
		rc = write_populated(fd, path, src, mf, h);
	else if (rc == 0 && !gf_mem_xfer_staged(x))
		rc = write_host(fd, path, gf_mem_va_addr(va), mf, h);
	for (size_t i = 0; rc == 0 && gf_mem_xfer_staged(x) && i < mf->nallocs; i++) {
		struct hash_io io = { .fd = fd, .path = path, .h = h };
		tiers_hasher_reset(h);
		rc = gf_mem_xfer_read(x, gf_mem_va_addr(va) + at, mf->allocs[i].size, sink_write, &io);
		mf->allocs[i].xxh3 = tiers_hasher_digest(h);
		at += mf->allocs[i].size;
	}
	gf_mem_xfer_free(x);
	gf_mem_va_free(va);
	tiers_hasher_free(h);
	if (rc == 0 && fsync(fd) < 0)
		rc = file_err(errno, "snapshot: fsync %s", path);
	if (close(fd) < 0 && rc == 0)
		rc = file_err(errno, "snapshot: close %s", path);
	if (rc < 0)
		return rc;

	char *text = NULL;
	size_t len = 0;
	snprintf(path, sizeof(path), "%s/%s", tmpname, TIERS_SNAP_MANIFEST);
	rc = tiers_manifest_format(mf, &text, &len);
	if (rc < 0)
		return rc;
	fd = openat(tfd, TIERS_SNAP_MANIFEST, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		rc = file_err(errno, "snapshot: create %s", path);
	if (rc == 0)
		rc = write_all(fd, text, len, path);
	if (rc == 0 && fsync(fd) < 0)
		rc = file_err(errno, "snapshot: fsync %s", path);
	if (fd >= 0 && close(fd) < 0 && rc == 0)
		rc = file_err(errno, "snapshot: close %s", path);
	free(text);
	if (rc == 0 && fsync(tfd) < 0)
		rc = file_err(errno, "snapshot: fsync directory %s", tmpname);
	return rc;
}

/* Put the complete temporary in place of @base: a plain rename when nothing
 * (or an empty directory) is there, else an atomic exchange with the old
 * snapshot, which is removed afterwards. */
static int install(int pfd, const char *tmpname, const char *base, const char *dir, bool *displaced)
{
	if (renameat(pfd, tmpname, pfd, base) == 0)
		return 0;
	if (errno != ENOTEMPTY && errno != EEXIST)
		return file_err(errno, "snapshot: rename into %s", dir);
	/* Only ever displace a snapshot, never some other directory that happens to be there. */
	int ofd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (ofd < 0)
		return file_err(errno, "snapshot: open %s", dir);
	bool is_snapshot = faccessat(ofd, TIERS_SNAP_MANIFEST, F_OK, 0) == 0 || faccessat(ofd, TIERS_SNAP_DATA, F_OK, 0) == 0;
	close(ofd);
	if (!is_snapshot)
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: %s exists and is not a snapshot directory; not replacing it", dir);
	if (renameat2(pfd, tmpname, pfd, base, RENAME_EXCHANGE) < 0)
		return file_err(errno, "snapshot: exchange with the previous snapshot at %s", dir);
	*displaced = true; /* the old snapshot is now at tmpname: removed once the new one is durable */
	return 0;
}

int tiers_snapshot_write(const char *dir, gf_mem *m, struct tiers_manifest *mf, gf_mem_alloc *const *allocs,
			 struct tiers_snap_stats *stats)
{
	return tiers_snapshot_write_from(dir, m, mf, allocs, 0, stats);
}

int tiers_snapshot_write_from(const char *dir, gf_mem *m, struct tiers_manifest *mf, gf_mem_alloc *const *allocs,
			      uint64_t src, struct tiers_snap_stats *stats)
{
	if (!dir || !m || !mf || (mf->nallocs && !allocs))
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: NULL argument");
	int64_t t0 = gf_now_us();
	char parent[4096], base[256], tmpname[320];
	int rc = split_dir(dir, parent, sizeof(parent), base, sizeof(base));
	if (rc == 0)
		rc = fill_identity(m, mf);
	if (rc < 0)
		return rc;
	mf->total_bytes = 0;
	for (size_t i = 0; i < mf->nallocs; i++) {
		if (!allocs[i] || gf_mem_alloc_size(allocs[i]) != mf->allocs[i].size)
			return gf_err(GF_ERR_INVALID_ARG, "snapshot: allocation %zu: size %zu does not match the manifest's %" PRIu64,
				      i, allocs[i] ? gf_mem_alloc_size(allocs[i]) : 0, mf->allocs[i].size);
		if (mf->allocs[i].id != i + 1)
			return gf_err(GF_ERR_INVALID_ARG, "snapshot: allocation %zu has id %" PRIu64 ", expected %zu", i,
				      mf->allocs[i].id, i + 1);
		mf->allocs[i].offset = mf->total_bytes;
		mf->total_bytes += mf->allocs[i].size;
	}
	int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0)
		return file_err(errno, "snapshot: open parent directory %s", parent);
	remove_stale_temps(pfd, base);
	uint32_t rnd = 0;
	gf_random_bytes(&rnd, sizeof(rnd));
	snprintf(tmpname, sizeof(tmpname), ".%s.tmp-%ld-%08x", base, (long)getpid(), rnd);
	if (mkdirat(pfd, tmpname, 0755) < 0) {
		rc = file_err(errno, "snapshot: create temporary directory in %s", parent);
		close(pfd);
		return rc;
	}
	int tfd = openat(pfd, tmpname, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	rc = tfd < 0 ? file_err(errno, "snapshot: open temporary directory %s", tmpname)
		     : write_files(tfd, tmpname, m, mf, allocs, src);
	gf_close(tfd);
	bool displaced = false;
	if (rc == 0)
		rc = install(pfd, tmpname, base, dir, &displaced);
	if (rc == 0 && fsync(pfd) < 0)
		rc = file_err(errno, "snapshot: fsync directory %s", parent);
	if (rc < 0) {
		/* Keep the detail of the real failure across the clean-up. */
		remove_snapshot_dir(pfd, tmpname);
		close(pfd);
		return rc;
	}
	/* The new snapshot is in place and durable: the time it took. Freeing
	 * the previous one's blocks (a second on some disks) is clean-up. */
	if (stats) {
		stats->bytes = mf->total_bytes;
		stats->elapsed_us = gf_now_us() - t0;
	}
	if (displaced)
		remove_snapshot_dir(pfd, tmpname);
	close(pfd);
	gf_log(GF_LOG_INFO, "gms", "snapshot=%s bytes=%" PRIu64 " allocations=%zu generation=%" PRIu64 " msg=\"snapshot written\"",
	       dir, mf->total_bytes, mf->nallocs, mf->generation);
	return 0;
}

int tiers_snapshot_remove(const char *dir)
{
	char parent[4096], base[256];
	int rc = dir ? split_dir(dir, parent, sizeof(parent), base, sizeof(base))
		     : gf_err(GF_ERR_INVALID_ARG, "snapshot: NULL directory");
	if (rc < 0)
		return rc;
	int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0)
		return file_err(errno, "snapshot: open parent directory %s", parent);
	int ofd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (ofd < 0) {
		rc = errno == ENOENT ? gf_err(GF_ERR_NOT_FOUND, "snapshot: no snapshot at %s", dir)
				     : file_err(errno, "snapshot: open %s", dir);
		close(pfd);
		return rc;
	}
	bool is_snapshot = faccessat(ofd, TIERS_SNAP_MANIFEST, F_OK, 0) == 0 || faccessat(ofd, TIERS_SNAP_DATA, F_OK, 0) == 0;
	close(ofd);
	if (!is_snapshot) {
		close(pfd);
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: %s is not a snapshot directory; not removing it", dir);
	}
	remove_snapshot_dir(pfd, base);
	if (faccessat(pfd, base, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		rc = gf_err(GF_ERR_IO, "snapshot: %s could not be removed", dir);
	else if (fsync(pfd) < 0)
		rc = file_err(errno, "snapshot: fsync directory %s", parent);
	close(pfd);
	return rc;
}

/* ---------------------------------------------------------------- reading */

/* Open and check the snapshot at @dir; *@data_fd is its data file, open for reading. */
static int open_snapshot(const char *dir, struct tiers_manifest **out, int *data_fd)
{
	if (!dir || !out)
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: NULL argument");
	/* Both files through one directory fd: a snapshot replaced meanwhile is
	 * read whole (old) or fails, never mixed with the new one's data. */
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return file_err(errno, "snapshot: open %s", dir);
	/* Not through a symlink (to a file the caller could not read), and a
	 * FIFO or device must not block the open: what it is comes next. */
	int mfd = openat(dfd, TIERS_SNAP_MANIFEST, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (mfd < 0) {
		int rc = file_err(errno, "snapshot: %s/" TIERS_SNAP_MANIFEST, dir);
		close(dfd);
		return rc;
	}
	struct stat st;
	int rc = 0;
	struct tiers_manifest *mf = NULL;
	if (fstat(mfd, &st) < 0)
		rc = file_err(errno, "snapshot: stat %s/" TIERS_SNAP_MANIFEST, dir);
	else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > TIERS_SNAP_MAX_MANIFEST)
		rc = gf_err(GF_ERR_PROTOCOL, "snapshot: %s/" TIERS_SNAP_MANIFEST " is not a regular file of at most %llu bytes",
			    dir, TIERS_SNAP_MAX_MANIFEST);
	else
		rc = tiers_manifest_read(mfd, (uint64_t)st.st_size, &mf);
	close(mfd);
	int fd = -1;
	if (rc == 0) {
		fd = openat(dfd, TIERS_SNAP_DATA, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		if (fd < 0)
			rc = file_err(errno, "snapshot: %s/" TIERS_SNAP_DATA, dir);
		else if (fstat(fd, &st) < 0)
			rc = file_err(errno, "snapshot: stat %s/" TIERS_SNAP_DATA, dir);
		else if (!S_ISREG(st.st_mode))
			rc = gf_err(GF_ERR_PROTOCOL, "snapshot: %s/" TIERS_SNAP_DATA " is not a regular file", dir);
		else if ((uint64_t)st.st_size != mf->total_bytes)
			rc = gf_err(GF_ERR_PROTOCOL, "snapshot: %s/" TIERS_SNAP_DATA " has %lld bytes, the manifest says %" PRIu64
				    " (%s)", dir, (long long)st.st_size, mf->total_bytes,
				    (uint64_t)st.st_size < mf->total_bytes ? "truncated" : "trailing bytes");
	}
	close(dfd);
	if (rc < 0) {
		gf_close(fd);
		tiers_manifest_free(mf);
		return rc;
	}
	if (data_fd) {
		posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
		*data_fd = fd;
	} else {
		close(fd);
	}
	*out = mf;
	return 0;
}

int tiers_snapshot_open(const char *dir, struct tiers_manifest **out)
{
	return open_snapshot(dir, out, NULL);
}

static int source_read(void *ud, void *buf, size_t n)
{
	struct hash_io *io = ud;
	uint8_t *p = buf;
	size_t left = n;
	while (left) {
		ssize_t r = pread(io->fd, p, left, (off_t)io->file_off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return file_err(errno, "snapshot: read %s", io->path);
		if (r == 0)
			return gf_err(GF_ERR_PROTOCOL, "snapshot: %s ends at byte %" PRIu64 " (truncated while reading)",
				      io->path, io->file_off);
		p += r;
		left -= (size_t)r;
		io->file_off += (uint64_t)r;
	}
	/* Hashed on the helper thread while the next chunk is read; the buffer
	 * is refilled only after a later submit, wait or digest returned. */
	tiers_hasher_submit(io->h, buf, n);
	return 0;
}

static int checksum_mismatch(const char *dir, const struct tiers_snap_alloc *a, uint64_t got)
{
	return gf_err(GF_ERR_PROTOCOL,
		      "snapshot: %s: checksum mismatch in allocation %" PRIu64 " (tag \"%s\", %" PRIu64
		      " bytes): manifest %016" PRIx64 ", data %016" PRIx64,
		      dir, a->id, a->tag, a->size, a->xxh3, got);
}

int tiers_snapshot_verify(const char *dir, struct tiers_manifest **out)
{
	struct tiers_manifest *mf;
	int fd;
	int rc = open_snapshot(dir, &mf, &fd);
	if (rc < 0)
		return rc;
	struct tiers_hasher *h = NULL;
	size_t bufsize = GF_MEM_XFER_CHUNK;
	/* Two buffers: one is read into while the other is hashed. */
	uint8_t *buf = malloc(2 * bufsize);
	if (!buf)
		rc = gf_err(GF_ERR_NOMEM, "snapshot: out of memory");
	if (rc == 0)
		rc = tiers_hasher_new(&h);
	struct hash_io io = { .fd = fd, .path = dir, .h = h };
	for (size_t i = 0; rc == 0 && i < mf->nallocs; i++) {
		tiers_hasher_reset(h);
		size_t k = 0;
		for (uint64_t off = 0; rc == 0 && off < mf->allocs[i].size; off += bufsize, k++) {
			uint64_t left = mf->allocs[i].size - off;
			rc = source_read(&io, buf + (k & 1) * bufsize, left < bufsize ? (size_t)left : bufsize);
		}
		uint64_t got = tiers_hasher_digest(h);
		if (rc == 0 && got != mf->allocs[i].xxh3)
			rc = checksum_mismatch(dir, &mf->allocs[i], got);
	}
	tiers_hasher_free(h);
	free(buf);
	close(fd);
	if (rc < 0 || !out)
		tiers_manifest_free(mf);
	else
		*out = mf;
	return rc;
}

void tiers_snapshot_restored_free(struct tiers_manifest *mf, gf_mem_alloc **allocs)
{
	if (allocs && mf)
		for (size_t i = 0; i < mf->nallocs; i++)
			gf_mem_alloc_free(allocs[i]);
	free(allocs);
	tiers_manifest_free(mf);
}

/* Refuse a snapshot another backend or granularity wrote; a node move (other UUID) is fine. */
static int check_compatible(const char *dir, gf_mem *m, const struct tiers_manifest *mf)
{
	size_t gmin, grec;
	char uuid[64];
	const char *kind = gf_mem_kind_name(gf_mem_kind(m));
	if (strcmp(mf->backend, kind) != 0)
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: %s was written by the %s backend, this GMS runs %s", dir,
			      mf->backend, kind);
	int rc = gf_mem_granularity(m, &gmin, &grec);
	if (rc < 0)
		return rc;
	if (mf->granularity != gmin)
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: %s has granularity %" PRIu64 ", this device's is %zu", dir,
			      mf->granularity, gmin);
	if (gf_mem_device_uuid(m, uuid, sizeof(uuid)) == 0 && strcmp(uuid, mf->device_uuid) != 0)
		gf_log(GF_LOG_INFO, "gms", "snapshot=%s from=%s to=%s msg=\"restoring onto another device\"", dir,
		       mf->device_uuid, uuid);
	return 0;
}

/*
 * Where allocations are files (host memfds), the helper thread reads the
 * data file in pieces into a small ring of buffers and hashes each piece
 * there, and this thread writes exactly that buffer into the allocation
 * (pwrite) once the helper is done with it. The bytes written are the bytes
 * hashed, so nothing is read back from the new memory: reading it back cost
 * more CPU than the copy into it (each page written and read again is also
 * moved to the kernel's active list). Each thread does one copy, so the two
 * cores share the work. No mapping of the new memory is made: no page is
 * zero-filled, faulted in or torn down. Pieces of 1 MiB measured best;
 * 64 KiB to 4 MiB were tried (docs/tiers.md).
 */
#define RESTORE_PIECE ((size_t)1 << 20)
#define RESTORE_RING 4

/* The pieces of every allocation, in data file order. */
struct cursor {
	const struct tiers_manifest *mf;
	size_t i;
	uint64_t off;
};

struct piece {
	size_t i;    /* allocation */
	uint64_t off; /* in the allocation */
	size_t n;
	bool last; /* the allocation's last piece */
};

static bool next_piece(struct cursor *c, struct piece *p)
{
	while (c->i < c->mf->nallocs && c->off >= c->mf->allocs[c->i].size)
		c->i++, c->off = 0;
	if (c->i >= c->mf->nallocs)
		return false;
	uint64_t left = c->mf->allocs[c->i].size - c->off;
	*p = (struct piece){ .i = c->i, .off = c->off, .n = left < RESTORE_PIECE ? (size_t)left : RESTORE_PIECE,
			     .last = left <= RESTORE_PIECE };
	c->off += p->n;
	return true;
}

/* @n bytes of @buf into allocation @a (index @i) at @off. */
static int write_piece(gf_mem_alloc *a, size_t i, const uint8_t *buf, size_t n, uint64_t off)
{
	int afd;
	bool owned;
	int rc = gf_mem_export_borrowed(a, &afd, &owned);
	if (rc < 0)
		return rc;
	for (size_t done = 0; rc == 0 && done < n;) {
		ssize_t w = pwrite(afd, buf + done, n - done, (off_t)(off + done));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			rc = gf_err_errno(w < 0 && errno == ENOMEM ? GF_ERR_OUT_OF_MEMORY : GF_ERR_IO, w < 0 ? errno : ENOSPC,
					  "snapshot restore: write into allocation %zu", i + 1);
		else
			done += (size_t)w;
	}
	if (owned)
		close(afd);
	return rc;
}

static int restore_files(const char *dir, const char *path, int fd, const struct tiers_manifest *mf,
			 gf_mem_alloc *const *allocs, struct tiers_hasher *h)
{
	uint64_t *got = calloc(mf->nallocs ? mf->nallocs : 1, sizeof(uint64_t));
	uint8_t *ring = malloc(RESTORE_RING * RESTORE_PIECE);
	int rc = got && ring ? 0 : gf_err(GF_ERR_NOMEM, "snapshot restore: out of memory");
	struct cursor rd = { .mf = mf };
	struct piece p, slot[RESTORE_RING];
	uint64_t ticket[RESTORE_RING], file_off = 0, next_hint = 0;
	size_t issued = 0, written = 0;
	bool more = true;
	while (rc == 0) {
		/* Keep the helper RESTORE_RING - 1 pieces ahead of the writes. */
		if (more && issued - written < RESTORE_RING && (more = next_piece(&rd, &p))) {
			if (file_off >= next_hint) {
				/* From a disk: the next range in large reads now (a hint). */
				(void)posix_fadvise(fd, (off_t)file_off, (off_t)(2 * GF_MEM_XFER_CHUNK), POSIX_FADV_WILLNEED);
				next_hint = file_off + GF_MEM_XFER_CHUNK;
			}
			size_t k = issued % RESTORE_RING;
			slot[k] = p;
			ticket[k] = tiers_hasher_queue_read(h, fd, file_off, p.n, ring + k * RESTORE_PIECE,
							    p.last ? &got[p.i] : NULL);
			file_off += p.n;
			issued++;
			continue;
		}
		if (written == issued)
			break;
		size_t k = written % RESTORE_RING;
		int e = tiers_hasher_wait_for(h, ticket[k]);
		if (e == ENODATA)
			rc = gf_err(GF_ERR_PROTOCOL, "snapshot: %s ends early (truncated while reading)", path);
		else if (e)
			rc = file_err(e, "snapshot: read %s", path);
		else
			rc = write_piece(allocs[slot[k].i], slot[k].i, ring + k * RESTORE_PIECE, slot[k].n, slot[k].off);
		written++;
	}
	/* The helper may still be reading into the ring after a failure. */
	tiers_hasher_wait(h);
	for (size_t i = 0; rc == 0 && i < mf->nallocs; i++)
		if (got[i] != mf->allocs[i].xxh3)
			rc = checksum_mismatch(dir, &mf->allocs[i], got[i]);
	free(ring);
	free(got);
	return rc;
}

int tiers_snapshot_restore(const char *dir, gf_mem *m, struct tiers_manifest **mf_out, gf_mem_alloc ***allocs_out,
			   struct tiers_snap_stats *stats)
{
	if (!m || !mf_out || !allocs_out)
		return gf_err(GF_ERR_INVALID_ARG, "snapshot restore: NULL argument");
	int64_t t0 = gf_now_us();
	struct tiers_manifest *mf;
	int fd;
	int rc = open_snapshot(dir, &mf, &fd);
	if (rc < 0)
		return rc;
	rc = check_compatible(dir, m, mf);
	gf_mem_alloc **allocs = calloc(mf->nallocs ? mf->nallocs : 1, sizeof(*allocs));
	if (rc == 0 && !allocs)
		rc = gf_err(GF_ERR_NOMEM, "snapshot restore: out of memory");
	for (size_t i = 0; rc == 0 && i < mf->nallocs; i++) {
		rc = gf_mem_create(&allocs[i], m, mf->allocs[i].size);
		if (rc == 0 && gf_mem_alloc_size(allocs[i]) != mf->allocs[i].size)
			rc = gf_err(GF_ERR_INVALID_ARG, "snapshot restore: allocation %zu came out %zu bytes, not %" PRIu64, i + 1,
				    gf_mem_alloc_size(allocs[i]), mf->allocs[i].size);
	}
	gf_mem_va *va = NULL;
	gf_mem_xfer *x = NULL;
	struct tiers_hasher *h = NULL;
	if (rc == 0)
		rc = tiers_hasher_new(&h);
	if (rc == 0)
		rc = gf_mem_xfer_new(m, 0, &x);
	/* Only a staged copy (cuda) writes through a mapping. */
	if (rc == 0 && !gf_mem_xfer_files(x))
		rc = map_all(m, allocs, mf->nallocs, mf->total_bytes, GF_MEM_READWRITE, &va);
	char path[4200];
	snprintf(path, sizeof(path), "%s/" TIERS_SNAP_DATA, dir);
	struct hash_io io = { .fd = fd, .path = path, .h = h };
	if (rc == 0 && gf_mem_xfer_files(x))
		rc = restore_files(dir, path, fd, mf, allocs, h);
	for (size_t i = 0; rc == 0 && !gf_mem_xfer_files(x) && i < mf->nallocs; i++) {
		tiers_hasher_reset(h);
		rc = gf_mem_xfer_write(x, gf_mem_va_addr(va) + mf->allocs[i].offset, mf->allocs[i].size, source_read, &io);
		uint64_t got = tiers_hasher_digest(h);
		if (rc == 0 && got != mf->allocs[i].xxh3)
			rc = checksum_mismatch(dir, &mf->allocs[i], got);
	}
	/* The hasher may still read the last chunk's buffer: done before the transfer frees it. */
	tiers_hasher_free(h);
	gf_mem_xfer_free(x);
	/* The device must hold every byte before anyone may map it read-only. */
	if (rc == 0)
		rc = gf_mem_synchronize(m);
	gf_mem_va_free(va);
	close(fd);
	if (rc < 0) {
		tiers_snapshot_restored_free(mf, allocs);
		return rc;
	}
	if (stats) {
		stats->bytes = mf->total_bytes;
		stats->elapsed_us = gf_now_us() - t0;
	}
	*mf_out = mf;
	*allocs_out = allocs;
	return 0;
}

void tiers_snapshot_probe(const char *dir, struct tiers_snap_probe *out)
{
	memset(out, 0, sizeof(*out));
	struct tiers_manifest *mf;
	int rc = dir ? tiers_snapshot_open(dir, &mf) : GF_ERR_NOT_FOUND;
	if (rc < 0) {
		/* A tier that was never written is simply absent; anything else is worth saying. */
		if (rc != GF_ERR_NOT_FOUND)
			snprintf(out->error, sizeof(out->error), "%s", gf_error_detail());
		return;
	}
	out->present = true;
	out->bytes = mf->total_bytes;
	out->allocations = mf->nallocs;
	out->generation = mf->generation;
	memcpy(out->layout_hash, mf->layout_hash, 16);
	out->created_unix_ms = mf->created_unix_ms;
	int64_t age = wall_ms() - mf->created_unix_ms;
	out->age_ms = age > 0 ? age : 0;
	snprintf(out->backend, sizeof(out->backend), "%s", mf->backend);
	tiers_manifest_free(mf);
}
