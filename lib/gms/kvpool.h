/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The KV pool's directory as a pure module (no sockets, no memory backend),
 * as fence.c is for the weight fence: which blocks of the pool hold finished
 * content, whose directory it is, and whether a new holder adopts it. See
 * docs/gms.md, "The KV pool".
 *
 * The directory belongs to the holder that mapped the pool last (its epoch).
 * A new holder adopts it when the layout is the same and the chain holds:
 * its epoch is not older than the directory's and, when it names the holder
 * before it, that one published it. Otherwise it starts empty: a cold cache
 * is slower, a wrong one would answer with another request's tokens.
 */
#ifndef GF_GMS_KVPOOL_H
#define GF_GMS_KVPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GMS_KV_HASH_MAX 48
#define GMS_KV_MAX_BLOCKS (1u << 22) /* bounds the directory's own memory (about 140 MiB at most) */

struct gms_kv_slot {
	uint8_t len; /* 0: the block holds nothing finished */
	uint8_t hash[GMS_KV_HASH_MAX];
};

struct gms_kv_dir {
	uint64_t epoch;       /* the owner: the holder that mapped the pool last (0: none yet) */
	uint8_t layout[16];   /* the owner's KV layout */
	uint64_t block_bytes;
	struct gms_kv_slot *slots; /* one per block of the pool */
	uint32_t nslots, count;
};

enum gms_kv_start {
	GMS_KV_ADOPTED,      /* the new holder keeps the directory */
	GMS_KV_EMPTY_FIRST,  /* nobody published one yet */
	GMS_KV_EMPTY_LAYOUT, /* another layout (or block size) */
	GMS_KV_EMPTY_CHAIN,  /* the holder named as previous did not publish it */
	GMS_KV_STALE,        /* the map's epoch is older than the directory's: refused */
};

/* How a map by @epoch with @layout and @block_bytes (@previous: the holder it names before it, 0: any) starts. */
enum gms_kv_start gms_kv_decide(const struct gms_kv_dir *d, uint64_t epoch, uint64_t previous, const uint8_t layout[16],
				uint64_t block_bytes);
const char *gms_kv_start_name(enum gms_kv_start s);

/* Hand the directory to @epoch as @s says: adopted, or emptied and sized for @pool_size / @block_bytes. GF_ERR_NOMEM. */
int gms_kv_take(struct gms_kv_dir *d, enum gms_kv_start s, uint64_t epoch, const uint8_t layout[16], uint64_t block_bytes,
		uint64_t pool_size);

/* Drop the blocks at @remove (first), then record @add (index and hash each); all or nothing: GF_ERR_INVALID_ARG names the bad entry. */
struct gms_kv_entry {
	uint32_t index;
	uint8_t len;
	const uint8_t *hash;
};
int gms_kv_publish(struct gms_kv_dir *d, bool clear, const uint32_t *remove, size_t nremove, const struct gms_kv_entry *add,
		   size_t nadd);

/* The first finished block at or after @from (nslots: none). */
uint32_t gms_kv_next(const struct gms_kv_dir *d, uint32_t from);

void gms_kv_dir_clear(struct gms_kv_dir *d);

#endif
