/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What every part of the GMS server stands on: the event ring, the writer's
 * progress, the metadata index, the drop of a layout (and the pin watcher it
 * hands its sleepers to), the connections and the replies to them. Nothing
 * here calls back into server.c, server_status.c or server_tiers.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

/* ---------------------------------------------------------------- events */

void gmsd_event(gf_gmsd *d, const char *fmt, ...)
{
	struct gevent *e = &d->events[d->ev_next];
	va_list ap;
	va_start(ap, fmt);
	gf_log_vformat(e->what, sizeof(e->what), fmt, ap); /* values escaped: logged as is below */
	va_end(ap);
	e->at_us = gf_wall_us();
	d->ev_next = (d->ev_next + 1) % GMSD_EVENTS;
	if (d->ev_count < GMSD_EVENTS)
		d->ev_count++;
	gf_log(GF_LOG_INFO, "gms", "%s", e->what);
}

/* ---------------------------------------------------------------- writer progress */

/* The writer did something (or came, or left): waiters by progress wait on from now. */
void gmsd_writer_progress(gf_gmsd *d)
{
	d->wmark_us = gf_now_us();
	d->wmark_wall_us = gf_wall_us();
}

void gmsd_writer_granted(gf_gmsd *d)
{
	gmsd_writer_progress(d);
	d->w_granted_wall_us = d->wmark_wall_us;
	d->w_done = d->w_total = 0;
	d->w_reports = 0;
}

/* The writer holding RW, or NULL. */

/* ---------------------------------------------------------------- metadata table */

uint64_t gmsd_key_hash(const char *k)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a: short keys, no need for more */
	for (; *k; k++)
		h = (h ^ (uint8_t)*k) * 1099511628211ull;
	return h;
}

/* Enter every metadata entry into the index, which has room (at most half full). */
void gmsd_index_fill(gf_gmsd *d)
{
	memset(d->index, 0, d->index_cap * sizeof(*d->index));
	for (size_t i = 0; i < d->nmeta; i++) {
		size_t p = gmsd_key_hash(d->meta[i].key) & (d->index_cap - 1);
		while (d->index[p])
			p = (p + 1) & (d->index_cap - 1);
		d->index[p] = (uint32_t)(i + 1);
	}
}

int gmsd_index_rebuild(gf_gmsd *d, size_t cap)
{
	uint32_t *idx = calloc(cap, sizeof(*idx));
	if (!idx)
		return gf_err(GF_ERR_NOMEM, "metadata index: out of memory");
	free(d->index);
	d->index = idx;
	d->index_cap = cap;
	gmsd_index_fill(d);
	return 0;
}

struct gmeta *gmsd_meta_find(gf_gmsd *d, const char *key)
{
	if (!d->index_cap)
		return NULL;
	size_t p = gmsd_key_hash(key) & (d->index_cap - 1);
	while (d->index[p]) {
		struct gmeta *m = &d->meta[d->index[p] - 1];
		if (!strcmp(m->key, key))
			return m;
		p = (p + 1) & (d->index_cap - 1);
	}
	return NULL;
}

struct galloc *gmsd_alloc_find(gf_gmsd *d, uint64_t id)
{
	/* ids are 1..n in allocation order within one layout */
	if (id == 0 || id > d->nallocs || d->allocs[id - 1].id != id)
		return NULL;
	return &d->allocs[id - 1];
}

/* ---------------------------------------------------------------- memory a released sleeper still pins */

/* Whether the dropped layouts' holders can be seen exactly: where allocations are files, /proc names them. */
bool gmsd_pins_exact(const gf_gmsd *d)
{
	return gf_mem_caps(d->mem) & GF_MEM_CAP_FILES;
}

/* The pin watcher's view of allocation @i of the layout being dropped (gms_pins_fd_fn). */
static int pins_fd_at(void *ctx, size_t i, int *fd, bool *owned, uint64_t *size)
{
	gf_gmsd *d = ctx;
	*size = d->allocs[i].size;
	return gf_mem_export_borrowed(d->allocs[i].a, fd, owned);
}

