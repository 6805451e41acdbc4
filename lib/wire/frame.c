/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "wire.h"

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void gf_frame_reader_init(struct gf_frame_reader *r, size_t max_fds)
{
	memset(r, 0, sizeof(*r));
	r->max_body = GF_FRAME_MAX_BODY;
	r->max_fds = max_fds > GF_MSG_MAX_FDS ? GF_MSG_MAX_FDS : max_fds;
}

void gf_frame_reader_set_max_body(struct gf_frame_reader *r, size_t max)
{
	r->max_body = max && max < GF_FRAME_MAX_BODY ? max : GF_FRAME_MAX_BODY;
}

static void reset_frame(struct gf_frame_reader *r)
{
	r->hdr_got = 0;
	r->hdr_done = false;
	r->frame_nfds = 0;
	r->frame_fds_got = 0;
	r->body_len = 0;
	r->body_got = 0;
}

static void drop_message(struct gf_frame_reader *r)
{
	gf_close_fds(r->fds, r->nfds);
	r->nfds = 0;
	r->in_message = false;
	r->msg_len = 0;
}

void gf_frame_reader_set_read_ahead(struct gf_frame_reader *r)
{
	if (r->ahead)
		return;
	r->ahead = malloc(GF_FRAME_READ_AHEAD);
	r->ahead_fds = malloc(GF_FDS_PER_FRAME * sizeof(int));
	if (!r->ahead || !r->ahead_fds) {
		free(r->ahead);
		free(r->ahead_fds);
		r->ahead = NULL;
		r->ahead_fds = NULL;
	}
}

bool gf_frame_reader_buffered(const struct gf_frame_reader *r)
{
	return r->ahead_off < r->ahead_len;
}

static void drop_ahead(struct gf_frame_reader *r)
{
	gf_close_fds(r->ahead_fds, r->ahead_nfds);
	r->ahead_nfds = 0;
	r->ahead_off = r->ahead_len = 0;
}

void gf_frame_reader_clear(struct gf_frame_reader *r)
{
	drop_message(r);
	drop_ahead(r);
	free(r->fds);
	free(r->body);
	free(r->ahead);
	free(r->ahead_fds);
	r->fds = NULL;
	r->body = NULL;
	r->ahead = NULL;
	r->ahead_fds = NULL;
	r->fds_cap = r->body_cap = 0;
	reset_frame(r);
}

bool gf_frame_reader_partial(const struct gf_frame_reader *r)
{
	return r->hdr_got > 0 || r->in_message || gf_frame_reader_buffered(r);
}

void gf_frame_reader_take_fds(struct gf_frame_reader *r, int **fds, size_t *nfds)
{
	if (r->nfds == 0) {
		*fds = NULL;
		*nfds = 0;
		return;
	}
	*fds = r->fds;
	*nfds = r->nfds;
	r->fds = NULL;
	r->fds_cap = 0;
	r->nfds = 0;
}

/* A protocol violation: drop everything received so far, fds included. */
static int fail(struct gf_frame_reader *r, int err, const char *what)
{
	drop_message(r);
	drop_ahead(r);
	reset_frame(r);
	return gf_err(err, "frame: %s", what);
}

static int stash_fds(struct gf_frame_reader *r, const int *fds, size_t n)
{
	if (r->nfds + n > r->fds_cap) {
		size_t cap = r->fds_cap ? r->fds_cap * 2 : 16;
		while (cap < r->nfds + n)
			cap *= 2;
		int *p = realloc(r->fds, cap * sizeof(int));
		if (!p) {
			for (size_t i = 0; i < n; i++)
				gf_close(fds[i]);
			return GF_ERR_NOMEM;
		}
		r->fds = p;
		r->fds_cap = cap;
	}
	memcpy(r->fds + r->nfds, fds, n * sizeof(int));
	r->nfds += n;
	r->frame_fds_got += n;
	return 0;
}

