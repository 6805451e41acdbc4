/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS server's policy on the shared server core (lib/wire/server.h):
 * one device. Owns the allocations (never maps them), the metadata table
 * and the lock FSM (fsm.c). Clients wait in the server with their own
 * timeout; every state change marks the waiters for re-evaluation, which
 * the core's settle step runs in FIFO order.
 * Its status and metrics are server_status.c, what its residency tiers ask
 * of it server_tiers.c; what all of them stand on, server_core.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mem_int.h"
#include "fsm.h"
#include "layout.h"
#include "listchunk.h"
#include "metablob.h"
#include "server_int.h"

static void start_list(gf_gmsd *d, struct client *c, uint32_t seq, bool with_fds, bool with_meta, bool blob);
static void do_commit(gf_gmsd *d, struct client *c, uint32_t seq);

static void fill_connected(gf_gmsd *d, gf_GmsConnected *g, int granted)
{
	g->granted = (gf_GmsMode)granted;
	g->state = (gf_GmsState)d->fsm.state;
	g->generation = d->generation;
	if (d->fsm.state == GMS_COMMITTED || d->fsm.state == GMS_RO) {
		memcpy(g->layout_hash.bytes, d->hash, 16);
		g->layout_hash.size = 16;
	}
	snprintf(g->backend, sizeof(g->backend), "%s", gf_mem_kind_name(gf_mem_kind(d->mem)));
	g->device = (uint32_t)d->device;
	snprintf(g->device_uuid, sizeof(g->device_uuid), "%s", d->uuid);
	g->granularity = d->granularity;
	g->oom_retry_ms = d->oom_retry_ms;
	g->takes_progress = true;
	g->no_restore = !tiers_residency_kept(d->res);
}

/* ---------------------------------------------------------------- waiting */

static bool other_rw_waiting(gf_gmsd *d, struct client *self)
{
	/* A fenced GMS with a committed layout: an RW not proven the holder's
	 * yet must not keep readers out (a stray writer would, until its timeout). */
	bool proven_only = d->lock_uri && gms_fsm_rw_would_drop(&d->fsm);
	for (struct client *c = gmsd_next_client(d, NULL); c; c = gmsd_next_client(d, c))
		if (c != self && c->phase == C_WAIT && c->mode == GMS_MODE_RW && (!proven_only || gms_fence_admitted(c->fence)))
			return true;
	return false;
}

/*
 * A GMS fenced by a lock drops its committed layout only for the lock's
 * current holder, proven by the fence proof of its grant (gf_lock_grant_proof()):
 * the epoch alone is public. The lock server is asked each time (a drop is
 * rare: a new load replacing the weights), so a refusal is based on the
 * grant as it is now, revocations included. The query runs on a thread of
 * the lock client and its end is an fd in this loop: the other peers are
 * served meanwhile, and the writer waits in its queue position.
 */
static void fence_cancel(gf_gmsd *d, struct client *c)
{
	if (!c->fence_q)
		return;
	gf_srv_watch_del(d->srv, gf_lock_query_get_fd(c->fence_q));
	gf_lock_query_free(c->fence_q);
	c->fence_q = NULL;
}

static void fence_refuse(gf_gmsd *d, struct client *c, uint64_t current)
{
	d->fence_refusals++;
	gmsd_event(d, "event=rw_refused peer=%s pid=%u epoch=%llu lock_epoch=%llu", c->peer, c->pid,
	      (unsigned long long)c->lock_epoch, (unsigned long long)current);
	c->phase = C_IDLE;
	/* A leaving RW waiter may unblock readers (writer priority). */
	d->changed = true;
}

/*
 * The fence holds at commit too: a writer that came with a lock grant
 * commits only while that grant is still the lock's current one, so a writer
 * revoked mid-load cannot publish its layout. Refused, its load is abandoned
 * as if it had left (the layout dropped), and its session stays.
 */
static void commit_fenced(gf_gmsd *d, struct client *c, int rc, const struct gf_lock_holder *h)
{
	if (rc == 0 && h->epoch == c->lock_epoch && h->proof_valid) {
		do_commit(d, c, c->commit_seq);
		return;
	}
	if (rc < 0)
		gmsd_reply_error(d, c, c->commit_seq, GF_ERR_UNREACHABLE, "commit: the lock server (%s) did not confirm the "
			    "writer's grant: %s; the load is abandoned", d->lock_uri, gf_error_detail());
	else
		gmsd_reply_error(d, c, c->commit_seq, GF_ERR_PERMISSION, "commit: the writer's lock grant (epoch %llu%s) is "
			    "not the lock's current one (epoch %llu); the load is abandoned",
			    (unsigned long long)c->lock_epoch, c->lock_proof.epoch ? "" : ", without a proof",
			    (unsigned long long)h->epoch);
	d->fence_refusals++;
	gmsd_event(d, "event=commit_refused peer=%s pid=%u epoch=%llu lock_epoch=%llu allocations=%zu", c->peer, c->pid,
	      (unsigned long long)c->lock_epoch, rc == 0 ? (unsigned long long)h->epoch : 0ull, d->nallocs);
	gms_fsm_writer_left(&d->fsm);
	gmsd_drop_layout(d, "abort");
	c->phase = C_IDLE;
	gmsd_writer_progress(d); /* no writer from now on */
	d->changed = true;
}

static void on_fence_answer(void *ctx, struct gf_srv_watch *w)
{
	gf_gmsd *d = ctx;
	struct client *c = (struct client *)((char *)w - offsetof(struct client, fence_w));
	struct gf_lock_holder h;
	int rc = gf_lock_query_result(c->fence_q, &h);
	if (rc == GF_ERR_AGAIN)
		return;
	fence_cancel(d, c);
	bool yes = rc == 0 && c->lock_epoch != 0 && h.epoch == c->lock_epoch && h.proof_valid;
	enum gms_fence was = c->fence;
	c->fence = gms_fence_next(was, yes ? GMS_FENCE_YES : GMS_FENCE_NO);
	if (c->phase == C_WRITER && was == GMS_FENCE_COMMITTING) {
		commit_fenced(d, c, rc, &h);
		return;
	}
	if (c->phase != C_WAIT)
		return;
	if (rc < 0) {
		gmsd_reply_error(d, c, c->seq, GF_ERR_UNREACHABLE, "RW would drop the committed layout and the lock server "
			    "(%s) did not answer: %s", d->lock_uri, gf_error_detail());
		fence_refuse(d, c, 0);
	} else if (c->lock_epoch == 0 || h.epoch != c->lock_epoch || !h.proof_valid) {
		gmsd_reply_error(d, c, c->seq, GF_ERR_PERMISSION, "RW would drop the committed layout: only the lock's current "
			    "holder may, with its grant's proof (connect epoch %llu%s, lock epoch %llu%s)",
			    (unsigned long long)c->lock_epoch, c->lock_proof.epoch ? "" : " without a proof",
			    (unsigned long long)h.epoch, h.epoch ? "" : ", no holder");
		fence_refuse(d, c, h.epoch);
	} else {
		/* An admission lets it wait ahead of readers; the grant is asked again. */
		d->changed = true;
	}
}

