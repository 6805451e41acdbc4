/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock on etcd, over the v3 JSON gateway (libcurl + jansson).
 *
 * The recipe of etcd's own concurrency package (Mutex): a lease with a TTL,
 * kept alive by a thread of ours while waiting and holding; the waiter's key
 * PREFIX/<lease-id-hex> created in a transaction only if it does not exist;
 * the grant once no key under the prefix with a lower create revision
 * remains, watching only the nearest predecessor so a release wakes one
 * waiter. The fencing epoch is the holder key's create revision: etcd's
 * revision only grows, across restarts and member changes.
 *
 * Fencing: the lease cannot expire earlier than TTL after the send time of
 * the last keepalive it answered. The holder counts T_fence from that send
 * time and, past it, stops renewing and reports the loss; T_fence + margin
 * <= TTL, so the report comes before anyone else can be granted.
 *
 * Threads: gf_etcd_acquire() and gf_etcd_release() run on the caller's
 * thread with their own curl handles; the keepalive thread has its own. They
 * share only atomics and the auth token (under mu).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/evp.h>

#include "common.h"
#include "etcd_int.h"

/* ---- small helpers ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* etcd's JSON gateway carries keys and values as base64: OpenSSL's codec (libcrypto is linked anyway). */
static char *b64enc(const char *in, size_t n)
{
	char *out = n <= INT_MAX / 2 ? malloc(4 * ((n + 2) / 3) + 1) : NULL;
	if (out)
		EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)in, (int)n);
	return out;
}

/* Decode into @out (cap bytes incl. NUL); -1 when malformed or too long. */
static int b64dec(const char *in, char *out, size_t cap)
{
	size_t n = strlen(in);
	if (n % 4 || n > INT_MAX / 2)
		return -1;
	size_t pad = (n && in[n - 1] == '=') + (n > 1 && in[n - 2] == '=');
	size_t len = n / 4 * 3 - pad;
	if (len + 1 > cap)
		return -1;
	unsigned char *tmp = malloc(n / 4 * 3 + 1);
	int r = tmp ? EVP_DecodeBlock(tmp, (const unsigned char *)in, (int)n) : -1;
	if (r >= 0)
		memcpy(out, tmp, len);
	free(tmp);
	if (r < 0)
		return -1;
	out[len] = 0;
	return (int)len;
}

static json_t *jkey(const char *k)
{
	char *b = b64enc(k, strlen(k));
	json_t *s = b ? json_string(b) : NULL;
	free(b);
	return s;
}

static char *i64s(int64_t v, char buf[24])
{
	snprintf(buf, 24, "%" PRId64, v);
	return buf;
}

/* The key right after every key that starts with @prefix. */
static char *prefix_end(const char *prefix)
{
	char *e = strdup(prefix);
	if (e && *e)
		e[strlen(e) - 1]++;
	return e;
}

/* ---- URI ---- */

static int read_file_secret(const char *path, char **out)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return gf_err_errno(GF_ERR_INVALID_ARG, errno, "etcd: password file %s", path);
	char buf[1024];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	buf[n] = 0;
	if (!n)
		return gf_err(GF_ERR_INVALID_ARG, "etcd: password file %s is empty", path);
	*out = strdup(buf);
	memset(buf, 0, sizeof(buf));
	return *out ? 0 : gf_err(GF_ERR_NOMEM, "etcd: out of memory");
}

static int set_param(struct gf_etcd *e, const char *k, size_t kl, const char *v)
{
#define IS(name) (kl == strlen(name) && !strncmp(k, name, kl))
	size_t vl = strlen(v);
	if (IS("ttl")) {
		char *end;
		long t = strtol(v, &end, 10);
		if (*end || t < 1 || t > 3600)
			return gf_err(GF_ERR_INVALID_ARG, "etcd: ttl=%s must be 1..3600 seconds", v);
		e->ttl_s = t;
		return 0;
	}
	char *dst = NULL;
	size_t cap = 0;
	if (IS("user")) {
		dst = e->user;
		cap = sizeof(e->user);
	} else if (IS("cacert")) {
		dst = e->cacert;
		cap = sizeof(e->cacert);
	} else if (IS("cert")) {
		dst = e->cert;
		cap = sizeof(e->cert);
	} else if (IS("key")) {
		dst = e->key;
		cap = sizeof(e->key);
	} else if (IS("password-file")) {
		free(e->password);
		e->password = NULL;
		return read_file_secret(v, &e->password);
	} else {
		return gf_err(GF_ERR_INVALID_ARG, "etcd: unknown URI parameter '%.*s' (ttl, user, password-file, cacert, cert, key)",
			      (int)kl, k);
	}
#undef IS
	if (vl == 0 || vl >= cap)
		return gf_err(GF_ERR_INVALID_ARG, "etcd: URI parameter '%.*s' is empty or too long", (int)kl, k);
	memcpy(dst, v, vl + 1);
	return 0;
}

/* One "host:port" of the endpoint list, checked by libcurl's URL parser, appended to e->ep. */
static int parse_endpoint(struct gf_etcd *e, const char *ep, size_t len)
{
	char url[300], *host = NULL, *port = NULL, *path = NULL;
	if (len == 0 || len > 255)
		return gf_err(GF_ERR_INVALID_ARG, "etcd: endpoint '%.*s' must be host:port", (int)len, ep);
	snprintf(url, sizeof(url), "http://%.*s", (int)len, ep);
	CURLU *u = curl_url();
	if (!u)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	int rc = 0;
	if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK || curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK || strcmp(path, "/") ||
	    memchr(ep, '@', len) || memchr(ep, '?', len) || memchr(ep, '#', len))
		rc = gf_err(GF_ERR_INVALID_ARG, "etcd: endpoint '%.*s' must be host:port", (int)len, ep);
	else if (strspn(host, host[0] == '[' ? "[]:.0123456789abcdefABCDEF"
					     : ".-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") != strlen(host))
		/* libcurl takes what a resolver might ('%' of a zone id, '_'): a name or an address only. */
		rc = gf_err(GF_ERR_INVALID_ARG, "etcd: bad host in '%.*s'", (int)len, ep);
	else if (curl_url_get(u, CURLUPART_PORT, &port, 0) != CURLUE_OK || !strcmp(port, "0"))
		rc = gf_err(GF_ERR_INVALID_ARG, "etcd: bad port in '%.*s' (host:port, 1..65535)", (int)len, ep);
	else if (e->n_ep == MAX_EP)
		rc = gf_err(GF_ERR_INVALID_ARG, "etcd: at most %d endpoints", MAX_EP);
	else
		snprintf(e->ep[e->n_ep++], sizeof(e->ep[0]), "%s://%s:%s", e->tls ? "https" : "http", host, port);
	curl_free(host);
	curl_free(port);
	curl_free(path);
	curl_url_cleanup(u);
	return rc;
}

