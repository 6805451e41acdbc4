/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A test-only CUDA driver (built as libcuda.so.1, never installed) that
 * implements exactly the driver entry points lib/mem/cuda.c uses, so CI
 * exercises the cuda backend without a GPU.
 *
 * Memory: each allocation is a file in $FAKECUDA_STATE_DIR (a tmpfs
 * directory; default /dev/shm/fakecuda-<uid>) that is never touched by
 * name after creation, so it behaves as a memfd: export hands out a dup of
 * its fd, import keeps a dup, and the kernel keeps the pages until the last
 * fd and the last mapping in every process are gone. The file name is what
 * makes accounting true across processes: the creator takes a shared flock
 * on the open file, which every dup, every fd passed over SCM_RIGHTS and
 * every mapping shares; cuMemGetInfo counts the files whose lock is still
 * held anywhere (a free one is dead and is removed). This is the driver's
 * Decision 7 behaviour, observable: creator releases while an importer
 * holds → still used; importer releases → freed.
 *
 * "Device addresses" are host addresses in PROT_NONE reservations, so tests
 * read and write them through the pointer; cuMemSetAccess is mprotect.
 *
 * Devices: CUdevice values are visible ordinals; allocation files and
 * UUIDs use the physical index, so processes with different
 * CUDA_VISIBLE_DEVICES share the accounting as on a real node.
 *
 * Fault knobs (read on every call, so a test may change them with setenv):
 *   FAKECUDA_DEVICES=N           number of physical devices (default 1, max 16)
 *   CUDA_VISIBLE_DEVICES         read at cuInit as the driver does: indices or
 *                                GPU-/MIG- UUIDs (unique prefixes), comma
 *                                separated; the list ends at the first invalid,
 *                                ambiguous or repeated entry
 *   FAKECUDA_TOTAL_MEM=b[,b...]  memory of physical device 0, 1, ... (the last
 *                                value repeats; default 16 GiB)
 *   FAKECUDA_CTX_OVERHEAD=bytes  cuMemGetInfo's free figure drops by this much
 *                                per retained primary context (a real context
 *                                costs a few hundred MiB)
 *   FAKECUDA_PEER_ACCESS=1       devices can access each other's memory
 *                                (cuDeviceCanAccessPeer); without it, access
 *                                to another device's allocation is refused
 *   FAKECUDA_MIG=1               devices are MIG instances: "... MIG 1g.10gb"
 *                                names and their own UUIDs
 *   FAKECUDA_STICKY=1            an injected fault with a sticky code (700,
 *                                710, 714-719, 214) poisons the process: every
 *                                later call but the device queries fails with it
 *   FAKECUDA_LOSE_CONTEXT=path   once the file @path exists, the process's context is
 *                                lost: the next call (and every later one that
 *                                needs a context) returns CUDA_ERROR_ILLEGAL_ADDRESS,
 *                                as after a kernel's fault (a loss at run time)
 *   FAKECUDA_FORK_UNSAFE=1       in a child forked after cuInit, every call
 *                                (cuInit too) is CUDA_ERROR_NOT_INITIALIZED ("initialization error")
 *   FAKECUDA_READONLY=enforce|reject|ignore  what PROT_READ does: mprotect
 *                                (default), CUDA_ERROR_INVALID_VALUE, or
 *                                accepted but mapped and reported read-write
 *   FAKECUDA_REVOKE=1            an allocation whose creating process has
 *                                exited can no longer be imported or mapped
 *   FAKECUDA_OOM_AFTER_BYTES=N   cuMemCreate fails OUT_OF_MEMORY past N used bytes
 *   FAKECUDA_NO_POSIX_FD=1       devices lack POSIX-fd handle support
 *   FAKECUDA_DRIVER_VERSION=N    what cuDriverGetVersion reports (default 13000)
 *   FAKECUDA_FAIL=name:nth[:code][,...]  the nth call (from 1, counted from when
 *                                the value was set) of entry point `name` returns
 *                                `code` (default CUDA_ERROR_UNKNOWN)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda.h"
#include "fakecuda_copy.h"

#undef cuGetProcAddress

#define FK_EXPORT __attribute__((visibility("default")))

pthread_mutex_t fk_lock = PTHREAD_MUTEX_INITIALIZER;
bool fk_initialized;
static struct CUctx_st primary[FK_MAX_DEV];
/* Physical index of each visible ordinal, fixed at cuInit. */
static int visible[FK_MAX_DEV];
static int nvisible;
static pid_t init_pid;
static CUresult sticky_code;
static _Thread_local CUcontext ctx_stack[64];
static _Thread_local int ctx_depth;

