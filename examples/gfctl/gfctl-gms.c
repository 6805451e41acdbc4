/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl gms status | ping | wait-committed: GMS status and probes. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gfctl.h"
#include "gpufailover.h"

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

struct gms_opts {
	const char *uri;
	bool json;
	int64_t timeout_ms; /* -1 when not given */
};

/* Options of every gms command; 0, or -1 after a message. */
static int parse_opts(int argc, char **argv, struct gms_opts *o)
{
	static const struct option opts[] = {
		{ "gms", required_argument, NULL, 'g' },
		{ "json", no_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 't' },
		{ NULL, 0, NULL, 0 },
	};
	int c;
	optind = 1;
	opterr = 0; /* the message below names the command */
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'g':
			o->uri = optarg;
			break;
		case 'j':
			o->json = true;
			break;
		case 't':
			if (gfctl_duration("gms", "--timeout", optarg, &o->timeout_ms) < 0)
				return -1;
			break;
		default:
			fprintf(stderr, "gfctl gms %s: unknown option or missing value: '%s' (see 'gfctl gms %s --help')\n",
				argv[0], argv[optind - 1], argv[0]);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "gfctl gms %s: unexpected argument '%s'\n", argv[0], argv[optind]);
		return -1;
	}
	if (!o->uri) {
		fprintf(stderr, "gfctl gms %s: --gms URI is required\n", argv[0]);
		return -1;
	}
	return 0;
}

static int run_status(int argc, char **argv)
{
	struct gms_opts o = { .timeout_ms = -1 };
	if (parse_opts(argc, argv, &o) < 0)
		return GFCTL_EXIT_USAGE;
	char *text;
	int rc = gf_gms_status_json(o.uri, o.timeout_ms >= 0 ? o.timeout_ms : 5000, &text);
	if (rc < 0)
		return gfctl_fail("gms", "status", rc);
	if (o.json)
		puts(text);
	else
		print_human(text);
	free(text);
	return GFCTL_OK;
}

static int run_ping(int argc, char **argv)
{
	struct gms_opts o = { .timeout_ms = -1 };
	if (parse_opts(argc, argv, &o) < 0)
		return GFCTL_EXIT_USAGE;
	int64_t rtt;
	int rc = gf_gms_ping(o.uri, o.timeout_ms >= 0 ? o.timeout_ms : 5000, &rtt);
	if (rc < 0)
		return gfctl_fail("gms", "ping", rc);
	printf("ok rtt_us=%lld\n", (long long)rtt);
	return GFCTL_OK;
}

static int run_wait_committed(int argc, char **argv)
{
	struct gms_opts o = { .timeout_ms = -1 };
	if (parse_opts(argc, argv, &o) < 0)
		return GFCTL_EXIT_USAGE;
	uint64_t gen;
	/* Without --timeout a startup probe waits as long as it is allowed to run. */
	int rc = gf_gms_wait_committed(o.uri, o.timeout_ms, &gen);
	if (rc < 0)
		return gfctl_fail("gms", "wait-committed", rc);
	printf("committed generation=%llu\n", (unsigned long long)gen);
	return GFCTL_OK;
}

#define GMS_OPT "  --gms URI              the GMS socket (unix:///path)\n"

static const struct gfctl_cmd gms_cmds[] = {
	{ "status", "--gms URI [--json] [--timeout DUR]",
	  "Show state, generation, layout hash, allocations, readers, events.", NULL,
	  GMS_OPT "  --json                 the status as one JSON object\n"
		  "  --timeout DUR          how long to wait for the answer (default 5s)\n",
	  ", 3 timeout, 5 unreachable, 6 refused", run_status },
	{ "ping", "--gms URI [--timeout DUR]", "Check that the GMS answers; print 'ok rtt_us=N'.", NULL,
	  GMS_OPT "  --timeout DUR          how long to wait for the answer (default 5s)\n",
	  ", 3 timeout, 5 unreachable, 6 refused", run_ping },
	{ "wait-committed", "--gms URI [--timeout DUR]",
	  "Wait for committed weights; print 'committed generation=N'.", NULL,
	  GMS_OPT "  --timeout DUR          give up after DUR (default: wait forever)\n",
	  ", 3 timeout, 5 unreachable, 6 refused", run_wait_committed },
	{ 0 },
};

const struct gfctl_group gfctl_gms_group = {
	"gms", "The GPU Memory Service (gf-gmsd): status and probes.", gms_cmds,
};
