/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "safetensors.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (err && errlen)
		vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

uint64_t st_nbytes(const struct st_tensor_in *t)
{
	uint64_t count = 1;
	for (unsigned d = 0; d < t->ndim; d++)
		count *= t->shape[d];
	return count * gf_safetensors_dtype_bits(t->dtype) / 8;
}

int st_write(const char *path, const struct st_tensor_in *ts, size_t n, char *err, size_t errlen)
{
	json_t *root = json_object();
	uint64_t off = 0;
	int rc = -1;
	char *hdr = NULL;
	FILE *f = NULL;
	if (!root)
		return fail(err, errlen, "out of memory");
	for (size_t i = 0; i < n; i++) {
		unsigned bits = gf_safetensors_dtype_bits(ts[i].dtype);
		if (!bits || ts[i].ndim > GF_SAFETENSORS_MAX_DIMS || !ts[i].name || !*ts[i].name) {
			fail(err, errlen, "tensor %zu: bad name, dtype or rank", i);
			goto out;
		}
		uint64_t bytes = st_nbytes(&ts[i]);
		json_t *shape = json_array();
		for (unsigned d = 0; d < ts[i].ndim; d++) {
			json_array_append_new(shape, json_integer((json_int_t)ts[i].shape[d]));
		}
		json_t *t = json_pack("{s:s,s:o,s:[I,I]}", "dtype", ts[i].dtype, "shape", shape, "data_offsets",
				      (json_int_t)off, (json_int_t)(off + bytes));
		if (!t || json_object_set_new(root, ts[i].name, t)) {
			fail(err, errlen, "out of memory");
			goto out;
		}
		off += bytes;
	}
	hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	if (!hdr) {
		fail(err, errlen, "out of memory");
		goto out;
	}
	size_t hlen = strlen(hdr);
	size_t padded = (hlen + 7) & ~(size_t)7;
	f = fopen(path, "wbe");
	if (!f) {
		fail(err, errlen, "create %s: %s", path, strerror(errno));
		goto out;
	}
	uint8_t le[8];
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
	fwrite(le, 1, 8, f);
	fwrite(hdr, 1, hlen, f);
	for (size_t i = hlen; i < padded; i++)
		fputc(' ', f);
	for (size_t i = 0; i < n; i++) {
		uint64_t bytes = st_nbytes(&ts[i]);
		if (bytes && fwrite(ts[i].data, 1, bytes, f) != bytes)
			break;
	}
	if (ferror(f) | fclose(f)) {
		f = NULL;
		fail(err, errlen, "write %s: %s", path, strerror(errno));
		goto out;
	}
	f = NULL;
	rc = 0;
out:
	if (f)
		fclose(f);
	free(hdr);
	json_decref(root);
	return rc;
}