/* One "key=value" of the query, percent-decoded (a password-file path may hold '&', '=' or '%'). */
static int parse_param(struct gf_etcd *e, const char *kv, size_t len)
{
	const char *eq = memchr(kv, '=', len);
	if (!eq)
		return gf_err(GF_ERR_INVALID_ARG, "etcd: URI parameter '%.*s' needs a value", (int)len, kv);
	int kl = 0, vl = 0;
	char *k = curl_easy_unescape(NULL, kv, (int)(eq - kv), &kl);
	char *v = curl_easy_unescape(NULL, eq + 1, (int)(kv + len - eq - 1), &vl);
	int rc;
	if (!k || !v)
		rc = gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	else if (memchr(k, 0, (size_t)kl) || memchr(v, 0, (size_t)vl))
		rc = gf_err(GF_ERR_INVALID_ARG, "etcd: URI parameter '%.*s' decodes to a NUL byte", (int)len, kv);
	else
		rc = set_param(e, k, (size_t)kl, v);
	curl_free(k);
	curl_free(v);
	return rc;
}

static int parse_uri(struct gf_etcd *e, const char *uri)
{
	const char *p;
	if (!strncmp(uri, "etcd://", 7)) {
		p = uri + 7;
	} else if (!strncmp(uri, "etcds://", 8)) {
		p = uri + 8;
		e->tls = true;
	} else {
		return gf_err(GF_ERR_INVALID_ARG, "etcd: '%s' is not an etcd:// or etcds:// URI", uri);
	}
	for (const unsigned char *q = (const unsigned char *)uri; *q; q++)
		if (*q <= ' ' || *q >= 0x7f)
			return gf_err(GF_ERR_INVALID_ARG, "etcd: URI must be printable ASCII without spaces");
	const char *slash = strchr(p, '/');
	if (!slash || slash == p)
		return gf_err(GF_ERR_INVALID_ARG, "etcd: '%s' needs host:port[,host:port...]/prefix/name", uri);
	/* Endpoints: a list, which no URL parser splits; each one is a URL authority. */
	for (const char *h = p; h < slash;) {
		const char *comma = memchr(h, ',', (size_t)(slash - h));
		const char *end = comma ? comma : slash;
		int rc = parse_endpoint(e, h, (size_t)(end - h));
		if (rc < 0)
			return rc;
		h = end + (comma ? 1 : 0);
		if (comma && h == slash)
			return gf_err(GF_ERR_INVALID_ARG, "etcd: empty endpoint in '%s'", uri);
	}
	/* Path and query, by libcurl's URL parser. */
	size_t rl = strlen(slash);
	char *url = malloc(rl + 16), *path = NULL, *query = NULL, *frag = NULL;
	CURLU *u = url ? curl_url() : NULL;
	if (!u) {
		free(url);
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	}
	snprintf(url, rl + 16, "http://x%s", slash);
	int rc = 0;
	if (curl_url_set(u, CURLUPART_URL, url, CURLU_PATH_AS_IS) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK)
		rc = gf_err(GF_ERR_INVALID_ARG, "etcd: '%s' is not a valid URI", uri);
	else if (curl_url_get(u, CURLUPART_FRAGMENT, &frag, 0) == CURLUE_OK)
		rc = gf_err(GF_ERR_INVALID_ARG, "etcd: '%s': no '#' fragment allowed (percent-encode a '#' as %%23)", uri);
	if (rc == 0) {
		size_t plen = strlen(path);
		while (plen > 1 && path[plen - 1] == '/')
			plen--;
		if (plen < 2 || plen + 2 > sizeof(e->prefix))
			rc = gf_err(GF_ERR_INVALID_ARG, "etcd: '%s' needs a lock name after the endpoints", uri);
		else
			snprintf(e->prefix, sizeof(e->prefix), "%.*s/", (int)plen, path);
	}
	if (rc == 0 && curl_url_get(u, CURLUPART_QUERY, &query, 0) == CURLUE_OK) {
		for (const char *kv = query; rc == 0 && *kv;) {
			const char *amp = strchr(kv, '&');
			size_t len = amp ? (size_t)(amp - kv) : strlen(kv);
			rc = parse_param(e, kv, len);
			kv += len + (amp ? 1 : 0);
		}
	}
	curl_free(path);
	curl_free(query);
	curl_free(frag);
	curl_url_cleanup(u);
	free(url);
	if (rc < 0)
		return rc;
	if ((e->cert[0] != 0) != (e->key[0] != 0))
		return gf_err(GF_ERR_INVALID_ARG, "etcd: cert= and key= go together");
	if (!e->tls && (e->cacert[0] || e->cert[0]))
		return gf_err(GF_ERR_INVALID_ARG, "etcd: TLS files need an etcds:// URI");
	return 0;
}

bool gf_etcd_is_uri(const char *uri)
{
	return uri && (!strncmp(uri, "etcd://", 7) || !strncmp(uri, "etcds://", 8));
}

/* ---- HTTP: etcd_http.c ---- */

/* ---- object ---- */

int gf_etcd_new(struct gf_etcd **out, const char *uri, const char *engine_id)
{
	pthread_once(&curl_once, curl_init);
	if (curl_init_rc != CURLE_OK)
		return gf_err(GF_ERR_IO, "etcd: curl_global_init failed");
	struct gf_etcd *e = calloc(1, sizeof(*e));
	if (!e)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	e->ttl_s = 10;
	e->ka_stop_fd = e->notify_fd = -1;
	pthread_mutex_init(&e->mu, NULL);
	snprintf(e->id, sizeof(e->id), "%s", engine_id);
	int rc = parse_uri(e, uri);
	if (rc == 0 && !e->user[0]) {
		const char *u = getenv("GF_ETCD_USER");
		if (u && *u)
			snprintf(e->user, sizeof(e->user), "%s", u);
	}
	if (rc == 0 && !e->password) {
		const char *pw = getenv("GF_ETCD_PASSWORD");
		if (pw && *pw && !(e->password = strdup(pw)))
			rc = gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	}
	size_t nfds = 0;
	int *fds = rc == 0 ? etcd_list_fds(&nfds) : NULL;
	if (rc == 0 && (etcd_hconn_init(&e->req) < 0 || etcd_hconn_init(&e->kac) < 0 || etcd_hconn_init(&e->wc) < 0 || etcd_hconn_init(&e->kwc) < 0))
		rc = gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	if (fds)
		etcd_cloexec_new_sockets(fds, nfds);
	free(fds);
	if (rc == 0) {
		e->ka_stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		e->notify_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (e->ka_stop_fd < 0 || e->notify_fd < 0)
			rc = gf_err_errno(GF_ERR_IO, errno, "etcd: eventfd");
	}
	if (rc < 0) {
		gf_etcd_free(e);
		return rc;
	}
	e->reconnect_ms = 12000;
	e->ka_ms = e->ttl_s * 1000 / 6;
	e->fence_ms = e->ttl_s * 1000 / 2;
	*out = e;
	return 0;
}

