/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sidecars' HTTP face (libmicrohttpd, as the engine's probe server): run
 * in the daemon's single loop (MHD's epoll fd polled next to the server's),
 * so every answer reads the server's state on the one thread that owns it.
 *   GET /metrics                      Prometheus text
 *   GET /status                       the status JSON
 *   GET /ready?gpu=UUID&model=NAME    (gf-lockd) 200 when an engine holds the
 *                                     lock for those GPUs (repeatable) and
 *                                     model, 503 when not, 400 on a malformed query
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <microhttpd.h>

#include "gpufailover.h"
#include "sidecar_http.h"

/* Few clients (a scraper, a router): a small bound keeps a flood from taking the server's fds. */
#define HTTP_CONN_LIMIT 32
#define HTTP_IDLE_TIMEOUT_S 10
#define READY_MAX_GPUS 8

struct sidecar_http {
	struct MHD_Daemon *daemon;
	const struct sidecar_http_ops *ops;
	void *ctx;
	int port;
};

struct ready_query {
	const char *gpus[READY_MAX_GPUS + 1];
	size_t ngpus;
	bool too_many;
};

static enum MHD_Result collect_gpu(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	(void)kind;
	struct ready_query *q = cls;
	if (strcmp(key, "gpu") != 0)
		return MHD_YES;
	if (q->ngpus == READY_MAX_GPUS) {
		q->too_many = true;
		return MHD_NO;
	}
	q->gpus[q->ngpus++] = value ? value : "";
	return MHD_YES;
}

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, const char *type, char *body)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", type);
	MHD_add_response_header(r, "Cache-Control", "no-store");
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result respond_error(struct MHD_Connection *c, unsigned status, const char *msg)
{
	/* jansson escapes quotes, backslashes and control characters; a detail
	 * that is not UTF-8 (it may echo a query) is sent without it. */
	json_t *o = json_pack("{s:s}", "error", msg);
	if (!o)
		o = json_pack("{s:s}", "error", "(the detail is not valid UTF-8)");
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	char *body = NULL;
	if (!text || asprintf(&body, "%s\n", text) < 0)
		body = NULL;
	free(text);
	if (!body)
		return MHD_NO;
	return respond(c, status, "application/json", body);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
			      const char *version, const char *upload_data, size_t *upload_size, void **ctx)
{
	(void)version;
	(void)upload_data;
	struct sidecar_http *h = cls;
	static int first;
	if (!*ctx) {
		*ctx = &first; /* headers only; answer on the next call */
		return MHD_YES;
	}
	if (*upload_size)
		return respond_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "no request body expected");
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return respond_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET");
	char *text = NULL;
	if (!strcmp(url, "/metrics")) {
		if (h->ops->metrics(h->ctx, &text) < 0)
			return respond_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, gf_error_detail());
		return respond(c, MHD_HTTP_OK, "text/plain; version=0.0.4", text);
	}
	if (!strcmp(url, "/status")) {
		if (h->ops->status(h->ctx, &text) < 0)
			return respond_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, gf_error_detail());
		return respond(c, MHD_HTTP_OK, "application/json", text);
	}
	if (!strcmp(url, "/ready") && h->ops->ready) {
		struct ready_query q = { .ngpus = 0 };
		MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_gpu, &q);
		if (q.too_many)
			return respond_error(c, MHD_HTTP_BAD_REQUEST, "ready: at most 8 gpu= parameters");
		const char *model = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "model");
		int rc = h->ops->ready(h->ctx, q.gpus, q.ngpus, model, &text);
		if (rc < 0)
			return respond_error(c, rc == GF_ERR_INVALID_ARG ? MHD_HTTP_BAD_REQUEST : MHD_HTTP_INTERNAL_SERVER_ERROR,
					     gf_error_detail());
		return respond(c, rc == 1 ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, "application/json", text);
	}
	return respond_error(c, MHD_HTTP_NOT_FOUND, h->ops->ready ? "not found: /metrics, /status, /ready"
								  : "not found: /metrics, /status");
}

int sidecar_http_start(struct sidecar_http **out, const char *prog, const struct sidecar_http_ops *ops, void *ctx,
		       const char *addrport)
{
	const char *colon = strrchr(addrport, ':');
	char addr[64];
	char *end;
	long port = colon ? strtol(colon + 1, &end, 10) : -1;
	struct sockaddr_in sin = { .sin_family = AF_INET };
	if (!colon || colon == addrport || (size_t)(colon - addrport) >= sizeof(addr) || !colon[1] || *end || port < 0 ||
	    port > 65535) {
		fprintf(stderr, "%s: --metrics: expected ADDR:PORT (IPv4, e.g. 127.0.0.1:9100), got '%s'\n", prog,
			addrport);
		return -1;
	}
	memcpy(addr, addrport, (size_t)(colon - addrport));
	addr[colon - addrport] = '\0';
	if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1) {
		fprintf(stderr, "%s: --metrics: '%s' is not an IPv4 address\n", prog, addr);
		return -1;
	}
	sin.sin_port = htons((uint16_t)port);
	struct sidecar_http *h = calloc(1, sizeof(*h));
	if (!h) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return -1;
	}
	h->ops = ops;
	h->ctx = ctx;
	h->daemon = MHD_start_daemon(MHD_USE_EPOLL, (uint16_t)port, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR,
				     (struct sockaddr *)&sin, MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONN_LIMIT,
				     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_TIMEOUT_S, MHD_OPTION_END);
	if (!h->daemon) {
		fprintf(stderr, "%s: --metrics %s: cannot listen (in use, or not an address of this host)\n", prog,
			addrport);
		free(h);
		return -1;
	}
	const union MHD_DaemonInfo *pi = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
	h->port = pi ? pi->port : (int)port;
	*out = h;
	return 0;
}

int sidecar_http_fd(const struct sidecar_http *h)
{
	const union MHD_DaemonInfo *i = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_EPOLL_FD);
	return i ? i->epoll_fd : -1;
}

int sidecar_http_timeout_ms(const struct sidecar_http *h)
{
	MHD_UNSIGNED_LONG_LONG t;
	if (MHD_get_timeout(h->daemon, &t) != MHD_YES)
		return -1;
	return t > 60000 ? 60000 : (int)t;
}

int sidecar_http_port(const struct sidecar_http *h)
{
	return h->port;
}

void sidecar_http_process(struct sidecar_http *h)
{
	MHD_run(h->daemon);
}

void sidecar_http_free(struct sidecar_http *h)
{
	if (!h)
		return;
	MHD_stop_daemon(h->daemon);
	free(h);
}
