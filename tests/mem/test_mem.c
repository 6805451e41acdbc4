/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory API on one backend, chosen by argv[1] ("host" or "cuda"; the
 * cuda run points GF_LIBCUDA at tests/fakecuda's libcuda.so.1, whose "device
 * addresses" are host addresses, so data is checked through the pointers).
 * Cross-process cases fork and pass fds over a socketpair with the wire's
 * gf_frame_send/gf_frame_recv, as the GMS does.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "memtest.h"
#include "mem_int.h"
#include "wire.h"

/* Set in forked children: they report by exit status, never through cmocka. */
static bool in_child;

static pid_t fork_child(void)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		in_child = true;
	return pid;
}

static size_t gran(gf_mem *m)
{
	size_t g = 0;
	assert_int_equal(gf_mem_granularity(m, &g, NULL), 0);
	return g;
}

static void *ptr(gf_mem_va *va, size_t off)
{
	return (void *)(uintptr_t)(gf_mem_va_addr(va) + off);
}

/* ---- fd passing over the wire ---- */

static void send_fd(int sock, const char *tag, int fd)
{
	int rc = gf_frame_send(sock, tag, strlen(tag) + 1, fd >= 0 ? &fd : NULL, fd >= 0, gf_deadline_from_ms(TU_MS(5000)));
	if (rc < 0 && in_child)
		_exit(20);
	if (rc < 0)
		fail_msg("send %s: %s: %s", tag, gf_error_name(rc), gf_error_detail());
}

/* Receive a message; checks its tag; returns its fd or -1. */
static int recv_fd(int sock, const char *tag)
{
	struct gf_frame_reader r;
	int *fds = NULL, fd = -1;
	size_t nfds = 0;
	gf_frame_reader_init(&r, 4);
	int rc = gf_frame_recv(&r, sock, gf_deadline_from_ms(TU_MS(5000)));
	if (rc != 1 && in_child)
		_exit(21);
	if (rc != 1)
		fail_msg("recv %s: %s: %s", tag, gf_error_name(rc), gf_error_detail());
	if (strcmp((const char *)r.body, tag) != 0) {
		if (in_child)
			_exit(22);
		fail_msg("expected message %s, got %s", tag, (const char *)r.body);
	}
	gf_frame_reader_take_fds(&r, &fds, &nfds);
	if (nfds)
		fd = fds[0];
	free(fds);
	gf_frame_reader_clear(&r);
	return fd;
}

static int wait_child(pid_t pid)
{
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	return st;
}

/* ---- device identity ---- */

static void test_identity(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	char uuid[64], prefix[16];
	int n = 0, idx = -1;
	size_t mn = 0, rec = 0;
	uint64_t fr = 0, tot = 0;

	assert_int_equal(gf_mem_device(m), 0);
	assert_string_equal(gf_mem_kind_name(mt_kind), mt_kind == GF_MEM_HOST ? "host" : "cuda");
	assert_int_equal(gf_mem_device_count(mt_kind, &n), 0);
	assert_true(n >= 1);
	assert_int_equal(gf_mem_granularity(m, &mn, &rec), 0);
	assert_true(mn >= 4096 && (mn & (mn - 1)) == 0);
	assert_true(rec >= mn && (rec & (rec - 1)) == 0);
	assert_int_equal(gf_mem_info(m, &fr, &tot), 0);
	assert_true(tot > 0 && fr <= tot);
	assert_int_equal(gf_mem_synchronize(m), 0);

	assert_int_equal(gf_mem_device_uuid(m, uuid, sizeof(uuid)), 0);
	const char *pre = mt_kind == GF_MEM_HOST ? "HOST-" : "GPU-";
	assert_memory_equal(uuid, pre, strlen(pre));
	assert_int_equal(strlen(uuid), strlen(pre) + 36);
	assert_int_equal(gf_mem_device_uuid(m, uuid, 20), GF_ERR_INVALID_ARG);

	assert_int_equal(gf_mem_uuid_to_index(mt_kind, uuid, &idx), 0);
	assert_int_equal(idx, 0);
	idx = -1;
	assert_int_equal(gf_mem_uuid_to_index(mt_kind, uuid + strlen(pre), &idx), 0);
	assert_int_equal(idx, 0);
	snprintf(prefix, sizeof(prefix), "%.*s", (int)strlen(pre) + 8, uuid);
	if (n == 1) {
		idx = -1;
		assert_int_equal(gf_mem_uuid_to_index(mt_kind, prefix, &idx), 0);
		assert_int_equal(idx, 0);
	}
	assert_int_equal(gf_mem_uuid_to_index(mt_kind, "GPU-zzzz", &idx), GF_ERR_NOT_FOUND);
	assert_int_equal(gf_mem_uuid_to_index(mt_kind, "", &idx), GF_ERR_INVALID_ARG);

	gf_mem *bad = NULL;
	assert_int_equal(gf_mem_open(&bad, mt_kind, 4096), GF_ERR_NOT_FOUND);
	assert_null(bad);
	assert_int_equal(gf_mem_open(&bad, 42, 0), GF_ERR_INVALID_ARG);
	gf_mem_free(m);
	gf_mem_free(NULL);
}

/* ---- one process: states, RW and RO views, remap at the same address ---- */

