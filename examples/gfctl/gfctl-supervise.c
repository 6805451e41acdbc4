/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl supervise: what gf-supervise says about its engines (its /status). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "gfctl.h"
#include "gpufailover.h"

struct body {
	char *p;
	size_t n;
};

static size_t collect(char *data, size_t size, size_t n, void *u)
{
	struct body *b = u;
	size_t add = size * n;
	if (b->n + add > (1u << 20))
		return 0; /* a status is small: refuse anything huge */
	char *q = realloc(b->p, b->n + add + 1);
	if (!q)
		return 0;
	memcpy(q + b->n, data, add);
	b->p = q;
	b->n += add;
	b->p[b->n] = '\0';
	return add;
}

static int run_status(int argc, char **argv)
{
	enum { O_URL = 1, O_JSON, O_TIMEOUT };
	static const struct option opts[] = {
		{ "url", required_argument, NULL, O_URL },
		{ "json", no_argument, NULL, O_JSON },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ 0 },
	};
	const char *url = NULL;
	int json = 0, opt;
	int64_t timeout_ms = 5000;
	optind = 1;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, GFCTL_OPTSTRING, opts, NULL)) != -1) {
		switch (opt) {
		case O_URL: url = optarg; break;
		case O_JSON: json = 1; break;
		case O_TIMEOUT:
			if (gfctl_duration("supervise", "--timeout", optarg, &timeout_ms) < 0)
				return GFCTL_EXIT_USAGE;
			break;
		default:
			gfctl_bad_option("supervise", argv, opt, opts);
			return GFCTL_EXIT_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "gfctl supervise status: unexpected argument '%s'\n", argv[optind]);
		return GFCTL_EXIT_USAGE;
	}
	if (!url || strncmp(url, "http://", 7) != 0) {
		fprintf(stderr, "gfctl supervise status: --url http://ADDR:PORT (gf-supervise --http) is required\n");
		return GFCTL_EXIT_USAGE;
	}
	char full[512];
	size_t ul = strlen(url);
	while (ul > 7 && url[ul - 1] == '/')
		ul--;
	snprintf(full, sizeof(full), "%.*s/status", (int)ul, url);
	struct body b = { 0 };
	long code = 0;
	CURL *h = curl_easy_init();
	if (!h) {
		fprintf(stderr, "gfctl supervise status: libcurl init failed\n");
		return GFCTL_EXIT_FAILURE;
	}
	curl_easy_setopt(h, CURLOPT_URL, full);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
	curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	CURLcode cr = curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
	curl_easy_cleanup(h);
	if (cr != CURLE_OK || code != 200) {
		fprintf(stderr, "gfctl supervise status: %s: %s\n", full,
			cr != CURLE_OK ? curl_easy_strerror(cr) : "unexpected HTTP status");
		free(b.p);
		return cr == CURLE_OPERATION_TIMEDOUT ? GFCTL_EXIT_TIMEOUT : GFCTL_EXIT_UNREACHABLE;
	}
	json_error_t jerr;
	json_t *root = json_loads(b.p, 0, &jerr);
	json_t *engines = root ? json_object_get(root, "engines") : NULL;
	if (!json_is_array(engines)) {
		fprintf(stderr, "gfctl supervise status: %s: not a gf-supervise status\n", full);
		json_decref(root);
		free(b.p);
		return GFCTL_EXIT_FAILURE;
	}
	if (json) {
		printf("%s\n", b.p);
	} else {
		printf("%-16s %-12s %8s %9s %8s %-22s %s\n", "ENGINE", "STATE", "PID", "RETRIES", "RESTARTS", "LAST EXIT",
		       "REASON");
		size_t i;
		json_t *e;
		json_array_foreach(engines, i, e) {
			char last[32];
			int st = (int)json_integer_value(json_object_get(e, "last_exit_status"));
			int sig = (int)json_integer_value(json_object_get(e, "last_exit_signal"));
			const char *cls = json_string_value(json_object_get(e, "last_exit_class"));
			if (sig > 0)
				snprintf(last, sizeof(last), "signal %d (%s)", sig, cls ? cls : "?");
			else if (st >= 0)
				snprintf(last, sizeof(last), "status %d (%s)", st, cls ? cls : "?");
			else
				snprintf(last, sizeof(last), "-");
			printf("%-16s %-12s %8lld %5lld/%-3lld %8lld %-22s %s\n",
			       json_string_value(json_object_get(e, "name")),
			       json_string_value(json_object_get(e, "state")),
			       (long long)json_integer_value(json_object_get(e, "pid")),
			       (long long)json_integer_value(json_object_get(e, "retries")),
			       (long long)json_integer_value(json_object_get(e, "retry_limit")),
			       (long long)json_integer_value(json_object_get(e, "restarts")), last,
			       json_string_value(json_object_get(e, "reason")));
		}
	}
	json_decref(root);
	free(b.p);
	return GFCTL_OK;
}

static const struct gfctl_cmd supervise_cmds[] = {
	{ "status", "--url http://ADDR:PORT [--json] [--timeout DUR]",
	  "Show each supervised engine: state, pid, retries used, restarts, last exit and why.",
	  "Reads gf-supervise's /status (started with --http ADDR:PORT).",
	  "  --url URL              gf-supervise's HTTP address, e.g. http://127.0.0.1:7462\n"
	  "  --json                 the status as one JSON object\n"
	  "  --timeout DUR          how long to wait for the answer (default 5s)\n",
	  ", 3 timeout, 5 unreachable", run_status },
	{ 0 },
};

const struct gfctl_group gfctl_supervise_group = {
	"supervise", "The supervisor (gf-supervise): its engines and their restart state.", supervise_cmds,
};
