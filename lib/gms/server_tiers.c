/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS server as its residency tiers see it (lib/tiers/residency.h): the
 * layout to snapshot, a restored layout to adopt, a demotion's drop; and the
 * tier requests of its clients (snapshot, restore, demote).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server_int.h"

static void host_layout(void *host, struct tiers_host_layout *l)
{
	gf_gmsd *d = host;
	*l = (struct tiers_host_layout){
		.empty = d->fsm.state == GMS_EMPTY,
		.hot = d->fsm.state == GMS_COMMITTED || d->fsm.state == GMS_RO,
		.writer = d->fsm.state == GMS_RW,
		.readers = d->fsm.readers,
		.state = gms_state_name(d->fsm.state),
		.generation = d->generation,
		.allocations = d->nallocs,
		.bytes = d->alloc_bytes,
		.pinned_bytes = gms_pins_bytes(&d->pins),
	};
	memcpy(l->hash, d->hash, 16);
	size_t len = 0;
	for (size_t i = 0; i < d->pins.nretired; i++)
		for (size_t k = 0; k < d->pins.retired[i].nholders && len < sizeof(l->pinned_by); k++) {
			const struct gms_pin_holder *h = &d->pins.retired[i].h[k];
			if (h->bytes)
				len += (size_t)snprintf(l->pinned_by + len, sizeof(l->pinned_by) - len, "%spid %u (%s) %llu bytes",
							len ? ", " : "", h->pid, h->peer, (unsigned long long)h->bytes);
		}
}

/* The committed layout as a snapshot job (a manifest and one exported fd per allocation), held like a reader. */
static int host_export(void *host, struct tiers_manifest **out, int **out_fds)
{
	gf_gmsd *d = host;
	if (d->fsm.state != GMS_COMMITTED && d->fsm.state != GMS_RO)
		return gf_err(GF_ERR_STATE, "snapshot: no committed layout (state %s)", gms_state_name(d->fsm.state));
	struct tiers_manifest *mf = tiers_manifest_new();
	int *fds = malloc((d->nallocs ? d->nallocs : 1) * sizeof(*fds));
	int rc = 0;
	if (!mf || !fds || !(mf->allocs = calloc(d->nallocs ? d->nallocs : 1, sizeof(*mf->allocs))) ||
	    !(mf->meta = calloc(d->nmeta ? d->nmeta : 1, sizeof(*mf->meta))))
		rc = gf_err(GF_ERR_NOMEM, "snapshot: out of memory");
	size_t nfds = 0;
	for (size_t i = 0; rc == 0 && i < d->nallocs; i++) {
		mf->allocs[i].id = d->allocs[i].id;
		mf->allocs[i].size = d->allocs[i].size;
		memcpy(mf->allocs[i].tag, d->allocs[i].tag, sizeof(mf->allocs[i].tag));
		mf->nallocs = i + 1;
		rc = gf_mem_export(d->allocs[i].a, &fds[i]);
		nfds += rc == 0;
	}
	for (size_t i = 0; rc == 0 && i < d->nmeta; i++) {
		struct tiers_snap_meta *e = &mf->meta[i];
		e->key = strdup(d->meta[i].key);
		e->value = malloc(d->meta[i].value_len ? d->meta[i].value_len : 1);
		mf->nmeta = i + 1;
		if (!e->key || !e->value) {
			rc = gf_err(GF_ERR_NOMEM, "snapshot: out of memory");
			break;
		}
		memcpy(e->value, d->meta[i].value, d->meta[i].value_len);
		e->value_len = d->meta[i].value_len;
		e->alloc_id = d->meta[i].alloc_id;
		e->offset = d->meta[i].offset;
	}
	if (rc < 0) {
		gf_close_fds(fds, nfds);
		free(fds);
		tiers_manifest_free(mf);
		return rc;
	}
	mf->generation = d->generation;
	memcpy(mf->layout_hash, d->hash, 16);
	/* No writer replaces the layout while the job reads it. */
	gms_fsm_apply(&d->fsm, GMS_GRANT_RO);
	*out = mf;
	*out_fds = fds;
	return 0;
}

static void host_release(void *host)
{
	gf_gmsd *d = host;
	gms_fsm_reader_left(&d->fsm);
	d->changed = true;
}

