/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The failover case itself on the test driver: a reader's device faults
 * with a sticky error (every later driver call fails) while it maps the
 * GMS's weights. gf_gms_unmap must finish, the process knows it is lost
 * (gf_mem_device_lost), and the GMS and the next reader are unharmed.
 * The GMS runs in a child process; each client is a process of its own.
 */
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/stat.h>

#include "forkcase.h"
#include "../common/testutil.h"

#define GRAN (2u * 1024 * 1024)

static char uri[600];

static gf_gms *connect_as(gf_mem **mem, int mode)
{
	gf_gms *g = NULL;
	CHECK(gf_mem_open(mem, GF_MEM_CUDA, 0) == 0);
	CHECK(gf_gms_connect(&g, uri, *mem, mode, 10000, NULL) == 0);
	return g;
}

static void case_writer(void)
{
	gf_mem *m = NULL;
	gf_gms *g = connect_as(&m, GF_GMS_RW);
	uint64_t id;
	struct gf_gms_alloc_info info;
	for (size_t i = 0; i < 2; i++) {
		CHECK(gf_gms_allocate(g, 2 * GRAN, "w", &id) == 0);
		CHECK(gf_gms_alloc_at(g, i, &info) == 0);
		memset((void *)(uintptr_t)info.addr, 0x60 + (int)i, info.size);
	}
	CHECK(gf_gms_commit(g, NULL) == 0);
	gf_gms_free(g);
	gf_mem_free(m);
}

static void check_weights(gf_gms *g)
{
	struct gf_gms_alloc_info info;
	CHECK(gf_gms_alloc_count(g) == 2);
	for (size_t i = 0; i < 2; i++) {
		CHECK(gf_gms_alloc_at(g, i, &info) == 0);
		const volatile uint8_t *p = (const volatile uint8_t *)(uintptr_t)info.addr;
		CHECK(p[0] == 0x60 + i && p[info.size - 1] == 0x60 + i);
	}
}

static void case_sticky_reader(void)
{
	gf_mem *m = NULL;
	gf_gms *g = connect_as(&m, GF_GMS_RO);
	CHECK(gf_gms_map_all(g) == 0);
	check_weights(g);
	/* A kernel faults: the next synchronize reports it, and from then on
	 * the driver fails everything. */
	tu_env_set("FAKECUDA_FAIL", "cuCtxSynchronize:1:700");
	CHECK_ERR(gf_mem_synchronize(m), GF_ERR_DRIVER, "CUDA_ERROR_ILLEGAL_ADDRESS");
	CHECK(gf_mem_device_lost(m) == 1);
	/* The loss path: unmap finishes (reporting the sticky error of its
	 * synchronize), the connection is closed, the lock released. */
	CHECK_ERR(gf_gms_unmap(g), GF_ERR_DRIVER, "sticky");
	CHECK(gf_gms_granted_mode(g) == 0);
	CHECK_ERR(gf_gms_remap(g, 1000), GF_ERR_DRIVER, "device lost");
	gf_gms_free(g);
	gf_mem_free(m);
}

static void case_next_reader(void)
{
	gf_mem *m = NULL;
	gf_gms *g = connect_as(&m, GF_GMS_RO);
	CHECK(gf_gms_map_all(g) == 0);
	check_weights(g);
	gf_gms_free(g);
	gf_mem_free(m);
}

static void test_sticky_reader(void **state)
{
	(void)state;
	char *dir = tu_tmpdir();
	setenv("FAKECUDA_STATE_DIR", dir, 1);
	snprintf(uri, sizeof(uri), "unix://%s/gms.sock", dir);
	fflush(NULL);
	pid_t server = fork();
	assert_true(server >= 0);
	if (server == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		gf_gmsd *d = NULL;
		if (gf_gmsd_new(&d) < 0 || gf_gmsd_add_listen(d, uri) < 0 || gf_gmsd_set_backend(d, GF_MEM_CUDA) < 0 ||
		    gf_gmsd_set_device(d, 0) < 0 || gf_gmsd_start(d) < 0)
			_exit(3);
		gf_gmsd_run(d);
		gf_gmsd_free(d);
		_exit(0);
	}
	struct stat sb;
	for (int i = 0; i < 1000 && stat(uri + strlen("unix://"), &sb) != 0; i++)
		usleep(10000);
	run_case(case_writer, NULL);
	run_case(case_sticky_reader, (const char *const[]){ "FAKECUDA_STICKY=1", NULL });
	run_case(case_next_reader, NULL);
	char *json = NULL;
	int rc = gf_gms_status_json(uri, 5000, &json);
	kill(server, SIGTERM);
	int st;
	assert_int_equal(waitpid(server, &st, 0), server);
	assert_int_equal(rc, 0);
	assert_non_null(strstr(json, "\"allocation_count\":2"));
	assert_non_null(strstr(json, "\"readers\":0"));
	free(json);
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	free(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sticky_reader),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
