/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcd's v3 JSON gateway for the etcd lock (etcd.c), over libcurl: one
 * request to the member that answered last, the next member on failure,
 * authentication when the member asks for it, every socket close-on-exec.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "etcd_int.h"

/* The gateway writes int64 as JSON strings; accept numbers too. -1 when absent. */
int64_t etcd_jint(const json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	if (json_is_integer(v))
		return json_integer_value(v);
	if (json_is_string(v)) {
		char *end;
		errno = 0;
		long long x = strtoll(json_string_value(v), &end, 10);
		if (!errno && *end == 0)
			return x;
	}
	return -1;
}

/* What one request to one member came to. */
enum { HR_OK, HR_NEXT, HR_AUTH, HR_FAIL };

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
	struct hconn *c = ud;
	size_t len = sz * n;
	if (c->len + len + 1 > MAX_RESP) {
		c->overflow = true;
		return 0;
	}
	if (c->len + len + 1 > c->cap) {
		size_t cap = c->cap ? c->cap : 4096;
		while (cap < c->len + len + 1)
			cap *= 2;
		char *b = realloc(c->buf, cap);
		if (!b)
			return 0;
		c->buf = b;
		c->cap = cap;
	}
	memcpy(c->buf + c->len, p, len);
	c->len += len;
	c->buf[c->len] = 0;
	return len;
}

int etcd_hconn_init(struct hconn *c)
{
	c->h = curl_easy_init();
	c->m = curl_multi_init();
	return c->h && c->m ? 0 : gf_err(GF_ERR_NOMEM, "etcd: curl_easy_init failed");
}

void etcd_hconn_free(struct hconn *c)
{
	if (c->m)
		curl_multi_cleanup(c->m);
	if (c->h)
		curl_easy_cleanup(c->h);
	free(c->buf);
	memset(c, 0, sizeof(*c));
}

/*
 * curl's own sockets would survive exec: every fd of the library is
 * close-on-exec. A connection is closed only after its answer was read (or
 * to abandon a watch), so it closes with a reset: short-lived clients such
 * as `gfctl lock status` leave no TIME_WAIT ports behind.
 */
static curl_socket_t open_cloexec(void *ud, curlsocktype purpose, struct curl_sockaddr *a)
{
	(void)ud;
	(void)purpose;
	int fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	return fd;
}

/* The open fds of this process, sorted (malloc'd; NULL when /proc is missing). */
int *etcd_list_fds(size_t *n)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return NULL;
	int *v = NULL;
	size_t cap = 0;
	*n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (de->d_name[0] < '0' || de->d_name[0] > '9' || atoi(de->d_name) == dirfd(d))
			continue;
		if (*n == cap) {
			int *nv = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof(int));
			if (!nv)
				break;
			v = nv;
		}
		v[(*n)++] = atoi(de->d_name);
	}
	closedir(d);
	return v;
}

static bool has_fd(const int *v, size_t n, int fd)
{
	for (size_t i = 0; i < n; i++)
		if (v[i] == fd)
			return true;
	return false;
}

/*
 * Every multi handle makes a wake-up socketpair without close-on-exec (curl
 * 7.88 has no option for it): mark the sockets that appeared while the
 * handles were made, so an exec'd child of the holder inherits none.
 */
void etcd_cloexec_new_sockets(const int *before, size_t nb)
{
	size_t na = 0;
	int *after = etcd_list_fds(&na);
	for (size_t i = 0; after && i < na; i++) {
		struct stat st;
		int fd = after[i], fl = fcntl(fd, F_GETFD);
		if (has_fd(before, nb, fd) || fl < 0 || (fl & FD_CLOEXEC) || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
			continue;
		fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
	}
	free(after);
}

/* Run one transfer on @c's own multi handle (blocking, bounded by the
 * handle's timeout); @intr_fd (if >= 0) becoming readable aborts it. */
static CURLcode perform(struct hconn *c, int intr_fd)
{
	CURLcode res = CURLE_OK;
	if (curl_multi_add_handle(c->m, c->h) != CURLM_OK)
		return CURLE_OUT_OF_MEMORY;
	for (;;) {
		int running = 0;
		if (curl_multi_perform(c->m, &running) != CURLM_OK) {
			res = CURLE_RECV_ERROR;
			break;
		}
		if (!running) {
			int q;
			CURLMsg *msg;
			while ((msg = curl_multi_info_read(c->m, &q)))
				if (msg->msg == CURLMSG_DONE)
					res = msg->data.result;
			break;
		}
		struct curl_waitfd wf = { .fd = intr_fd, .events = CURL_WAIT_POLLIN };
		curl_multi_poll(c->m, &wf, intr_fd >= 0 ? 1 : 0, 1000, NULL);
		struct pollfd p = { .fd = intr_fd, .events = POLLIN };
		if (intr_fd >= 0 && poll(&p, 1, 0) > 0) {
			res = CURLE_ABORTED_BY_CALLBACK;
			break;
		}
	}
	curl_multi_remove_handle(c->m, c->h);
	return res;
}

/* Options every request shares; the caller adds the body and callbacks. */
void etcd_setup_handle(struct gf_etcd *e, CURL *h, const char *url, struct curl_slist *hdrs, int64_t timeout_ms)
{
	curl_easy_reset(h);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_ms < 1 || timeout_ms > TRY_MAX_MS ? TRY_MAX_MS : timeout_ms));
	if (timeout_ms > 0)
		curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
	curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, open_cloexec);
	if (e->tls) {
		if (e->cacert[0])
			curl_easy_setopt(h, CURLOPT_CAINFO, e->cacert);
		if (e->cert[0]) {
			curl_easy_setopt(h, CURLOPT_SSLCERT, e->cert);
			curl_easy_setopt(h, CURLOPT_SSLKEY, e->key);
		}
	}
}

