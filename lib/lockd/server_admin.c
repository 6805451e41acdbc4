/* SPDX-License-Identifier: Apache-2.0 */
/* The lock server's admin requests: revoke a grant, a planned switchover, evict a standby. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "server_int.h"

/*
 * An admin drops the grant of @epoch: the holder will not die (uninterruptible
 * sleep keeps its process and socket) or its socket outlived it. Naming the
 * epoch makes a late or repeated request harmless: it revokes nothing once
 * the next waiter holds the lock.
 */
void lockd_handle_revoke(gf_lockd *d, struct conn *c, uint64_t epoch)
{
	struct gf_srv_peer *p = c->peer;
	char det[200];
	if (!lockd_is_admin(p)) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"revoke refused: not an admin uid\" id=%s uid=%u", p->id, p->uid);
		lockd_reply_error(d, c, GF_ERR_PERMISSION, "revoke: only root or the server's own uid may revoke", false);
		return;
	}
	if (d->holder && d->epoch == epoch) {
		struct conn *h = d->holder;
		gf_log(GF_LOG_WARN, "lock", "msg=\"revoked\" id=%s epoch=%llu pid=%u by=%s", h->peer->id,
		       (unsigned long long)epoch, h->peer->pid, p->id);
		/* No exit wait: the process is presumed unkillable, which is why
		 * it is revoked. Closing its connection makes any later request
		 * of it fail, and its reclaim is refused (new token, no window). */
		/* Hung up now, before the next grant goes out (the socket itself
		 * is closed after it): a revoked holder that resumes sees the
		 * hang-up before it accepts from a carried listener again. */
		shutdown(h->peer->fd, SHUT_RDWR);
		lockd_holder_gone(d, h, "revoked", WAIT_NONE);
		gf_srv_close(d->srv, h->peer, "revoked");
	} else if (!d->holder && d->exit_left > 0 && d->epoch == epoch) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"revoked during the exit wait\" id=%s epoch=%llu pid=%u by=%s",
		       d->exit_id, (unsigned long long)epoch, d->exit_pid, p->id);
		lockd_end_exit_wait(d, "revoked during the exit wait");
	} else {
		snprintf(det, sizeof(det), "revoke: epoch %llu is not the current grant (current %llu, %s)",
			 (unsigned long long)epoch, (unsigned long long)d->epoch, d->holder ? "held" : "free");
		lockd_reply_error(d, c, GF_ERR_STATE, det, false);
		return;
	}
	memset(d->msg, 0, sizeof(*d->msg));
	d->msg->seq = c->seq;
	d->msg->which_body = gf_Msg_ok_tag;
	lockd_reply(d, c, d->msg);
}

/*
 * Planned switchover: the holder is asked to step down (stop accepting,
 * drain, release); the lock's FIFO then grants the first waiter as usual.
 * Without a waiter nobody would serve afterwards, so that is refused.
 */
void lockd_handle_switchover(gf_lockd *d, struct conn *c, uint64_t epoch)
{
	struct gf_srv_peer *p = c->peer;
	char det[200];
	if (!lockd_is_admin(p)) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"switchover refused: not an admin uid\" id=%s uid=%u", p->id, p->uid);
		lockd_reply_error(d, c, GF_ERR_PERMISSION, "switchover: only root or the server's own uid may ask", false);
		return;
	}
	if (!d->holder || (epoch && epoch != d->epoch)) {
		snprintf(det, sizeof(det), "switchover: epoch %llu does not hold the lock (current %llu, %s)",
			 (unsigned long long)epoch, (unsigned long long)d->epoch, d->holder ? "held" : "free");
		lockd_reply_error(d, c, GF_ERR_STATE, det, false);
		return;
	}
	if (!d->whead) {
		lockd_reply_error(d, c, GF_ERR_STATE, "switchover: no standby is waiting for the lock", false);
		return;
	}
	struct conn *h = d->holder;
	gf_Msg *m = d->msg;
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_lock_step_down_tag;
	m->body.lock_step_down.epoch = d->epoch;
	if (lockd_reply(d, h, m) < 0) {
		lockd_reply_error(d, c, GF_ERR_UNREACHABLE, "switchover: the holder's connection failed", false);
		return;
	}
	d->step_down_epoch = d->epoch;
	gf_log(GF_LOG_INFO, "lock", "msg=\"switchover: holder asked to step down\" id=%s epoch=%llu next=%s by=%s",
	       h->peer->id, (unsigned long long)d->epoch, d->whead->peer->id, p->id);
	memset(m, 0, sizeof(*m));
	m->seq = c->seq;
	m->which_body = gf_Msg_ok_tag;
	lockd_reply(d, c, m);
}

/*
 * An admin evicts one named standby, as the budget would: its acquire ends
 * with GF_ERR_EVICTED. Only waiters: the holder is revoked, not evicted.
 */
void lockd_handle_evict(gf_lockd *d, struct conn *c, const char *id)
{
	struct gf_srv_peer *p = c->peer;
	char det[300];
	if (!lockd_is_admin(p)) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"evict refused: not an admin uid\" id=%s uid=%u", p->id, p->uid);
		lockd_reply_error(d, c, GF_ERR_PERMISSION, "evict: only root or the server's own uid may evict", false);
		return;
	}
	struct conn *v = d->whead;
	while (v && strcmp(v->peer->id, id))
		v = v->wnext;
	if (!v) {
		snprintf(det, sizeof(det), "evict: no standby \"%.127s\" is waiting%s", id,
			 d->holder && !strcmp(d->holder->peer->id, id) ? " (it holds the lock: revoke it instead)" : "");
		lockd_reply_error(d, c, GF_ERR_STATE, det, false);
		return;
	}
	gf_log(GF_LOG_WARN, "lock", "msg=\"evicted\" id=%s pid=%u by=%s reason=\"evicted by an admin\"", v->peer->id,
	       v->peer->pid, p->id);
	d->evicted++;
	lockd_waiter_unlink(d, v);
	snprintf(det, sizeof(det), "evicted from the standby pool by an admin (%.127s)", p->id);
	lockd_reply_error(d, v, GF_ERR_EVICTED, det, true);
	memset(d->msg, 0, sizeof(*d->msg));
	d->msg->seq = c->seq;
	d->msg->which_body = gf_Msg_ok_tag;
	lockd_reply(d, c, d->msg);
}