/* Ask the lock server whether @c's grant is the current one (@why: which ask); on_fence_answer() gets the answer. */
static int fence_ask(gf_gmsd *d, struct client *c, enum gms_fence_event why)
{
	int rc = gf_lock_query_start(&c->fence_q, d->lock_uri, d->lock_secret, d->lock_secret_len,
				     c->lock_proof.epoch ? &c->lock_proof : NULL, FENCE_QUERY_MS);
	if (rc < 0)
		return rc;
	c->fence_w.fn = on_fence_answer;
	rc = gf_srv_watch_add(d->srv, gf_lock_query_get_fd(c->fence_q), &c->fence_w);
	if (rc < 0) {
		gf_lock_query_free(c->fence_q);
		c->fence_q = NULL;
		return rc;
	}
	c->fence = gms_fence_next(c->fence, why);
	return 0;
}

/* 1: @c may drop the layout now; 0: the lock server is being asked (or
 * refused @c: its phase is then C_IDLE and the reply sent). */
static int fence_step(gf_gmsd *d, struct client *c)
{
	if (gms_fence_passed(c->fence))
		return 1;
	if (gms_fence_asking(c->fence))
		return 0;
	if (c->lock_epoch == 0) {
		gmsd_reply_error(d, c, c->seq, GF_ERR_PERMISSION, "RW would drop the committed layout: only the lock's current "
			    "holder may (the connect carried no lock grant)");
		fence_refuse(d, c, 0);
		return 0;
	}
	int rc = fence_ask(d, c, GMS_FENCE_ASK_GRANT);
	if (rc < 0) {
		gmsd_reply_error(d, c, c->seq, GF_ERR_UNREACHABLE, "RW would drop the committed layout and the lock "
			    "server could not be asked: %s", gf_error_detail());
		fence_refuse(d, c, 0);
	}
	return 0;
}

/*
 * A fenced GMS with a committed layout: a waiting RW would drop it, and an
 * RW waiting ahead of readers holds every new one back. So each is checked
 * when it arrives, or when the load it waited on commits, not only at its
 * grant: without a grant it is refused at once; with one, the lock server
 * is asked (off the loop) and only an admitted RW holds readers back
 * (other_rw_waiting()). The fence runs again at the grant.
 */
static void fence_waiting_writers(gf_gmsd *d)
{
	if (!d->lock_uri || !gms_fsm_rw_would_drop(&d->fsm))
		return;
	/* A refusal may close its peer (a failed send): walk afresh after each one. */
	for (;;) {
		struct client *c = gmsd_next_client(d, NULL);
		while (c && (c->phase != C_WAIT || c->mode != GMS_MODE_RW || c->fence != GMS_FENCE_NONE))
			c = gmsd_next_client(d, c);
		if (!c)
			return;
		if (c->lock_epoch == 0) {
			gmsd_reply_error(d, c, c->seq, GF_ERR_PERMISSION, "RW would drop the committed layout: only the lock's "
				    "current holder may (the connect carried no lock grant)");
			fence_refuse(d, c, 0);
			continue;
		}
		if (fence_ask(d, c, GMS_FENCE_ASK_ADMISSION) < 0) {
			gmsd_reply_error(d, c, c->seq, GF_ERR_UNREACHABLE, "RW would drop the committed layout and the lock "
				    "server could not be asked: %s", gf_error_detail());
			fence_refuse(d, c, 0);
		}
	}
}

/* Try to grant @c now. Returns 1 granted, 0 still waiting, <0 the client was dropped. */
static int try_grant(gf_gmsd *d, struct client *c)
{
	enum gms_decision dec = gms_fsm_decide(&d->fsm, c->mode, other_rw_waiting(d, c));
	if (dec == GMS_WAIT || dec == GMS_INVALID)
		return 0;
	if (dec == GMS_GRANT_RW_DROP && d->lock_uri && !fence_step(d, c))
		return c->phase == C_WAIT ? 0 : -1;
	/* An ask still in flight (the layout went meanwhile) no longer matters. */
	fence_cancel(d, c);
	c->fence = gms_fence_next(c->fence, GMS_FENCE_RESET);
	if (dec == GMS_GRANT_RW_DROP) {
		gmsd_event(d, "event=layout_dropped generation=%llu by=%s", (unsigned long long)d->generation,
		      c->peer);
		gmsd_drop_layout(d, "new_load");
		tiers_residency_dropped(d->res);
	}
	gms_fsm_apply(&d->fsm, dec);
	int granted = dec == GMS_GRANT_RO ? GMS_MODE_RO : GMS_MODE_RW;
	c->phase = granted == GMS_MODE_RO ? C_READER : C_WRITER;
	if (granted == GMS_MODE_RW)
		gmsd_writer_granted(d);
	gf_msg_start(d->out, gf_Msg_gms_connected_tag);
	d->out->seq = c->seq;
	fill_connected(d, &d->out->body.gms_connected, granted);
	/* A wake whose handles are this very layout's (no drop since it slept) maps them: no list. */
	bool valid = granted == GMS_MODE_RO && c->handles_kept && c->parked_drops == d->drops &&
		     !memcmp(c->parked_hash, d->hash, 16);
	d->out->body.gms_connected.handles_valid = valid;
	c->handles_kept = false;
	int sent = gmsd_send_msg(d, c, NULL, 0);
	/* Logged once the answer is on its way: a wake waits on it. */
	gmsd_event(d, "event=connect peer=%s pid=%u mode=%s granted=%s state=%s readers=%u lock_epoch=%llu proof=%d", c->peer,
	      c->pid, gms_mode_name(c->mode), gms_mode_name(granted), gms_state_name(d->fsm.state), d->fsm.readers,
	      (unsigned long long)c->lock_epoch, c->lock_proof.epoch != 0);
	if (sent < 0)
		return -1;
	/* A reader waking asked for the list with the grant: no second round trip. */
	if (c->connect_list && granted == GMS_MODE_RO && !valid)
		start_list(d, c, c->seq, true, false, false);
	c->connect_list = false;
	return 1;
}

