/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda backend: CUDA VMM through a dlopen()ed libcuda.so.1.
 *
 * The driver is never linked: the library must load and run its host backend
 * on machines without a GPU, and say precisely why cuda is unusable. Only
 * cuGetProcAddress is looked up with dlsym; every other entry point comes
 * from it, each at a pinned ABI version (GF_CUDA_ABI) so a newer driver
 * cannot hand back a variant with another signature (CUDA 13 changed
 * cuCtxGetDevice and cuCtxSynchronize, for instance).
 *
 * GF_LIBCUDA overrides the library path (tests point it at tests/fakecuda).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cuda_errors.h"

/* The ABI this file is written against: every entry point is requested as
 * CUDA 12.0 defined it. */
#define GF_CUDA_ABI 12000
/* A driver older than the ABI requested has no such variants to hand out
 * (cuGetProcAddress answers VERSION_NOT_SUFFICIENT), so the minimum is the
 * ABI itself. */
#define GF_CUDA_MIN_DRIVER GF_CUDA_ABI

typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

struct cu_api {
	CUresult (*Init)(unsigned int);
	CUresult (*DriverGetVersion)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
	CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice);
	CUresult (*CtxGetCurrent)(CUcontext *);
	CUresult (*CtxGetDevice)(CUdevice *);
	CUresult (*CtxPushCurrent)(CUcontext);
	CUresult (*CtxPopCurrent)(CUcontext *);
	CUresult (*CtxSynchronize)(void);
	CUresult (*MemGetInfo)(size_t *, size_t *);
	CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
					       unsigned long long);
	CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*MemAddressFree)(CUdeviceptr, size_t);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*MemUnmap)(CUdeviceptr, size_t);
	CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*MemGetAccess)(unsigned long long *, const CUmemLocation *, CUdeviceptr);
	CUresult (*MemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice);
	CUresult (*GetErrorName)(CUresult, const char **);
	CUresult (*GetErrorString)(CUresult, const char **);
};

/* The driver is loaded once per process and kept: libcuda cannot be
 * unloaded safely once initialized. A failed load is not remembered, so a
 * later call retries (e.g. after the driver was installed). */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static bool loaded;
static struct cu_api cu;
/* The process that ran cuInit: a forked child shares the parent's driver
 * state, which is not its own (see load_driver). */
static pid_t init_pid;
/* The first sticky error seen (0: none): after a fault on the device the
 * driver fails every later call in the process's contexts. */
static atomic_int sticky;

/* Errors after which the context is unusable for good (cuda.h: "the
 * process must be terminated and relaunched"). */
static bool is_sticky(CUresult r)
{
	switch ((int)r) {
	case CUDA_ERROR_ILLEGAL_ADDRESS:
	case CUDA_ERROR_ASSERT:
	case CUDA_ERROR_HARDWARE_STACK_ERROR:
	case CUDA_ERROR_ILLEGAL_INSTRUCTION:
	case CUDA_ERROR_MISALIGNED_ADDRESS:
	case CUDA_ERROR_INVALID_ADDRESS_SPACE:
	case CUDA_ERROR_INVALID_PC:
	case CUDA_ERROR_LAUNCH_FAILED:
	case CUDA_ERROR_ECC_UNCORRECTABLE:
		return true;
	default:
		return false;
	}
}

/* The name of @r: the driver's, else cuda.h's, else its number. */
static const char *error_name(CUresult r, char *buf, size_t len)
{
	const char *name = NULL;
	if (cu.GetErrorName && cu.GetErrorName(r, &name) == CUDA_SUCCESS && name)
		return name;
	if ((name = gf_cuda_error_name((int)r)))
		return name;
	snprintf(buf, len, "CUDA error %d", (int)r);
	return buf;
}