void gmsd_pins_event(void *ctx, const char *text)
{
	gmsd_event(ctx, "%s", text);
}

/* Free the layout. @reason ("new_load", "demotion", "abort", NULL at exit) names the drop in the pins it leaves. */
void gmsd_drop_layout(gf_gmsd *d, const char *reason)
{
	d->drops++;
	/* Sleeping readers (and wakes that said they kept handles) hold this
	 * layout's memory through their handles: closing their sessions is
	 * what tells them to let go (docs/gms.md, "Sleep and wake"). One that
	 * is stopped or hung does not: the GMS watches them (retire()). */
	struct gms_pin_holder *held = NULL;
	size_t nheld = 0;
	for (struct client *c = d->srv ? gmsd_next_client(d, NULL) : NULL, *n; c; c = n) {
		n = gmsd_next_client(d, c);
		if (c->parked || (c->phase == C_WAIT && c->handles_kept)) {
			gmsd_event(d, "event=sleeper_released peer=%s pid=%u reason=layout_dropped", c->peer, c->pid);
			gms_pins_note(&held, &nheld, gmsd_pins_exact(d), c->pid, c->peer);
			gmsd_client_close(d, c, "layout dropped: a sleeping reader lets go of its handles");
		}
	}
	if (nheld && reason) {
		struct gms_pins_layout l = { .generation = d->generation, .reason = reason, .exact = gmsd_pins_exact(d),
					     .bytes = d->alloc_bytes, .nallocs = d->nallocs, .fd_at = pins_fd_at, .ctx = d };
		gms_pins_retire(&d->pins, &l, held, nheld);
	}
	else
		free(held);
	for (size_t i = 0; i < d->nallocs; i++)
		gf_mem_alloc_free(d->allocs[i].a); /* importers keep the memory alive (driver refcount) */
	for (size_t i = 0; i < d->nmeta; i++) {
		free(d->meta[i].key);
		free(d->meta[i].value);
	}
	gf_close(d->mblob_fd);
	d->mblob_fd = -1;
	d->nallocs = 0;
	d->nmeta = 0;
	d->alloc_bytes = 0;
	d->next_alloc_id = 1;
	if (d->index)
		memset(d->index, 0, d->index_cap * sizeof(*d->index));
	memset(d->hash, 0, sizeof(d->hash));
}

/* ---------------------------------------------------------------- replies */

struct client *gmsd_writer_client(gf_gmsd *d)
{
	for (struct client *c = gmsd_next_client(d, NULL); c; c = gmsd_next_client(d, c))
		if (c->phase == C_WRITER || c->phase == C_ALLOC_WAIT)
			return c;
	return NULL;
}

/* Open peers that finished the handshake, in no particular order: first with NULL. */
struct client *gmsd_next_client(gf_gmsd *d, struct client *prev)
{
	struct gf_srv_peer *p = prev ? prev->p : NULL;
	while ((p = gf_srv_next_peer(d->srv, p)))
		if (p->ready)
			return p->data;
	return NULL;
}

void gmsd_client_close(gf_gmsd *d, struct client *c, const char *why)
{
	gf_srv_close(d->srv, c->p, why);
}

/* Send d->out; a peer that does not take it within the core's send deadline is closed. */
int gmsd_send_msg(gf_gmsd *d, struct client *c, const int *fds, size_t nfds)
{
	return gf_srv_send(d->srv, c->p, d->out, fds, nfds);
}

int gmsd_reply_error(gf_gmsd *d, struct client *c, uint32_t seq, int code, const char *fmt, ...)
{
	char detail[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = seq;
	gf_msg_set_error(d->out, code, detail);
	gf_log(GF_LOG_DEBUG, "gms", "event=error_sent peer=%s code=%s detail=\"%s\"", c->peer, gf_error_name(code),
	       detail);
	return gmsd_send_msg(d, c, NULL, 0);
}
