/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The direct list-chunk encoder (lib/wire/listchunk.c) against
 * nanopb: the same bytes as gf_msg_encode() of the equivalent gf_Msg for
 * empty, small, extreme and full chunks, a clean decode, and its limits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../common/testutil.h"

#include "listchunk.h"
#include "wire.h"

static uint64_t rng = 88172645463325252ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Varied magnitudes: zero (left out by proto3), one byte, huge. */
static uint64_t pick(void)
{
	switch (next_rand() % 4) {
	case 0:
		return 0;
	case 1:
		return next_rand() % 128;
	case 2:
		return UINT64_MAX - next_rand() % 3;
	default:
		return next_rand() >> (next_rand() % 64);
	}
}

struct sample {
	struct gf_lc_alloc a[GF_LIMIT_CHUNK_ALLOCS];
	struct gf_lc_meta m[32];
	char tags[GF_LIMIT_CHUNK_ALLOCS][64];
	char keys[32][256];
	uint8_t values[32][1024];
	uint8_t hash[16];
	struct gf_lc_chunk c;
};

static void fill(struct sample *s, size_t na, size_t nm, size_t keylen, size_t valuelen, bool with_hash)
{
	memset(s, 0, sizeof(*s));
	for (size_t i = 0; i < na; i++) {
		size_t tl = next_rand() % 64;
		memset(s->tags[i], 'a' + (int)(i % 26), tl);
		s->tags[i][tl] = 0;
		s->a[i] = (struct gf_lc_alloc){pick(), pick(), pick(), s->tags[i]};
	}
	for (size_t i = 0; i < nm; i++) {
		size_t kl = keylen ? keylen : 1 + next_rand() % 255;
		for (size_t j = 0; j < kl; j++)
			s->keys[i][j] = (char)(' ' + next_rand() % 94);
		s->keys[i][kl] = 0;
		size_t vl = valuelen != SIZE_MAX ? valuelen : next_rand() % 1025;
		for (size_t j = 0; j < vl; j++)
			s->values[i][j] = (uint8_t)next_rand();
		s->m[i] = (struct gf_lc_meta){s->keys[i], pick(), pick(), s->values[i], vl};
	}
	for (int i = 0; i < 16; i++)
		s->hash[i] = (uint8_t)next_rand();
	s->c = (struct gf_lc_chunk){
		.seq = (uint32_t)pick(),
		.allocs = s->a,
		.nallocs = na,
		.meta = s->m,
		.nmeta = nm,
		.last = next_rand() % 2,
		.generation = pick(),
		.hash = with_hash ? s->hash : NULL,
		.total_allocations = (uint32_t)pick(),
		.total_metadata = (uint32_t)pick(),
	};
}

/* The equivalent message, as the server used to build it for nanopb. */
static void to_msg(const struct gf_lc_chunk *c, gf_Msg *m)
{
	memset(m, 0, sizeof(*m));
	m->seq = c->seq;
	m->which_body = gf_Msg_gms_list_chunk_tag;
	gf_GmsListChunk *ch = &m->body.gms_list_chunk;
	for (size_t i = 0; i < c->nallocs; i++) {
		gf_GmsAllocation *o = &ch->allocations[ch->allocations_count++];
		o->id = c->allocs[i].id;
		o->size = c->allocs[i].size;
		o->requested = c->allocs[i].requested;
		snprintf(o->tag, sizeof(o->tag), "%s", c->allocs[i].tag);
	}
	for (size_t i = 0; i < c->nmeta; i++) {
		gf_GmsMetaEntry *e = &ch->metadata[ch->metadata_count++];
		snprintf(e->key, sizeof(e->key), "%s", c->meta[i].key);
		e->allocation_id = c->meta[i].alloc_id;
		e->offset = c->meta[i].offset;
		memcpy(e->value.bytes, c->meta[i].value, c->meta[i].value_len);
		e->value.size = (pb_size_t)c->meta[i].value_len;
	}
	ch->last = c->last;
	ch->generation = c->generation;
	if (c->hash) {
		memcpy(ch->layout_hash.bytes, c->hash, 16);
		ch->layout_hash.size = 16;
	}
	ch->total_allocations = c->total_allocations;
	ch->total_metadata = c->total_metadata;
}

