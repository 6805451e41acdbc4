/* SPDX-License-Identifier: Apache-2.0 */
/* Framing, fd passing and message helpers over real socketpairs. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmocka.h>

#include "../common/testutil.h"
#include "wire.h"

static void pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

static int64_t in_ms(int ms)
{
	return gf_now_us() + (int64_t)ms * 1000;
}

static void test_roundtrip_message(void **state)
{
	int sv[2];
	struct gf_frame_reader r;
	gf_Msg *m = gf_msg_new(), *got = gf_msg_new();
	pair(sv);
	gf_frame_reader_init(&r, 0);
	m->seq = 7;
	m->which_body = gf_Msg_lock_acquire_tag;
	strcpy(m->body.lock_acquire.engine_id, "engine-a");
	m->body.lock_acquire.timeout_ms = -1;
	assert_int_equal(gf_msg_send(sv[0], m, NULL, 0, in_ms(1000)), 0);
	assert_int_equal(gf_msg_recv(&r, sv[1], got, NULL, NULL, in_ms(1000)), 0);
	assert_int_equal(got->seq, 7);
	assert_int_equal(got->which_body, gf_Msg_lock_acquire_tag);
	assert_string_equal(got->body.lock_acquire.engine_id, "engine-a");
	assert_int_equal(got->body.lock_acquire.timeout_ms, -1);
	gf_frame_reader_clear(&r);
	gf_msg_free(m);
	gf_msg_free(got);
	close(sv[0]);
	close(sv[1]);
}

/* Encode a frame by hand so tests can dribble or corrupt it. */
static size_t make_frame(uint8_t *out, uint8_t flags, uint16_t nfds, const void *body, uint32_t len)
{
	out[0] = 'G';
	out[1] = 'F';
	out[2] = GF_FRAME_WIRE_VERSION;
	out[3] = flags;
	out[4] = (uint8_t)nfds;
	out[5] = (uint8_t)(nfds >> 8);
	out[6] = out[7] = 0;
	for (int i = 0; i < 4; i++)
		out[8 + i] = (uint8_t)(len >> (8 * i));
	memcpy(out + 12, body, len);
	return 12 + len;
}

struct dribble {
	int fd;
	const uint8_t *buf;
	size_t len;
};

static void *dribble_thread(void *p)
{
	struct dribble *d = p;
	for (size_t i = 0; i < d->len; i++) {
		assert_int_equal(write(d->fd, d->buf + i, 1), 1);
		usleep(200);
	}
	return NULL;
}

static void test_short_reads(void **state)
{
	int sv[2];
	uint8_t frame[256];
	struct gf_frame_reader r;
	pthread_t t;
	pair(sv);
	size_t n = make_frame(frame, 0, 0, "hello world", 11);
	struct dribble d = { sv[0], frame, n };
	pthread_create(&t, NULL, dribble_thread, &d);
	gf_frame_reader_init(&r, 0);
	assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(5000)), 1);
	assert_int_equal(r.msg_len, 11);
	assert_memory_equal(r.body, "hello world", 11);
	pthread_join(t, NULL);
	gf_frame_reader_clear(&r);
	close(sv[0]);
	close(sv[1]);
}

static void test_short_writes(void **state)
{
	/* A small send buffer and a slow reader force partial sendmsg calls. */
	int sv[2];
	pair(sv);
	int small = 4096;
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	fcntl(sv[0], F_SETFL, O_NONBLOCK);
	static uint8_t body[60000];
	for (size_t i = 0; i < sizeof(body); i++)
		body[i] = (uint8_t)(i * 31);
	pid_t pid = fork();
	if (pid == 0) {
		struct gf_frame_reader r;
		gf_frame_reader_init(&r, 0);
		usleep(50000);
		int rc = gf_frame_recv(&r, sv[1], in_ms(5000));
		_exit(rc == 1 && r.msg_len == sizeof(body) && !memcmp(r.body, body, sizeof(body)) ? 0 : 1);
	}
	assert_int_equal(gf_frame_send(sv[0], body, sizeof(body), NULL, 0, in_ms(5000)), 0);
	int st;
	waitpid(pid, &st, 0);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(sv[0]);
	close(sv[1]);
}

static void on_alarm(int sig)
{
	(void)sig;
}

