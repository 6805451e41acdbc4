/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The KV pool (docs/gms.md, "The KV pool"; docs/design.md, decision 32): one
 * allocation per device that the GMS creates at the first map and keeps, and
 * its directory of finished blocks (kvpool.c decides). Only the lock's
 * current holder maps it, proven by its grant's fence proof, asked of the
 * lock server off the loop as the weight fence is. The mapper's connection
 * owns the mapping: when it closes (the holder died) the pool and its
 * directory stay for the next holder.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

static void kv_cancel(gf_gmsd *d, struct client *c)
{
	if (!c->kv_q)
		return;
	gf_srv_watch_del(d->srv, gf_lock_query_get_fd(c->kv_q));
	gf_lock_query_free(c->kv_q);
	c->kv_q = NULL;
}

static void kv_refuse(gf_gmsd *d, struct client *c, uint32_t seq, int code, const char *detail, uint64_t current)
{
	d->kv.refusals++;
	gmsd_event(d, "event=kv_refused peer=%s pid=%u epoch=%llu lock_epoch=%llu", c->peer, c->pid,
		   (unsigned long long)c->kv_req.lock_epoch, (unsigned long long)current);
	gmsd_reply_error(d, c, seq, code, "KV pool: %s", detail);
}

/* The lock server said @c holds the current grant: create the pool if needed, hand it the directory, send the fd. */
static void kv_grant(gf_gmsd *d, struct client *c)
{
	const gf_GmsKvMap *r = &c->kv_req;
	uint32_t seq = c->kv_seq;
	bool created = false;
	if (!d->kv.a) {
		int rc = gf_mem_create(&d->kv.a, d->mem, r->size);
		if (rc < 0) {
			d->kv.a = NULL;
			gmsd_reply_error(d, c, seq, rc, "KV pool of %llu bytes: %s", (unsigned long long)r->size,
					 gf_error_detail());
			return;
		}
		d->kv.requested = r->size;
		created = true;
		gmsd_event(d, "event=kv_created peer=%s size=%llu", c->peer, (unsigned long long)gf_mem_alloc_size(d->kv.a));
	}
	enum gms_kv_start s = gms_kv_decide(&d->kv.dir, r->lock_epoch, r->previous_epoch, r->layout_hash.bytes,
					    r->block_bytes);
	if (s == GMS_KV_STALE) {
		char why[160];
		snprintf(why, sizeof(why), "epoch %llu is older than the directory's owner (epoch %llu)",
			 (unsigned long long)r->lock_epoch, (unsigned long long)d->kv.dir.epoch);
		kv_refuse(d, c, seq, GF_ERR_PERMISSION, why, d->kv.dir.epoch);
		return;
	}
	uint64_t before = d->kv.dir.epoch;
	int rc = gms_kv_take(&d->kv.dir, s, r->lock_epoch, r->layout_hash.bytes, r->block_bytes, gf_mem_alloc_size(d->kv.a));
	int fd = -1;
	if (rc == 0)
		rc = gf_mem_export(d->kv.a, &fd);
	if (rc < 0) {
		gmsd_reply_error(d, c, seq, rc, "KV pool: %s", gf_error_detail());
		return;
	}
	if (d->kv.mapper && d->kv.mapper != c)
		gmsd_event(d, "event=kv_takeover peer=%s pid=%u from_pid=%u from_epoch=%llu", c->peer, c->pid,
			   d->kv.mapper->pid, (unsigned long long)before);
	d->kv.mapper = c;
	d->kv.maps++;
	d->kv.start = s;
	gmsd_event(d, "event=kv_mapped peer=%s pid=%u epoch=%llu previous=%llu start=%s blocks=%u", c->peer, c->pid,
		   (unsigned long long)r->lock_epoch, (unsigned long long)before, gms_kv_start_name(s), d->kv.dir.count);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = seq;
	d->out->which_body = gf_Msg_gms_kv_mapped_tag;
	gf_GmsKvMapped *o = &d->out->body.gms_kv_mapped;
	o->size = gf_mem_alloc_size(d->kv.a);
	o->epoch = r->lock_epoch;
	o->previous_epoch = before;
	o->blocks = d->kv.dir.count;
	o->created = created;
	snprintf(o->start, sizeof(o->start), "%s", gms_kv_start_name(s));
	gmsd_send_msg(d, c, &fd, 1);
	gf_close(fd);
}

