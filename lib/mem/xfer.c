/* SPDX-License-Identifier: Apache-2.0 */
/* Chunked, double-buffered transfers between mappings and host code (xfer.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "xfer.h"

struct gf_mem_xfer {
	gf_mem *m;
	size_t chunk;
	bool staged;
	void *buf[2];
	void *event[2];
	bool pending[2]; /* a copy from or into buf[i] may still be running */
	void *stream;
	int pipe[2];    /* fill_from_file: splice's pipe; -1 until first used */
	uint8_t *bounce; /* fill_from_file: the read/write fallback's buffer */
};

int gf_mem_xfer_staged(const gf_mem_xfer *x)
{
	return x && x->staged;
}

static int wait_buf(gf_mem_xfer *x, int b)
{
	if (!x->pending[b])
		return 0;
	x->pending[b] = false;
	return x->m->be->event_wait(x->m, x->event[b]);
}

/* Wait for both buffers; the first error wins, but both are waited for. */
static int drain(gf_mem_xfer *x)
{
	int r0 = wait_buf(x, 0), r1 = wait_buf(x, 1);
	return r0 < 0 ? r0 : r1;
}

void gf_mem_xfer_free(gf_mem_xfer *x)
{
	if (!x)
		return;
	gf_close(x->pipe[0]);
	gf_close(x->pipe[1]);
	free(x->bounce);
	if (x->staged) {
		const struct gf_mem_backend *be = x->m->be;
		/* Buffers may be freed only when no copy uses them any more. */
		drain(x);
		for (int i = 0; i < 2; i++) {
			if (x->event[i])
				be->event_free(x->m, x->event[i]);
			if (x->buf[i])
				be->host_free(x->m, x->buf[i]);
		}
		if (x->stream)
			be->stream_free(x->m, x->stream);
	}
	free(x);
}

int gf_mem_xfer_new(gf_mem *m, size_t chunk, gf_mem_xfer **out)
{
	if (!m || !out)
		return gf_err(GF_ERR_INVALID_ARG, "xfer: NULL argument");
	gf_mem_xfer *x = calloc(1, sizeof(*x));
	if (!x)
		return gf_err(GF_ERR_NOMEM, "xfer: out of memory");
	const struct gf_mem_backend *be = m->be;
	x->m = m;
	x->pipe[0] = x->pipe[1] = -1;
	x->chunk = chunk ? chunk : GF_MEM_XFER_CHUNK;
	x->staged = be->copy_dtoh != NULL;
	if (x->staged) {
		int rc = be->stream_new(m, &x->stream);
		for (int i = 0; i < 2 && rc == 0; i++) {
			rc = be->host_alloc(m, x->chunk, &x->buf[i]);
			if (rc == 0)
				rc = be->event_new(m, &x->event[i]);
		}
		if (rc < 0) {
			gf_mem_xfer_free(x);
			return rc;
		}
	}
	*out = x;
	return 0;
}

/* Host mappings of a fresh memfd fault in page by page; populating a chunk's
 * page tables in one call first is several times cheaper. A hint only: kernels
 * before 5.14 lack it and the copy then faults as usual. */