static void test_eintr(void **state)
{
	/* Signals without SA_RESTART interrupt poll(); the read must carry on. */
	int sv[2];
	pair(sv);
	struct sigaction sa = { .sa_handler = on_alarm }, old;
	sigaction(SIGALRM, &sa, &old);
	struct itimerval it = { .it_interval = { 0, 2000 }, .it_value = { 0, 2000 } };
	setitimer(ITIMER_REAL, &it, NULL);
	pid_t pid = fork();
	if (pid == 0) {
		struct itimerval off = { 0 };
		setitimer(ITIMER_REAL, &off, NULL);
		usleep(100000);
		uint8_t frame[64];
		size_t n = make_frame(frame, 0, 0, "late", 4);
		_exit(write(sv[0], frame, n) == (ssize_t)n ? 0 : 1);
	}
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, 0);
	assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(5000)), 1);
	assert_memory_equal(r.body, "late", 4);
	struct itimerval off = { 0 };
	setitimer(ITIMER_REAL, &off, NULL);
	/* The no-op handler stays: a SIGALRM still in flight (slow under
	 * valgrind) must not kill the test program after the timer is off. */
	(void)old;
	waitpid(pid, NULL, 0);
	gf_frame_reader_clear(&r);
	close(sv[0]);
	close(sv[1]);
}

static void test_oversize_rejected_before_alloc(void **state)
{
	int sv[2];
	uint8_t hdr[12];
	pair(sv);
	make_frame(hdr, 0, 0, "", 0);
	uint32_t huge = 0xfffffff0u;
	for (int i = 0; i < 4; i++)
		hdr[8 + i] = (uint8_t)(huge >> (8 * i));
	assert_int_equal(write(sv[0], hdr, 12), 12);
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, 0);
	assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(1000)), GF_ERR_TOO_BIG);
	assert_null(r.body);
	/* The sender refuses too. */
	static uint8_t big[GF_FRAME_MAX_BODY + 1];
	assert_int_equal(gf_frame_send(sv[0], big, sizeof(big), NULL, 0, in_ms(100)), GF_ERR_TOO_BIG);
	gf_frame_reader_clear(&r);
	close(sv[0]);
	close(sv[1]);
}

static void test_truncated(void **state)
{
	int sv[2];
	uint8_t frame[64];
	pair(sv);
	size_t n = make_frame(frame, 0, 0, "0123456789", 10);
	assert_int_equal(write(sv[0], frame, n - 3), (ssize_t)(n - 3));
	close(sv[0]);
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, 0);
	assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(1000)), GF_ERR_PROTOCOL);
	gf_frame_reader_clear(&r);
	close(sv[1]);

	/* EOF exactly between frames is a clean close. */
	pair(sv);
	close(sv[0]);
	gf_frame_reader_init(&r, 0);
	assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(1000)), GF_ERR_CLOSED);
	gf_frame_reader_clear(&r);
	close(sv[1]);
}

static void test_garbage(void **state)
{
	static const char *junk[] = { "GET / HTTP/1.1\r\n\r\n", "\x47\x46\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00",
				      "\x47\x46\x01\x80\x00\x00\x00\x00\x00\x00\x00\x00",
				      "\x47\x46\x01\x00\xff\x00\x00\x00\x00\x00\x00\x00",
				      "\x47\x46\x01\x02\x00\x00\x00\x00\x00\x00\x00\x00" };
	static const int want[] = { GF_ERR_PROTOCOL, GF_ERR_VERSION, GF_ERR_PROTOCOL, GF_ERR_PROTOCOL,
				    GF_ERR_PROTOCOL };
	for (size_t i = 0; i < GF_ARRAY_SIZE(junk); i++) {
		int sv[2];
		pair(sv);
		size_t len = i == 0 ? strlen(junk[i]) : 12;
		assert_int_equal(write(sv[0], junk[i], len), (ssize_t)len);
		struct gf_frame_reader r;
		gf_frame_reader_init(&r, 8);
		assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(1000)), want[i]);
		gf_frame_reader_clear(&r);
		close(sv[0]);
		close(sv[1]);
	}
	/* A well-framed body that is not a message fails to decode. */
	gf_Msg *m = gf_msg_new();
	assert_int_equal(gf_msg_decode((const uint8_t *)"\xff\xff\xff\xff", 4, m), GF_ERR_PROTOCOL);
	assert_true(strlen(gf_error_detail()) > 0);
	gf_msg_free(m);
}

