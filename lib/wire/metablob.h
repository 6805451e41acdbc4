/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The committed metadata as one blob (docs/protocol.md, "Metadata blob"):
 * the GMS writes it once into a sealed memfd and passes that fd with the
 * first list chunk; a reader reads it with one pread and decodes it in
 * place, instead of 32 protobuf entries per chunk.
 *
 * Layout, little endian: a 16-byte header ("GFMB", u32 version 1, u32
 * entry count, u32 0), then per entry u64 allocation id, u64 offset, u16
 * key length (1..255), u16 value length (0..1024), the key, one NUL, the
 * value. Entries are sorted by key (strcmp), keys unique.
 */
#ifndef GF_WIRE_METABLOB_H
#define GF_WIRE_METABLOB_H

#include <stddef.h>
#include <stdint.h>

#include "listchunk.h"

#define GF_MB_VERSION 1
#define GF_MB_HEADER 16
/* 1,000,000 entries of the largest size: refuses a size before reading it. */
#define GF_MB_MAX_BYTES ((uint64_t)GF_MB_HEADER + 1000000ull * (20 + 256 + 1024))

/* Encode @n entries (sorted by key, as the GMS keeps them) into a fresh
 * sealed memfd (write, grow, shrink and further seals refused): *@fd and
 * *@size. GF_ERR_INVALID_ARG (a key or value too long), GF_ERR_NOMEM, GF_ERR_IO. */
int gf_mb_make_memfd(const struct gf_lc_meta *m, size_t n, int *fd, uint64_t *size);

/* Read the blob behind @fd, which must be a memfd sealed against writes,
 * growing and shrinking, of exactly @size bytes, into a malloc'ed buffer
 * (*@buf, the caller frees). GF_ERR_PROTOCOL (not sealed, size differs, too
 * large), GF_ERR_NOMEM, GF_ERR_IO. */
int gf_mb_read_fd(int fd, uint64_t size, uint8_t **buf);

/* Called per entry; key and value point into the buffer (the key
 * NUL-terminated). A negative return stops the decode and is returned. */
typedef int (*gf_mb_fn)(void *ud, const struct gf_lc_meta *e);

/* Check and walk @len bytes of blob: the header, @expect entries, every
 * length within the limits and the buffer, keys NUL-terminated without an
 * inner NUL and strictly ascending, nothing left over. GF_ERR_PROTOCOL
 * names the first problem; nothing is called for a blob that fails before
 * its entries. */
int gf_mb_decode(const uint8_t *buf, size_t len, uint32_t expect, gf_mb_fn fn, void *ud);

#endif