struct curl_slist *etcd_headers(struct gf_etcd *e)
{
	struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
	pthread_mutex_lock(&e->mu);
	if (e->token[0] && hdrs) {
		char line[560];
		snprintf(line, sizeof(line), "Authorization: %s", e->token);
		struct curl_slist *n = curl_slist_append(hdrs, line);
		if (!n) {
			curl_slist_free_all(hdrs);
			hdrs = NULL;
		} else {
			hdrs = n;
		}
	}
	pthread_mutex_unlock(&e->mu);
	return hdrs;
}

/* One POST to one member. HR_OK with *out, HR_NEXT (try another member),
 * HR_AUTH (token refused), HR_FAIL (rc set). */
static int post_one(struct gf_etcd *e, struct hconn *c, int ep, const char *path, const char *body,
		    int64_t timeout_ms, int intr_fd, json_t **out, int *rc)
{
	char url[400];
	snprintf(url, sizeof(url), "%s%s", e->ep[ep], path);
	struct curl_slist *hdrs = etcd_headers(e);
	if (!hdrs) {
		*rc = gf_err(GF_ERR_NOMEM, "etcd: out of memory");
		return HR_FAIL;
	}
	etcd_setup_handle(e, c->h, url, hdrs, timeout_ms);
	curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
	c->len = 0;
	c->overflow = false;
	CURLcode cc = perform(c, intr_fd);
	curl_slist_free_all(hdrs);
	long code = 0;
	curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &code);
	if (cc != CURLE_OK) {
		if (cc == CURLE_ABORTED_BY_CALLBACK) {
			*rc = gf_err(GF_ERR_INTERRUPTED, "etcd: interrupted");
			return HR_FAIL;
		}
		if (c->overflow) {
			*rc = gf_err(GF_ERR_PROTOCOL, "etcd %s: answer larger than %d bytes", e->ep[ep], MAX_RESP);
			return HR_FAIL;
		}
		if (cc == CURLE_SSL_CERTPROBLEM || cc == CURLE_SSL_CACERT_BADFILE || cc == CURLE_PEER_FAILED_VERIFICATION) {
			*rc = gf_err(GF_ERR_PERMISSION, "etcd %s: TLS: %s", e->ep[ep], curl_easy_strerror(cc));
			return HR_FAIL;
		}
		gf_err(GF_ERR_UNREACHABLE, "etcd %s: %s", e->ep[ep], curl_easy_strerror(cc));
		return HR_NEXT;
	}
	json_error_t je;
	json_t *j = c->len ? json_loadb(c->buf, c->len, 0, &je) : NULL;
	if (code == 200 && json_is_object(j)) {
		*out = j;
		return HR_OK;
	}
	const char *msg = j ? json_string_value(json_object_get(j, "error")) : NULL;
	int64_t gcode = j ? etcd_jint(j, "code") : -1;
	char detail[300];
	snprintf(detail, sizeof(detail), "%s", msg ? msg : (c->len ? "unreadable answer" : "empty answer"));
	json_decref(j);
	/* gRPC codes: 14 unavailable (no leader, leader changed, timeout), 4
	 * deadline, 16 unauthenticated, 7 permission denied. */
	if (gcode == 16 || code == 401) {
		gf_err(GF_ERR_PERMISSION, "etcd %s: %s", e->ep[ep], detail);
		return HR_AUTH;
	}
	if (gcode == 7 || code == 403) {
		*rc = gf_err(GF_ERR_PERMISSION, "etcd %s: %s", e->ep[ep], detail);
		return HR_FAIL;
	}
	if (gcode == 14 || gcode == 4 || code >= 500 || code == 0) {
		gf_err(GF_ERR_UNREACHABLE, "etcd %s: HTTP %ld: %s", e->ep[ep], code, detail);
		return HR_NEXT;
	}
	*rc = gf_err(GF_ERR_PROTOCOL, "etcd %s %s: HTTP %ld: %s", e->ep[ep], path, code, detail);
	return HR_FAIL;
}