/* Stops the keepalive thread and the holder's key watch (they share the stop fd). */
static void stop_keepalive(struct gf_etcd *e)
{
	if (!e->ka_running)
		return;
	uint64_t one = 1;
	ssize_t w = write(e->ka_stop_fd, &one, sizeof(one));
	(void)w;
	pthread_join(e->ka, NULL);
	if (e->kw_running)
		pthread_join(e->kw, NULL);
	e->kw_running = false;
	uint64_t v;
	while (read(e->ka_stop_fd, &v, sizeof(v)) > 0)
		;
	e->ka_running = false;
}

/* Revoke our lease (its keys go with it): best effort within @ms. */
static void revoke_lease(struct gf_etcd *e, int64_t ms)
{
	if (!e->lease_id || atomic_load(&e->revoked)) {
		e->lease_id = 0;
		return;
	}
	char b[24];
	json_t *out = NULL;
	if (etcd_call(e, &e->req, "/v3/lease/revoke", json_pack("{s:s}", "ID", i64s(e->lease_id, b)),
		 gf_now_us() + ms * 1000, TRY_MAX_MS, -1, &out) < 0)
		/* No answer is no proof of failure: etcd may have applied it (the
		 * next holder then comes at once), or the lease ends at its TTL. */
		gf_log(GF_LOG_WARN, "lock",
		       "msg=\"etcd lease revoke not confirmed: it may have taken effect, else the lease expires after its TTL\" id=%s lease=%llx detail=\"%s\"",
		       e->id, (unsigned long long)e->lease_id, gf_error_detail());
	json_decref(out);
	e->lease_id = 0;
}

void gf_etcd_free(struct gf_etcd *e)
{
	if (!e)
		return;
	if (!e->forked) {
		stop_keepalive(e);
		revoke_lease(e, 1000);
	}
	etcd_hconn_free(&e->req);
	etcd_hconn_free(&e->kac);
	etcd_hconn_free(&e->wc);
	etcd_hconn_free(&e->kwc);
	gf_close(e->ka_stop_fd);
	gf_close(e->notify_fd);
	if (e->password) {
		memset(e->password, 0, strlen(e->password));
		free(e->password);
	}
	memset(e->token, 0, sizeof(e->token));
	pthread_mutex_destroy(&e->mu);
	free(e);
}

int gf_etcd_set_password(struct gf_etcd *e, const void *pw, size_t len)
{
	if (!pw || len == 0 || len > 1000 || memchr(pw, 0, len))
		return gf_err(GF_ERR_INVALID_ARG, "etcd: password must be 1..1000 bytes without NUL");
	char *p = malloc(len + 1);
	if (!p)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	memcpy(p, pw, len);
	while (len && (p[len - 1] == '\n' || p[len - 1] == '\r'))
		len--;
	p[len] = 0;
	if (e->password) {
		memset(e->password, 0, strlen(e->password));
		free(e->password);
	}
	e->password = p;
	return 0;
}

int gf_etcd_set_reconnect_timeout(struct gf_etcd *e, int64_t ms)
{
	e->reconnect_ms = ms;
	return 0;
}

static int64_t margin_ms(int64_t ttl_ms)
{
	return ttl_ms / 4 > MARGIN_MIN_MS ? ttl_ms / 4 : MARGIN_MIN_MS;
}

int64_t gf_etcd_fence_ms(const struct gf_etcd *e)
{
	return e->fence_ms;
}

int gf_etcd_set_lease(struct gf_etcd *e, int64_t keepalive_ms, int64_t fence_ms)
{
	int64_t ttl = e->ttl_s * 1000;
	if (fence_ms + margin_ms(ttl) > ttl)
		return gf_err(GF_ERR_INVALID_ARG,
			      "etcd: T_fence %lldms + margin %lldms must not exceed the lease TTL %llds (set ttl= in the URI)",
			      (long long)fence_ms, (long long)margin_ms(ttl), (long long)e->ttl_s);
	e->ka_ms = keepalive_ms;
	e->fence_ms = fence_ms;
	return 0;
}

/* ---- keepalive ---- */

static void notify(struct gf_etcd *e)
{
	uint64_t one = 1;
	ssize_t w = write(e->notify_fd, &one, sizeof(one));
	(void)w;
}

static bool fence_passed(const struct gf_etcd *e, int64_t now)
{
	return now - atomic_load(&e->last_ok_us) >= e->fence_ms * 1000;
}

/* Two threads answer keepalives (the keepalive thread, and the acquire's
 * renew_now()): the later send time wins, whichever answer lands last. */
static void note_ok(struct gf_etcd *e, int64_t sent)
{
	int64_t cur = atomic_load(&e->last_ok_us);
	while (cur < sent && !atomic_compare_exchange_weak(&e->last_ok_us, &cur, sent))
		;
}

/*
 * On the keepalive thread, once the holder counts as lost: stop renewing and
 * wake the owner's loop. No revoke here: the hook must run before anyone
 * else can be granted, and it runs on the owner's thread; gf_lock_release()
 * or gf_lock_free() after it revokes, else the lease runs out.
 */
static void *give_up(struct gf_etcd *e)
{
	atomic_store(&e->lease_gone, 1);
	notify(e);
	return NULL;
}

