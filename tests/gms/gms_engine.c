/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A tiny "engine" for the GMS integration tests. It speaks lines on stdout
 * (granted=, loaded, committed, mapped, verified, asleep, awake, holding,
 * lost, error=NAME) and waits for a line on stdin where the test must be
 * able to act in between (--pause-before-commit, --sleep, --hold).
 *
 * usage: gms-engine URI rw|ro|rw_or_ro [--backend host|cuda] [--timeout MS]
 *        [--allocs N] [--size BYTES] [--meta M] [--seed BYTE]
 *        [--pause-before-commit] [--sleep] [--remap-timeout MS] [--hold]
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpufailover.h"

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

static int die(const char *what, int rc)
{
	say("error=%s what=%s detail=\"%s\"", gf_error_name(rc), what, gf_error_detail());
	return 1;
}

static bool verify(gf_gms *g, int seed)
{
	for (size_t i = 0; i < gf_gms_alloc_count(g); i++) {
		struct gf_gms_alloc_info ai;
		gf_gms_alloc_at(g, i, &ai);
		const uint8_t *p = (const uint8_t *)(uintptr_t)ai.addr;
		if (p[0] != ((seed + (int)i) & 0xff) || p[ai.size - 1] != ((seed + (int)i) & 0xff)) {
			say("mismatch alloc=%zu got=%d", i, p[0]);
			return false;
		}
	}
	say("verified allocs=%zu", gf_gms_alloc_count(g));
	return true;
}

static bool wait_line(void)
{
	char buf[64];
	return fgets(buf, sizeof(buf), stdin) != NULL;
}

static void on_lost(gf_gms *g, int err, const char *detail, void *ud)
{
	(void)g;
	(void)ud;
	say("lost err=%s detail=\"%s\"", gf_error_name(err), detail);
	_exit(42); /* what an engine's default policy does: terminate */
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: gms-engine URI rw|ro|rw_or_ro [options]\n");
		return 2;
	}
	const char *uri = argv[1];
	int mode = !strcmp(argv[2], "rw") ? GF_GMS_RW : !strcmp(argv[2], "ro") ? GF_GMS_RO : GF_GMS_RW_OR_RO;
	int64_t timeout = -1, remap_timeout = 1000;
	size_t allocs = 2, meta = 4;
	uint64_t size = 1 << 20;
	int seed = 0x30, kind = GF_MEM_HOST;
	bool pause = false, sleep_wake = false, hold = false;
	for (int i = 3; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "0";
		if (!strcmp(a, "--timeout"))
			timeout = atoll(v), i++;
		else if (!strcmp(a, "--remap-timeout"))
			remap_timeout = atoll(v), i++;
		else if (!strcmp(a, "--allocs"))
			allocs = (size_t)atoll(v), i++;
		else if (!strcmp(a, "--size"))
			size = (uint64_t)atoll(v), i++;
		else if (!strcmp(a, "--meta"))
			meta = (size_t)atoll(v), i++;
		else if (!strcmp(a, "--seed"))
			seed = atoi(v), i++;
		else if (!strcmp(a, "--backend"))
			kind = !strcmp(v, "cuda") ? GF_MEM_CUDA : GF_MEM_HOST, i++;
		else if (!strcmp(a, "--pause-before-commit"))
			pause = true;
		else if (!strcmp(a, "--sleep"))
			sleep_wake = true;
		else if (!strcmp(a, "--hold"))
			hold = true;
		else {
			fprintf(stderr, "gms-engine: unknown option %s\n", a);
			return 2;
		}
	}
	gf_mem *mem;
	gf_gms *g;
	int rc = gf_mem_open(&mem, kind, 0);
	if (rc < 0)
		return die("mem_open", rc);
	if ((rc = gf_gms_connect(&g, uri, mem, mode, timeout, NULL)) < 0)
		return die("connect", rc);
	say("granted=%s pid=%d", gf_gms_granted_mode(g) == GF_GMS_RW ? "RW" : "RO", (int)getpid());
	if (gf_gms_granted_mode(g) == GF_GMS_RW) {
		for (size_t i = 0; i < allocs; i++) {
			uint64_t id;
			struct gf_gms_alloc_info ai;
			if ((rc = gf_gms_allocate(g, size, "weights", &id)) < 0 || (rc = gf_gms_alloc_at(g, i, &ai)) < 0)
				return die("allocate", rc);
			memset((void *)(uintptr_t)ai.addr, (seed + (int)i) & 0xff, ai.size);
		}
		for (size_t k = 0; k < meta; k++) {
			char key[64];
			snprintf(key, sizeof(key), "t%06zu", k);
			if ((rc = gf_gms_put_meta(g, key, 1 + k % allocs, k % size, &k, sizeof(k))) < 0)
				return die("put_meta", rc);
		}
		say("loaded allocs=%zu", allocs);
		if (pause && !wait_line())
			goto done;
		uint64_t gen;
		if ((rc = gf_gms_commit(g, &gen)) < 0)
			return die("commit", rc);
		say("committed generation=%llu", (unsigned long long)gen);
	} else {
		if ((rc = gf_gms_map_all(g)) < 0)
			return die("map_all", rc);
		say("mapped allocs=%zu meta=%zu", gf_gms_alloc_count(g), gf_gms_meta_count(g));
	}
	/* Everyone checks the bytes: a reader sees the writer's memory, not a copy of its own. */
	if (!verify(g, seed))
		return 1;
	if (sleep_wake) {
		if ((rc = gf_gms_unmap(g)) < 0)
			return die("unmap", rc);
		say("asleep");
		if (!wait_line())
			goto done;
		int64_t t0 = 0;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		t0 = ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
		rc = gf_gms_remap(g, remap_timeout);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		long ms = (long)(ts.tv_sec * 1000 + ts.tv_nsec / 1000000 - t0);
		if (rc < 0) {
			say("error=%s what=remap ms=%ld detail=\"%s\"", gf_error_name(rc), ms, gf_error_detail());
			return 1;
		}
		say("awake ms=%ld", ms);
		/* The same bytes after the remap (e.g. from a GMS restored from a snapshot). */
		if (!verify(g, seed))
			return 1;
	}
	if (hold) {
		gf_gms_set_lost_fn(g, on_lost, NULL);
		if ((rc = gf_gms_start_watch(g)) < 0)
			return die("watch", rc);
		say("holding");
		while (wait_line())
			;
	}
done:
	gf_gms_free(g);
	gf_mem_free(mem);
	return 0;
}
