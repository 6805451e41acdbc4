/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sidecars' HTTP face (libmicrohttpd):
 *   GET /metrics                      Prometheus text
 *   GET /status                       the status JSON
 *   GET /ready?gpu=UUID&model=NAME    (gf-lockd) 200 when an engine holds the
 *                                     lock for those GPUs (repeatable) and
 *                                     model, 503 when not, 400 on a malformed query
 *
 * Connections live on libmicrohttpd's own thread (poll, so fds above
 * FD_SETSIZE are fine): accepting, reading, timing out and closing never
 * wait for the daemon's loop, and a client never stalls it. Only the answer
 * is made on the loop, where the server's state lives: the request is
 * suspended, handed over through an eventfd, rendered by
 * sidecar_http_process() and resumed.
 *
 * A flood of slow connections, even from the prober's own address, does
 * not keep a probe or a scrape out (conn_guard.h): a request unfinished
 * after HTTP_DEADLINE_MS is cut, and an address over HTTP_PER_IP_LIMIT (or
 * the server over HTTP_CONN_LIMIT) loses its oldest connection to the new
 * one instead of the new one being refused.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "conn_guard.h"
#include "gpufailover.h"
#include "sidecar_http.h"

/* Few clients (a scraper, a router, a probe): small bounds keep a flood from
 * taking the server's fds, and one source from taking every slot. */
#define HTTP_CONN_LIMIT 32
#define HTTP_PER_IP_LIMIT 8
/* A request takes milliseconds; one unfinished after this is cut. */
#define HTTP_DEADLINE_MS 5000
#define HTTP_IDLE_TIMEOUT_S 10
#define READY_MAX_GPUS 8
#define READY_MAX_ARG 256

enum job_kind { JOB_METRICS, JOB_STATUS, JOB_READY };

/* One request, from its headers to its answer (the connection's context). */
struct job {
	struct job *next; /* in the hand-over queue */
	struct MHD_Connection *conn;
	enum job_kind kind;
	bool queued, done;
	/* /ready's query, copied: the loop reads it after the handler returned. */
	char gpus[READY_MAX_GPUS][READY_MAX_ARG];
	size_t ngpus;
	char model[READY_MAX_ARG];
	bool has_model;
	/* The answer, made on the loop. */
	unsigned status;
	const char *type;
	char *body;
};

struct sidecar_http {
	struct MHD_Daemon *daemon;
	const struct sidecar_http_ops *ops;
	void *ctx;
	int port;
	int wake_fd; /* eventfd: requests are waiting for the loop */
	pthread_mutex_t mu;
	struct job *head, *tail; /* guarded by mu */
	bool stopping;           /* guarded by mu: answer at once, suspend nothing more */
	struct gf_conn_guard guard;
};

struct ready_query {
	const char *gpus[READY_MAX_GPUS + 1];
	size_t ngpus;
	bool too_many;
};

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

/* {"error": msg} (NULL when out of memory). */
static char *error_body(const char *msg)
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
	return body;
}

static enum MHD_Result respond_error(struct MHD_Connection *c, unsigned status, const char *msg)
{
	char *body = error_body(msg);
	return body ? respond(c, status, "application/json", body) : MHD_NO;
}

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

