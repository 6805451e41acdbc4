/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl gms status | ping | wait-committed | snapshot | restore | tiers: GMS status, probes and residency tiers. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gfctl.h"
#include "gpufailover.h"

static void gms_usage(FILE *f)
{
	fputs("usage: gfctl gms status --gms URI [--json] [--timeout DURATION]\n"
	      "       gfctl gms ping --gms URI [--timeout DURATION]\n"
	      "       gfctl gms wait-committed --gms URI [--timeout DURATION]\n"
	      "       gfctl gms snapshot --gms URI [--dir DIR] [--timeout DURATION]\n"
	      "       gfctl gms restore --gms URI [--dir DIR] [--timeout DURATION]\n"
	      "       gfctl gms tiers --gms URI [--json] [--timeout DURATION]\n",
	      f);
}

static int err_exit(const char *what, int rc)
{
	fprintf(stderr, "gfctl gms %s: %s (%s)\n", what, gf_strerror(rc), gf_error_detail());
	return gfctl_exit_code(rc);
}

/* Human form of the status JSON: the library already did the parsing. */
static void print_human(const char *json)
{
	/* One key per line is what operators grep; keep the JSON's field names. */
	const char *p = json;
	int depth = 0;
	bool in_str = false;
	for (; *p; p++) {
		char ch = *p;
		if (ch == '"' && (p == json || p[-1] != '\\'))
			in_str = !in_str;
		if (!in_str && (ch == '{' || ch == '[')) {
			depth++;
			if (depth > 1)
				putchar(ch);
			continue;
		}
		if (!in_str && (ch == '}' || ch == ']')) {
			depth--;
			if (depth >= 1)
				putchar(ch);
			continue;
		}
		if (!in_str && ch == ',' && depth == 1) {
			putchar('\n');
			continue;
		}
		if (!in_str && ch == ',' && depth > 1) {
			fputs(",\n  ", stdout);
			continue;
		}
		if (ch == '"')
			continue;
		if (!in_str && ch == ':' && depth == 1) {
			fputs(": ", stdout);
			continue;
		}
		putchar(ch);
	}
	putchar('\n');
}

/* The tiers and the last operation from the status, one line each (same names as the status JSON). */
static int print_tiers(const char *uri, int64_t timeout_ms, bool json)
{
	char *text;
	int rc = gf_gms_status_json(uri, timeout_ms, &text);
	if (rc < 0)
		return err_exit("tiers", rc);
	json_t *st = json_loads(text, 0, NULL);
	free(text);
	json_t *tiers = json_object_get(st, "tiers"), *op = json_object_get(st, "operation");
	if (!st || !json_is_object(tiers)) {
		json_decref(st);
		fprintf(stderr, "gfctl gms tiers: the GMS reports no tiers (an older gf-gmsd?)\n");
		return GFCTL_EXIT_FAILURE;
	}
	if (json) {
		json_t *o = json_pack("{s:O, s:O, s:O, s:O}", "state", json_object_get(st, "state"), "generation",
				      json_object_get(st, "generation"), "tiers", tiers, "operation", op ? op : json_null());
		char *out = o ? json_dumps(o, JSON_COMPACT) : NULL;
		if (out)
			puts(out);
		free(out);
		json_decref(o);
		json_decref(st);
		return GFCTL_OK;
	}
	printf("hot: state=%s generation=%lld\n", json_string_value(json_object_get(st, "state")),
	       (long long)json_integer_value(json_object_get(st, "generation")));
	const char *names[] = { "warm", "cold" };
	for (size_t i = 0; i < 2; i++) {
		json_t *t = json_object_get(tiers, names[i]);
		if (!t) {
			printf("%s: not kept\n", names[i]);
			continue;
		}
		printf("%s: dir=%s present=%s bytes=%lld generation=%lld age_seconds=%.1f%s%s%s\n", names[i],
		       json_string_value(json_object_get(t, "dir")), json_is_true(json_object_get(t, "present")) ? "yes" : "no",
		       (long long)json_integer_value(json_object_get(t, "bytes")),
		       (long long)json_integer_value(json_object_get(t, "generation")),
		       json_real_value(json_object_get(t, "age_seconds")),
		       *json_string_value(json_object_get(t, "error")) ? " error=\"" : "",
		       json_string_value(json_object_get(t, "error")),
		       *json_string_value(json_object_get(t, "error")) ? "\"" : "");
	}
	if (json_is_object(op))
		printf("operation: kind=%s phase=%s bytes=%lld seconds=%.3f reason=\"%s\"\n",
		       json_string_value(json_object_get(op, "kind")), json_string_value(json_object_get(op, "phase")),
		       (long long)json_integer_value(json_object_get(op, "bytes")),
		       json_real_value(json_object_get(op, "seconds")), json_string_value(json_object_get(op, "reason")));
	else
		printf("operation: none\n");
	json_decref(st);
	return GFCTL_OK;
}