static void on_kv_answer(void *ctx, struct gf_srv_watch *w)
{
	gf_gmsd *d = ctx;
	struct client *c = (struct client *)((char *)w - offsetof(struct client, kv_w));
	struct gf_lock_holder h;
	int rc = gf_lock_query_result(c->kv_q, &h);
	if (rc == GF_ERR_AGAIN)
		return;
	kv_cancel(d, c);
	c->kv_asking = false;
	char why[256];
	if (rc < 0) {
		snprintf(why, sizeof(why), "the lock server (%s) did not answer: %s", d->lock_uri, gf_error_detail());
		kv_refuse(d, c, c->kv_seq, GF_ERR_UNREACHABLE, why, 0);
	} else if (h.epoch != c->kv_req.lock_epoch || !h.proof_valid) {
		snprintf(why, sizeof(why), "only the lock's current holder maps it, with its grant's proof (map epoch %llu, "
			 "lock epoch %llu%s%s)", (unsigned long long)c->kv_req.lock_epoch, (unsigned long long)h.epoch,
			 h.epoch ? "" : ", no holder", h.epoch == c->kv_req.lock_epoch ? ", the proof is not that grant's" : "");
		kv_refuse(d, c, c->kv_seq, GF_ERR_PERMISSION, why, h.epoch);
	} else {
		kv_grant(d, c);
	}
}

void gmsd_handle_kv_map(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsKvMap *r = &m->body.gms_kv_map;
	c->kv_req = *r;
	if (!d->lock_uri) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_NOT_SUPPORTED, "KV pool: this GMS is not fenced by a lock (--lock): "
				 "nobody could prove to be its only writer");
		return;
	}
	if (r->lock_epoch == 0 || r->lock_proof.size != GF_LOCK_PROOF_LEN) {
		kv_refuse(d, c, m->seq, GF_ERR_PERMISSION, "a map needs the holder's lock grant and its proof (a standby "
			  "never maps the pool)", 0);
		return;
	}
	if (r->layout_hash.size != 16 || r->block_bytes == 0 || r->size == 0 || r->block_bytes > r->size) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "KV pool: a map needs a size, a block size within it "
				 "and a 16-byte layout hash (size %llu, block %llu, hash %u bytes)",
				 (unsigned long long)r->size, (unsigned long long)r->block_bytes,
				 (unsigned)r->layout_hash.size);
		return;
	}
	if (d->kv.a && r->size != d->kv.requested) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "KV pool: it is %llu bytes, fixed when it was created; "
				 "this map asks for %llu", (unsigned long long)d->kv.requested,
				 (unsigned long long)r->size);
		return;
	}
	struct gf_lock_proof proof = { .epoch = r->lock_epoch };
	memcpy(proof.token, r->lock_proof.bytes, GF_LOCK_PROOF_LEN);
	int rc = gf_lock_query_start(&c->kv_q, d->lock_uri, d->lock_secret, d->lock_secret_len, &proof, FENCE_QUERY_MS);
	if (rc == 0) {
		c->kv_w.fn = on_kv_answer;
		rc = gf_srv_watch_add(d->srv, gf_lock_query_get_fd(c->kv_q), &c->kv_w);
		if (rc < 0) {
			gf_lock_query_free(c->kv_q);
			c->kv_q = NULL;
		}
	}
	if (rc < 0) {
		gmsd_reply_error(d, c, m->seq, rc, "KV pool: asking the lock server: %s", gf_error_detail());
		return;
	}
	c->kv_asking = true;
	c->kv_seq = m->seq;
}

