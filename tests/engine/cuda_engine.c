/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An engine on the cuda backend for tests over the test driver, whose device
 * memory is host-addressable (real device memory is not): the whole loop of
 * gf_engine_run_shadow() with the probe server, one 1 MiB weight allocation, and a
 * "serve" step that reads the mapped weights and says what it read.
 *
 * usage: cuda-engine LOCK_URI GMS_URI loader|follower ID PROBE_PORT
 * stdout: "serving epoch=E checksum=X" once Active, "stopped" after SIGTERM
 * (from the platform, or the default loss policy).
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpufailover.h"

#define WEIGHT_BYTES (1u << 20)

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static int load(gf_engine *e, int device, gf_gms *gms, void *ud)
{
	(void)e, (void)device, (void)ud;
	uint64_t id, gen;
	struct gf_gms_alloc_info info;
	int rc = gf_gms_allocate(gms, WEIGHT_BYTES, "weights", &id);
	if (rc == 0)
		rc = gf_gms_alloc_at(gms, 0, &info);
	if (rc)
		return rc;
	unsigned char *w = (unsigned char *)(uintptr_t)info.addr;
	for (uint32_t i = 0; i < WEIGHT_BYTES; i++)
		w[i] = (unsigned char)(i * 2654435761u >> 24);
	return gf_gms_commit(gms, &gen);
}

static int serve(gf_engine *e, void *ud)
{
	(void)ud;
	gf_gms *gms = gf_engine_gms(e, 0);
	struct gf_gms_alloc_info info;
	int rc = gf_gms_alloc_at(gms, 0, &info);
	if (rc)
		return rc;
	const unsigned char *w = (const unsigned char *)(uintptr_t)info.addr;
	uint64_t h = 1469598103934665603ull; /* FNV-1a over the weights */
	for (uint64_t i = 0; i < info.size; i++)
		h = (h ^ w[i]) * 1099511628211ull;
	printf("serving epoch=%" PRIu64 " checksum=%016" PRIx64 "\n", gf_engine_epoch(e), h);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: %s LOCK_URI GMS_URI loader|follower ID PROBE_PORT\n", argv[0]);
		return 2;
	}
	gf_engine *e;
	struct gf_engine_callbacks cb = { .load_weights = load, .serve = serve };
	int rc = gf_engine_new(&e);
	if (rc == 0)
		rc = gf_engine_set_lock(e, argv[1], argv[4]);
	if (rc == 0)
		rc = gf_engine_add_gms(e, argv[2]);
	if (rc == 0)
		rc = gf_engine_set_role(e, strcmp(argv[3], "loader") ? GF_ENGINE_FOLLOWER : GF_ENGINE_LOADER);
	if (rc == 0)
		rc = gf_engine_set_backend(e, GF_MEM_CUDA);
	if (rc == 0)
		rc = gf_engine_set_probe_address(e, "127.0.0.1", atoi(argv[5]));
	struct sigaction sa = { .sa_handler = on_term };
	sigaction(SIGTERM, &sa, NULL);
	if (rc == 0)
		rc = gf_engine_run_shadow(e, &cb);
	if (rc) {
		fprintf(stderr, "cuda-engine: %s: %s\n", gf_error_name(rc), gf_error_detail());
		gf_engine_free(e);
		return 1;
	}
	/* Active until SIGTERM (from the platform, or the default loss policy). */
	while (!stop)
		pause();
	gf_engine_free(e);
	printf("stopped\n");
	return 0;
}
