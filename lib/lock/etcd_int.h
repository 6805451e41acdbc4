/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The etcd lock's own state, shared by its files: etcd.c (the lock recipe:
 * lease, key, predecessor watch, keepalive) and etcd_http.c (etcd's v3 JSON
 * gateway over libcurl: members, authentication, retries).
 */
#ifndef GF_LOCK_ETCD_INT_H
#define GF_LOCK_ETCD_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>

#include "etcd.h"
#include "lockint.h"

#define MAX_EP 16
#define MAX_RESP (4 << 20)    /* a status range of a busy prefix stays far below */
#define TRY_MAX_MS 1000       /* one request to one member at most */
#define WATCH_CHUNK_US 2000000 /* re-check the predecessor at least this often */
#define RETRY_US 50000        /* pause after every member failed */
#define ONCE_US 2000000       /* an acquire with timeout 0: one try, this long at most */
#define MARGIN_MIN_MS 500
/* The lease rule: T_fence >= this many election timeouts. A leader change
 * stalls keepalives for up to about two election timeouts (the old leader's
 * and the new one's, more when a healed member forces another election, as
 * without pre-vote); 5 leaves the holder's own tries room besides. */
#define GF_ETCD_FENCE_PER_ELECTION 5
/* etcd's default --election-timeout: the one a client cannot ask about. */
#define ETCD_DEFAULT_ELECTION_MS 1000

enum estate { E_IDLE, E_WAITING, E_HELD, E_LOST };

struct hconn {
	CURL *h;
	CURLM *m; /* its own multi handle: curl_easy_perform() would make a hidden one */
	char *buf;
	size_t len, cap;
	bool overflow;
};

struct gf_etcd {
	char id[GF_LOCK_ID_MAX];
	bool tls;
	int n_ep;
	char ep[MAX_EP][280];   /* "http://host:port" */
	char prefix[512];       /* "/prefix/name/" */
	int64_t ttl_s;
	char user[128];
	char *password;
	char cacert[PATH_MAX], cert[PATH_MAX], key[PATH_MAX];

	pthread_mutex_t mu;     /* token */
	char token[512];
	_Atomic int cur;        /* the member that answered last */

	int64_t reconnect_ms, ka_ms, fence_ms;
	struct hconn req, kac, wc, kwc;

	_Atomic int state;
	int64_t lease_id;
	int64_t granted_ttl_ms;
	_Atomic int64_t last_ok_us; /* send time of the last answered keepalive */
	_Atomic int lease_gone;
	_Atomic int revoked;       /* the lease is gone already: no revoke at release */
	_Atomic int key_gone;      /* the holder's key was seen deleted */
	_Atomic uint64_t epoch;
	char mykey[600];
	int64_t myrev;
	char warned_key[700]; /* the last lease-less key reported */
	bool warned_fence;    /* T_fence below the rule (GF_ETCD_FENCE_PER_ELECTION), said once */

	pthread_t ka, kw;
	bool ka_running, kw_running;
	int ka_stop_fd;
	int notify_fd;
	bool forked;
};

/* etcd_http.c: an integer field of an answer (int64 comes as a JSON string; numbers too). -1 when absent. */
int64_t etcd_jint(const json_t *o, const char *k);
/* One curl handle per thread of the lock, and a request to the members. */
int etcd_hconn_init(struct hconn *c);
void etcd_hconn_free(struct hconn *c);
int *etcd_list_fds(size_t *n);
void etcd_cloexec_new_sockets(const int *before, size_t nb);
void etcd_setup_handle(struct gf_etcd *e, CURL *h, const char *url, struct curl_slist *hdrs, int64_t timeout_ms);
struct curl_slist *etcd_headers(struct gf_etcd *e);
/* POST @body (stolen) to @path, the members in turn from the one that answered last, each for at
 * most @try_ms, until @deadline: 0 with *@out, or GF_ERR_UNREACHABLE, _PERMISSION, _PROTOCOL, _INTERRUPTED. */
int etcd_call(struct gf_etcd *e, struct hconn *c, const char *path, json_t *body, int64_t deadline, int64_t try_ms,
		int intr_fd, json_t **out);

#endif
