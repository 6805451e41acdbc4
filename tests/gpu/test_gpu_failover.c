/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The failover path on a GPU: gf-lockd, gf-gmsd on the cuda backend, a
 * loader (lock holder, weights committed to the GMS, private memory of its
 * own) and a sleeping follower, as separate processes. The loader is
 * SIGKILLed; the follower is granted the lock, and by then the loader's
 * memory is free again in the driver's accounting (the lock server grants
 * only once the holder's process is gone); it wakes at the same addresses
 * and reads the same bytes; and the GMS's allocation figure is what the
 * follower mapped. Bytes go through the driver's copies (device memory is
 * not host memory).
 *
 * On a machine without a GPU it exits 77 (SKIP), never a pass. With
 * GF_GPU_TEST_DRIVER=1 (the integration suite) the same program runs over
 * the test driver, so the scenario itself is exercised where there is no
 * GPU; the gpu suite runs it unchanged on the real driver.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cuda.h>
#include <jansson.h>

#include "gpufailover.h"

#define SKIP 77
#define NALLOC 2
#define ALLOC_BYTES (4u << 20)
#define PRIVATE_BYTES (64u << 20)

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static struct {
	CUresult (*retain)(CUcontext *, CUdevice);
	CUresult (*push)(CUcontext);
	CUresult (*stream_create)(CUstream *, unsigned);
	CUresult (*sync)(CUstream);
	CUresult (*htod)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*mem_info)(size_t *, size_t *);
	CUstream stream;
} drv;

