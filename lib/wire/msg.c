/* SPDX-License-Identifier: Apache-2.0 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pb_common.h>
#include <pb_decode.h>
#include <pb_encode.h>

#include "wire.h"

gf_Msg *gf_msg_new(void)
{
	return calloc(1, sizeof(gf_Msg));
}

void gf_msg_free(gf_Msg *m)
{
	free(m);
}

int gf_msg_encode(const gf_Msg *m, uint8_t **out, size_t *len)
{
	size_t size;
	if (!pb_get_encoded_size(&size, gf_Msg_fields, m))
		return gf_err(GF_ERR_INVALID_ARG, "encode: message cannot be encoded");
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf)
		return gf_err(GF_ERR_NOMEM, "encode: out of memory");
	pb_ostream_t s = pb_ostream_from_buffer(buf, size);
	if (!pb_encode(&s, gf_Msg_fields, m)) {
		free(buf);
		return gf_err(GF_ERR_INVALID_ARG, "encode: %s", PB_GET_ERROR(&s));
	}
	*out = buf;
	*len = s.bytes_written;
	return 0;
}

/* gf_msg_decode() decodes without nanopb's init pass and clears seq and which_body itself. */
_Static_assert(offsetof(gf_Msg, body) <= 8 && sizeof(gf_Msg) - offsetof(gf_Msg, body) - sizeof(((gf_Msg *)0)->body) < 8,
	       "gf_Msg gained a top-level field: gf_msg_decode must clear it");

/* Bytes of the union that body @tag takes (0: no body). */
static size_t body_size(gf_Msg *m, pb_size_t tag)
{
	pb_field_iter_t it;
	if (tag && pb_field_iter_begin(&it, gf_Msg_fields, m) && pb_field_iter_find(&it, tag))
		return it.data_size;
	return 0;
}

/*
 * Nothing of an earlier message survives in a gf_Msg: every byte of the
 * union past the active body is zero. A gf_Msg is as large as its largest
 * body (tens of KiB), so that is kept by clearing only what the previous
 * body used, not the whole union, on every message: the paths a failover
 * waits on decode and build several, and a cold 60 KiB memset each showed.
 */
int gf_msg_decode(const uint8_t *buf, size_t len, gf_Msg *m)
{
	size_t before = body_size(m, m->which_body);
	m->seq = 0;
	m->which_body = 0; /* so nanopb zeroes (and defaults) whatever body it decodes */
	pb_istream_t s = pb_istream_from_buffer(buf, len);
	if (!pb_decode_ex(&s, gf_Msg_fields, m, PB_DECODE_NOINIT)) {
		/* Rare (a broken or hostile peer): leave no half-decoded body behind. */
		m->which_body = 0;
		memset(&m->body, 0, sizeof(m->body));
		return gf_err(GF_ERR_PROTOCOL, "decode: %s", PB_GET_ERROR(&s));
	}
	size_t now = body_size(m, m->which_body);
	if (before > now)
		memset((uint8_t *)&m->body + now, 0, before - now);
	return 0;
}

void gf_msg_start(gf_Msg *m, pb_size_t tag)
{
	size_t before = body_size(m, m->which_body), now = body_size(m, tag);
	memset(&m->body, 0, before > now ? before : now);
	m->seq = 0;
	m->which_body = tag;
}

int gf_msg_send(int fd, const gf_Msg *m, const int *fds, size_t nfds, int64_t deadline_us)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = gf_msg_encode(m, &buf, &len);
	if (rc < 0)
		return rc;
	rc = gf_frame_send(fd, buf, len, fds, nfds, deadline_us);
	free(buf);
	return rc;
}

/* Decode the message @r holds and hand over its fds (or refuse them). */
static int take_msg(struct gf_frame_reader *r, gf_Msg *m, int **fds, size_t *nfds)
{
	int rc = gf_msg_decode(r->body, r->msg_len, m);
	if (rc == 0 && !fds && r->nfds)
		rc = gf_err(GF_ERR_PROTOCOL, "message %s carries %zu unexpected fds", gf_msg_name(m),
			    r->nfds);
	if (rc < 0) {
		gf_close_fds(r->fds, r->nfds);
		r->nfds = 0;
		return rc;
	}
	if (fds)
		gf_frame_reader_take_fds(r, fds, nfds);
	return 0;
}

int gf_msg_recv(struct gf_frame_reader *r, int fd, gf_Msg *m, int **fds, size_t *nfds,
		int64_t deadline_us)
{
	int rc = gf_frame_recv(r, fd, deadline_us);
	return rc < 0 ? rc : take_msg(r, m, fds, nfds);
}

int gf_msg_try_recv(struct gf_frame_reader *r, int fd, gf_Msg *m, int **fds, size_t *nfds)
{
	int rc = gf_frame_reader_feed(r, fd);
	if (rc < 0)
		return rc;
	rc = take_msg(r, m, fds, nfds);
	return rc < 0 ? rc : 1;
}

int gf_msg_error_code(const gf_Msg *m)
{
	if (m->which_body != gf_Msg_error_tag)
		return 0;
	int code = m->body.error.code;
	/* A peer must not make us report success or an unknown code. */
	if (code >= 0 || !gf_error_name(code))
		code = GF_ERR_PROTOCOL;
	return gf_err(code, "%s", m->body.error.detail);
}

void gf_msg_set_error(gf_Msg *m, int code, const char *detail)
{
	uint32_t seq = m->seq;
	memset(m, 0, sizeof(*m));
	m->seq = seq;
	m->which_body = gf_Msg_error_tag;
	m->body.error.code = code;
	snprintf(m->body.error.detail, sizeof(m->body.error.detail), "%s",
		 detail && *detail ? detail : gf_strerror(code));
}

const char *gf_msg_name(const gf_Msg *m)
{
	switch (m->which_body) {
#define N(x) \
	case gf_Msg_##x##_tag: \
		return #x;
		N(hello) N(welcome) N(auth) N(auth_ok) N(error) N(ok) N(lock_acquire) N(lock_granted)
		N(lock_release) N(lock_status_request) N(lock_status) N(heartbeat) N(lock_add_pids) N(gms_connect)
		N(gms_connected) N(gms_allocate) N(gms_allocated) N(gms_meta_put) N(gms_commit)
		N(gms_committed) N(gms_list) N(gms_list_chunk) N(gms_status_request) N(gms_status)
		N(gms_progress) N(gms_kv_map) N(gms_kv_mapped) N(gms_kv_publish) N(gms_kv_dir_request)
		N(gms_kv_dir)
#undef N
	default:
		return "unknown";
	}
}
