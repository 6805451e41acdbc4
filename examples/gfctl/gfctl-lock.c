/* SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>

#include "gfctl.h"

/* Replaced by the lock component's commands. */
int gfctl_lock(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "gfctl: 'lock' commands are not part of this build yet\n");
	return GFCTL_EXIT_FAILURE;
}