static void test_states_single_process(void **state)
{
	(void)state;
	int fds_before = tu_count_fds();
	gf_mem *m = mt_open();
	size_t g = gran(m);
	gf_mem_alloc *a = NULL, *imp = NULL;
	gf_mem_va *rw = NULL, *ro = NULL;
	int fd = -1;

	assert_int_equal(gf_mem_create(&a, m, 0), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_create(&a, m, g + 1), 0);
	assert_int_equal(gf_mem_alloc_size(a), 2 * g);
	assert_int_equal(gf_mem_alloc_state(a), GF_MEM_ALLOC_CREATED);

	assert_int_equal(gf_mem_export(a, &fd), 0);
	assert_true(fd >= 0);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	assert_int_equal(gf_mem_import(&imp, m, fd, 2 * g), 0);
	close(fd);
	assert_int_equal(gf_mem_alloc_state(imp), GF_MEM_ALLOC_IMPORTED);

	assert_int_equal(gf_mem_reserve(&rw, m, 4 * g, 0), 0);
	assert_int_equal(gf_mem_va_size(rw), 4 * g);
	assert_int_equal(gf_mem_va_addr(rw) % g, 0);
	assert_int_equal(gf_mem_reserve(&ro, m, 2 * g, 0), 0);
	gf_mem_va *big = NULL;
	gf_mem_alloc *big_alloc = NULL;
	assert_int_equal(gf_mem_reserve(&big, m, g, 3 * g), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_reserve(&big, m, g, 8 * g), 0);
	assert_int_equal(gf_mem_va_addr(big) % (8 * g), 0);
	gf_mem_va_free(big);
	assert_int_equal(gf_mem_reserve(&big, m, g, (size_t)1 << 62), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_reserve(&big, m, SIZE_MAX, 0), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_map_many(rw, NULL, 0, GF_MEM_READ), 0);
	assert_int_equal(gf_mem_map_many(rw, NULL, 1, GF_MEM_READ), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_create(&big_alloc, m, SIZE_MAX), GF_ERR_INVALID_ARG);

	assert_int_equal(gf_mem_map(rw, g, a, GF_MEM_READWRITE), 0);
	assert_int_equal(gf_mem_alloc_state(a), GF_MEM_ALLOC_MAPPED);
	assert_int_equal(gf_mem_map(ro, 0, imp, GF_MEM_READ), 0);

	uint8_t *w = ptr(rw, g);
	const uint8_t *r = ptr(ro, 0);
	memset(w, 0xab, 2 * g);
	w[2 * g - 1] = 0x5a;
	assert_int_equal(r[0], 0xab);
	assert_int_equal(r[2 * g - 1], 0x5a);

	/* Wrong-state and bad-range calls are errors, never crashes. */
	assert_int_equal(gf_mem_release(a), GF_ERR_BUSY);
	assert_int_equal(gf_mem_map(rw, 2 * g, a, GF_MEM_READWRITE), GF_ERR_INVALID_ARG); /* overlaps */
	assert_int_equal(gf_mem_map(rw, 3 * g, a, GF_MEM_READWRITE), GF_ERR_INVALID_ARG); /* past the end */
	assert_int_equal(gf_mem_map(rw, 1, a, GF_MEM_READWRITE), GF_ERR_INVALID_ARG);     /* unaligned */
	assert_int_equal(gf_mem_map(rw, 0, a, 2), GF_ERR_INVALID_ARG);                    /* bad access */

	/* Freeing a mapped allocation keeps it until its last mapping goes; then
	 * it is released (the fd count at the end shows it went). */
	gf_mem_alloc *dropped = NULL;
	gf_mem_va *dva = NULL;
	assert_int_equal(gf_mem_create(&dropped, m, g), 0);
	assert_int_equal(gf_mem_reserve(&dva, m, g, 0), 0);
	assert_int_equal(gf_mem_map(dva, 0, dropped, GF_MEM_READWRITE), 0);
	gf_mem_alloc_free(dropped);
	uint8_t *dp = ptr(dva, 0);
	dp[g - 1] = 0x42;
	assert_int_equal(dp[g - 1], 0x42);
	gf_mem_va_free(dva);

	/* Unmap keeps the reservation; remap at the same address sees the data. */
	uint64_t addr = gf_mem_va_addr(rw);
	assert_int_equal(gf_mem_unmap_all(rw), 0);
	assert_int_equal(gf_mem_alloc_state(a), GF_MEM_ALLOC_UNMAPPED);
	assert_int_equal(gf_mem_va_addr(rw), addr);
	assert_int_equal(gf_mem_map(rw, g, a, GF_MEM_READWRITE), 0);
	assert_int_equal(w[0], 0xab);
	assert_int_equal(w[2 * g - 1], 0x5a);
	assert_int_equal(gf_mem_unmap_all(rw), 0);

	assert_int_equal(gf_mem_release(a), 0);
	assert_int_equal(gf_mem_alloc_state(a), GF_MEM_ALLOC_RELEASED);
	assert_int_equal(gf_mem_release(a), GF_ERR_STATE);
	assert_int_equal(gf_mem_export(a, &fd), GF_ERR_STATE);
	assert_int_equal(gf_mem_map(rw, 0, a, GF_MEM_READ), GF_ERR_STATE);

	/* The importer's handle keeps the memory alive (Decision 7). */
	assert_int_equal(r[0], 0xab);
	gf_mem_alloc_free(a);
	assert_int_equal(r[2 * g - 1], 0x5a);

	/* Freeing the backend first is allowed: objects keep it alive. */
	gf_mem_free(m);
	gf_mem_va_free(ro);
	assert_int_equal(gf_mem_alloc_state(imp), GF_MEM_ALLOC_UNMAPPED);
	gf_mem_alloc_free(imp);
	gf_mem_va_free(rw);
	gf_mem_alloc_free(NULL);
	gf_mem_va_free(NULL);
	assert_int_equal(tu_count_fds(), fds_before);
}