static void *keepalive_main(void *arg)
{
	struct gf_etcd *e = arg;
	char b[24];
	i64s(e->lease_id, b);
	int64_t next = gf_now_us() + e->ka_ms * 1000;
	for (;;) {
		struct pollfd p = { .fd = e->ka_stop_fd, .events = POLLIN };
		if (poll(&p, 1, gf_poll_timeout_ms(next)) > 0)
			return NULL;
		int64_t now = gf_now_us();
		/* A holder past T_fence (or already reported lost) must not
		 * renew: the next waiter may be granted once the lease is gone. */
		int st = atomic_load(&e->state);
		if (st == E_LOST || (st == E_HELD && fence_passed(e, now)))
			return give_up(e);
		int64_t try_ms = e->fence_ms / 3 < TRY_MAX_MS ? e->fence_ms / 3 : TRY_MAX_MS;
		/* Give up on this round before T_fence runs out, so the check
		 * above runs in time. */
		int64_t deadline = atomic_load(&e->last_ok_us) + e->fence_ms * 1000;
		if (deadline < now + try_ms * 1000)
			deadline = now + try_ms * 1000;
		json_t *out = NULL;
		int rc = etcd_call(e, &e->kac, "/v3/lease/keepalive", json_pack("{s:s}", "ID", b), deadline,
			      try_ms < 100 ? 100 : try_ms, e->ka_stop_fd, &out);
		if (rc == GF_ERR_INTERRUPTED)
			return NULL;
		if (rc == 0) {
			json_t *res = json_object_get(out, "result");
			int64_t ttl = etcd_jint(res, "TTL");
			json_decref(out);
			if (ttl <= 0) {
				gf_log(GF_LOG_WARN, "lock", "msg=\"etcd lease expired\" id=%s lease=%llx", e->id,
				       (unsigned long long)e->lease_id);
				atomic_store(&e->revoked, 1);
				atomic_store(&e->lease_gone, 1);
				notify(e);
				return NULL;
			}
			/* A stale answer after T_fence does not revive a held lock. */
			if (!(atomic_load(&e->state) == E_HELD && fence_passed(e, gf_now_us())))
				note_ok(e, now);
		} else {
			gf_log(GF_LOG_WARN, "lock", "msg=\"etcd keepalive failed\" id=%s detail=\"%s\"", e->id, gf_error_detail());
		}
		next = (rc == 0 ? now + e->ka_ms * 1000 : gf_now_us() + RETRY_US);
		if (rc == 0)
			continue;
		st = atomic_load(&e->state);
		if (st == E_LOST || (st == E_HELD && fence_passed(e, gf_now_us())))
			return give_up(e);
	}
}

/* ---- acquire ---- */

static int grant_lease(struct gf_etcd *e, int64_t deadline, int intr_fd)
{
	json_t *out = NULL;
	int64_t sent = gf_now_us();
	int rc = etcd_call(e, &e->req, "/v3/lease/grant", json_pack("{s:I}", "TTL", (json_int_t)e->ttl_s), deadline,
		      TRY_MAX_MS, intr_fd, &out);
	if (rc < 0)
		return rc;
	int64_t id = etcd_jint(out, "ID"), ttl = etcd_jint(out, "TTL");
	const char *err = json_string_value(json_object_get(out, "error"));
	json_decref(out);
	if (id <= 0 || ttl <= 0)
		return gf_err(GF_ERR_PROTOCOL, "etcd: lease grant refused: %s", err ? err : "no lease in the answer");
	e->lease_id = id;
	e->granted_ttl_ms = ttl * 1000;
	atomic_store(&e->last_ok_us, sent);
	atomic_store(&e->lease_gone, 0);
	atomic_store(&e->revoked, 0);
	snprintf(e->mykey, sizeof(e->mykey), "%s%llx", e->prefix, (unsigned long long)id);
	/* Signals are the application's business: they go to its own threads. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int er = pthread_create(&e->ka, NULL, keepalive_main, e);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (er) {
		revoke_lease(e, 1000);
		return gf_err_errno(GF_ERR_IO, er, "etcd: pthread_create");
	}
	e->ka_running = true;
	return 0;
}

/*
 * One keepalive from the acquiring thread, on its own handle: 0 (last_ok_us
 * moved to its send time), GF_ERR_NOT_FOUND when the lease is gone, or the
 * call's error. A waiter whose keepalives failed for a while (a member
 * restart) can reach the head of the line before its keepalive thread's next
 * try; this confirms the lease now instead of turning the grant down.
 */
static int renew_now(struct gf_etcd *e, int64_t deadline, int intr_fd)
{
	char b[24];
	json_t *out = NULL;
	int64_t sent = gf_now_us();
	int rc = etcd_call(e, &e->req, "/v3/lease/keepalive", json_pack("{s:s}", "ID", i64s(e->lease_id, b)), deadline,
		      TRY_MAX_MS, intr_fd, &out);
	if (rc < 0)
		return rc;
	int64_t ttl = etcd_jint(json_object_get(out, "result"), "TTL");
	json_decref(out);
	if (ttl <= 0) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"etcd lease expired\" id=%s lease=%llx", e->id,
		       (unsigned long long)e->lease_id);
		atomic_store(&e->revoked, 1);
		return GF_ERR_NOT_FOUND;
	}
	note_ok(e, sent);
	return 0;
}

/* Create our key unless it exists; its create revision is our place in line. */
static int put_key(struct gf_etcd *e, int64_t deadline, int intr_fd)
{
	char b[24];
	json_t *k = jkey(e->mykey);
	char *v = b64enc(e->id, strlen(e->id));
	json_t *body = json_pack("{s:[{s:s,s:O,s:s}],s:[{s:{s:O,s:s,s:s}}],s:[{s:{s:o}}]}", "compare", "target", "CREATE",
				 "key", k, "create_revision", "0", "success", "request_put", "key", k, "value", v ? v : "",
				 "lease", i64s(e->lease_id, b), "failure", "request_range", "key", k);
	free(v);
	if (!body) {
		json_decref(k);
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	}
	json_t *out = NULL;
	int rc = etcd_call(e, &e->req, "/v3/kv/txn", body, deadline, TRY_MAX_MS, intr_fd, &out);
	if (rc < 0)
		return rc;
	int64_t rev = -1;
	if (json_is_true(json_object_get(out, "succeeded"))) {
		rev = etcd_jint(json_object_get(out, "header"), "revision");
	} else {
		json_t *r = json_object_get(json_array_get(json_object_get(out, "responses"), 0), "response_range");
		json_t *kv = json_array_get(json_object_get(r, "kvs"), 0);
		if (etcd_jint(kv, "lease") == e->lease_id)
			rev = etcd_jint(kv, "create_revision");
	}
	json_decref(out);
	if (rev <= 0)
		return gf_err(GF_ERR_PROTOCOL, "etcd: could not create the waiter key %s", e->mykey);
	e->myrev = rev;
	return 0;
}

/* Keys fetched per page when looking for the nearest older key of this lock. */
#define PRED_PAGE 64

/*
 * A key of this lock itself: the prefix and one more path element (a lease id
 * here, etcdctl lock's too). A lock named "x/sub" keeps its keys under
 * "x/sub/", inside the range of "x/": those are another lock's, not waiters
 * of this one.
 */
static bool own_key(const struct gf_etcd *e, const char *kb64, char *key, size_t cap)
{
	size_t pl = strlen(e->prefix);
	return kb64 && b64dec(kb64, key, cap) > 0 && !strncmp(key, e->prefix, pl) && key[pl] && !strchr(key + pl, '/');
}

/*
 * The first key of this lock in @kvs from index @from (newest first): 1 and
 * *@pred (malloc'd base64 key), or 0 with *@oldest the lowest create revision
 * seen (where the next page starts). A key without a lease never goes away by
 * itself: any etcd writer can plant one, and it would hold the lock for good,
 * so it is reported (once per key) while waiting on it as on any other.
 */