static int cu_err(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int cu_err(CUresult r, const char *fmt, ...)
{
	char what[256], num[32];
	const char *name = error_name(r, num, sizeof(num)), *text = NULL;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (is_sticky(r)) {
		int none = 0;
		atomic_compare_exchange_strong(&sticky, &none, (int)r);
		gf_log(GF_LOG_ERR, "mem", "backend=cuda error=%s msg=\"sticky device error: the CUDA context is lost for good, the process must exit\"", name);
	}
	if (!cu.GetErrorString || cu.GetErrorString(r, &text) != CUDA_SUCCESS || !text)
		text = "";
	return gf_err(r == CUDA_ERROR_OUT_OF_MEMORY ? GF_ERR_OUT_OF_MEMORY : GF_ERR_DRIVER, "%s: %s (%d)%s%s", what,
		      name, (int)r, *text ? ": " : "", text);
}

/* Staged copies (lib/mem/xfer.c): optional, so a driver without them still
 * serves everything else; the backend ops then say what is missing. */
struct cu_copy_api {
	CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
	CUresult (*MemFreeHost)(void *);
	CUresult (*StreamCreate)(CUstream *, unsigned int);
	CUresult (*StreamDestroy)(CUstream);
	CUresult (*EventCreate)(CUevent *, unsigned int);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
};
static struct cu_copy_api cuc;
static bool have_copy;

static void load_copy_api(get_proc_v1_fn gp1, get_proc_v2_fn gp2)
{
	struct cu_copy_api api = { 0 };
	struct {
		const char *name;
		void **slot;
	} table[] = {
#define E(n) { "cu" #n, (void **)&api.n }
		E(MemHostAlloc), E(MemFreeHost), E(StreamCreate), E(StreamDestroy), E(EventCreate), E(EventDestroy),
		E(EventRecord), E(EventSynchronize), E(MemcpyDtoHAsync), E(MemcpyHtoDAsync),
#undef E
	};
	for (size_t i = 0; i < GF_ARRAY_SIZE(table); i++) {
		CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
		CUresult r = gp2 ? gp2(table[i].name, table[i].slot, GF_CUDA_ABI, CU_GET_PROC_ADDRESS_DEFAULT, &st)
				 : gp1(table[i].name, table[i].slot, GF_CUDA_ABI, CU_GET_PROC_ADDRESS_DEFAULT);
		if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !*table[i].slot) {
			gf_log(GF_LOG_DEBUG, "mem", "backend=cuda msg=\"no staged copies: driver lacks %s\"", table[i].name);
			return;
		}
	}
	cuc = api;
	have_copy = true;
}

