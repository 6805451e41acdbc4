/* SPDX-License-Identifier: Apache-2.0 */
/*
 * XXH3-64 of a byte stream computed on a helper thread, so that hashing a
 * chunk overlaps the file I/O of the same (snapshot) or the next (restore)
 * chunk instead of adding to it. Chunks are hashed in submission order; a
 * submitted buffer must stay readable and unchanged until the next
 * tiers_hasher_submit(), tiers_hasher_wait() or tiers_hasher_digest() returns.
 * When the thread cannot be started, every call hashes inline instead.
 * One user thread at a time.
 */
#ifndef GF_TIERS_HASHER_H
#define GF_TIERS_HASHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tiers_hasher;

/* 0 or GF_ERR_NOMEM. */
int tiers_hasher_new(struct tiers_hasher **out);
/* Waits for the last chunk and stops the thread. NULL is a no-op. */
void tiers_hasher_free(struct tiers_hasher *h);
/* Start a new stream (waits for the previous one's last chunk). */
void tiers_hasher_reset(struct tiers_hasher *h);
/* Wait until the previous chunk is hashed, then hand over @buf. */
void tiers_hasher_submit(struct tiers_hasher *h, const void *buf, size_t n);
/*
 * As tiers_hasher_submit(), and: with @fault_in, @buf is a fresh host mapping
 * whose page tables the helper fills first (so that work leaves the
 * caller's thread too); with @digest_out, this chunk ends the stream: the
 * digest is stored there once hashed (read it after the next wait) and the
 * next chunk starts a new stream.
 */
void tiers_hasher_submit_ex(struct tiers_hasher *h, const void *buf, size_t n, bool fault_in, uint64_t *digest_out);
/*
 * Chunks tiers_hasher_queue() may have waiting: 8 of GF_MEM_XFER_CHUNK, 64 MiB
 * of slack, so a hasher held up for a while by a busy second core falls
 * behind the I/O instead of stopping it.
 */
#define TIERS_HASHER_QUEUE 8
/*
 * As tiers_hasher_submit_ex(), but returns as soon as fewer than
 * TIERS_HASHER_QUEUE chunks are waiting: @buf must stay readable and
 * unchanged until tiers_hasher_wait(), tiers_hasher_digest() or
 * tiers_hasher_reset() returns (a mapping of the whole source, not a buffer
 * that is refilled).
 */
void tiers_hasher_queue(struct tiers_hasher *h, const void *buf, size_t n, bool fault_in, uint64_t *digest_out);
/*
 * As tiers_hasher_queue(), for @n bytes of the file @fd from @off: the helper
 * reads them whole into @dst (the caller's, at least @n bytes) and hashes
 * them there, while they are in its cache, so the caller can then use
 * exactly the bytes that were hashed. Returns the chunk's ticket: @dst must
 * not be touched until tiers_hasher_wait_for() of it returned (0: the bytes
 * are there), and @fd must stay open until then. The first read that fails
 * (its errno) or ends early (ENODATA) is remembered, see
 * tiers_hasher_read_error(); file chunks after it are not read and the
 * digest is meaningless.
 */
uint64_t tiers_hasher_queue_read(struct tiers_hasher *h, int fd, uint64_t off, size_t n, void *dst, uint64_t *digest_out);
/* Wait until the chunk with @ticket (and those before it) is hashed; then the
 * errno of the first failed read so far, as tiers_hasher_read_error(), 0 if none. */
int tiers_hasher_wait_for(struct tiers_hasher *h, uint64_t ticket);
/* Waits, then the errno of the first failed read of a file chunk since the hasher was made, 0 if none. */
int tiers_hasher_read_error(struct tiers_hasher *h);
/* Wait until every submitted chunk is hashed. */
void tiers_hasher_wait(struct tiers_hasher *h);
/* tiers_hasher_wait(), then the digest of the stream so far. */
uint64_t tiers_hasher_digest(struct tiers_hasher *h);

#endif