/* Every state change: walk the waiters in FIFO order and grant whoever can go now. */
static void reevaluate(gf_gmsd *d)
{
	d->changed = false;
	fence_waiting_writers(d);
	for (;;) {
		struct client *best = NULL;
		bool progressed = false;
		/* Waiters in FIFO order: find the oldest not yet examined in this pass. */
		uint64_t after = 0;
		for (;;) {
			best = NULL;
			for (struct client *c = gmsd_next_client(d, NULL); c; c = gmsd_next_client(d, c))
				if (c->phase == C_WAIT && c->order > after && (!best || c->order < best->order))
					best = c;
			if (!best)
				break;
			after = best->order;
			int r = try_grant(d, best);
			if (r != 0) {
				/* A grant or a drop changed the state (or the list): start a fresh pass. */
				progressed = true;
				break;
			}
		}
		if (!progressed)
			return;
	}
}

/* ---------------------------------------------------------------- handlers */

static void handle_connect(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsConnect *r = &m->body.gms_connect;
	if (c->phase != C_IDLE) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_STATE, "already connected in this session");
		return;
	}
	if ((int)r->mode != GMS_MODE_RW && (int)r->mode != GMS_MODE_RO && (int)r->mode != GMS_MODE_RW_OR_RO) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "unknown mode %d", (int)r->mode);
		return;
	}
	c->mode = r->mode;
	c->lock_epoch = r->lock_epoch;
	memset(&c->lock_proof, 0, sizeof(c->lock_proof));
	if (r->lock_proof.size == GF_LOCK_PROOF_LEN) {
		c->lock_proof.epoch = r->lock_epoch;
		memcpy(c->lock_proof.token, r->lock_proof.bytes, GF_LOCK_PROOF_LEN);
	}
	fence_cancel(d, c);
	c->fence = gms_fence_next(c->fence, GMS_FENCE_RESET);
	c->connect_list = r->with_list;
	/* Only a session that slept here can have kept this server's handles. */
	c->handles_kept = r->handles_kept && c->parked;
	c->parked = false;
	c->seq = m->seq;
	c->deadline_us = gf_deadline_from_ms(r->timeout_ms);
	c->by_progress = r->by_progress;
	c->wait_since_us = gf_now_us();
	c->wait_timeout_us = r->timeout_ms < 0 ? -1
			     : r->timeout_ms > GF_MAX_DURATION_MS ? GF_MAX_DURATION_MS * 1000
								 : r->timeout_ms * 1000;
	c->order = ++d->next_order;
	c->phase = C_WAIT;
	/* A reader waking after a demotion: bring the same layout back from its tier, then grant. */
	if (c->mode != GMS_MODE_RW)
		tiers_residency_reader_connects(d->res);
	int g = try_grant(d, c);
	if (g != 0)
		return;
	fence_waiting_writers(d);
	if (c->phase != C_WAIT)
		return;
	if (r->timeout_ms == 0) {
		c->phase = C_IDLE;
		gmsd_reply_error(d, c, m->seq, GF_ERR_TIMEOUT, "%s not grantable now (state %s)",
			    gms_mode_name(c->mode), gms_state_name(d->fsm.state));
		return;
	}
	gf_log(GF_LOG_DEBUG, "gms", "event=waiting peer=%s mode=%s state=%s", c->peer, gms_mode_name(c->mode),
	       gms_state_name(d->fsm.state));
	/* A new RW waiter holds back RO requests (writer priority); nothing else to re-check. */
}

static int do_allocate(gf_gmsd *d, struct client *c, uint32_t seq)
{
	gf_mem_alloc *a;
	int rc = gf_mem_create(&a, d->mem, c->alloc_size);
	if (rc == GF_ERR_OUT_OF_MEMORY && gf_now_us() < c->alloc_until_us) {
		if (c->alloc_tries++ == 0)
			gmsd_event(d, "event=oom_retry peer=%s size=%llu for_ms=%lld", c->peer,
			      (unsigned long long)c->alloc_size, (long long)d->oom_retry_ms);
		c->phase = C_ALLOC_WAIT;
		c->seq = seq;
		c->alloc_next_us = gf_now_us() + GMSD_OOM_RETRY_US;
		return 0;
	}
	c->phase = C_WRITER;
	if (rc < 0) {
		if (rc == GF_ERR_OUT_OF_MEMORY)
			gmsd_event(d, "event=oom peer=%s size=%llu tries=%u", c->peer,
			      (unsigned long long)c->alloc_size, c->alloc_tries + 1);
		return gmsd_reply_error(d, c, seq, rc, "allocate %llu bytes: %s",
				   (unsigned long long)c->alloc_size, gf_error_detail());
	}
	int fd = -1;
	if (d->nallocs == d->allocs_cap) {
		size_t cap = d->allocs_cap ? d->allocs_cap * 2 : 64;
		struct galloc *n = realloc(d->allocs, cap * sizeof(*n));
		if (!n) {
			gf_mem_alloc_free(a);
			return gmsd_reply_error(d, c, seq, GF_ERR_NOMEM, "allocation table: out of memory");
		}
		d->allocs = n;
		d->allocs_cap = cap;
	}
	rc = gf_mem_export(a, &fd);
	if (rc < 0) {
		gf_mem_alloc_free(a);
		return gmsd_reply_error(d, c, seq, rc, "export: %s", gf_error_detail());
	}
	struct galloc *g = &d->allocs[d->nallocs++];
	g->id = d->next_alloc_id++;
	g->a = a;
	g->size = gf_mem_alloc_size(a);
	g->requested = c->alloc_size;
	snprintf(g->tag, sizeof(g->tag), "%s", c->alloc_tag);
	d->alloc_bytes += g->size;
	gmsd_writer_progress(d);
	if (c->alloc_tries)
		gmsd_event(d, "event=oom_recovered peer=%s size=%llu tries=%u", c->peer,
		      (unsigned long long)c->alloc_size, c->alloc_tries + 1);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = seq;
	d->out->which_body = gf_Msg_gms_allocated_tag;
	d->out->body.gms_allocated.has_allocation = true;
	gf_GmsAllocation *o = &d->out->body.gms_allocated.allocation;
	o->id = g->id;
	o->size = g->size;
	o->requested = g->requested;
	snprintf(o->tag, sizeof(o->tag), "%s", g->tag);
	rc = gmsd_send_msg(d, c, &fd, 1);
	gf_close(fd);
	return rc;
}