struct fk_range {
	uintptr_t p;
	size_t size;
	unsigned long long access; /* mappings: the flags cuMemGetAccess reports */
	int creator;               /* mappings: pid that created the allocation */
	int dev;                   /* mappings: device (ordinal) of the allocation */
};
static struct fk_alloc *allocs;
static size_t nallocs, cap_allocs;
static CUmemGenericAllocationHandle next_handle = 0x1000;
static struct fk_range *resv, *maps;
static size_t nresv, cap_resv, nmaps, cap_maps;
static unsigned long long file_seq;

/* ---- knobs ---- */

long long fk_env_ll(const char *name, long long dflt)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return dflt;
	char *end;
	long long x = strtoll(v, &end, 0);
	return *end ? dflt : x;
}

static int nphysical(void)
{
	long long n = fk_env_ll("FAKECUDA_DEVICES", 1);
	return n < 0 ? 0 : n > FK_MAX_DEV ? FK_MAX_DEV : (int)n;
}

int fk_ndevices(void)
{
	/* Before cuInit nothing is visible; the count is read then. */
	return fk_initialized ? nvisible : nphysical();
}

/* GPU-fa4ec0da-0000-4000-8000-0000000000NN (MIG: 3f1c0000-...-NN): all
 * devices share the first group, so short prefixes are ambiguous as on a
 * real multi-GPU node. */
static void phys_uuid(int phys, unsigned char out[16])
{
	static const unsigned char base[16] = { 0xfa, 0x4e, 0xc0, 0xda, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0 };
	memcpy(out, base, 16);
	if (fk_env_ll("FAKECUDA_MIG", 0)) {
		out[0] = 0x3f;
		out[1] = 0x1c;
		out[2] = 0;
		out[3] = 0;
	}
	out[15] = (unsigned char)phys;
}

static void format_uuid(int phys, char *buf, size_t len)
{
	unsigned char u[16];
	phys_uuid(phys, u);
	snprintf(buf, len, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 fk_env_ll("FAKECUDA_MIG", 0) ? "MIG" : "GPU", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8],
		 u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* The physical device an entry of CUDA_VISIBLE_DEVICES names, -1 if none
 * or more than one. */
static int parse_visible_entry(const char *e, int nphys)
{
	if (!*e)
		return -1;
	if (strspn(e, "0123456789") == strlen(e)) {
		long v = strlen(e) > 4 ? -1 : strtol(e, NULL, 10);
		return v >= 0 && v < nphys ? (int)v : -1;
	}
	if (strncasecmp(e, "GPU-", 4) != 0 && strncasecmp(e, "MIG-", 4) != 0)
		return -1;
	int found = -1;
	for (int i = 0; i < nphys; i++) {
		char u[64];
		format_uuid(i, u, sizeof(u));
		if (strncasecmp(u, e, strlen(e)) == 0) {
			if (found >= 0)
				return -1;
			found = i;
		}
	}
	return found;
}

static void read_visible(void)
{
	int nphys = nphysical();
	const char *v = getenv("CUDA_VISIBLE_DEVICES");
	nvisible = 0;
	if (!v) {
		for (int i = 0; i < nphys; i++)
			visible[nvisible++] = i;
		return;
	}
	char buf[1024];
	snprintf(buf, sizeof(buf), "%s", v);
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && nvisible < FK_MAX_DEV;
	     tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		int phys = parse_visible_entry(tok, nphys);
		for (int i = 0; i < nvisible && phys >= 0; i++)
			if (visible[i] == phys)
				phys = -1;
		if (phys < 0)
			break;
		visible[nvisible++] = phys;
	}
}

/* Visible ordinal of physical device @phys, -1 when it is not visible. */
static int ordinal_of(int phys)
{
	for (int i = 0; i < nvisible; i++)
		if (visible[i] == phys)
			return i;
	return -1;
}

static bool is_sticky_code(int c)
{
	return c == 700 || c == 710 || (c >= 714 && c <= 719) || c == 214;
}

/* Calls that still answer after a sticky error: they need no context. */
static bool context_free(const char *name)
{
	return strcmp(name, "cuInit") == 0 || strcmp(name, "cuDriverGetVersion") == 0 ||
	       strcmp(name, "cuGetProcAddress") == 0 ||
	       (strncmp(name, "cuDevice", 8) == 0 && strncmp(name, "cuDevicePrimaryCtx", 18) != 0);
}

