/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl: status, probes and flock(1)-like locking for scripts and Kubernetes. */
#include <stdio.h>
#include <string.h>

#include "gfctl.h"
#include "gpufailover.h"

static void usage(FILE *f)
{
	fputs("usage: gfctl [--help] [--version] COMMAND ...\n"
	      "\n"
	      "commands:\n"
	      "  lock acquire --lock URI --id ID [--timeout DURATION] [-- CMD ARGS...]\n"
	      "  lock status  --lock URI [--json]\n"
	      "  lock ping    --lock URI [--timeout DURATION]\n"
	      "  gms status   --gms URI [--json]\n"
	      "  gms ping     --gms URI [--timeout DURATION]\n"
	      "  gms wait-committed --gms URI [--timeout DURATION]\n"
	      "  gms snapshot --gms URI [--dir DIR]   snapshot the committed layout (docs/tiers.md)\n"
	      "  gms restore  --gms URI [--dir DIR]   restore an EMPTY GMS from DIR or its best tier\n"
	      "  gms tiers    --gms URI [--json]      WARM/COLD presence, size, age; last operation\n"
	      "\n"
	      "Durations are written 250ms, 10s, 2m. Exit codes: 0 ok, 1 failure, 2 usage,\n"
	      "3 timeout, 4 lock lost, 5 server unreachable, 6 permission denied.\n",
	      f);
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
	case GF_ERR_INVALID_ARG:
		return GFCTL_EXIT_USAGE;
	default:
		return GFCTL_EXIT_FAILURE;
	}
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return GFCTL_EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("gfctl (libgpufailover) %s\n", gf_version());
		return 0;
	}
	if (!strcmp(argv[1], "lock"))
		return gfctl_lock(argc - 1, argv + 1);
	if (!strcmp(argv[1], "gms"))
		return gfctl_gms(argc - 1, argv + 1);
	fprintf(stderr, "gfctl: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return GFCTL_EXIT_USAGE;
}