static int pick_older(struct gf_etcd *e, json_t *kvs, size_t from, char **pred, int64_t *oldest)
{
	char key[700];
	for (size_t i = from; i < json_array_size(kvs); i++) {
		json_t *kv = json_array_get(kvs, i);
		const char *kb = json_string_value(json_object_get(kv, "key"));
		*oldest = etcd_jint(kv, "create_revision");
		if (!own_key(e, kb, key, sizeof(key)))
			continue;
		if (etcd_jint(kv, "lease") <= 0 && strcmp(e->warned_key, key)) {
			gf_log(GF_LOG_ERR, "lock",
			       "msg=\"etcd: a key without a lease is in this lock's line; it holds the lock until someone deletes it\" id=%s key=%s create_revision=%lld fix=\"etcdctl del %s\"",
			       e->id, key, (long long)*oldest, key);
			snprintf(e->warned_key, sizeof(e->warned_key), "%s", key);
		}
		*pred = strdup(kb);
		return *pred ? 1 : gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	}
	return 0;
}

/*
 * Pages on through keys created before @below (another lock's keys nested
 * in our prefix came first): like pick_older(), with *@rev the revision read
 * at. @serializable: any member's view will do (see predecessor_after()).
 */
static int older_pages(struct gf_etcd *e, int64_t below, bool serializable, int64_t deadline, int intr_fd,
		       char **pred, int64_t *rev)
{
	char *end = prefix_end(e->prefix);
	if (!end)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	int rc = 0;
	while (below > 1 && rc == 0) {
		char b[24];
		json_t *out = NULL, *body = json_pack("{s:o,s:o,s:s,s:s,s:s,s:s,s:b,s:b}", "key", jkey(e->prefix),
						       "range_end", jkey(end), "sort_order", "DESCEND", "sort_target",
						       "CREATE", "limit", "64", "max_create_revision", i64s(below - 1, b),
						       "serializable", serializable, "keys_only", 1);
		if (!body) {
			rc = gf_err(GF_ERR_NOMEM, "etcd: out of memory");
			break;
		}
		rc = etcd_call(e, &e->req, "/v3/kv/range", body, deadline, TRY_MAX_MS, intr_fd, &out);
		if (rc < 0)
			break;
		json_t *kvs = json_object_get(out, "kvs");
		int64_t r = etcd_jint(json_object_get(out, "header"), "revision");
		if (r < *rev)
			*rev = r; /* the older view of the two decides where a watch starts */
		int64_t oldest = 0;
		rc = pick_older(e, kvs, 0, pred, &oldest);
		if (rc == 0 && !json_is_true(json_object_get(out, "more")))
			below = 0;
		else
			below = oldest;
		json_decref(out);
	}
	free(end);
	return rc;
}

/*
 * Our key still there and the nearest key created before it: 1 and *pred
 * (malloc'd) with *rev the revision it was seen at; 0 when none (granted);
 * GF_ERR_NOT_FOUND when our key is gone (lease expired).
 */
static int predecessor(struct gf_etcd *e, int64_t deadline, int intr_fd, char **pred, int64_t *rev)
{
	char b[24];
	char *end = prefix_end(e->prefix);
	json_t *k = jkey(e->mykey), *pk = jkey(e->prefix), *pe = end ? jkey(end) : NULL;
	free(end);
	json_t *body = json_pack("{s:[{s:s,s:o,s:s}],s:[{s:{s:o,s:o,s:s,s:s,s:s,s:s,s:b}}]}", "compare", "target",
				 "CREATE", "key", k, "create_revision", i64s(e->myrev, b), "success", "request_range", "key", pk,
				 "range_end", pe, "sort_order", "DESCEND", "sort_target", "CREATE", "limit", "64",
				 "max_create_revision", i64s(e->myrev - 1, (char[24]){ 0 }), "keys_only", 1);
	if (!body)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	json_t *out = NULL;
	int rc = etcd_call(e, &e->req, "/v3/kv/txn", body, deadline, TRY_MAX_MS, intr_fd, &out);
	if (rc < 0)
		return rc;
	if (!json_is_true(json_object_get(out, "succeeded"))) {
		json_decref(out);
		return GF_ERR_NOT_FOUND;
	}
	*rev = etcd_jint(json_object_get(out, "header"), "revision");
	json_t *r = json_object_get(json_array_get(json_object_get(out, "responses"), 0), "response_range");
	int64_t oldest = 0;
	rc = pick_older(e, json_object_get(r, "kvs"), 0, pred, &oldest);
	bool more = json_is_true(json_object_get(r, "more"));
	json_decref(out);
	return rc == 0 && more ? older_pages(e, oldest, false, deadline, intr_fd, pred, rev) : rc;
}

/*
 * After a delete seen at revision @min_rev: the same question as
 * predecessor(), answered by one serializable range on any member that has
 * applied @min_rev. That is enough: no key can get a create revision below
 * ours later, so "none older than ours" at any revision >= @min_rev stays
 * true. Returns like predecessor(), or 2 when the member is behind.
 */
static int predecessor_after(struct gf_etcd *e, int64_t min_rev, int64_t deadline, int intr_fd, char **pred,
			     int64_t *rev)
{
	char b[24];
	char *end = prefix_end(e->prefix);
	json_t *body = json_pack("{s:o,s:o,s:s,s:s,s:s,s:s,s:b}", "key", jkey(e->prefix), "range_end", end ? jkey(end) : NULL,
				 "sort_order", "DESCEND", "sort_target", "CREATE", "limit", "65", "max_create_revision",
				 i64s(e->myrev, b), "serializable", 1);
	free(end);
	if (!body)
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	json_t *out = NULL;
	int rc = etcd_call(e, &e->req, "/v3/kv/range", body, deadline, TRY_MAX_MS, intr_fd, &out);
	if (rc < 0)
		return rc;
	*rev = etcd_jint(json_object_get(out, "header"), "revision");
	json_t *kvs = json_object_get(out, "kvs");
	json_t *mine = json_array_get(kvs, 0);
	int64_t oldest = e->myrev;
	bool more = false;
	if (*rev < min_rev)
		rc = 2;
	else if (etcd_jint(mine, "create_revision") != e->myrev)
		rc = GF_ERR_NOT_FOUND;
	else {
		rc = pick_older(e, kvs, 1, pred, &oldest);
		more = json_is_true(json_object_get(out, "more"));
	}
	json_decref(out);
	return rc == 0 && more ? older_pages(e, oldest, true, deadline, intr_fd, pred, rev) : rc;
}

struct watch_ctx {
	char *buf;
	size_t len, cap;
	bool done;
	int64_t del_rev; /* revision of the delete seen, 0 if none */
};