/* Adopt a verified restore: allocations, metadata, generation and hash exactly as snapshotted; EMPTY -> COMMITTED. */
static int host_adopt(void *host, struct tiers_manifest *mf, gf_mem_alloc **allocs)
{
	gf_gmsd *d = host;
	if (d->fsm.state != GMS_EMPTY)
		return gf_err(GF_ERR_STATE, "restore: the GMS is %s, not EMPTY", gms_state_name(d->fsm.state));
	size_t cap = 512;
	while (cap < 2 * mf->nmeta)
		cap *= 2;
	struct galloc *ga = calloc(mf->nallocs ? mf->nallocs : 1, sizeof(*ga));
	struct gmeta *gm = calloc(mf->nmeta ? mf->nmeta : 1, sizeof(*gm));
	/* The index is sized while the table is still empty: nothing fails once the restore is taken over. */
	if (!ga || !gm || gmsd_index_rebuild(d, cap) < 0) {
		free(ga);
		free(gm);
		return gf_err(GF_ERR_NOMEM, "restore: out of memory");
	}
	/* Final bytes, as after a commit (host: sealed; cuda cannot enforce it). */
	for (size_t i = 0; i < mf->nallocs; i++) {
		int src = gf_mem_seal(allocs[i]);
		if (src < 0 && src != GF_ERR_NOT_SUPPORTED) {
			free(ga);
			free(gm);
			return src;
		}
	}
	uint64_t bytes = 0;
	for (size_t i = 0; i < mf->nallocs; i++) {
		ga[i] = (struct galloc){ .id = mf->allocs[i].id, .a = allocs[i], .size = mf->allocs[i].size,
					 .requested = mf->allocs[i].size };
		memcpy(ga[i].tag, mf->allocs[i].tag, sizeof(ga[i].tag));
		bytes += mf->allocs[i].size;
	}
	for (size_t i = 0; i < mf->nmeta; i++) {
		/* Taken over from the manifest, which is freed without them. */
		gm[i] = (struct gmeta){ .key = mf->meta[i].key, .alloc_id = mf->meta[i].alloc_id,
					.offset = mf->meta[i].offset, .value = mf->meta[i].value,
					.value_len = mf->meta[i].value_len };
		mf->meta[i].key = NULL;
		mf->meta[i].value = NULL;
	}
	free(d->allocs);
	free(d->meta);
	d->allocs = ga;
	d->nallocs = d->allocs_cap = mf->nallocs;
	d->meta = gm;
	d->nmeta = d->meta_cap = mf->nmeta;
	d->next_alloc_id = mf->nallocs + 1;
	d->alloc_bytes = bytes;
	gmsd_index_fill(d);
	d->generation = mf->generation;
	memcpy(d->hash, mf->layout_hash, 16);
	gms_fsm_restored(&d->fsm);
	d->changed = true;
	return 0;
}

/* A demotion: the layout is kept in a lower tier, free it here. */
static int host_drop(void *host)
{
	gf_gmsd *d = host;
	if (!gms_fsm_demoted(&d->fsm))
		return gf_err(GF_ERR_BUSY, "the layout is in use (state %s)", gms_state_name(d->fsm.state));
	gmsd_drop_layout(d, "demotion");
	d->changed = true;
	return 0;
}

static void host_event(void *host, const char *text)
{
	gmsd_event(host, "%s", text);
}

static void host_answer(void *host, enum tiers_residency_wait what, int err, const char *detail)
{
	gf_gmsd *d = host;
	for (struct client *c = gmsd_next_client(d, NULL); c; c = gmsd_next_client(d, c)) {
		if (c->tier_wait != what)
			continue;
		c->tier_wait = 0;
		if (err < 0) {
			gmsd_reply_error(d, c, c->tier_seq, err, "%s: %s",
				    what == TIERS_WAIT_SNAPSHOT ? "snapshot failed" : what == TIERS_WAIT_RESTORE ? "restore" : "demote",
				    detail);
			continue;
		}
		if (what == TIERS_WAIT_DEMOTION && d->pins.nretired) {
			/* The answer (and the status it is read with) says what the drop really freed. */
			c->settling = true;
			c->settle_until_us = gf_now_us() + GMS_PINS_SETTLE_US;
			continue;
		}
		memset(d->out, 0, sizeof(*d->out));
		d->out->seq = c->tier_seq;
		d->out->which_body = gf_Msg_ok_tag;
		gmsd_send_msg(d, c, NULL, 0);
	}
}

static void on_tier_ready(void *ctx, struct gf_srv_watch *w)
{
	(void)w;
	tiers_residency_process(((gf_gmsd *)ctx)->res);
}

static int host_watch(void *host, int fd)
{
	gf_gmsd *d = host;
	d->tier_watch.fn = on_tier_ready;
	return gf_srv_watch_add(d->srv, fd, &d->tier_watch);
}

