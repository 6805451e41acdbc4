/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock on etcd (etcd:// and etcds:// URIs): what etcd_backend.c puts
 * behind the lock backend table (backend.h) that lib/lock/client.c and
 * oneshot.c dispatch through. Same contract as the gf_lock_* functions of the
 * same name; docs/lock.md describes the recipe and the lease arithmetic.
 */
#ifndef GF_LOCK_ETCD_H
#define GF_LOCK_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpufailover/lock.h"
#include "schema_limits.h"

struct gf_etcd;

/* True when @uri names the etcd backend (etcd:// or etcds://). */
bool gf_etcd_is_uri(const char *uri);
int gf_etcd_new(struct gf_etcd **out, const char *uri, const char *engine_id);
void gf_etcd_free(struct gf_etcd *e);
/* The etcd password (when the URI names a user and no password file). */
int gf_etcd_set_password(struct gf_etcd *e, const void *pw, size_t len);
int gf_etcd_set_reconnect_timeout(struct gf_etcd *e, int64_t ms);
/* T_fence in ms (set, or half the TTL). */
int64_t gf_etcd_fence_ms(const struct gf_etcd *e);
/* Keepalive interval and T_fence; GF_ERR_INVALID_ARG unless fence + margin <= TTL. */
int gf_etcd_set_lease(struct gf_etcd *e, int64_t keepalive_ms, int64_t fence_ms);
/* Blocks; @intr_fd is the owner's interrupt eventfd. */
int gf_etcd_acquire(struct gf_etcd *e, int64_t timeout_ms, struct gf_lock_grant *grant, int intr_fd);
int gf_etcd_release(struct gf_etcd *e);
int gf_etcd_is_held(const struct gf_etcd *e);
uint64_t gf_etcd_epoch(const struct gf_etcd *e);
int gf_etcd_get_fd(const struct gf_etcd *e);
int gf_etcd_get_timeout_ms(const struct gf_etcd *e);
/*
 * 0 while held or idle, GF_ERR_LOCK_LOST once lost. *@newly is set true
 * (and @detail filled) only on the call that noticed the loss, so the
 * caller runs the hook once.
 */
int gf_etcd_process(struct gf_etcd *e, bool *newly, char *detail, size_t dlen);
/* In a fork child: forget the parent's lease without touching it. */
void gf_etcd_forked(struct gf_etcd *e);

#define GF_ETCD_KEY_MAX 700            /* a key under the lock's prefix, decoded */
#define GF_ETCD_STATUS_MAX_WAITERS 64  /* waiters listed by name; the count is whole */

/* One key under the lock's prefix: who (the value, or the key when the value is not an id), and its place in line. */
struct gf_etcd_entry {
	char id[GF_LIMIT_ID * 2];
	char key[GF_ETCD_KEY_MAX];
	int64_t create_revision; /* the holder's is its epoch */
};

/* The lock as etcd holds it now: the oldest key holds, the others wait in create order. */
struct gf_etcd_status {
	char prefix[512];
	bool has_holder;
	struct gf_etcd_entry holder;
	size_t nwaiters;    /* listed in waiters[] */
	size_t waiter_count; /* all of them */
	struct gf_etcd_entry waiters[GF_ETCD_STATUS_MAX_WAITERS];
	int64_t revision;   /* etcd's revision at the read */
};

/* Read the lock's keys into @out (large: allocate it); @out is written only on success. */
int gf_etcd_status(const char *uri, const void *pw, size_t pw_len, int64_t timeout_ms, struct gf_etcd_status *out);
int gf_etcd_ping(const char *uri, const void *pw, size_t pw_len, int64_t timeout_ms);

#endif
