/* SPDX-License-Identifier: Apache-2.0 */
/* Streaming XXH3-64 built for AVX2 (xxh3_avx2.c); hasher.c calls it only on CPUs that have AVX2. */
#ifndef GF_TIERS_XXH3_FAST_H
#define GF_TIERS_XXH3_FAST_H

#include <stddef.h>
#include <stdint.h>

void *tiers_xxh3_avx2_new(void); /* NULL when out of memory */
void tiers_xxh3_avx2_free(void *st);
void tiers_xxh3_avx2_reset(void *st);
void tiers_xxh3_avx2_update(void *st, const void *buf, size_t n);
uint64_t tiers_xxh3_avx2_digest(void *st);

#endif