void gmsd_handle_kv_publish(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsKvPublish *r = &m->body.gms_kv_publish;
	if (d->kv.mapper != c || r->epoch != d->kv.dir.epoch) {
		char why[200];
		snprintf(why, sizeof(why), "publish by epoch %llu refused: the pool is mapped for epoch %llu%s",
			 (unsigned long long)r->epoch, (unsigned long long)d->kv.dir.epoch,
			 d->kv.mapper == c ? "" : " by another connection");
		kv_refuse(d, c, m->seq, GF_ERR_PERMISSION, why, d->kv.dir.epoch);
		return;
	}
	struct gms_kv_entry add[GF_LIMIT_KV_BATCH];
	for (pb_size_t i = 0; i < r->add_count; i++)
		add[i] = (struct gms_kv_entry){ .index = r->add[i].index,
						.len = (uint8_t)r->add[i].hash.size,
						.hash = r->add[i].hash.bytes };
	int rc = gms_kv_publish(&d->kv.dir, r->clear, r->remove, r->remove_count, add, r->add_count);
	if (rc < 0) {
		gmsd_reply_error(d, c, m->seq, rc, "KV publish: %s", gf_error_detail());
		return;
	}
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_ok_tag;
	gmsd_send_msg(d, c, NULL, 0);
}

void gmsd_handle_kv_dir(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const struct gms_kv_dir *dir = &d->kv.dir;
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_gms_kv_dir_tag;
	gf_GmsKvDir *o = &d->out->body.gms_kv_dir;
	o->total = dir->count;
	o->epoch = dir->epoch;
	if (dir->epoch) {
		memcpy(o->layout_hash.bytes, dir->layout, 16);
		o->layout_hash.size = 16;
	}
	uint32_t i = gms_kv_next(dir, m->body.gms_kv_dir_request.from);
	while (i < dir->nslots && o->blocks_count < GF_LIMIT_KV_BATCH) {
		gf_GmsKvBlock *b = &o->blocks[o->blocks_count++];
		b->index = i;
		b->hash.size = dir->slots[i].len;
		memcpy(b->hash.bytes, dir->slots[i].hash, dir->slots[i].len);
		i = gms_kv_next(dir, i + 1);
	}
	o->next = i < dir->nslots ? i : 0;
	gmsd_send_msg(d, c, NULL, 0);
}

void gmsd_kv_closed(gf_gmsd *d, struct client *c)
{
	kv_cancel(d, c);
	c->kv_asking = false;
	if (d->kv.mapper != c)
		return;
	d->kv.mapper = NULL;
	gmsd_event(d, "event=kv_unmapped peer=%s pid=%u epoch=%llu blocks=%u", c->peer, c->pid,
		   (unsigned long long)d->kv.dir.epoch, d->kv.dir.count);
}

void gmsd_kv_fill_status(gf_gmsd *d, gf_GmsStatus *s)
{
	if (!d->kv.a)
		return;
	gf_GmsKvPool *o = &s->kv_pool;
	s->has_kv_pool = true;
	o->size = gf_mem_alloc_size(d->kv.a);
	o->block_bytes = d->kv.dir.block_bytes;
	o->mapped = d->kv.mapper != NULL;
	o->epoch = d->kv.dir.epoch;
	if (d->kv.mapper) {
		o->pid = d->kv.mapper->pid;
		snprintf(o->peer, sizeof(o->peer), "%s", d->kv.mapper->peer);
	}
	o->blocks = d->kv.dir.count;
	o->maps = d->kv.maps;
	o->refusals = d->kv.refusals;
	snprintf(o->start, sizeof(o->start), "%s", gms_kv_start_name(d->kv.start));
	memcpy(o->layout_hash.bytes, d->kv.dir.layout, 16);
	o->layout_hash.size = 16;
}

void gmsd_kv_free(gf_gmsd *d)
{
	gf_mem_alloc_free(d->kv.a);
	d->kv.a = NULL;
	gms_kv_dir_clear(&d->kv.dir);
}