/* ---- two processes ---- */

static void test_two_processes(void **state)
{
	(void)state;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	gf_mem *m = mt_open();
	size_t g = gran(m);
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	int fd;
	assert_int_equal(gf_mem_create(&a, m, 2 * g), 0);
	assert_int_equal(gf_mem_reserve(&va, m, 2 * g, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READWRITE), 0);
	uint32_t *w = ptr(va, 0);
	w[0] = 0x11111111;
	w[2 * g / 4 - 1] = 0x22222222;
	assert_int_equal(gf_mem_export(a, &fd), 0);

	pid_t pid = fork_child();
	if (pid == 0) {
		/* The child: an importer with its own backend, as an engine. */
		close(sv[0]);
		gf_mem *cm = NULL;
		gf_mem_alloc *ca = NULL;
		gf_mem_va *cro = NULL, *crw = NULL;
		int cfd = recv_fd(sv[1], "alloc");
		if (cfd < 0 || gf_mem_open(&cm, mt_kind, 0) < 0 || gf_mem_import(&ca, cm, cfd, 2 * g) < 0)
			_exit(10);
		close(cfd);
		if (gf_mem_reserve(&cro, cm, 2 * g, 0) < 0 || gf_mem_map(cro, 0, ca, GF_MEM_READ) < 0)
			_exit(11);
		const volatile uint32_t *r = ptr(cro, 0);
		if (r[0] != 0x11111111 || r[2 * g / 4 - 1] != 0x22222222)
			_exit(12);
		send_fd(sv[1], "mapped", -1);
		recv_fd(sv[1], "written");
		if (r[1] != 0x33333333)
			_exit(13);
		/* Unmap and remap read-write at the same address, write back. */
		uint64_t addr = gf_mem_va_addr(cro);
		if (gf_mem_unmap_all(cro) < 0 || gf_mem_va_addr(cro) != addr)
			_exit(14);
		gf_mem_va_free(cro);
		if (gf_mem_reserve(&crw, cm, 2 * g, 0) < 0 || gf_mem_map(crw, 0, ca, GF_MEM_READWRITE) < 0)
			_exit(15);
		((volatile uint32_t *)ptr(crw, 0))[2] = 0x44444444;
		gf_mem_va_free(crw);
		if (gf_mem_release(ca) < 0 || gf_mem_release(ca) != GF_ERR_STATE)
			_exit(16);
		gf_mem_alloc_free(ca);
		gf_mem_free(cm);
		send_fd(sv[1], "done", -1);
		_exit(0);
	}
	close(sv[1]);
	send_fd(sv[0], "alloc", fd);
	close(fd);
	recv_fd(sv[0], "mapped");
	w[1] = 0x33333333;
	send_fd(sv[0], "written", -1);
	recv_fd(sv[0], "done");
	int st = wait_child(pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(w[2], 0x44444444);
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
	close(sv[0]);
}

/* A write through a read-only mapping must fault: checked in a child. */
static void test_readonly_faults(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	size_t g = gran(m);
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	assert_int_equal(gf_mem_create(&a, m, g), 0);
	assert_int_equal(gf_mem_reserve(&va, m, g, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READ), 0);
	volatile uint8_t *p = ptr(va, 0);
	assert_int_equal(p[0], 0); /* reading is fine */

	pid_t pid = fork_child();
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		p[0] = 1;
		_exit(0);
	}
	int st = wait_child(pid);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGSEGV);
	assert_int_equal(p[0], 0);

	/* After unmap the range is reserved but inaccessible. */
	assert_int_equal(gf_mem_unmap_all(va), 0);
	pid = fork_child();
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		(void)p[0];
		_exit(0);
	}
	st = wait_child(pid);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGSEGV);
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

/* Pages of [@addr, +@len) whose page table entry is present (/proc/self/pagemap bit 63); -1: unreadable. */
static long present_pages(const void *addr, size_t len)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	long n = 0;
	for (uintptr_t a = (uintptr_t)addr; a < (uintptr_t)addr + len; a += 4096) {
		uint64_t e;
		if (pread(fd, &e, sizeof(e), (off_t)(a / 4096 * sizeof(e))) != (ssize_t)sizeof(e)) {
			n = -1;
			break;
		}
		n += (long)(e >> 63);
	}
	close(fd);
	return n;
}

/*
 * Fencing in place: with the mappings fenced every access faults, as when
 * unmapped; opened again, each has the access it was mapped with, the bytes
 * are there, and (host) the page tables stayed: every page is still present.
 * cuda cannot, and says so.
 */
