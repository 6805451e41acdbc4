/* SPDX-License-Identifier: Apache-2.0 */
/* Connection deadlines and per-address eviction for the small HTTP servers
 * (conn_guard.h). Self-contained: the sidecars compile it in as well. */
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conn_guard.h"

#define REAP_INTERVAL_MS 100

static int64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int gf_conn_guard_init(struct gf_conn_guard *g, unsigned total, unsigned per_addr, int64_t deadline_ms)
{
	memset(g, 0, sizeof(*g));
	g->total = total;
	g->per_addr = per_addr;
	g->deadline_us = deadline_ms * 1000;
	pthread_condattr_t ca;
	int rc = pthread_condattr_init(&ca);
	if (!rc) {
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		rc = pthread_cond_init(&g->wake, &ca);
		pthread_condattr_destroy(&ca);
	}
	if (rc) {
		errno = rc;
		return -1;
	}
	if ((rc = pthread_mutex_init(&g->mu, NULL))) {
		pthread_cond_destroy(&g->wake);
		errno = rc;
		return -1;
	}
	return 0;
}

/* Under g->mu. The fd is still open: the server closes it only after it
 * reports the close, which takes g->mu and unlinks the record. */
static void cut(struct gf_conn_guard *g, struct gf_guarded_conn *c, uint64_t *counter)
{
	c->cut = true;
	g->nopen--;
	(*counter)++;
	shutdown(c->fd, SHUT_RDWR);
}

static void *reaper_main(void *arg)
{
	struct gf_conn_guard *g = arg;
	pthread_mutex_lock(&g->mu);
	while (!g->stopping) {
		int64_t now = mono_us();
		for (struct gf_guarded_conn *c = g->conns; c; c = c->next)
			if (!c->cut && now - c->since_us >= g->deadline_us)
				cut(g, c, &g->cut_deadline);
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += REAP_INTERVAL_MS * 1000000L;
		ts.tv_sec += ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		pthread_cond_timedwait(&g->wake, &g->mu, &ts);
	}
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

int gf_conn_guard_start(struct gf_conn_guard *g)
{
	int rc = pthread_create(&g->reaper, NULL, reaper_main, g);
	if (rc) {
		errno = rc;
		return -1;
	}
	g->running = true;
	return 0;
}

void gf_conn_guard_stop(struct gf_conn_guard *g)
{
	if (g->running) {
		pthread_mutex_lock(&g->mu);
		g->stopping = true;
		pthread_cond_signal(&g->wake);
		pthread_mutex_unlock(&g->mu);
		pthread_join(g->reaper, NULL);
		g->running = false;
	}
}

void gf_conn_guard_destroy(struct gf_conn_guard *g)
{
	gf_conn_guard_stop(g);
	while (g->conns) {
		struct gf_guarded_conn *c = g->conns;
		g->conns = c->next;
		free(c);
	}
	g->last = NULL;
	pthread_cond_destroy(&g->wake);
	pthread_mutex_destroy(&g->mu);
}

static void peer_key(const struct sockaddr *sa, unsigned char key[16])
{
	memset(key, 0, 16);
	if (sa && sa->sa_family == AF_INET)
		memcpy(key, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	else if (sa && sa->sa_family == AF_INET6)
		memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
}

struct gf_guarded_conn *gf_conn_guard_open(struct gf_conn_guard *g, int fd, const struct sockaddr *peer)
{
	struct gf_guarded_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->fd = fd;
	c->since_us = mono_us();
	peer_key(peer, c->addr);
	pthread_mutex_lock(&g->mu);
	c->prev = g->last;
	if (g->last)
		g->last->next = c;
	else
		g->conns = c;
	g->last = c;
	g->nopen++;
	unsigned same = 0;
	for (struct gf_guarded_conn *o = g->conns; o; o = o->next)
		same += !o->cut && !memcmp(o->addr, c->addr, sizeof(c->addr));
	/* The oldest first: they had their chance; the newcomer has had none. */
	for (struct gf_guarded_conn *o = g->conns; same > g->per_addr && o != c; o = o->next)
		if (!o->cut && !memcmp(o->addr, c->addr, sizeof(c->addr))) {
			cut(g, o, &g->cut_evicted);
			same--;
		}
	for (struct gf_guarded_conn *o = g->conns; g->nopen > g->total && o && o != c; o = o->next)
		if (!o->cut)
			cut(g, o, &g->cut_evicted);
	pthread_mutex_unlock(&g->mu);
	return c;
}

void gf_conn_guard_answered(struct gf_conn_guard *g, struct gf_guarded_conn *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&g->mu);
	c->since_us = mono_us();
	pthread_mutex_unlock(&g->mu);
}

void gf_conn_guard_closed(struct gf_conn_guard *g, struct gf_guarded_conn *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&g->mu);
	if (!c->cut)
		g->nopen--;
	if (c->prev)
		c->prev->next = c->next;
	else
		g->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		g->last = c->prev;
	pthread_mutex_unlock(&g->mu);
	free(c);
}

void gf_conn_guard_stats(struct gf_conn_guard *g, unsigned *open, uint64_t *cut_deadline, uint64_t *cut_evicted)
{
	pthread_mutex_lock(&g->mu);
	*open = g->nopen;
	*cut_deadline = g->cut_deadline;
	*cut_evicted = g->cut_evicted;
	pthread_mutex_unlock(&g->mu);
}
