/* SPDX-License-Identifier: Apache-2.0 */
#ifndef GFCTL_H
#define GFCTL_H

/* Exit codes shared by every gfctl command (documented in docs/operations.md). */
enum {
	GFCTL_OK = 0,
	GFCTL_EXIT_FAILURE = 1,   /* anything not listed below */
	GFCTL_EXIT_USAGE = 2,     /* bad command line */
	GFCTL_EXIT_TIMEOUT = 3,   /* the timeout passed */
	GFCTL_EXIT_LOCK_LOST = 4, /* the lock was held and lost */
	GFCTL_EXIT_UNREACHABLE = 5, /* server not reachable */
	GFCTL_EXIT_PERMISSION = 6,  /* refused by the server */
};

/* argv[0] is the subcommand's name ("lock", "gms"). */
int gfctl_lock(int argc, char **argv);
int gfctl_gms(int argc, char **argv);
int gfctl_gpu(int argc, char **argv);
/* Map a library error to the exit codes above. */
int gfctl_exit_code(int err);

#endif