void gf_mem_populate(uint64_t addr, size_t n, bool write)
{
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t start = addr & ~(page - 1);
	madvise((void *)(uintptr_t)start, n + (addr - start), write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
#else
	(void)addr, (void)n, (void)write;
#endif
}

static size_t chunk_len(const gf_mem_xfer *x, size_t n, size_t off)
{
	return n - off < x->chunk ? n - off : x->chunk;
}

/* Queue the device-to-host copy of the chunk at @off into buffer @b. */
static int issue_dtoh(gf_mem_xfer *x, int b, uint64_t src, size_t n, size_t off)
{
	const struct gf_mem_backend *be = x->m->be;
	int rc = be->copy_dtoh(x->m, x->buf[b], src + off, chunk_len(x, n, off), x->stream);
	if (rc == 0)
		rc = be->event_record(x->m, x->event[b], x->stream);
	if (rc == 0)
		x->pending[b] = true;
	return rc;
}

int gf_mem_xfer_read(gf_mem_xfer *x, uint64_t src, size_t n, gf_mem_xfer_sink sink, void *ud)
{
	if (!x || !sink || (n && !src))
		return gf_err(GF_ERR_INVALID_ARG, "xfer read: NULL argument");
	if (!x->staged) {
		for (size_t off = 0; off < n; off += x->chunk) {
			gf_mem_populate(src + off, chunk_len(x, n, off), false);
			int rc = sink(ud, (const void *)(uintptr_t)(src + off), chunk_len(x, n, off));
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	if (n == 0)
		return 0;
	int rc = issue_dtoh(x, 0, src, n, 0);
	for (size_t off = 0, k = 0; rc == 0 && off < n; off += x->chunk, k++) {
		int b = (int)(k & 1);
		size_t next = off + x->chunk;
		/* The other buffer was consumed in the previous round: refill it now,
		 * so the driver copies while the sink works on this one. */
		if (next < n)
			rc = issue_dtoh(x, !b, src, n, next);
		if (rc == 0)
			rc = wait_buf(x, b);
		if (rc == 0)
			rc = sink(ud, x->buf[b], chunk_len(x, n, off));
	}
	int rd = drain(x);
	return rc < 0 ? rc : rd;
}

int gf_mem_xfer_write(gf_mem_xfer *x, uint64_t dst, size_t n, gf_mem_xfer_source source, void *ud)
{
	if (!x || !source || (n && !dst))
		return gf_err(GF_ERR_INVALID_ARG, "xfer write: NULL argument");
	if (!x->staged) {
		for (size_t off = 0; off < n; off += x->chunk) {
			gf_mem_populate(dst + off, chunk_len(x, n, off), true);
			int rc = source(ud, (void *)(uintptr_t)(dst + off), chunk_len(x, n, off));
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	const struct gf_mem_backend *be = x->m->be;
	int rc = 0;
	for (size_t off = 0, k = 0; rc == 0 && off < n; off += x->chunk, k++) {
		int b = (int)(k & 1);
		size_t len = chunk_len(x, n, off);
		/* Refill a buffer only once its previous copy to the device is done;
		 * meanwhile the other buffer's copy runs. */
		rc = wait_buf(x, b);
		if (rc == 0)
			rc = source(ud, x->buf[b], len);
		if (rc == 0)
			rc = be->copy_htod(x->m, dst + off, x->buf[b], len, x->stream);
		if (rc == 0)
			rc = be->event_record(x->m, x->event[b], x->stream);
		if (rc == 0)
			x->pending[b] = true;
	}
	int rd = drain(x);
	return rc < 0 ? rc : rd;
}

/* The read/write fallback of fill_from_file: through one chunk-sized buffer. */
static int fill_by_copy(gf_mem_xfer *x, int dst, uint64_t dst_off, int src, uint64_t *src_off, size_t n)
{
	if (!x->bounce && !(x->bounce = malloc(x->chunk)))
		return gf_err(GF_ERR_NOMEM, "xfer: out of memory for a %zu-byte buffer", x->chunk);
	while (n) {
		size_t want = n < x->chunk ? n : x->chunk;
		ssize_t r = pread(src, x->bounce, want, (off_t)*src_off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return gf_err_errno(GF_ERR_IO, errno, "xfer: read at byte %llu", (unsigned long long)*src_off);
		if (r == 0)
			return gf_err(GF_ERR_PROTOCOL, "xfer: the file ends at byte %llu (truncated while reading)",
				      (unsigned long long)*src_off);
		for (size_t done = 0; done < (size_t)r;) {
			ssize_t w = pwrite(dst, x->bounce + done, (size_t)r - done, (off_t)(dst_off + done));
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				return gf_err_errno(w < 0 && errno == ENOMEM ? GF_ERR_OUT_OF_MEMORY : GF_ERR_IO,
						    w < 0 ? errno : ENOSPC, "xfer: write into the allocation");
			done += (size_t)w;
		}
		*src_off += (uint64_t)r;
		dst_off += (uint64_t)r;
		n -= (size_t)r;
	}
	return 0;
}

/* Drain what the pipe holds into @dst at *@dst_off. */
static int drain_pipe(gf_mem_xfer *x, int dst, loff_t *dst_off, size_t held)
{
	while (held) {
		ssize_t w = splice(x->pipe[0], NULL, dst, dst_off, held, SPLICE_F_MOVE);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return gf_err_errno(w < 0 && errno == ENOMEM ? GF_ERR_OUT_OF_MEMORY : GF_ERR_IO,
					    w < 0 ? errno : ENOSPC, "xfer: splice into the allocation");
		held -= (size_t)w;
	}
	return 0;
}

bool gf_mem_xfer_files(const gf_mem_xfer *x)
{
	return x && (x->m->be->caps & GF_MEM_CAP_FILES) && x->m->be->export_borrow;
}

int gf_mem_xfer_fill_from_file(gf_mem_xfer *x, gf_mem_alloc *a, uint64_t a_off, int src_fd, uint64_t *src_off,
			       size_t n)
{
	if (!x || !a || src_fd < 0 || !src_off)
		return gf_err(GF_ERR_INVALID_ARG, "xfer fill: NULL argument");
	int dst;
	bool owned;
	if (!gf_mem_xfer_files(x))
		return gf_err(GF_ERR_NOT_SUPPORTED, "xfer fill: %s allocations are not files", x->m->be->name);
	int rc = gf_mem_export_borrowed(a, &dst, &owned);
	if (rc < 0)
		return rc;
	if (x->pipe[0] < 0 && pipe2(x->pipe, O_CLOEXEC) == 0)
		fcntl(x->pipe[1], F_SETPIPE_SZ, 1 << 20); /* fewer round trips; the default 64 KiB works too */
	loff_t in = (loff_t)*src_off, out = (loff_t)a_off;
	/* From a disk: ask for this range and the next one in large reads now.
	 * splice alone reads a pipe's worth at a time within the readahead
	 * window, slower on a cold cache than one big read() (and the disk
	 * would idle while the caller hashes). A hint: failure changes nothing. */
	(void)posix_fadvise(src_fd, in, (off_t)(2 * (uint64_t)n), POSIX_FADV_WILLNEED);
	while (n && x->pipe[0] >= 0) {
		ssize_t r = splice(src_fd, &in, x->pipe[1], NULL, n, SPLICE_F_MOVE);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EINVAL || errno == ENOSYS) && (uint64_t)in == *src_off)
			break; /* this file system does not splice: copy instead */
		if (r < 0)
			return gf_err_errno(GF_ERR_IO, errno, "xfer: splice at byte %llu", (unsigned long long)in);
		if (r == 0)
			return gf_err(GF_ERR_PROTOCOL, "xfer: the file ends at byte %llu (truncated while reading)",
				      (unsigned long long)in);
		rc = drain_pipe(x, dst, &out, (size_t)r);
		if (rc < 0) {
			/* Bytes may be left in the pipe: never let a later fill read them. */
			gf_close(x->pipe[0]);
			gf_close(x->pipe[1]);
			x->pipe[0] = x->pipe[1] = -1;
			return rc;
		}
		*src_off = (uint64_t)in;
		n -= (size_t)r;
	}
	return n ? fill_by_copy(x, dst, (uint64_t)out, src_fd, src_off, n) : 0;
}