const struct tiers_residency_host gmsd_residency_host = {
	.layout = host_layout,
	.export_layout = host_export,
	.release = host_release,
	.adopt = host_adopt,
	.drop = host_drop,
	.event = host_event,
	.answer = host_answer,
	.watch = host_watch,
};

int gf_gmsd_restore(gf_gmsd *d, const char *dir)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	return tiers_residency_restore(d->res, dir);
}

int gf_gmsd_snapshot(gf_gmsd *d, const char *dir)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	return tiers_residency_snapshot(d->res, dir && *dir ? dir : NULL);
}

/* Root or the server's own uid: the operator's own tools. */
static bool admin_peer(const struct client *c)
{
	return c->p->uid == 0 || c->p->uid == (uint32_t)geteuid();
}

/*
 * A directory a client names for a snapshot or a restore. The GMS (often
 * root) reads and writes there on the client's behalf: any other allowed
 * peer may name only a kept tier (or none), or it could write into, or
 * restore and then map, what only the GMS's uid can reach (a confused
 * deputy). 0, or the refusal sent.
 */
static int client_dir_allowed(gf_gmsd *d, struct client *c, uint32_t seq, const char *what, const char *dir)
{
	if (!dir || admin_peer(c) || tiers_residency_is_tier_dir(d->res, dir))
		return 0;
	gmsd_event(d, "event=%s_refused peer=%s uid=%u reason=\"not an admin uid: only a kept tier\"", what, c->peer,
	      c->p->uid);
	gmsd_reply_error(d, c, seq, GF_ERR_PERMISSION,
		    "%s: only root or the server's own uid may name a directory other than the kept tiers", what);
	return GF_ERR_PERMISSION;
}

void gmsd_handle_snapshot(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const char *dir = m->body.gms_snapshot.dir[0] ? m->body.gms_snapshot.dir : NULL;
	if (client_dir_allowed(d, c, m->seq, "snapshot", dir) < 0)
		return;
	int rc = tiers_residency_snapshot(d->res, dir);
	if (rc < 0) {
		gmsd_reply_error(d, c, m->seq, rc, "%s", gf_error_detail());
		return;
	}
	c->tier_wait = TIERS_WAIT_SNAPSHOT;
	c->tier_seq = m->seq;
}

void gmsd_handle_restore(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const char *dir = m->body.gms_restore.dir[0] ? m->body.gms_restore.dir : NULL;
	if (client_dir_allowed(d, c, m->seq, "restore", dir) < 0)
		return;
	/* On the tier worker: reading and checking a snapshot never holds up the loop. */
	int rc = tiers_residency_restore_start(d->res, dir);
	if (rc < 0) {
		gmsd_reply_error(d, c, m->seq, rc, "%s", gf_error_detail());
		return;
	}
	c->tier_wait = TIERS_WAIT_RESTORE;
	c->tier_seq = m->seq;
}

void gmsd_handle_demote(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const char *to = m->body.gms_demote.to;
	/* Dropping the weights every engine sleeps on is an admin's decision, like
	 * revoking a lock: root or the server's own uid, not every allowed engine. */
	if (!admin_peer(c)) {
		gmsd_event(d, "event=demote_refused peer=%s uid=%u reason=\"not an admin uid\"", c->peer, c->p->uid);
		gmsd_reply_error(d, c, m->seq, GF_ERR_PERMISSION, "demote: only root or the server's own uid may demote");
		return;
	}
	enum tier want = !*to ? TIER_HOT : !strcmp(to, "warm") ? TIER_WARM : !strcmp(to, "cold") ? TIER_COLD : TIER_LOADER;
	if (want == TIER_LOADER) {
		gmsd_reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "demote: to must be warm, cold or empty, not '%s'", to);
		return;
	}
	char why[160];
	snprintf(why, sizeof(why), "requested by peer=%s pid=%u", c->peer, c->pid);
	/* Waiting first: a demotion that ends at once answers it; one refused to begin (busy) does not. */
	c->tier_wait = TIERS_WAIT_DEMOTION;
	c->tier_seq = m->seq;
	int rc = tiers_residency_demote(d->res, want, why);
	if (rc < 0 && c->tier_wait == TIERS_WAIT_DEMOTION) {
		c->tier_wait = 0;
		gmsd_reply_error(d, c, m->seq, rc, "%s", gf_error_detail());
	}
}

int gf_gmsd_demote(gf_gmsd *d, int to)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	if (to != GF_GMS_TIER_ANY && to != GF_GMS_TIER_WARM && to != GF_GMS_TIER_COLD)
		return gf_err(GF_ERR_INVALID_ARG, "demote: unknown tier %d", to);
	return tiers_residency_demote(d->res, (enum tier)to, "requested in process");
}