static char dir[256], lock_uri[300], gms_uri[300];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* The copy and accounting calls, with a context current on this thread. */
static int setup_driver(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!lib && getenv("GF_LIBCUDA"))
		lib = dlopen(getenv("GF_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
	get_proc_fn gp = lib ? (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
	if (!gp)
		return -1;
	if (gp("cuDevicePrimaryCtxRetain", (void **)&drv.retain, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuCtxPushCurrent", (void **)&drv.push, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuStreamCreate", (void **)&drv.stream_create, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuStreamSynchronize", (void **)&drv.sync, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuMemcpyHtoDAsync", (void **)&drv.htod, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuMemcpyDtoHAsync", (void **)&drv.dtoh, 12000, 0, NULL) != CUDA_SUCCESS ||
	    gp("cuMemGetInfo", (void **)&drv.mem_info, 12000, 0, NULL) != CUDA_SUCCESS)
		return -1;
	CUcontext ctx;
	if (drv.retain(&ctx, 0) != CUDA_SUCCESS || drv.push(ctx) != CUDA_SUCCESS ||
	    drv.stream_create(&drv.stream, 0) != CUDA_SUCCESS)
		return -1;
	return 0;
}

static void die(const char *what, int rc)
{
	say("FAIL %s: %s: %s", what, gf_error_name(rc) ? gf_error_name(rc) : "?", gf_error_detail());
	_exit(1);
}

static void fill(uint8_t *buf, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = (uint8_t)((i * 2654435761u + seed * 97u) >> 13);
}

static size_t free_bytes(void)
{
	size_t f = 0, t = 0;
	if (drv.mem_info(&f, &t) != CUDA_SUCCESS)
		die("cuMemGetInfo", GF_ERR_DRIVER);
	return f;
}

/* Every allocation of @gms holds the bytes fill() wrote for its index. */
static void verify(gf_gms *gms, uint64_t *addrs)
{
	uint8_t *want = malloc(ALLOC_BYTES), *got = malloc(ALLOC_BYTES);
	if (!want || !got || gf_gms_alloc_count(gms) != NALLOC)
		die("verify: allocations", GF_ERR_STATE);
	for (size_t i = 0; i < NALLOC; i++) {
		struct gf_gms_alloc_info a;
		if (gf_gms_alloc_at(gms, i, &a) || !a.addr)
			die("verify: alloc_at", GF_ERR_STATE);
		if (addrs[i] && addrs[i] != a.addr) {
			say("FAIL allocation %zu woke at 0x%" PRIx64 ", not 0x%" PRIx64, i, a.addr, addrs[i]);
			_exit(1);
		}
		addrs[i] = a.addr;
		fill(want, ALLOC_BYTES, (unsigned)i);
		if (drv.dtoh(got, a.addr, ALLOC_BYTES, drv.stream) != CUDA_SUCCESS || drv.sync(drv.stream) != CUDA_SUCCESS)
			die("verify: copy to host", GF_ERR_DRIVER);
		if (memcmp(want, got, ALLOC_BYTES) != 0) {
			say("FAIL allocation %zu: bytes differ", i);
			_exit(1);
		}
	}
	free(want);
	free(got);
}

/* The loader: holds the lock, commits the weights, keeps private memory, waits to be killed. */
static int __attribute__((noreturn)) loader(void)
{
	gf_lock *l;
	struct gf_lock_grant g;
	int rc = gf_lock_new(&l, lock_uri, "loader");
	if (rc || (rc = gf_lock_acquire(l, 10000, &g)))
		die("lock", rc);
	gf_mem *m;
	gf_gms *gms;
	if ((rc = gf_mem_open(&m, GF_MEM_CUDA, 0)) || (rc = gf_gms_connect(&gms, gms_uri, m, GF_GMS_RW, 10000, NULL)))
		die("connect", rc);
	if (setup_driver()) /* the driver the library loaded */
		die("driver", GF_ERR_DRIVER);
	uint8_t *buf = malloc(ALLOC_BYTES);
	for (unsigned i = 0; i < NALLOC; i++) {
		uint64_t id;
		struct gf_gms_alloc_info a;
		char tag[16];
		snprintf(tag, sizeof(tag), "w%u", i);
		if ((rc = gf_gms_allocate(gms, ALLOC_BYTES, tag, &id)) || (rc = gf_gms_alloc_at(gms, i, &a)))
			die("allocate", rc);
		fill(buf, ALLOC_BYTES, i);
		if (drv.htod(a.addr, buf, ALLOC_BYTES, drv.stream) != CUDA_SUCCESS || drv.sync(drv.stream) != CUDA_SUCCESS)
			die("copy to device", GF_ERR_DRIVER);
	}
	free(buf);
	uint64_t gen;
	if ((rc = gf_gms_commit(gms, &gen)))
		die("commit", rc);
	/* Memory of its own, as an engine's KV cache: the driver gives it back
	 * only when this process is gone. */
	gf_mem_region *priv;
	if ((rc = gf_mem_region_new(&priv, m, PRIVATE_BYTES)))
		die("private memory", rc);
	say("loader ready");
	for (;;)
		pause();
}

/* The follower: imports, sleeps, waits for the lock, checks the takeover. */
static int follower(void)
{
	gf_mem *m;
	gf_gms *gms;
	int rc;
	if ((rc = gf_mem_open(&m, GF_MEM_CUDA, 0)) || setup_driver() || (rc = gf_gms_connect(&gms, gms_uri, m, GF_GMS_RO, 10000, NULL)) ||
	    (rc = gf_gms_map_all(gms)))
		die("import", rc);
	uint64_t addrs[NALLOC] = { 0 };
	verify(gms, addrs);
	if ((rc = gf_gms_unmap(gms)))
		die("sleep", rc);
	size_t free_alive = free_bytes();
	gf_lock *l;
	struct gf_lock_grant g;
	if ((rc = gf_lock_new(&l, lock_uri, "follower")))
		die("lock", rc);
	say("follower asleep");
	if ((rc = gf_lock_acquire(l, 60000, &g)))
		die("acquire", rc);
	/* Granted only once the loader's process is gone, so its private
	 * memory (and its context's) is already free. */
	size_t free_granted = free_bytes();
	if (free_granted < free_alive + PRIVATE_BYTES) {
		say("FAIL at the grant %zu bytes free, %zu while the loader lived: its %u private bytes are not back",
		    free_granted, free_alive, PRIVATE_BYTES);
		return 1;
	}
	if ((rc = gf_gms_remap(gms, 30000)))
		die("wake", rc);
	verify(gms, addrs);
	/* The GMS's figure is the memory the follower mapped. */
	char *js;
	if ((rc = gf_gms_status_json(gms_uri, 5000, &js)))
		die("status", rc);
	json_t *o = json_loads(js, 0, NULL);
	uint64_t mapped = 0;
	for (size_t i = 0; i < gf_gms_alloc_count(gms); i++) {
		struct gf_gms_alloc_info a;
		gf_gms_alloc_at(gms, i, &a);
		mapped += a.size;
	}
	json_int_t gms_bytes = json_integer_value(json_object_get(o, "allocation_bytes"));
	if (!o || gms_bytes != (json_int_t)mapped) {
		say("FAIL the GMS reports %lld allocated bytes, the follower mapped %" PRIu64, (long long)gms_bytes,
		    mapped);
		return 1;
	}
	json_decref(o);
	free(js);
	say("follower ok epoch=%" PRIu64 " freed=%zu", g.epoch, free_granted - free_alive);
	return 0;
}

static pid_t spawn(char *const argv[], int out_fd)
{
	pid_t pid = fork();
	if (pid == 0) {
		if (out_fd >= 0)
			dup2(out_fd, STDOUT_FILENO);
		execv(argv[0], argv);
		_exit(127);
	}
	return pid;
}

/* Waits until a line starting with @want comes from @f; false on EOF. */
static bool wait_line(FILE *f, const char *want)
{
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		fputs(line, stdout);
		if (strncmp(line, want, strlen(want)) == 0)
			return true;
	}
	return false;
}

static pid_t role(const char *name, FILE **out)
{
	int p[2];
	if (pipe(p) < 0)
		return -1;
	char *argv[] = { (char *)"/proc/self/exe", (char *)name, dir, NULL };
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return -1;
	self[n] = '\0';
	argv[0] = self;
	pid_t pid = spawn(argv, p[1]);
	close(p[1]);
	*out = fdopen(p[0], "r");
	return pid;
}

static int run(void)
{
	const char *lockd = getenv("GF_LOCKD"), *gmsd = getenv("GF_GMSD");
	if (!lockd || !gmsd) {
		say("FAIL GF_LOCKD and GF_GMSD must name the daemons");
		return 1;
	}
	char listen_l[320], listen_g[320], state[300];
	snprintf(listen_l, sizeof(listen_l), "--listen=%s", lock_uri);
	snprintf(state, sizeof(state), "--state-file=%s/lock.state", dir);
	snprintf(listen_g, sizeof(listen_g), "--listen=%s", gms_uri);
	char *la[] = { (char *)lockd, listen_l, state, (char *)"--exit-wait-timeout=30s", NULL };
	char *ga[] = { (char *)gmsd, listen_g, (char *)"--backend=cuda", (char *)"--device=0", NULL };
	pid_t pl = spawn(la, -1), pg = spawn(ga, -1), pa = -1, pb = -1;
	int status = 1;
	for (int i = 0; i < 500 && (gf_lock_ping(lock_uri, NULL, 0, 100) || gf_gms_ping(gms_uri, 100, NULL)); i++)
		usleep(20000);
	FILE *fa = NULL, *fb = NULL;
	pa = role("loader", &fa);
	if (!fa || !wait_line(fa, "loader ready"))
		goto out;
	pb = role("follower", &fb);
	if (!fb || !wait_line(fb, "follower asleep"))
		goto out;
	usleep(200000); /* the follower is waiting on the lock */
	kill(pa, SIGKILL);
	waitpid(pa, NULL, 0);
	pa = -1;
	bool ok = wait_line(fb, "follower ok");
	int ws;
	waitpid(pb, &ws, 0);
	pb = -1;
	status = ok && WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? 0 : 1;
out:
	for (pid_t *p = (pid_t[]){ pa, pb, pg, pl }, *end = p + 4; p < end; p++)
		if (*p > 0) {
			kill(*p, SIGKILL);
			waitpid(*p, NULL, 0);
		}
	if (fa)
		fclose(fa);
	if (fb)
		fclose(fb);
	say(status ? "FAIL the failover scenario" : "PASS the failover scenario");
	return status;
}

int main(int argc, char **argv)
{
	if (argc == 3) {
		snprintf(dir, sizeof(dir), "%s", argv[2]);
		snprintf(lock_uri, sizeof(lock_uri), "unix://%s/lock.sock", dir);
		snprintf(gms_uri, sizeof(gms_uri), "unix://%s/gms.sock", dir);
		return strcmp(argv[1], "loader") == 0 ? loader() : follower();
	}
	bool test_driver = getenv("GF_GPU_TEST_DRIVER") && !strcmp(getenv("GF_GPU_TEST_DRIVER"), "1");
	if (!test_driver)
		unsetenv("GF_LIBCUDA"); /* only the real driver counts */
	gf_mem *m = NULL;
	if (gf_mem_open(&m, GF_MEM_CUDA, 0) < 0) {
		say("SKIP: no usable GPU: %s", gf_error_detail());
		return SKIP;
	}
	gf_mem_free(m);
	Dl_info info;
	void *lib = dlopen(test_driver ? getenv("GF_LIBCUDA") : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void *sym = lib ? dlsym(lib, "cuGetProcAddress_v2") : NULL;
	bool is_fake = !sym || !dladdr(sym, &info) || strstr(info.dli_fname, "fakecuda");
	if (is_fake != test_driver) {
		say(test_driver ? "FAIL GF_GPU_TEST_DRIVER=1 but the driver is not the test driver"
				: "SKIP: the loaded libcuda.so.1 is the test driver, not a GPU driver");
		return test_driver ? 1 : SKIP;
	}
	snprintf(dir, sizeof(dir), "/tmp/gf-gpu-failover-XXXXXX");
	if (!mkdtemp(dir)) {
		say("FAIL mkdtemp: %s", strerror(errno));
		return 1;
	}
	if (test_driver)
		setenv("FAKECUDA_STATE_DIR", dir, 1); /* this scenario's accounting only */
	snprintf(lock_uri, sizeof(lock_uri), "unix://%s/lock.sock", dir);
	snprintf(gms_uri, sizeof(gms_uri), "unix://%s/gms.sock", dir);
	int rc = run();
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		say("note: could not remove %s", dir);
	return rc;
}
