/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GPU identity on the test driver: several devices with UUIDs, names and
 * memory figures; CUDA_VISIBLE_DEVICES as the driver applies it (indices,
 * UUIDs, permutations, truncation at an invalid entry); --device parsing;
 * MIG UUIDs; an import refused on the wrong device.
 */
#include <dlfcn.h>
#include <stdint.h>

#include <cuda.h>

#include "forkcase.h"
#include "../common/testutil.h"

#define GRAN (2u * 1024 * 1024)
#define UUID(n) "GPU-fa4ec0da-0000-4000-8000-00000000000" #n

static gf_mem *open_cuda(int device)
{
	gf_mem *m = NULL;
	CHECK(gf_mem_open(&m, GF_MEM_CUDA, device) == 0);
	return m;
}

static void uuid_of(int device, char *buf)
{
	gf_mem *m = open_cuda(device);
	CHECK(gf_mem_device_uuid(m, buf, 64) == 0);
	gf_mem_free(m);
}

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* The driver itself: device 1 given access to a mapping of device 0's
 * allocation works only with peer access (the library never asks this). */
static void raw_peer_access(gf_mem *m0, gf_mem_alloc *a)
{
	void *lib = dlopen(getenv("GF_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
	get_proc_fn gp = lib ? (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
	CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t) = NULL;
	CHECK(gp && gp("cuMemSetAccess", (void **)&set_access, 12000, 0, NULL) == CUDA_SUCCESS);
	gf_mem_va *va = NULL;
	CHECK(gf_mem_reserve(&va, m0, GRAN, 0) == 0 && gf_mem_map(va, 0, a, GF_MEM_READWRITE) == 0);
	CUmemAccessDesc d;
	memset(&d, 0, sizeof(d));
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = 1;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CUresult r = set_access(gf_mem_va_addr(va), GRAN, &d, 1);
	CHECK(r == (getenv("FAKECUDA_PEER_ACCESS") ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE));
	gf_mem_va_free(va);
	dlclose(lib);
}

static void case_three_devices(void)
{
	int n = 0, idx = -1;
	char uuid[64];
	CHECK(gf_mem_device_count(GF_MEM_CUDA, &n) == 0 && n == 3);
	uuid_of(2, uuid);
	CHECK(strcmp(uuid, UUID(2)) == 0);
	CHECK(gf_device_find_by_uuid(GF_MEM_CUDA, uuid, &idx) == 0 && idx == 2);
	CHECK(gf_device_find_by_uuid(GF_MEM_CUDA, "fa4ec0da-0000-4000-8000-000000000001", &idx) == 0 && idx == 1);
	CHECK_ERR(gf_device_find_by_uuid(GF_MEM_CUDA, "GPU-FA4EC0DA-0000-4000-8000-00000000000", &idx),
		  GF_ERR_INVALID_ARG, "matches 3");
	CHECK_ERR(gf_device_find_by_uuid(GF_MEM_CUDA, UUID(3), &idx), GF_ERR_NOT_FOUND, UUID(3));
	gf_mem *bad = NULL;
	CHECK_ERR(gf_mem_open(&bad, GF_MEM_CUDA, 3), GF_ERR_NOT_FOUND, "no device 3");

	/* An allocation of device 0 is refused by device 2, at map and at import. */
	gf_mem *m0 = open_cuda(0), *m2 = open_cuda(2);
	gf_mem_alloc *a = NULL, *imp = NULL;
	gf_mem_va *va = NULL;
	int fd = -1;
	CHECK(gf_mem_create(&a, m0, GRAN) == 0);
	raw_peer_access(m0, a);
	CHECK(gf_mem_reserve(&va, m2, GRAN, 0) == 0);
	CHECK_ERR(gf_mem_map(va, 0, a, GF_MEM_READ), GF_ERR_INVALID_ARG, NULL);
	CHECK(gf_mem_export(a, &fd) == 0);
	/* Refused whether or not the devices could reach each other. */
	CHECK_ERR(gf_mem_import(&imp, m2, fd, GRAN), GF_ERR_INVALID_ARG, "lives on device 0, this backend is on device 2");
	CHECK(strstr(gf_error_detail(), getenv("FAKECUDA_PEER_ACCESS") ? "peer access possible" : "peer access impossible"));
	CHECK(gf_mem_import(&imp, m0, fd, GRAN) == 0);
	close(fd);
	gf_mem_alloc_free(imp);
	gf_mem_va_free(va);
	gf_mem_alloc_free(a);
	gf_mem_free(m0);
	gf_mem_free(m2);
}

static void test_three_devices(void **state)
{
	(void)state;
	run_case(case_three_devices,
		 (const char *const[]){ "FAKECUDA_DEVICES=3", "CUDA_VISIBLE_DEVICES", "FAKECUDA_PEER_ACCESS", NULL });
	run_case(case_three_devices,
		 (const char *const[]){ "FAKECUDA_DEVICES=3", "CUDA_VISIBLE_DEVICES", "FAKECUDA_PEER_ACCESS=1", NULL });
}

/* The visible list each CUDA_VISIBLE_DEVICES value gives on 4 devices, as
 * physical indices (the last digit of their UUIDs). */
static const struct {
	const char *cvd;
	const char *want; /* "" = no device */
} perms[] = {
	{ "2,0", "20" },
	{ "3,2,1,0", "3210" },
	{ UUID(3) ",1", "31" },
	{ "MIG-nope,1", "" },
	{ "1,7,2", "1" },         /* out of range: the list ends there */
	{ "1,1,2", "1" },         /* repeated: ends there */
	{ "0,GPU-fa4ec0da,1", "0" }, /* ambiguous prefix: ends there */
	{ "GPU-fa4ec0da-0000-4000-8000-000000000002", "2" },
	{ "gpu-FA4EC0DA-0000-4000-8000-000000000001,3", "13" },
	{ "", "" },
	{ "x", "" },
};
static size_t perm_i;

static void case_permutation(void)
{
	const char *want = perms[perm_i].want;
	int n = -1;
	int rc = gf_mem_device_count(GF_MEM_CUDA, &n);
	if (!*want) {
		CHECK_ERR(rc, GF_ERR_NOT_SUPPORTED, "no CUDA device");
		size_t k = 9;
		CHECK_ERR(gf_device_list(GF_MEM_CUDA, NULL, 0, &k), GF_ERR_NOT_SUPPORTED, "no CUDA device");
		return;
	}
	CHECK(rc == 0 && n == (int)strlen(want));
	struct gf_device_info info[4];
	size_t k = 0;
	CHECK(gf_device_list(GF_MEM_CUDA, info, 4, &k) == 0 && k == strlen(want));
	for (int i = 0; i < n; i++) {
		char uuid[64];
		int idx = -1;
		snprintf(uuid, sizeof(uuid), "GPU-fa4ec0da-0000-4000-8000-00000000000%c", want[i]);
		CHECK(info[i].index == i && strcmp(info[i].uuid, uuid) == 0);
		CHECK(gf_device_find_by_uuid(GF_MEM_CUDA, uuid, &idx) == 0 && idx == i);
		CHECK(gf_device_parse(GF_MEM_CUDA, uuid, &idx) == 0 && idx == i);
	}
	/* A device that exists but is not visible is not found. */
	for (char c = '0'; c <= '3'; c++)
		if (!strchr(want, c)) {
			char uuid[64];
			int idx;
			snprintf(uuid, sizeof(uuid), "GPU-fa4ec0da-0000-4000-8000-00000000000%c", c);
			CHECK_ERR(gf_device_find_by_uuid(GF_MEM_CUDA, uuid, &idx), GF_ERR_NOT_FOUND, "no cuda device has uuid");
		}
}

static void test_visible_devices(void **state)
{
	(void)state;
	for (perm_i = 0; perm_i < sizeof(perms) / sizeof(perms[0]); perm_i++) {
		char cvd[128];
		snprintf(cvd, sizeof(cvd), "CUDA_VISIBLE_DEVICES=%s", perms[perm_i].cvd);
		print_message("# CUDA_VISIBLE_DEVICES=\"%s\" -> \"%s\"\n", perms[perm_i].cvd, perms[perm_i].want);
		run_case(case_permutation, (const char *const[]){ "FAKECUDA_DEVICES=4", cvd, NULL });
	}
}

static void case_list_figures(void)
{
	struct gf_device_info info[2];
	size_t n = 0;
	CHECK(gf_device_list(GF_MEM_CUDA, NULL, 0, &n) == 0 && n == 2);
	CHECK(gf_device_list(GF_MEM_CUDA, info, 2, &n) == 0 && n == 2);
	CHECK(strcmp(info[0].name, "Fake GPU 0") == 0 && strcmp(info[1].name, "Fake GPU 1") == 0);
	CHECK(info[0].total_bytes == 8ull << 30 && info[1].total_bytes == 4ull << 30);
	/* The context the listing made costs its overhead, nothing else is used. */
	CHECK(info[0].free_bytes == info[0].total_bytes - (64u << 20));
	CHECK(info[1].free_bytes == info[1].total_bytes - (64u << 20));
	CHECK(!info[0].mig && !info[1].mig);

	gf_mem *m = open_cuda(1);
	gf_mem_alloc *a = NULL;
	CHECK(gf_mem_create(&a, m, 2 * GRAN) == 0);
	CHECK(gf_device_list(GF_MEM_CUDA, info, 2, &n) == 0);
	/* Our open backend's context and the listing's are the same primary
	 * context, retained twice: the overhead counts per retain here. */
	CHECK(info[1].free_bytes == info[1].total_bytes - 2 * GRAN - 2 * (64u << 20));
	CHECK(info[0].free_bytes == info[0].total_bytes - (64u << 20));
	gf_mem_alloc_free(a);
	gf_mem_free(m);
}

static void test_list_figures(void **state)
{
	(void)state;
	run_case(case_list_figures, (const char *const[]){ "FAKECUDA_DEVICES=2", "CUDA_VISIBLE_DEVICES",
							   "FAKECUDA_TOTAL_MEM=8589934592,4294967296",
							   "FAKECUDA_CTX_OVERHEAD=67108864", NULL });
}

static void case_parse(void)
{
	int idx = -1;
	CHECK(gf_device_parse(GF_MEM_CUDA, "1", &idx) == 0 && idx == 1);
	CHECK(gf_device_parse(GF_MEM_CUDA, UUID(1), &idx) == 0 && idx == 1);
	CHECK_ERR(gf_device_parse(GF_MEM_CUDA, "2", &idx), GF_ERR_NOT_FOUND, "device 2: no such cuda device (2 visible");
	CHECK_ERR(gf_device_parse(GF_MEM_CUDA, "99999999999", &idx), GF_ERR_NOT_FOUND, "no such cuda device");
	CHECK_ERR(gf_device_parse(GF_MEM_CUDA, "GPU-0bad", &idx), GF_ERR_NOT_FOUND, "GPU-0bad");
	CHECK_ERR(gf_device_parse(GF_MEM_CUDA, "-1", &idx), GF_ERR_NOT_FOUND, "-1");
	CHECK_ERR(gf_device_parse(GF_MEM_CUDA, "", &idx), GF_ERR_INVALID_ARG, "empty");
	/* auto: a GPU UUID names the GPU, an index the GPU too, else host. */
	CHECK(gf_device_parse(GF_MEM_AUTO, UUID(1), &idx) == 0 && idx == 1);
	CHECK(gf_device_parse(GF_MEM_HOST, "0", &idx) == 0 && idx == 0);
	CHECK_ERR(gf_device_parse(GF_MEM_HOST, "1", &idx), GF_ERR_NOT_FOUND, "no such host device");
}

static void test_parse(void **state)
{
	(void)state;
	run_case(case_parse, (const char *const[]){ "FAKECUDA_DEVICES=2", "CUDA_VISIBLE_DEVICES", NULL });
}

#define MIG(n) "MIG-3f1c0000-0000-4000-8000-00000000000" #n

static void case_mig(void)
{
	char uuid[64];
	int idx = -1;
	struct gf_device_info info[1];
	size_t n = 0;
	CHECK(gf_device_list(GF_MEM_CUDA, info, 1, &n) == 0 && n == 1);
	CHECK(info[0].mig == 1 && strcmp(info[0].uuid, MIG(1)) == 0 && strstr(info[0].name, " MIG "));
	uuid_of(0, uuid);
	CHECK(strcmp(uuid, MIG(1)) == 0);
	CHECK(gf_device_find_by_uuid(GF_MEM_CUDA, MIG(1), &idx) == 0 && idx == 0);
	CHECK(gf_device_find_by_uuid(GF_MEM_CUDA, MIG(1) + 4, &idx) == 0 && idx == 0);
	CHECK_ERR(gf_device_find_by_uuid(GF_MEM_CUDA, "GPU-3f1c0000-0000-4000-8000-000000000001", &idx),
		  GF_ERR_NOT_FOUND, NULL);
}

static void test_mig(void **state)
{
	(void)state;
	run_case(case_mig, (const char *const[]){ "FAKECUDA_DEVICES=2", "FAKECUDA_MIG=1", "CUDA_VISIBLE_DEVICES=" MIG(1),
						  NULL });
}

int main(void)
{
	char *dir = tu_tmpdir();
	setenv("FAKECUDA_STATE_DIR", dir, 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_three_devices), cmocka_unit_test(test_visible_devices),
		cmocka_unit_test(test_list_figures),  cmocka_unit_test(test_parse),
		cmocka_unit_test(test_mig),
	};
	int rc = tu_run_group_tests(tests, NULL, NULL);
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	free(dir);
	return rc;
}
