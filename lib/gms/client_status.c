/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GMS client: the one-shot calls (status JSON, ping, waiting for a commit,
 * snapshot and restore requests). Each opens its own short session; none
 * takes the GMS lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "client_session.h"
#include "common.h"
#include "gpufailover.h"

/* One request on a session of its own; *m holds the reply (checked for errors and for @want). */
static int one_shot(const char *uri, int64_t timeout_ms, gf_Msg *m, pb_size_t want)
{
	struct gf_uri u;
	struct gf_frame_reader rd;
	int fd, rc;
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	if (!uri)
		return gf_err(GF_ERR_INVALID_ARG, "%s: URI is NULL", gf_msg_name(m));
	if ((rc = gf_uri_parse(uri, &u)) < 0)
		return rc;
	if ((rc = gf_gms_open_session(uri, &u, deadline, &fd, &rd, 0)) < 0)
		return rc;
	m->seq = 1;
	rc = gf_msg_send(fd, m, NULL, 0, deadline);
	if (rc == 0)
		rc = gf_msg_recv(&rd, fd, m, NULL, NULL, deadline);
	if (rc == 0 && (rc = gf_msg_error_code(m)) == 0 && m->which_body != want)
		rc = gf_err(GF_ERR_PROTOCOL, "expected another reply, got %s", gf_msg_name(m));
	gf_frame_reader_clear(&rd);
	gf_close(fd);
	return rc;
}

static int tier_request(const char *uri, const char *dir, int64_t timeout_ms, bool snapshot)
{
	if (dir && strlen(dir) >= sizeof(((gf_GmsSnapshot *)0)->dir))
		return gf_err(GF_ERR_INVALID_ARG, "%s: directory path longer than %zu bytes", snapshot ? "snapshot" : "restore",
			      sizeof(((gf_GmsSnapshot *)0)->dir) - 1);
	gf_Msg *m = gf_msg_new();
	if (!m)
		return gf_err(GF_ERR_NOMEM, "out of memory");
	if (snapshot) {
		m->which_body = gf_Msg_gms_snapshot_tag;
		snprintf(m->body.gms_snapshot.dir, sizeof(m->body.gms_snapshot.dir), "%s", dir ? dir : "");
	} else {
		m->which_body = gf_Msg_gms_restore_tag;
		snprintf(m->body.gms_restore.dir, sizeof(m->body.gms_restore.dir), "%s", dir ? dir : "");
	}
	int rc = one_shot(uri, timeout_ms, m, gf_Msg_ok_tag);
	gf_msg_free(m);
	return rc;
}

int gf_gms_snapshot(const char *uri, const char *dir, int64_t timeout_ms)
{
	return tier_request(uri, dir, timeout_ms, true);
}

int gf_gms_restore(const char *uri, const char *dir, int64_t timeout_ms)
{
	return tier_request(uri, dir, timeout_ms, false);
}

int gf_gms_demote(const char *uri, int to, int64_t timeout_ms)
{
	if (to != GF_GMS_TIER_ANY && to != GF_GMS_TIER_WARM && to != GF_GMS_TIER_COLD)
		return gf_err(GF_ERR_INVALID_ARG, "demote: unknown tier %d", to);
	gf_Msg *m = gf_msg_new();
	if (!m)
		return gf_err(GF_ERR_NOMEM, "out of memory");
	m->which_body = gf_Msg_gms_demote_tag;
	snprintf(m->body.gms_demote.to, sizeof(m->body.gms_demote.to), "%s",
		 to == GF_GMS_TIER_WARM ? "warm" : to == GF_GMS_TIER_COLD ? "cold" : "");
	int rc = one_shot(uri, timeout_ms, m, gf_Msg_ok_tag);
	gf_msg_free(m);
	return rc;
}

