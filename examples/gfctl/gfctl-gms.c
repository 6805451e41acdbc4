/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl gms status | ping | wait-committed | snapshot | restore | tiers | demote: GMS status, probes, residency tiers. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gfctl.h"
#include "gpufailover.h"

/* One value of the status for a human: strings as they are (JSON-escaped when
 * they hold a quote, a backslash or a control character, so no value can fake
 * a line), everything else as compact JSON. */
static void print_value(json_t *v)
{
	const char *s = json_string_value(v);
	bool plain = s != NULL;
	for (const char *p = s; plain && *p; p++)
		plain = *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20 && *p != 0x7f;
	if (plain) {
		fputs(s, stdout);
		return;
	}
	char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(10));
	fputs(text ? text : "?", stdout);
	free(text);
}

/* Human form of the status JSON: one key per line, in the JSON's order and
 * with its names (what operators grep); a list puts one item a line under it. */
static int print_human(const char *json)
{
	json_error_t e;
	json_t *st = json_loads(json, 0, &e);
	if (!json_is_object(st)) {
		json_decref(st);
		fprintf(stderr, "gfctl gms status: the GMS's status is not a JSON object: %s\n", e.text);
		return -1;
	}
	const char *key;
	json_t *v;
	json_object_foreach(st, key, v) {
		printf("%s:", key);
		if (json_is_array(v) && json_array_size(v)) {
			size_t i;
			json_t *item;
			json_array_foreach(v, i, item) {
				fputs("\n  ", stdout);
				print_value(item);
			}
		} else {
			putchar(' ');
			print_value(v);
		}
		putchar('\n');
	}
	json_decref(st);
	return 0;
}

/* The options of the gms commands (bits of the allowed masks below). */
enum { O_GMS = 1, O_JSON, O_TIMEOUT, O_DIR, O_TO };
#define BIT(o) (UINT32_C(1) << (o))

struct gms_opts {
	const char *uri;
	const char *dir;
	const char *to;
	bool json;
	int64_t timeout_ms; /* -1 when not given */
};