static int authenticate(struct gf_etcd *e, struct hconn *c, int ep, int64_t timeout_ms)
{
	if (!e->password)
		return gf_err(GF_ERR_PERMISSION, "etcd: user %s needs a password (password-file=, GF_ETCD_PASSWORD or a secret file)",
			      e->user);
	json_t *b = json_pack("{s:s,s:s}", "name", e->user, "password", e->password);
	char *body = b ? json_dumps(b, JSON_COMPACT) : NULL;
	json_decref(b);
	if (!body)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	pthread_mutex_lock(&e->mu);
	e->token[0] = 0;
	pthread_mutex_unlock(&e->mu);
	json_t *out = NULL;
	int rc = 0, r = post_one(e, c, ep, "/v3/auth/authenticate", body, timeout_ms, -1, &out, &rc);
	memset(body, 0, strlen(body));
	free(body);
	if (r == HR_AUTH || r == HR_FAIL)
		return gf_err(GF_ERR_PERMISSION, "etcd: authentication of user %s refused: %s", e->user, gf_error_detail());
	if (r == HR_NEXT)
		return GF_ERR_UNREACHABLE;
	const char *tok = json_string_value(json_object_get(out, "token"));
	rc = tok && strlen(tok) < sizeof(e->token) ? 0 : gf_err(GF_ERR_PROTOCOL, "etcd: authenticate returned no token");
	if (rc == 0) {
		pthread_mutex_lock(&e->mu);
		snprintf(e->token, sizeof(e->token), "%s", tok);
		pthread_mutex_unlock(&e->mu);
	}
	json_decref(out);
	return rc;
}

/*
 * POST @body (stolen) to @path, trying the members in turn from the one that
 * answered last, each for at most @try_ms, until one answers or @deadline.
 * Returns 0 with *out, GF_ERR_UNREACHABLE, GF_ERR_PERMISSION, GF_ERR_PROTOCOL,
 * GF_ERR_INTERRUPTED (when @intr_fd >= 0 became readable between tries).
 */
int etcd_call(struct gf_etcd *e, struct hconn *c, const char *path, json_t *body, int64_t deadline, int64_t try_ms,
		int intr_fd, json_t **out)
{
	char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	if (!text)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	int rc = GF_ERR_UNREACHABLE;
	bool reauthed = false;
	char last[300] = "no member tried";
	for (int round = 0;; round++) {
		int start = atomic_load(&e->cur);
		bool any_fast_fail = false;
		for (int i = 0; i < e->n_ep; i++) {
			int ep = (start + i) % e->n_ep;
			int64_t now = gf_now_us();
			if (now >= deadline)
				goto out;
			int64_t t = (deadline - now) / 1000;
			if (t > try_ms)
				t = try_ms;
			if (t < 1)
				t = 1;
			if (e->user[0]) {
				pthread_mutex_lock(&e->mu);
				bool have = e->token[0] != 0;
				pthread_mutex_unlock(&e->mu);
				if (!have) {
					int a = authenticate(e, c, ep, t);
					if (a == GF_ERR_UNREACHABLE) {
						snprintf(last, sizeof(last), "%s", gf_error_detail());
						continue;
					}
					if (a < 0) {
						rc = a;
						goto fail;
					}
				}
			}
			int64_t t0 = gf_now_us();
			int r = post_one(e, c, ep, path, text, t, intr_fd, out, &rc);
			if (r == HR_OK) {
				atomic_store(&e->cur, ep);
				rc = 0;
				goto done;
			}
			if (r == HR_FAIL)
				goto fail;
			if (r == HR_AUTH) {
				if (reauthed || !e->user[0]) {
					rc = GF_ERR_PERMISSION;
					goto fail;
				}
				/* Simple tokens expire: authenticate again once. */
				reauthed = true;
				pthread_mutex_lock(&e->mu);
				e->token[0] = 0;
				pthread_mutex_unlock(&e->mu);
				i--;
				continue;
			}
			snprintf(last, sizeof(last), "%s", gf_error_detail());
			if (gf_now_us() - t0 < 100000)
				any_fast_fail = true;
			if (intr_fd >= 0) {
				struct pollfd p = { .fd = intr_fd, .events = POLLIN };
				if (poll(&p, 1, 0) > 0) {
					free(text);
					return gf_err(GF_ERR_INTERRUPTED, "etcd: interrupted");
				}
			}
		}
		/* Every member refused at once (all down, or no leader yet): do
		 * not spin; an interrupt cuts the pause short. */
		if (any_fast_fail) {
			int64_t until = gf_now_us() + RETRY_US;
			if (until > deadline)
				until = deadline;
			struct pollfd p = { .fd = intr_fd, .events = POLLIN };
			if (intr_fd >= 0 && poll(&p, 1, gf_poll_timeout_ms(until)) > 0) {
				free(text);
				return gf_err(GF_ERR_INTERRUPTED, "etcd: interrupted");
			}
			if (intr_fd < 0)
				usleep((useconds_t)(until > gf_now_us() ? until - gf_now_us() : 0));
		}
	}
out:
	rc = gf_err(GF_ERR_UNREACHABLE, "etcd %s: no member answered in time (%s)", path, last);
fail:
done:
	free(text);
	return rc;
}
