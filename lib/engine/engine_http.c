/* SPDX-License-Identifier: Apache-2.0 */
/* The built-in probe server: libmicrohttpd with its own polling thread, so
 * probes are answered while the engine's main thread blocks in acquire() or
 * hangs in a wake. It only reads the engine through its thread-safe
 * inspection calls.
 *
 * Slow or idle clients must not starve kubelet (a /live that times out gets
 * the Active engine restarted), and kubelet probes from the node's address,
 * which anyone on the node can share: libmicrohttpd's per-address limit
 * would refuse the probe once others hold the slots. So every connection is
 * let in and tracked (conn_guard.h): one that has not finished its request
 * within PROBE_DEADLINE_MS is cut, and when an address has more than
 * PROBE_PER_IP_LIMIT open (or the server PROBE_SOFT_LIMIT) the oldest
 * makes room, so a probe sent whole is answered whatever the others do. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "common.h"
#include "conn_guard.h"
#include "engine_int.h"

/* Probes and scrapes take milliseconds; a request still unfinished after
 * this long is a slow or hostile client. */
#define PROBE_DEADLINE_MS 2000
/* Connections from one address beyond which its oldest is cut for a new
 * one (kubelet and a scraper need a few). */
#define PROBE_PER_IP_LIMIT 8
/* Open connections beyond which the oldest is cut for a new one. */
#define PROBE_SOFT_LIMIT 32
/* libmicrohttpd's own limit: room for the cut connections still closing. */
#define PROBE_HARD_LIMIT (2 * PROBE_SOFT_LIMIT)
/* libmicrohttpd's idle timeout, a backstop behind the deadline. */
#define PROBE_IDLE_TIMEOUT_S (2 * PROBE_DEADLINE_MS / 1000)

struct gf_engine_http {
	struct MHD_Daemon *daemon;
	gf_engine *engine;
	int port;
	struct gf_conn_guard guard;
};

static void notify(void *cls, struct MHD_Connection *conn, void **socket_context,
		   enum MHD_ConnectionNotificationCode code)
{
	struct gf_engine_http *h = cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *fdi = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		const union MHD_ConnectionInfo *ai = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		struct gf_guarded_conn *c = fdi ? gf_conn_guard_open(&h->guard, fdi->connect_fd, ai ? ai->client_addr : NULL)
					       : NULL;
		*socket_context = c;
		/* Untracked connections would escape the deadline: refuse. */
		if (!c && fdi)
			shutdown(fdi->connect_fd, SHUT_RDWR);
		return;
	}
	gf_conn_guard_closed(&h->guard, *socket_context);
	*socket_context = NULL;
}

/* A request was answered: a kept-alive connection gets a fresh deadline
 * for its next one. */
static void request_done(struct gf_engine_http *h, struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	gf_conn_guard_answered(&h->guard, ci ? ci->socket_context : NULL);
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
	if (gf_conn_guard_init(&h->guard, PROBE_SOFT_LIMIT, PROBE_PER_IP_LIMIT, PROBE_DEADLINE_MS) < 0) {
		free(h);
		return gf_err_errno(GF_ERR_IO, errno, "probe server: cannot set up its connection guard");
	}
	/* Internal polling thread: probes must be answered while the engine's
	 * own thread blocks. No per-address limit of libmicrohttpd's: it would
	 * refuse the probe itself (the guard makes room instead). */
	h->daemon = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, (uint16_t)port, NULL, NULL, handle, h,
		MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin, MHD_OPTION_CONNECTION_LIMIT, (unsigned)PROBE_HARD_LIMIT,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)PROBE_IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_CONNECTION, notify, h,
		MHD_OPTION_END);
	if (!h->daemon) {
		gf_conn_guard_destroy(&h->guard);
		free(h);
		return gf_err(GF_ERR_IO, "probe server: cannot listen on %s:%d (port in use or not permitted)", address,
			      port);
	}
	if (gf_conn_guard_start(&h->guard) < 0) {
		gf_engine_http_stop(h);
		return gf_err(GF_ERR_IO, "probe server: cannot start the deadline thread");
	}
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
	/* The deadline thread first: no shutdown() on fds the daemon is closing. */
	gf_conn_guard_stop(&h->guard);
	MHD_stop_daemon(h->daemon);
	gf_conn_guard_destroy(&h->guard);
	free(h);
}

void gf_engine_http_stats(struct gf_engine_http *h, struct gf_engine_http_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!h)
		return;
	unsigned open;
	gf_conn_guard_stats(&h->guard, &open, &out->cut_deadline, &out->cut_evicted);
	out->open = open;
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