static int load_driver_locked(void)
{
	const char *path = getenv("GF_LIBCUDA");
	if (!path || !*path)
		path = "libcuda.so.1";
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return gf_err(GF_ERR_NOT_SUPPORTED, "cuda backend: no CUDA driver: dlopen(%s): %s", path, dlerror());

	get_proc_v2_fn gp2 = (get_proc_v2_fn)dlsym(lib, "cuGetProcAddress_v2");
	get_proc_v1_fn gp1 = gp2 ? NULL : (get_proc_v1_fn)dlsym(lib, "cuGetProcAddress");
	if (!gp2 && !gp1) {
		dlclose(lib);
		return gf_err(GF_ERR_NOT_SUPPORTED,
			      "cuda backend: CUDA driver %s too old: it has no cuGetProcAddress (needs driver >= %d.%d)", path,
			      GF_CUDA_MIN_DRIVER / 1000, GF_CUDA_MIN_DRIVER % 1000 / 10);
	}
	struct cu_api api = { 0 };
	struct {
		const char *name;
		void **slot;
	} table[] = {
#define E(n) { "cu" #n, (void **)&api.n }
		E(Init), E(DriverGetVersion), E(DeviceGet), E(DeviceGetCount), E(DeviceGetAttribute),
		E(DeviceGetUuid), E(DevicePrimaryCtxRetain), E(DevicePrimaryCtxRelease), E(CtxGetCurrent),
		E(CtxGetDevice), E(CtxPushCurrent), E(CtxPopCurrent), E(CtxSynchronize), E(MemGetInfo),
		E(MemGetAllocationGranularity), E(MemCreate), E(MemRelease), E(MemExportToShareableHandle),
		E(MemImportFromShareableHandle), E(MemAddressReserve), E(MemAddressFree), E(MemMap), E(MemUnmap),
		E(MemSetAccess), E(GetErrorName), E(GetErrorString), E(MemGetAccess),
		E(MemGetAllocationPropertiesFromHandle), E(DeviceGetName), E(DeviceCanAccessPeer),
#undef E
	};
	/* When an entry point is missing, an old driver is named as such rather
	 * than by the first entry point it lacks. */
	for (size_t i = 0; i < GF_ARRAY_SIZE(table); i++) {
		CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
		CUresult r = gp2 ? gp2(table[i].name, table[i].slot, GF_CUDA_ABI, CU_GET_PROC_ADDRESS_DEFAULT, &st)
				 : gp1(table[i].name, table[i].slot, GF_CUDA_ABI, CU_GET_PROC_ADDRESS_DEFAULT);
		if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !*table[i].slot) {
			int version = 0;
			if (api.DriverGetVersion && api.DriverGetVersion(&version) == CUDA_SUCCESS &&
			    version < GF_CUDA_MIN_DRIVER) {
				dlclose(lib);
				return gf_err(GF_ERR_NOT_SUPPORTED,
					      "cuda backend: CUDA driver too old: version %d.%d, needs >= %d.%d", version / 1000,
					      version % 1000 / 10, GF_CUDA_MIN_DRIVER / 1000, GF_CUDA_MIN_DRIVER % 1000 / 10);
			}
			dlclose(lib);
			return gf_err(GF_ERR_NOT_SUPPORTED,
				      "cuda backend: CUDA driver %s lacks entry point %s (cuGetProcAddress: %d, status %d)", path,
				      table[i].name, (int)r, (int)st);
		}
	}
	load_copy_api(gp1, gp2);
	CUresult r = api.Init(0);
	if (r != CUDA_SUCCESS) {
		const char *name = NULL;
		if (api.GetErrorName(r, &name) != CUDA_SUCCESS || !name)
			name = gf_cuda_error_name((int)r) ? gf_cuda_error_name((int)r) : "unknown CUDA error";
		/* No dlclose once cuInit ran: the driver may have started
		 * threads; a later attempt's dlopen reuses this handle. */
		if (r == CUDA_ERROR_NO_DEVICE)
			return gf_err(GF_ERR_NOT_SUPPORTED, "cuda backend: cuInit: no CUDA device (%s)", name);
		return gf_err(r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH ||
				      r == CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE ? GF_ERR_NOT_SUPPORTED
												   : GF_ERR_DRIVER,
			      "cuda backend: cuInit failed: %s (%d)", name, (int)r);
	}
	cu = api;
	loaded = true;
	init_pid = getpid();
	gf_log(GF_LOG_DEBUG, "mem", "backend=cuda driver=%s msg=\"CUDA driver loaded\"", path);
	return 0;
}

/* Load the driver and check its version (on every call: cheap, and it
 * keeps the answer true if the loaded driver's reported version changes,
 * which the test driver can do). */
static int load_driver(void)
{
	pthread_mutex_lock(&load_lock);
	int rc = loaded ? 0 : load_driver_locked();
	pid_t self = getpid();
	if (rc == 0 && init_pid != self) {
		/* A forked child: the parent's initialisation is not its own. The
		 * driver decides whether a child may initialise again; if it may
		 * not, that is said here rather than by a later call failing. */
		CUresult r = cu.Init(0);
		if (r == CUDA_SUCCESS) {
			gf_log(GF_LOG_INFO, "mem", "backend=cuda pid=%d parent=%d msg=\"forked child: driver initialised again\"",
			       (int)self, (int)init_pid);
			init_pid = self;
		} else {
			char num[32];
			rc = gf_err(GF_ERR_STATE,
				    "cuda backend: forked child: pid %d is a fork of pid %d, which initialised the CUDA driver, "
				    "and the driver refuses a second cuInit in the child (%s); start CUDA users with exec, not fork",
				    (int)self, (int)init_pid, error_name(r, num, sizeof(num)));
		}
	}
	pthread_mutex_unlock(&load_lock);
	if (rc < 0)
		return rc;
	int version = 0;
	CUresult r = cu.DriverGetVersion(&version);
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuda backend: cuDriverGetVersion");
	if (version < GF_CUDA_MIN_DRIVER)
		return gf_err(GF_ERR_NOT_SUPPORTED, "cuda backend: CUDA driver too old: version %d.%d, needs >= %d.%d",
			      version / 1000, version % 1000 / 10, GF_CUDA_MIN_DRIVER / 1000, GF_CUDA_MIN_DRIVER % 1000 / 10);
	return 0;
}

