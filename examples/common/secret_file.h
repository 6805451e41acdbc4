/* SPDX-License-Identifier: Apache-2.0 */
/* The shared secret of a tcp:// lock server, read from a file the same way by
 * every program that takes one (gf-lockd --secret-file, gf-gmsd and
 * gf-c-engine --lock-secret-file, gfctl lock --secret-file). */
#ifndef GF_SECRET_FILE_H
#define GF_SECRET_FILE_H

#include <stddef.h>

/* At most 4096 bytes of @path, the trailing newlines (and CRs) dropped, in a
 * malloc'd *@out of *@len bytes; the caller wipes and frees it. -1 with errno
 * on failure: EINVAL when nothing is left, ENOMEM, or open/read's own. */
int secret_file_read(const char *path, char **out, size_t *len);

#endif