static void watch_line(struct watch_ctx *w, const char *line, size_t n)
{
	json_t *j = json_loadb(line, n, 0, NULL);
	json_t *res = json_object_get(j, "result");
	if (!j || json_object_get(j, "error") || json_is_true(json_object_get(res, "canceled")) ||
	    etcd_jint(res, "compact_revision") > 0)
		w->done = true; /* re-check by range */
	json_t *ev;
	size_t i;
	json_array_foreach(json_object_get(res, "events"), i, ev) {
		const char *t = json_string_value(json_object_get(ev, "type"));
		if (t && !strcmp(t, "DELETE")) {
			w->done = true;
			w->del_rev = etcd_jint(json_object_get(ev, "kv"), "mod_revision");
		}
	}
	json_decref(j);
}

static size_t on_watch(char *p, size_t sz, size_t n, void *ud)
{
	struct watch_ctx *w = ud;
	size_t len = sz * n;
	if (w->len + len + 1 > MAX_RESP)
		return 0;
	if (w->len + len + 1 > w->cap) {
		size_t cap = w->cap ? w->cap : 4096;
		while (cap < w->len + len + 1)
			cap *= 2;
		char *b = realloc(w->buf, cap);
		if (!b)
			return 0;
		w->buf = b;
		w->cap = cap;
	}
	memcpy(w->buf + w->len, p, len);
	w->len += len;
	char *nl;
	while ((nl = memchr(w->buf, '\n', w->len))) {
		size_t ln = (size_t)(nl - w->buf);
		if (ln)
			watch_line(w, w->buf, ln);
		memmove(w->buf, nl + 1, w->len - ln - 1);
		w->len -= ln + 1;
	}
	return len;
}

/*
 * Watch @pred_b64 from @from_rev until it is deleted, the stream ends, or
 * @until. 0 in all those cases (the caller re-checks), GF_ERR_INTERRUPTED.
 * A stream that ends at once (member down) costs a short pause, not a spin.
 */
static int watch_delete(struct gf_etcd *e, const char *pred_b64, int64_t from_rev, int64_t until, int intr_fd,
			int64_t *del_rev)
{
	char b[24];
	json_t *body = json_pack("{s:{s:s,s:s}}", "create_request", "key", pred_b64, "start_revision", i64s(from_rev, b));
	char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	struct curl_slist *hdrs = text ? etcd_headers(e) : NULL;
	if (!hdrs) {
		free(text);
		return gf_err(GF_ERR_NOMEM, "etcd: out of memory");
	}
	char url[400];
	snprintf(url, sizeof(url), "%s/v3/watch", e->ep[atomic_load(&e->cur)]);
	struct watch_ctx w = { 0 };
	int64_t t0 = gf_now_us();
	etcd_setup_handle(e, e->wc.h, url, hdrs, 0);
	curl_easy_setopt(e->wc.h, CURLOPT_POSTFIELDS, text);
	curl_easy_setopt(e->wc.h, CURLOPT_WRITEFUNCTION, on_watch);
	curl_easy_setopt(e->wc.h, CURLOPT_WRITEDATA, &w);
	curl_multi_add_handle(e->wc.m, e->wc.h);
	int rc = 0;
	for (;;) {
		int running = 0;
		curl_multi_perform(e->wc.m, &running);
		if (w.done || !running)
			break;
		int to = gf_poll_timeout_ms(until);
		if (to == 0)
			break;
		struct curl_waitfd wf = { .fd = intr_fd, .events = CURL_WAIT_POLLIN };
		curl_multi_poll(e->wc.m, &wf, 1, to < 0 || to > 1000 ? 1000 : to, NULL);
		struct pollfd p = { .fd = intr_fd, .events = POLLIN };
		if (poll(&p, 1, 0) > 0) {
			rc = gf_err(GF_ERR_INTERRUPTED, "etcd: interrupted");
			break;
		}
	}
	curl_multi_remove_handle(e->wc.m, e->wc.h);
	if (rc == 0 && !w.done && gf_now_us() - t0 < RETRY_US) {
		struct pollfd p = { .fd = intr_fd, .events = POLLIN };
		if (poll(&p, 1, (int)(RETRY_US / 1000)) > 0)
			rc = gf_err(GF_ERR_INTERRUPTED, "etcd: interrupted");
	}
	curl_slist_free_all(hdrs);
	free(text);
	free(w.buf);
	*del_rev = w.del_rev;
	return rc;
}

/* Our key, as etcd sees it now: 1 (still ours, *@rev the revision read at), 0 (gone), or an error. */
static int key_present(struct gf_etcd *e, int64_t deadline, int64_t *rev)
{
	json_t *out = NULL;
	int rc = etcd_call(e, &e->kwc, "/v3/kv/range", json_pack("{s:o}", "key", jkey(e->mykey)), deadline, TRY_MAX_MS,
		      e->ka_stop_fd, &out);
	if (rc < 0)
		return rc;
	*rev = etcd_jint(json_object_get(out, "header"), "revision");
	json_t *kv = json_array_get(json_object_get(out, "kvs"), 0);
	rc = kv && etcd_jint(kv, "create_revision") == e->myrev;
	json_decref(out);
	return rc;
}

/*
 * The holder's own key, watched from its creation on: anyone with write
 * access deleting it (etcdctl del, or revoking the lease, which deletes it
 * too) lets the next waiter in at once, so the loss is reported at once, not
 * at the next keepalive. Between watch chunks, and whenever the stream ends
 * (member down, compaction), one range confirms the key is still ours.
 */
static void *keywatch_main(void *arg)
{
	struct gf_etcd *e = arg;
	char *kb = b64enc(e->mykey, strlen(e->mykey));
	int64_t from = e->myrev + 1;
	for (; kb;) {
		int64_t del = 0, rev = 0;
		int rc = watch_delete(e, kb, from, gf_now_us() + WATCH_CHUNK_US, e->ka_stop_fd, &del);
		if (rc == GF_ERR_INTERRUPTED)
			break;
		if (del == 0) {
			rc = key_present(e, gf_now_us() + e->fence_ms * 1000, &rev);
			if (rc == GF_ERR_INTERRUPTED)
				break;
			if (rc != 0) {
				/* Still ours, or not known: the keepalive's T_fence decides then. */
				if (rc == 1)
					from = rev + 1;
				continue;
			}
		}
		gf_log(GF_LOG_ERR, "lock", "msg=\"etcd: the holder's key was deleted\" id=%s key=%s epoch=%lld", e->id,
		       e->mykey, (long long)e->myrev);
		atomic_store(&e->key_gone, 1);
		atomic_store(&e->lease_gone, 1);
		notify(e);
		break;
	}
	free(kb);
	return NULL;
}

static void end_session(struct gf_etcd *e)
{
	stop_keepalive(e);
	revoke_lease(e, 1000);
	atomic_store(&e->state, E_IDLE);
}