struct cu_dev {
	CUdevice dev;
	CUcontext primary;
	pid_t pid; /* the process that retained @primary */
	/* What the driver did with PROT_READ (enum gf_mem_read_protection). */
	int read_prot;
};

/* Is @d unusable: opened in the process this one was forked from, or lost
 * to a sticky error? Returns 0 or the error to give (recorded). */
static int unusable(const gf_mem *m)
{
	const struct cu_dev *d = m->priv;
	if (d->pid != getpid())
		return gf_err(GF_ERR_STATE,
			      "cuda backend: device %d was opened by pid %d; pid %d is a forked child and cannot use "
			      "the parent's CUDA context (open the backend again in the child)",
			      m->device, (int)d->pid, (int)getpid());
	int s = atomic_load(&sticky);
	if (s) {
		char num[32];
		return gf_err(GF_ERR_DRIVER,
			      "cuda backend: device lost: an earlier %s is sticky, every call in this process fails; "
			      "the process must exit",
			      error_name((CUresult)s, num, sizeof(num)));
	}
	return 0;
}

/* Teardown (unmap, release, free_va, close) of a backend that is
 * unusable (objects inherited by a forked child, or a context lost to a
 * sticky error) is tried once without a context and its failure ignored:
 * the bookkeeping drops the object either way, so failover paths finish,
 * and the driver frees what is left when the process exits. */
static bool teardown_best_effort(const gf_mem *m)
{
	const struct cu_dev *d = m->priv;
	return d->pid != getpid() || atomic_load(&sticky);
}

/*
 * Make a context of our device current for one call: the caller's (e.g.
 * PyTorch's) when it already made one current on this device, else the
 * primary context pushed for the call's duration.
 */
static int ctx_enter(gf_mem *m, bool *pushed)
{
	struct cu_dev *d = m->priv;
	CUcontext cur = NULL;
	CUdevice cd;
	*pushed = false;
	int rc = unusable(m);
	if (rc < 0)
		return rc;
	if (cu.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur && cu.CtxGetDevice(&cd) == CUDA_SUCCESS && cd == d->dev)
		return 0;
	CUresult r = cu.CtxPushCurrent(d->primary);
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuCtxPushCurrent(primary context of device %d)", m->device);
	*pushed = true;
	return 0;
}

static void ctx_leave(bool pushed)
{
	CUcontext c;
	if (pushed)
		cu.CtxPopCurrent(&c);
}

/* Evaluate @expr (a CUresult) inside our context; on failure record the
 * printf-style description that follows and yield the GF_ERR_* code. */
#define CU_CALL(m, expr, ...)                                            \
	({                                                               \
		bool pushed_;                                            \
		int rc_ = ctx_enter((m), &pushed_);                      \
		if (rc_ == 0) {                                          \
			CUresult r_ = (expr);                            \
			ctx_leave(pushed_);                              \
			if (r_ != CUDA_SUCCESS)                          \
				rc_ = cu_err(r_, __VA_ARGS__);           \
		}                                                        \
		rc_;                                                     \
	})

/* A teardown call: CU_CALL, or best effort (see teardown_best_effort). */
#define CU_TEARDOWN(m, expr, ...)                                                                  \
	({                                                                                         \
		int td_rc_ = 0;                                                                    \
		if (teardown_best_effort(m)) {                                                     \
			CUresult td_r_ = (expr);                                                   \
			if (td_r_ != CUDA_SUCCESS)                                                 \
				gf_log(GF_LOG_DEBUG, "mem", "backend=cuda code=%d msg=\"teardown of " \
				       "an unusable context failed; dropped\"", (int)td_r_);           \
		} else {                                                                           \
			td_rc_ = CU_CALL(m, expr, __VA_ARGS__);                                    \
		}                                                                                  \
		td_rc_;                                                                            \
	})

