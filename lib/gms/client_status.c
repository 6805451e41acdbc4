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
#include "status_json.h"

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
