/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: arbitrary bytes from one client of a GMS server (host
 * backend, in this process, driven by gf_gmsd_process()). The server must
 * answer or close, never crash or hang, and a second client must still be
 * served afterwards. Seeds: valid sessions (hello, connect, allocate, meta,
 * commit, list, status) made by tests/gms/gen_gms_seeds.c.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpufailover.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static gf_gmsd *srv;
static struct gf_uri uri;
static char tmpl[] = "/tmp/gf-fuzz-gms-XXXXXX";

static void stop_at_exit(void)
{
	gf_gmsd_free(srv); /* removes the socket */
	rmdir(tmpl);
}

static void start_once(void)
{
	if (srv)
		return;
	char text[128];
	if (!mkdtemp(tmpl))
		abort();
	atexit(stop_at_exit);
	snprintf(text, sizeof(text), "unix://%s/gms.sock", tmpl);
	if (gf_gmsd_new(&srv) < 0 || gf_gmsd_add_listen(srv, text) < 0 || gf_gmsd_set_backend(srv, GF_MEM_HOST) < 0 ||
	    gf_gmsd_start(srv) < 0 || gf_uri_parse(text, &uri) < 0)
		abort();
}

/* Run the server until the client socket sees EOF (the server closed) or nothing moves for a while. */
static void drive(int fd, const uint8_t *data, size_t size)
{
	size_t off = 0;
	char sink[65536];
	int idle = 0;
	bool shut = false;
	while (idle < 50) {
		bool moved = false;
		if (off < size) {
			ssize_t n = send(fd, data + off, size - off, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (n > 0) {
				off += (size_t)n;
				moved = true;
			} else if (n < 0 && errno != EAGAIN) {
				off = size;
			}
		} else if (!shut) {
			shutdown(fd, SHUT_WR);
			shut = true;
		}
		struct pollfd p = {.fd = gf_gmsd_get_fd(srv), .events = POLLIN};
		if (poll(&p, 1, 1) > 0) {
			gf_gmsd_process(srv);
			moved = true;
		}
		/* Replies and fds are drained and dropped (MSG_CMSG_CLOEXEC, then closed). */
		for (;;) {
			char ctl[CMSG_SPACE(sizeof(int) * 253)];
			struct iovec iov = {sink, sizeof(sink)};
			struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
					    .msg_controllen = sizeof(ctl)};
			ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
			for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); n > 0 && c; c = CMSG_NXTHDR(&mh, c))
				if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
					int *fds = (int *)CMSG_DATA(c);
					for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
						close(fds[i]);
				}
			if (n == 0 || (n < 0 && errno != EAGAIN))
				return; /* the server closed: done */
			if (n < 0)
				break;
			moved = true;
		}
		idle = moved ? 0 : idle + 1;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	start_once();
	int fd;
	if (gf_uri_connect(&uri, gf_deadline_from_ms(1000), &fd) < 0)
		abort();
	drive(fd, data, size);
	close(fd);
	/* let the server see the close (a writer's abort drops its layout) */
	for (int i = 0; i < 20; i++) {
		struct pollfd p = {.fd = gf_gmsd_get_fd(srv), .events = POLLIN};
		if (poll(&p, 1, 1) > 0)
			gf_gmsd_process(srv);
	}
	/* still serving: a fresh client completes a handshake */
	struct gf_frame_reader r;
	if (gf_uri_connect(&uri, gf_deadline_from_ms(1000), &fd) < 0)
		abort();
	gf_frame_reader_init(&r, 0);
	gf_Msg *m = gf_msg_new();
	m->which_body = gf_Msg_hello_tag;
	m->body.hello.version = GF_PROTOCOL_VERSION;
	m->body.hello.component = gf_Component_COMPONENT_GMS;
	if (gf_msg_send(fd, m, NULL, 0, gf_deadline_from_ms(1000)) < 0)
		abort();
	int rc = 0;
	for (int i = 0; i < 1000; i++) {
		struct pollfd p = {.fd = gf_gmsd_get_fd(srv), .events = POLLIN};
		if (poll(&p, 1, 1) > 0)
			gf_gmsd_process(srv);
		rc = gf_frame_reader_feed(&r, fd);
		if (rc != GF_ERR_AGAIN)
			break;
	}
	if (rc != 1 || gf_msg_decode(r.body, r.msg_len, m) < 0 || m->which_body != gf_Msg_welcome_tag)
		abort();
	gf_msg_free(m);
	gf_frame_reader_clear(&r);
	close(fd);
	for (int i = 0; i < 5; i++) {
		struct pollfd p = {.fd = gf_gmsd_get_fd(srv), .events = POLLIN};
		if (poll(&p, 1, 1) > 0)
			gf_gmsd_process(srv);
	}
	return 0;
}