static int cuda_device_count(int *out)
{
	int rc = load_driver();
	if (rc < 0)
		return rc;
	int n = 0;
	CUresult r = cu.DeviceGetCount(&n);
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuDeviceGetCount");
	*out = n;
	return 0;
}

static int get_device(int index, CUdevice *dev)
{
	int n, rc = cuda_device_count(&n);
	if (rc < 0)
		return rc;
	if (index >= n)
		return gf_err(GF_ERR_NOT_FOUND, "cuda backend: no device %d (the driver sees %d)", index, n);
	CUresult r = cu.DeviceGet(dev, index);
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuDeviceGet(%d)", index);
	return 0;
}

static int cuda_device_uuid(int index, uint8_t uuid[16])
{
	CUdevice dev;
	CUuuid u;
	int rc = get_device(index, &dev);
	if (rc < 0)
		return rc;
	CUresult r = cu.DeviceGetUuid(&u, dev);
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuDeviceGetUuid(%d)", index);
	memcpy(uuid, u.bytes, 16);
	return 0;
}

/* MIG compute instances are named "<GPU> MIG <profile>" by the driver
 * (cuda.h gives no attribute for it); their cuDeviceGetUuid is the MIG
 * UUID, which nvidia-smi and CUDA_VISIBLE_DEVICES spell "MIG-...". */
static bool cuda_device_mig(int index)
{
	char name[256];
	CUdevice dev;
	if (get_device(index, &dev) < 0 || cu.DeviceGetName(name, sizeof(name), dev) != CUDA_SUCCESS)
		return false;
	name[sizeof(name) - 1] = '\0';
	return strstr(name, " MIG ") != NULL;
}

static int cuda_device_name(int index, char *buf, size_t len)
{
	CUdevice dev;
	int rc = get_device(index, &dev);
	if (rc < 0)
		return rc;
	CUresult r = cu.DeviceGetName(buf, (int)(len > 4096 ? 4096 : len), dev);
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuDeviceGetName(%d)", index);
	buf[len - 1] = '\0';
	return 0;
}

static bool cuda_lost(void)
{
	return atomic_load(&sticky) != 0;
}

static int cuda_read_protection(gf_mem *m)
{
	return ((struct cu_dev *)m->priv)->read_prot;
}

static void alloc_prop(const struct cu_dev *d, CUmemAllocationProp *p)
{
	memset(p, 0, sizeof(*p));
	p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p->location.id = d->dev;
	p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

static int cuda_open(gf_mem *m, int device)
{
	CUdevice dev;
	int rc = get_device(device, &dev);
	if (rc < 0)
		return rc;
	int vmm = 0, posix = 0;
	CUresult r = cu.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, %d)", device);
	if (!vmm)
		return gf_err(GF_ERR_NOT_SUPPORTED, "cuda backend: device %d has no virtual memory management support", device);
	r = cu.DeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, %d)", device);
	if (!posix)
		return gf_err(GF_ERR_NOT_SUPPORTED,
			      "cuda backend: device %d cannot export memory as POSIX file descriptors", device);
	struct cu_dev *d = calloc(1, sizeof(*d));
	if (!d)
		return gf_err(GF_ERR_NOMEM, "cuda backend");
	d->dev = dev;
	d->pid = getpid();
	r = cu.DevicePrimaryCtxRetain(&d->primary, dev);
	if (r != CUDA_SUCCESS) {
		free(d);
		return cu_err(r, "cuDevicePrimaryCtxRetain(%d)", device);
	}
	m->priv = d;
	return 0;
}

static void cuda_close(gf_mem *m)
{
	struct cu_dev *d = m->priv;
	if (!d)
		return;
	cu.DevicePrimaryCtxRelease(d->dev);
	free(d);
	m->priv = NULL;
}

