/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda backend's error paths, driven by the fake driver's fault knobs
 * (tests/fakecuda; GF_LIBCUDA points at it). The knobs are environment
 * variables the fake reads on every call, so each test sets and clears them.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <cuda.h>

#include "memtest.h"

#define GRAN (2u * 1024 * 1024)

static int clear_knobs(void **state)
{
	(void)state;
	tu_env_set("FAKECUDA_FAIL", NULL);
	tu_env_set("FAKECUDA_OOM_AFTER_BYTES", NULL);
	tu_env_set("FAKECUDA_NO_POSIX_FD", NULL);
	tu_env_set("FAKECUDA_DRIVER_VERSION", NULL);
	unsetenv("FAKECUDA_DEVICES");
	tu_env_set("FAKECUDA_TOTAL_MEM", NULL);
	return 0;
}

static gf_mem *open_cuda(int device)
{
	gf_mem *m = NULL;
	int rc = gf_mem_open(&m, GF_MEM_CUDA, device);
	if (rc < 0)
		fail_msg("gf_mem_open(cuda): %s: %s", gf_error_name(rc), gf_error_detail());
	return m;
}

static void expect_segv_reading(uint64_t addr)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		(void)*(volatile uint8_t *)(uintptr_t)addr;
		_exit(0);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGSEGV);
}

static void test_oom_on_create(void **state)
{
	(void)state;
	gf_mem *m = open_cuda(0);
	gf_mem_alloc *a = NULL, *b = NULL;
	uint64_t fr, tot;
	tu_env_set("FAKECUDA_OOM_AFTER_BYTES", "6291456"); /* 3 granules */
	assert_int_equal(gf_mem_create(&a, m, 2 * GRAN), 0);
	assert_int_equal(gf_mem_create(&b, m, 2 * GRAN), GF_ERR_OUT_OF_MEMORY);
	assert_null(b);
	assert_non_null(strstr(gf_error_detail(), "CUDA_ERROR_OUT_OF_MEMORY"));
	assert_non_null(strstr(gf_error_detail(), "cuMemCreate"));
	gf_mem_alloc_free(a);
	assert_int_equal(gf_mem_create(&b, m, 2 * GRAN), 0);
	gf_mem_alloc_free(b);

	/* The device's own size limits too. A real device's free figure is
	 * short of its total by what contexts take (hundreds of MiB, run under
	 * FAKECUDA_CTX_OVERHEAD too): free is checked with that slack. */
	tu_env_set("FAKECUDA_TOTAL_MEM", "1073741824");
	tu_env_set("FAKECUDA_OOM_AFTER_BYTES", NULL);
	assert_int_equal(gf_mem_info(m, &fr, &tot), 0);
	assert_int_equal(tot, 1073741824);
	assert_true(fr <= tot && fr >= tot - (512u << 20));
	assert_int_equal(gf_mem_create(&b, m, 513 * GRAN), GF_ERR_OUT_OF_MEMORY);
	gf_mem_free(m);
}

