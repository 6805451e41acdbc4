/* SPDX-License-Identifier: Apache-2.0 */
/* The GMS layout hash: XXH3-128 over the structure of a committed layout. */
#ifndef GF_GMS_LAYOUT_H
#define GF_GMS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

struct gms_layout_meta {
	const char *key;
	uint64_t alloc_index; /* position of the allocation in allocation order, not its id */
	uint64_t offset;
	const void *value;
	size_t value_len;
};

/*
 * Hash allocation sizes in order and metadata entries in the given order
 * (the server sorts them by key first, so insertion order does not matter).
 * Bytes inside the allocations are not hashed: the hash says "same
 * structure", which is what a sleeping reader needs to remap at the same
 * addresses. Output is the canonical big-endian XXH128 form.
 * Returns 0, or -1 when out of memory.
 */
int gms_layout_hash(const uint64_t *sizes, size_t n, const struct gms_layout_meta *meta, size_t m,
		    uint8_t out[16]);

#endif