static void test_set_accessible(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	size_t g = gran(m);
	gf_mem_alloc *a = NULL, *b = NULL;
	gf_mem_va *va = NULL;
	assert_int_equal(gf_mem_create(&a, m, g), 0);
	assert_int_equal(gf_mem_create(&b, m, g), 0);
	assert_int_equal(gf_mem_reserve(&va, m, 2 * g, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READWRITE), 0);
	assert_int_equal(gf_mem_map(va, g, b, GF_MEM_READ), 0);
	volatile uint8_t *p = ptr(va, 0), *q = ptr(va, g);
	memset((void *)p, 7, g);
	assert_int_equal(gf_mem_set_accessible(NULL, 0), GF_ERR_INVALID_ARG);
	if (mt_kind == GF_MEM_CUDA) {
		assert_int_equal(gf_mem_set_accessible(va, 0), GF_ERR_NOT_SUPPORTED);
		assert_int_equal(p[0], 7); /* untouched */
	} else {
		for (size_t i = 0; i < g; i += 4096)
			(void)q[i];
		assert_int_equal(gf_mem_set_accessible(va, 0), 0);
		for (int which = 0; which < 2; which++) {
			pid_t pid = fork_child();
			if (pid == 0) {
				signal(SIGSEGV, SIG_DFL);
				(void)(which ? q[0] : p[0]);
				_exit(0);
			}
			int st = wait_child(pid);
			assert_true(WIFSIGNALED(st));
			assert_int_equal(WTERMSIG(st), SIGSEGV);
		}
		assert_int_equal(gf_mem_alloc_state(a), GF_MEM_ALLOC_MAPPED); /* still holds it */
		assert_int_equal(gf_mem_set_accessible(va, 1), 0);
		/* The page tables stayed: every page is present before anything touches it again. */
		assert_int_equal(present_pages((const void *)p, 2 * g), 2 * g / 4096);
		unsigned sum = 0;
		for (size_t i = 0; i < g; i += 4096)
			sum += p[i] + q[i];
		assert_int_equal(sum, 7 * (g / 4096));
		p[1] = 8; /* read-write again */
		pid_t pid = fork_child();
		if (pid == 0) {
			signal(SIGSEGV, SIG_DFL);
			q[0] = 1; /* read-only again */
			_exit(0);
		}
		int st = wait_child(pid);
		assert_true(WIFSIGNALED(st));
	}
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	gf_mem_alloc_free(b);
	gf_mem_free(m);
}

/*
 * What the backend says it can do (what the GMS and the tiers ask instead of
 * its kind) is what it does: host allocations are files that host code can
 * map, filled on first touch, creatable ahead and fenceable in place; cuda
 * claims none of it.
 */