static void check_fd_passing(size_t nfds, bool ahead)
{
	int sv[2];
	pair(sv);
	int *fds = calloc(nfds, sizeof(int));
	for (size_t i = 0; i < nfds; i++) {
		fds[i] = memfd_create("t", MFD_CLOEXEC);
		assert_true(fds[i] >= 0);
		assert_int_equal(ftruncate(fds[i], (off_t)(i + 1)), 0);
	}
	int before = tu_count_fds();
	pid_t pid = fork();
	if (pid == 0) {
		close(sv[1]);
		_exit(gf_frame_send(sv[0], "x", 1, fds, nfds, in_ms(5000)) == 0 ? 0 : 1);
	}
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, GF_MSG_MAX_FDS);
	if (ahead)
		gf_frame_reader_set_read_ahead(&r);
	assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(5000)), 1);
	assert_int_equal(r.nfds, nfds);
	for (size_t i = 0; i < nfds; i++) {
		struct stat st;
		assert_int_equal(fstat(r.fds[i], &st), 0);
		assert_int_equal(st.st_size, (off_t)(i + 1)); /* order is kept */
		assert_int_equal(fcntl(r.fds[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	}
	int st;
	waitpid(pid, &st, 0);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_int_equal(tu_count_fds(), before + (int)nfds);
	gf_frame_reader_clear(&r);
	assert_int_equal(tu_count_fds(), before);
	gf_close_fds(fds, nfds);
	free(fds);
	close(sv[0]);
	close(sv[1]);
}

static void test_fds_1(void **state) { check_fd_passing(1, false); }
static void test_fds_64(void **state) { check_fd_passing(64, false); }
static void test_fds_253(void **state) { check_fd_passing(253, false); }
static void test_fds_300(void **state) { check_fd_passing(300, false); }
static void test_fds_1000(void **state) { check_fd_passing(1000, false); }
static void test_fds_ahead_1(void **state) { check_fd_passing(1, true); }
static void test_fds_ahead_300(void **state) { check_fd_passing(300, true); }
static void test_fds_ahead_1000(void **state) { check_fd_passing(1000, true); }

static int memfd_of_size(off_t size)
{
	int fd = memfd_create("t", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, size), 0);
	return fd;
}

/* Read-ahead: messages sent before the reader looks are read together, and
 * each message gets exactly the fds sent with it. */
static void test_read_ahead(void **state)
{
	int sv[2];
	pair(sv);
	int fa = memfd_of_size(1), fb[2] = { memfd_of_size(2), memfd_of_size(3) };
	int before = tu_count_fds();
	assert_int_equal(gf_frame_send(sv[0], "a", 1, NULL, 0, in_ms(1000)), 0);
	assert_int_equal(gf_frame_send(sv[0], "bb", 2, &fa, 1, in_ms(1000)), 0);
	assert_int_equal(gf_frame_send(sv[0], "ccc", 3, NULL, 0, in_ms(1000)), 0);
	assert_int_equal(gf_frame_send(sv[0], "dddd", 4, fb, 2, in_ms(1000)), 0);
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, 4);
	gf_frame_reader_set_read_ahead(&r);
	assert_int_equal(gf_frame_reader_feed(&r, sv[1]), 1);
	assert_int_equal(r.msg_len, 1);
	assert_int_equal(r.nfds, 0);
	/* The next message came with the first read. */
	assert_true(gf_frame_reader_buffered(&r));
	assert_int_equal(gf_frame_reader_feed(&r, sv[1]), 1);
	assert_int_equal(r.msg_len, 2);
	assert_memory_equal(r.body, "bb", 2);
	assert_int_equal(r.nfds, 1);
	struct stat st;
	assert_int_equal(fstat(r.fds[0], &st), 0);
	assert_int_equal(st.st_size, 1);
	assert_int_equal(gf_frame_reader_feed(&r, sv[1]), 1);
	assert_int_equal(r.msg_len, 3);
	assert_int_equal(r.nfds, 0);
	/* The untaken fd was closed; the next message's two came with this read. */
	assert_true(gf_frame_reader_buffered(&r));
	assert_int_equal(tu_count_fds(), before + 2);
	assert_int_equal(gf_frame_reader_feed(&r, sv[1]), 1);
	assert_int_equal(r.msg_len, 4);
	assert_memory_equal(r.body, "dddd", 4);
	assert_int_equal(r.nfds, 2);
	assert_int_equal(fstat(r.fds[1], &st), 0);
	assert_int_equal(st.st_size, 3);
	assert_false(gf_frame_reader_buffered(&r));
	assert_int_equal(gf_frame_reader_feed(&r, sv[1]), GF_ERR_AGAIN);
	/* Bytes and fds kept when the reader is cleared are closed with it. */
	assert_int_equal(gf_frame_send(sv[0], "e", 1, NULL, 0, in_ms(1000)), 0);
	assert_int_equal(gf_frame_send(sv[0], "ff", 2, &fa, 1, in_ms(1000)), 0);
	assert_int_equal(gf_frame_reader_feed(&r, sv[1]), 1);
	assert_true(gf_frame_reader_buffered(&r));
	gf_frame_reader_clear(&r);
	assert_int_equal(tu_count_fds(), before);
	close(fa);
	gf_close_fds(fb, 2);
	close(sv[0]);
	close(sv[1]);
}