struct fault {
	char name[64];
	long nth, count;
	int code;
};
static char fault_spec[512];
static struct fault faults[16];
static size_t nfaults;

/* Should this call of @name fail, and with which code? (0: no) */
CUresult fk_fault(const char *name)
{
	const char *spec = getenv("FAKECUDA_FAIL");
	CUresult r = CUDA_SUCCESS;
	if (fk_env_ll("FAKECUDA_FORK_UNSAFE", 0) && fk_initialized && getpid() != init_pid)
		return CUDA_ERROR_NOT_INITIALIZED;
	const char *lose = getenv("FAKECUDA_LOSE_CONTEXT");
	pthread_mutex_lock(&fk_lock);
	if (sticky_code == CUDA_SUCCESS && lose && *lose && access(lose, F_OK) == 0)
		sticky_code = CUDA_ERROR_ILLEGAL_ADDRESS;
	if (sticky_code != CUDA_SUCCESS && !context_free(name)) {
		r = sticky_code;
		pthread_mutex_unlock(&fk_lock);
		return r;
	}
	if (!spec)
		spec = "";
	if (strcmp(spec, fault_spec) != 0) {
		snprintf(fault_spec, sizeof(fault_spec), "%s", spec);
		nfaults = 0;
		char buf[512];
		snprintf(buf, sizeof(buf), "%s", spec);
		for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && nfaults < 16;
		     tok = strtok_r(NULL, ",", &save)) {
			struct fault *f = &faults[nfaults];
			char *c1 = strchr(tok, ':');
			if (!c1)
				continue;
			*c1 = '\0';
			snprintf(f->name, sizeof(f->name), "%s", tok);
			char *c2 = strchr(c1 + 1, ':');
			f->nth = strtol(c1 + 1, NULL, 0);
			f->code = c2 ? (int)strtol(c2 + 1, NULL, 0) : CUDA_ERROR_UNKNOWN;
			f->count = 0;
			nfaults++;
		}
	}
	for (size_t i = 0; i < nfaults; i++)
		if (strcmp(faults[i].name, name) == 0 && ++faults[i].count == faults[i].nth)
			r = (CUresult)faults[i].code;
	if (is_sticky_code((int)r) && fk_env_ll("FAKECUDA_STICKY", 0))
		sticky_code = r;
	pthread_mutex_unlock(&fk_lock);
	return r;
}

/* ---- cross-process accounting ---- */

static const char *state_dir(void)
{
	static char dflt[128];
	const char *d = getenv("FAKECUDA_STATE_DIR");
	if (d && *d)
		return d;
	snprintf(dflt, sizeof(dflt), "/dev/shm/fakecuda-%u", (unsigned)getuid());
	mkdir(dflt, 0700);
	return dflt;
}

/* Bytes held on @dev by live allocations of every process. */
static unsigned long long used_bytes(int dev)
{
	char prefix[32], path[4096];
	unsigned long long used = 0;
	const char *dir = state_dir();
	DIR *d = opendir(dir);
	struct dirent *e;
	if (!d)
		return 0;
	snprintf(prefix, sizeof(prefix), "alloc-d%d-", dev);
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
			unlink(path); /* nobody holds it: freed */
		} else {
			struct stat st;
			if (fstat(fd, &st) == 0)
				used += (unsigned long long)st.st_size;
		}
		close(fd);
	}
	closedir(d);
	return used;
}

/* Memory of physical device @phys: its entry of FAKECUDA_TOTAL_MEM. */
static unsigned long long total_bytes(int phys)
{
	const char *v = getenv("FAKECUDA_TOTAL_MEM");
	unsigned long long t = 16ULL << 30;
	for (int i = 0; v && *v; i++) {
		char *end;
		unsigned long long x = strtoull(v, &end, 0);
		if (end == v || (*end && *end != ','))
			break;
		t = x;
		if (i == phys || !*end)
			break;
		v = end + 1;
	}
	return t;
}

static int physical_of(CUdevice dev)
{
	return dev >= 0 && dev < nvisible ? visible[dev] : -1;
}

/* Is the process that created the allocation of file @fd gone (only
 * checked under FAKECUDA_REVOKE)? */
static bool revoked(int creator)
{
	return fk_env_ll("FAKECUDA_REVOKE", 0) && creator > 0 && kill(creator, 0) < 0 && errno == ESRCH;
}

/* ---- entry points ---- */

