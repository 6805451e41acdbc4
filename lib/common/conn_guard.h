/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Keeping a small HTTP server answerable under a flood of slow connections
 * (internal; used by the engine's probe server and, compiled in, by the
 * sidecars' HTTP). libmicrohttpd's own per-address limit refuses the
 * connection over the limit, which is the probe when an attacker on the
 * node's address holds the slots first; here every connection is let in
 * and the oldest unfinished ones make room instead:
 *
 * - a connection that has not finished a request within deadline_ms of its
 *   start (or of its last answer) is cut;
 * - when an address has more than per_addr connections open, its oldest is
 *   cut; when the server has more than total open, the oldest of all is.
 *
 * So a client that sends a whole request at once (a probe, a scrape) is
 * answered unless more than per_addr newer connections from its address
 * arrive while it is served, which takes milliseconds. Cutting is
 * shutdown() of the socket: the server then sees the end and closes it.
 * Thread-safe; the records are the caller's per-connection context.
 */
#ifndef GF_CONN_GUARD_H
#define GF_CONN_GUARD_H
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct gf_guarded_conn {
	int fd;
	int64_t since_us; /* connection start, or end of its last request */
	bool cut;
	unsigned char addr[16]; /* the peer's address (IPv4 in the first 4 bytes) */
	struct gf_guarded_conn *prev, *next;
};

struct gf_conn_guard {
	unsigned total, per_addr;
	int64_t deadline_us;
	pthread_mutex_t mu;
	pthread_cond_t wake;
	struct gf_guarded_conn *conns, *last; /* oldest first */
	unsigned nopen; /* not cut yet */
	uint64_t cut_deadline, cut_evicted;
	bool stopping, running;
	pthread_t reaper;
};

/* Set up @g (not started). 0, or -1 (errno) when a lock cannot be made. */
int gf_conn_guard_init(struct gf_conn_guard *g, unsigned total, unsigned per_addr, int64_t deadline_ms);
/* Start the thread that cuts connections past their deadline. 0 or -1 (errno). */
int gf_conn_guard_start(struct gf_conn_guard *g);
/* Stop the thread (if started): no cut happens after. Call it before the
 * server stops, which closes the fds of records it may not report. */
void gf_conn_guard_stop(struct gf_conn_guard *g);
/* Stop the thread (if started) and free what is left. */
void gf_conn_guard_destroy(struct gf_conn_guard *g);
/* A connection was accepted: its record (NULL when out of memory: the
 * caller then shuts it down, since it would escape the deadline). May cut
 * older connections. */
struct gf_guarded_conn *gf_conn_guard_open(struct gf_conn_guard *g, int fd, const struct sockaddr *peer);
/* A request on @c was answered: a kept-alive connection gets a fresh deadline. */
void gf_conn_guard_answered(struct gf_conn_guard *g, struct gf_guarded_conn *c);
/* The server closed @c (NULL: nothing); frees it. */
void gf_conn_guard_closed(struct gf_conn_guard *g, struct gf_guarded_conn *c);
/* Connections open and not cut, and the cuts so far. */
void gf_conn_guard_stats(struct gf_conn_guard *g, unsigned *open, uint64_t *cut_deadline, uint64_t *cut_evicted);

#endif
