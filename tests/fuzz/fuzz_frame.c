/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: arbitrary bytes arriving on a connection go through the
 * frame reader and the message decoder; whatever decodes must re-encode and
 * decode to the same message. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The socket buffer must hold the whole input: inputs beyond it are cut. */
#define FUZZ_MAX_INPUT (150 * 1024)

/* Once as a plain reader, once with read-ahead (gf_frame_reader_set_read_ahead()). */
static void one_input(const uint8_t *data, size_t size, bool ahead)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return;
	int buf = 4 * FUZZ_MAX_INPUT;
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
	setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
	size_t off = 0;
	while (off < size) {
		ssize_t n = send(sv[0], data + off, size - off, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	shutdown(sv[0], SHUT_WR);

	struct gf_frame_reader r;
	gf_Msg *m = gf_msg_new(), *again = gf_msg_new();
	gf_frame_reader_init(&r, 0);
	if (ahead)
		gf_frame_reader_set_read_ahead(&r);
	for (;;) {
		int rc = gf_frame_reader_feed(&r, sv[1]);
		if (rc != 1)
			break;
		if (gf_msg_decode(r.body, r.msg_len, m) < 0)
			continue;
		uint8_t *enc;
		size_t len;
		if (gf_msg_encode(m, &enc, &len) == 0) {
			if (gf_msg_decode(enc, len, again) < 0 || again->which_body != m->which_body)
				abort(); /* a decoded message must survive a round trip */
			free(enc);
		}
		(void)gf_msg_error_code(m);
		(void)gf_handshake_check_hello(m, gf_Component_COMPONENT_LOCK);
		(void)gf_msg_name(m);
	}
	gf_frame_reader_clear(&r);
	gf_msg_free(m);
	gf_msg_free(again);
	close(sv[0]);
	close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > FUZZ_MAX_INPUT)
		size = FUZZ_MAX_INPUT;
	one_input(data, size, false);
	one_input(data, size, true);
	return 0;
}
