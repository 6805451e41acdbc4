/* SPDX-License-Identifier: Apache-2.0 */
#include <string.h>

#include <xxhash.h>

#include "layout.h"

static void put_u64(XXH3_state_t *s, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	XXH3_128bits_update(s, b, sizeof(b));
}

int gms_layout_hash(const uint64_t *sizes, size_t n, const struct gms_layout_meta *meta, size_t m,
		    uint8_t out[16])
{
	/* The state is heap-allocated: its layout is private to the shared libxxhash. */
	XXH3_state_t *st = XXH3_createState();
	static const char domain[] = "gpufailover-gms-layout-v1";
	if (!st)
		return -1;
	XXH3_state_t *const s = st;
	XXH3_128bits_reset(s);
	XXH3_128bits_update(s, domain, sizeof(domain));
	put_u64(s, n);
	for (size_t i = 0; i < n; i++)
		put_u64(s, sizes[i]);
	put_u64(s, m);
	for (size_t i = 0; i < m; i++) {
		size_t kl = strlen(meta[i].key);
		/* Lengths first, so "ab"+"c" and "a"+"bc" never collide by construction. */
		put_u64(s, kl);
		XXH3_128bits_update(s, meta[i].key, kl);
		put_u64(s, meta[i].alloc_index);
		put_u64(s, meta[i].offset);
		put_u64(s, meta[i].value_len);
		if (meta[i].value_len)
			XXH3_128bits_update(s, meta[i].value, meta[i].value_len);
	}
	XXH128_hash_t h = XXH3_128bits_digest(s);
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, h);
	memcpy(out, c.digest, 16);
	XXH3_freeState(st);
	return 0;
}
