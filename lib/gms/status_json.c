/* SPDX-License-Identifier: Apache-2.0 */
/* The GMS's status as JSON: shared by the client (gf_gms_status_json) and the server (gf_gmsd_status_json). */
#include <stdint.h>

#include <jansson.h>

#include "common.h"
#include "gpufailover.h"
#include "status_json.h"

int gf_gms_status_to_json(const gf_GmsStatus *s, char **json)
{
	char hex[33] = "";
	if (s->layout_hash.size == 16)
		gf_hex(s->layout_hash.bytes, 16, hex);
	json_t *o = json_pack("{s:s, s:I, s:s, s:i, s:i, s:b, s:i, s:I, s:i, s:s, s:i, s:s, s:I}", "state",
			      gf_gms_state_name(s->state), "generation", (json_int_t)s->generation, "layout_hash", hex,
			      "readers", (int)s->readers, "waiters", (int)s->waiters, "writer", (int)s->writer,
			      "allocation_count", (int)s->allocation_count, "allocation_bytes",
			      (json_int_t)s->allocation_bytes, "metadata_count", (int)s->metadata_count, "backend",
			      s->backend, "device", (int)s->device, "device_uuid", s->device_uuid, "uptime_ms",
			      (json_int_t)s->uptime_ms);
	if (o) {
		json_object_set_new(o, "sleeping", json_integer(s->sleeping));
		json_object_set_new(o, "connections", json_integer(s->connections));
		json_object_set_new(o, "fd_limit", json_integer(s->fd_limit > INT64_MAX ? -1 : (json_int_t)s->fd_limit));
		json_object_set_new(o, "accept_paused", json_integer((json_int_t)s->accept_paused));
		json_object_set_new(o, "fenced", json_boolean(s->fenced));
		json_object_set_new(o, "fence_refusals", json_integer((json_int_t)s->fence_refusals));
		json_object_set_new(o, "resident_tier", json_string(s->resident_tier));
		json_object_set_new(o, "resident_seconds", json_real(s->resident_seconds));
		json_object_set_new(o, "pinned", json_boolean(s->pinned));
		json_object_set_new(o, "min_resident_seconds", json_real(s->min_resident_seconds));
		json_object_set_new(o, "demote_below_free_bytes", json_integer((json_int_t)s->demote_below_free_bytes));
		json_object_set_new(o, "demotions", json_integer((json_int_t)s->demotions));
		json_object_set_new(o, "pinned_bytes", json_integer((json_int_t)s->pinned_bytes));
		json_object_set_new(o, "pinned_exact", json_boolean(s->pinned_exact));
		json_t *pins = json_array();
		for (pb_size_t i = 0; pins && i < s->pinned_by_count; i++) {
			const gf_GmsPinned *p = &s->pinned_by[i];
			json_array_append_new(pins, json_pack("{s:i, s:s, s:I, s:i, s:I, s:s, s:I}", "pid", (int)p->pid, "peer",
							      p->peer, "bytes", (json_int_t)p->bytes, "allocations",
							      (int)p->allocations, "generation", (json_int_t)p->generation,
							      "reason", p->reason, "since_unix_ms", (json_int_t)p->since_unix_ms));
		}
		json_object_set_new(o, "pinned_by", pins ? pins : json_null());
		const gf_GmsWriterProgress *w = &s->writer_progress;
		json_object_set_new(
			o, "writer_progress",
			s->has_writer_progress
				? json_pack("{s:s, s:i, s:I, s:i, s:I, s:i, s:I, s:I, s:I, s:i}", "peer", w->peer, "pid",
					    (int)w->pid, "granted_unix_ms", (json_int_t)w->granted_unix_ms, "allocations",
					    (int)w->allocations, "allocated_bytes", (json_int_t)w->allocated_bytes,
					    "metadata", (int)w->metadata, "done_bytes", (json_int_t)w->done_bytes,
					    "total_bytes", (json_int_t)w->total_bytes, "last_progress_unix_ms",
					    (json_int_t)w->last_progress_unix_ms, "progress_reports", (int)w->progress_reports)
				: json_null());
		json_object_set_new(o, "no_writer_since_unix_ms",
				    s->has_writer_progress ? json_null() : json_integer((json_int_t)s->no_writer_since_unix_ms));
		json_object_set_new(o, "waiters_by_progress", json_integer(s->waiters_by_progress));
		const gf_GmsKvPool *kv = &s->kv_pool;
		char kvhash[33] = "";
		if (kv->layout_hash.size == 16)
			gf_hex(kv->layout_hash.bytes, 16, kvhash);
		json_object_set_new(o, "kv_pool",
				    s->has_kv_pool
					    ? json_pack("{s:I, s:I, s:b, s:I, s:i, s:s, s:i, s:I, s:I, s:s, s:s}", "size",
							(json_int_t)kv->size, "block_bytes", (json_int_t)kv->block_bytes,
							"mapped", (int)kv->mapped, "epoch", (json_int_t)kv->epoch, "pid",
							(int)kv->pid, "peer", kv->peer, "blocks", (int)kv->blocks, "maps",
							(json_int_t)kv->maps, "refusals", (json_int_t)kv->refusals, "start",
							kv->start, "layout_hash", kvhash)
					    : json_null());
		const gf_GmsDemotion *l = &s->last_demotion;
		json_object_set_new(o, "last_demotion",
				    s->has_last_demotion
					    ? json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I}", "from", l->from, "to", l->to,
							"reason", l->reason, "detail", l->detail, "at_unix_ms",
							(json_int_t)l->at_unix_ms, "generation", (json_int_t)l->generation,
							"bytes", (json_int_t)l->bytes)
					    : json_null());
	}
	json_t *evs = json_array();
	for (pb_size_t i = 0; o && evs && i < s->events_count; i++)
		json_array_append_new(evs, json_pack("{s:I, s:s}", "at_us", (json_int_t)s->events[i].at_us, "what",
						     s->events[i].what));
	json_t *tiers = json_object();
	for (pb_size_t i = 0; o && tiers && i < s->tiers_count; i++) {
		const gf_GmsTier *t = &s->tiers[i];
		json_object_set_new(tiers, t->name,
				    json_pack("{s:s, s:b, s:I, s:I, s:I, s:f, s:s}", "dir", t->dir, "present", (int)t->present,
					      "bytes", (json_int_t)t->bytes, "allocations", (json_int_t)t->allocations,
					      "generation", (json_int_t)t->generation, "age_seconds", t->age_seconds,
					      "error", t->error));
	}
	if (o && tiers) {
		json_object_set_new(o, "tiers", tiers);
		tiers = NULL;
		const gf_GmsOperation *op = &s->operation;
		json_object_set_new(o, "operation",
				    s->has_operation
					    ? json_pack("{s:s, s:s, s:s, s:I, s:f}", "kind", op->kind, "phase", op->phase,
							"reason", op->reason, "bytes", (json_int_t)op->bytes, "seconds",
							op->seconds)
					    : json_null());
	}
	json_decref(tiers);
	char *text = NULL;
	if (o && evs) {
		json_object_set_new(o, "events", evs);
		evs = NULL;
		text = json_dumps(o, JSON_COMPACT);
	}
	json_decref(evs);
	json_decref(o);
	if (!text)
		return gf_err(GF_ERR_NOMEM, "status: JSON encoding failed");
	*json = text;
	return 0;
}
