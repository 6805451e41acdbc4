/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory tests' backend: one program runs on the host backend or on the
 * cuda backend over the test driver tests/fakecuda, as argv[1] says. A
 * cmocka program: include <cmocka.h> first.
 */
#ifndef TESTS_MEM_MEMTEST_H
#define TESTS_MEM_MEMTEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/testutil.h"
#include "gpufailover.h"

/* The backend under test (mt_init). */
static int mt_kind = GF_MEM_HOST;

/* A gf_mem of mt_kind on device 0; a failure to open fails the test. */
static inline gf_mem *mt_open(void)
{
	gf_mem *m = NULL;
	int rc = gf_mem_open(&m, mt_kind, 0);
	if (rc < 0)
		fail_msg("gf_mem_open(%s): %s: %s", gf_mem_kind_name(mt_kind), gf_error_name(rc), gf_error_detail());
	assert_int_equal(gf_mem_kind(m), mt_kind);
	return m;
}

/* The test driver keeps its accounting of every process's memory in
 * FAKECUDA_STATE_DIR: a directory of this run's own unless the environment
 * names one, so that runs side by side do not count each other's memory.
 * tu_tmpdir() removes it when this process exits. Returns 0, or -1 after a
 * line on stderr. Called from main(), before any test. */
static inline int mt_fakecuda_state_dir(void)
{
	if (getenv("FAKECUDA_STATE_DIR"))
		return 0;
	char *dir = tu_tmpdir();
	if (!dir || setenv("FAKECUDA_STATE_DIR", dir, 1) != 0) {
		fprintf(stderr, "no directory for FAKECUDA_STATE_DIR\n");
		free(dir);
		return -1;
	}
	free(dir);
	return 0;
}

/* mt_kind from argv[1] ("host", the default, or "cuda"); on cuda, the test
 * driver's state directory. Returns 0, or 2 after a line on stderr. */
static inline int mt_init(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
		mt_kind = GF_MEM_CUDA;
	} else if (argc > 1 && strcmp(argv[1], "host") != 0) {
		fprintf(stderr, "usage: %s host|cuda\n", argv[0]);
		return 2;
	}
	if (mt_kind == GF_MEM_CUDA && mt_fakecuda_state_dir() < 0)
		return 2;
	return 0;
}

#endif