static int cuda_granularity(gf_mem *m, size_t *minimum, size_t *recommended)
{
	CUmemAllocationProp p;
	alloc_prop(m->priv, &p);
	int rc;
	rc = CU_CALL(m, cu.MemGetAllocationGranularity(minimum, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity(MINIMUM) on device %d", m->device);
	if (rc < 0)
		return rc;
	rc = CU_CALL(m, cu.MemGetAllocationGranularity(recommended, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "cuMemGetAllocationGranularity(RECOMMENDED) on device %d", m->device);
	return rc;
}

static int cuda_info(gf_mem *m, uint64_t *free_bytes, uint64_t *total_bytes)
{
	size_t f = 0, t = 0;
	int rc;
	rc = CU_CALL(m, cu.MemGetInfo(&f, &t), "cuMemGetInfo on device %d", m->device);
	if (rc == 0) {
		*free_bytes = f;
		*total_bytes = t;
	}
	return rc;
}

static int cuda_synchronize(gf_mem *m)
{
	int rc;
	rc = CU_CALL(m, cu.CtxSynchronize(), "cuCtxSynchronize on device %d", m->device);
	return rc;
}

static int cuda_create(gf_mem *m, size_t size, uint64_t *handle)
{
	CUmemAllocationProp p;
	CUmemGenericAllocationHandle h = 0;
	int rc;
	alloc_prop(m->priv, &p);
	rc = CU_CALL(m, cu.MemCreate(&h, size, &p, 0), "cuMemCreate(%zu bytes, POSIX fd handle) on device %d", size, m->device);
	if (rc == 0)
		*handle = h;
	return rc;
}

static int cuda_export(gf_mem *m, uint64_t handle, int *out_fd)
{
	int fd = -1, rc;
	rc = CU_CALL(m, cu.MemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "cuMemExportToShareableHandle on device %d", m->device);
	if (rc < 0)
		return rc;
	/* The driver does not promise O_CLOEXEC; the library's rule is that
	 * every fd it hands out has it. */
	if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		int e = errno;
		close(fd);
		return gf_err_errno(GF_ERR_IO, e, "export: set FD_CLOEXEC");
	}
	*out_fd = fd;
	return 0;
}

static int cuda_import(gf_mem *m, int fd, size_t size, uint64_t *handle)
{
	(void)size; /* the driver keeps the size with the allocation */
	struct cu_dev *d = m->priv;
	CUmemGenericAllocationHandle h = 0;
	bool pushed;
	int rc = ctx_enter(m, &pushed);
	if (rc < 0)
		return rc;
	CUresult r = cu.MemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	ctx_leave(pushed);
	if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_HANDLE) {
		cu_err(r, "cuMemImportFromShareableHandle(fd %d): not an allocation fd, or its exporting process has "
			  "exited and the driver revoked it", fd);
		return GF_ERR_INVALID_ARG;
	}
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuMemImportFromShareableHandle(fd %d) on device %d", fd, m->device);
	/* An allocation of another device would map (with peer access) or
	 * fail later with a vaguer error: the weights must be on our device. */
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	rc = CU_CALL(m, cu.MemGetAllocationPropertiesFromHandle(&prop, h),
		     "cuMemGetAllocationPropertiesFromHandle(fd %d) on device %d", fd, m->device);
	if (rc == 0 && (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != d->dev)) {
		/* Refused even with peer access: weights read over the
		 * interconnect would be silently slow. */
		int peer = 0;
		if (cu.DeviceCanAccessPeer(&peer, d->dev, prop.location.id) != CUDA_SUCCESS)
			peer = 0;
		rc = gf_err(GF_ERR_INVALID_ARG,
			    "import: the allocation of fd %d lives on device %d, this backend is on device %d "
			    "(peer access %s; the exporter and the importer must name the same GPU)",
			    fd, prop.location.id, m->device, peer ? "possible" : "impossible");
	}
	if (rc < 0) {
		CU_TEARDOWN(m, cu.MemRelease(h), "cuMemRelease");
		return rc;
	}
	*handle = h;
	return 0;
}

static int cuda_release(gf_mem *m, uint64_t handle)
{
	int rc;
	rc = CU_TEARDOWN(m, cu.MemRelease(handle), "cuMemRelease on device %d", m->device);
	return rc;
}

static int cuda_reserve(gf_mem *m, size_t size, size_t align, uint64_t *addr)
{
	CUdeviceptr p = 0;
	int rc;
	rc = CU_CALL(m, cu.MemAddressReserve(&p, size, align, 0, 0), "cuMemAddressReserve(%zu bytes, align %zu)", size, align);
	if (rc == 0)
		*addr = p;
	return rc;
}

static int cuda_free_va(gf_mem *m, uint64_t addr, size_t size)
{
	int rc;
	rc = CU_TEARDOWN(m, cu.MemAddressFree(addr, size), "cuMemAddressFree(0x%llx, %zu)", (unsigned long long)addr, size);
	return rc;
}

static int cuda_map(gf_mem *m, uint64_t addr, size_t size, uint64_t handle, int access)
{
	(void)access; /* set per span by cuda_set_access */
	int rc;
	rc = CU_CALL(m, cu.MemMap(addr, size, 0, handle, 0), "cuMemMap(0x%llx, %zu)", (unsigned long long)addr, size);
	return rc;
}

static int set_access(gf_mem *m, uint64_t addr, size_t size, unsigned long long flags)
{
	struct cu_dev *d = m->priv;
	CUmemAccessDesc desc;
	memset(&desc, 0, sizeof(desc));
	desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	desc.location.id = d->dev;
	desc.flags = (CUmemAccess_flags)flags;
	return CU_CALL(m, cu.MemSetAccess(addr, size, &desc, 1), "cuMemSetAccess(0x%llx, %zu, %s)",
		       (unsigned long long)addr, size,
		       flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "PROT_READWRITE" : "PROT_READ");
}

/*
 * Read-only mappings: the documentation defines PROT_READ but not whether a
 * device accepts or enforces it. Three outcomes are handled: enforced (the
 * driver keeps it), rejected (the driver refuses it: map read-write, log,
 * and report protection off) and ignored (the driver accepts it but reports
 * the range read-write: report protection off).
 */
static int cuda_set_access(gf_mem *m, uint64_t addr, size_t size, int access)
{
	struct cu_dev *d = m->priv;
	if (access == GF_MEM_READWRITE || d->read_prot == GF_MEM_READ_PROT_REJECTED)
		return set_access(m, addr, size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	bool pushed;
	int rc = ctx_enter(m, &pushed);
	if (rc < 0)
		return rc;
	CUmemAccessDesc desc;
	memset(&desc, 0, sizeof(desc));
	desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	desc.location.id = d->dev;
	desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	CUresult r = cu.MemSetAccess(addr, size, &desc, 1);
	unsigned long long got = 0;
	CUresult rg = r == CUDA_SUCCESS ? cu.MemGetAccess(&got, &desc.location, addr) : CUDA_SUCCESS;
	ctx_leave(pushed);
	if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED) {
		char num[32];
		gf_log(GF_LOG_WARN, "mem",
		       "backend=cuda device=%d error=%s read_protection=rejected msg=\"the driver refuses read-only "
		       "device mappings: mapping read-write, writes through read-only mappings are not caught\"",
		       m->device, error_name(r, num, sizeof(num)));
		d->read_prot = GF_MEM_READ_PROT_REJECTED;
		return set_access(m, addr, size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	}
	if (r != CUDA_SUCCESS)
		return cu_err(r, "cuMemSetAccess(0x%llx, %zu, PROT_READ)", (unsigned long long)addr, size);
	if (rg != CUDA_SUCCESS)
		return cu_err(rg, "cuMemGetAccess(0x%llx) after setting PROT_READ", (unsigned long long)addr);
	int now = got == CU_MEM_ACCESS_FLAGS_PROT_READ ? GF_MEM_READ_PROT_ENFORCED : GF_MEM_READ_PROT_IGNORED;
	if (now != d->read_prot && now == GF_MEM_READ_PROT_IGNORED)
		gf_log(GF_LOG_WARN, "mem",
		       "backend=cuda device=%d read_protection=ignored access=%llu msg=\"the driver accepted PROT_READ "
		       "but reports the mapping as read-write: writes through read-only mappings are not caught\"",
		       m->device, got);
	d->read_prot = now;
	return 0;
}

static int cuda_unmap(gf_mem *m, uint64_t addr, size_t size)
{
	int rc;
	rc = CU_TEARDOWN(m, cu.MemUnmap(addr, size), "cuMemUnmap(0x%llx, %zu)", (unsigned long long)addr, size);
	return rc;
}

/* ---- staged copies (xfer.c): pinned buffers, one stream, events ---- */

static int copy_check(void)
{
	if (!have_copy)
		return gf_err(GF_ERR_NOT_SUPPORTED, "cuda backend: the driver lacks the copy and stream entry points");
	return 0;
}

static int cuda_host_alloc(gf_mem *m, size_t size, void **p)
{
	int rc = copy_check();
	if (rc == 0)
		rc = CU_CALL(m, cuc.MemHostAlloc(p, size, 0), "cuMemHostAlloc(%zu bytes, pinned)", size);
	return rc;
}

static void cuda_host_free(gf_mem *m, void *p)
{
	(void)CU_CALL(m, cuc.MemFreeHost(p), "cuMemFreeHost");
}

static int cuda_stream_new(gf_mem *m, void **stream)
{
	CUstream s = NULL;
	int rc = copy_check();
	if (rc == 0)
		rc = CU_CALL(m, cuc.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate on device %d", m->device);
	if (rc == 0)
		*stream = s;
	return rc;
}

static void cuda_stream_free(gf_mem *m, void *stream)
{
	(void)CU_CALL(m, cuc.StreamDestroy(stream), "cuStreamDestroy");
}

static int cuda_event_new(gf_mem *m, void **event)
{
	CUevent e = NULL;
	int rc = copy_check();
	if (rc == 0)
		rc = CU_CALL(m, cuc.EventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate on device %d", m->device);
	if (rc == 0)
		*event = e;
	return rc;
}

static void cuda_event_free(gf_mem *m, void *event)
{
	(void)CU_CALL(m, cuc.EventDestroy(event), "cuEventDestroy");
}

static int cuda_copy_dtoh(gf_mem *m, void *dst, uint64_t src, size_t n, void *stream)
{
	return CU_CALL(m, cuc.MemcpyDtoHAsync(dst, src, n, stream), "cuMemcpyDtoHAsync(0x%llx, %zu bytes)",
		       (unsigned long long)src, n);
}

static int cuda_copy_htod(gf_mem *m, uint64_t dst, const void *src, size_t n, void *stream)
{
	return CU_CALL(m, cuc.MemcpyHtoDAsync(dst, src, n, stream), "cuMemcpyHtoDAsync(0x%llx, %zu bytes)",
		       (unsigned long long)dst, n);
}

static int cuda_event_record(gf_mem *m, void *event, void *stream)
{
	return CU_CALL(m, cuc.EventRecord(event, stream), "cuEventRecord");
}

static int cuda_event_wait(gf_mem *m, void *event)
{
	return CU_CALL(m, cuc.EventSynchronize(event), "cuEventSynchronize");
}

const struct gf_mem_backend gf_mem_cuda_backend = {
	.name = "cuda",
	.kind = GF_MEM_CUDA,
	.device_count = cuda_device_count,
	.device_uuid = cuda_device_uuid,
	.uuid_prefix = "GPU-",
	.device_mig = cuda_device_mig,
	.device_name = cuda_device_name,
	.read_protection = cuda_read_protection,
	.lost = cuda_lost,
	.open = cuda_open,
	.close = cuda_close,
	.granularity = cuda_granularity,
	.info = cuda_info,
	.synchronize = cuda_synchronize,
	.create = cuda_create,
	.export_fd = cuda_export,
	.import_fd = cuda_import,
	.release = cuda_release,
	.reserve = cuda_reserve,
	.free_va = cuda_free_va,
	.map = cuda_map,
	.set_access = cuda_set_access,
	.unmap = cuda_unmap,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.stream_new = cuda_stream_new,
	.stream_free = cuda_stream_free,
	.event_new = cuda_event_new,
	.event_free = cuda_event_free,
	.copy_dtoh = cuda_copy_dtoh,
	.copy_htod = cuda_copy_htod,
	.event_record = cuda_event_record,
	.event_wait = cuda_event_wait,
};
