/* SPDX-License-Identifier: Apache-2.0 */
/* The example engine's safetensors reader/writer and its deterministic
 * model: good files round-trip, every kind of malformed file is refused with
 * a message, and inference is a pure function of weights and seed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../examples/c-engine/model.h"
#include "../../examples/c-engine/safetensors.h"
#include "../common/testutil.h"

/* A file image: 8-byte LE length + header + @datalen bytes of data. */
static uint8_t *image(const char *header, uint64_t claimed_len, size_t datalen, size_t *len)
{
	size_t hl = strlen(header);
	*len = 8 + hl + datalen;
	uint8_t *b = calloc(1, *len);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(claimed_len >> (8 * i));
	memcpy(b + 8, header, hl);
	for (size_t i = 0; i < datalen; i++)
		b[8 + hl + i] = (uint8_t)i;
	return b;
}

static int parse_text(const char *header, size_t datalen, struct st_file *f, char *err, size_t errlen)
{
	size_t len;
	uint8_t *b = image(header, strlen(header), datalen, &len);
	int rc = st_parse(b, len, f, err, errlen);
	if (rc == 0)
		st_close(f); /* the tensors point into b; only the result matters here */
	free(b);
	return rc;
}

static void test_good(void **state)
{
	const char *hdr = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]},"
			  "\"a\":{\"dtype\":\"I8\",\"shape\":[8],\"data_offsets\":[0,8]},"
			  "\"__metadata__\":{\"format\":\"pt\"},"
			  "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[32,34]}}  ";
	size_t len;
	uint8_t *b = image(hdr, strlen(hdr), 34, &len);
	struct st_file f;
	char err[256] = "";
	assert_int_equal(st_parse(b, len, &f, err, sizeof(err)), 0);
	assert_int_equal(f.n, 3);
	/* Sorted by offset. */
	assert_string_equal(f.t[0].name, "a");
	assert_string_equal(f.t[1].name, "b");
	assert_string_equal(f.t[2].name, "s");
	assert_int_equal(f.t[1].ndim, 2);
	assert_int_equal(f.t[1].shape[1], 3);
	assert_int_equal(f.t[1].dtype_size, 4);
	assert_int_equal(f.t[2].ndim, 0);
	assert_ptr_equal(f.t[1].data, b + 8 + strlen(hdr) + 8);
	assert_non_null(f.metadata);
	assert_non_null(strstr(f.metadata, "format"));
	st_close(&f);
	free(b);

	/* Empty file of tensors. */
	assert_int_equal(parse_text("{}", 0, &f, err, sizeof(err)), 0);
}

struct bad {
	const char *header;
	size_t datalen;
	const char *want; /* substring of the message */
};

static void test_malformed(void **state)
{
	static const struct bad bad[] = {
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "beyond the data area" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 16, "need 16" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", 16, "begin 16 > end" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-4,12]}}", 16, "non-negative" },
		{ "{\"a\":{\"dtype\":\"X32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "unknown dtype" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,16]}}", 16, "shape[0]" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16, "shape" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16, "data_offsets" },
		{ "{\"a\":{\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "dtype" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16],\"x\":1}}", 16, "unexpected keys" },
		{ "{\"a\":[1,2]}", 0, "not a JSON object" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,16]}}", 16,
		  "overflows" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
		  16, "overlap" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		  4, "not valid JSON" },
		{ "{\"a\":", 0, "not valid JSON" },
		{ "{\"a\":1} trailing", 0, "not valid JSON" },
		{ "[1,2,3]", 0, "does not start with '{'" },
		{ "{\"__metadata__\":{\"k\":1}}", 0, "__metadata__" },
		{ "{\"\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "empty name" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct st_file f;
		char err[256] = "";
		memset(&f, 0x5a, sizeof(f));
		int rc = parse_text(bad[i].header, bad[i].datalen, &f, err, sizeof(err));
		if (rc != -1 || !strstr(err, bad[i].want))
			fail_msg("case %zu (%s): rc %d, message \"%s\", wanted \"%s\"", i, bad[i].header, rc, err,
				 bad[i].want);
	}
}

