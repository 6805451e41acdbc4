/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Direct encoder of Msg{seq, gms_list_chunk} from the server's own tables.
 * nanopb would need the 47 KB gf_GmsListChunk filled (memset, key and value
 * copies) and walks every entry three to four times (one sizing pass for the
 * frame, one per enclosing submessage); this walks each entry twice with
 * plain arithmetic and writes the same bytes as pb_encode (fields in tag
 * order, proto3 defaults left out), which tests/gms/test_gms_listchunk.c
 * checks against nanopb.
 */
#ifndef GF_WIRE_LISTCHUNK_H
#define GF_WIRE_LISTCHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gf_lc_alloc {
	uint64_t id, size, requested;
	const char *tag; /* NUL-terminated, < GF_LIMIT_TAG bytes */
};

struct gf_lc_meta {
	const char *key; /* NUL-terminated, < GF_LIMIT_META_KEY bytes */
	uint64_t alloc_id, offset;
	const uint8_t *value;
	size_t value_len; /* <= GF_LIMIT_META_VALUE */
};

struct gf_lc_chunk {
	uint32_t seq;
	const struct gf_lc_alloc *allocs;
	size_t nallocs; /* <= GF_LIMIT_CHUNK_ALLOCS */
	const struct gf_lc_meta *meta;
	size_t nmeta;   /* <= GF_LIMIT_CHUNK_META */
	bool last;
	uint64_t generation;
	const uint8_t *hash; /* 16 bytes, or NULL for none */
	uint32_t total_allocations, total_metadata;
	uint64_t metadata_blob_size; /* 0: none */
};

/* Encode @c into @buf (@cap bytes); *@len gets the size. GF_ERR_TOO_BIG when
 * it does not fit, GF_ERR_INVALID_ARG when a count or length exceeds what the
 * receiver's nanopb limits accept. */
int gf_lc_encode(const struct gf_lc_chunk *c, uint8_t *buf, size_t cap, size_t *len);

#endif
