/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where a real driver may be stricter than the test driver's default, each
 * behaviour as a knob of the test driver and the library's answer to it:
 * sticky errors, read-only mappings enforced / rejected / ignored, fork
 * after the driver is loaded, the exporting process's death, error codes
 * the driver cannot name, the minimum driver version.
 */
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>

#include "forkcase.h"
#include "../common/testutil.h"

#define GRAN (2u * 1024 * 1024)

static gf_mem *open_cuda(void)
{
	gf_mem *m = NULL;
	CHECK(gf_mem_open(&m, GF_MEM_CUDA, 0) == 0);
	return m;
}

/* Does writing a byte at @addr fault? (in a grandchild) */
static bool write_faults(uint64_t addr)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		*(volatile uint8_t *)(uintptr_t)addr = 1;
		_exit(0);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	return WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV;
}

/* After a sticky fault every call fails, and teardown still completes. */
static void case_sticky(void)
{
	gf_mem *m = open_cuda();
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	CHECK(gf_mem_create(&a, m, GRAN) == 0);
	CHECK(gf_mem_reserve(&va, m, GRAN, 0) == 0);
	CHECK(gf_mem_map(va, 0, a, GF_MEM_READWRITE) == 0);
	CHECK(gf_mem_device_lost(m) == 0);
	tu_env_set("FAKECUDA_FAIL", "cuCtxSynchronize:1:700");
	/* 700 is unknown to the test driver's cuGetErrorName: named from cuda.h. */
	CHECK_ERR(gf_mem_synchronize(m), GF_ERR_DRIVER, "CUDA_ERROR_ILLEGAL_ADDRESS (700)");
	CHECK(gf_mem_device_lost(m) == 1);
	uint64_t fr, tot;
	CHECK_ERR(gf_mem_info(m, &fr, &tot), GF_ERR_DRIVER, "device lost: an earlier CUDA_ERROR_ILLEGAL_ADDRESS is sticky");
	gf_mem_alloc *b = NULL;
	CHECK_ERR(gf_mem_create(&b, m, GRAN), GF_ERR_DRIVER, "the process must exit");
	/* The loss path: unmap, release, free all finish. */
	CHECK(gf_mem_unmap_all(va) == 0);
	CHECK(gf_mem_alloc_state(a) == GF_MEM_ALLOC_UNMAPPED);
	gf_mem_alloc_free(a);
	gf_mem_va_free(va);
	gf_mem_free(m);
}

static void test_sticky(void **state)
{
	(void)state;
	/* The library treats the code as sticky whether or not the driver does. */
	run_case(case_sticky, (const char *const[]){ "FAKECUDA_STICKY=1", NULL });
	run_case(case_sticky, (const char *const[]){ "FAKECUDA_STICKY", NULL });
}

static int want_prot;

static void case_readonly(void)
{
	gf_mem *m = open_cuda();
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	CHECK(gf_mem_read_protection(m) == GF_MEM_READ_PROT_UNTESTED);
	char *log = tu_logged();
	gf_set_log_fn(tu_capture_log, "mem");
	CHECK(gf_mem_create(&a, m, GRAN) == 0);
	CHECK(gf_mem_reserve(&va, m, GRAN, 0) == 0);
	CHECK(gf_mem_map(va, 0, a, GF_MEM_READ) == 0);
	CHECK(gf_mem_read_protection(m) == want_prot);
	CHECK(write_faults(gf_mem_va_addr(va)) == (want_prot == GF_MEM_READ_PROT_ENFORCED));
	if (want_prot != GF_MEM_READ_PROT_ENFORCED)
		CHECK(strstr(log, gf_mem_read_protection_name(want_prot)) && strstr(log, "not caught"));
	/* A second read-only mapping gives the same answer. */
	CHECK(gf_mem_unmap_all(va) == 0);
	CHECK(gf_mem_map(va, 0, a, GF_MEM_READ) == 0);
	CHECK(gf_mem_read_protection(m) == want_prot);
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
	gf_set_log_fn(NULL, NULL);
}

