/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl: status, probes and flock(1)-like locking for scripts and Kubernetes.
 * main() finds the group and the command and answers help; each command
 * parses its own options. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gfctl.h"
#include "gpufailover.h"

static const struct gfctl_group *const groups[] = { &gfctl_lock_group, &gfctl_gms_group, &gfctl_gpu_group,
								&gfctl_supervise_group };
#define NGROUPS (sizeof(groups) / sizeof(groups[0]))

static const char exit_codes[] = "exit codes: 0 ok, 1 failure, 2 usage, 3 timeout, 4 lock lost,\n"
				 "            5 server unreachable, 6 permission denied\n";

static void usage(FILE *f)
{
	fputs("usage: gfctl [--help] [--version] GROUP COMMAND [OPTIONS] (COMMAND --help for its options)\n\n"
	      "Status, probes and flock(1)-like locking for libgpufailover's lock server and GMS.\n\n"
	      "commands:\n",
	      f);
	for (size_t g = 0; g < NGROUPS; g++) {
		for (const struct gfctl_cmd *c = groups[g]->cmds; c->name; c++) {
			char both[64];
			snprintf(both, sizeof(both), "%s %s", groups[g]->name, c->name);
			fprintf(f, "  %-20s %s\n", both, c->description);
		}
	}
	fprintf(f, "\nDurations are written 250ms, 10s, 2m.\n%s", exit_codes);
}

static void group_usage(FILE *f, const struct gfctl_group *g)
{
	fprintf(f, "usage: gfctl %s COMMAND [OPTIONS]\n\n%s\n\ncommands:\n", g->name, g->description);
	for (const struct gfctl_cmd *c = g->cmds; c->name; c++)
		fprintf(f, "  %-15s %s\n", c->name, c->description);
	fprintf(f, "\n'gfctl %s COMMAND --help' shows a command's options.\n%s", g->name, exit_codes);
}

static void cmd_usage(FILE *f, const struct gfctl_group *g, const struct gfctl_cmd *c)
{
	fprintf(f, "usage: gfctl %s %s %s\n\n%s\n", g->name, c->name, c->args, c->description);
	if (c->details)
		fprintf(f, "%s\n", c->details);
	fprintf(f, "\noptions:\n%s  -h, --help             this text\n\nexit codes: 0 ok, 1 failure, 2 usage%s\n",
		c->options, c->exits);
}

int gfctl_exit_code(int err)
{
	switch (err) {
	case 0:
		return GFCTL_OK;
	case GF_ERR_TIMEOUT:
		return GFCTL_EXIT_TIMEOUT;
	case GF_ERR_LOCK_LOST:
		return GFCTL_EXIT_LOCK_LOST;
	case GF_ERR_UNREACHABLE:
	case GF_ERR_CLOSED:
		return GFCTL_EXIT_UNREACHABLE;
	case GF_ERR_PERMISSION:
		return GFCTL_EXIT_PERMISSION;
	case GF_ERR_EVICTED:
		return GFCTL_EXIT_EVICTED;
	case GF_ERR_INVALID_ARG:
		return GFCTL_EXIT_USAGE;
	default:
		return GFCTL_EXIT_FAILURE;
	}
}

int gfctl_fail(const char *group, const char *name, int err)
{
	fprintf(stderr, "gfctl %s %s: %s (%s)\n", group, name, gf_error_detail(),
		gf_error_name(err) ? gf_error_name(err) : "?");
	return gfctl_exit_code(err);
}

int gfctl_duration(const char *group, const char *opt, const char *text, int64_t *out_ms)
{
	uint64_t ms;
	if (gf_parse_duration_ms(text, &ms) < 0 || ms > INT64_MAX / 1000) {
		fprintf(stderr, "gfctl %s: %s: %s\n", group, opt,
			ms > INT64_MAX / 1000 ? "too long" : gf_error_detail());
		return -1;
	}
	*out_ms = (int64_t)ms;
	return 0;
}

void gfctl_options(const struct option *all, uint32_t allowed, struct option *out)
{
	size_t n = 0;
	for (; all->name; all++)
		if (all->val > 0 && all->val < 32 && (allowed & (UINT32_C(1) << all->val)) && n < 31)
			out[n++] = *all;
	out[n] = (struct option){ 0 };
}

void gfctl_bad_option(const char *group, char **argv, int c, const struct option *opts)
{
	const char *arg = argv[optind - 1];
	const char *eq = strchr(arg, '=');
	if (c == ':') {
		fprintf(stderr, "gfctl %s %s: option '%s' needs a value", group, argv[0], arg);
	} else if (!strncmp(arg, "--", 2) && eq) {
		/* "--json=x": known to this command but takes no value, or not known at all. */
		size_t n = (size_t)(eq - arg - 2);
		const struct option *o = opts;
		while (o->name && !(strlen(o->name) == n && !strncmp(o->name, arg + 2, n)))
			o++;
		if (o->name)
			fprintf(stderr, "gfctl %s %s: option '--%s' takes no value", group, argv[0], o->name);
		else
			fprintf(stderr, "gfctl %s %s: unknown option '%.*s'", group, argv[0], (int)(eq - arg), arg);
	} else {
		fprintf(stderr, "gfctl %s %s: unknown option '%s'", group, argv[0], arg);
	}
	fprintf(stderr, " (see 'gfctl %s %s --help')\n", group, argv[0]);
}

static int is_help(const char *arg)
{
	return !strcmp(arg, "-h") || !strcmp(arg, "--help");
}

static const struct gfctl_group *find_group(const char *name)
{
	for (size_t g = 0; g < NGROUPS; g++)
		if (!strcmp(groups[g]->name, name))
			return groups[g];
	return NULL;
}

static const struct gfctl_cmd *find_cmd(const struct gfctl_group *g, const char *name)
{
	for (const struct gfctl_cmd *c = g->cmds; c->name; c++)
		if (!strcmp(c->name, name))
			return c;
	return NULL;
}

/* -h/--help anywhere before "--" asks for the command's help. */
static int wants_help(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (is_help(argv[i]))
			return 1;
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return GFCTL_EXIT_USAGE;
	}
	if (is_help(argv[1])) {
		usage(stdout);
		return GFCTL_OK;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("gfctl (libgpufailover) %s\n", gf_version());
		return GFCTL_OK;
	}
	/* "gfctl switchover ..." is short for "gfctl lock switchover ...". */
	char *alias[argc + 2];
	if (!strcmp(argv[1], "switchover")) {
		alias[0] = argv[0];
		alias[1] = (char *)"lock";
		for (int i = 1; i <= argc; i++)
			alias[i + 1] = argv[i];
		argv = alias;
		argc++;
	}
	const struct gfctl_group *g = find_group(argv[1]);
	if (!g) {
		fprintf(stderr, "gfctl: unknown command '%s' (see gfctl --help)\n", argv[1]);
		return GFCTL_EXIT_USAGE;
	}
	if (argc < 3 || is_help(argv[2])) {
		group_usage(argc < 3 ? stderr : stdout, g);
		return argc < 3 ? GFCTL_EXIT_USAGE : GFCTL_OK;
	}
	const struct gfctl_cmd *c = find_cmd(g, argv[2]);
	if (!c) {
		fprintf(stderr, "gfctl %s: unknown command '%s' (see gfctl %s --help)\n", g->name, argv[2], g->name);
		return GFCTL_EXIT_USAGE;
	}
	if (wants_help(argc - 2, argv + 2)) {
		cmd_usage(stdout, g, c);
		return GFCTL_OK;
	}
	return c->run(argc - 2, argv + 2);
}
