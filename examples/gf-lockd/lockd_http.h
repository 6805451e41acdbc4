/* SPDX-License-Identifier: Apache-2.0 */
/* gf-lockd --metrics: /metrics, /status and /ready over HTTP, served from gf-lockd's own loop. */
#ifndef GF_LOCKD_HTTP_H
#define GF_LOCKD_HTTP_H

#include "gpufailover.h"

struct lockd_http;

/* Listen on @addrport ("ADDR:PORT", IPv4, port 0: any). 0 or -1 after a message on stderr. */
int lockd_http_start(struct lockd_http **out, gf_lockd *d, const char *addrport);
/* The fd to poll for input (an epoll fd), and the most to wait in ms (-1: no limit). */
int lockd_http_fd(const struct lockd_http *h);
int lockd_http_timeout_ms(const struct lockd_http *h);
/* The bound port. */
int lockd_http_port(const struct lockd_http *h);
/* Serve what is ready, without blocking. On the thread that drives the lock server. */
void lockd_http_process(struct lockd_http *h);
void lockd_http_free(struct lockd_http *h);

#endif
