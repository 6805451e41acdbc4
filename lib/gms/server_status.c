/* SPDX-License-Identifier: Apache-2.0 */
/* The GMS server's status (GmsStatus, its JSON) and its metrics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"
#include "status_json.h"

/* Everything status reports, for the wire, the JSON and the metrics. */
static void fill_status(gf_gmsd *d, gf_GmsStatus *s)
{
	memset(s, 0, sizeof(*s));
	s->state = (gf_GmsState)d->fsm.state;
	s->generation = d->generation;
	if (d->fsm.state == GMS_COMMITTED || d->fsm.state == GMS_RO) {
		memcpy(s->layout_hash.bytes, d->hash, 16);
		s->layout_hash.size = 16;
	}
	s->readers = d->fsm.readers;
	for (struct client *x = gmsd_next_client(d, NULL); x; x = gmsd_next_client(d, x)) {
		if (x->phase == C_WAIT)
			s->waiters++;
		if (x->phase == C_WAIT && x->by_progress)
			s->waiters_by_progress++;
		if (x->parked)
			s->sleeping++;
	}
	s->allocation_count = (uint32_t)d->nallocs;
	s->allocation_bytes = d->alloc_bytes;
	s->writer = d->fsm.state == GMS_RW;
	struct client *w = gmsd_writer_client(d);
	if (w) {
		gf_GmsWriterProgress *o = &s->writer_progress;
		s->has_writer_progress = true;
		snprintf(o->peer, sizeof(o->peer), "%s", w->peer);
		o->pid = w->pid;
		o->granted_unix_ms = d->w_granted_wall_us / 1000;
		o->allocations = (uint32_t)d->nallocs;
		o->allocated_bytes = d->alloc_bytes;
		o->metadata = (uint32_t)d->nmeta;
		o->done_bytes = d->w_done;
		o->total_bytes = d->w_total;
		o->last_progress_unix_ms = d->wmark_wall_us / 1000;
		o->progress_reports = d->w_reports;
	} else {
		s->no_writer_since_unix_ms = d->wmark_wall_us / 1000;
	}
	snprintf(s->backend, sizeof(s->backend), "%s", gf_mem_kind_name(gf_mem_kind(d->mem)));
	s->device = (uint32_t)d->device;
	snprintf(s->device_uuid, sizeof(s->device_uuid), "%s", d->uuid);
	s->uptime_ms = (gf_now_us() - d->started_us) / 1000;
	s->metadata_count = (uint32_t)d->nmeta;
	struct gf_srv_stats st;
	gf_srv_stats(d->srv, &st);
	s->connections = st.connections;
	s->fd_limit = st.fd_limit;
	s->accept_paused = st.accept_paused;
	s->fenced = d->lock_uri != NULL;
	s->fence_refusals = d->fence_refusals;
	/* Looked at now: the figure an operator or a demotion's answer reads is current. */
	gms_pins_scan(&d->pins);
	s->pinned_exact = gmsd_pins_exact(d);
	s->pinned_bytes = gms_pins_bytes(&d->pins);
	for (size_t i = 0; i < d->pins.nretired; i++)
		for (size_t k = 0; k < d->pins.retired[i].nholders && s->pinned_by_count < GF_ARRAY_SIZE(s->pinned_by); k++) {
			const struct gms_retired *r = &d->pins.retired[i];
			gf_GmsPinned *o = &s->pinned_by[s->pinned_by_count++];
			o->pid = r->h[k].pid;
			snprintf(o->peer, sizeof(o->peer), "%s", r->h[k].peer);
			o->bytes = r->h[k].bytes;
			o->allocations = r->h[k].allocs;
			o->generation = r->generation;
			snprintf(o->reason, sizeof(o->reason), "%s", r->reason);
			o->since_unix_ms = r->at_unix_ms;
		}
	/* oldest first */
	size_t first = (d->ev_next + GMSD_EVENTS - d->ev_count) % GMSD_EVENTS;
	for (size_t i = 0; i < d->ev_count; i++) {
		const struct gevent *e = &d->events[(first + i) % GMSD_EVENTS];
		s->events[s->events_count].at_us = e->at_us;
		snprintf(s->events[s->events_count].what, sizeof(s->events[0].what), "%s", e->what);
		s->events_count++;
	}
	tiers_residency_status(d->res, s);
	gmsd_kv_fill_status(d, s);
}

void gmsd_handle_status(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_gms_status_tag;
	fill_status(d, &d->out->body.gms_status);
	gmsd_send_msg(d, c, NULL, 0);
}

int gf_gmsd_status_json(gf_gmsd *d, char **json)
{
	if (!d || !json)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gmsd_status_json: NULL argument");
	gf_GmsStatus *s = malloc(sizeof(*s));
	if (!s)
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	fill_status(d, s);
	int rc = gf_gms_status_to_json(s, json);
	free(s);
	return rc;
}