/* Read-ahead on a frame that announces no fds while fds came with it: refused, and closed. */
static void test_read_ahead_unannounced_fds(void **state)
{
	int sv[2];
	pair(sv);
	int fd = memfd_of_size(1);
	int before = tu_count_fds();
	uint8_t frame[2 * GF_FRAME_HEADER_SIZE + 2] = { 'G', 'F', GF_FRAME_WIRE_VERSION, 0, 0, 0, 0, 0, 1, 0, 0, 0, 'a',
							 'G', 'F', GF_FRAME_WIRE_VERSION, 0, 0, 0, 0, 0, 1, 0, 0, 0, 'b' };
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	memset(&ctl, 0, sizeof(ctl));
	struct iovec iov = { frame, sizeof(frame) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	assert_int_equal(sendmsg(sv[0], &mh, 0), (ssize_t)sizeof(frame));
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, 4);
	gf_frame_reader_set_read_ahead(&r);
	/* The first frame is whole before the fd is given to the frame that holds the read's last byte. */
	assert_int_equal(gf_frame_reader_feed(&r, sv[1]), 1);
	assert_int_equal(gf_frame_reader_feed(&r, sv[1]), GF_ERR_PROTOCOL);
	assert_int_equal(tu_count_fds(), before);
	gf_frame_reader_clear(&r);
	close(fd);
	close(sv[0]);
	close(sv[1]);
}

static void test_unexpected_fds_closed(void **state)
{
	int sv[2];
	pair(sv);
	int fd = memfd_create("t", MFD_CLOEXEC);
	int before = tu_count_fds();
	assert_int_equal(gf_frame_send(sv[0], "x", 1, &fd, 1, in_ms(1000)), 0);
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, 0); /* this connection takes no fds */
	assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(1000)), GF_ERR_PROTOCOL);
	assert_int_equal(tu_count_fds(), before);
	gf_frame_reader_clear(&r);

	/* gf_msg_recv without an fd out-parameter refuses fds too. */
	gf_Msg *m = gf_msg_new();
	m->which_body = gf_Msg_ok_tag;
	assert_int_equal(gf_msg_send(sv[0], m, &fd, 1, in_ms(1000)), 0);
	gf_frame_reader_init(&r, 8);
	assert_int_equal(gf_msg_recv(&r, sv[1], m, NULL, NULL, in_ms(1000)), GF_ERR_PROTOCOL);
	assert_int_equal(tu_count_fds(), before);
	gf_frame_reader_clear(&r);
	gf_msg_free(m);
	close(fd);
	close(sv[0]);
	close(sv[1]);
}

static void test_announced_fds_missing(void **state)
{
	int sv[2];
	uint8_t frame[64];
	pair(sv);
	size_t n = make_frame(frame, 0, 3, "abc", 3); /* says 3 fds, sends none */
	assert_int_equal(write(sv[0], frame, n), (ssize_t)n);
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, 8);
	assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(1000)), GF_ERR_PROTOCOL);
	gf_frame_reader_clear(&r);
	close(sv[0]);
	close(sv[1]);
}