static CUresult fk_cuInit(unsigned int flags)
{
	CUresult f = fk_fault("cuInit");
	if (f != CUDA_SUCCESS)
		return f;
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk_lock);
	/* A fork-safe child initialises again (its own pid); the visible set
	 * is read at the first cuInit only, as the driver does. */
	if (!fk_initialized)
		read_visible();
	if (nvisible > 0) {
		fk_initialized = true;
		init_pid = getpid();
	}
	pthread_mutex_unlock(&fk_lock);
	return nvisible > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static CUresult fk_cuDriverGetVersion(int *v)
{
	CUresult f = fk_fault("cuDriverGetVersion");
	if (f != CUDA_SUCCESS)
		return f;
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = (int)fk_env_ll("FAKECUDA_DRIVER_VERSION", 13000);
	return CUDA_SUCCESS;
}

static CUresult fk_cuDeviceGetCount(int *n)
{
	FK_ENTRY("cuDeviceGetCount");
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	*n = fk_ndevices();
	return CUDA_SUCCESS;
}

static CUresult fk_cuDeviceGet(CUdevice *dev, int ordinal)
{
	FK_ENTRY("cuDeviceGet");
	if (!dev)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= fk_ndevices())
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

static CUresult fk_cuDeviceGetAttribute(int *pi, CUdevice_attribute attr, CUdevice dev)
{
	FK_ENTRY("cuDeviceGetAttribute");
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= fk_ndevices())
		return CUDA_ERROR_INVALID_DEVICE;
	switch (attr) {
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		*pi = 1;
		break;
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		*pi = fk_env_ll("FAKECUDA_NO_POSIX_FD", 0) ? 0 : 1;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

static CUresult fk_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	FK_ENTRY("cuDeviceGetUuid");
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	if (physical_of(dev) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	phys_uuid(physical_of(dev), (unsigned char *)uuid->bytes);
	return CUDA_SUCCESS;
}

static CUresult fk_cuDeviceGetName(char *name, int len, CUdevice dev)
{
	FK_ENTRY("cuDeviceGetName");
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (physical_of(dev) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "Fake GPU %d%s", physical_of(dev),
		 fk_env_ll("FAKECUDA_MIG", 0) ? " MIG 1g.10gb" : "");
	return CUDA_SUCCESS;
}

static CUresult fk_cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
	FK_ENTRY("cuDeviceCanAccessPeer");
	if (!can)
		return CUDA_ERROR_INVALID_VALUE;
	if (physical_of(dev) < 0 || physical_of(peer) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*can = dev != peer && fk_env_ll("FAKECUDA_PEER_ACCESS", 0) ? 1 : 0;
	return CUDA_SUCCESS;
}

static CUresult fk_cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
	FK_ENTRY("cuDeviceTotalMem");
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (physical_of(dev) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = (size_t)total_bytes(physical_of(dev));
	return CUDA_SUCCESS;
}

static CUresult fk_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	FK_ENTRY("cuDevicePrimaryCtxRetain");
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= fk_ndevices())
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fk_lock);
	primary[dev].dev = dev;
	primary[dev].refs++;
	pthread_mutex_unlock(&fk_lock);
	*pctx = &primary[dev];
	return CUDA_SUCCESS;
}

static CUresult fk_cuDevicePrimaryCtxRelease(CUdevice dev)
{
	FK_ENTRY("cuDevicePrimaryCtxRelease");
	if (dev < 0 || dev >= fk_ndevices())
		return CUDA_ERROR_INVALID_DEVICE;
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&fk_lock);
	if (primary[dev].refs <= 0)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else
		primary[dev].refs--;
	pthread_mutex_unlock(&fk_lock);
	return r;
}

bool fk_ctx_valid(CUcontext c)
{
	return c >= primary && c < primary + FK_MAX_DEV && c->refs > 0;
}

static CUresult fk_cuCtxGetCurrent(CUcontext *pctx)
{
	FK_ENTRY("cuCtxGetCurrent");
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
	return CUDA_SUCCESS;
}