/* First in line: check the lease still outlives T_fence, start watching
 * our own key, and hand out the grant. */
static int begin_hold(struct gf_etcd *e, struct gf_lock_grant *grant)
{
	if (fence_passed(e, gf_now_us())) {
		/* Granted on paper, but the lease is not known to outlive T_fence. */
		end_session(e);
		e->myrev = 0;
		return gf_err(GF_ERR_UNREACHABLE, "lock %s: granted but no keepalive answered within T_fence", e->id);
	}
	atomic_store(&e->key_gone, 0);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int er = pthread_create(&e->kw, NULL, keywatch_main, e);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (er) {
		end_session(e);
		e->myrev = 0;
		return gf_err_errno(GF_ERR_IO, er, "lock %s: pthread_create for the key watch", e->id);
	}
	e->kw_running = true;
	atomic_store(&e->epoch, (uint64_t)e->myrev);
	atomic_store(&e->state, E_HELD);
	if (grant) {
		memset(grant, 0, sizeof(*grant));
		grant->epoch = (uint64_t)e->myrev;
		for (int i = 0; i < 8; i++)
			grant->session_token[i] = (uint8_t)((uint64_t)e->lease_id >> (8 * i));
		grant->granted_at_us = gf_wall_us();
	}
	gf_log(GF_LOG_INFO, "lock", "msg=\"granted\" backend=etcd id=%s epoch=%lld key=%s ttl_ms=%lld fence_ms=%lld", e->id,
	       (long long)e->myrev, e->mykey, (long long)e->granted_ttl_ms, (long long)e->fence_ms);
	return 0;
}

int gf_etcd_acquire(struct gf_etcd *e, int64_t timeout_ms, struct gf_lock_grant *grant, int intr_fd)
{
	int st = atomic_load(&e->state);
	if (st == E_HELD)
		return gf_err(GF_ERR_STATE, "lock %s: already held", e->id);
	if (st == E_WAITING)
		return gf_err(GF_ERR_STATE, "lock %s: an acquire is already in progress", e->id);
	if (st == E_LOST)
		end_session(e);
	atomic_store(&e->state, E_WAITING);
	if (!e->warned_fence && e->fence_ms < GF_ETCD_FENCE_PER_ELECTION * ETCD_DEFAULT_ELECTION_MS) {
		/* etcd does not tell its clients its election timeout: check against
		 * its default, once. */
		gf_log(GF_LOG_WARN, "lock",
		       "msg=\"T_fence is below %d x etcd's default election timeout (%d ms): a leader change can lose the lock unless the cluster's --election-timeout is at most T_fence/%d (docs/lock.md, lease arithmetic)\" id=%s fence_ms=%lld max_election_timeout_ms=%lld",
		       GF_ETCD_FENCE_PER_ELECTION, ETCD_DEFAULT_ELECTION_MS, GF_ETCD_FENCE_PER_ELECTION, e->id,
		       (long long)e->fence_ms, (long long)(e->fence_ms / GF_ETCD_FENCE_PER_ELECTION));
		e->warned_fence = true;
	}
	uint64_t v;
	while (read(e->notify_fd, &v, sizeof(v)) > 0)
		;
	/* 0: try once: queue, look, and leave at once when someone holds it. */
	const bool once = timeout_ms == 0;
	const int64_t deadline = once ? gf_now_us() + ONCE_US : gf_deadline_from_ms(timeout_ms);
	int64_t reach_by = gf_now_us() + e->reconnect_ms * 1000;
	int rc;
	char *pred = NULL;
	int64_t del_rev = 0;
	for (;;) {
		struct pollfd p = { .fd = intr_fd, .events = POLLIN };
		if (poll(&p, 1, 0) > 0 && read(intr_fd, &v, sizeof(v)) == sizeof(v)) {
			rc = gf_err(GF_ERR_INTERRUPTED, "lock %s: acquire interrupted", e->id);
			break;
		}
		int64_t d = deadline < reach_by ? deadline : reach_by;
		if (gf_now_us() >= deadline) {
			rc = gf_err(GF_ERR_TIMEOUT, "lock %s: not granted within %lldms", e->id, (long long)timeout_ms);
			break;
		}
		if (e->lease_id && atomic_load(&e->lease_gone)) {
			/* Our lease ran out while waiting (etcd unreachable for a
			 * TTL): start over at the back of the line. */
			gf_log(GF_LOG_WARN, "lock", "msg=\"etcd lease lost while waiting; queueing again\" id=%s", e->id);
			stop_keepalive(e);
			e->lease_id = 0;
			e->myrev = 0;
		}
		if (!e->lease_id)
			rc = grant_lease(e, d, intr_fd);
		else if (!e->myrev)
			rc = put_key(e, d, intr_fd);
		else {
			int64_t rev = 0;
			free(pred);
			pred = NULL;
			rc = 2;
			if (del_rev > 0)
				rc = predecessor_after(e, del_rev, d, intr_fd, &pred, &rev);
			del_rev = 0;
			if (rc == 2)
				rc = predecessor(e, d, intr_fd, &pred, &rev);
			/* First in line. A lease last confirmed more than half of
			 * T_fence ago is confirmed again before the grant: a holder
			 * must start with its fence ahead of it, and a waiter whose
			 * keepalives failed (etcd restarting) is still in line. */
			if (rc == 0 && gf_now_us() - atomic_load(&e->last_ok_us) >= e->fence_ms * 500)
				rc = renew_now(e, d, intr_fd);
			if (rc == 0)
				break;
			if (rc == GF_ERR_NOT_FOUND) {
				atomic_store(&e->lease_gone, 1);
				continue;
			}
			if (rc == 1 && once) {
				rc = gf_err(GF_ERR_TIMEOUT, "lock %s: held by another (single try)", e->id);
				break;
			}
			if (rc == 1) {
				int64_t until = gf_now_us() + WATCH_CHUNK_US;
				rc = watch_delete(e, pred, rev + 1, until < deadline ? until : deadline, intr_fd, &del_rev);
				if (rc == 0)
					reach_by = gf_now_us() + e->reconnect_ms * 1000;
			}
		}
		if (rc == 0) {
			reach_by = gf_now_us() + e->reconnect_ms * 1000;
			continue;
		}
		if (rc == GF_ERR_UNREACHABLE && gf_now_us() < d)
			continue;
		if (rc == GF_ERR_UNREACHABLE && gf_now_us() >= deadline)
			rc = gf_err(GF_ERR_TIMEOUT, "lock %s: not granted within %lldms (%s)", e->id, (long long)timeout_ms,
				    gf_error_detail());
		break;
	}
	free(pred);
	if (rc == GF_ERR_INTERRUPTED) {
		/* Consumed here, not left to interrupt the next acquire. */
		while (read(intr_fd, &v, sizeof(v)) > 0)
			;
	}
	if (rc < 0) {
		char keep[512];
		snprintf(keep, sizeof(keep), "%s", gf_error_detail());
		end_session(e);
		e->myrev = 0;
		return gf_err(rc, "%s", keep);
	}
	return begin_hold(e, grant);
}