static void test_recv_timeout(void **state)
{
	int sv[2];
	pair(sv);
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, 0);
	int64_t t0 = gf_now_us();
	assert_int_equal(gf_frame_recv(&r, sv[1], in_ms(50)), GF_ERR_TIMEOUT);
	assert_true(gf_now_us() - t0 >= 45000);
	gf_frame_reader_clear(&r);
	close(sv[0]);
	close(sv[1]);
}

static void test_error_message(void **state)
{
	gf_Msg *m = gf_msg_new();
	gf_msg_set_error(m, GF_ERR_STALE_LAYOUT, "layout abc != def");
	assert_int_equal(gf_msg_error_code(m), GF_ERR_STALE_LAYOUT);
	assert_string_equal(gf_error_detail(), "layout abc != def");
	/* A peer cannot smuggle in success or unknown codes. */
	m->body.error.code = 5;
	assert_int_equal(gf_msg_error_code(m), GF_ERR_PROTOCOL);
	m->body.error.code = -999;
	assert_int_equal(gf_msg_error_code(m), GF_ERR_PROTOCOL);
	gf_msg_free(m);
}

static void *server_side(void *p)
{
	int fd = *(int *)p;
	struct gf_frame_reader r;
	gf_Msg *m = gf_msg_new();
	gf_frame_reader_init(&r, 0);
	int rc = gf_msg_recv(&r, fd, m, NULL, NULL, in_ms(2000));
	assert_int_equal(rc, 0);
	rc = gf_handshake_check_hello(m, gf_Component_COMPONENT_LOCK);
	if (rc < 0) {
		gf_msg_set_error(m, rc, gf_error_detail());
	} else {
		memset(m, 0, sizeof(*m));
		m->which_body = gf_Msg_welcome_tag;
		m->body.welcome.version = GF_PROTOCOL_VERSION;
		m->body.welcome.component = gf_Component_COMPONENT_LOCK;
	}
	gf_msg_send(fd, m, NULL, 0, in_ms(2000));
	gf_frame_reader_clear(&r);
	gf_msg_free(m);
	return NULL;
}

static void test_handshake(void **state)
{
	int sv[2];
	pthread_t t;
	struct gf_frame_reader r;
	pair(sv);
	pthread_create(&t, NULL, server_side, &sv[1]);
	gf_frame_reader_init(&r, 0);
	gf_Welcome w;
	assert_int_equal(gf_handshake_client(sv[0], &r, gf_Component_COMPONENT_LOCK, "t", NULL, 0,
					     in_ms(2000), &w), 0);
	assert_int_equal(w.version, GF_PROTOCOL_VERSION);
	pthread_join(t, NULL);
	close(sv[0]);
	close(sv[1]);

	/* Wrong component: refused with a clear error. */
	pair(sv);
	pthread_create(&t, NULL, server_side, &sv[1]);
	assert_int_equal(gf_handshake_client(sv[0], &r, gf_Component_COMPONENT_GMS, "t", NULL, 0,
					     in_ms(2000), NULL), GF_ERR_PROTOCOL);
	assert_non_null(strstr(gf_error_detail(), "lock server"));
	pthread_join(t, NULL);
	gf_frame_reader_clear(&r);
	close(sv[0]);
	close(sv[1]);

	/* Unknown version: refused, not misread. */
	gf_Msg *m = gf_msg_new();
	m->which_body = gf_Msg_hello_tag;
	m->body.hello.version = 99;
	m->body.hello.component = gf_Component_COMPONENT_LOCK;
	assert_int_equal(gf_handshake_check_hello(m, gf_Component_COMPONENT_LOCK), GF_ERR_VERSION);
	assert_non_null(strstr(gf_error_detail(), "99"));
	gf_msg_free(m);
}

