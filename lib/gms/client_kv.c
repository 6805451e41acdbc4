/* SPDX-License-Identifier: Apache-2.0 */
/* The KV pool from the holder's side (docs/gms.md, "The KV pool"): map, publish, read the directory. */
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "schema_limits.h"

int gf_gms_kv_map(gf_gms *gms, const struct gf_lock_proof *proof, uint64_t size, uint64_t block_bytes,
		  const uint8_t layout_hash[16], uint64_t previous_epoch, int *fd, struct gf_gms_kv_map_info *info)
{
	if (!gms || !proof || !layout_hash || !fd)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_kv_map: NULL argument");
	if (proof->epoch == 0 || size == 0 || block_bytes == 0 || block_bytes > size)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_kv_map: epoch %llu, size %llu, block %llu bytes",
			      (unsigned long long)proof->epoch, (unsigned long long)size, (unsigned long long)block_bytes);
	int rc = gms_client_check_usable(gms);
	if (rc < 0)
		return rc;
	memset(gms->msg, 0, sizeof(*gms->msg));
	gms->msg->which_body = gf_Msg_gms_kv_map_tag;
	gf_GmsKvMap *r = &gms->msg->body.gms_kv_map;
	r->size = size;
	r->block_bytes = block_bytes;
	memcpy(r->layout_hash.bytes, layout_hash, 16);
	r->layout_hash.size = 16;
	r->lock_epoch = proof->epoch;
	memcpy(r->lock_proof.bytes, proof->token, GF_LOCK_PROOF_LEN);
	r->lock_proof.size = GF_LOCK_PROOF_LEN;
	r->previous_epoch = previous_epoch;
	int *fds = NULL;
	size_t nfds = 0;
	/* The GMS asks the lock server first (FENCE_QUERY_MS on its side). */
	rc = gms_client_request(gms, &fds, &nfds, gf_now_us() + GMS_IO_TIMEOUT_US);
	if (rc < 0)
		return rc;
	if (gms->msg->which_body != gf_Msg_gms_kv_mapped_tag || nfds != 1) {
		gf_close_fds(fds, nfds);
		free(fds);
		return gf_err(GF_ERR_PROTOCOL, "KV map: expected gms_kv_mapped with one fd, got %s with %zu",
			      gf_msg_name(gms->msg), nfds);
	}
	const gf_GmsKvMapped *o = &gms->msg->body.gms_kv_mapped;
	if (info) {
		memset(info, 0, sizeof(*info));
		info->size = o->size;
		info->previous_epoch = o->previous_epoch;
		info->blocks = o->blocks;
		info->created = o->created;
		memcpy(info->start, o->start, sizeof(info->start) - 1);
	}
	*fd = fds[0];
	free(fds);
	return 0;
}

/* One GmsKvPublish; @add and @remove at most GF_LIMIT_KV_BATCH each. */
static int publish_one(gf_gms *gms, uint64_t epoch, bool clear, const struct gf_gms_kv_block *add, size_t nadd,
		       const uint32_t *remove, size_t nremove)
{
	memset(gms->msg, 0, sizeof(*gms->msg));
	gms->msg->which_body = gf_Msg_gms_kv_publish_tag;
	gf_GmsKvPublish *r = &gms->msg->body.gms_kv_publish;
	r->epoch = epoch;
	r->clear = clear;
	for (size_t i = 0; i < nadd; i++) {
		r->add[i].index = add[i].index;
		r->add[i].hash.size = (pb_size_t)add[i].hash_len;
		if (add[i].hash_len)
			memcpy(r->add[i].hash.bytes, add[i].hash, add[i].hash_len);
	}
	r->add_count = (pb_size_t)nadd;
	if (nremove)
		memcpy(r->remove, remove, nremove * sizeof(*remove));
	r->remove_count = (pb_size_t)nremove;
	int rc = gms_client_request(gms, NULL, NULL, gf_now_us() + GMS_IO_TIMEOUT_US);
	if (rc < 0)
		return rc;
	if (gms->msg->which_body != gf_Msg_ok_tag)
		return gf_err(GF_ERR_PROTOCOL, "KV publish: expected ok, got %s", gf_msg_name(gms->msg));
	return 0;
}