static void test_caps(void **state)
{
	(void)state;
	assert_int_equal(gf_mem_caps(NULL), 0);
	gf_mem *m = mt_open();
	unsigned caps = gf_mem_caps(m);
	if (mt_kind == GF_MEM_CUDA) {
		assert_int_equal(caps, 0);
		gf_mem_free(m);
		return;
	}
	assert_int_equal(caps, GF_MEM_CAP_CREATE_FREE | GF_MEM_CAP_FILES | GF_MEM_CAP_HOST_PAGES | GF_MEM_CAP_FENCE);
	size_t g = gran(m);
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	assert_int_equal(gf_mem_create(&a, m, g), 0);
	assert_int_equal(gf_mem_reserve(&va, m, g, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READWRITE), 0);
	memset(ptr(va, 0), 0x5a, g);
	/* FILES: an exported fd maps in plain host code, with the same bytes and one inode. */
	int fd = -1;
	struct stat st1, st2;
	assert_int_equal(gf_mem_export(a, &fd), 0);
	int fd2 = -1;
	assert_int_equal(gf_mem_export(a, &fd2), 0);
	assert_int_equal(fstat(fd, &st1), 0);
	assert_int_equal(fstat(fd2, &st2), 0);
	assert_true(st1.st_ino == st2.st_ino);
	const uint8_t *f = mmap(NULL, g, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(f != MAP_FAILED);
	assert_int_equal(f[0], 0x5a);
	assert_int_equal(f[g - 1], 0x5a);
	munmap((void *)f, g);
	close(fd);
	close(fd2);
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

/*
 * Fencing large mappings (host): they are moved away whole (parked, page
 * tables and all) and a placeholder takes their place, so a stale pointer
 * faults; reopened, they are back at their addresses with every page
 * present and their access; and an unmap while parked lets go of them.
 * A small mapping beside them is fenced in place as before.
 */
static void test_set_accessible_parks_large_mappings(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	size_t g = gran(m), big = 4u << 20;
	gf_mem_alloc *a = NULL, *b = NULL, *c = NULL;
	gf_mem_va *va = NULL;
	assert_int_equal(gf_mem_create(&a, m, big), 0);
	assert_int_equal(gf_mem_create(&b, m, big), 0);
	assert_int_equal(gf_mem_create(&c, m, g), 0);
	assert_int_equal(gf_mem_reserve(&va, m, 2 * big + g, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READWRITE), 0);
	assert_int_equal(gf_mem_map(va, big, b, GF_MEM_READ), 0);
	assert_int_equal(gf_mem_map(va, 2 * big, c, GF_MEM_READWRITE), 0);
	volatile uint8_t *p = ptr(va, 0), *q = ptr(va, big), *s = ptr(va, 2 * big);
	memset((void *)p, 9, big);
	memset((void *)s, 3, g);
	for (size_t i = 0; i < big; i += 4096)
		(void)q[i];
	int mapped = tu_memfd_mappings();
	for (int round = 0; round < 2; round++) {
		assert_int_equal(gf_mem_set_accessible(va, 0), 0);
		assert_int_equal(tu_memfd_mappings(), mapped); /* moved, not unmapped */
		for (int which = 0; which < 3; which++) {
			pid_t pid = fork_child();
			if (pid == 0) {
				signal(SIGSEGV, SIG_DFL);
				(void)(which == 0 ? p[0] : which == 1 ? q[0] : s[0]);
				_exit(0);
			}
			int st = wait_child(pid);
			assert_true(WIFSIGNALED(st));
			assert_int_equal(WTERMSIG(st), SIGSEGV);
		}
		assert_int_equal(gf_mem_alloc_state(a), GF_MEM_ALLOC_MAPPED);
		assert_int_equal(gf_mem_set_accessible(va, 1), 0);
		assert_int_equal(present_pages((const void *)p, 2 * big), 2 * big / 4096);
		unsigned long sum = 0;
		for (size_t i = 0; i < big; i += 4096)
			sum += p[i];
		assert_int_equal(sum, 9 * (big / 4096));
		assert_int_equal(s[g - 1], 3);
		p[1] = 8; /* read-write again */
		pid_t pid = fork_child();
		if (pid == 0) {
			signal(SIGSEGV, SIG_DFL);
			q[0] = 1; /* read-only again */
			_exit(0);
		}
		assert_true(WIFSIGNALED(wait_child(pid)));
	}
	/* Unmapped while parked: nothing of them stays mapped anywhere. */
	assert_int_equal(gf_mem_set_accessible(va, 0), 0);
	assert_int_equal(gf_mem_unmap_all(va), 0);
	assert_int_equal(tu_memfd_mappings(), mapped - 3);
	gf_mem_alloc_free(a);
	gf_mem_alloc_free(b);
	gf_mem_alloc_free(c);
	gf_mem_va_free(va);
	gf_mem_free(m);
}

/*
 * Reopening moves each run of adjacent parked mappings back together (one
 * move where the kernel can): runs split by a gap in the reservation and by
 * a small mapping fenced in place each come back whole, every mapping at its
 * own address with its own bytes, pages and access, and nothing is left in
 * the parking range.
 */
static void test_set_accessible_unparks_runs(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	size_t g = gran(m), big = 2u << 20;
	/* offsets: 0 1 2 (run), small, 4 5 (run), gap, 7 (alone), 8 9 (run) in units of big */
	static const int at[] = { 0, 1, 2, 4, 5, 7, 8, 9 };
	enum { NBIG = sizeof(at) / sizeof(at[0]) };
	gf_mem_alloc *a[NBIG], *small = NULL;
	gf_mem_va *va = NULL;
	assert_int_equal(gf_mem_reserve(&va, m, 10 * big, 0), 0);
	for (int i = 0; i < NBIG; i++) {
		assert_int_equal(gf_mem_create(&a[i], m, big), 0);
		assert_int_equal(gf_mem_map(va, (size_t)at[i] * big, a[i], i == 4 ? GF_MEM_READ : GF_MEM_READWRITE), 0);
		if (i != 4)
			memset(ptr(va, (size_t)at[i] * big), 'a' + i, big);
	}
	assert_int_equal(gf_mem_create(&small, m, g), 0);
	assert_int_equal(gf_mem_map(va, 3 * big, small, GF_MEM_READWRITE), 0);
	memset(ptr(va, 3 * big), 's', g);
	int mapped = tu_memfd_mappings();
	for (int round = 0; round < 2; round++) {
		assert_int_equal(gf_mem_set_accessible(va, 0), 0);
		assert_int_equal(gf_mem_set_accessible(va, 1), 0);
		assert_int_equal(tu_memfd_mappings(), mapped);
		for (int i = 0; i < NBIG; i++) {
			const volatile uint8_t *p = ptr(va, (size_t)at[i] * big);
			uint8_t want = i == 4 ? 0 : (uint8_t)('a' + i);
			assert_int_equal(p[0], want);
			assert_int_equal(p[big - 1], want);
		}
		assert_int_equal(((const uint8_t *)ptr(va, 3 * big))[g - 1], 's');
		/* Written on the first round, before the fence of the second: the pages stayed. */
		assert_int_equal(present_pages(ptr(va, 0), 3 * big), (long)(3 * big / 4096));
		((volatile uint8_t *)ptr(va, 9 * big))[1] = 'a' + 7; /* read-write again */
		pid_t pid = fork_child();
		if (pid == 0) {
			signal(SIGSEGV, SIG_DFL);
			((volatile uint8_t *)ptr(va, 5 * big))[0] = 1; /* the read-only one stays so */
			_exit(0);
		}
		assert_true(WIFSIGNALED(wait_child(pid)));
	}
	assert_int_equal(gf_mem_unmap_all(va), 0);
	assert_int_equal(tu_memfd_mappings(), mapped - NBIG - 1);
	for (int i = 0; i < NBIG; i++)
		gf_mem_alloc_free(a[i]);
	gf_mem_alloc_free(small);
	gf_mem_va_free(va);
	gf_mem_free(m);
}

/* Start of a mapping in /proc/self/maps of @len bytes with @perms that does not start at any of @old[0..n). */
static uintptr_t new_mapping(const uintptr_t *old, size_t n, size_t len, const char *perms)
{
	FILE *f = fopen("/proc/self/maps", "r");
	assert_non_null(f);
	char line[512];
	uintptr_t found = 0;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned long a, b;
		char pm[8];
		if (sscanf(line, "%lx-%lx %7s", &a, &b, pm) != 3 || b - a != len || strcmp(pm, perms) != 0)
			continue;
		bool seen = false;
		for (size_t i = 0; i < n; i++)
			seen |= old[i] == a;
		if (!seen)
			found = a;
	}
	fclose(f);
	return found;
}

/*
 * The opening leaves the parking range to the next fence or unmap (one call
 * less on a wake), but the places the mappings came back from are holes
 * that anybody may map since: giving the rest back must not unmap them.
 */
static void test_parking_range_holes_stay_others(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	size_t big = 4u << 20;
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	assert_int_equal(gf_mem_create(&a, m, big), 0);
	assert_int_equal(gf_mem_reserve(&va, m, 3 * big, 0), 0);
	assert_int_equal(gf_mem_map(va, big, a, GF_MEM_READWRITE), 0);
	memset(ptr(va, big), 5, big);
	uintptr_t at = (uintptr_t)ptr(va, big);
	assert_int_equal(gf_mem_set_accessible(va, 0), 0);
	/* Parked: the mapping is elsewhere now, a mapping of its size of its own. */
	uintptr_t parked = new_mapping(&at, 1, big, "rw-s");
	assert_true(parked != 0);
	assert_int_equal(gf_mem_set_accessible(va, 1), 0);
	assert_int_equal(((const uint8_t *)ptr(va, big))[big - 1], 5);
	void *mine = mmap((void *)parked, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
			  -1, 0);
	assert_ptr_equal(mine, (void *)parked);
	memset(mine, 7, big);
	assert_int_equal(gf_mem_set_accessible(va, 0), 0);
	assert_int_equal(gf_mem_set_accessible(va, 1), 0);
	assert_int_equal(gf_mem_set_accessible(va, 0), 0);
	assert_int_equal(gf_mem_unmap_all(va), 0);
	gf_mem_va_free(va);
	pid_t pid = fork_child();
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		_exit(((volatile uint8_t *)mine)[big - 1] == 7 ? 0 : 1);
	}
	int st = wait_child(pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	munmap(mine, big);
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

/* gf_mem_has_free(): the same answer as gf_mem_info(), with the figure when short. */
static void test_has_free(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	uint64_t free_b = 0, total_b = 0, got = 7;
	assert_int_equal(gf_mem_has_free(NULL, 1, NULL), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_info(m, &free_b, &total_b), 0);
	assert_true(free_b > 4096);
	assert_int_equal(gf_mem_has_free(m, 4096, NULL), 1);
	assert_int_equal(gf_mem_has_free(m, UINT64_MAX, &got), 0);
	assert_true(got > 4096 && got <= total_b);
	if (mt_kind == GF_MEM_HOST) {
		/* The test knob (a machine short of memory) wins over the cheap look. */
		setenv("GF_MEM_HOST_AVAILABLE", "1000", 1);
		assert_int_equal(gf_mem_has_free(m, 4096, &got), 0);
		assert_int_equal(got, 1000);
		assert_int_equal(gf_mem_has_free(m, 1000, NULL), 1);
		unsetenv("GF_MEM_HOST_AVAILABLE");
	}
	gf_mem_free(m);
}

static int count_proc_lines(const char *path, const char *needle)
{
	char line[512];
	int n = 0;
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, needle))
			n++;
	fclose(f);
	return n;
}

