/* SPDX-License-Identifier: Apache-2.0 */
/* The example engine's safetensors reader/writer and its deterministic
 * model, and the library's reader under it: good files round-trip, every kind
 * of malformed file is refused with a message (the reference library's rules:
 * tests/safetensors/test_safetensors_ref.py checks them against it), and inference
 * is a pure function of weights and seed. */
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
#include "gpufailover/safetensors.h"
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

/* Parse a header text with @datalen data bytes; on failure the detail is
 * copied into @err. Returns the library's code. */
static int parse_text(const char *header, size_t datalen, char *err, size_t errlen)
{
	size_t len;
	uint8_t *b = image(header, strlen(header), datalen, &len);
	gf_safetensors *st = NULL;
	int rc = gf_safetensors_parse(&st, b, len);
	if (rc)
		snprintf(err, errlen, "%s", gf_error_detail());
	gf_safetensors_free(st);
	free(b);
	return rc;
}

static void test_good(void **state)
{
	const char *hdr = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]},"
			  "\"a\":{\"dtype\":\"I8\",\"shape\":[8],\"data_offsets\":[0,8]},"
			  "\"__metadata__\":{\"format\":\"pt\"},"
			  "\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[34,34]},"
			  "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[32,34]},"
			  "\"f4\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[34,37]},"
			  "\"q\":{\"dtype\":\"F8_E4M3FNUZ\",\"shape\":[3],\"data_offsets\":[37,40]}}  ";
	size_t len;
	uint8_t *b = image(hdr, strlen(hdr), 40, &len);
	gf_safetensors *st;
	assert_int_equal(gf_safetensors_parse(&st, b, len), 0);
	assert_int_equal(gf_safetensors_count(st), 6);
	assert_int_equal(gf_safetensors_data_offset(st), 8 + strlen(hdr));
	/* Sorted by (begin, end): the empty z before f4 at the same offset. */
	static const char *order[] = { "a", "b", "s", "z", "f4", "q" };
	struct gf_safetensors_tensor t;
	for (size_t i = 0; i < 6; i++) {
		assert_int_equal(gf_safetensors_at(st, i, &t), 0);
		assert_string_equal(t.name, order[i]);
	}
	assert_int_equal(gf_safetensors_at(st, 1, &t), 0);
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[1], 3);
	assert_int_equal(t.dtype_bits, 32);
	assert_ptr_equal(t.data, b + 8 + strlen(hdr) + 8);
	assert_int_equal(gf_safetensors_at(st, 2, &t), 0);
	assert_int_equal(t.ndim, 0);
	assert_int_equal(gf_safetensors_at(st, 4, &t), 0);
	assert_string_equal(t.dtype, "F4");
	assert_int_equal(t.dtype_bits, 4);
	assert_int_equal(gf_safetensors_at(st, 6, &t), GF_ERR_NOT_FOUND);
	assert_string_equal(gf_safetensors_metadata(st), "{\"format\":\"pt\"}");
	gf_safetensors_free(st);
	free(b);

	char err[256];
	/* No tensors; null metadata is no metadata; keys other than the three are ignored. */
	assert_int_equal(parse_text("{}", 0, err, sizeof(err)), 0);
	b = image("{\"__metadata__\":null}", strlen("{\"__metadata__\":null}"), 0, &len);
	assert_int_equal(gf_safetensors_parse(&st, b, len), 0);
	assert_null(gf_safetensors_metadata(st));
	gf_safetensors_free(st);
	free(b);
	assert_int_equal(parse_text("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1, err,
				    sizeof(err)),
			 0);
	assert_int_equal(gf_safetensors_dtype_bits("F6_E3M2"), 6);
	assert_int_equal(gf_safetensors_dtype_bits("F8_E5M2FNUZ"), 8);
	assert_int_equal(gf_safetensors_dtype_bits("F128"), 0);
	assert_int_equal(gf_safetensors_dtype_bits(NULL), 0);
}

struct bad {
	const char *header;
	size_t datalen;
	const char *want; /* substring of the message */
};

