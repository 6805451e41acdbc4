/* SPDX-License-Identifier: Apache-2.0 */
/* The sidecars' HTTP face (gf-lockd --metrics, gf-gmsd --metrics): /metrics,
 * /status and, where the daemon has one, /ready. Connections live on
 * libmicrohttpd's thread; every answer is made on the daemon's own loop, so
 * it reads the state on the one thread that owns it. */
#ifndef GF_SIDECAR_HTTP_H
#define GF_SIDECAR_HTTP_H

#include <stddef.h>

/* What a daemon answers; each fills a malloc'd body or returns a negative
 * GF_ERR_* with the detail set. ready (optional) returns 1 ready, 0 not. */
struct sidecar_http_ops {
	int (*metrics)(void *ctx, char **text);
	int (*status)(void *ctx, char **json);
	int (*ready)(void *ctx, const char *const *gpus, size_t ngpus, const char *model, char **json);
};

struct sidecar_http;

/* Listen on @addrport ("ADDR:PORT", IPv4, port 0: any). 0, or -1 after a
 * message on stderr naming @prog. */
int sidecar_http_start(struct sidecar_http **out, const char *prog, const struct sidecar_http_ops *ops, void *ctx,
		       const char *addrport);
/* The fd to poll for input: readable when requests wait for an answer. */
int sidecar_http_fd(const struct sidecar_http *h);
/* The bound port. */
int sidecar_http_port(const struct sidecar_http *h);
/* Answer the waiting requests, without blocking. On the thread that drives the daemon. */
void sidecar_http_process(struct sidecar_http *h);
void sidecar_http_free(struct sidecar_http *h);

#endif
