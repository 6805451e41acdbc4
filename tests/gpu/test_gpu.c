/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The mem scenarios on a real GPU, with the real driver: selected when
 * gf_mem_open(GF_MEM_CUDA) works without a GF_LIBCUDA override; otherwise the
 * program exits 77 and meson reports SKIP (never a pass without a GPU).
 *
 * Device memory is not readable through host pointers, so data is moved with
 * cuMemcpyHtoD/DtoH, looked up from the same driver. CUDA is not fork-safe,
 * so the second process is this program exec'd again in a child role with
 * the socket's fd number on its command line.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../common/testutil.h"
#include "gpu_driver.h"

#include <cuda.h>

#include "gpufailover.h"
#include "wire.h"

#define SKIP GPU_SKIP

struct drv {
	CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
	CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*retain)(CUcontext *, CUdevice);
	CUresult (*push)(CUcontext);
};
static struct drv drv;

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* Look up the copy functions in the driver the library loaded, and make the
 * device's primary context current (the library then uses it as is). */
static int setup_driver(int device)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!lib)
		return -1;
	get_proc_fn gp = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
	if (!gp)
		return -1;
	if (gp("cuMemcpyHtoD", (void **)&drv.memcpy_htod, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuMemcpyDtoH", (void **)&drv.memcpy_dtoh, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuDevicePrimaryCtxRetain", (void **)&drv.retain, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuCtxPushCurrent", (void **)&drv.push, 12000, 0, NULL) != CUDA_SUCCESS)
		return -1;
	CUcontext ctx;
	if (drv.retain(&ctx, device) != CUDA_SUCCESS || drv.push(ctx) != CUDA_SUCCESS)
		return -1;
	return 0;
}

static void send_tag(int sock, const char *tag, int fd)
{
	if (gf_frame_send(sock, tag, strlen(tag) + 1, fd >= 0 ? &fd : NULL, fd >= 0, gf_deadline_from_ms(30000)) < 0)
		_exit(20);
}

static int recv_tag(int sock, const char *tag)
{
	struct gf_frame_reader r;
	int *fds = NULL, fd = -1;
	size_t n = 0;
	gf_frame_reader_init(&r, 4);
	if (gf_frame_recv(&r, sock, gf_deadline_from_ms(30000)) != 1 || strcmp((const char *)r.body, tag) != 0)
		return -2;
	gf_frame_reader_take_fds(&r, &fds, &n);
	if (n)
		fd = fds[0];
	free(fds);
	gf_frame_reader_clear(&r);
	return fd;
}

static const char *self_exe;

/* Start this program as "child <role> <sock> <size>"; returns its pid. */
static pid_t spawn(const char *role, int sock, size_t size)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char s[16], z[32];
		fcntl(sock, F_SETFD, 0);
		snprintf(s, sizeof(s), "%d", sock);
		snprintf(z, sizeof(z), "%zu", size);
		execl(self_exe, self_exe, "child", role, s, z, (char *)NULL);
		_exit(127);
	}
	return pid;
}