static void test_auth_mac(void **state)
{
	const uint8_t secret[] = "s3cret", chal[] = "0123456789abcdef0123456789abcdef";
	uint8_t mac[32];
	assert_int_equal(gf_auth_mac(secret, 6, chal, 32, mac), 0);
	assert_true(gf_auth_verify(secret, 6, chal, 32, mac, 32));
	mac[0] ^= 1;
	assert_false(gf_auth_verify(secret, 6, chal, 32, mac, 32));
	assert_false(gf_auth_verify(secret, 6, chal, 32, mac, 31));
	/* HMAC-SHA256 itself, as every peer computes it: RFC 4231, test case 2,
	 * twice (the second through the same per-process context). */
	static const uint8_t want[32] = { 0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
					  0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
					  0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43 };
	for (int i = 0; i < 2; i++) {
		assert_int_equal(gf_auth_mac((const uint8_t *)"Jefe", 4, (const uint8_t *)"what do ya want for nothing?",
					     28, mac),
				 0);
		assert_memory_equal(mac, want, 32);
	}
}

static bool all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return false;
	return true;
}

/* Decoding into a reused gf_Msg leaves nothing of the previous message: not in the header, not in the body. */
static void test_decode_reuse(void **state)
{
	(void)state;
	gf_Msg *m = gf_msg_new(), *in = gf_msg_new();
	assert_non_null(m);
	assert_non_null(in);
	uint8_t *buf;
	size_t len;
	in->seq = 9;
	in->which_body = gf_Msg_gms_list_chunk_tag;
	in->body.gms_list_chunk.metadata_count = 5;
	for (int i = 0; i < 5; i++) {
		snprintf(in->body.gms_list_chunk.metadata[i].key, 256, "key%d", i);
		in->body.gms_list_chunk.metadata[i].value.size = 3;
		memset(in->body.gms_list_chunk.metadata[i].value.bytes, 'x', 3);
	}
	assert_int_equal(gf_msg_encode(in, &buf, &len), 0);
	assert_int_equal(gf_msg_decode(buf, len, m), 0);
	free(buf);
	assert_int_equal(m->seq, 9);
	assert_int_equal(m->body.gms_list_chunk.metadata_count, 5);
	assert_string_equal(m->body.gms_list_chunk.metadata[4].key, "key4");

	/* The same body with fewer entries: the old ones are gone. */
	in->seq = 0;
	in->body.gms_list_chunk.metadata_count = 2;
	assert_int_equal(gf_msg_encode(in, &buf, &len), 0);
	assert_int_equal(gf_msg_decode(buf, len, m), 0);
	free(buf);
	assert_int_equal(m->seq, 0);
	assert_int_equal(m->body.gms_list_chunk.metadata_count, 2);
	assert_true(all_zero(&m->body.gms_list_chunk.metadata[2], 3 * sizeof(m->body.gms_list_chunk.metadata[0])));

	/* Starting a small body on it (a reply built in the same buffer): nothing of the big one is left. */
	gf_msg_start(m, gf_Msg_lock_release_tag);
	assert_int_equal(m->which_body, gf_Msg_lock_release_tag);
	assert_int_equal(m->seq, 0);
	assert_true(all_zero(&m->body, sizeof(m->body)));
	in->seq = 0;
	in->which_body = gf_Msg_gms_list_chunk_tag;
	in->body.gms_list_chunk.metadata_count = 5;
	assert_int_equal(gf_msg_encode(in, &buf, &len), 0);
	assert_int_equal(gf_msg_decode(buf, len, m), 0);
	free(buf);

	/* A small body after a big one: the rest of the union reads as zero. */
	memset(in, 0, sizeof(*in));
	in->which_body = gf_Msg_ok_tag;
	assert_int_equal(gf_msg_encode(in, &buf, &len), 0);
	assert_int_equal(gf_msg_decode(buf, len, m), 0);
	free(buf);
	assert_int_equal(m->which_body, gf_Msg_ok_tag);
	assert_true(all_zero(&m->body, sizeof(m->body)));

	/* No body at all, and a failed decode, leave no body behind either. */
	m->which_body = gf_Msg_gms_list_chunk_tag;
	m->body.gms_list_chunk.metadata_count = 3;
	assert_int_equal(gf_msg_decode((const uint8_t *)"", 0, m), 0);
	assert_int_equal(m->which_body, 0);
	assert_true(all_zero(&m->body, sizeof(m->body)));
	m->body.gms_list_chunk.metadata_count = 3;
	static const uint8_t bad[] = {0x08, 0xff};
	assert_int_equal(gf_msg_decode(bad, sizeof(bad), m), GF_ERR_PROTOCOL);
	assert_true(all_zero(&m->body, sizeof(m->body)));
	gf_msg_free(m);
	gf_msg_free(in);
}