static int fetch_status(const char *uri, int64_t timeout_ms, gf_Msg *m)
{
	struct gf_uri u;
	struct gf_frame_reader rd;
	int fd, rc;
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	if (!uri)
		return gf_err(GF_ERR_INVALID_ARG, "status: URI is NULL");
	if ((rc = gf_uri_parse(uri, &u)) < 0)
		return rc;
	if ((rc = gf_gms_open_session(uri, &u, deadline, &fd, &rd, 0)) < 0)
		return rc;
	memset(m, 0, sizeof(*m));
	m->seq = 1;
	m->which_body = gf_Msg_gms_status_request_tag;
	rc = gf_msg_send(fd, m, NULL, 0, deadline);
	if (rc == 0)
		rc = gf_msg_recv(&rd, fd, m, NULL, NULL, deadline);
	if (rc == 0 && (rc = gf_msg_error_code(m)) == 0 && m->which_body != gf_Msg_gms_status_tag)
		rc = gf_err(GF_ERR_PROTOCOL, "status: expected gms_status, got %s", gf_msg_name(m));
	gf_frame_reader_clear(&rd);
	gf_close(fd);
	return rc;
}

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

int gf_gms_status_json(const char *uri, int64_t timeout_ms, char **json)
{
	if (!json)
		return gf_err(GF_ERR_INVALID_ARG, "status_json: json is NULL");
	gf_Msg *m = gf_msg_new();
	if (!m)
		return gf_err(GF_ERR_NOMEM, "status: out of memory");
	int rc = fetch_status(uri, timeout_ms, m);
	if (rc == 0)
		rc = gf_gms_status_to_json(&m->body.gms_status, json);
	gf_msg_free(m);
	return rc;
}

int gf_gms_ping(const char *uri, int64_t timeout_ms, int64_t *rtt_us)
{
	gf_Msg *m = gf_msg_new();
	if (!m)
		return gf_err(GF_ERR_NOMEM, "ping: out of memory");
	int64_t t0 = gf_now_us();
	int rc = fetch_status(uri, timeout_ms, m);
	gf_msg_free(m);
	if (rc == 0 && rtt_us)
		*rtt_us = gf_now_us() - t0;
	return rc;
}

/* The deadline passed: a GMS that never answered is unreachable (a probe
 * should say so), one that answered without a committed layout timed out. */
static int wait_committed_expired(const char *uri, int last)
{
	if (last == GF_ERR_UNREACHABLE || last == GF_ERR_CLOSED)
		return gf_err(GF_ERR_UNREACHABLE, "%s: not reachable before the timeout (last: %s)", uri,
			      gf_error_detail());
	return gf_err(GF_ERR_TIMEOUT, "%s: no committed layout in time", uri);
}

int gf_gms_wait_committed(const char *uri, int64_t timeout_ms, uint64_t *generation)
{
	gf_Msg *m = gf_msg_new();
	if (!m)
		return gf_err(GF_ERR_NOMEM, "wait_committed: out of memory");
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	int rc = 0; /* the last try's result; none yet */
	for (;;) {
		int64_t left = deadline == INT64_MAX ? -1 : (deadline - gf_now_us()) / 1000;
		if (left == 0 || (left < 0 && deadline != INT64_MAX)) {
			rc = wait_committed_expired(uri, rc);
			break;
		}
		rc = fetch_status(uri, left < 0 || left > 1000 ? 1000 : left, m);
		if (rc == 0 && (m->body.gms_status.state == gf_GmsState_GMS_STATE_COMMITTED ||
				m->body.gms_status.state == gf_GmsState_GMS_STATE_RO)) {
			if (generation)
				*generation = m->body.gms_status.generation;
			break;
		}
		if (rc == GF_ERR_PERMISSION || rc == GF_ERR_PROTOCOL || rc == GF_ERR_VERSION ||
		    rc == GF_ERR_INVALID_ARG)
			break;
		if (gf_now_us() + 50000 >= deadline) {
			rc = wait_committed_expired(uri, rc);
			break;
		}
		usleep(50000);
	}
	gf_msg_free(m);
	return rc;
}
