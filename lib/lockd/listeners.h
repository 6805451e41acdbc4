/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Listening sockets carried by the lock (socket-activation style): the lock
 * server owns them for its lifetime and hands duplicates to each holder with
 * its grant, so connections that arrive between two holders wait in the
 * kernel's backlog instead of being refused.
 *
 * Across a restart of the server: a holder that still has the sockets keeps
 * them listening, so the restarted server cannot bind them again (the port or
 * the unix socket file is busy). Such a listener stays pending while the
 * reconnect window is open; the holder's reclaim hands its duplicates back and
 * the server adopts them (the same socket, its backlog intact). When the window
 * ends without that, the server binds it afresh (retrying while still busy).
 */
#ifndef GF_LOCK_LISTENERS_H
#define GF_LOCK_LISTENERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpufailover.pb.h"
#include "schema_limits.h"

#define GF_LSN_MAX GF_LIMIT_LISTENERS
#define GF_LSN_NAME_MAX GF_LIMIT_LISTENER_NAME /* including the NUL */
/* Retry binding a listener that is still busy after the reconnect window this often. */
#define GF_LSN_RETRY_US 1000000

struct gf_lsn_set;

int gf_lsn_new(struct gf_lsn_set **out);
/* Closes the server's copies. Unix socket files are left in place: a holder may still serve from them. */
void gf_lsn_free(struct gf_lsn_set *s);
/* Name: 1..63 of [A-Za-z0-9._-] (sd_listen_fds names may not hold ':'); unique. */
int gf_lsn_add(struct gf_lsn_set *s, const char *name, const char *uri);
/* An already listening stream socket (inherited from systemd); taken on success. */
int gf_lsn_add_fd(struct gf_lsn_set *s, const char *name, int fd);
size_t gf_lsn_count(const struct gf_lsn_set *s);
/*
 * Bind and listen every configured listener not open yet. With
 * @holder_may_have_them, one that is busy stays pending (0 is returned);
 * otherwise a busy one is an error naming it.
 */
int gf_lsn_open(struct gf_lsn_set *s, bool holder_may_have_them);
/* Pending listeners: retry binding them now; logs those still busy. 0 when none is left pending. */
int gf_lsn_retry(struct gf_lsn_set *s);
size_t gf_lsn_pending(const struct gf_lsn_set *s);
/* Adopt the reclaiming holder's sockets for pending listeners of the same name
 * (checked: a listening stream socket at the configured address). Takes every fd
 * (closes those not adopted). */
void gf_lsn_adopt(struct gf_lsn_set *s, const gf_LockAcquire *a, int *fds, size_t nfds);
/* Names (in @g->listeners) and fds (into @fds, at least GF_LSN_MAX) of the open listeners. */
size_t gf_lsn_fill_grant(const struct gf_lsn_set *s, gf_LockGranted *g, int *fds);
void gf_lsn_fill_status(const struct gf_lsn_set *s, gf_LockStatus *st);

#endif