static void test_readonly(void **state)
{
	(void)state;
	want_prot = GF_MEM_READ_PROT_ENFORCED;
	run_case(case_readonly, (const char *const[]){ "FAKECUDA_READONLY", NULL });
	run_case(case_readonly, (const char *const[]){ "FAKECUDA_READONLY=enforce", NULL });
	want_prot = GF_MEM_READ_PROT_REJECTED;
	run_case(case_readonly, (const char *const[]){ "FAKECUDA_READONLY=reject", NULL });
	want_prot = GF_MEM_READ_PROT_IGNORED;
	run_case(case_readonly, (const char *const[]){ "FAKECUDA_READONLY=ignore", NULL });
	CHECK(strcmp(gf_mem_read_protection_name(GF_MEM_READ_PROT_IGNORED), "ignored") == 0);
}

static bool fork_unsafe;

static void case_fork(void)
{
	gf_mem *m = open_cuda();
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* The parent's backend is never the child's. */
		gf_mem_alloc *a = NULL;
		CHECK_ERR(gf_mem_create(&a, m, GRAN), GF_ERR_STATE, "is a forked child and cannot use");
		gf_mem *cm = NULL;
		int rc = gf_mem_open(&cm, GF_MEM_CUDA, 0);
		if (fork_unsafe) {
			CHECK_ERR(rc, GF_ERR_STATE, "forked child: pid");
			CHECK(strstr(gf_error_detail(), "CUDA_ERROR_NOT_INITIALIZED"));
		} else {
			CHECK(rc == 0);
			CHECK(gf_mem_create(&a, cm, GRAN) == 0);
			gf_mem_alloc_free(a);
			gf_mem_free(cm);
		}
		gf_mem_free(m); /* dropping the inherited backend is fine */
		_exit(0);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	gf_mem_alloc *a = NULL;
	CHECK(gf_mem_create(&a, m, GRAN) == 0);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

static void test_fork(void **state)
{
	(void)state;
	fork_unsafe = false;
	run_case(case_fork, (const char *const[]){ "FAKECUDA_FORK_UNSAFE", NULL });
	fork_unsafe = true;
	run_case(case_fork, (const char *const[]){ "FAKECUDA_FORK_UNSAFE=1", NULL });
}

static bool revoking;

static void send_one_fd(int s, int fd)
{
	char byte = 'f';
	struct iovec iov = { &byte, 1 };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof(u));
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	CHECK(sendmsg(s, &msg, 0) == 1);
}

static int recv_alloc_fd(int s)
{
	char byte;
	struct iovec iov = { &byte, 1 };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	CHECK(recvmsg(s, &msg, MSG_CMSG_CLOEXEC) == 1);
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	CHECK(c && c->cmsg_type == SCM_RIGHTS);
	int fd;
	memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

/* A creator process makes an allocation, writes 0x5a, sends its fd and
 * waits for a byte on @sv[1] before exiting. */
static pid_t spawn_creator(int sv[2])
{
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		gf_mem *m = open_cuda();
		gf_mem_alloc *a = NULL;
		gf_mem_va *va = NULL;
		int fd = -1;
		CHECK(gf_mem_create(&a, m, GRAN) == 0 && gf_mem_reserve(&va, m, GRAN, 0) == 0);
		CHECK(gf_mem_map(va, 0, a, GF_MEM_READWRITE) == 0);
		memset((void *)(uintptr_t)gf_mem_va_addr(va), 0x5a, GRAN);
		CHECK(gf_mem_export(a, &fd) == 0);
		send_one_fd(sv[1], fd);
		char c;
		CHECK(read(sv[1], &c, 1) >= 0);
		_exit(0);
	}
	close(sv[1]);
	return pid;
}

static void reap(pid_t pid, int s)
{
	CHECK(write(s, "x", 1) == 1);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(s);
}

