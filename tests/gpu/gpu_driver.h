/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the GPU tests share: whether the libcuda.so.1 the library loads is a
 * real GPU driver (not tests/fakecuda), and making that decision in a forked
 * child, so that a test process never initialises the driver before it forks
 * (a process that did cannot use the driver in its fork children, and the
 * test runner forks each test).
 */
#ifndef GF_TESTS_GPU_DRIVER_H
#define GF_TESTS_GPU_DRIVER_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpufailover.h"

#define GPU_SKIP 77

/* Loads the driver through the library. Its cuGetProcAddress_v2 when it is
 * a GPU driver with a usable device; otherwise NULL, with the SKIP reason
 * printed. */
static inline void *gpu_real_driver(void)
{
	gf_mem *m = NULL;
	if (gf_mem_open(&m, GF_MEM_CUDA, 0) < 0) {
		printf("SKIP: no usable GPU: %s\n", gf_error_detail());
		return NULL;
	}
	gf_mem_free(m);
	Dl_info info;
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void *sym = lib ? dlsym(lib, "cuGetProcAddress_v2") : NULL;
	if (!sym || !dladdr(sym, &info) || strstr(info.dli_fname, "fakecuda")) {
		printf("SKIP: the loaded libcuda.so.1 is the test driver, not a GPU driver\n");
		return NULL;
	}
	return sym;
}

/* Runs @find (0, GPU_SKIP or 1) in a forked child and returns what it
 * returned; 1 when the child did not exit normally. */
static inline int gpu_decide_in_child(int (*find)(void))
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		int rc = find();
		fflush(stdout);
		_exit(rc);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return 1;
	return WEXITSTATUS(st);
}

#endif
