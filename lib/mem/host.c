/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host backend: memfd + mmap. A real backend for CPU engines and tests,
 * with the same lifetime rule as the driver for free: the kernel keeps a
 * memfd's pages until its last fd and its last mapping are gone, in every
 * process (docs/design.md, decision 7).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"

/* Recommended granularity: a transparent huge page, as the driver's 2 MiB. */
#define HOST_GRAN_RECOMMENDED (2u * 1024 * 1024)

static int host_device_count(int *out)
{
	*out = 1;
	return 0;
}

/* 32 hex digits (dashes skipped) from the first line of @path. */
static bool read_id_file(const char *path, uint8_t out[16])
{
	char line[128];
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	bool ok = fgets(line, sizeof(line), f) != NULL;
	fclose(f);
	if (!ok)
		return false;
	char digits[32];
	size_t n = 0;
	for (const char *p = line; *p && *p != '\n' && n < sizeof(digits); p++)
		if (*p != '-')
			digits[n++] = *p;
	return n == sizeof(digits) && gf_unhex(digits, 16, out) == 0;
}

/* The machine's identity: machine-id (stable across boots), else boot_id. */
static int host_device_uuid(int index, uint8_t uuid[16])
{
	if (index != 0)
		return gf_err(GF_ERR_NOT_FOUND, "host backend has one device (0), not %d", index);
	if (read_id_file("/etc/machine-id", uuid) || read_id_file("/var/lib/dbus/machine-id", uuid) ||
	    read_id_file("/proc/sys/kernel/random/boot_id", uuid))
		return 0;
	return gf_err(GF_ERR_IO, "host uuid: none of /etc/machine-id, /var/lib/dbus/machine-id, "
				 "/proc/sys/kernel/random/boot_id is readable");
}

static int host_open(gf_mem *m, int device)
{
	if (device != 0)
		return gf_err(GF_ERR_NOT_FOUND, "host backend has one device (0), not %d", device);
	m->priv = NULL;
	return 0;
}

static void host_close(gf_mem *m)
{
	(void)m;
}

static int host_granularity(gf_mem *m, size_t *minimum, size_t *recommended)
{
	(void)m;
	long page = sysconf(_SC_PAGESIZE);
	*minimum = page > 0 ? (size_t)page : 4096;
	*recommended = HOST_GRAN_RECOMMENDED > *minimum ? HOST_GRAN_RECOMMENDED : *minimum;
	return 0;
}

/*
 * MemAvailable is at least MemFree less the kernel's reserves (watermarks
 * and lowmem reserves, a few percent of RAM at most): free memory beyond a
 * sixteenth of RAM is available for sure, and sysinfo(2) costs far less than
 * /proc/meminfo, which the kernel computes field by field.
 */
static bool host_plenty_free(gf_mem *m, uint64_t need)
{
	(void)m;
	const char *knob = getenv("GF_MEM_HOST_AVAILABLE");
	struct sysinfo si;
	if ((knob && *knob) || sysinfo(&si) < 0)
		return false;
	uint64_t unit = si.mem_unit ? si.mem_unit : 1;
	uint64_t freeb = (uint64_t)si.freeram * unit, margin = (uint64_t)si.totalram * unit / 16;
	return freeb > margin && freeb - margin >= need;
}