int gf_gms_kv_publish(gf_gms *gms, uint64_t epoch, int clear, const struct gf_gms_kv_block *add, size_t nadd,
		      const uint32_t *remove, size_t nremove)
{
	if (!gms || (nadd && !add) || (nremove && !remove) || epoch == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_kv_publish: NULL argument or epoch 0");
	for (size_t i = 0; i < nadd; i++)
		if (add[i].hash_len == 0 || add[i].hash_len > GF_LIMIT_KV_HASH)
			return gf_err(GF_ERR_INVALID_ARG, "gf_gms_kv_publish: block %u has a hash of %u bytes (1..%d)",
				      add[i].index, add[i].hash_len, GF_LIMIT_KV_HASH);
	int rc = gms_client_check_usable(gms);
	if (rc < 0)
		return rc;
	/* Removals first: a block leaves the directory before anything writes it again. */
	bool first = true;
	for (size_t i = 0; i < nremove || (first && !nadd); i += GF_LIMIT_KV_BATCH) {
		size_t n = nremove - i < GF_LIMIT_KV_BATCH ? nremove - i : GF_LIMIT_KV_BATCH;
		if ((rc = publish_one(gms, epoch, first && clear, NULL, 0, remove + i, n)) < 0)
			return rc;
		first = false;
	}
	for (size_t i = 0; i < nadd; i += GF_LIMIT_KV_BATCH) {
		size_t n = nadd - i < GF_LIMIT_KV_BATCH ? nadd - i : GF_LIMIT_KV_BATCH;
		if ((rc = publish_one(gms, epoch, first && clear, add + i, n, NULL, 0)) < 0)
			return rc;
		first = false;
	}
	return 0;
}

int gf_gms_kv_directory(gf_gms *gms, struct gf_gms_kv_block **blocks, size_t *n, uint64_t *epoch)
{
	if (!gms || !blocks || !n)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_kv_directory: NULL argument");
	int rc = gms_client_check_usable(gms);
	if (rc < 0)
		return rc;
	struct gf_gms_kv_block *out = NULL;
	size_t count = 0, cap = 0;
	uint32_t from = 0;
	uint64_t owner = 0;
	for (;;) {
		memset(gms->msg, 0, sizeof(*gms->msg));
		gms->msg->which_body = gf_Msg_gms_kv_dir_request_tag;
		gms->msg->body.gms_kv_dir_request.from = from;
		rc = gms_client_request(gms, NULL, NULL, gf_now_us() + GMS_IO_TIMEOUT_US);
		if (rc == 0 && gms->msg->which_body != gf_Msg_gms_kv_dir_tag)
			rc = gf_err(GF_ERR_PROTOCOL, "KV directory: expected gms_kv_dir, got %s", gf_msg_name(gms->msg));
		if (rc < 0) {
			free(out);
			return rc;
		}
		const gf_GmsKvDir *d = &gms->msg->body.gms_kv_dir;
		if (from == 0)
			owner = d->epoch;
		if (count + d->blocks_count > cap) {
			size_t ncap = cap ? cap * 2 : 256;
			while (ncap < count + d->blocks_count)
				ncap *= 2;
			struct gf_gms_kv_block *nb = realloc(out, ncap * sizeof(*nb));
			if (!nb) {
				free(out);
				return gf_err(GF_ERR_NOMEM, "KV directory: out of memory");
			}
			out = nb;
			cap = ncap;
		}
		for (pb_size_t i = 0; i < d->blocks_count; i++) {
			struct gf_gms_kv_block *b = &out[count++];
			memset(b, 0, sizeof(*b));
			b->index = d->blocks[i].index;
			b->hash_len = d->blocks[i].hash.size;
			memcpy(b->hash, d->blocks[i].hash.bytes, d->blocks[i].hash.size);
		}
		if (d->next == 0 || d->next <= from)
			break;
		from = d->next;
	}
	*blocks = out;
	*n = count;
	if (epoch)
		*epoch = owner;
	return 0;
}
