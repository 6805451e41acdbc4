/* SPDX-License-Identifier: Apache-2.0 */
#include <string.h>

#include "listchunk.h"
#include "wire.h"

enum { WT_VARINT = 0, WT_LEN = 2 };

static size_t varint_size(uint64_t v)
{
	size_t n = 1;
	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

static uint8_t *put_tag(uint8_t *p, uint32_t field, int wt)
{
	return put_varint(p, (uint64_t)field << 3 | (uint64_t)wt);
}

/* A varint field, left out when 0 (proto3). */
static size_t uint_size(uint32_t field, uint64_t v)
{
	return v ? varint_size((uint64_t)field << 3) + varint_size(v) : 0;
}

static uint8_t *put_uint(uint8_t *p, uint32_t field, uint64_t v)
{
	if (!v)
		return p;
	return put_varint(put_tag(p, field, WT_VARINT), v);
}

/* A length-delimited field, left out when empty (proto3 string/bytes). */
static size_t bytes_size(uint32_t field, size_t len)
{
	return len ? varint_size((uint64_t)field << 3) + varint_size(len) + len : 0;
}

static uint8_t *put_bytes(uint8_t *p, uint32_t field, const void *b, size_t len)
{
	if (!len)
		return p;
	p = put_varint(put_tag(p, field, WT_LEN), len);
	memcpy(p, b, len);
	return p + len;
}

/* A submessage field: always present, even when empty (nanopb writes repeated entries that way). */
static size_t sub_size(uint32_t field, size_t body)
{
	return varint_size((uint64_t)field << 3) + varint_size(body) + body;
}

static size_t alloc_body(const struct gf_lc_alloc *a, size_t taglen)
{
	return uint_size(gf_GmsAllocation_id_tag, a->id) + uint_size(gf_GmsAllocation_size_tag, a->size) +
	       uint_size(gf_GmsAllocation_requested_tag, a->requested) + bytes_size(gf_GmsAllocation_tag_tag, taglen);
}

static size_t meta_body(const struct gf_lc_meta *m, size_t keylen)
{
	return bytes_size(gf_GmsMetaEntry_key_tag, keylen) + uint_size(gf_GmsMetaEntry_allocation_id_tag, m->alloc_id) +
	       uint_size(gf_GmsMetaEntry_offset_tag, m->offset) + bytes_size(gf_GmsMetaEntry_value_tag, m->value_len);
}

int gf_lc_encode(const struct gf_lc_chunk *c, uint8_t *buf, size_t cap, size_t *len)
{
	if (c->nallocs > GF_LIMIT_CHUNK_ALLOCS || c->nmeta > GF_LIMIT_CHUNK_META)
		return gf_err(GF_ERR_INVALID_ARG, "list chunk: %zu allocations / %zu metadata exceed %d / %d",
			      c->nallocs, c->nmeta, GF_LIMIT_CHUNK_ALLOCS, GF_LIMIT_CHUNK_META);
	/* Lengths once: the sizing pass and the writing pass both need them. */
	size_t taglen[GF_LIMIT_CHUNK_ALLOCS], keylen[GF_LIMIT_CHUNK_META];
	size_t body = 0;
	for (size_t i = 0; i < c->nallocs; i++) {
		taglen[i] = strlen(c->allocs[i].tag);
		if (taglen[i] >= GF_LIMIT_TAG)
			return gf_err(GF_ERR_INVALID_ARG, "list chunk: tag of %zu bytes", taglen[i]);
		body += sub_size(gf_GmsListChunk_allocations_tag, alloc_body(&c->allocs[i], taglen[i]));
	}
	for (size_t i = 0; i < c->nmeta; i++) {
		keylen[i] = strlen(c->meta[i].key);
		if (keylen[i] >= GF_LIMIT_META_KEY || c->meta[i].value_len > GF_LIMIT_META_VALUE)
			return gf_err(GF_ERR_INVALID_ARG, "list chunk: key of %zu or value of %zu bytes", keylen[i],
				      c->meta[i].value_len);
		body += sub_size(gf_GmsListChunk_metadata_tag, meta_body(&c->meta[i], keylen[i]));
	}
	body += uint_size(gf_GmsListChunk_last_tag, c->last) + uint_size(gf_GmsListChunk_generation_tag, c->generation) +
		bytes_size(gf_GmsListChunk_layout_hash_tag, c->hash ? 16 : 0) +
		uint_size(gf_GmsListChunk_total_allocations_tag, c->total_allocations) +
		uint_size(gf_GmsListChunk_total_metadata_tag, c->total_metadata) +
		uint_size(gf_GmsListChunk_metadata_blob_size_tag, c->metadata_blob_size);
	size_t total = uint_size(gf_Msg_seq_tag, c->seq) + sub_size(gf_Msg_gms_list_chunk_tag, body);
	if (total > cap)
		return gf_err(GF_ERR_TOO_BIG, "list chunk: %zu bytes exceed %zu", total, cap);

	uint8_t *p = put_uint(buf, gf_Msg_seq_tag, c->seq);
	p = put_varint(put_tag(p, gf_Msg_gms_list_chunk_tag, WT_LEN), body);
	for (size_t i = 0; i < c->nallocs; i++) {
		const struct gf_lc_alloc *a = &c->allocs[i];
		p = put_varint(put_tag(p, gf_GmsListChunk_allocations_tag, WT_LEN), alloc_body(a, taglen[i]));
		p = put_uint(p, gf_GmsAllocation_id_tag, a->id);
		p = put_uint(p, gf_GmsAllocation_size_tag, a->size);
		p = put_uint(p, gf_GmsAllocation_requested_tag, a->requested);
		p = put_bytes(p, gf_GmsAllocation_tag_tag, a->tag, taglen[i]);
	}
	for (size_t i = 0; i < c->nmeta; i++) {
		const struct gf_lc_meta *m = &c->meta[i];
		p = put_varint(put_tag(p, gf_GmsListChunk_metadata_tag, WT_LEN), meta_body(m, keylen[i]));
		p = put_bytes(p, gf_GmsMetaEntry_key_tag, m->key, keylen[i]);
		p = put_uint(p, gf_GmsMetaEntry_allocation_id_tag, m->alloc_id);
		p = put_uint(p, gf_GmsMetaEntry_offset_tag, m->offset);
		p = put_bytes(p, gf_GmsMetaEntry_value_tag, m->value, m->value_len);
	}
	p = put_uint(p, gf_GmsListChunk_last_tag, c->last);
	p = put_uint(p, gf_GmsListChunk_generation_tag, c->generation);
	p = put_bytes(p, gf_GmsListChunk_layout_hash_tag, c->hash, c->hash ? 16 : 0);
	p = put_uint(p, gf_GmsListChunk_total_allocations_tag, c->total_allocations);
	p = put_uint(p, gf_GmsListChunk_total_metadata_tag, c->total_metadata);
	p = put_uint(p, gf_GmsListChunk_metadata_blob_size_tag, c->metadata_blob_size);
	*len = (size_t)(p - buf);
	return 0;
}