static void test_driver_error_is_named(void **state)
{
	(void)state;
	gf_mem *m = open_cuda(0);
	gf_mem_alloc *a = NULL;
	tu_env_set("FAKECUDA_FAIL", "cuMemCreate:1");
	assert_int_equal(gf_mem_create(&a, m, GRAN), GF_ERR_DRIVER);
	assert_non_null(strstr(gf_error_detail(), "CUDA_ERROR_UNKNOWN"));
	/* Only the nth call fails: errors are per call, never sticky. */
	assert_int_equal(gf_mem_create(&a, m, GRAN), 0);
	tu_env_set("FAKECUDA_FAIL", "cuMemExportToShareableHandle:1:801");
	int fd = -1;
	assert_int_equal(gf_mem_export(a, &fd), GF_ERR_DRIVER);
	assert_non_null(strstr(gf_error_detail(), "CUDA_ERROR_NOT_SUPPORTED"));
	assert_int_equal(fd, -1);
	tu_env_set("FAKECUDA_FAIL", "cuMemRelease:1");
	assert_int_equal(gf_mem_release(a), GF_ERR_DRIVER);
	assert_int_equal(gf_mem_alloc_state(a), GF_MEM_ALLOC_CREATED);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

/* A failure in the middle of a multi-allocation map leaves nothing mapped. */
static void run_map_many_failure(const char *knob, int expect)
{
	gf_mem *m = open_cuda(0);
	gf_mem_alloc *a[4] = { 0 };
	gf_mem_va *va = NULL;
	struct gf_mem_mapping maps[4];
	for (int i = 0; i < 4; i++) {
		assert_int_equal(gf_mem_create(&a[i], m, GRAN), 0);
		maps[i] = (struct gf_mem_mapping){ (size_t)i * GRAN, a[i] };
	}
	assert_int_equal(gf_mem_reserve(&va, m, 4 * GRAN, 0), 0);
	tu_env_set("FAKECUDA_FAIL", knob);
	assert_int_equal(gf_mem_map_many(va, maps, 4, GF_MEM_READWRITE), expect);
	for (int i = 0; i < 4; i++)
		assert_int_not_equal(gf_mem_alloc_state(a[i]), GF_MEM_ALLOC_MAPPED);
	expect_segv_reading(gf_mem_va_addr(va));
	/* Nothing left behind in the driver either: the same map now works. */
	tu_env_set("FAKECUDA_FAIL", NULL);
	assert_int_equal(gf_mem_map_many(va, maps, 4, GF_MEM_READWRITE), 0);
	memset((void *)(uintptr_t)gf_mem_va_addr(va), 1, 4 * GRAN);
	gf_mem_va_free(va);
	for (int i = 0; i < 4; i++)
		gf_mem_alloc_free(a[i]);
	gf_mem_free(m);
}

static void test_map_many_fails_midway(void **state)
{
	(void)state;
	run_map_many_failure("cuMemMap:3", GF_ERR_DRIVER);
	assert_non_null(strstr(gf_error_detail(), "cuMemMap"));
	run_map_many_failure("cuMemMap:2:2", GF_ERR_OUT_OF_MEMORY);
	run_map_many_failure("cuMemSetAccess:1", GF_ERR_DRIVER);
	assert_non_null(strstr(gf_error_detail(), "cuMemSetAccess"));
}

/* One contiguous span gets one cuMemSetAccess; a gap makes two. */
static void test_access_once_per_span(void **state)
{
	(void)state;
	gf_mem *m = open_cuda(0);
	gf_mem_alloc *a[3] = { 0 };
	gf_mem_va *va = NULL;
	for (int i = 0; i < 3; i++)
		assert_int_equal(gf_mem_create(&a[i], m, GRAN), 0);
	assert_int_equal(gf_mem_reserve(&va, m, 4 * GRAN, 0), 0);
	struct gf_mem_mapping span[3] = { { 0, a[0] }, { GRAN, a[1] }, { 2 * GRAN, a[2] } };
	/* A second cuMemSetAccess call would fail: one call for one span. */
	tu_env_set("FAKECUDA_FAIL", "cuMemSetAccess:2");
	assert_int_equal(gf_mem_map_many(va, span, 3, GF_MEM_READ), 0);
	assert_int_equal(gf_mem_unmap_all(va), 0);
	/* a different spelling of the same knob restarts its count */
	tu_env_set("FAKECUDA_FAIL", "cuMemSetAccess:2:999");
	struct gf_mem_mapping gap[3] = { { 0, a[0] }, { GRAN, a[1] }, { 3 * GRAN, a[2] } };
	assert_int_equal(gf_mem_map_many(va, gap, 3, GF_MEM_READ), GF_ERR_DRIVER);
	gf_mem_va_free(va);
	for (int i = 0; i < 3; i++)
		gf_mem_alloc_free(a[i]);
	gf_mem_free(m);
}

static void test_no_posix_fd(void **state)
{
	(void)state;
	gf_mem *m = NULL;
	tu_env_set("FAKECUDA_NO_POSIX_FD", "1");
	assert_int_equal(gf_mem_open(&m, GF_MEM_CUDA, 0), GF_ERR_NOT_SUPPORTED);
	assert_non_null(strstr(gf_error_detail(), "POSIX file descriptors"));
	tu_logged()[0] = '\0';
	gf_set_log_fn(tu_capture_log, (void *)"mem");
	assert_int_equal(gf_mem_open(&m, GF_MEM_AUTO, 0), 0);
	gf_set_log_fn(NULL, NULL);
	assert_int_equal(gf_mem_kind(m), GF_MEM_HOST);
	assert_non_null(strstr(tu_logged(), "backend=host"));
	assert_non_null(strstr(tu_logged(), "POSIX file descriptors"));
	gf_mem_free(m);
}

static void test_old_driver(void **state)
{
	(void)state;
	gf_mem *m = NULL;
	tu_env_set("FAKECUDA_DRIVER_VERSION", "11020");
	assert_int_equal(gf_mem_open(&m, GF_MEM_CUDA, 0), GF_ERR_NOT_SUPPORTED);
	assert_non_null(strstr(gf_error_detail(), "too old"));
	assert_non_null(strstr(gf_error_detail(), "11.2"));
	assert_null(m);
}

static void test_auto_picks_cuda(void **state)
{
	(void)state;
	gf_mem *m = NULL;
	tu_logged()[0] = '\0';
	gf_set_log_fn(tu_capture_log, (void *)"mem");
	assert_int_equal(gf_mem_open(&m, GF_MEM_AUTO, 0), 0);
	gf_set_log_fn(NULL, NULL);
	assert_int_equal(gf_mem_kind(m), GF_MEM_CUDA);
	assert_non_null(strstr(tu_logged(), "backend=cuda"));
	gf_mem_free(m);
}

/*
 * Context rule: a context the caller made current on our device is used as
 * is; otherwise the primary context is pushed and popped around each call,
 * leaving the caller's thread as it was.
 */
typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void test_context_left_as_found(void **state)
{
	(void)state;
	/* Opening the backend loads the driver this test then reaches into. */
	gf_mem *m = open_cuda(0);
	void *lib = dlopen(getenv("GF_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
	assert_non_null(lib);
	get_proc_fn gp = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
	assert_non_null(gp);
	CUresult (*get_current)(CUcontext *) = NULL;
	CUresult (*retain)(CUcontext *, CUdevice) = NULL;
	CUresult (*release)(CUdevice) = NULL;
	CUresult (*push)(CUcontext) = NULL;
	CUresult (*pop)(CUcontext *) = NULL;
	assert_int_equal(gp("cuCtxGetCurrent", (void **)&get_current, 12000, 0, NULL), CUDA_SUCCESS);
	assert_int_equal(gp("cuDevicePrimaryCtxRetain", (void **)&retain, 12000, 0, NULL), CUDA_SUCCESS);
	assert_int_equal(gp("cuDevicePrimaryCtxRelease", (void **)&release, 12000, 0, NULL), CUDA_SUCCESS);
	assert_int_equal(gp("cuCtxPushCurrent", (void **)&push, 12000, 0, NULL), CUDA_SUCCESS);
	assert_int_equal(gp("cuCtxPopCurrent", (void **)&pop, 12000, 0, NULL), CUDA_SUCCESS);

	CUcontext cur = (CUcontext)1, mine = NULL;
	uint64_t fr, tot;
	assert_int_equal(gf_mem_info(m, &fr, &tot), 0);
	assert_int_equal(get_current(&cur), CUDA_SUCCESS);
	assert_null(cur);

	assert_int_equal(retain(&mine, 0), CUDA_SUCCESS);
	assert_int_equal(push(mine), CUDA_SUCCESS);
	assert_int_equal(gf_mem_info(m, &fr, &tot), 0);
	assert_int_equal(gf_mem_synchronize(m), 0);
	assert_int_equal(get_current(&cur), CUDA_SUCCESS);
	assert_ptr_equal(cur, mine);
	assert_int_equal(pop(&cur), CUDA_SUCCESS);
	assert_int_equal(release(0), CUDA_SUCCESS);
	gf_mem_free(m);
	dlclose(lib);
}

int main(void)
{
	if (mt_fakecuda_state_dir() < 0)
		return 2;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_oom_on_create, clear_knobs),
		cmocka_unit_test_teardown(test_driver_error_is_named, clear_knobs),
		cmocka_unit_test_teardown(test_map_many_fails_midway, clear_knobs),
		cmocka_unit_test_teardown(test_access_once_per_span, clear_knobs),
		cmocka_unit_test_teardown(test_no_posix_fd, clear_knobs),
		cmocka_unit_test_teardown(test_old_driver, clear_knobs),
		cmocka_unit_test_teardown(test_auto_picks_cuda, clear_knobs),
		cmocka_unit_test_teardown(test_context_left_as_found, clear_knobs),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