static CUresult fk_cuCtxPushCurrent(CUcontext ctx)
{
	FK_ENTRY("cuCtxPushCurrent");
	if (!fk_ctx_valid(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth == (int)(sizeof(ctx_stack) / sizeof(ctx_stack[0])))
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

static CUresult fk_cuCtxPopCurrent(CUcontext *pctx)
{
	FK_ENTRY("cuCtxPopCurrent");
	if (!ctx_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUcontext c = ctx_stack[--ctx_depth];
	if (pctx)
		*pctx = c;
	return CUDA_SUCCESS;
}

CUcontext fk_current(void)
{
	return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

static CUresult fk_cuCtxGetDevice(CUdevice *dev)
{
	FK_ENTRY("cuCtxGetDevice");
	if (!dev)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_current())
		return CUDA_ERROR_INVALID_CONTEXT;
	*dev = fk_current()->dev;
	return CUDA_SUCCESS;
}

/* CUDA 13's variant, returned for cudaVersion >= 13000. */
static CUresult fk_cuCtxGetDevice_v13000(CUdevice *dev, CUcontext ctx)
{
	FK_ENTRY("cuCtxGetDevice");
	if (!dev)
		return CUDA_ERROR_INVALID_VALUE;
	if (!ctx)
		ctx = fk_current();
	if (!fk_ctx_valid(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	*dev = ctx->dev;
	return CUDA_SUCCESS;
}

static CUresult fk_cuCtxSynchronize(void)
{
	FK_ENTRY("cuCtxSynchronize");
	return fk_current() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult fk_cuCtxSynchronize_v13000(CUcontext ctx)
{
	FK_ENTRY("cuCtxSynchronize");
	return fk_ctx_valid(ctx ? ctx : fk_current()) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult fk_cuMemGetInfo(size_t *free_b, size_t *total_b)
{
	FK_ENTRY("cuMemGetInfo");
	if (!free_b || !total_b)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_current())
		return CUDA_ERROR_INVALID_CONTEXT;
	int phys = physical_of(fk_current()->dev);
	unsigned long long used = used_bytes(phys), tot = total_bytes(phys);
	used += (unsigned long long)fk_env_ll("FAKECUDA_CTX_OVERHEAD", 0) * (unsigned long long)fk_current()->refs;
	*total_b = (size_t)tot;
	*free_b = (size_t)(used >= tot ? 0 : tot - used);
	return CUDA_SUCCESS;
}

static bool prop_ok(const CUmemAllocationProp *p)
{
	return p && p->type == CU_MEM_ALLOCATION_TYPE_PINNED && p->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
	       p->location.id >= 0 && p->location.id < fk_ndevices();
}

static CUresult fk_cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
						 CUmemAllocationGranularity_flags option)
{
	FK_ENTRY("cuMemGetAllocationGranularity");
	if (!g || !prop_ok(prop) ||
	    (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
		return CUDA_ERROR_INVALID_VALUE;
	*g = FK_GRAN;
	return CUDA_SUCCESS;
}

struct fk_alloc *fk_find_alloc(CUmemGenericAllocationHandle h)
{
	for (size_t i = 0; i < nallocs; i++)
		if (allocs[i].h == h)
			return &allocs[i];
	return NULL;
}

static bool grow(void **arr, size_t *cap, size_t n, size_t elem)
{
	if (n < *cap)
		return true;
	size_t c = *cap ? *cap * 2 : 16;
	void *p = realloc(*arr, c * elem);
	if (!p)
		return false;
	*arr = p;
	*cap = c;
	return true;
}

static CUresult add_alloc(int fd, size_t size, int dev, int creator, CUmemGenericAllocationHandle *out)
{
	if (!grow((void **)&allocs, &cap_allocs, nallocs, sizeof(*allocs)))
		return CUDA_ERROR_OUT_OF_MEMORY;
	allocs[nallocs] = (struct fk_alloc){ next_handle++, fd, size, dev, creator };
	*out = allocs[nallocs++].h;
	return CUDA_SUCCESS;
}

static CUresult fk_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			       unsigned long long flags)
{
	FK_ENTRY("cuMemCreate");
	if (!handle || !prop_ok(prop) || flags != 0 || size == 0 || size % FK_GRAN)
		return CUDA_ERROR_INVALID_VALUE;
	if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && fk_env_ll("FAKECUDA_NO_POSIX_FD", 0))
		return CUDA_ERROR_NOT_SUPPORTED;
	int dev = prop->location.id, phys = physical_of(dev);
	unsigned long long used = used_bytes(phys);
	long long oom_after = fk_env_ll("FAKECUDA_OOM_AFTER_BYTES", -1);
	if (used + size > total_bytes(phys) || (oom_after >= 0 && used + size > (unsigned long long)oom_after))
		return CUDA_ERROR_OUT_OF_MEMORY;

	char tmp[4096], final[4096];
	const char *dir = state_dir();
	pthread_mutex_lock(&fk_lock);
	unsigned long long seq = ++file_seq;
	pthread_mutex_unlock(&fk_lock);
	snprintf(tmp, sizeof(tmp), "%s/new-%d-%llu", dir, (int)getpid(), seq);
	snprintf(final, sizeof(final), "%s/alloc-d%d-%d-%llu", dir, phys, (int)getpid(), seq);
	int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	/* Locked before it gets the name the accounting scans. */
	if (ftruncate(fd, (off_t)size) < 0 || flock(fd, LOCK_SH) < 0 || rename(tmp, final) < 0) {
		int e = errno;
		unlink(tmp);
		close(fd);
		return e == ENOSPC || e == ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
	}
	pthread_mutex_lock(&fk_lock);
	CUresult r = add_alloc(fd, size, dev, (int)getpid(), handle);
	pthread_mutex_unlock(&fk_lock);
	if (r != CUDA_SUCCESS)
		close(fd);
	return r;
}

static CUresult fk_cuMemRelease(CUmemGenericAllocationHandle h)
{
	FK_ENTRY("cuMemRelease");
	pthread_mutex_lock(&fk_lock);
	struct fk_alloc *a = fk_find_alloc(h);
	if (!a) {
		pthread_mutex_unlock(&fk_lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	/* Mappings keep the open file (and its lock) alive by themselves. */
	close(a->fd);
	*a = allocs[--nallocs];
	pthread_mutex_unlock(&fk_lock);
	return CUDA_SUCCESS;
}

static CUresult fk_cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
						CUmemAllocationHandleType type, unsigned long long flags)
{
	FK_ENTRY("cuMemExportToShareableHandle");
	if (!out || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&fk_lock);
	struct fk_alloc *a = fk_find_alloc(h);
	int fd = a ? fcntl(a->fd, F_DUPFD, 0) : -1;
	pthread_mutex_unlock(&fk_lock);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	if (fd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

static CUresult fk_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
						  CUmemAllocationHandleType type)
{
	FK_ENTRY("cuMemImportFromShareableHandle");
	if (!h)
		return CUDA_ERROR_INVALID_VALUE;
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	int fd = (int)(intptr_t)os_handle, phys, creator;
	char link[64], target[4096], real_dir[4096];
	struct stat st;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || n <= 0 || !realpath(state_dir(), real_dir))
		return CUDA_ERROR_INVALID_VALUE;
	target[n] = '\0';
	size_t dl = strlen(real_dir);
	if (strncmp(target, real_dir, dl) != 0 || sscanf(target + dl, "/alloc-d%d-%d-", &phys, &creator) != 2 ||
	    phys < 0 || phys >= nphysical())
		return CUDA_ERROR_INVALID_VALUE;
	int dev = ordinal_of(phys);
	if (dev < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (revoked(creator))
		return CUDA_ERROR_INVALID_HANDLE;
	int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (own < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	pthread_mutex_lock(&fk_lock);
	CUresult r = add_alloc(own, (size_t)st.st_size, dev, creator, h);
	pthread_mutex_unlock(&fk_lock);
	if (r != CUDA_SUCCESS)
		close(own);
	return r;
}

static CUresult fk_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
				       unsigned long long flags)
{
	FK_ENTRY("cuMemAddressReserve");
	if (!ptr || size == 0 || size % FK_GRAN || (align & (align - 1)) || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (align < FK_GRAN)
		align = FK_GRAN;
	(void)addr; /* a hint only, as in the driver */
	size_t total = size + align;
	uint8_t *p = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
	if (start > (uintptr_t)p)
		munmap(p, start - (uintptr_t)p);
	if ((uintptr_t)p + total > start + size)
		munmap((void *)(start + size), (uintptr_t)p + total - start - size);
	pthread_mutex_lock(&fk_lock);
	bool ok = grow((void **)&resv, &cap_resv, nresv, sizeof(*resv));
	if (ok)
		resv[nresv++] = (struct fk_range){ start, size };
	pthread_mutex_unlock(&fk_lock);
	if (!ok) {
		munmap((void *)start, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*ptr = start;
	return CUDA_SUCCESS;
}

static bool overlaps_mapping(uintptr_t p, size_t size)
{
	for (size_t i = 0; i < nmaps; i++)
		if (p < maps[i].p + maps[i].size && maps[i].p < p + size)
			return true;
	return false;
}

static CUresult fk_cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	FK_ENTRY("cuMemAddressFree");
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk_lock);
	for (size_t i = 0; i < nresv; i++)
		if (resv[i].p == ptr && resv[i].size == size) {
			if (overlaps_mapping(ptr, size))
				break; /* still mapped: the caller must unmap first */
			munmap((void *)(uintptr_t)ptr, size);
			resv[i] = resv[--nresv];
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&fk_lock);
	return r;
}

static bool in_reservation(uintptr_t p, size_t size)
{
	for (size_t i = 0; i < nresv; i++)
		if (p >= resv[i].p && p + size <= resv[i].p + resv[i].size)
			return true;
	return false;
}

static CUresult fk_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
			    unsigned long long flags)
{
	FK_ENTRY("cuMemMap");
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&fk_lock);
	struct fk_alloc *a = fk_find_alloc(h);
	if (!a || flags != 0 || size == 0 || ptr % FK_GRAN || size % FK_GRAN || offset % FK_GRAN ||
	    offset + size > a->size || !in_reservation(ptr, size))
		r = CUDA_ERROR_INVALID_VALUE;
	else if (revoked(a->creator))
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (overlaps_mapping(ptr, size))
		r = CUDA_ERROR_ALREADY_MAPPED;
	else if (!grow((void **)&maps, &cap_maps, nmaps, sizeof(*maps)))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	/* Mapped but inaccessible until cuMemSetAccess, as on a device. */
	else if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)offset) ==
		 MAP_FAILED)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else
		maps[nmaps++] = (struct fk_range){ ptr, size, CU_MEM_ACCESS_FLAGS_PROT_NONE, a->creator, a->dev };
	pthread_mutex_unlock(&fk_lock);
	return r;
}

/* Is [p, p+size) covered exactly by whole mappings, without gaps? */
static bool covered_by_mappings(uintptr_t p, size_t size)
{
	uintptr_t at = p;
	while (at < p + size) {
		size_t i;
		for (i = 0; i < nmaps; i++)
			if (maps[i].p == at)
				break;
		if (i == nmaps || maps[i].p + maps[i].size > p + size)
			return false;
		at += maps[i].size;
	}
	return at == p + size;
}

static CUresult fk_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	FK_ENTRY("cuMemUnmap");
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&fk_lock);
	if (size == 0 || !covered_by_mappings(ptr, size))
		r = CUDA_ERROR_INVALID_VALUE;
	else if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		      -1, 0) == MAP_FAILED)
		r = CUDA_ERROR_OPERATING_SYSTEM;
	else
		for (size_t i = 0; i < nmaps;)
			if (maps[i].p >= ptr && maps[i].p < ptr + size)
				maps[i] = maps[--nmaps];
			else
				i++;
	pthread_mutex_unlock(&fk_lock);
	return r;
}