static int count_memfds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		char p[300], t[256];
		snprintf(p, sizeof(p), "/proc/self/fd/%s", e->d_name);
		ssize_t k = readlink(p, t, sizeof(t) - 1);
		if (k > 0) {
			t[k] = 0;
			if (strstr(t, "memfd:"))
				n++;
		}
	}
	closedir(d);
	return n;
}

/*
 * Decision 7: the creator releases while an importer holds the memory; it is
 * not freed (the importer still reads the data; the fake driver's
 * cuMemGetInfo still counts it); when the importer releases, it is freed.
 */
static void test_refcount_decision7(void **state)
{
	(void)state;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	gf_mem *m = mt_open();
	size_t size = 8 * gran(m);
	uint64_t free0, free1, free2, free3, tot;
	gf_mem_alloc *a = NULL;
	gf_mem_va *va = NULL;
	int fd, memfds0 = count_memfds(), maps0 = count_proc_lines("/proc/self/maps", "memfd:");

	assert_int_equal(gf_mem_info(m, &free0, &tot), 0);
	assert_int_equal(gf_mem_create(&a, m, size), 0);
	assert_int_equal(gf_mem_reserve(&va, m, size, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READWRITE), 0);
	memset(ptr(va, 0), 0x77, size);
	assert_int_equal(gf_mem_info(m, &free1, &tot), 0);
	if (mt_kind == GF_MEM_CUDA)
		assert_int_equal(free0 - free1, size);
	assert_int_equal(gf_mem_export(a, &fd), 0);

	pid_t pid = fork_child();
	if (pid == 0) {
		/* A fork inherits the creator's fds and mappings; a real importer
		 * (another program) has none: drop them. */
		close(sv[0]);
		close(fd);
		gf_mem_va_free(va);
		gf_mem_alloc_free(a);
		gf_mem_free(m);
		gf_mem *cm = NULL;
		gf_mem_alloc *ca = NULL;
		gf_mem_va *cva = NULL;
		int cfd = recv_fd(sv[1], "alloc");
		if (cfd < 0 || gf_mem_open(&cm, mt_kind, 0) < 0 || gf_mem_import(&ca, cm, cfd, size) < 0)
			_exit(10);
		close(cfd);
		if (gf_mem_reserve(&cva, cm, size, 0) < 0 || gf_mem_map(cva, 0, ca, GF_MEM_READ) < 0)
			_exit(11);
		send_fd(sv[1], "imported", -1);
		recv_fd(sv[1], "creator-released");
		const volatile uint8_t *r = ptr(cva, 0);
		if (r[0] != 0x77 || r[size - 1] != 0x77)
			_exit(12);
		send_fd(sv[1], "still-there", -1);
		recv_fd(sv[1], "release");
		gf_mem_va_free(cva);
		gf_mem_alloc_free(ca);
		gf_mem_free(cm);
		send_fd(sv[1], "released", -1);
		recv_fd(sv[1], "exit");
		_exit(0);
	}
	close(sv[1]);
	send_fd(sv[0], "alloc", fd);
	close(fd);
	recv_fd(sv[0], "imported");
	/* The creator lets go of everything it had. */
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	assert_int_equal(count_memfds(), memfds0);
	assert_int_equal(count_proc_lines("/proc/self/maps", "memfd:"), maps0);
	assert_int_equal(gf_mem_info(m, &free2, &tot), 0);
	if (mt_kind == GF_MEM_CUDA)
		assert_int_equal(free2, free1); /* not freed: the importer holds it */
	send_fd(sv[0], "creator-released", -1);
	recv_fd(sv[0], "still-there");
	send_fd(sv[0], "release", -1);
	recv_fd(sv[0], "released");
	assert_int_equal(gf_mem_info(m, &free3, &tot), 0);
	if (mt_kind == GF_MEM_CUDA)
		assert_int_equal(free3, free0); /* freed with the last handle */
	send_fd(sv[0], "exit", -1);
	int st = wait_child(pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	gf_mem_free(m);
	close(sv[0]);
}

/* ---- all-or-nothing mapping and bad imports ---- */

static void test_map_many(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	size_t g = gran(m);
	gf_mem_alloc *a[4] = { 0 };
	gf_mem_va *va = NULL;
	struct gf_mem_mapping maps[4];
	for (int i = 0; i < 4; i++) {
		assert_int_equal(gf_mem_create(&a[i], m, g), 0);
		/* listed out of order: the call sorts them into spans */
		maps[i] = (struct gf_mem_mapping){ (size_t)(3 - i) * g, a[i] };
	}
	assert_int_equal(gf_mem_reserve(&va, m, 8 * g, 0), 0);
	assert_int_equal(gf_mem_map_many(va, maps, 4, GF_MEM_READWRITE), 0);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(gf_mem_alloc_state(a[i]), GF_MEM_ALLOC_MAPPED);
		memset(ptr(va, (size_t)(3 - i) * g), i + 1, g);
	}
	/* Entries overlapping each other or earlier mappings are refused whole. */
	struct gf_mem_mapping dup[2] = { { 4 * g, a[0] }, { 4 * g, a[1] } };
	assert_int_equal(gf_mem_map_many(va, dup, 2, GF_MEM_READ), GF_ERR_INVALID_ARG);
	struct gf_mem_mapping partly[2] = { { 4 * g, a[0] }, { 0, a[1] } };
	assert_int_equal(gf_mem_map_many(va, partly, 2, GF_MEM_READ), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_unmap_all(va), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(gf_mem_alloc_state(a[i]), GF_MEM_ALLOC_UNMAPPED);

	/* A released allocation in the middle: nothing of the call is mapped. */
	assert_int_equal(gf_mem_release(a[2]), 0);
	assert_int_equal(gf_mem_map_many(va, maps, 4, GF_MEM_READ), GF_ERR_STATE);
	for (int i = 0; i < 4; i++)
		assert_int_not_equal(gf_mem_alloc_state(a[i]), GF_MEM_ALLOC_MAPPED);
	maps[2] = (struct gf_mem_mapping){ 5 * g, a[3] };
	assert_int_equal(gf_mem_map_many(va, maps, 3, GF_MEM_READ), 0);
	assert_int_equal(((uint8_t *)ptr(va, 3 * g))[0], 1);
	assert_int_equal(((uint8_t *)ptr(va, 5 * g))[g - 1], 4);
	gf_mem_va_free(va);
	for (int i = 0; i < 4; i++)
		gf_mem_alloc_free(a[i]);
	gf_mem_free(m);
}

/*
 * A failure in the middle of the real mapping work (not the checks before
 * it) undoes what the call mapped. On host, an import of a read-only fd
 * fails at its read-write mmap; the cuda fault knobs are in test_mem_faults.
 */
static void test_map_many_undo_host(void **state)
{
	(void)state;
	gf_mem *m = mt_open();
	size_t g = gran(m);
	gf_mem_alloc *a[3] = { 0 }, *rdonly = NULL;
	gf_mem_va *va = NULL;
	int fd;
	char path[64];
	for (int i = 0; i < 3; i++)
		assert_int_equal(gf_mem_create(&a[i], m, g), 0);
	assert_int_equal(gf_mem_export(a[1], &fd), 0);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	int rofd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(rofd >= 0);
	close(fd);
	assert_int_equal(gf_mem_import(&rdonly, m, rofd, g), 0);
	close(rofd);
	assert_int_equal(gf_mem_reserve(&va, m, 3 * g, 0), 0);
	struct gf_mem_mapping maps[3] = { { 0, a[0] }, { g, rdonly }, { 2 * g, a[2] } };
	int rc = gf_mem_map_many(va, maps, 3, GF_MEM_READWRITE);
	assert_int_equal(rc, GF_ERR_PERMISSION);
	assert_non_null(strstr(gf_error_detail(), "read-write"));
	assert_int_equal(gf_mem_alloc_state(a[0]), GF_MEM_ALLOC_CREATED);
	assert_int_equal(gf_mem_alloc_state(a[2]), GF_MEM_ALLOC_CREATED);
	/* The first entry's range is inaccessible again. */
	pid_t pid = fork_child();
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		(void)*(volatile uint8_t *)ptr(va, 0);
		_exit(0);
	}
	int st = wait_child(pid);
	assert_true(WIFSIGNALED(st));
	/* Read-only is what that fd allows. */
	assert_int_equal(gf_mem_map_many(va, maps, 3, GF_MEM_READ), 0);
	gf_mem_va_free(va);
	gf_mem_alloc_free(rdonly);
	for (int i = 0; i < 3; i++)
		gf_mem_alloc_free(a[i]);
	gf_mem_free(m);
}

