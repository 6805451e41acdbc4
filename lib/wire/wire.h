/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The wire: length-prefixed frames over stream sockets, with file
 * descriptors passed as SCM_RIGHTS ancillary data, nanopb message helpers,
 * URIs and the handshake. Used by both halves of every component.
 *
 * Frame layout (all integers little endian):
 *   u16 magic 'G''F' | u8 version | u8 flags | u16 nfds | u16 reserved | u32 length
 *   followed by `length` bytes of one encoded gf_Msg.
 * A logical message whose fds exceed GF_FDS_PER_FRAME is followed by
 * continuation frames (flag CONT, empty body) carrying the rest; every frame
 * but the last of a message has flag MORE. The nfds of each frame must match
 * the fds that actually arrived with it.
 */
#ifndef GF_WIRE_H
#define GF_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gpufailover.pb.h"
#include "schema_limits.h"

#define GF_PROTOCOL_VERSION 1
#define GF_FRAME_MAGIC 0x4647u /* "GF" little endian */
#define GF_FRAME_WIRE_VERSION 1
#define GF_FRAME_HEADER_SIZE 12
/* Every gf_Msg encodes to under 64 KiB (nanopb 16-bit field descriptors). */
#define GF_FRAME_MAX_BODY (64u * 1024)
/* Linux's SCM_MAX_FD: the kernel refuses more fds in one sendmsg. */
#define GF_FDS_PER_FRAME 253
/* Upper bound on fds in one logical message (a whole GMS layout). */
#define GF_MSG_MAX_FDS 65536

#define GF_FRAME_F_MORE 0x01 /* continuation frames with more fds follow */
#define GF_FRAME_F_CONT 0x02 /* this is a continuation frame */

/* The fields are lib/wire's own: other code uses the functions below. */
struct gf_frame_reader {
	uint8_t hdr[GF_FRAME_HEADER_SIZE];
	size_t hdr_got;
	bool hdr_done;
	uint8_t flags;
	uint16_t frame_nfds;   /* fds the current frame's header announced */
	size_t frame_fds_got;  /* fds that arrived during the current frame */
	uint32_t body_len;
	size_t body_got;
	bool in_message;       /* a MORE frame was seen; continuations expected */
	uint8_t *body;         /* body of the message's first frame */
	size_t body_cap;
	uint32_t msg_len;
	int *fds;              /* all fds of the logical message so far */
	size_t nfds, fds_cap;
	size_t max_body;       /* defaults to GF_FRAME_MAX_BODY */
	size_t max_fds;        /* 0: no fds accepted at all */
	uint8_t *ahead;        /* read-ahead: bytes received past the piece being read */
	size_t ahead_off, ahead_len;
	int *ahead_fds;        /* fds received with them, for the frame holding their last byte */
	size_t ahead_nfds;
};

/* Bytes one read may take past the frame piece it was asked for, with read-ahead on. */
#define GF_FRAME_READ_AHEAD 1024

void gf_frame_reader_init(struct gf_frame_reader *r, size_t max_fds);
/* Refuse frames whose body is larger than @max (clamped to GF_FRAME_MAX_BODY) before allocating. */
void gf_frame_reader_set_max_body(struct gf_frame_reader *r, size_t max);
/*
 * Let each read take up to GF_FRAME_READ_AHEAD bytes past the frame piece it
 * is for (a header and its body in one recvmsg, or a message and the next
 * one), kept for the following calls. Only for a reader whose caller calls
 * gf_frame_reader_feed() again after each message before it polls the fd,
 * or checks gf_frame_reader_buffered(): bytes kept here do not make the fd
 * readable. Without memory for the buffer the reader goes on without it.
 */
void gf_frame_reader_set_read_ahead(struct gf_frame_reader *r);
/* True when bytes already received wait in the reader: the next feed needs no readable fd. */
bool gf_frame_reader_buffered(const struct gf_frame_reader *r);
/* Closes fds still held and frees buffers. */
void gf_frame_reader_clear(struct gf_frame_reader *r);

/*
 * Read from @fd without blocking past what is available.
 * Returns 1 when a whole logical message is ready: its body is r->body,
 * r->msg_len bytes, and its fds r->fds[0..r->nfds). The caller takes them
 * with gf_frame_reader_take_fds() or they are closed by the next call.
 * Returns GF_ERR_AGAIN when more bytes are needed, GF_ERR_CLOSED on EOF at a
 * frame boundary, GF_ERR_PROTOCOL/TOO_BIG on bad frames (fds received are
 * closed), GF_ERR_IO on socket errors.
 */
int gf_frame_reader_feed(struct gf_frame_reader *r, int fd);
/* True while a frame (or a message's continuation frames) is half read. */
bool gf_frame_reader_partial(const struct gf_frame_reader *r);
/* Move the ready message's fds to the caller (*fds malloc'd, may be NULL when n==0). */
void gf_frame_reader_take_fds(struct gf_frame_reader *r, int **fds, size_t *nfds);

/* Blocking read of one logical message, until @deadline_us (INT64_MAX: none). */
int gf_frame_recv(struct gf_frame_reader *r, int fd, int64_t deadline_us);