static int host_info(gf_mem *m, uint64_t *free_bytes, uint64_t *total_bytes)
{
	(void)m;
	char line[256];
	uint64_t avail = 0, total = 0;
	bool have_avail = false, have_total = false;
	FILE *f = fopen("/proc/meminfo", "re");
	if (!f)
		return gf_err_errno(GF_ERR_IO, errno, "open /proc/meminfo");
	/* Both are among the first lines: stop there (the gate asks on every wake). */
	while ((!have_total || !have_avail) && fgets(line, sizeof(line), f)) {
		uint64_t kb;
		if (sscanf(line, "MemTotal: %" SCNu64 " kB", &kb) == 1) {
			total = kb * 1024;
			have_total = true;
		} else if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1) {
			avail = kb * 1024;
			have_avail = true;
		}
	}
	fclose(f);
	if (!have_total || !have_avail)
		return gf_err(GF_ERR_IO, "/proc/meminfo lacks MemTotal or MemAvailable");
	/* Test knob: a machine short of memory on demand (the engine's memory
	 * gate). Empty is unset; refused loudly when it is not a plain byte
	 * count. */
	const char *knob = getenv("GF_MEM_HOST_AVAILABLE");
	if (knob && *knob) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(knob, &end, 10);
		if (errno || end == knob || *end || knob[0] == '-')
			return gf_err(GF_ERR_INVALID_ARG, "GF_MEM_HOST_AVAILABLE=\"%.32s\" is not a byte count", knob);
		avail = v;
	}
	*free_bytes = avail;
	*total_bytes = total;
	return 0;
}

static int host_synchronize(gf_mem *m)
{
	(void)m;
	return 0;
}

