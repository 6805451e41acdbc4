/* SPDX-License-Identifier: Apache-2.0 */
/* Chunked, double-buffered transfers between mappings and host code (xfer.h). */
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

bool gf_mem_xfer_files(const gf_mem_xfer *x)
{
	return x && (x->m->be->caps & GF_MEM_CAP_FILES) && x->m->be->export_borrow;
}