static void test_bad_lengths(void **state)
{
	struct st_file f;
	char err[256];
	uint8_t tiny[5] = { 1, 2, 3, 4, 5 };
	assert_int_equal(st_parse(tiny, sizeof(tiny), &f, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "too short"));
	size_t len;
	const char *hdr = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
	/* Header length claiming more than the file holds: truncated. */
	uint8_t *b = image(hdr, strlen(hdr) + 100, 4, &len);
	assert_int_equal(st_parse(b, len, &f, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "truncated"));
	free(b);
	/* Absurd length: refused before anything is allocated. */
	b = image(hdr, UINT64_MAX, 4, &len);
	assert_int_equal(st_parse(b, len, &f, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "limit"));
	free(b);
	b = image(hdr, 1, 4, &len);
	assert_int_equal(st_parse(b, len, &f, err, sizeof(err)), -1);
	free(b);
	/* The data cut short: the tensor's offsets run past the end. */
	b = image(hdr, strlen(hdr), 2, &len);
	assert_int_equal(st_parse(b, len, &f, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "beyond"));
	free(b);
	/* Every truncation of a good file fails cleanly. */
	b = image(hdr, strlen(hdr), 4, &len);
	for (size_t cut = 0; cut < len; cut++)
		assert_int_equal(st_parse(b, cut, &f, err, sizeof(err)), -1);
	free(b);
}

static void test_roundtrip_and_infer(void **state)
{
	char *dir = tu_tmpdir();
	char path[512], err[256];
	snprintf(path, sizeof(path), "%s/w.safetensors", dir);
	struct model gen, loaded;
	void *buf;
	assert_int_equal(model_generate(&gen, 4, 256, &buf), 0);
	assert_int_equal(gen.n, 8);
	assert_int_equal(model_write(&gen, path, err, sizeof(err)), 0);
	struct st_file f;
	assert_int_equal(st_open(path, &f, err, sizeof(err)), 0);
	assert_int_equal(f.n, 8);
	assert_int_equal(model_from_safetensors(&loaded, &f), 0);
	for (size_t i = 0; i < gen.n; i++) {
		assert_string_equal(loaded.t[i].name, gen.t[i].name);
		assert_int_equal(loaded.t[i].nbytes, gen.t[i].nbytes);
		assert_memory_equal(loaded.t[i].data, gen.t[i].data, gen.t[i].nbytes);
	}
	float *o1, *o2, *o3;
	size_t l1, l2, l3;
	assert_int_equal(model_infer(&gen, 42, &o1, &l1), 0);
	assert_int_equal(model_infer(&loaded, 42, &o2, &l2), 0);
	assert_int_equal(model_infer(&gen, 43, &o3, &l3), 0);
	assert_int_equal(l1, 256);
	assert_int_equal(l2, 256);
	assert_memory_equal(o1, o2, l1 * sizeof(float));
	assert_memory_not_equal(o1, o3, l1 * sizeof(float));
	/* Not saturated: the values are spread inside (-1, 1). */
	int inside = 0;
	for (size_t i = 0; i < l1; i++)
		inside += o1[i] > -0.99f && o1[i] < 0.99f && o1[i] != 0.0f;
	assert_true(inside > 200);
	free(o1);
	free(o2);
	free(o3);
	model_clear(&loaded);
	model_clear(&gen);
	free(buf);
	st_close(&f);

	/* Open errors name the file. */
	assert_int_equal(st_open("/nonexistent/w.safetensors", &f, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "/nonexistent/w.safetensors"));
	assert_int_equal(st_open(dir, &f, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "not a regular file"));
	unlink(path);
	rmdir(dir);
	free(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_good),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_bad_lengths),
		cmocka_unit_test(test_roundtrip_and_infer),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
