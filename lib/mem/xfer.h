/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bulk transfers between a mapped range of a reservation and host code, in
 * chunks: what snapshots and restores stream to and from files.
 *
 * On host the mapping is host memory, so the callbacks get pointers into it
 * (no copy). On cuda the bytes go through two pinned staging buffers on one
 * stream: while the callback consumes (or fills) one buffer, the driver
 * copies the next chunk into (or out of) the other, so file I/O and
 * device copies overlap.
 */
#ifndef GF_MEM_XFER_H
#define GF_MEM_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpufailover/mem.h"

typedef struct gf_mem_xfer gf_mem_xfer;

/* Takes @n bytes that came from the device; returns 0 or a GF_ERR_* code (stops the transfer). */
typedef int (*gf_mem_xfer_sink)(void *ud, const void *buf, size_t n);
/* Fills @buf with the next @n bytes for the device; returns 0 or a GF_ERR_* code. */
typedef int (*gf_mem_xfer_source)(void *ud, void *buf, size_t n);

/* Default chunk: large enough for full-speed copies, small enough that two fit anywhere. */
#define GF_MEM_XFER_CHUNK (8u << 20)

/*
 * A transfer context for @m with chunks of @chunk bytes (0: the default).
 * On cuda it owns two pinned host buffers, one stream and two events.
 * Errors: GF_ERR_NOMEM, GF_ERR_OUT_OF_MEMORY (pinned memory), GF_ERR_DRIVER.
 */
int gf_mem_xfer_new(gf_mem *m, size_t chunk, gf_mem_xfer **out);
/* Waits for copies still in flight, then frees. NULL is a no-op. */
void gf_mem_xfer_free(gf_mem_xfer *x);
/* Whether this context copies through staging buffers (cuda) or hands out the mapping itself (host). */
int gf_mem_xfer_staged(const gf_mem_xfer *x);
/*
 * Stream @n bytes at address @src (inside a readable mapping of @x's
 * backend) to @sink, in order, chunk by chunk. Blocks. On an error the
 * copies in flight are waited for before returning.
 */
int gf_mem_xfer_read(gf_mem_xfer *x, uint64_t src, size_t n, gf_mem_xfer_sink sink, void *ud);
/* Fill @n bytes at address @dst (inside a read-write mapping) from @source, in order. Blocks until the last copy landed. */
int gf_mem_xfer_write(gf_mem_xfer *x, uint64_t dst, size_t n, gf_mem_xfer_source source, void *ud);

/* Whether @x's backend lends each allocation's own fd as a file of its bytes
 * (host memfds), so a copy can write into it with pwrite instead of through a mapping. */
bool gf_mem_xfer_files(const gf_mem_xfer *x);

/*
 * Fault in the page tables of [@addr, @addr + @n) of a host mapping in one
 * call (MADV_POPULATE_*), several times cheaper than a fault per page. A
 * hint: kernels without it fault as usual.
 */
void gf_mem_populate(uint64_t addr, size_t n, bool write);

#endif
