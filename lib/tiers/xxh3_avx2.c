/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Streaming XXH3-64 compiled with -mavx2 (lib/meson.build): xxhash.h picks
 * its vector code at compile time, and the distribution's library is built
 * for baseline x86-64, at half the speed. hasher.c uses these only when the
 * CPU has AVX2; the digest is the same either way (one algorithm).
 */
#include <stdlib.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "xxh3_fast.h"

void *tiers_xxh3_avx2_new(void)
{
	XXH3_state_t *st = XXH3_createState();
	if (st)
		XXH3_64bits_reset(st);
	return st;
}

void tiers_xxh3_avx2_free(void *st)
{
	XXH3_freeState(st);
}

void tiers_xxh3_avx2_reset(void *st)
{
	XXH3_64bits_reset(st);
}

void tiers_xxh3_avx2_update(void *st, const void *buf, size_t n)
{
	XXH3_64bits_update(st, buf, n);
}

uint64_t tiers_xxh3_avx2_digest(void *st)
{
	return XXH3_64bits_digest(st);
}