static void handle_allocate(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsAllocate *r = &m->body.gms_allocate;
	if (c->phase != C_WRITER) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_STATE, "allocate needs the RW lock");
		return;
	}
	if (r->size == 0) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "allocate: size 0");
		return;
	}
	if (d->nallocs >= GMSD_MAX_ALLOCS) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_TOO_BIG, "allocate: more than %d allocations", GMSD_MAX_ALLOCS);
		return;
	}
	gmsd_writer_progress(d);
	c->alloc_size = r->size;
	snprintf(c->alloc_tag, sizeof(c->alloc_tag), "%s", r->tag);
	c->alloc_tries = 0;
	c->alloc_until_us = gf_now_us() + d->oom_retry_ms * 1000;
	do_allocate(d, c, m->seq);
}

static void handle_meta_put(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsMetaPut *r = &m->body.gms_meta_put;
	if (c->phase != C_WRITER) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_STATE, "put metadata needs the RW lock");
		return;
	}
	if (!r->key[0]) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "metadata: empty key");
		return;
	}
	struct galloc *a = gmsd_alloc_find(d, r->allocation_id);
	if (!a) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_NOT_FOUND, "metadata %s: unknown allocation id %llu", r->key,
			    (unsigned long long)r->allocation_id);
		return;
	}
	if (r->offset >= a->size) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_INVALID_ARG,
			    "metadata %s: offset %llu outside allocation %llu of %llu bytes", r->key,
			    (unsigned long long)r->offset, (unsigned long long)a->id,
			    (unsigned long long)a->size);
		return;
	}
	if (gmsd_meta_find(d, r->key)) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "metadata key %s already exists", r->key);
		return;
	}
	if (d->nmeta >= GMSD_MAX_META) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_TOO_BIG, "more than %d metadata entries", GMSD_MAX_META);
		return;
	}
	if (d->nmeta == d->meta_cap) {
		size_t cap = d->meta_cap ? d->meta_cap * 2 : 256;
		struct gmeta *n = realloc(d->meta, cap * sizeof(*n));
		if (!n) {
			gmsd_reply_error(d, c, m->seq, GF_ERR_NOMEM, "metadata: out of memory");
			return;
		}
		d->meta = n;
		d->meta_cap = cap;
	}
	/* Keep the index at most half full. */
	if ((d->nmeta + 1) * 2 > d->index_cap &&
	    gmsd_index_rebuild(d, d->index_cap ? d->index_cap * 2 : 512) < 0) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_NOMEM, "metadata: out of memory");
		return;
	}
	struct gmeta *e = &d->meta[d->nmeta];
	e->key = strdup(r->key);
	e->value = malloc(r->value.size ? r->value.size : 1);
	if (!e->key || !e->value) {
		free(e->key);
		free(e->value);
		gmsd_reply_error(d, c, m->seq, GF_ERR_NOMEM, "metadata: out of memory");
		return;
	}
	memcpy(e->value, r->value.bytes, r->value.size);
	e->value_len = r->value.size;
	e->alloc_id = r->allocation_id;
	e->offset = r->offset;
	size_t p = gmsd_key_hash(e->key) & (d->index_cap - 1);
	while (d->index[p])
		p = (p + 1) & (d->index_cap - 1);
	d->index[p] = (uint32_t)(d->nmeta + 1);
	d->nmeta++;
	gmsd_writer_progress(d);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_ok_tag;
	gmsd_send_msg(d, c, NULL, 0);
}

static void handle_progress(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsProgress *r = &m->body.gms_progress;
	if (c->phase != C_WRITER) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_STATE, "progress is the writer's to report");
		return;
	}
	d->w_done = r->done_bytes;
	d->w_total = r->total_bytes;
	d->w_reports++;
	gmsd_writer_progress(d);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_ok_tag;
	gmsd_send_msg(d, c, NULL, 0);
}

static int meta_cmp(const void *a, const void *b)
{
	return strcmp(((const struct gmeta *)a)->key, ((const struct gmeta *)b)->key);
}

/*
 * The committed metadata as one sealed memfd, made once per layout (after
 * the commit or at the first reader's list after a restore) and shared by
 * every reader: a reader's list then costs one fd and one pread, not 32
 * entries per chunk. False when there is none or it cannot be made (the
 * list then carries the entries in chunks, as for an older client).
 */
static bool meta_blob(gf_gmsd *d)
{
	if (!d->nmeta)
		return false;
	if (d->mblob_fd >= 0 && !memcmp(d->mblob_hash, d->hash, 16))
		return true;
	gf_close(d->mblob_fd);
	d->mblob_fd = -1;
	struct gf_lc_meta *lm = calloc(d->nmeta, sizeof(*lm));
	int rc = lm ? 0 : gf_err(GF_ERR_NOMEM, "out of memory");
	for (size_t i = 0; rc == 0 && i < d->nmeta; i++)
		lm[i] = (struct gf_lc_meta){d->meta[i].key, d->meta[i].alloc_id, d->meta[i].offset, d->meta[i].value,
					    d->meta[i].value_len};
	if (rc == 0)
		rc = gf_mb_make_memfd(lm, d->nmeta, &d->mblob_fd, &d->mblob_size);
	free(lm);
	if (rc < 0) {
		gf_log(GF_LOG_DEBUG, "gms", "msg=\"metadata blob not made; lists carry the entries\" detail=\"%s\"",
		       gf_error_detail());
		return false;
	}
	memcpy(d->mblob_hash, d->hash, 16);
	return true;
}

static void handle_commit(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	if (c->phase != C_WRITER) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_STATE, "commit needs the RW lock");
		return;
	}
	if (c->fence == GMS_FENCE_COMMITTING) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_STATE, "a commit is already waiting for the lock's answer");
		return;
	}
	if (d->lock_uri && c->lock_epoch) {
		/* Checked off the loop like the drop (fence_step()); the answer commits or refuses. */
		c->commit_seq = m->seq;
		int rc = fence_ask(d, c, GMS_FENCE_ASK_COMMIT);
		if (rc < 0)
			commit_fenced(d, c, rc, NULL);
		return;
	}
	do_commit(d, c, m->seq);
}