static CUresult fk_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	FK_ENTRY("cuMemSetAccess");
	if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc->location.id < 0 ||
	    desc->location.id >= fk_ndevices())
		return CUDA_ERROR_INVALID_VALUE;
	int prot;
	unsigned long long flags = desc->flags;
	int dev_of_access = desc->location.id;
	const char *ro = getenv("FAKECUDA_READONLY");
	switch (desc->flags) {
	case CU_MEM_ACCESS_FLAGS_PROT_NONE:
		prot = PROT_NONE;
		break;
	case CU_MEM_ACCESS_FLAGS_PROT_READ:
		if (ro && strcmp(ro, "reject") == 0)
			return CUDA_ERROR_INVALID_VALUE;
		prot = PROT_READ;
		if (ro && strcmp(ro, "ignore") == 0) {
			prot = PROT_READ | PROT_WRITE;
			flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		}
		break;
	case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
		prot = PROT_READ | PROT_WRITE;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&fk_lock);
	if (size == 0 || !covered_by_mappings(ptr, size))
		r = CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < nmaps && r == CUDA_SUCCESS; i++)
		if (maps[i].p >= ptr && maps[i].p < ptr + size) {
			if (revoked(maps[i].creator))
				r = CUDA_ERROR_INVALID_HANDLE;
			else if (maps[i].dev != dev_of_access && !fk_env_ll("FAKECUDA_PEER_ACCESS", 0))
				r = CUDA_ERROR_INVALID_DEVICE;
		}
	if (r == CUDA_SUCCESS && mprotect((void *)(uintptr_t)ptr, size, prot) < 0)
		r = CUDA_ERROR_OPERATING_SYSTEM;
	for (size_t i = 0; i < nmaps && r == CUDA_SUCCESS; i++)
		if (maps[i].p >= ptr && maps[i].p < ptr + size)
			maps[i].access = flags;
	pthread_mutex_unlock(&fk_lock);
	return r;
}