/* A fake TCP server that asks for the client's MAC without proving it knows
 * the secret itself (or with a wrong proof). */
struct fake_server {
	int lfd;
	bool wrong_proof;
	size_t hello_challenge; /* what the client's Hello carried */
};

static void *fake_server(void *arg)
{
	struct fake_server *f = arg;
	int fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	struct gf_frame_reader r;
	gf_frame_reader_init(&r, 0);
	gf_Msg *m = gf_msg_new();
	if (fd >= 0 && gf_msg_recv(&r, fd, m, NULL, NULL, in_ms(2000)) == 0) {
		f->hello_challenge = m->body.hello.challenge.size;
		memset(m, 0, sizeof(*m));
		m->which_body = gf_Msg_welcome_tag;
		m->body.welcome.version = GF_PROTOCOL_VERSION;
		m->body.welcome.component = gf_Component_COMPONENT_LOCK;
		m->body.welcome.challenge.size = 32;
		if (f->wrong_proof) {
			m->body.welcome.proof.size = 32;
			memset(m->body.welcome.proof.bytes, 0x11, 32);
		}
		gf_msg_send(fd, m, NULL, 0, in_ms(2000));
		/* A fake that grants whatever MAC arrives. */
		if (gf_msg_recv(&r, fd, m, NULL, NULL, in_ms(500)) == 0) {
			memset(m, 0, sizeof(*m));
			m->which_body = gf_Msg_auth_ok_tag;
			gf_msg_send(fd, m, NULL, 0, in_ms(2000));
		}
	}
	gf_msg_free(m);
	gf_frame_reader_clear(&r);
	gf_close(fd);
	return NULL;
}

static void test_handshake_server_must_prove_secret(void **state)
{
	(void)state;
	for (int wrong = 0; wrong < 2; wrong++) {
		struct fake_server f = { .wrong_proof = wrong };
		f.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t al = sizeof(a);
		assert_int_equal(bind(f.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
		assert_int_equal(listen(f.lfd, 1), 0);
		assert_int_equal(getsockname(f.lfd, (struct sockaddr *)&a, &al), 0);
		pthread_t t;
		pthread_create(&t, NULL, fake_server, &f);
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
		struct gf_frame_reader r;
		gf_frame_reader_init(&r, 0);
		assert_int_equal(gf_handshake_client(fd, &r, gf_Component_COMPONENT_LOCK, "t", (const uint8_t *)"k", 1,
						     in_ms(2000), NULL), GF_ERR_PERMISSION);
		assert_non_null(strstr(gf_error_detail(), "did not prove"));
		close(fd);
		pthread_join(t, NULL);
		assert_int_equal(f.hello_challenge, 32);
		gf_frame_reader_clear(&r);
		close(f.lfd);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_message),
		cmocka_unit_test(test_short_reads),
		cmocka_unit_test(test_short_writes),
		cmocka_unit_test(test_eintr),
		cmocka_unit_test(test_oversize_rejected_before_alloc),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_garbage),
		cmocka_unit_test(test_fds_1),
		cmocka_unit_test(test_fds_64),
		cmocka_unit_test(test_fds_253),
		cmocka_unit_test(test_fds_300),
		cmocka_unit_test(test_fds_1000),
		cmocka_unit_test(test_fds_ahead_1),
		cmocka_unit_test(test_fds_ahead_300),
		cmocka_unit_test(test_fds_ahead_1000),
		cmocka_unit_test(test_read_ahead),
		cmocka_unit_test(test_read_ahead_unannounced_fds),
		cmocka_unit_test(test_unexpected_fds_closed),
		cmocka_unit_test(test_announced_fds_missing),
		cmocka_unit_test(test_recv_timeout),
		cmocka_unit_test(test_error_message),
		cmocka_unit_test(test_handshake),
		cmocka_unit_test(test_handshake_server_must_prove_secret),
		cmocka_unit_test(test_auth_mac),
		cmocka_unit_test(test_decode_reuse),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
