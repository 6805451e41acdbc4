/* SPDX-License-Identifier: Apache-2.0 */
/* The built-in probe server: libmicrohttpd with its own polling thread, so
 * probes are answered while the engine's main thread blocks in acquire() or
 * hangs in a wake. It only reads the engine through its thread-safe
 * inspection calls. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "common.h"
#include "engine_int.h"

struct gf_engine_http {
	struct MHD_Daemon *daemon;
	gf_engine *engine;
	int port;
};

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
		char body[64];
		int n = snprintf(body, sizeof(body), "%s %s\n", status == 200 ? "ok" : "unavailable",
				 gf_engine_state_name(gf_engine_state(h->engine)));
		return reply(conn, status > 0 ? (unsigned)status : 500, "text/plain", body, (size_t)n);
	}
	char *text = NULL;
	if (!strcmp(url, "/state")) {
		if (gf_engine_state_json(h->engine, &text) != 0)
			return reply(conn, 500, "text/plain", "error\n", 6);
		enum MHD_Result r = reply(conn, 200, "application/json", text, strlen(text));
		free(text);
		return r;
	}
	if (!strcmp(url, "/metrics")) {
		if (gf_engine_metrics_text(h->engine, &text) != 0)
			return reply(conn, 500, "text/plain", "error\n", 6);
		enum MHD_Result r = reply(conn, 200, "text/plain; version=0.0.4", text, strlen(text));
		free(text);
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
	/* Internal polling thread: probes must be answered while the engine's
	 * own thread blocks. Small limits: only kubelet and scrapers talk here. */
	h->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, (uint16_t)port, NULL, NULL,
				     handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin,
				     MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_CONNECTION_TIMEOUT,
				     (unsigned)10, MHD_OPTION_END);
	if (!h->daemon) {
		free(h);
		return gf_err(GF_ERR_IO, "probe server: cannot listen on %s:%d (port in use or not permitted)", address,
			      port);
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
	MHD_stop_daemon(h->daemon);
	free(h);
}

GF_EXPORT int gf_engine_start_probe_server(gf_engine *e)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_start_probe_server: NULL engine");
	if (e->http)
		return 0;
	if (e->probe_port < 0)
		return gf_err(GF_ERR_STATE, "probe server disabled (gf_engine_set_probe_address with port >= 0)");
	return gf_engine_http_start(e, e->probe_addr, e->probe_port, &e->http);
}

GF_EXPORT int gf_engine_probe_port(const gf_engine *e)
{
	return e && e->http ? gf_engine_http_port(e->http) : -1;
}