static int host_create(gf_mem *m, size_t size, uint64_t *handle)
{
	(void)m;
	int fd = memfd_create("gf-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return gf_err_errno(errno == ENOMEM ? GF_ERR_OUT_OF_MEMORY : GF_ERR_IO, errno, "memfd_create");
	if (ftruncate(fd, (off_t)size) < 0) {
		int e = errno;
		close(fd);
		return gf_err_errno(e == ENOMEM || e == ENOSPC || e == EFBIG ? GF_ERR_OUT_OF_MEMORY : GF_ERR_IO, e,
				    "ftruncate memfd to %zu bytes", size);
	}
	/* The size is final at once: a peer that shrinks a mapped memfd kills
	 * every process mapping it with SIGBUS. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK) < 0) {
		int e = errno;
		close(fd);
		return gf_err_errno(GF_ERR_IO, e, "seal the size of a memfd");
	}
	*handle = (uint64_t)fd;
	return 0;
}

/* A new open file description, read-only: writes, writable shared mappings
 * and truncation through it fail whatever the seals say. */
static int host_export_readonly(gf_mem *m, uint64_t handle, int *out_fd)
{
	(void)m;
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", (int)handle);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gf_err_errno(gf_errno_to_err(errno), errno, "export read-only: open %s", path);
	*out_fd = fd;
	return 0;
}

/* Committed: no write through any fd, no new writable mapping, from now on. */
static int host_seal(gf_mem *m, uint64_t handle)
{
	(void)m;
	if (fcntl((int)handle, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) < 0)
		return gf_err_errno(errno == EINVAL ? GF_ERR_NOT_SUPPORTED : GF_ERR_IO, errno, "seal a memfd against writes");
	return 0;
}

static int host_export(gf_mem *m, uint64_t handle, int *out_fd)
{
	(void)m;
	int fd = fcntl((int)handle, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return gf_err_errno(GF_ERR_IO, errno, "export: dup memfd");
	*out_fd = fd;
	return 0;
}

/* The memfd itself: sendmsg copies it into the peer, the handle keeps it. */
static int host_export_borrow(gf_mem *m, uint64_t handle, int *fd)
{
	(void)m;
	*fd = (int)handle;
	return 0;
}

/* The device number of the kernel's internal shmem mount, where every memfd
 * lives (tmpfs mounts such as /dev/shm have their own): one fstat then tells
 * a memfd from any other file, without a path lookup. */
static pthread_once_t memfd_dev_once = PTHREAD_ONCE_INIT;
static dev_t memfd_dev;
static bool memfd_dev_known;

static void find_memfd_dev(void)
{
	struct stat st;
	int fd = memfd_create("gf-probe", MFD_CLOEXEC);
	if (fd >= 0 && fstat(fd, &st) == 0) {
		memfd_dev = st.st_dev;
		memfd_dev_known = true;
	}
	gf_close(fd);
}

/* Is @fd a memfd of exactly @size bytes? One fstat. */
static int host_check_import(int fd, size_t size)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return gf_err_errno(GF_ERR_INVALID_ARG, errno, "import: fd %d", fd);
	pthread_once(&memfd_dev_once, find_memfd_dev);
	if (!memfd_dev_known)
		return gf_err(GF_ERR_IO, "import: cannot create a memfd to compare with");
	if (!S_ISREG(st.st_mode) || st.st_dev != memfd_dev)
		return gf_err(GF_ERR_INVALID_ARG, "import: fd %d is not a memfd allocation", fd);
	if ((uint64_t)st.st_size != (uint64_t)size)
		return gf_err(GF_ERR_INVALID_ARG, "import: fd %d holds %jd bytes, expected %zu", fd, (intmax_t)st.st_size,
			      size);
	return 0;
}

static int host_import(gf_mem *m, int fd, size_t size, uint64_t *handle)
{
	(void)m;
	int rc = host_check_import(fd, size);
	if (rc < 0)
		return rc;
	int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (own < 0)
		return gf_err_errno(GF_ERR_IO, errno, "import: dup fd %d", fd);
	*handle = (uint64_t)own;
	return 0;
}

/* The handle is the fd: taking it over saves the dup and the caller's close. */
static int host_import_adopt(gf_mem *m, int fd, size_t size, uint64_t *handle)
{
	(void)m;
	int rc = host_check_import(fd, size);
	if (rc < 0)
		return rc;
	*handle = (uint64_t)fd;
	return 0;
}

static int host_release(gf_mem *m, uint64_t handle)
{
	(void)m;
	/* close() always releases the descriptor on Linux, even on EINTR. */
	close((int)handle);
	return 0;
}

static int host_reserve(gf_mem *m, size_t size, size_t align, uint64_t *addr)
{
	/* mmap is page-aligned already; over-reserve only for larger alignment. */
	size_t total = align > m->gran_min ? size + align : size;
	uint8_t *p = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return gf_err_errno(errno == ENOMEM ? GF_ERR_OUT_OF_MEMORY : GF_ERR_IO, errno,
				    "reserve %zu bytes of address space", size);
	uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
	size_t head = start - (uintptr_t)p, tail = total - head - size;
	if (head)
		munmap(p, head);
	if (tail)
		munmap((uint8_t *)start + size, tail);
	*addr = start;
	return 0;
}

static int host_free_va(gf_mem *m, uint64_t addr, size_t size)
{
	(void)m;
	if (munmap((void *)(uintptr_t)addr, size) < 0)
		return gf_err_errno(GF_ERR_IO, errno, "munmap reservation");
	return 0;
}

/* Put the PROT_NONE placeholder back over [addr, addr+size). */
static int host_unmap(gf_mem *m, uint64_t addr, size_t size)
{
	(void)m;
	void *p = mmap((void *)(uintptr_t)addr, size, PROT_NONE,
		       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return gf_err_errno(GF_ERR_IO, errno, "unmap: restore reservation");
	return 0;
}

static int host_protect(gf_mem *m, uint64_t addr, size_t size, int access)
{
	(void)m;
	int prot = access == GF_MEM_READWRITE ? PROT_READ | PROT_WRITE : access ? PROT_READ : PROT_NONE;
	if (mprotect((void *)(uintptr_t)addr, size, prot) < 0)
		return gf_err_errno(errno == ENOMEM ? GF_ERR_OUT_OF_MEMORY : GF_ERR_IO, errno, "mprotect %zu bytes", size);
	return 0;
}

static int host_move(gf_mem *m, uint64_t from, size_t size, uint64_t to, bool placeholder)
{
	(void)m;
	/* MREMAP_FIXED replaces whatever is at @to (a parking range, or the
	 * placeholder at the mapping's own address); the page tables move with
	 * the mapping. */
	void *p = mremap((void *)(uintptr_t)from, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)to);
	if (p == MAP_FAILED)
		return gf_err_errno(errno == ENOMEM ? GF_ERR_OUT_OF_MEMORY : GF_ERR_IO, errno, "mremap %zu bytes", size);
	if (placeholder &&
	    mmap((void *)(uintptr_t)from, size, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
		 0) == MAP_FAILED) {
		int err = errno;
		/* Without the placeholder the range is not ours: move back. */
		if (mremap(p, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)from) == MAP_FAILED)
			gf_log(GF_LOG_ERR, "mem", "backend=host msg=\"a parked mapping could not be moved back\"");
		return gf_err_errno(GF_ERR_IO, err, "park: restore reservation");
	}
	return 0;
}

/*
 * Does mremap move a range that spans several mappings (Linux 6.17)? Asked
 * once, with two adjacent one-page mappings of different access (two
 * mappings the kernel cannot merge) moved to a scratch range of our own: a
 * kernel that refuses does so after it unmapped the destination, which must
 * never be a reservation somebody relies on.
 */
static bool spans_move;
static pthread_once_t spans_once = PTHREAD_ONCE_INIT;

static void probe_spans(void)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	uint8_t *src = mmap(NULL, 2 * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uint8_t *dst = mmap(NULL, 2 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (src != MAP_FAILED && dst != MAP_FAILED && mprotect(src + pg, pg, PROT_READ | PROT_WRITE) == 0)
		spans_move = mremap(src, 2 * pg, 2 * pg, MREMAP_MAYMOVE | MREMAP_FIXED, dst) == dst;
	/* Whatever moved, both ranges go. */
	if (src != MAP_FAILED)
		munmap(src, 2 * pg);
	if (dst != MAP_FAILED)
		munmap(dst, 2 * pg);
}

static bool host_move_spans(gf_mem *m)
{
	(void)m;
	pthread_once(&spans_once, probe_spans);
	return spans_move;
}

static int host_map(gf_mem *m, uint64_t addr, size_t size, uint64_t handle, int access)
{
	int prot = access == GF_MEM_READWRITE ? PROT_READ | PROT_WRITE : PROT_READ;
	void *p = mmap((void *)(uintptr_t)addr, size, prot, MAP_FIXED | MAP_SHARED, (int)handle, 0);
	if (p == MAP_FAILED) {
		int e = errno;
		/* A failed MAP_FIXED may have dropped the placeholder: keep the
		 * reservation whole so nobody else gets these addresses. */
		host_unmap(m, addr, size);
		return gf_err_errno(e == ENOMEM ? GF_ERR_OUT_OF_MEMORY : e == EACCES ? GF_ERR_PERMISSION : GF_ERR_IO, e,
				    "map %zu bytes %s", size, access == GF_MEM_READWRITE ? "read-write" : "read-only");
	}
	return 0;
}

const struct gf_mem_backend gf_mem_host_backend = {
	.name = "host",
	.kind = GF_MEM_HOST,
	.caps = GF_MEM_CAP_CREATE_FREE | GF_MEM_CAP_FILES | GF_MEM_CAP_HOST_PAGES,
	.device_count = host_device_count,
	.device_uuid = host_device_uuid,
	.uuid_prefix = "HOST-",
	.open = host_open,
	.close = host_close,
	.granularity = host_granularity,
	.protect = host_protect,
	.move = host_move,
	.info = host_info,
	.plenty_free = host_plenty_free,
	.synchronize = host_synchronize,
	.create = host_create,
	.export_fd = host_export,
	.import_fd = host_import,
	.import_adopt = host_import_adopt,
	.export_borrow = host_export_borrow,
	.export_readonly = host_export_readonly,
	.seal = host_seal,
	.release = host_release,
	.reserve = host_reserve,
	.free_va = host_free_va,
	.map = host_map,
	.set_access = NULL,
	.unmap = host_unmap,
	.unmap_spans = true,
	.move_spans = host_move_spans,
};