static void check_same(const struct gf_lc_chunk *c)
{
	static uint8_t buf[GF_FRAME_MAX_BODY];
	size_t len = 0;
	assert_int_equal(gf_lc_encode(c, buf, sizeof(buf), &len), 0);
	gf_Msg *m = gf_msg_new(), *back = gf_msg_new();
	assert_non_null(m);
	assert_non_null(back);
	to_msg(c, m);
	uint8_t *ref;
	size_t ref_len;
	assert_int_equal(gf_msg_encode(m, &ref, &ref_len), 0);
	assert_int_equal(len, ref_len);
	assert_memory_equal(buf, ref, len);
	free(ref);
	assert_int_equal(gf_msg_decode(buf, len, back), 0);
	assert_int_equal(back->which_body, gf_Msg_gms_list_chunk_tag);
	assert_int_equal(back->body.gms_list_chunk.allocations_count, c->nallocs);
	assert_int_equal(back->body.gms_list_chunk.metadata_count, c->nmeta);
	for (size_t i = 0; i < c->nmeta; i++) {
		assert_string_equal(back->body.gms_list_chunk.metadata[i].key, c->meta[i].key);
		assert_int_equal(back->body.gms_list_chunk.metadata[i].value.size, c->meta[i].value_len);
	}
	gf_msg_free(m);
	gf_msg_free(back);
}

static void test_empty(void **state)
{
	(void)state;
	struct gf_lc_chunk c = {0};
	check_same(&c);
	c.last = true;
	c.seq = 7;
	check_same(&c);
}

static void test_random(void **state)
{
	(void)state;
	struct sample *s = malloc(sizeof(*s));
	assert_non_null(s);
	for (int round = 0; round < 300; round++) {
		fill(s, next_rand() % 65, next_rand() % 33, 0, SIZE_MAX, next_rand() % 2);
		check_same(&s->c);
		fill(s, next_rand() % (GF_LIMIT_CHUNK_ALLOCS + 1), 0, 0, SIZE_MAX, next_rand() % 2);
		check_same(&s->c);
	}
	free(s);
}

/* The largest chunks the server builds: 64 allocations with 32 entries of
 * maximum key and value, and 240 allocations without metadata (a wake). */
static void test_full(void **state)
{
	(void)state;
	struct sample *s = malloc(sizeof(*s));
	assert_non_null(s);
	fill(s, GF_LIMIT_CHUNK_ALLOCS_WITH_META, 32, 255, 1024, true);
	check_same(&s->c);
	fill(s, GF_LIMIT_CHUNK_ALLOCS, 0, 0, 0, true);
	for (size_t i = 0; i < GF_LIMIT_CHUNK_ALLOCS; i++) {
		memset(s->tags[i], 't', GF_LIMIT_TAG - 1);
		s->tags[i][GF_LIMIT_TAG - 1] = 0;
		s->a[i] = (struct gf_lc_alloc){UINT64_MAX, UINT64_MAX, UINT64_MAX, s->tags[i]};
	}
	check_same(&s->c);
	fill(s, 64, 32, 1, 0, true); /* empty values are left out */
	check_same(&s->c);
	free(s);
}

static void test_limits(void **state)
{
	(void)state;
	struct sample *s = malloc(sizeof(*s));
	assert_non_null(s);
	uint8_t small[64];
	size_t len = 0;
	fill(s, 10, 10, 40, 40, true);
	assert_int_equal(gf_lc_encode(&s->c, small, sizeof(small), &len), GF_ERR_TOO_BIG);
	s->c.nallocs = GF_LIMIT_CHUNK_ALLOCS + 1;
	assert_int_equal(gf_lc_encode(&s->c, small, sizeof(small), &len), GF_ERR_INVALID_ARG);
	s->c.nallocs = 1;
	s->c.nmeta = 33;
	assert_int_equal(gf_lc_encode(&s->c, small, sizeof(small), &len), GF_ERR_INVALID_ARG);
	s->c.nmeta = 1;
	s->m[0].value_len = 1025;
	assert_int_equal(gf_lc_encode(&s->c, small, sizeof(small), &len), GF_ERR_INVALID_ARG);
	free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_random),
		cmocka_unit_test(test_full),
		cmocka_unit_test(test_limits),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