/* The fds the frame in progress has so far: within what it and the message may carry. */
static int check_fds(struct gf_frame_reader *r)
{
	if (r->nfds > r->max_fds)
		return fail(r, GF_ERR_PROTOCOL, r->max_fds ? "more fds than this message may carry"
							 : "unexpected fds on a connection that takes none");
	if (r->hdr_done && r->frame_fds_got > r->frame_nfds)
		return fail(r, GF_ERR_PROTOCOL, "more fds arrived than the frame announced");
	return 0;
}

/*
 * One recvmsg of at most @len bytes into @buf, collecting any fds; with
 * read-ahead (and nothing kept from before) up to GF_FRAME_READ_AHEAD more
 * bytes into r->ahead. The fds of a read that went past @buf belong to the
 * frame holding its last byte: a unix socket ends a read with the message
 * that carried fds, and a frame's fds are sent with its own bytes. They
 * wait in r->ahead_fds until that byte is taken (take_some()).
 */
static int read_some(struct gf_frame_reader *r, int fd, void *buf, size_t len, size_t *got)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * GF_FDS_PER_FRAME)];
	} ctl;
	struct iovec iov[2] = { { .iov_base = buf, .iov_len = len },
				{ .iov_base = r->ahead, .iov_len = GF_FRAME_READ_AHEAD } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = r->ahead ? 2 : 1, .msg_control = ctl.buf,
			     .msg_controllen = sizeof(ctl.buf) };
	ssize_t n;

	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return GF_ERR_AGAIN;
		if (errno == ECONNRESET)
			return fail(r, GF_ERR_CLOSED, "connection reset by peer");
		return gf_err_errno(GF_ERR_IO, errno, "frame: recvmsg");
	}
	/* Collect fds first so that every error path below closes them. */
	bool ahead = (size_t)n > len;
	int rc = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int tmp[GF_FDS_PER_FRAME];
			memcpy(tmp, CMSG_DATA(c), k * sizeof(int));
			if (rc < 0) {
				gf_close_fds(tmp, k);
			} else if (ahead) {
				/* The control buffer holds GF_FDS_PER_FRAME at most, as does ahead_fds. */
				memcpy(r->ahead_fds + r->ahead_nfds, tmp, k * sizeof(int));
				r->ahead_nfds += k;
			} else {
				rc = stash_fds(r, tmp, k);
			}
		}
	}
	if (ahead) {
		r->ahead_off = 0;
		r->ahead_len = (size_t)n - len;
		n = (ssize_t)len;
	}
	if (rc < 0)
		return fail(r, rc, "out of memory for received fds");
	if (mh.msg_flags & MSG_CTRUNC)
		return fail(r, GF_ERR_PROTOCOL, "ancillary data truncated (MSG_CTRUNC): too many fds");
	if ((rc = check_fds(r)) < 0)
		return rc;
	if (n == 0) {
		if (r->hdr_got == 0 && !r->in_message && r->nfds == 0)
			return gf_err(GF_ERR_CLOSED, "connection closed by peer");
		return fail(r, GF_ERR_PROTOCOL, "connection closed in the middle of a frame");
	}
	*got = (size_t)n;
	return 0;
}

/*
 * Up to @len bytes for @buf from what read-ahead kept, else from @fd. The
 * kept fds go to the frame in progress with the last kept byte.
 */
static int take_some(struct gf_frame_reader *r, int fd, void *buf, size_t len, size_t *got)
{
	if (!gf_frame_reader_buffered(r))
		return read_some(r, fd, buf, len, got);
	size_t k = r->ahead_len - r->ahead_off;
	if (k > len)
		k = len;
	memcpy(buf, r->ahead + r->ahead_off, k);
	r->ahead_off += k;
	*got = k;
	if (r->ahead_off < r->ahead_len)
		return 0;
	r->ahead_off = r->ahead_len = 0;
	if (r->ahead_nfds == 0)
		return 0;
	size_t nfds = r->ahead_nfds;
	r->ahead_nfds = 0;
	int rc = stash_fds(r, r->ahead_fds, nfds);
	if (rc < 0)
		return fail(r, rc, "out of memory for received fds");
	return check_fds(r);
}