/* On libmicrohttpd's thread: check the request, then hand it to the loop. */
static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
			      const char *version, const char *upload_data, size_t *upload_size, void **ctx)
{
	(void)version;
	(void)upload_data;
	struct sidecar_http *h = cls;
	struct job *j = *ctx;
	if (!j) {
		/* Headers only: allocate the request's context, answer on the next call. */
		if (!(j = calloc(1, sizeof(*j))))
			return MHD_NO;
		j->conn = c;
		*ctx = j;
		return MHD_YES;
	}
	if (j->done) {
		char *body = j->body;
		j->body = NULL;
		return body ? respond(c, j->status, j->type, body) : MHD_NO;
	}
	if (*upload_size)
		return respond_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "no request body expected");
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return respond_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET");
	if (!strcmp(url, "/metrics")) {
		j->kind = JOB_METRICS;
	} else if (!strcmp(url, "/status")) {
		j->kind = JOB_STATUS;
	} else if (!strcmp(url, "/ready") && h->ops->ready) {
		struct ready_query q = { .ngpus = 0 };
		MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_gpu, &q);
		if (q.too_many)
			return respond_error(c, MHD_HTTP_BAD_REQUEST, "ready: at most 8 gpu= parameters");
		const char *model = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "model");
		for (size_t i = 0; i < q.ngpus; i++)
			if (strlen(q.gpus[i]) >= READY_MAX_ARG)
				return respond_error(c, MHD_HTTP_BAD_REQUEST, "ready: gpu= too long");
		if (model && strlen(model) >= READY_MAX_ARG)
			return respond_error(c, MHD_HTTP_BAD_REQUEST, "ready: model= too long");
		j->kind = JOB_READY;
		j->ngpus = q.ngpus;
		for (size_t i = 0; i < q.ngpus; i++)
			snprintf(j->gpus[i], READY_MAX_ARG, "%s", q.gpus[i]);
		j->has_model = model != NULL;
		snprintf(j->model, sizeof(j->model), "%s", model ? model : "");
	} else {
		return respond_error(c, MHD_HTTP_NOT_FOUND, h->ops->ready ? "not found: /metrics, /status, /ready"
									 : "not found: /metrics, /status");
	}
	if (j->queued)
		return MHD_YES;
	pthread_mutex_lock(&h->mu);
	if (h->stopping) {
		pthread_mutex_unlock(&h->mu);
		return respond_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "stopping");
	}
	/* Suspended under the lock: sidecar_http_free() must find every
	 * suspended request in the queue, or stopping the daemon aborts. */
	j->queued = true;
	MHD_suspend_connection(c);
	if (h->tail)
		h->tail->next = j;
	else
		h->head = j;
	h->tail = j;
	pthread_mutex_unlock(&h->mu);
	uint64_t one = 1;
	if (write(h->wake_fd, &one, sizeof(one)) < 0) {
		/* The counter is already non-zero: the loop wakes anyway. */
	}
	return MHD_YES;
}

/* On the loop: make the answer of @j from the server's state. */
static void render(struct sidecar_http *h, struct job *j)
{
	char *text = NULL;
	int rc;
	j->type = "application/json";
	switch (j->kind) {
	case JOB_METRICS:
		rc = h->ops->metrics(h->ctx, &text);
		j->type = "text/plain; version=0.0.4";
		j->status = MHD_HTTP_OK;
		break;
	case JOB_STATUS:
		rc = h->ops->status(h->ctx, &text);
		j->status = MHD_HTTP_OK;
		break;
	default: {
		const char *gpus[READY_MAX_GPUS + 1] = { NULL };
		for (size_t i = 0; i < j->ngpus; i++)
			gpus[i] = j->gpus[i];
		rc = h->ops->ready(h->ctx, gpus, j->ngpus, j->has_model ? j->model : NULL, &text);
		j->status = rc == 1 ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
		break;
	}
	}
	if (rc < 0) {
		free(text);
		text = error_body(gf_error_detail());
		j->type = "application/json";
		j->status = j->kind == JOB_READY && rc == GF_ERR_INVALID_ARG ? MHD_HTTP_BAD_REQUEST
									   : MHD_HTTP_INTERNAL_SERVER_ERROR;
	}
	if (!text) {
		text = strdup("{\"error\":\"out of memory\"}\n");
		j->type = "application/json";
		j->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
	}
	j->body = text;
}

/* A request is over (answered, or its connection closed): free its context. */
static void notify(void *cls, struct MHD_Connection *c, void **socket_context,
		   enum MHD_ConnectionNotificationCode code)
{
	struct sidecar_http *h = cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *fdi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
		const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		*socket_context = fdi ? gf_conn_guard_open(&h->guard, fdi->connect_fd, ai ? ai->client_addr : NULL) : NULL;
		/* Untracked connections would escape the deadline: refuse. */
		if (!*socket_context && fdi)
			shutdown(fdi->connect_fd, SHUT_RDWR);
		return;
	}
	gf_conn_guard_closed(&h->guard, *socket_context);
	*socket_context = NULL;
}