static void do_commit(gf_gmsd *d, struct client *c, uint32_t seq)
{
	for (size_t i = 0; i < d->nmeta; i++) {
		struct galloc *a = gmsd_alloc_find(d, d->meta[i].alloc_id);
		if (!a || d->meta[i].offset >= a->size) {
			gmsd_reply_error(d, c, seq, GF_ERR_INVALID_ARG, "commit: metadata %s is invalid",
				    d->meta[i].key);
			return;
		}
	}
	uint64_t *sizes = malloc((d->nallocs ? d->nallocs : 1) * sizeof(*sizes));
	struct gms_layout_meta *lm = malloc((d->nmeta ? d->nmeta : 1) * sizeof(*lm));
	if (!sizes || !lm) {
		free(sizes);
		free(lm);
		gmsd_reply_error(d, c, seq, GF_ERR_NOMEM, "commit: out of memory");
		return;
	}
	/* Canonical order (by key) so the hash does not depend on the order of puts. */
	if (d->nmeta)
		qsort(d->meta, d->nmeta, sizeof(*d->meta), meta_cmp);
	/* The sort moved the entries: index them again in place, which cannot
	 * fail (a new index could, and would leave the old one pointing at the
	 * wrong entries). No index yet means no metadata. */
	if (d->index_cap)
		gmsd_index_fill(d);
	for (size_t i = 0; i < d->nallocs; i++)
		sizes[i] = d->allocs[i].size;
	for (size_t i = 0; i < d->nmeta; i++) {
		lm[i].key = d->meta[i].key;
		lm[i].alloc_index = d->meta[i].alloc_id - 1;
		lm[i].offset = d->meta[i].offset;
		lm[i].value = d->meta[i].value;
		lm[i].value_len = d->meta[i].value_len;
	}
	int hrc = gms_layout_hash(sizes, d->nallocs, lm, d->nmeta, d->hash);
	free(sizes);
	free(lm);
	if (hrc < 0) {
		gmsd_reply_error(d, c, seq, GF_ERR_NOMEM, "commit: out of memory");
		return;
	}
	/* The committed bytes are final: no holder of an fd, the writer
	 * included, may change them under the readers (host: sealed; cuda
	 * cannot enforce it, docs/gms.md). */
	for (size_t i = 0; i < d->nallocs; i++) {
		int src = gf_mem_seal(d->allocs[i].a);
		if (src < 0 && src != GF_ERR_NOT_SUPPORTED) {
			gmsd_reply_error(d, c, seq, src, "commit: %s", gf_error_detail());
			return;
		}
	}
	d->generation++;
	gms_fsm_commit(&d->fsm);
	c->phase = C_READER;
	gmsd_writer_progress(d);
	char hex[33];
	gf_hex(d->hash, 16, hex);
	gmsd_event(d, "event=commit peer=%s generation=%llu hash=%s allocations=%zu bytes=%llu metadata=%zu", c->peer,
	      (unsigned long long)d->generation, hex, d->nallocs, (unsigned long long)d->alloc_bytes, d->nmeta);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = seq;
	d->out->which_body = gf_Msg_gms_committed_tag;
	d->out->body.gms_committed.generation = d->generation;
	memcpy(d->out->body.gms_committed.layout_hash.bytes, d->hash, 16);
	d->out->body.gms_committed.layout_hash.size = 16;
	gmsd_send_msg(d, c, NULL, 0);
	d->changed = true;
	tiers_residency_committed(d->res);
	meta_blob(d); /* now, after the reply, rather than in the first reader's map */
}

static void close_owned(const int *fds, const bool *owned, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (owned[i])
			gf_close(fds[i]);
}

/*
 * Stream the chunks of a list reply: one round trip for the client, but the
 * loop sends a chunk only while the socket has room (a unix socket reports
 * POLLOUT with at least 3/4 of its buffer free, more than one chunk), so a
 * reader that stops reading costs its own connection, not the loop.
 */
/* A list without metadata (a wake) packs 240 allocations a chunk, one
 * sendmsg and one recvmsg per 240 fds; with metadata a chunk also carries
 * up to 32 entries of 1.3 KB, so fewer allocations keep it under 64 KiB. */
static size_t chunk_allocs(const struct client *c)
{
	return c->list_meta && !c->list_blob ? GF_LIMIT_CHUNK_ALLOCS_WITH_META : GMSD_CHUNK_ALLOCS;
}

static void list_pump(gf_gmsd *d, struct client *c)
{
	int fds[GMSD_CHUNK_ALLOCS + 1];
	bool owned[GMSD_CHUNK_ALLOCS + 1];
	size_t nm = c->list_meta && !c->list_blob ? d->nmeta : 0, per = chunk_allocs(c);
	for (int budget = 32; c->list_next < c->list_chunks; budget--) {
		struct pollfd p = {.fd = c->p->fd, .events = POLLOUT};
		if (budget == 0 || poll(&p, 1, 0) <= 0 || !(p.revents & POLLOUT)) {
			gf_srv_want_write(d->srv, c->p, true);
			return;
		}
		size_t k = c->list_next, a0 = k * per, m0 = k * GMSD_CHUNK_META, nfds = 0;
		struct gf_lc_alloc la[GMSD_CHUNK_ALLOCS];
		struct gf_lc_meta lm[GMSD_CHUNK_META];
		struct gf_lc_chunk ch = {
			.seq = c->seq,
			.allocs = la,
			.meta = lm,
			.last = k + 1 == c->list_chunks,
			.generation = d->generation,
			.hash = d->hash,
			.total_allocations = (uint32_t)d->nallocs,
			.total_metadata = (uint32_t)(c->list_meta ? d->nmeta : 0),
		};
		int rc = 0;
		for (size_t i = a0; i < d->nallocs && i < a0 + per; i++) {
			const struct galloc *g = &d->allocs[i];
			la[ch.nallocs++] = (struct gf_lc_alloc){g->id, g->size, g->requested, g->tag};
			/* A reader gets a read-only file description; the writer the
			 * allocation's own fd where the backend allows (sendmsg copies it). */
			if (c->list_fds &&
			    (rc = c->phase == C_READER ? gf_mem_export_readonly(g->a, &fds[nfds], &owned[nfds])
						       : gf_mem_export_borrowed(g->a, &fds[nfds], &owned[nfds])) == 0)
				nfds++;
			if (rc < 0)
				break;
		}
		for (size_t i = m0; i < nm && i < m0 + GMSD_CHUNK_META; i++) {
			const struct gmeta *e = &d->meta[i];
			lm[ch.nmeta++] = (struct gf_lc_meta){e->key, e->alloc_id, e->offset, e->value, e->value_len};
		}
		/* The blob's fd follows the first chunk's allocation fds (not owned: kept for the next reader). */
		if (rc == 0 && c->list_blob && k == 0) {
			ch.metadata_blob_size = d->mblob_size;
			fds[nfds] = d->mblob_fd;
			owned[nfds++] = false;
		}
		size_t len = 0;
		if (rc == 0)
			rc = gf_lc_encode(&ch, d->lc_buf, GF_FRAME_MAX_BODY, &len);
		if (rc < 0) {
			close_owned(fds, owned, nfds);
			/* The reply is already under way: the client cannot resynchronise. */
			gmsd_reply_error(d, c, c->seq, rc, "list: %s", gf_error_detail());
			gmsd_client_close(d, c, "list chunk failed");
			return;
		}
		rc = gf_srv_send_raw(d->srv, c->p, d->lc_buf, len, fds, nfds);
		close_owned(fds, owned, nfds);
		if (rc < 0)
			return;
		c->list_next++;
	}
	c->listing = false;
	gf_srv_want_write(d->srv, c->p, false);
}