static int parse_header(struct gf_frame_reader *r)
{
	const uint8_t *h = r->hdr;
	if (get16(h) != GF_FRAME_MAGIC)
		return fail(r, GF_ERR_PROTOCOL, "bad magic (not a libgpufailover peer?)");
	if (h[2] != GF_FRAME_WIRE_VERSION)
		return fail(r, GF_ERR_VERSION, "unsupported frame version");
	r->flags = h[3];
	if (r->flags & ~(GF_FRAME_F_MORE | GF_FRAME_F_CONT))
		return fail(r, GF_ERR_PROTOCOL, "unknown frame flags");
	r->frame_nfds = get16(h + 4);
	if (get16(h + 6) != 0)
		return fail(r, GF_ERR_PROTOCOL, "reserved header field not zero");
	r->body_len = get32(h + 8);
	if (r->frame_nfds > GF_FDS_PER_FRAME)
		return fail(r, GF_ERR_PROTOCOL, "frame announces more than 253 fds");
	if (r->frame_fds_got > r->frame_nfds)
		return fail(r, GF_ERR_PROTOCOL, "more fds arrived than the frame announced");
	bool cont = r->flags & GF_FRAME_F_CONT;
	if (cont != r->in_message)
		return fail(r, GF_ERR_PROTOCOL, cont ? "continuation frame without a message"
						     : "new message while continuation frames were due");
	if (cont && r->body_len != 0)
		return fail(r, GF_ERR_PROTOCOL, "continuation frame with a body");
	if ((r->flags & GF_FRAME_F_MORE) && r->frame_nfds != GF_FDS_PER_FRAME)
		return fail(r, GF_ERR_PROTOCOL, "MORE flag on a frame that is not full of fds");
	if (r->body_len > r->max_body)
		return fail(r, GF_ERR_TOO_BIG, "frame body exceeds the maximum size");
	if (!cont) {
		/* Allocate only after the size was checked against the maximum. */
		if (r->body_len > r->body_cap) {
			uint8_t *b = realloc(r->body, r->body_len);
			if (!b)
				return fail(r, GF_ERR_NOMEM, "out of memory for frame body");
			r->body = b;
			r->body_cap = r->body_len;
		}
		r->msg_len = r->body_len;
	}
	r->hdr_done = true;
	return 0;
}

int gf_frame_reader_feed(struct gf_frame_reader *r, int fd)
{
	for (;;) {
		size_t got = 0;
		int rc;
		if (!r->hdr_done) {
			if (r->hdr_got == 0 && !r->in_message && r->nfds) {
				/* fds of a message the caller did not take. */
				gf_close_fds(r->fds, r->nfds);
				r->nfds = 0;
			}
			rc = take_some(r, fd, r->hdr + r->hdr_got, GF_FRAME_HEADER_SIZE - r->hdr_got, &got);
			if (rc < 0)
				return rc;
			r->hdr_got += got;
			if (r->hdr_got < GF_FRAME_HEADER_SIZE)
				continue;
			rc = parse_header(r);
			if (rc < 0)
				return rc;
		}
		bool cont = r->flags & GF_FRAME_F_CONT;
		if (!cont && r->body_got < r->body_len) {
			rc = take_some(r, fd, r->body + r->body_got, r->body_len - r->body_got, &got);
			if (rc < 0)
				return rc;
			r->body_got += got;
			if (r->body_got < r->body_len)
				continue;
		}
		/* The frame is complete: its fds must all have arrived with it. */
		if (r->frame_fds_got != r->frame_nfds)
			return fail(r, GF_ERR_PROTOCOL, "frame announced fds that did not arrive");
		bool more = r->flags & GF_FRAME_F_MORE;
		reset_frame(r);
		if (more) {
			r->in_message = true;
			continue;
		}
		r->in_message = false;
		return 1;
	}
}