static void case_exporter_dies(void)
{
	/* Killed before the import: its fd is still queued here. */
	int sv[2];
	pid_t pid = spawn_creator(sv);
	int fd = recv_alloc_fd(sv[0]);
	reap(pid, sv[0]);
	gf_mem *m = open_cuda();
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	int rc = gf_mem_import(&a, m, fd, GRAN);
	close(fd);
	if (revoking) {
		CHECK_ERR(rc, GF_ERR_INVALID_ARG, "its exporting process has exited");
	} else {
		CHECK(rc == 0 && gf_mem_reserve(&va, m, GRAN, 0) == 0 && gf_mem_map(va, 0, a, GF_MEM_READ) == 0);
		CHECK(((volatile uint8_t *)(uintptr_t)gf_mem_va_addr(va))[GRAN - 1] == 0x5a);
		gf_mem_va_free(va);
		gf_mem_alloc_free(a);
		va = NULL;
	}

	/* Killed after the mapping: the mapping stays readable; mapping again
	 * (a remap) is what a revoking driver refuses. */
	pid = spawn_creator(sv);
	fd = recv_alloc_fd(sv[0]);
	CHECK(gf_mem_import(&a, m, fd, GRAN) == 0);
	close(fd);
	CHECK(gf_mem_reserve(&va, m, GRAN, 0) == 0 && gf_mem_map(va, 0, a, GF_MEM_READ) == 0);
	reap(pid, sv[0]);
	CHECK(((volatile uint8_t *)(uintptr_t)gf_mem_va_addr(va))[0] == 0x5a);
	CHECK(gf_mem_unmap_all(va) == 0);
	rc = gf_mem_map(va, 0, a, GF_MEM_READ);
	if (revoking)
		CHECK_ERR(rc, GF_ERR_DRIVER, "CUDA_ERROR_INVALID_HANDLE");
	else
		CHECK(rc == 0 && ((volatile uint8_t *)(uintptr_t)gf_mem_va_addr(va))[0] == 0x5a);
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

static void test_exporter_dies(void **state)
{
	(void)state;
	revoking = false;
	run_case(case_exporter_dies, (const char *const[]){ "FAKECUDA_REVOKE", NULL });
	revoking = true;
	run_case(case_exporter_dies, (const char *const[]){ "FAKECUDA_REVOKE=1", NULL });
}

static void case_unknown_code(void)
{
	gf_mem *m = open_cuda();
	gf_mem_alloc *a = NULL;
	tu_env_set("FAKECUDA_FAIL", "cuMemCreate:1:222");
	CHECK_ERR(gf_mem_create(&a, m, GRAN), GF_ERR_DRIVER, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)");
	tu_env_set("FAKECUDA_FAIL", "cuMemCreate:1:4242");
	CHECK_ERR(gf_mem_create(&a, m, GRAN), GF_ERR_DRIVER, "CUDA error 4242 (4242)");
	CHECK(gf_mem_device_lost(m) == 0);
	gf_mem_free(m);
}

static void test_unknown_code(void **state)
{
	(void)state;
	run_case(case_unknown_code, NULL);
}

static void case_minimum_driver(void)
{
	gf_mem *m = NULL;
	tu_env_set("FAKECUDA_DRIVER_VERSION", "11080");
	CHECK_ERR(gf_mem_open(&m, GF_MEM_CUDA, 0), GF_ERR_NOT_SUPPORTED, "too old: version 11.8, needs >= 12.0");
	tu_env_set("FAKECUDA_DRIVER_VERSION", "12000");
	CHECK(gf_mem_open(&m, GF_MEM_CUDA, 0) == 0);
	gf_mem_free(m);
}

static void test_minimum_driver(void **state)
{
	(void)state;
	run_case(case_minimum_driver, NULL);
}

int main(void)
{
	char *dir = tu_tmpdir();
	setenv("FAKECUDA_STATE_DIR", dir, 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sticky),       cmocka_unit_test(test_readonly),
		cmocka_unit_test(test_fork),         cmocka_unit_test(test_exporter_dies),
		cmocka_unit_test(test_unknown_code), cmocka_unit_test(test_minimum_driver),
	};
	int rc = tu_run_group_tests(tests, NULL, NULL);
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	free(dir);
	return rc;
}