/*
 * Send one logical message: @body of @len bytes and @nfds fds (split into
 * continuation frames above GF_FDS_PER_FRAME). Works on blocking and
 * non-blocking sockets; waits for writability until @deadline_us.
 * The fds stay owned by the caller.
 */
int gf_frame_send(int fd, const void *body, size_t len, const int *fds, size_t nfds,
		  int64_t deadline_us);

/* ---- messages ---- */

/* gf_Msg is large (its biggest member is a GMS list chunk): allocate it. */
gf_Msg *gf_msg_new(void);
/*
 * Start @m as a message with body @tag (a gf_Msg_*_tag): seq 0, that body
 * zeroed, and nothing left of the previous body. Clears only what the two
 * bodies take, not the whole union (tens of KiB): the paths a failover waits
 * on send several messages.
 */
void gf_msg_start(gf_Msg *m, pb_size_t tag);
void gf_msg_free(gf_Msg *m);
/* Encode into a freshly malloc'd buffer. */
int gf_msg_encode(const gf_Msg *m, uint8_t **out, size_t *len);
/* Decode @len bytes into @m; nothing of the message it held before survives.
 * GF_ERR_PROTOCOL with detail on failure (no body then). */
int gf_msg_decode(const uint8_t *buf, size_t len, gf_Msg *m);
int gf_msg_send(int fd, const gf_Msg *m, const int *fds, size_t nfds, int64_t deadline_us);
/*
 * Blocking receive of one message into @m. Fds that came with it are
 * returned through @fds/@nfds when non-NULL; when NULL, a message carrying
 * fds is a protocol error and its fds are closed.
 */
int gf_msg_recv(struct gf_frame_reader *r, int fd, gf_Msg *m, int **fds, size_t *nfds,
		int64_t deadline_us);
/*
 * Non-blocking receive: 1 with the next message decoded into @m (fds as for
 * gf_msg_recv()), GF_ERR_AGAIN when more bytes are needed, GF_ERR_CLOSED on
 * EOF at a message boundary, another negative error otherwise.
 */
int gf_msg_try_recv(struct gf_frame_reader *r, int fd, gf_Msg *m, int **fds, size_t *nfds);
/* If @m is an Error message, record its detail and return its code (< 0); else 0. */
int gf_msg_error_code(const gf_Msg *m);
/* Fill @m as an Error message. */
void gf_msg_set_error(gf_Msg *m, int code, const char *detail);
/* Name of the message body ("lock_acquire", ...) for logs. */
const char *gf_msg_name(const gf_Msg *m);

/* ---- URIs ---- */
enum gf_uri_kind { GF_URI_UNIX = 1, GF_URI_TCP = 2 };
struct gf_uri {
	enum gf_uri_kind kind;
	char path[108];   /* unix: absolute socket path */
	char host[256];   /* tcp: host name or address (no brackets) */
	uint16_t port;    /* tcp */
};
/* Parse "unix:///abs/path" or "tcp://host:port" / "tcp://[v6addr]:port". */
int gf_uri_parse(const char *text, struct gf_uri *out);
/* Connect (SOCK_CLOEXEC|SOCK_NONBLOCK), waiting until @deadline_us. */
int gf_uri_connect(const struct gf_uri *u, int64_t deadline_us, int *out_fd);
/* Listen (SOCK_CLOEXEC|SOCK_NONBLOCK); a stale unix socket file nobody serves is replaced. */
int gf_uri_listen(const struct gf_uri *u, int backlog, int *out_fd);
/* "unix:///x" / "tcp://h:p" for logs. */
void gf_uri_format(const struct gf_uri *u, char *buf, size_t len);

/* ---- handshake ---- */
/*
 * Client side: send Hello, read Welcome, answer a challenge with
 * HMAC-SHA256(@secret, challenge) when the server asks for one. With a
 * secret on a TCP connection the server must prove it knows the secret too
 * (Welcome.proof over the Hello's challenge) before the client answers:
 * GF_ERR_PERMISSION otherwise.
 * @welcome_out may be NULL.
 */
int gf_handshake_client(int fd, struct gf_frame_reader *r, gf_Component component,
			const char *peer_id, const uint8_t *secret, size_t secret_len,
			int64_t deadline_us, gf_Welcome *welcome_out);
/* Server side: validate a received Hello for @component. */
int gf_handshake_check_hello(const gf_Msg *m, gf_Component component);
/* HMAC-SHA256 of @challenge under @secret into @mac (32 bytes). */
int gf_auth_mac(const uint8_t *secret, size_t secret_len, const uint8_t *challenge,
		size_t challenge_len, uint8_t mac[32]);
/* The server's proof of the secret for a client's @challenge: HMAC-SHA256(secret, "gf-server-proof:" + challenge). */
int gf_auth_server_proof(const uint8_t *secret, size_t secret_len, const uint8_t *challenge, size_t challenge_len,
			 uint8_t proof[32]);
/* Constant-time check of a client's answer. */
bool gf_auth_verify(const uint8_t *secret, size_t secret_len, const uint8_t *challenge,
		    size_t challenge_len, const uint8_t *mac, size_t mac_len);

#endif
