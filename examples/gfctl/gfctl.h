/* SPDX-License-Identifier: Apache-2.0 */
#ifndef GFCTL_H
#define GFCTL_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes shared by every gfctl command (documented in docs/operations.md). */
enum {
	GFCTL_OK = 0,
	GFCTL_EXIT_FAILURE = 1,   /* anything not listed below */
	GFCTL_EXIT_USAGE = 2,     /* bad command line */
	GFCTL_EXIT_TIMEOUT = 3,   /* the timeout passed */
	GFCTL_EXIT_LOCK_LOST = 4, /* the lock was held and lost */
	GFCTL_EXIT_UNREACHABLE = 5, /* server not reachable */
	GFCTL_EXIT_PERMISSION = 6,  /* refused by the server */
	GFCTL_EXIT_EVICTED = 73,    /* a waiting acquire was evicted from the standby pool (GF_ENGINE_EXIT_EVICTED) */
};

/* One command: "gfctl GROUP NAME ARGS". run() gets argv[0] = NAME and the
 * arguments after it; -h/--help never reaches it. */
struct gfctl_cmd {
	const char *name;
	const char *args;        /* synopsis of the arguments */
	const char *description; /* one line */
	const char *details;     /* more text for --help, or NULL */
	const char *options;     /* one option per line, indented */
	const char *exits;       /* the exit codes this command uses besides 0, 1 and 2 */
	int (*run)(int argc, char **argv);
};

/* A command group ("lock", "gms"): its commands, NULL-name terminated. */
struct gfctl_group {
	const char *name;
	const char *description;
	const struct gfctl_cmd *cmds;
};

extern const struct gfctl_group gfctl_lock_group;
extern const struct gfctl_group gfctl_gms_group;
extern const struct gfctl_group gfctl_supervise_group;
extern const struct gfctl_group gfctl_gpu_group;

/* Map a library error to the exit codes above. */
int gfctl_exit_code(int err);
/* Print "gfctl GROUP NAME: DETAIL (ERROR_NAME)" to stderr; returns the exit code for @err. */
int gfctl_fail(const char *group, const char *name, int err);
/* getopt_long's option string for every command: stop at the first argument
 * ("--" or CMD), and tell a missing value (':') from an unknown option ('?'). */
#define GFCTL_OPTSTRING "+:"
/* The options of one command: the entries of its group's table @all whose val
 * is a bit set in @allowed (vals are 1..31), copied into @out (room for 32),
 * terminated. */
void gfctl_options(const struct option *all, uint32_t allowed, struct option *out);
/* Say what was wrong after getopt_long returned @c ('?' or ':'), naming the
 * command ("gfctl GROUP CMD") and where its help is. */
void gfctl_bad_option(const char *group, char **argv, int c, const struct option *opts);
/* Parse a duration option; prints the reason and returns -1 when malformed. */
int gfctl_duration(const char *group, const char *opt, const char *text, int64_t *out_ms);

#endif
