/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fixture of the GMS tests that talk to one in-process server: for each
 * test (cmocka setup and teardown) a private directory @dir, a host-backend
 * GMS at @srv (srv.uri, "gms.sock" in @dir) and a gf_mem @mem for its
 * clients. A cmocka program: include <cmocka.h> first.
 */
#ifndef GF_GMSFIXTURE_H
#define GF_GMSFIXTURE_H

#include <stdlib.h>

#include "gmstest.h"
#include "testutil.h"

static char *dir;
static struct gt_server srv;
static gf_mem *mem;

static inline int gt_setup(void **state)
{
	(void)state;
	dir = tu_tmpdir();
	if (!dir || gf_mem_open(&mem, GF_MEM_HOST, 0) < 0)
		return -1;
	return gt_start(&srv, dir, "gms", 0) < 0 ? -1 : 0;
}

static inline int gt_teardown(void **state)
{
	(void)state;
	gt_stop(&srv);
	gf_mem_free(mem);
	mem = NULL;
	gt_rmtree(dir);
	free(dir);
	dir = NULL;
	return 0;
}

/* @expr returns 0 or a negative error code; an error fails the test with its name and detail. */
#define OK(expr)                                                                                  \
	do {                                                                                          \
		int rc_ = (expr);                                                                         \
		if (rc_ < 0)                                                                              \
			fail_msg("%s: %s: %s", #expr, gf_error_name(rc_), gf_error_detail());                 \
	} while (0)

#endif
