/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The questions the test driver cannot answer (docs/memory.md, "Where a
 * real driver may be stricter"), asked of a real GPU: one scenario each,
 * every scenario in a process of its own (this program exec'd in a role),
 * each printing "QUESTION <name> OUTCOME <what the hardware did>". A
 * scenario fails only when the library's handling of the outcome it saw
 * is wrong; the outcome itself is the answer. Exits 77 (SKIP) unless the
 * real driver works with a device.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "gpu_driver.h"
#include "gpufailover.h"

#define SKIP GPU_SKIP
#define SIZE (2u * 1024 * 1024)

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static struct {
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*retain)(CUcontext *, CUdevice);
	CUresult (*push)(CUcontext);
	CUresult (*mem_info)(size_t *, size_t *);
	CUresult (*unmap)(CUdeviceptr, size_t);
	CUresult (*module_load)(CUmodule *, const void *);
	CUresult (*get_function)(CUfunction *, CUmodule, const char *);
	CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
			   void **, void **);
	CUresult (*sync)(void);
	CUresult (*can_access_peer)(int *, CUdevice, CUdevice);
	CUresult (*error_name)(CUresult, const char **);
} drv;

/* One store of 1 to the address it is given: a device-side write. */
static const char ptx[] = ".version 7.0\n.target sm_50\n.address_size 64\n"
			  ".visible .entry store1(.param .u64 p)\n{\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n"
			  "ld.param.u64 %rd1, [p];\nmov.u32 %r1, 1;\nst.global.u32 [%rd1], %r1;\nret;\n}\n";

static const char *name_of(CUresult r)
{
	const char *n = NULL;
	if (drv.error_name(r, &n) != CUDA_SUCCESS || !n)
		return "unnamed";
	return n;
}

#define Q(question, ...)                                   \
	do {                                               \
		printf("QUESTION %s OUTCOME ", question);  \
		printf(__VA_ARGS__);                       \
		printf("\n");                              \
		fflush(stdout);                            \
	} while (0)
