/* SPDX-License-Identifier: Apache-2.0 */
/* The built-in probe server: libmicrohttpd with its own polling thread, so
 * probes are answered while the engine's main thread blocks in acquire() or
 * hangs in a wake. It only reads the engine through its thread-safe
 * inspection calls.
 *
 * Slow or idle clients must not starve kubelet (a /live that times out gets
 * the Active engine restarted), so besides libmicrohttpd's own per-IP limit
 * and idle timeout, every connection is tracked here: one that has not
 * finished its request within PROBE_DEADLINE_MS is cut (a client trickling
 * a byte at a time never goes idle), and when more than PROBE_SOFT_LIMIT
 * connections are open the oldest is cut to make room for the new one, so
 * a probe gets in even when others hold every slot. Cutting is shutdown()
 * on the socket; libmicrohttpd then sees the end and closes it. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "common.h"
#include "engine_int.h"

/* Probes and scrapes take milliseconds; a request still unfinished after
 * this long is a slow or hostile client. */
#define PROBE_DEADLINE_MS 2000
/* Connections from one address (kubelet and a scraper need a few). */
#define PROBE_PER_IP_LIMIT 8
/* Open connections beyond which the oldest is cut for a new one. */
#define PROBE_SOFT_LIMIT 32
/* libmicrohttpd's own limit: room for the cut connections still closing. */
#define PROBE_HARD_LIMIT (2 * PROBE_SOFT_LIMIT)
#define PROBE_REAP_INTERVAL_MS 100
/* libmicrohttpd's idle timeout, a backstop behind the deadline. */
#define PROBE_IDLE_TIMEOUT_S (2 * PROBE_DEADLINE_MS / 1000)

struct probe_conn {
	int fd;
	int64_t since_us; /* connection start, or end of its last request */
	bool cut;
	struct probe_conn *prev, *next;
};

struct gf_engine_http {
	struct MHD_Daemon *daemon;
	gf_engine *engine;
	int port;

	/* Guards the connection list, the counters and stopping. */
	pthread_mutex_t mu;
	pthread_cond_t wake;
	struct probe_conn *conns; /* oldest first */
	struct probe_conn *last;
	unsigned nopen;  /* connections in the list that are not cut yet */
	uint64_t cut_deadline, cut_evicted;
	bool stopping;
	bool reaper_running;
	pthread_t reaper;
};

static int64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Under h->mu. The fd is still open: libmicrohttpd closes it only after
 * the CLOSED notification, which takes h->mu and unlinks the record. */
static void cut(struct gf_engine_http *h, struct probe_conn *c, uint64_t *counter)
{
	c->cut = true;
	h->nopen--;
	(*counter)++;
	shutdown(c->fd, SHUT_RDWR);
}

static void notify(void *cls, struct MHD_Connection *conn, void **socket_context,
		   enum MHD_ConnectionNotificationCode code)
{
	struct gf_engine_http *h = cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *fdi = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		struct probe_conn *c = calloc(1, sizeof(*c));
		*socket_context = c;
		if (!c || !fdi) {
			/* Untracked connections would escape the deadline: refuse. */
			if (fdi)
				shutdown(fdi->connect_fd, SHUT_RDWR);
			return;
		}
		c->fd = fdi->connect_fd;
		c->since_us = mono_us();
		pthread_mutex_lock(&h->mu);
		c->prev = h->last;
		if (h->last)
			h->last->next = c;
		else
			h->conns = c;
		h->last = c;
		h->nopen++;
		for (struct probe_conn *o = h->conns; h->nopen > PROBE_SOFT_LIMIT && o && o != c; o = o->next)
			if (!o->cut)
				cut(h, o, &h->cut_evicted);
		pthread_mutex_unlock(&h->mu);
		return;
	}
	struct probe_conn *c = *socket_context;
	if (!c)
		return;
	pthread_mutex_lock(&h->mu);
	if (!c->cut)
		h->nopen--;
	if (c->prev)
		c->prev->next = c->next;
	else
		h->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		h->last = c->prev;
	pthread_mutex_unlock(&h->mu);
	free(c);
	*socket_context = NULL;
}

/* A request was answered: a kept-alive connection gets a fresh deadline
 * for its next one. */
static void request_done(struct gf_engine_http *h, struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct probe_conn *c = ci ? ci->socket_context : NULL;
	if (!c)
		return;
	pthread_mutex_lock(&h->mu);
	c->since_us = mono_us();
	pthread_mutex_unlock(&h->mu);
}

