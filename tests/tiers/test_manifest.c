/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The manifest parser against the checked-in fuzz corpus (argv[1]): "valid"
 * parses and round-trips, "other_version" is GF_ERR_VERSION, every other
 * seed is a malformed manifest and GF_ERR_PROTOCOL with a detail naming it.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpufailover.h"
#include "snapshot.h"
#include "../common/testutil.h"

static const char *corpus;

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	rewind(f);
	char *s = malloc((size_t)n + 1);
	assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return s;
}

static void test_corpus(void **state)
{
	(void)state;
	DIR *d = opendir(corpus);
	assert_non_null(d);
	struct dirent *e;
	int seen = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[1024];
		size_t len;
		snprintf(path, sizeof(path), "%s/%s", corpus, e->d_name);
		char *text = slurp(path, &len);
		struct tiers_manifest *mf = NULL;
		int rc = tiers_manifest_parse(text, len, &mf);
		int want = !strcmp(e->d_name, "valid") ? 0 : !strcmp(e->d_name, "other_version") ? GF_ERR_VERSION : GF_ERR_PROTOCOL;
		if (rc != want)
			fail_msg("%s: got %s (%s), want %s", e->d_name, gf_error_name(rc), gf_error_detail(), gf_error_name(want));
		if (rc < 0) {
			assert_null(mf);
			assert_non_null(strstr(gf_error_detail(), "snapshot manifest"));
		} else {
			assert_int_equal(mf->nallocs, 3);
			assert_int_equal(mf->nmeta, 2);
			assert_string_equal(mf->allocs[2].tag, "\xff\xfe"); /* not UTF-8: stored as hex */
			assert_int_equal(mf->meta[0].value_len, 3);
			assert_memory_equal(mf->meta[0].value, "\x01\x00\x02", 3);
			uint8_t h[16];
			assert_int_equal(tiers_manifest_layout_hash(mf, h), 0);
			assert_memory_equal(h, mf->layout_hash, 16);
			tiers_manifest_free(mf);
		}
		free(text);
		seen++;
	}
	closedir(d);
	assert_true(seen >= 10);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	corpus = argv[1];
	const struct CMUnitTest tests[] = { cmocka_unit_test(test_corpus) };
	return tu_run_group_tests(tests, NULL, NULL);
}
