/* SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kvpool.h"

enum gms_kv_start gms_kv_decide(const struct gms_kv_dir *d, uint64_t epoch, uint64_t previous, const uint8_t layout[16],
				uint64_t block_bytes)
{
	if (d->epoch && epoch < d->epoch)
		return GMS_KV_STALE;
	if (!d->epoch)
		return GMS_KV_EMPTY_FIRST;
	if (memcmp(d->layout, layout, 16) != 0 || d->block_bytes != block_bytes)
		return GMS_KV_EMPTY_LAYOUT;
	/* The same holder mapping again keeps its own directory. */
	if (epoch != d->epoch && previous && previous != d->epoch)
		return GMS_KV_EMPTY_CHAIN;
	return GMS_KV_ADOPTED;
}

const char *gms_kv_start_name(enum gms_kv_start s)
{
	switch (s) {
	case GMS_KV_ADOPTED:
		return "adopted";
	case GMS_KV_EMPTY_FIRST:
		return "first";
	case GMS_KV_EMPTY_LAYOUT:
		return "layout";
	case GMS_KV_EMPTY_CHAIN:
		return "chain";
	case GMS_KV_STALE:
		return "stale";
	}
	return "?";
}

int gms_kv_take(struct gms_kv_dir *d, enum gms_kv_start s, uint64_t epoch, const uint8_t layout[16], uint64_t block_bytes,
		uint64_t pool_size)
{
	if (s == GMS_KV_STALE)
		return gf_err(GF_ERR_INVALID_ARG, "a stale epoch takes no directory");
	if (s != GMS_KV_ADOPTED) {
		uint64_t n = block_bytes ? pool_size / block_bytes : 0;
		if (n > GMS_KV_MAX_BLOCKS)
			return gf_err(GF_ERR_INVALID_ARG, "KV pool of %llu blocks: at most %u", (unsigned long long)n,
				      GMS_KV_MAX_BLOCKS);
		struct gms_kv_slot *slots = n ? calloc(n, sizeof(*slots)) : NULL;
		if (n && !slots)
			return gf_err(GF_ERR_NOMEM, "KV directory of %llu blocks", (unsigned long long)n);
		free(d->slots);
		d->slots = slots;
		d->nslots = (uint32_t)n;
		d->count = 0;
		memcpy(d->layout, layout, 16);
		d->block_bytes = block_bytes;
	}
	d->epoch = epoch;
	return 0;
}

int gms_kv_publish(struct gms_kv_dir *d, bool clear, const uint32_t *remove, size_t nremove, const struct gms_kv_entry *add,
		   size_t nadd)
{
	for (size_t i = 0; i < nremove; i++)
		if (remove[i] >= d->nslots)
			return gf_err(GF_ERR_INVALID_ARG, "remove: block %u outside the pool's %u", remove[i], d->nslots);
	for (size_t i = 0; i < nadd; i++) {
		if (add[i].index >= d->nslots)
			return gf_err(GF_ERR_INVALID_ARG, "add: block %u outside the pool's %u", add[i].index, d->nslots);
		if (add[i].len == 0 || add[i].len > GMS_KV_HASH_MAX)
			return gf_err(GF_ERR_INVALID_ARG, "add: block %u has a hash of %u bytes (1..%d)", add[i].index,
				      add[i].len, GMS_KV_HASH_MAX);
	}
	if (clear) {
		memset(d->slots, 0, (size_t)d->nslots * sizeof(*d->slots));
		d->count = 0;
	}
	for (size_t i = 0; i < nremove; i++) {
		struct gms_kv_slot *s = &d->slots[remove[i]];
		d->count -= s->len != 0;
		s->len = 0;
	}
	for (size_t i = 0; i < nadd; i++) {
		struct gms_kv_slot *s = &d->slots[add[i].index];
		d->count += s->len == 0;
		s->len = add[i].len;
		memcpy(s->hash, add[i].hash, add[i].len);
	}
	return 0;
}

uint32_t gms_kv_next(const struct gms_kv_dir *d, uint32_t from)
{
	while (from < d->nslots && !d->slots[from].len)
		from++;
	return from;
}

void gms_kv_dir_clear(struct gms_kv_dir *d)
{
	free(d->slots);
	memset(d, 0, sizeof(*d));
}