static void completed(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_RequestTerminationCode toe)
{
	struct sidecar_http *h = cls;
	(void)toe;
	/* Answered: a kept-alive connection gets a fresh deadline for its next request. */
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	gf_conn_guard_answered(&h->guard, ci ? ci->socket_context : NULL);
	struct job *j = *ctx;
	if (j) {
		free(j->body);
		free(j);
		*ctx = NULL;
	}
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
		fprintf(stderr, "%s: --metrics: expected ADDR:PORT (IPv4, e.g. 127.0.0.1:7461), got '%s'\n", prog,
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
	pthread_mutex_init(&h->mu, NULL);
	h->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (h->wake_fd < 0) {
		perror("eventfd");
		free(h);
		return -1;
	}
	if (gf_conn_guard_init(&h->guard, HTTP_CONN_LIMIT, HTTP_PER_IP_LIMIT, HTTP_DEADLINE_MS) < 0) {
		perror("pthread");
		close(h->wake_fd);
		free(h);
		return -1;
	}
	/* No per-address limit of libmicrohttpd's: it would refuse the probe
	 * itself once others from its address hold the slots (the guard makes
	 * room instead); its own limit leaves room for cut connections closing. */
	h->daemon = MHD_start_daemon(MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME, (uint16_t)port, NULL, NULL,
				     handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin, MHD_OPTION_CONNECTION_LIMIT,
				     (unsigned)(2 * HTTP_CONN_LIMIT), MHD_OPTION_CONNECTION_TIMEOUT,
				     (unsigned)HTTP_IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_COMPLETED, completed, h,
				     MHD_OPTION_NOTIFY_CONNECTION, notify, h, MHD_OPTION_END);
	if (!h->daemon || gf_conn_guard_start(&h->guard) < 0) {
		fprintf(stderr, "%s: --metrics %s: cannot listen (in use, or not an address of this host)\n", prog,
			addrport);
		if (h->daemon)
			MHD_stop_daemon(h->daemon);
		gf_conn_guard_destroy(&h->guard);
		close(h->wake_fd);
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
	return h->wake_fd;
}

int sidecar_http_port(const struct sidecar_http *h)
{
	return h->port;
}

void sidecar_http_process(struct sidecar_http *h)
{
	uint64_t n;
	if (read(h->wake_fd, &n, sizeof(n)) < 0) {
		/* Nothing was signalled: the loop woke for its own reasons. */
	}
	pthread_mutex_lock(&h->mu);
	struct job *j = h->head;
	h->head = h->tail = NULL;
	pthread_mutex_unlock(&h->mu);
	while (j) {
		struct job *next = j->next;
		render(h, j);
		j->done = true;
		MHD_resume_connection(j->conn);
		j = next;
	}
}

void sidecar_http_free(struct sidecar_http *h)
{
	if (!h)
		return;
	/* libmicrohttpd refuses to stop with a request still suspended: answer
	 * the waiting ones, and let no new one wait. */
	pthread_mutex_lock(&h->mu);
	h->stopping = true;
	struct job *j = h->head;
	h->head = h->tail = NULL;
	pthread_mutex_unlock(&h->mu);
	while (j) {
		struct job *next = j->next;
		j->body = error_body("stopping");
		j->type = "application/json";
		j->status = MHD_HTTP_SERVICE_UNAVAILABLE;
		j->done = true;
		MHD_resume_connection(j->conn);
		j = next;
	}
	/* The deadline thread first: no shutdown() on fds the daemon is closing. */
	gf_conn_guard_stop(&h->guard);
	MHD_stop_daemon(h->daemon);
	gf_conn_guard_destroy(&h->guard);
	close(h->wake_fd);
	pthread_mutex_destroy(&h->mu);
	free(h);
}