static void start_list(gf_gmsd *d, struct client *c, uint32_t seq, bool with_fds, bool with_meta, bool blob)
{
	c->list_fds = with_fds;
	c->list_meta = with_meta;
	/* A reader's committed layout only: a writer's metadata still change. */
	c->list_blob = with_meta && blob && c->phase == C_READER && meta_blob(d);
	size_t nm = c->list_meta && !c->list_blob ? d->nmeta : 0;
	size_t per = chunk_allocs(c), chunks_a = (d->nallocs + per - 1) / per;
	size_t chunks_m = (nm + GMSD_CHUNK_META - 1) / GMSD_CHUNK_META;
	c->list_chunks = chunks_a > chunks_m ? chunks_a : chunks_m;
	if (c->list_chunks == 0)
		c->list_chunks = 1;
	c->list_next = 0;
	c->seq = seq;
	c->listing = true;
	list_pump(d, c);
}

static void handle_list(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	if (c->phase != C_READER && c->phase != C_WRITER) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_STATE, "list needs the RW or RO lock");
		return;
	}
	start_list(d, c, m->seq, m->body.gms_list.with_fds, !m->body.gms_list.without_metadata,
		   m->body.gms_list.metadata_blob);
}

/* A reader going to sleep gives the RO lock back but keeps its session. */
static void handle_disconnect(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	if (c->phase != C_READER) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_STATE, "disconnect: only a reader keeps its session without a lock");
		return;
	}
	gms_fsm_reader_left(&d->fsm);
	c->phase = C_IDLE;
	c->parked = true;
	c->parked_drops = d->drops;
	memcpy(c->parked_hash, d->hash, 16);
	d->changed = true;
	gmsd_event(d, "event=disconnect peer=%s pid=%u mode=RO readers=%u state=%s session=kept", c->peer, c->pid,
	      d->fsm.readers, gms_state_name(d->fsm.state));
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_ok_tag;
	gmsd_send_msg(d, c, NULL, 0);
}

/* ---------------------------------------------------------------- tiers (lib/tiers/residency.h) */

/* Returns false when the client was closed. */
static bool dispatch(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	if (c->phase == C_WAIT || c->phase == C_ALLOC_WAIT || c->listing || c->tier_wait || c->settling || c->kv_asking) {
		/* The client protocol is strictly request/reply: nothing may arrive while a reply is pending. */
		gmsd_reply_error(d, c, m->seq, GF_ERR_PROTOCOL, "%s while a request is pending", gf_msg_name(m));
		gmsd_client_close(d, c, "request while waiting");
		return false;
	}
	switch (m->which_body) {
	case gf_Msg_gms_connect_tag:
		handle_connect(d, c, m);
		break;
	case gf_Msg_gms_allocate_tag:
		handle_allocate(d, c, m);
		break;
	case gf_Msg_gms_meta_put_tag:
		handle_meta_put(d, c, m);
		break;
	case gf_Msg_gms_commit_tag:
		handle_commit(d, c, m);
		break;
	case gf_Msg_gms_list_tag:
		handle_list(d, c, m);
		break;
	case gf_Msg_gms_status_request_tag:
		gmsd_handle_status(d, c, m);
		break;
	case gf_Msg_gms_snapshot_tag:
		gmsd_handle_snapshot(d, c, m);
		break;
	case gf_Msg_gms_restore_tag:
		gmsd_handle_restore(d, c, m);
		break;
	case gf_Msg_gms_disconnect_tag:
		handle_disconnect(d, c, m);
		break;
	case gf_Msg_gms_demote_tag:
		gmsd_handle_demote(d, c, m);
		break;
	case gf_Msg_gms_progress_tag:
		handle_progress(d, c, m);
		break;
	case gf_Msg_gms_kv_map_tag:
		gmsd_handle_kv_map(d, c, m);
		break;
	case gf_Msg_gms_kv_publish_tag:
		gmsd_handle_kv_publish(d, c, m);
		break;
	case gf_Msg_gms_kv_dir_request_tag:
		gmsd_handle_kv_dir(d, c, m);
		break;
	default:
		gmsd_reply_error(d, c, m->seq, GF_ERR_PROTOCOL, "unexpected message %s", gf_msg_name(m));
		gmsd_client_close(d, c, "unexpected message");
		return false;
	}
	return true;
}

/* ---------------------------------------------------------------- connections */

static void on_ready(void *ctx, struct gf_srv_peer *p)
{
	(void)ctx;
	struct client *c = p->data;
	c->p = p;
	c->peer = p->id;
	c->pid = p->pid;
}

/* Forget @p; what it held changes the lock state, which settle() acts on. */
static void on_close(void *ctx, struct gf_srv_peer *p, const char *why)
{
	gf_gmsd *d = ctx;
	struct client *c = p->data;
	if (!c->p)
		return; /* never finished its handshake */
	fence_cancel(d, c);
	gmsd_kv_closed(d, c);
	switch (c->phase) {
	case C_WRITER:
	case C_ALLOC_WAIT:
		gms_fsm_writer_left(&d->fsm);
		gmsd_event(d, "event=rw_abort peer=%s pid=%u allocations=%zu reason=\"%s\"", c->peer, c->pid,
		      d->nallocs, why);
		gmsd_drop_layout(d, "abort");
		gmsd_writer_progress(d); /* no writer from now on */
		d->changed = true;
		break;
	case C_READER:
		gms_fsm_reader_left(&d->fsm);
		gmsd_event(d, "event=disconnect peer=%s pid=%u mode=RO readers=%u state=%s", c->peer, c->pid,
		      d->fsm.readers, gms_state_name(d->fsm.state));
		d->changed = true;
		break;
	case C_WAIT:
		/* A leaving RW waiter may unblock readers (writer priority). */
		d->changed |= c->mode == GMS_MODE_RW;
		break;
	default:
		break;
	}
	c->phase = C_IDLE;
	c->listing = false;
}

static void on_message(void *ctx, struct gf_srv_peer *p, gf_Msg *m, int *fds, size_t nfds)
{
	gf_close_fds(fds, nfds); /* clients never send fds (max_fds is 0) */
	free(fds);
	dispatch(ctx, p->data, m);
}