static int wait_status(pid_t pid)
{
	int st;
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- child roles (exit status tells the parent what failed) ---- */

static int child_main(const char *role, int sock, size_t size)
{
	gf_mem *m = NULL;
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	if (gf_mem_open(&m, GF_MEM_CUDA, 0) < 0 || setup_driver(0) < 0)
		return 10;
	int fd = recv_tag(sock, "alloc");
	if (fd < 0 || gf_mem_import(&a, m, fd, size) < 0)
		return 11;
	close(fd);
	if (gf_mem_reserve(&va, m, size, 0) < 0)
		return 12;
	uint32_t words[2];
	if (strcmp(role, "reader") == 0) {
		if (gf_mem_map(va, 0, a, GF_MEM_READ) < 0)
			return 13;
		if (drv.memcpy_dtoh(words, gf_mem_va_addr(va), sizeof(words)) != CUDA_SUCCESS)
			return 14;
		if (words[0] != 0x11111111 || words[1] != 0x22222222)
			return 15;
		send_tag(sock, "read", -1);
		if (recv_tag(sock, "creator-released") != -1)
			return 16;
		/* The creator let go: the importer's handle keeps the memory. */
		if (drv.memcpy_dtoh(words, gf_mem_va_addr(va), sizeof(words)) != CUDA_SUCCESS || words[0] != 0x11111111)
			return 17;
		gf_mem_va_free(va);
		gf_mem_alloc_free(a);
		gf_mem_free(m);
		send_tag(sock, "released", -1);
		recv_tag(sock, "exit");
		return 0;
	}
	if (strcmp(role, "rowrite") == 0) {
		/* A copy into a read-only mapping must not succeed. */
		if (gf_mem_map(va, 0, a, GF_MEM_READ) < 0)
			return 13;
		words[0] = words[1] = 0xdeadbeef;
		CUresult r = drv.memcpy_htod(gf_mem_va_addr(va), words, sizeof(words));
		return r == CUDA_SUCCESS ? 30 : 0;
	}
	return 99;
}

/* ---- parent-side tests ---- */

static void test_identity(void **state)
{
	(void)state;
	gf_mem *m = NULL;
	char uuid[64];
	int idx = -1, n = 0;
	uint64_t fr, tot;
	assert_int_equal(gf_mem_open(&m, GF_MEM_CUDA, 0), 0);
	assert_int_equal(gf_mem_device_count(GF_MEM_CUDA, &n), 0);
	assert_true(n >= 1);
	assert_int_equal(gf_mem_device_uuid(m, uuid, sizeof(uuid)), 0);
	assert_memory_equal(uuid, "GPU-", 4);
	assert_int_equal(gf_mem_uuid_to_index(GF_MEM_CUDA, uuid, &idx), 0);
	assert_int_equal(idx, 0);
	assert_int_equal(gf_mem_info(m, &fr, &tot), 0);
	assert_true(tot > 0 && fr <= tot);
	assert_int_equal(gf_mem_synchronize(m), 0);
	gf_mem_free(m);
}

/* Decision 7 on the real driver, observed with cuMemGetInfo. */
static void test_two_processes_and_decision7(void **state)
{
	(void)state;
	gf_mem *m = NULL;
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	size_t g, rec;
	uint64_t f0, f1, f2, f3, tot;
	int sv[2], fd;
	assert_int_equal(gf_mem_open(&m, GF_MEM_CUDA, 0), 0);
	assert_int_equal(gf_mem_granularity(m, &g, &rec), 0);
	size_t size = 256u << 20;
	size = (size + g - 1) / g * g;
	assert_int_equal(gf_mem_info(m, &f0, &tot), 0);
	assert_int_equal(gf_mem_create(&a, m, size), 0);
	assert_int_equal(gf_mem_reserve(&va, m, size, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READWRITE), 0);
	uint32_t words[2] = { 0x11111111, 0x22222222 };
	assert_int_equal(drv.memcpy_htod(gf_mem_va_addr(va), words, sizeof(words)), CUDA_SUCCESS);
	assert_int_equal(gf_mem_synchronize(m), 0);
	assert_int_equal(gf_mem_info(m, &f1, &tot), 0);
	/* Other tenants of the GPU may allocate too: compare with slack. */
	assert_true(f1 + size / 2 <= f0);

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid_t pid = spawn("reader", sv[1], size);
	close(sv[1]);
	assert_int_equal(gf_mem_export(a, &fd), 0);
	send_tag(sv[0], "alloc", fd);
	close(fd);
	assert_int_equal(recv_tag(sv[0], "read"), -1);

	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	assert_int_equal(gf_mem_info(m, &f2, &tot), 0);
	assert_true(f2 + size / 2 <= f0); /* still held by the importer */
	send_tag(sv[0], "creator-released", -1);
	assert_int_equal(recv_tag(sv[0], "released"), -1);
	assert_int_equal(gf_mem_info(m, &f3, &tot), 0);
	assert_true(f3 >= f2 + size / 2); /* freed with the last handle */
	send_tag(sv[0], "exit", -1);
	assert_int_equal(wait_status(pid), 0);
	close(sv[0]);
	gf_mem_free(m);
}

static void test_readonly_refuses_writes(void **state)
{
	(void)state;
	gf_mem *m = NULL;
	gf_mem_alloc *a = NULL;
	size_t g;
	int sv[2], fd;
	assert_int_equal(gf_mem_open(&m, GF_MEM_CUDA, 0), 0);
	assert_int_equal(gf_mem_granularity(m, &g, NULL), 0);
	assert_int_equal(gf_mem_create(&a, m, g), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid_t pid = spawn("rowrite", sv[1], g);
	close(sv[1]);
	assert_int_equal(gf_mem_export(a, &fd), 0);
	send_tag(sv[0], "alloc", fd);
	close(fd);
	assert_int_equal(wait_status(pid), 0);
	close(sv[0]);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

/* Many allocations in one call, unmapped and remapped at the same address. */
static void test_map_many_remap(void **state)
{
	(void)state;
	enum { N = 16 };
	gf_mem *m = NULL;
	gf_mem_alloc *a[N];
	gf_mem_va *va = NULL;
	struct gf_mem_mapping maps[N];
	size_t g;
	assert_int_equal(gf_mem_open(&m, GF_MEM_CUDA, 0), 0);
	assert_int_equal(gf_mem_granularity(m, &g, NULL), 0);
	assert_int_equal(gf_mem_reserve(&va, m, N * g, 0), 0);
	for (int i = 0; i < N; i++) {
		assert_int_equal(gf_mem_create(&a[i], m, g), 0);
		maps[i] = (struct gf_mem_mapping){ (size_t)i * g, a[i] };
	}
	assert_int_equal(gf_mem_map_many(va, maps, N, GF_MEM_READWRITE), 0);
	for (uint32_t i = 0; i < N; i++)
		assert_int_equal(drv.memcpy_htod(gf_mem_va_addr(va) + i * g, &i, sizeof(i)), CUDA_SUCCESS);
	assert_int_equal(gf_mem_synchronize(m), 0);
	uint64_t addr = gf_mem_va_addr(va);
	assert_int_equal(gf_mem_unmap_all(va), 0);
	assert_int_equal(gf_mem_release(a[0]), 0);
	assert_int_equal(gf_mem_map_many(va, maps, N, GF_MEM_READ), GF_ERR_STATE);
	assert_int_equal(gf_mem_map_many(va, maps + 1, N - 1, GF_MEM_READ), 0);
	assert_int_equal(gf_mem_va_addr(va), addr);
	for (uint32_t i = 1; i < N; i++) {
		uint32_t v = 0;
		assert_int_equal(drv.memcpy_dtoh(&v, addr + i * g, sizeof(v)), CUDA_SUCCESS);
		assert_int_equal(v, i);
	}
	gf_mem_va_free(va);
	for (int i = 0; i < N; i++)
		gf_mem_alloc_free(a[i]);
	gf_mem_free(m);
}

/* Whether the real driver works with a device, and then its copy
 * functions and device 0's context: 0, SKIP (the reason printed) or 1.
 * Loads the driver. */
static int find_driver(void)
{
	if (!gpu_real_driver())
		return SKIP;
	if (setup_driver(0) < 0) {
		printf("FAIL: cannot look up cuMemcpyHtoD/DtoH in the driver\n");
		return 1;
	}
	return 0;
}

/* In each test's process: the driver and its device files, before the runner counts fds. */
static void load_driver(void)
{
	if (!drv.memcpy_htod && find_driver() != 0)
		fprintf(stderr, "the driver did not load in the test's process\n");
}

int main(int argc, char **argv)
{
	self_exe = "/proc/self/exe";
	if (argc == 5 && strcmp(argv[1], "child") == 0) {
		unsetenv("GF_LIBCUDA");
		return child_main(argv[2], atoi(argv[3]), (size_t)strtoull(argv[4], NULL, 10));
	}
	/* Only the real driver counts: no override, no test driver. The driver
	 * is loaded in forked children only (a process that initialised it
	 * cannot use it in its fork children): one to decide SKIP, then one per
	 * test (the runner forks each). */
	unsetenv("GF_LIBCUDA");
	int rc = gpu_decide_in_child(find_driver);
	if (rc != 0)
		return rc;
	tu_process_init = load_driver;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_identity),
		cmocka_unit_test(test_two_processes_and_decision7),
		cmocka_unit_test(test_readonly_refuses_writes),
		cmocka_unit_test(test_map_many_remap),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