static void test_malformed(void **state)
{
	static const struct bad bad[] = {
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "cover 16 bytes but the data area has 8" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "cover 4 bytes but the data area has 8" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "a hole of 4 bytes" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
		  8, "\"b\" starts at 4: it overlaps" },
		{ "{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, "do not fill whole bytes" },
		{ "{\"__metadata__\":[\"x\"]}", 0, "__metadata__" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 16, "need 16" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", 16, "begin 16 > end" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-4,12]}}", 16, "non-negative" },
		{ "{\"a\":{\"dtype\":\"X32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "unknown dtype" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,16]}}", 16, "shape[0]" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16, "shape" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16, "data_offsets" },
		{ "{\"a\":{\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "dtype" },
		{ "{\"a\":[1,2]}", 0, "not a JSON object" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,16]}}", 16,
		  "overflows" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
		  16, "overlaps \"a\"" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		  4, "not valid JSON" },
		{ "{\"a\":", 0, "not valid JSON" },
		{ "{\"a\":1} trailing", 0, "not valid JSON" },
		{ "[1,2,3]", 0, "not a JSON object" },
		{ "{\"__metadata__\":{\"k\":1}}", 0, "value of \"k\" is not a string" },
		{ "{\"\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "empty name" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char err[256] = "";
		int rc = parse_text(bad[i].header, bad[i].datalen, err, sizeof(err));
		if (rc != GF_ERR_INVALID_ARG || !strstr(err, bad[i].want))
			fail_msg("case %zu (%s): rc %d, message \"%s\", wanted \"%s\"", i, bad[i].header, rc, err,
				 bad[i].want);
	}
}

static void test_bad_lengths(void **state)
{
	gf_safetensors *st = (gf_safetensors *)&st;
	uint8_t tiny[5] = { 1, 2, 3, 4, 5 };
	assert_int_equal(gf_safetensors_parse(&st, tiny, sizeof(tiny)), GF_ERR_INVALID_ARG);
	assert_null(st);
	assert_non_null(strstr(gf_error_detail(), "too short"));
	size_t len;
	const char *hdr = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
	/* Header length claiming more than the file holds: truncated. */
	uint8_t *b = image(hdr, strlen(hdr) + 100, 4, &len);
	assert_int_equal(gf_safetensors_parse(&st, b, len), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "truncated"));
	free(b);
	/* Absurd length: refused before anything is allocated. */
	b = image(hdr, UINT64_MAX, 4, &len);
	assert_int_equal(gf_safetensors_parse(&st, b, len), GF_ERR_TOO_BIG);
	assert_non_null(strstr(gf_error_detail(), "limit"));
	free(b);
	b = image(hdr, 1, 4, &len);
	assert_int_equal(gf_safetensors_parse(&st, b, len), GF_ERR_INVALID_ARG);
	free(b);
	/* The data cut short. */
	b = image(hdr, strlen(hdr), 2, &len);
	assert_int_equal(gf_safetensors_parse(&st, b, len), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "data area has 2"));
	free(b);
	/* Every truncation of a good file fails cleanly. */
	b = image(hdr, strlen(hdr), 4, &len);
	for (size_t cut = 0; cut < len; cut++)
		assert_int_not_equal(gf_safetensors_parse(&st, b, cut), 0);
	free(b);
	assert_int_equal(gf_safetensors_parse(NULL, tiny, sizeof(tiny)), GF_ERR_INVALID_ARG);
	gf_safetensors_free(NULL);
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
	gf_safetensors *f;
	assert_int_equal(gf_safetensors_open(&f, path), 0);
	assert_int_equal(gf_safetensors_count(f), 8);
	assert_int_equal(model_from_safetensors(&loaded, f), 0);
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
	gf_safetensors_free(f);

	/* Open errors name the file; parse errors too. */
	assert_int_equal(gf_safetensors_open(&f, "/nonexistent/w.safetensors"), GF_ERR_IO);
	assert_non_null(strstr(gf_error_detail(), "/nonexistent/w.safetensors"));
	assert_int_equal(gf_safetensors_open(&f, dir), GF_ERR_IO);
	assert_non_null(strstr(gf_error_detail(), "not a regular file"));
	FILE *fp = fopen(path, "we");
	assert_non_null(fp);
	fputs("short", fp);
	fclose(fp);
	assert_int_equal(gf_safetensors_open(&f, path), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), path));
	assert_non_null(strstr(gf_error_detail(), "too short"));
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
	return tu_run_group_tests(tests, NULL, NULL);
}