static void *reaper_main(void *arg)
{
	struct gf_engine_http *h = arg;
	pthread_mutex_lock(&h->mu);
	while (!h->stopping) {
		int64_t now = mono_us();
		for (struct probe_conn *c = h->conns; c; c = c->next)
			if (!c->cut && now - c->since_us >= (int64_t)PROBE_DEADLINE_MS * 1000)
				cut(h, c, &h->cut_deadline);
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += PROBE_REAP_INTERVAL_MS * 1000000L;
		ts.tv_sec += ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		pthread_cond_timedwait(&h->wake, &h->mu, &ts);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type, const char *body,
			     size_t len)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	enum MHD_Result ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
			      const char *version, const char *upload_data, size_t *upload_data_size,
			      void **req_cls)
{
	struct gf_engine_http *h = cls;
	(void)version;
	(void)upload_data;
	/* Probes carry no body; answer on the first call for the request. */
	if (*upload_data_size != 0) {
		*upload_data_size = 0;
		return MHD_YES;
	}
	(void)req_cls;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "method not allowed\n", 19);

	int probe = 0;
	if (!strcmp(url, "/live"))
		probe = GF_PROBE_LIVE;
	else if (!strcmp(url, "/ready"))
		probe = GF_PROBE_READY;
	else if (!strcmp(url, "/startup"))
		probe = GF_PROBE_STARTUP;
	if (probe) {
		int status = gf_engine_probe(h->engine, probe);
		/* "ok standby", "unavailable dead startup_deadline": a Dead
		 * engine says why in one word (/state has the sentence). */
		gf_engine *e = h->engine;
		char cause[32];
		pthread_mutex_lock(gf_engine_mu(e));
		int state = e->state;
		snprintf(cause, sizeof(cause), "%s", e->dead_cause);
		pthread_mutex_unlock(gf_engine_mu(e));
		char body[96];
		int n = snprintf(body, sizeof(body), "%s %s%s%s\n", status == 200 ? "ok" : "unavailable",
				 gf_engine_state_name(state), state == GF_ENGINE_DEAD ? " " : "",
				 state == GF_ENGINE_DEAD ? cause : "");
		enum MHD_Result r = reply(conn, status > 0 ? (unsigned)status : 500, "text/plain", body, (size_t)n);
		request_done(h, conn);
		return r;
	}
	char *text = NULL;
	if (!strcmp(url, "/state")) {
		if (gf_engine_state_json(h->engine, &text) != 0)
			return reply(conn, 500, "text/plain", "error\n", 6);
		enum MHD_Result r = reply(conn, 200, "application/json", text, strlen(text));
		free(text);
		request_done(h, conn);
		return r;
	}
	if (!strcmp(url, "/metrics")) {
		if (gf_engine_metrics_text(h->engine, &text) != 0)
			return reply(conn, 500, "text/plain", "error\n", 6);
		enum MHD_Result r = reply(conn, 200, "text/plain; version=0.0.4", text, strlen(text));
		free(text);
		request_done(h, conn);
		return r;
	}
	return reply(conn, MHD_HTTP_NOT_FOUND, "text/plain", "not found\n", 10);
}

int gf_engine_http_start(gf_engine *e, const char *address, int port, struct gf_engine_http **out)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	if (inet_pton(AF_INET, address, &sin.sin_addr) != 1)
		return gf_err(GF_ERR_INVALID_ARG, "probe server: %s is not a numeric IPv4 address", address);
	struct gf_engine_http *h = calloc(1, sizeof(*h));
	if (!h)
		return gf_err(GF_ERR_NOMEM, "probe server: out of memory");
	h->engine = e;
	pthread_mutex_init(&h->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->wake, &ca);
	pthread_condattr_destroy(&ca);
	/* Internal polling thread: probes must be answered while the engine's
	 * own thread blocks. */
	h->daemon = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, (uint16_t)port, NULL, NULL, handle, h,
		MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin, MHD_OPTION_CONNECTION_LIMIT, (unsigned)PROBE_HARD_LIMIT,
		MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PROBE_PER_IP_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT,
		(unsigned)PROBE_IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_CONNECTION, notify, h, MHD_OPTION_END);
	if (!h->daemon) {
		pthread_cond_destroy(&h->wake);
		pthread_mutex_destroy(&h->mu);
		free(h);
		return gf_err(GF_ERR_IO, "probe server: cannot listen on %s:%d (port in use or not permitted)", address,
			      port);
	}
	if (pthread_create(&h->reaper, NULL, reaper_main, h) != 0) {
		gf_engine_http_stop(h);
		return gf_err(GF_ERR_IO, "probe server: cannot start the deadline thread");
	}
	h->reaper_running = true;
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
	h->port = info ? info->port : port;
	gf_log(GF_LOG_INFO, "engine", "event=probe_server_listening address=%s port=%d", address, h->port);
	*out = h;
	return 0;
}

int gf_engine_http_port(const struct gf_engine_http *h)
{
	return h ? h->port : -1;
}

void gf_engine_http_stop(struct gf_engine_http *h)
{
	if (!h)
		return;
	/* The reaper goes first: no shutdown() on fds the daemon is closing. */
	if (h->reaper_running) {
		pthread_mutex_lock(&h->mu);
		h->stopping = true;
		pthread_cond_signal(&h->wake);
		pthread_mutex_unlock(&h->mu);
		pthread_join(h->reaper, NULL);
	}
	MHD_stop_daemon(h->daemon);
	pthread_cond_destroy(&h->wake);
	pthread_mutex_destroy(&h->mu);
	free(h);
}

void gf_engine_http_stats(struct gf_engine_http *h, struct gf_engine_http_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	out->open = h->nopen;
	out->cut_deadline = h->cut_deadline;
	out->cut_evicted = h->cut_evicted;
	pthread_mutex_unlock(&h->mu);
}

GF_EXPORT int gf_engine_start_probe_server(gf_engine *e)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_start_probe_server: NULL engine");
	if (atomic_load(&e->http))
		return 0;
	if (e->probe_port < 0)
		return gf_err(GF_ERR_STATE, "probe server disabled (gf_engine_set_probe_address with port >= 0)");
	struct gf_engine_http *h;
	int rc = gf_engine_http_start(e, e->probe_addr, e->probe_port, &h);
	if (rc == 0)
		atomic_store(&e->http, h);
	return rc;
}

GF_EXPORT int gf_engine_probe_port(const gf_engine *e)
{
	struct gf_engine_http *h = e ? atomic_load(&((gf_engine *)e)->http) : NULL;
	return h ? gf_engine_http_port(h) : -1;
}
