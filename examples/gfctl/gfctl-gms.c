/* SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>

#include "gfctl.h"

/* Replaced by the gms component's commands. */
int gfctl_gms(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "gfctl: 'gms' commands are not part of this build yet\n");
	return GFCTL_EXIT_FAILURE;
}