static void on_writable(void *ctx, struct gf_srv_peer *p)
{
	struct client *c = p->data;
	if (c->listing)
		list_pump(ctx, c);
}

static void settle(void *ctx)
{
	gf_gmsd *d = ctx;
	while (d->changed)
		reevaluate(d);
}

/* ---------------------------------------------------------------- timers */

/* When a waiting request times out: from its start, or by progress, from the writer's last progress. */
static int64_t wait_deadline(const gf_gmsd *d, const struct client *c)
{
	if (!c->by_progress)
		return c->deadline_us;
	return gms_progress_deadline(c->wait_since_us, c->wait_timeout_us, d->wmark_us);
}

/* A request waiting by progress timed out: say which of the two it was. */
static void progress_timeout(gf_gmsd *d, struct client *c)
{
	double secs = (double)c->wait_timeout_us / 1e6;
	struct client *w = gmsd_writer_client(d);
	if (!w) {
		gmsd_event(d, "event=connect_timeout peer=%s mode=%s state=%s by_progress=1 reason=no_writer", c->peer,
		      gms_mode_name(c->mode), gms_state_name(d->fsm.state));
		gmsd_reply_error(d, c, c->seq, GF_ERR_TIMEOUT,
			    "%s not granted: no writer connected for %.1f s (state %s, generation %llu): is a loader "
			    "running against this GMS?",
			    gms_mode_name(c->mode), secs, gms_state_name(d->fsm.state),
			    (unsigned long long)d->generation);
		return;
	}
	gmsd_event(d, "event=connect_timeout peer=%s mode=%s state=%s by_progress=1 reason=writer_stalled writer=%s "
		 "writer_pid=%u",
	      c->peer, gms_mode_name(c->mode), gms_state_name(d->fsm.state), w->peer, w->pid);
	char done[96] = "";
	if (d->w_reports)
		snprintf(done, sizeof(done), ", reported %llu of %llu bytes written", (unsigned long long)d->w_done,
			 (unsigned long long)d->w_total);
	gmsd_reply_error(d, c, c->seq, GF_ERR_TIMEOUT,
		    "%s not granted: writer connected but made no progress for %.1f s (writer %s pid %u: %zu "
		    "allocations, %llu bytes, %zu metadata entries%s): is the loader hung?",
		    gms_mode_name(c->mode), secs, w->peer, w->pid, d->nallocs, (unsigned long long)d->alloc_bytes,
		    d->nmeta, done);
}

static void on_timer(void *ctx, int64_t now)
{
	gf_gmsd *d = ctx;
	struct client *c = gmsd_next_client(d, NULL), *next;
	for (; c; c = next) {
		next = gmsd_next_client(d, c);
		if (c->phase == C_WAIT && now >= wait_deadline(d, c)) {
			c->phase = C_IDLE;
			d->changed |= c->mode == GMS_MODE_RW;
			if (c->by_progress) {
				progress_timeout(d, c);
				continue;
			}
			gmsd_event(d, "event=connect_timeout peer=%s mode=%s state=%s", c->peer, gms_mode_name(c->mode),
			      gms_state_name(d->fsm.state));
			gmsd_reply_error(d, c, c->seq, GF_ERR_TIMEOUT, "%s not granted in time (state %s)",
				    gms_mode_name(c->mode), gms_state_name(d->fsm.state));
		} else if (c->phase == C_ALLOC_WAIT && now >= c->alloc_next_us) {
			do_allocate(d, c, c->seq);
		}
	}
	if (d->pins.nretired && now >= d->pins.next_us)
		gms_pins_scan(&d->pins);
	bool settling = false;
	for (c = gmsd_next_client(d, NULL); c; c = gmsd_next_client(d, c))
		settling |= c->settling;
	if (settling)
		gms_pins_scan(&d->pins);
	for (c = gmsd_next_client(d, NULL); settling && c; c = gmsd_next_client(d, c)) {
		if (!c->settling)
			continue;
		if (d->pins.nretired && now < c->settle_until_us)
			continue;
		c->settling = false;
		memset(d->out, 0, sizeof(*d->out));
		d->out->seq = c->tier_seq;
		d->out->which_body = gf_Msg_ok_tag;
		gmsd_send_msg(d, c, NULL, 0);
	}
	tiers_residency_timer(d->res, now);
}

static int64_t next_deadline(void *ctx)
{
	gf_gmsd *d = ctx;
	int64_t next = INT64_MAX;
	for (struct client *c = gmsd_next_client(d, NULL); c; c = gmsd_next_client(d, c)) {
		int64_t w = c->phase == C_WAIT ? wait_deadline(d, c) : INT64_MAX;
		if (w < next)
			next = w;
		if (c->phase == C_ALLOC_WAIT && c->alloc_next_us < next)
			next = c->alloc_next_us;
		if (c->settling) {
			int64_t step = gf_now_us() + GMS_PINS_SETTLE_STEP_US;
			next = step < next ? step : next;
		}
	}
	if (d->pins.nretired && d->pins.next_us < next)
		next = d->pins.next_us;
	int64_t p = tiers_residency_deadline(d->res);
	return p < next ? p : next;
}

/* ---------------------------------------------------------------- public */

int gf_gmsd_new(gf_gmsd **out)
{
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gmsd_new: out is NULL");
	gf_gmsd *d = calloc(1, sizeof(*d));
	if (!d)
		return gf_err(GF_ERR_NOMEM, "gf_gmsd_new: out of memory");
	d->mblob_fd = -1;
	d->pins = (struct gms_pins){ .event = gmsd_pins_event, .ctx = d };
	static const struct gf_srv_handlers h = {
		.on_ready = on_ready,
		.on_message = on_message,
		.on_close = on_close,
		.next_deadline = next_deadline,
		.on_timer = on_timer,
		.settle = settle,
		.on_writable = on_writable,
	};
	const struct gf_srv_config cfg = {
		.name = "gms",
		.component = gf_Component_COMPONENT_GMS,
		.max_fds = 0, /* clients never send fds */
		.backlog = 128,
		.peer_data_size = sizeof(struct client),
	};
	int rc = gf_srv_new(&d->srv, &cfg, &h, d);
	if (rc == 0 && (rc = tiers_residency_new(&d->res, &gmsd_residency_host, d)) < 0)
		gf_srv_free(d->srv);
	if (rc < 0) {
		free(d);
		return rc;
	}
	d->kind = GF_MEM_AUTO;
	d->next_alloc_id = 1;
	gms_fsm_init(&d->fsm);
	*out = d;
	return 0;
}