static void test_import_bad_fd(void **state)
{
	(void)state;
	int fds_before = tu_count_fds();
	gf_mem *m = mt_open();
	size_t g = gran(m);
	gf_mem_alloc *imp = NULL, *a = NULL;
	int p[2], fd;
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_int_equal(gf_mem_import(&imp, m, p[0], g), GF_ERR_INVALID_ARG);
	assert_true(strlen(gf_error_detail()) > 0);
	assert_null(imp);
	assert_int_equal(gf_mem_import(&imp, m, -1, g), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_mem_import(&imp, m, 1000, g), GF_ERR_INVALID_ARG); /* not open */
	char *dir = tu_tmpdir(), file[300];
	snprintf(file, sizeof(file), "%s/plain", dir);
	int f = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	assert_true(f >= 0);
	assert_int_equal(ftruncate(f, (off_t)g), 0);
	assert_int_equal(gf_mem_import(&imp, m, f, g), GF_ERR_INVALID_ARG);
	close(f);
	unlink(file);
	rmdir(dir);
	free(dir);
	/* A shared-memory file that is not an allocation (tmpfs, not memfd). */
	int shm = open("/dev/shm", O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
	if (shm >= 0) {
		assert_int_equal(ftruncate(shm, (off_t)g), 0);
		assert_int_equal(gf_mem_import(&imp, m, shm, g), GF_ERR_INVALID_ARG);
		close(shm);
	}
	if (mt_kind == GF_MEM_HOST) {
		/* the driver cannot tell an import's size; the host backend can */
		assert_int_equal(gf_mem_create(&a, m, g), 0);
		assert_int_equal(gf_mem_export(a, &fd), 0);
		assert_int_equal(gf_mem_import(&imp, m, fd, 2 * g), GF_ERR_INVALID_ARG);
		assert_non_null(strstr(gf_error_detail(), "expected"));
		close(fd);
		gf_mem_alloc_free(a);
	}
	close(p[0]);
	close(p[1]);
	gf_mem_free(m);
	assert_int_equal(tu_count_fds(), fds_before);
}

int main(int argc, char **argv)
{
	if (mt_init(argc, argv))
		return 2;
	struct CMUnitTest tests[] = {
		cmocka_unit_test(test_identity),
		cmocka_unit_test(test_states_single_process),
		cmocka_unit_test(test_two_processes),
		cmocka_unit_test(test_readonly_faults),
		cmocka_unit_test(test_set_accessible),
		cmocka_unit_test(test_caps),
		cmocka_unit_test(test_has_free),
		cmocka_unit_test(test_refcount_decision7),
		cmocka_unit_test(test_map_many),
		cmocka_unit_test(test_import_bad_fd),
		cmocka_unit_test(test_map_many_undo_host), /* host only: last four */
		cmocka_unit_test(test_set_accessible_parks_large_mappings),
		cmocka_unit_test(test_set_accessible_unparks_runs),
		cmocka_unit_test(test_parking_range_holes_stay_others),
	};
	size_t n = GF_ARRAY_SIZE(tests) - (mt_kind == GF_MEM_HOST ? 0 : 4);
	return tu_run_tests(tests, n, NULL, NULL);
}
