/* SPDX-License-Identifier: Apache-2.0 */
/* The GMS client's session opening, shared by the connection (client.c) and
 * the one-shot status calls (client_status.c). */
#ifndef GF_GMS_CLIENT_SESSION_H
#define GF_GMS_CLIENT_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* Connect to @u (@uri_text for messages) and do the client handshake by
 * @deadline; @rd is initialised for frames carrying up to @max_fds fds.
 * On success *out_fd is the session's socket (the caller closes it and
 * clears @rd). Errors: GF_ERR_UNREACHABLE, the handshake's errors. */
int gf_gms_open_session(const char *uri_text, const struct gf_uri *u, int64_t deadline, int *out_fd,
			struct gf_frame_reader *rd, size_t max_fds);

#endif