#define NOT_STARTED(d)                                                                 \
	do {                                                                               \
		if (!(d))                                                                      \
			return gf_err(GF_ERR_INVALID_ARG, "gmsd is NULL");                         \
		if ((d)->started)                                                              \
			return gf_err(GF_ERR_STATE, "gmsd: settings are fixed once started");      \
	} while (0)

int gf_gmsd_add_listen(gf_gmsd *d, const char *uri)
{
	NOT_STARTED(d);
	int rc = gf_srv_add_listen(d->srv, uri, true);
	if (rc == 0 && !d->listen_text[0])
		snprintf(d->listen_text, sizeof(d->listen_text), "%s", uri);
	return rc;
}

int gf_gmsd_set_device(gf_gmsd *d, int index)
{
	NOT_STARTED(d);
	if (index < 0)
		return gf_err(GF_ERR_INVALID_ARG, "device index %d", index);
	d->device = index;
	return 0;
}

int gf_gmsd_set_backend(gf_gmsd *d, int kind)
{
	NOT_STARTED(d);
	if (kind != GF_MEM_AUTO && kind != GF_MEM_CUDA && kind != GF_MEM_HOST)
		return gf_err(GF_ERR_INVALID_ARG, "backend kind %d", kind);
	d->kind = kind;
	return 0;
}

int gf_gmsd_set_oom_retry(gf_gmsd *d, int64_t ms)
{
	NOT_STARTED(d);
	if (ms < 0 || ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "oom retry %lldms outside 0..%lldms", (long long)ms, (long long)GF_MAX_DURATION_MS);
	d->oom_retry_ms = ms;
	return 0;
}

int gf_gmsd_add_allow_uid(gf_gmsd *d, uint32_t uid)
{
	NOT_STARTED(d);
	return gf_srv_add_allow_uid(d->srv, uid);
}

int gf_gmsd_set_handshake_timeout(gf_gmsd *d, int64_t ms)
{
	NOT_STARTED(d);
	return gf_srv_set_handshake_timeout(d->srv, ms);
}

int gf_gmsd_set_lock(gf_gmsd *d, const char *uri, const void *secret, size_t secret_len)
{
	NOT_STARTED(d);
	if (!uri || !*uri || (secret_len && !secret))
		return gf_err(GF_ERR_INVALID_ARG, "gf_gmsd_set_lock: empty URI");
	char *u = strdup(uri);
	void *s = secret_len ? malloc(secret_len) : NULL;
	if (!u || (secret_len && !s)) {
		free(u);
		free(s);
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	}
	if (secret_len)
		memcpy(s, secret, secret_len);
	free(d->lock_uri);
	free(d->lock_secret);
	d->lock_uri = u;
	d->lock_secret = s;
	d->lock_secret_len = secret_len;
	return 0;
}

int gf_gmsd_start(gf_gmsd *d)
{
	NOT_STARTED(d);
	int rc;
	size_t rec;
	if (!d->out && (!(d->out = gf_msg_new()) || !(d->lc_buf = malloc(GF_FRAME_MAX_BODY))))
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	if (!d->listen_text[0])
		return gf_err(GF_ERR_INVALID_ARG, "gmsd: no listen URI set");
	if (!d->mem && (rc = gf_mem_open(&d->mem, d->kind, d->device)) < 0)
		return rc;
	if ((rc = gf_mem_granularity(d->mem, &d->granularity, &rec)) < 0)
		return rc;
	if (gf_mem_device_uuid(d->mem, d->uuid, sizeof(d->uuid)) < 0)
		d->uuid[0] = 0;
	char sid[64];
	snprintf(sid, sizeof(sid), "gms-%s-%d", gf_mem_kind_name(gf_mem_kind(d->mem)), d->device);
	gf_srv_set_server_id(d->srv, sid);
	if ((rc = gf_srv_start(d->srv)) < 0)
		return rc;
	d->started = true;
	d->started_us = gf_now_us();
	gmsd_writer_progress(d); /* no writer since the start */
	tiers_residency_start(d->res, d->mem, d->device);
	gmsd_event(d, "event=start listen=%s backend=%s device=%d uuid=%s", d->listen_text,
	      gf_mem_kind_name(gf_mem_kind(d->mem)), d->device, d->uuid);
	return 0;
}

gf_mem *gf_gmsd_mem(gf_gmsd *d)
{
	return d ? d->mem : NULL;
}

int gf_gmsd_get_fd(const gf_gmsd *d)
{
	return d ? gf_srv_get_fd(d->srv) : gf_err(GF_ERR_INVALID_ARG, "gmsd is NULL");
}

int gf_gmsd_get_timeout_ms(const gf_gmsd *d)
{
	return d ? gf_srv_get_timeout_ms(d->srv) : -1;
}

int gf_gmsd_process(gf_gmsd *d)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	return gf_srv_process(d->srv, 0);
}

int gf_gmsd_run(gf_gmsd *d)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	return gf_srv_run(d->srv);
}

void gf_gmsd_stop(gf_gmsd *d)
{
	if (d)
		gf_srv_stop(d->srv);
}

void gf_gmsd_free(gf_gmsd *d)
{
	if (!d)
		return;
	tiers_residency_free(d->res); /* waits for a running snapshot job */
	for (struct client *c = d->srv ? gmsd_next_client(d, NULL) : NULL; c; c = gmsd_next_client(d, c)) {
		fence_cancel(d, c);
		gmsd_kv_closed(d, c);
	}
	gf_srv_free(d->srv);
	d->srv = NULL; /* drop_layout() below has no sessions left to close */
	gmsd_drop_layout(d, NULL);
	gms_pins_free(&d->pins);
	gmsd_kv_free(d);
	free(d->allocs);
	free(d->meta);
	free(d->index);
	gf_mem_free(d->mem);
	gf_msg_free(d->out);
	free(d->lc_buf);
	free(d->lock_uri);
	free(d->lock_secret);
	free(d);
}

int gf_gmsd_set_tiers(gf_gmsd *d, const char *warm_dir, const char *cold_dir)
{
	NOT_STARTED(d);
	return tiers_residency_set_dirs(d->res, warm_dir, cold_dir);
}

int gf_gmsd_set_min_resident(gf_gmsd *d, int64_t ms)
{
	NOT_STARTED(d);
	return tiers_residency_set_min_resident(d->res, ms);
}

int gf_gmsd_set_pinned(gf_gmsd *d, int pinned)
{
	NOT_STARTED(d);
	tiers_residency_set_pinned(d->res, pinned != 0);
	return 0;
}

int gf_gmsd_set_demote_below_free(gf_gmsd *d, uint64_t bytes)
{
	NOT_STARTED(d);
	tiers_residency_set_demote_below_free(d->res, bytes);
	return 0;
}