/* The options @allowed of this command; 0, or -1 after a message. */
static int parse_opts(int argc, char **argv, uint32_t allowed, struct gms_opts *o)
{
	static const struct option all[] = {
		{ "gms", required_argument, NULL, O_GMS },
		{ "json", no_argument, NULL, O_JSON },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "dir", required_argument, NULL, O_DIR },
		{ "to", required_argument, NULL, O_TO },
		{ NULL, 0, NULL, 0 },
	};
	struct option opts[32];
	gfctl_options(all, allowed | BIT(O_GMS), opts);
	int c;
	optind = 1;
	opterr = 0; /* the message below names the command */
	while ((c = getopt_long(argc, argv, GFCTL_OPTSTRING, opts, NULL)) != -1) {
		switch (c) {
		case O_GMS:
			o->uri = optarg;
			break;
		case O_JSON:
			o->json = true;
			break;
		case O_DIR:
			o->dir = optarg;
			break;
		case O_TO:
			o->to = optarg;
			break;
		case O_TIMEOUT:
			if (gfctl_duration("gms", "--timeout", optarg, &o->timeout_ms) < 0)
				return -1;
			break;
		default:
			gfctl_bad_option("gms", argv, c, opts);
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
	if (parse_opts(argc, argv, BIT(O_JSON) | BIT(O_TIMEOUT), &o) < 0)
		return GFCTL_EXIT_USAGE;
	char *text;
	int rc = gf_gms_status_json(o.uri, o.timeout_ms >= 0 ? o.timeout_ms : 5000, &text);
	if (rc < 0)
		return gfctl_fail("gms", "status", rc);
	if (o.json)
		puts(text);
	else if (print_human(text) < 0)
		rc = GF_ERR_PROTOCOL;
	free(text);
	return rc < 0 ? GFCTL_EXIT_FAILURE : GFCTL_OK;
}

static int run_ping(int argc, char **argv)
{
	struct gms_opts o = { .timeout_ms = -1 };
	if (parse_opts(argc, argv, BIT(O_TIMEOUT), &o) < 0)
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
	if (parse_opts(argc, argv, BIT(O_TIMEOUT), &o) < 0)
		return GFCTL_EXIT_USAGE;
	uint64_t gen;
	/* Without --timeout a startup probe waits as long as it is allowed to run. */
	int rc = gf_gms_wait_committed(o.uri, o.timeout_ms, &gen);
	if (rc < 0)
		return gfctl_fail("gms", "wait-committed", rc);
	printf("committed generation=%llu\n", (unsigned long long)gen);
	return GFCTL_OK;
}

static int run_snapshot_restore(int argc, char **argv)
{
	struct gms_opts o = { .timeout_ms = -1 };
	if (parse_opts(argc, argv, BIT(O_DIR) | BIT(O_TIMEOUT), &o) < 0)
		return GFCTL_EXIT_USAGE;
	bool snap = !strcmp(argv[0], "snapshot");
	/* Copies take as long as the bytes need: a minute unless told otherwise. */
	int64_t t = o.timeout_ms >= 0 ? o.timeout_ms : 60000;
	int rc = snap ? gf_gms_snapshot(o.uri, o.dir, t) : gf_gms_restore(o.uri, o.dir, t);
	if (rc < 0)
		return gfctl_fail("gms", argv[0], rc);
	printf("%s ok%s%s\n", snap ? "Checkpointed" : "Restored", o.dir ? " dir=" : "", o.dir ? o.dir : "");
	return GFCTL_OK;
}

static const char *str_or(json_t *o, const char *key, const char *dflt)
{
	const char *s = json_string_value(json_object_get(o, key));
	return s ? s : dflt;
}

/* Where the layout is and the last demotion, with the status JSON's names. */
static void print_residency(json_t *st)
{
	if (!json_object_get(st, "resident_tier"))
		return; /* an older gf-gmsd */
	printf("residency: resident_tier=%s resident_seconds=%.1f pinned=%s min_resident_seconds=%.1f "
	       "demote_below_free_bytes=%lld demotions=%lld\n",
	       str_or(st, "resident_tier", "?"), json_real_value(json_object_get(st, "resident_seconds")),
	       json_is_true(json_object_get(st, "pinned")) ? "yes" : "no",
	       json_real_value(json_object_get(st, "min_resident_seconds")),
	       (long long)json_integer_value(json_object_get(st, "demote_below_free_bytes")),
	       (long long)json_integer_value(json_object_get(st, "demotions")));
	json_t *l = json_object_get(st, "last_demotion");
	if (!json_is_object(l)) {
		printf("last_demotion: none\n");
		return;
	}
	printf("last_demotion: from=%s to=%s reason=%s at_unix_ms=%lld generation=%lld bytes=%lld detail=\"%s\"\n",
	       str_or(l, "from", "?"), str_or(l, "to", "?"), str_or(l, "reason", "?"),
	       (long long)json_integer_value(json_object_get(l, "at_unix_ms")),
	       (long long)json_integer_value(json_object_get(l, "generation")),
	       (long long)json_integer_value(json_object_get(l, "bytes")), str_or(l, "detail", ""));
}

/* The tiers and the last operation from the status, one line each (same names as the status JSON). */
static int run_tiers(int argc, char **argv)
{
	struct gms_opts o = { .timeout_ms = -1 };
	if (parse_opts(argc, argv, BIT(O_JSON) | BIT(O_TIMEOUT), &o) < 0)
		return GFCTL_EXIT_USAGE;
	char *text;
	int rc = gf_gms_status_json(o.uri, o.timeout_ms >= 0 ? o.timeout_ms : 5000, &text);
	if (rc < 0)
		return gfctl_fail("gms", "tiers", rc);
	json_t *st = json_loads(text, 0, NULL);
	free(text);
	json_t *tiers = json_object_get(st, "tiers"), *op = json_object_get(st, "operation");
	if (!st || !json_is_object(tiers)) {
		json_decref(st);
		fprintf(stderr, "gfctl gms tiers: the GMS reports no tiers (an older gf-gmsd?)\n");
		return GFCTL_EXIT_FAILURE;
	}
	if (o.json) {
		json_t *out = json_pack("{s:O, s:O, s:O, s:O}", "state", json_object_get(st, "state"), "generation",
					json_object_get(st, "generation"), "tiers", tiers, "operation", op ? op : json_null());
		static const char *const residency[] = { "resident_tier", "resident_seconds", "pinned", "min_resident_seconds",
							 "demote_below_free_bytes", "demotions", "last_demotion" };
		for (size_t i = 0; out && i < sizeof(residency) / sizeof(residency[0]); i++) {
			json_t *v = json_object_get(st, residency[i]);
			if (v)
				json_object_set(out, residency[i], v);
		}
		char *s = out ? json_dumps(out, JSON_COMPACT) : NULL;
		if (s)
			puts(s);
		free(s);
		json_decref(out);
		json_decref(st);
		return GFCTL_OK;
	}
	printf("hot: state=%s generation=%lld\n", str_or(st, "state", "?"),
	       (long long)json_integer_value(json_object_get(st, "generation")));
	print_residency(st);
	const char *names[] = { "warm", "cold" };
	for (size_t i = 0; i < 2; i++) {
		json_t *t = json_object_get(tiers, names[i]);
		if (!t) {
			printf("%s: not kept\n", names[i]);
			continue;
		}
		const char *err = str_or(t, "error", "");
		printf("%s: dir=%s present=%s bytes=%lld generation=%lld age_seconds=%.1f%s%s%s\n", names[i],
		       str_or(t, "dir", "?"), json_is_true(json_object_get(t, "present")) ? "yes" : "no",
		       (long long)json_integer_value(json_object_get(t, "bytes")),
		       (long long)json_integer_value(json_object_get(t, "generation")),
		       json_real_value(json_object_get(t, "age_seconds")), *err ? " error=\"" : "", err, *err ? "\"" : "");
	}
	if (json_is_object(op))
		printf("operation: kind=%s phase=%s bytes=%lld seconds=%.3f reason=\"%s\"\n", str_or(op, "kind", "?"),
		       str_or(op, "phase", "?"), (long long)json_integer_value(json_object_get(op, "bytes")),
		       json_real_value(json_object_get(op, "seconds")), str_or(op, "reason", ""));
	else
		printf("operation: none\n");
	json_decref(st);
	return GFCTL_OK;
}

/* Ask for a demotion; on success say where the layout went (the GMS's own record). */
static int run_demote(int argc, char **argv)
{
	struct gms_opts o = { .timeout_ms = -1 };
	if (parse_opts(argc, argv, BIT(O_TO) | BIT(O_TIMEOUT), &o) < 0)
		return GFCTL_EXIT_USAGE;
	int to = GF_GMS_TIER_ANY;
	if (o.to && !strcmp(o.to, "warm"))
		to = GF_GMS_TIER_WARM;
	else if (o.to && !strcmp(o.to, "cold"))
		to = GF_GMS_TIER_COLD;
	else if (o.to) {
		fprintf(stderr, "gfctl gms demote: --to must be warm or cold, not '%s'\n", o.to);
		return GFCTL_EXIT_USAGE;
	}
	/* Writing the snapshot first takes as long as the bytes need: a minute unless told otherwise. */
	int rc = gf_gms_demote(o.uri, to, o.timeout_ms >= 0 ? o.timeout_ms : 60000);
	if (rc < 0)
		return gfctl_fail("gms", "demote", rc);
	char *text = NULL;
	json_t *st = NULL;
	if (gf_gms_status_json(o.uri, 5000, &text) == 0) {
		st = json_loads(text, 0, NULL);
		free(text);
	}
	json_t *l = json_object_get(st, "last_demotion");
	/* Memory the drop could not free: sleepers it released that still hold their handles (docs/gms.md). */
	printf("demoted to=%s state=%s pinned_bytes=%lld\n", json_is_object(l) ? str_or(l, "to", "?") : "?",
	       str_or(st, "state", "?"), (long long)json_integer_value(json_object_get(st, "pinned_bytes")));
	json_t *pins = json_object_get(st, "pinned_by");
	for (size_t i = 0; i < json_array_size(pins); i++) {
		json_t *p = json_array_get(pins, i);
		printf("pinned_by: pid=%lld peer=%s bytes=%lld generation=%lld\n",
		       (long long)json_integer_value(json_object_get(p, "pid")), str_or(p, "peer", "?"),
		       (long long)json_integer_value(json_object_get(p, "bytes")),
		       (long long)json_integer_value(json_object_get(p, "generation")));
	}
	json_decref(st);
	return GFCTL_OK;
}

#define GMS_OPT "  --gms URI              the GMS socket: unix:///path (fds travel over it: no tcp://, no etcd://)\n"

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
	{ "snapshot", "--gms URI [--dir DIR] [--timeout DUR]",
	  "Snapshot the committed layout to DIR or the kept WARM and COLD tiers; wait until written.",
	  "See docs/tiers.md. DIR is a path on the GMS's host.\n",
	  GMS_OPT "  --dir DIR              where to write (default: the tiers given to gf-gmsd --warm/--cold)\n"
		  "  --timeout DUR          how long to wait (default 60s)\n",
	  ", 3 timeout, 5 unreachable, 6 refused", run_snapshot_restore },
	{ "restore", "--gms URI [--dir DIR] [--timeout DUR]",
	  "Restore an EMPTY GMS from DIR or its best tier; every checksum is verified first.",
	  "See docs/tiers.md. On any error the GMS stays EMPTY.\n",
	  GMS_OPT "  --dir DIR              the snapshot (default: the best of the --warm/--cold tiers)\n"
		  "  --timeout DUR          how long to wait (default 60s)\n",
	  ", 3 timeout, 5 unreachable, 6 refused", run_snapshot_restore },
	{ "tiers", "--gms URI [--json] [--timeout DUR]",
	  "Show the WARM and COLD tiers (present, bytes, generation, age) and the last snapshot or restore.", NULL,
	  GMS_OPT "  --json                 state, generation, tiers and operation as one JSON object\n"
		  "  --timeout DUR          how long to wait for the answer (default 5s)\n",
	  ", 3 timeout, 5 unreachable, 6 refused", run_tiers },
	{ "demote", "--gms URI [--to warm|cold] [--timeout DUR]",
	  "Demote the committed layout to a lower tier and free it in the GMS (admin only).",
	  "Pressure once: the GMS's policy decides. Refused when pinned (gf-gmsd --pin), before\n"
	  "--min-resident, while an engine holds the RO or RW lock, or when the snapshot fails (the\n"
	  "layout then stays). The next engine that connects gets the same layout back from the tier.\n"
	  "See docs/tiers.md.\n",
	  GMS_OPT "  --to warm|cold         the tier (default: WARM, or COLD when WARM is not kept or full)\n"
		  "  --timeout DUR          how long to wait (default 60s)\n",
	  ", 3 timeout, 5 unreachable, 6 refused (not an admin); 1 when the policy refuses; 2 also when the tier is not kept", run_demote },
	{ 0 },
};

const struct gfctl_group gfctl_gms_group = {
	"gms", "The GPU Memory Service (gf-gmsd): status and probes.", gms_cmds,
};
