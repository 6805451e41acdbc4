/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS server's weight fence at work (the states are fence.c's): asking
 * the lock server, off the loop, whether a connection's grant is the current
 * one before an RW drops the committed layout, before a waiting RW holds
 * readers back, and before a writer commits.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "server_int.h"

/*
 * A GMS fenced by a lock drops its committed layout only for the lock's
 * current holder, proven by the fence proof of its grant (gf_lock_grant_proof()):
 * the epoch alone is public. The lock server is asked each time (a drop is
 * rare: a new load replacing the weights), so a refusal is based on the
 * grant as it is now, revocations included. The query runs on a thread of
 * the lock client and its end is an fd in this loop: the other peers are
 * served meanwhile, and the writer waits in its queue position.
 */
void gmsd_fence_cancel(gf_gmsd *d, struct client *c)
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
void gmsd_commit_fenced(gf_gmsd *d, struct client *c, int rc, const struct gf_lock_holder *h)
{
	if (rc == 0 && h->epoch == c->lock_epoch && h->proof_valid) {
		gmsd_do_commit(d, c, c->commit_seq);
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
	gmsd_fence_cancel(d, c);
	bool yes = rc == 0 && c->lock_epoch != 0 && h.epoch == c->lock_epoch && h.proof_valid;
	enum gms_fence was = c->fence;
	c->fence = gms_fence_next(was, yes ? GMS_FENCE_YES : GMS_FENCE_NO);
	if (c->phase == C_WRITER && was == GMS_FENCE_COMMITTING) {
		gmsd_commit_fenced(d, c, rc, &h);
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
int gmsd_fence_ask(gf_gmsd *d, struct client *c, enum gms_fence_event why)
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
int gmsd_fence_step(gf_gmsd *d, struct client *c)
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
	int rc = gmsd_fence_ask(d, c, GMS_FENCE_ASK_GRANT);
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
void gmsd_fence_waiting_writers(gf_gmsd *d)
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
		if (gmsd_fence_ask(d, c, GMS_FENCE_ASK_ADMISSION) < 0) {
			gmsd_reply_error(d, c, c->seq, GF_ERR_UNREACHABLE, "RW would drop the committed layout and the lock "
				    "server could not be asked: %s", gf_error_detail());
			fence_refuse(d, c, 0);
		}
	}
}