#define NEED(cond)                                                                                      \
	do {                                                                                            \
		if (!(cond)) {                                                                          \
			printf("FAIL %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, gf_error_detail()); \
			return 1;                                                                       \
		}                                                                                       \
	} while (0)

/* Open device 0 and make its primary context current, so the raw driver
 * calls below and the library's share it. */
static int open_dev(gf_mem **m, int device)
{
	void *lib = NULL;
	get_proc_fn gp = NULL;
	if (gf_mem_open(m, GF_MEM_CUDA, device) < 0 || !(lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) ||
	    !(gp = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2")))
		return -1;
	struct {
		const char *name;
		void **slot;
	} t[] = {
		{ "cuMemcpyHtoD", (void **)&drv.htod },	   { "cuMemcpyDtoH", (void **)&drv.dtoh },
		{ "cuDevicePrimaryCtxRetain", (void **)&drv.retain }, { "cuCtxPushCurrent", (void **)&drv.push },
		{ "cuMemGetInfo", (void **)&drv.mem_info }, { "cuMemUnmap", (void **)&drv.unmap },
		{ "cuModuleLoadData", (void **)&drv.module_load }, { "cuModuleGetFunction", (void **)&drv.get_function },
		{ "cuLaunchKernel", (void **)&drv.launch },	   { "cuCtxSynchronize", (void **)&drv.sync },
		{ "cuDeviceCanAccessPeer", (void **)&drv.can_access_peer }, { "cuGetErrorName", (void **)&drv.error_name },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (gp(t[i].name, t[i].slot, 12000, 0, NULL) != CUDA_SUCCESS)
			return -1;
	CUcontext ctx;
	return drv.retain(&ctx, device) == CUDA_SUCCESS && drv.push(ctx) == CUDA_SUCCESS ? 0 : -1;
}

/* Launch store1 at @addr; the launch's own result (faults show at sync). */
static CUresult store_kernel(uint64_t addr)
{
	CUmodule mod;
	CUfunction fn;
	CUresult r = drv.module_load(&mod, ptx);
	if (r == CUDA_SUCCESS)
		r = drv.get_function(&fn, mod, "store1");
	CUdeviceptr p = addr;
	void *args[] = { &p };
	if (r == CUDA_SUCCESS)
		r = drv.launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
	return r;
}

static int map_new(gf_mem *m, int access, gf_mem_alloc **a, gf_mem_va **va)
{
	if (gf_mem_create(a, m, SIZE) < 0 || gf_mem_reserve(va, m, SIZE, 0) < 0 ||
	    gf_mem_map(*va, 0, *a, access) < 0)
		return -1;
	return 0;
}

/* 1. After a device fault: is the error sticky, do unmap/release still work? */
static int role_sticky(void)
{
	gf_mem *m = NULL;
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	NEED(open_dev(&m, 0) == 0 && map_new(m, GF_MEM_READWRITE, &a, &va) == 0);
	CUresult launch = store_kernel(8); /* an address nothing maps */
	CUresult sync = drv.sync();
	size_t f, t;
	CUresult after = drv.mem_info(&f, &t);
	CUresult unmap = drv.unmap(gf_mem_va_addr(va), SIZE);
	Q("sticky", "launch=%s sync=%s next_call=%s raw_unmap=%s", name_of(launch), name_of(sync), name_of(after),
	  name_of(unmap));
	int rc = gf_mem_synchronize(m);
	NEED(sync == CUDA_SUCCESS || (rc < 0 && gf_mem_device_lost(m) == 1));
	/* The library's teardown finishes whatever the driver does. */
	gf_mem_unmap_all(va);
	gf_mem_alloc_free(a);
	gf_mem_va_free(va);
	gf_mem_free(m);
	return 0;
}

/* 2. Does PROT_READ hold on device memory, for copies and for kernels? */
static int role_readonly(void)
{
	gf_mem *m = NULL;
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	NEED(open_dev(&m, 0) == 0 && map_new(m, GF_MEM_READ, &a, &va) == 0);
	int prot = gf_mem_read_protection(m);
	uint32_t one = 1;
	CUresult copy = drv.htod(gf_mem_va_addr(va), &one, sizeof(one));
	CUresult launch = store_kernel(gf_mem_va_addr(va));
	CUresult sync = drv.sync();
	Q("readonly", "library=%s copy_engine_write=%s kernel_write_launch=%s kernel_write_sync=%s",
	  gf_mem_read_protection_name(prot), name_of(copy), name_of(launch), name_of(sync));
	NEED(prot != GF_MEM_READ_PROT_UNTESTED);
	gf_mem_synchronize(m);
	gf_mem_unmap_all(va);
	gf_mem_alloc_free(a);
	gf_mem_va_free(va);
	gf_mem_free(m);
	return 0;
}

/* 3. fork() after the driver is loaded. */
static int role_fork(void)
{
	gf_mem *m = NULL;
	NEED(open_dev(&m, 0) == 0);
	fflush(NULL);
	pid_t pid = fork();
	NEED(pid >= 0);
	if (pid == 0) {
		gf_mem_alloc *a = NULL;
		int inherited = gf_mem_create(&a, m, SIZE);
		gf_mem *cm = NULL;
		int rc = gf_mem_open(&cm, GF_MEM_CUDA, 0);
		Q("fork", "inherited_backend=%s child_open=%s detail=\"%s\"", gf_error_name(inherited) ?: "ok",
		  gf_error_name(rc) ?: "ok", rc < 0 ? gf_error_detail() : "");
		if (rc == 0 && gf_mem_create(&a, cm, SIZE) == 0)
			gf_mem_alloc_free(a);
		_exit(inherited == GF_ERR_STATE ? 0 : 1);
	}
	int st;
	NEED(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	gf_mem_free(m);
	return 0;
}

static const char *self_exe = "/proc/self/exe";

/* The creator role: allocate, fill with 0x5a, send the fd, wait for a byte. */
static int role_creator(int sock)
{
	gf_mem *m = NULL;
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	int fd;
	NEED(open_dev(&m, 0) == 0 && map_new(m, GF_MEM_READWRITE, &a, &va) == 0);
	static uint8_t buf[SIZE];
	memset(buf, 0x5a, sizeof(buf));
	NEED(drv.htod(gf_mem_va_addr(va), buf, SIZE) == CUDA_SUCCESS && gf_mem_synchronize(m) == 0);
	NEED(gf_mem_export(a, &fd) == 0);
	char b = 'f';
	struct iovec iov = { &b, 1 };
	union {
		struct cmsghdr h;
		char c[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof(u));
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.c, .msg_controllen = sizeof(u.c) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	NEED(sendmsg(sock, &msg, 0) == 1);
	NEED(read(sock, &b, 1) >= 0);
	return 0;
}

static pid_t spawn_creator(int *sock, int *fd)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -1;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		char s[16];
		fcntl(sv[1], F_SETFD, 0);
		snprintf(s, sizeof(s), "%d", sv[1]);
		execl(self_exe, self_exe, "role", "creator", s, (char *)NULL);
		_exit(127);
	}
	close(sv[1]);
	char b;
	struct iovec iov = { &b, 1 };
	union {
		struct cmsghdr h;
		char c[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.c, .msg_controllen = sizeof(u.c) };
	struct cmsghdr *c;
	if (recvmsg(sv[0], &msg, MSG_CMSG_CLOEXEC) != 1 || !(c = CMSG_FIRSTHDR(&msg)))
		return -1;
	memcpy(fd, CMSG_DATA(c), sizeof(int));
	*sock = sv[0];
	return pid;
}

static bool reap(pid_t pid, int sock)
{
	int st;
	bool ok = write(sock, "x", 1) == 1 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && !WEXITSTATUS(st);
	close(sock);
	return ok;
}

static const char *data_state(gf_mem_va *va)
{
	uint8_t b[2] = { 0, 0 };
	if (drv.dtoh(b, gf_mem_va_addr(va), 1) != CUDA_SUCCESS ||
	    drv.dtoh(b + 1, gf_mem_va_addr(va) + SIZE - 1, 1) != CUDA_SUCCESS)
		return "unreadable";
	return b[0] == 0x5a && b[1] == 0x5a ? "intact" : "changed";
}

/* 4. The exporting process dies: before the import, and after the mapping. */
static int role_exporter_dies(void)
{
	gf_mem *m = NULL;
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	int sock, fd;
	NEED(open_dev(&m, 0) == 0);
	pid_t pid = spawn_creator(&sock, &fd);
	NEED(pid > 0 && reap(pid, sock));
	int rc = gf_mem_import(&a, m, fd, SIZE);
	close(fd);
	const char *data = "-";
	if (rc == 0) {
		NEED(gf_mem_reserve(&va, m, SIZE, 0) == 0 && gf_mem_map(va, 0, a, GF_MEM_READ) == 0);
		data = data_state(va);
		gf_mem_va_free(va);
		gf_mem_alloc_free(a);
	}
	Q("exporter_died_before_import", "import=%s data=%s", gf_error_name(rc) ?: "ok", data);

	pid = spawn_creator(&sock, &fd);
	NEED(pid > 0);
	NEED(gf_mem_import(&a, m, fd, SIZE) == 0);
	close(fd);
	NEED(gf_mem_reserve(&va, m, SIZE, 0) == 0 && gf_mem_map(va, 0, a, GF_MEM_READ) == 0);
	NEED(reap(pid, sock));
	const char *mapped = data_state(va);
	NEED(gf_mem_unmap_all(va) == 0);
	rc = gf_mem_map(va, 0, a, GF_MEM_READ);
	Q("exporter_died_after_map", "mapping=%s remap=%s remapped_data=%s", mapped, gf_error_name(rc) ?: "ok",
	  rc == 0 ? data_state(va) : "-");
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
	return 0;
}

/* 5. Device identity: MIG spelling, import on another device, peer access. */
static int role_identity(void)
{
	struct gf_device_info d[16];
	size_t n = 0;
	NEED(gf_device_list(GF_MEM_CUDA, d, 16, &n) == 0);
	for (size_t i = 0; i < n && i < 16; i++)
		Q("identity", "index=%d uuid=%s mig=%d name=\"%s\" total=%llu free=%llu", d[i].index, d[i].uuid, d[i].mig,
		  d[i].name, (unsigned long long)d[i].total_bytes, (unsigned long long)d[i].free_bytes);
	const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
	Q("identity_visible", "CUDA_VISIBLE_DEVICES=\"%s\" devices=%zu", cvd ? cvd : "(unset)", n);
	if (n < 2)
		return 0;
	gf_mem *m0 = NULL, *m1 = NULL;
	gf_mem_alloc *a = NULL, *b = NULL;
	int fd, peer = -1;
	NEED(open_dev(&m0, 0) == 0 && gf_mem_open(&m1, GF_MEM_CUDA, 1) == 0);
	drv.can_access_peer(&peer, 1, 0);
	NEED(gf_mem_create(&a, m0, SIZE) == 0 && gf_mem_export(a, &fd) == 0);
	int rc = gf_mem_import(&b, m1, fd, SIZE);
	Q("identity_cross_device_import", "peer_access=%d library=%s", peer, gf_error_name(rc) ?: "accepted");
	NEED(rc == GF_ERR_INVALID_ARG);
	close(fd);
	gf_mem_alloc_free(a);
	gf_mem_free(m1);
	gf_mem_free(m0);
	return 0;
}

/* 6. Driver version, and what a context costs in cuMemGetInfo. */
static int role_smaller(void)
{
	size_t before_f = 0, t = 0;
	struct gf_device_info d;
	size_t n = 0;
	NEED(gf_device_list(GF_MEM_CUDA, &d, 1, &n) == 0);
	before_f = d.free_bytes;
	gf_mem *m = NULL;
	NEED(open_dev(&m, 0) == 0);
	size_t f = 0;
	NEED(drv.mem_info(&f, &t) == CUDA_SUCCESS);
	Q("memory_info", "total=%zu free_with_context=%zu listed_free=%zu total_minus_free=%zu", t, f, before_f, t - f);
	gf_mem_free(m);
	return 0;
}

static int run_role(const char *role)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		execl(self_exe, self_exe, "role", role, (char *)NULL);
		_exit(127);
	}
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return 1;
	int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	printf("%s %s (exit %d)\n", rc ? "FAILED" : "done", role, rc);
	return rc != 0;
}

int main(int argc, char **argv)
{
	unsetenv("GF_LIBCUDA"); /* only the real driver answers */
	if (argc >= 3 && strcmp(argv[1], "role") == 0) {
		const char *r = argv[2];
		return !strcmp(r, "sticky")	    ? role_sticky()
		       : !strcmp(r, "readonly")	    ? role_readonly()
		       : !strcmp(r, "fork")	    ? role_fork()
		       : !strcmp(r, "exporter")     ? role_exporter_dies()
		       : !strcmp(r, "identity")     ? role_identity()
		       : !strcmp(r, "smaller")	    ? role_smaller()
		       : !strcmp(r, "creator") && argc == 4 ? role_creator(atoi(argv[3]))
							    : 2;
	}
	if (!gpu_real_driver())
		return SKIP;
	int failed = 0;
	/* The fault scenario last: a device-side fault may upset the GPU. */
	static const char *const roles[] = { "identity", "smaller", "readonly", "fork", "exporter", "sticky" };
	for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
		failed += run_role(roles[i]);
	return failed ? 1 : 0;
}
