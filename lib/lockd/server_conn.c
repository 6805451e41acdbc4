/* SPDX-License-Identifier: Apache-2.0 */
/* The lock server's connections: who may administer, replies, and the FIFO of waiters. */
#include <unistd.h>

#include "server_int.h"

/* TCP peers proved the shared secret in the handshake; on unix sockets only
 * root and the server's own uid are admins, not every allowed engine. */
bool lockd_is_admin(const struct gf_srv_peer *p)
{
	return p->tcp || p->uid == 0 || p->uid == (uint32_t)geteuid();
}

int lockd_reply(gf_lockd *d, struct conn *c, gf_Msg *m)
{
	return gf_srv_send(d->srv, c->peer, m, NULL, 0);
}

/* Send an error; the connection stays unless @close_after. Returns -1 if @c was closed. */
int lockd_reply_error(gf_lockd *d, struct conn *c, int code, const char *detail, bool close_after)
{
	gf_srv_send_error(d->srv, c->peer, c->seq, code, detail, close_after);
	return c->peer->fd < 0 ? -1 : 0;
}

void lockd_waiter_unlink(gf_lockd *d, struct conn *c)
{
	if (c->role != R_WAITER)
		return;
	if (c->wprev)
		c->wprev->wnext = c->wnext;
	else
		d->whead = c->wnext;
	if (c->wnext)
		c->wnext->wprev = c->wprev;
	else
		d->wtail = c->wprev;
	c->wprev = c->wnext = NULL;
	c->role = R_NONE;
	d->nwaiters--;
}