int gf_etcd_release(struct gf_etcd *e)
{
	int st = atomic_load(&e->state);
	if (st == E_IDLE || st == E_WAITING)
		return gf_err(GF_ERR_STATE, "lock %s: not held", e->id);
	end_session(e);
	e->myrev = 0;
	return st == E_HELD ? 0 : gf_err(GF_ERR_STATE, "lock %s: lost before the release", e->id);
}

int gf_etcd_is_held(const struct gf_etcd *e)
{
	return atomic_load(&e->state) == E_HELD && !atomic_load(&e->lease_gone) && !fence_passed(e, gf_now_us());
}

uint64_t gf_etcd_epoch(const struct gf_etcd *e)
{
	return atomic_load(&e->epoch);
}

int gf_etcd_get_fd(const struct gf_etcd *e)
{
	return atomic_load(&e->state) == E_HELD ? e->notify_fd : -1;
}

int gf_etcd_get_timeout_ms(const struct gf_etcd *e)
{
	if (atomic_load(&e->state) != E_HELD)
		return -1;
	int64_t left = atomic_load(&e->last_ok_us) + e->fence_ms * 1000 - gf_now_us();
	return left <= 0 ? 0 : (int)((left + 999) / 1000);
}

int gf_etcd_process(struct gf_etcd *e, bool *newly, char *detail, size_t dlen)
{
	*newly = false;
	int st = atomic_load(&e->state);
	if (st == E_LOST)
		return gf_err(GF_ERR_LOCK_LOST, "lock %s: lost", e->id);
	if (st != E_HELD)
		return 0;
	uint64_t v;
	while (read(e->notify_fd, &v, sizeof(v)) > 0)
		;
	bool gone = atomic_load(&e->lease_gone);
	if (!gone && !fence_passed(e, gf_now_us()))
		return 0;
	atomic_store(&e->state, E_LOST);
	*newly = true;
	const char *why = atomic_load(&e->key_gone)		   ? "its key was deleted (etcdctl del, or the lease revoked)"
			  : gone && !fence_passed(e, gf_now_us()) ? "the etcd lease expired"
								 : "no keepalive answered by an etcd quorum for T_fence";
	snprintf(detail, dlen, "lock %s epoch %lld lost: %s", e->id, (long long)e->myrev, why);
	gf_log(GF_LOG_ERR, "lock", "msg=\"lock lost\" backend=etcd id=%s epoch=%lld reason=\"%s\" fence_ms=%lld", e->id,
	       (long long)e->myrev, why, (long long)e->fence_ms);
	return gf_err(GF_ERR_LOCK_LOST, "%s", detail);
}

void gf_etcd_forked(struct gf_etcd *e)
{
	e->forked = true;
	e->ka_running = e->kw_running = false;
	e->lease_id = 0;
	atomic_store(&e->state, E_IDLE);
	pthread_mutex_init(&e->mu, NULL);
}

/* ---- one-shot queries ---- */

int gf_etcd_ping(const char *uri, const void *pw, size_t pw_len, int64_t timeout_ms)
{
	struct gf_etcd *e;
	int rc = gf_etcd_new(&e, uri, "gfctl");
	if (rc < 0)
		return rc;
	if (pw && pw_len && (rc = gf_etcd_set_password(e, pw, pw_len)) < 0)
		goto out;
	json_t *o = NULL;
	/* A linearizable read needs a quorum: what the lock needs too. */
	json_t *body = json_pack("{s:o,s:s}", "key", jkey(e->prefix), "limit", "1");
	rc = etcd_call(e, &e->req, "/v3/kv/range", body, gf_deadline_from_ms(timeout_ms), TRY_MAX_MS, -1, &o);
	json_decref(o);
out:
	gf_etcd_free(e);
	return rc;
}

int gf_etcd_status(const char *uri, const void *pw, size_t pw_len, int64_t timeout_ms, struct gf_etcd_status *out)
{
	struct gf_etcd *e;
	int rc = gf_etcd_new(&e, uri, "gfctl");
	if (rc < 0)
		return rc;
	json_t *o = NULL;
	char *end = NULL;
	if (pw && pw_len && (rc = gf_etcd_set_password(e, pw, pw_len)) < 0)
		goto out;
	end = prefix_end(e->prefix);
	json_t *body = json_pack("{s:o,s:o,s:s,s:s}", "key", jkey(e->prefix), "range_end", jkey(end), "sort_order",
				 "ASCEND", "sort_target", "CREATE");
	rc = etcd_call(e, &e->req, "/v3/kv/range", body, gf_deadline_from_ms(timeout_ms), TRY_MAX_MS, -1, &o);
	if (rc < 0)
		goto out;
	memset(out, 0, sizeof(*out));
	snprintf(out->prefix, sizeof(out->prefix), "%s", e->prefix);
	json_t *kvs = json_object_get(o, "kvs"), *kv;
	size_t i, n = 0;
	json_array_foreach(kvs, i, kv) {
		char idb[GF_LOCK_ID_MAX * 2] = "", keyb[GF_ETCD_KEY_MAX] = "";
		const char *vb = json_string_value(json_object_get(kv, "value"));
		const char *kb = json_string_value(json_object_get(kv, "key"));
		if (!vb || b64dec(vb, idb, sizeof(idb)) < 0)
			idb[0] = 0;
		if (!own_key(e, kb, keyb, sizeof(keyb)))
			continue; /* a nested lock's ("name/sub") */
		int64_t rev = etcd_jint(kv, "create_revision");
		if (n++ == 0) {
			out->has_holder = true;
			snprintf(out->holder.id, sizeof(out->holder.id), "%s", idb[0] ? idb : keyb);
			snprintf(out->holder.key, sizeof(out->holder.key), "%s", keyb);
			out->holder.create_revision = rev;
		} else if (n <= GF_ETCD_STATUS_MAX_WAITERS + 1) {
			struct gf_etcd_entry *w = &out->waiters[out->nwaiters++];
			snprintf(w->id, sizeof(w->id), "%s", idb[0] ? idb : keyb);
			snprintf(w->key, sizeof(w->key), "%s", keyb);
			w->create_revision = rev;
		}
	}
	out->waiter_count = n > 0 ? n - 1 : 0;
	out->revision = etcd_jint(json_object_get(o, "header"), "revision");
out:
	free(end);
	json_decref(o);
	gf_etcd_free(e);
	return rc;
}