int gfctl_gms(int argc, char **argv)
{
	static const struct option opts[] = {
		{"gms", required_argument, NULL, 'g'},   {"json", no_argument, NULL, 'j'},
		{"timeout", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
		{"dir", required_argument, NULL, 'd'},
		{NULL, 0, NULL, 0},
	};
	if (argc < 2) {
		gms_usage(stderr);
		return GFCTL_EXIT_USAGE;
	}
	const char *cmd = argv[1];
	if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
		gms_usage(stdout);
		return GFCTL_OK;
	}
	const char *uri = NULL, *dir = NULL;
	bool json = false, have_timeout = false;
	uint64_t timeout_ms = 5000;
	int c;
	optind = 1;
	while ((c = getopt_long(argc - 1, argv + 1, "", opts, NULL)) != -1) {
		switch (c) {
		case 'g':
			uri = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'd':
			dir = optarg;
			break;
		case 't':
			if (gf_parse_duration_ms(optarg, &timeout_ms) < 0) {
				fprintf(stderr, "gfctl gms: --timeout: %s\n", gf_error_detail());
				return GFCTL_EXIT_USAGE;
			}
			have_timeout = true;
			break;
		case 'h':
			gms_usage(stdout);
			return GFCTL_OK;
		default:
			gms_usage(stderr);
			return GFCTL_EXIT_USAGE;
		}
	}
	if (optind < argc - 1) {
		fprintf(stderr, "gfctl gms: unexpected argument '%s'\n", argv[optind + 1]);
		return GFCTL_EXIT_USAGE;
	}
	if (!uri) {
		fprintf(stderr, "gfctl gms %s: --gms URI is required\n", cmd);
		return GFCTL_EXIT_USAGE;
	}
	int rc;
	if (!strcmp(cmd, "status")) {
		char *text;
		if ((rc = gf_gms_status_json(uri, (int64_t)timeout_ms, &text)) < 0)
			return err_exit("status", rc);
		if (json)
			puts(text);
		else
			print_human(text);
		free(text);
		return GFCTL_OK;
	}
	if (!strcmp(cmd, "ping")) {
		int64_t rtt;
		if ((rc = gf_gms_ping(uri, (int64_t)timeout_ms, &rtt)) < 0)
			return err_exit("ping", rc);
		printf("ok rtt_us=%lld\n", (long long)rtt);
		return GFCTL_OK;
	}
	if (!strcmp(cmd, "wait-committed")) {
		uint64_t gen;
		/* Without --timeout a startup probe waits as long as it is allowed to run. */
		if ((rc = gf_gms_wait_committed(uri, have_timeout ? (int64_t)timeout_ms : -1, &gen)) < 0)
			return err_exit("wait-committed", rc);
		printf("committed generation=%llu\n", (unsigned long long)gen);
		return GFCTL_OK;
	}
	if (!strcmp(cmd, "snapshot") || !strcmp(cmd, "restore")) {
		bool snap = !strcmp(cmd, "snapshot");
		/* Copies take as long as the bytes need: a minute unless told otherwise. */
		int64_t t = have_timeout ? (int64_t)timeout_ms : 60000;
		if ((rc = snap ? gf_gms_snapshot(uri, dir, t) : gf_gms_restore(uri, dir, t)) < 0)
			return err_exit(cmd, rc);
		printf("%s ok%s%s\n", snap ? "Checkpointed" : "Restored", dir ? " dir=" : "", dir ? dir : "");
		return GFCTL_OK;
	}
	if (!strcmp(cmd, "tiers"))
		return print_tiers(uri, (int64_t)timeout_ms, json);
	fprintf(stderr, "gfctl gms: unknown command '%s'\n", cmd);
	gms_usage(stderr);
	return GFCTL_EXIT_USAGE;
}