int gf_gmsd_metrics(gf_gmsd *d, char **text)
{
	if (!d || !text)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gmsd_metrics: NULL argument");
	gf_GmsStatus *s = malloc(sizeof(*s));
	char *buf = NULL;
	size_t len = 0;
	FILE *f = s ? open_memstream(&buf, &len) : NULL;
	if (!f) {
		free(s);
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	}
	fill_status(d, s);
	fputs("# HELP gf_gms_state Lock state of the GMS: 1 for the current state, 0 for the others.\n"
	      "# TYPE gf_gms_state gauge\n", f);
	for (int st = GF_GMS_STATE_EMPTY; st <= GF_GMS_STATE_RO; st++)
		fprintf(f, "gf_gms_state{state=\"%s\"} %d\n", gf_gms_state_name(st), (int)s->state == st);
	fprintf(f, "# HELP gf_gms_generation Generation of the committed layout (0: none).\n"
		   "# TYPE gf_gms_generation gauge\ngf_gms_generation %llu\n"
		   "# HELP gf_gms_readers Readers holding the RO lock.\n# TYPE gf_gms_readers gauge\ngf_gms_readers %u\n"
		   "# HELP gf_gms_waiters Connections waiting for a lock.\n# TYPE gf_gms_waiters gauge\ngf_gms_waiters %u\n"
		   "# HELP gf_gms_sleeping Readers asleep on a kept session, holding their handles.\n"
		   "# TYPE gf_gms_sleeping gauge\ngf_gms_sleeping %u\n"
		   "# HELP gf_gms_allocations Allocations in the layout.\n"
		   "# TYPE gf_gms_allocations gauge\ngf_gms_allocations %u\n"
		   "# HELP gf_gms_allocation_bytes Bytes allocated for the layout.\n"
		   "# TYPE gf_gms_allocation_bytes gauge\ngf_gms_allocation_bytes %llu\n"
		   "# HELP gf_gms_connections Open connections.\n"
		   "# TYPE gf_gms_connections gauge\ngf_gms_connections %u\n"
		   "# HELP gf_gms_fd_limit The soft RLIMIT_NOFILE: bounds connections and host allocations.\n"
		   "# TYPE gf_gms_fd_limit gauge\ngf_gms_fd_limit %llu\n"
		   "# HELP gf_gms_fenced 1 when a layout drop needs the lock's current epoch (gf-gmsd --lock).\n"
		   "# TYPE gf_gms_fenced gauge\ngf_gms_fenced %d\n"
		   "# HELP gf_gms_fence_refusals_total RW requests refused by the lock fence.\n"
		   "# TYPE gf_gms_fence_refusals_total counter\ngf_gms_fence_refusals_total %llu\n"
		   "# HELP gf_gms_pinned_bytes Bytes of dropped layouts that released sleepers still hold.\n"
		   "# TYPE gf_gms_pinned_bytes gauge\ngf_gms_pinned_bytes %llu\n"
		   "# HELP gf_gms_pinned_exact 1 when those holders are seen (host), 0 for a lower bound (cuda).\n"
		   "# TYPE gf_gms_pinned_exact gauge\ngf_gms_pinned_exact %d\n",
		(unsigned long long)s->generation, s->readers, s->waiters, s->sleeping, s->allocation_count,
		(unsigned long long)s->allocation_bytes, s->connections, (unsigned long long)s->fd_limit, s->fenced ? 1 : 0,
		(unsigned long long)s->fence_refusals, (unsigned long long)s->pinned_bytes, s->pinned_exact ? 1 : 0);
	fprintf(f, "# HELP gf_gms_waiters_by_progress Waiters whose timeout counts only while no writer makes progress.\n"
		   "# TYPE gf_gms_waiters_by_progress gauge\ngf_gms_waiters_by_progress %u\n"
		   "# HELP gf_gms_writer_connected 1 while a writer holds RW.\n"
		   "# TYPE gf_gms_writer_connected gauge\ngf_gms_writer_connected %d\n"
		   "# HELP gf_gms_writer_idle_seconds Seconds since the writer's last progress, or without one since a writer last held RW.\n"
		   "# TYPE gf_gms_writer_idle_seconds gauge\ngf_gms_writer_idle_seconds %.3f\n",
		s->waiters_by_progress, s->has_writer_progress ? 1 : 0,
		(double)(gf_now_us() - d->wmark_us) / 1e6);
	if (s->pinned_by_count)
		fputs("# HELP gf_gms_pinned_by_bytes Bytes of a dropped layout one released sleeper still holds.\n"
		      "# TYPE gf_gms_pinned_by_bytes gauge\n", f);
	for (pb_size_t i = 0; i < s->pinned_by_count; i++)
		fprintf(f, "gf_gms_pinned_by_bytes{pid=\"%u\",peer=\"%s\",generation=\"%llu\"} %llu\n", s->pinned_by[i].pid,
			s->pinned_by[i].peer, (unsigned long long)s->pinned_by[i].generation,
			(unsigned long long)s->pinned_by[i].bytes);
	if (s->has_kv_pool)
		fprintf(f, "# HELP gf_gms_kv_pool_bytes Size of the KV pool (docs/gms.md).\n"
			   "# TYPE gf_gms_kv_pool_bytes gauge\ngf_gms_kv_pool_bytes %llu\n"
			   "# HELP gf_gms_kv_pool_mapped 1 while a lock holder maps the KV pool.\n"
			   "# TYPE gf_gms_kv_pool_mapped gauge\ngf_gms_kv_pool_mapped %d\n"
			   "# HELP gf_gms_kv_pool_epoch Lock epoch of the KV pool's last map (the directory's owner).\n"
			   "# TYPE gf_gms_kv_pool_epoch gauge\ngf_gms_kv_pool_epoch %llu\n"
			   "# HELP gf_gms_kv_pool_blocks Finished blocks in the KV pool's directory.\n"
			   "# TYPE gf_gms_kv_pool_blocks gauge\ngf_gms_kv_pool_blocks %u\n"
			   "# HELP gf_gms_kv_pool_refusals_total KV pool maps and publishes refused.\n"
			   "# TYPE gf_gms_kv_pool_refusals_total counter\ngf_gms_kv_pool_refusals_total %llu\n",
			(unsigned long long)s->kv_pool.size, s->kv_pool.mapped ? 1 : 0, (unsigned long long)s->kv_pool.epoch,
			s->kv_pool.blocks, (unsigned long long)s->kv_pool.refusals);
	tiers_residency_metrics(d->res, s, f);
	free(s);
	if (fclose(f) != 0) {
		free(buf);
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	}
	*text = buf;
	return 0;
}