static CUresult fk_cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc, CUdeviceptr ptr)
{
	FK_ENTRY("cuMemGetAccess");
	if (!flags || !loc || loc->type != CU_MEM_LOCATION_TYPE_DEVICE || physical_of(loc->id) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk_lock);
	for (size_t i = 0; i < nmaps; i++)
		if (ptr >= maps[i].p && ptr < maps[i].p + maps[i].size) {
			*flags = maps[i].access;
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&fk_lock);
	return r;
}

static CUresult fk_cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
	FK_ENTRY("cuMemGetAllocationPropertiesFromHandle");
	if (!prop)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk_lock);
	struct fk_alloc *a = fk_find_alloc(h);
	if (a) {
		memset(prop, 0, sizeof(*prop));
		prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop->location.id = a->dev;
		prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	}
	pthread_mutex_unlock(&fk_lock);
	return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static const struct {
	CUresult code;
	const char *name, *text;
} errors[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	  "system has unsupported display driver / cuda driver combination" },
	{ CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	  "forward compatibility was attempted on non supported HW" },
	{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

static CUresult fk_cuGetErrorName(CUresult e, const char **s)
{
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == e) {
			*s = errors[i].name;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

static CUresult fk_cuGetErrorString(CUresult e, const char **s)
{
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == e) {
			*s = errors[i].text;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

static const struct fk_proc procs[] = {
#define P(n) { #n, 0, (void *)fk_##n }
	P(cuInit), P(cuDriverGetVersion), P(cuDeviceGet), P(cuDeviceGetCount), P(cuDeviceGetAttribute),
	P(cuDeviceGetUuid), P(cuDevicePrimaryCtxRetain), P(cuDevicePrimaryCtxRelease), P(cuCtxGetCurrent),
	P(cuCtxPushCurrent), P(cuCtxPopCurrent), P(cuMemGetInfo), P(cuMemGetAllocationGranularity), P(cuMemCreate),
	P(cuMemRelease), P(cuMemExportToShareableHandle), P(cuMemImportFromShareableHandle), P(cuMemAddressReserve),
	P(cuMemAddressFree), P(cuMemMap), P(cuMemUnmap), P(cuMemSetAccess), P(cuGetErrorName), P(cuGetErrorString),
	P(cuCtxGetDevice), P(cuCtxSynchronize), P(cuMemGetAccess), P(cuMemGetAllocationPropertiesFromHandle),
	P(cuDeviceGetName), P(cuDeviceCanAccessPeer),
#undef P
	{ "cuDeviceTotalMem", 3020, (void *)fk_cuDeviceTotalMem },
	{ "cuCtxGetDevice", 13000, (void *)fk_cuCtxGetDevice_v13000 },
	{ "cuCtxSynchronize", 13000, (void *)fk_cuCtxSynchronize_v13000 },
};

/* The newest variant of @symbol in @t[0..n) that a caller of @version may
 * get: *best is updated, *seen set when the name is there at all. */
static void lookup(const struct fk_proc *t, size_t n, const char *symbol, int version, const struct fk_proc **best,
		   bool *seen)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(t[i].name, symbol) == 0) {
			*seen = true;
			if (t[i].since <= version && (!*best || t[i].since > (*best)->since))
				*best = &t[i];
		}
}

static CUresult get_proc(const char *symbol, void **pfn, int version, CUdriverProcAddressQueryResult *status)
{
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	const struct fk_proc *best = NULL;
	bool seen = false;
	lookup(procs, sizeof(procs) / sizeof(procs[0]), symbol, version, &best, &seen);
	if (&fk_copy_nprocs)
		lookup(fk_copy_procs, fk_copy_nprocs, symbol, version, &best, &seen);
	*pfn = best ? best->fn : NULL;
	/* The copy calls (fakecuda_copy.c) answer for themselves. */
	bool found = best != NULL;
	if (!found && !seen && (*pfn = fakecuda_copy_proc(symbol)) != NULL)
		found = true;
	if (status)
		*status = found  ? CU_GET_PROC_ADDRESS_SUCCESS
			  : seen ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
				 : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return found ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FK_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				       CUdriverProcAddressQueryResult *status)
{
	(void)flags;
	CUresult f = fk_fault("cuGetProcAddress");
	if (f != CUDA_SUCCESS)
		return f;
	return get_proc(symbol, pfn, version, status);
}

/* The CUDA 11.3 signature, still exported by drivers for old callers. */
FK_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
FK_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	(void)flags;
	CUresult f = fk_fault("cuGetProcAddress");
	if (f != CUDA_SUCCESS)
		return f;
	return get_proc(symbol, pfn, version, NULL);
}

FK_EXPORT CUresult cuInit(unsigned int flags)
{
	return fk_cuInit(flags);
}

FK_EXPORT CUresult cuDriverGetVersion(int *v)
{
	return fk_cuDriverGetVersion(v);
}