static int wait_fd(int fd, short events, int64_t deadline_us, const char *what)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		int t = gf_poll_timeout_ms(deadline_us);
		int n = poll(&p, 1, t);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return gf_err_errno(GF_ERR_IO, errno, "%s: poll", what);
		}
		if (n == 0) {
			if (t == 0 || gf_now_us() >= deadline_us)
				return gf_err(GF_ERR_TIMEOUT, "%s: timed out", what);
			continue;
		}
		return 0;
	}
}

int gf_frame_recv(struct gf_frame_reader *r, int fd, int64_t deadline_us)
{
	for (;;) {
		int rc = gf_frame_reader_feed(r, fd);
		if (rc != GF_ERR_AGAIN)
			return rc;
		rc = wait_fd(fd, POLLIN, deadline_us, "receive");
		if (rc < 0)
			return rc;
	}
}

/* Send one frame: header+body with up to 253 fds attached to its first byte. */
static int send_frame(int fd, uint8_t flags, const void *body, size_t len, const int *fds,
		      size_t nfds, int64_t deadline_us)
{
	uint8_t hdr[GF_FRAME_HEADER_SIZE];
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * GF_FDS_PER_FRAME)];
	} ctl;
	put16(hdr, GF_FRAME_MAGIC);
	hdr[2] = GF_FRAME_WIRE_VERSION;
	hdr[3] = flags;
	put16(hdr + 4, (uint16_t)nfds);
	put16(hdr + 6, 0);
	put32(hdr + 8, (uint32_t)len);

	size_t total = sizeof(hdr) + len, sent = 0;
	while (sent < total) {
		struct iovec iov[2];
		int niov = 0;
		if (sent < sizeof(hdr)) {
			iov[niov++] = (struct iovec){ hdr + sent, sizeof(hdr) - sent };
			if (len)
				iov[niov++] = (struct iovec){ (void *)body, len };
		} else {
			iov[niov++] = (struct iovec){ (uint8_t *)body + (sent - sizeof(hdr)), total - sent };
		}
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)niov };
		if (sent == 0 && nfds > 0) {
			memset(&ctl, 0, sizeof(ctl)); /* CMSG padding goes to the kernel too */
			mh.msg_control = ctl.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
		}
		ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				int rc = wait_fd(fd, POLLOUT, deadline_us, "send");
				if (rc < 0)
					return rc;
				continue;
			}
			if (errno == EPIPE || errno == ECONNRESET)
				return gf_err(GF_ERR_CLOSED, "send: connection closed by peer");
			return gf_err_errno(GF_ERR_IO, errno, "send: sendmsg");
		}
		sent += (size_t)n;
	}
	return 0;
}

int gf_frame_send(int fd, const void *body, size_t len, const int *fds, size_t nfds,
		  int64_t deadline_us)
{
	if (len > GF_FRAME_MAX_BODY)
		return gf_err(GF_ERR_TOO_BIG, "send: %zu-byte message exceeds the %u-byte frame limit",
			      len, GF_FRAME_MAX_BODY);
	if (nfds > GF_MSG_MAX_FDS)
		return gf_err(GF_ERR_TOO_BIG, "send: %zu fds exceed the per-message limit", nfds);
	size_t first = nfds > GF_FDS_PER_FRAME ? GF_FDS_PER_FRAME : nfds;
	int rc = send_frame(fd, nfds > first ? GF_FRAME_F_MORE : 0, body, len, fds, first, deadline_us);
	for (size_t off = first; rc == 0 && off < nfds; off += GF_FDS_PER_FRAME) {
		size_t k = nfds - off > GF_FDS_PER_FRAME ? GF_FDS_PER_FRAME : nfds - off;
		uint8_t flags = GF_FRAME_F_CONT | (off + k < nfds ? GF_FRAME_F_MORE : 0);
		rc = send_frame(fd, flags, NULL, 0, fds + off, k, deadline_us);
	}
	return rc;
}
