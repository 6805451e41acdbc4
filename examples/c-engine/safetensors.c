/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "safetensors.h"

static const struct {
	const char *name;
	unsigned size;
} dtypes[] = {
	{ "F64", 8 }, { "F32", 4 }, { "F16", 2 }, { "BF16", 2 }, { "F8_E4M3", 1 }, { "F8_E5M2", 1 },
	{ "F8_E8M0", 1 }, { "I64", 8 }, { "I32", 4 }, { "I16", 2 }, { "I8", 1 }, { "U64", 8 },
	{ "U32", 4 }, { "U16", 2 }, { "U8", 1 }, { "BOOL", 1 }, { "C64", 8 },
};

unsigned st_dtype_size(const char *dtype)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (!strcmp(dtypes[i].name, dtype))
			return dtypes[i].size;
	return 0;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (err && errlen)
		vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

static void free_tensors(struct st_tensor *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(t[i].name);
	free(t);
}

static int by_begin(const void *a, const void *b)
{
	const struct st_tensor *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

static int parse_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int parse_tensor(const char *name, json_t *obj, uint64_t data_len, struct st_tensor *t, char *err,
			size_t errlen)
{
	if (!json_is_object(obj))
		return fail(err, errlen, "tensor \"%s\": entry is not a JSON object", name);
	json_t *dt = json_object_get(obj, "dtype"), *shape = json_object_get(obj, "shape"),
	       *offs = json_object_get(obj, "data_offsets");
	if (!json_is_string(dt))
		return fail(err, errlen, "tensor \"%s\": missing or non-string \"dtype\"", name);
	if (!json_is_array(shape))
		return fail(err, errlen, "tensor \"%s\": missing or non-array \"shape\"", name);
	if (!json_is_array(offs) || json_array_size(offs) != 2)
		return fail(err, errlen, "tensor \"%s\": \"data_offsets\" must be an array [begin, end]", name);
	if (json_object_size(obj) != 3)
		return fail(err, errlen, "tensor \"%s\": unexpected keys (only dtype, shape, data_offsets)", name);
	const char *dts = json_string_value(dt);
	unsigned esize = st_dtype_size(dts);
	if (!esize)
		return fail(err, errlen, "tensor \"%s\": unknown dtype \"%s\"", name, dts);
	if (json_array_size(shape) > ST_MAX_DIMS)
		return fail(err, errlen, "tensor \"%s\": %zu dimensions (at most %d supported)", name,
			    json_array_size(shape), ST_MAX_DIMS);
	memset(t, 0, sizeof(*t));
	snprintf(t->dtype, sizeof(t->dtype), "%s", dts);
	t->dtype_size = esize;
	t->ndim = (unsigned)json_array_size(shape);
	uint64_t count = 1;
	for (unsigned i = 0; i < t->ndim; i++) {
		if (parse_u64(json_array_get(shape, i), &t->shape[i]))
			return fail(err, errlen, "tensor \"%s\": shape[%u] is not a non-negative integer", name, i);
		if (t->shape[i] && count > UINT64_MAX / t->shape[i])
			return fail(err, errlen, "tensor \"%s\": shape overflows", name);
		count *= t->shape[i];
	}
	if (count > UINT64_MAX / esize)
		return fail(err, errlen, "tensor \"%s\": byte size overflows", name);
	if (parse_u64(json_array_get(offs, 0), &t->begin) || parse_u64(json_array_get(offs, 1), &t->end))
		return fail(err, errlen, "tensor \"%s\": data_offsets are not non-negative integers", name);
	if (t->begin > t->end)
		return fail(err, errlen, "tensor \"%s\": data_offsets begin %llu > end %llu", name,
			    (unsigned long long)t->begin, (unsigned long long)t->end);
	if (t->end > data_len)
		return fail(err, errlen, "tensor \"%s\": data_offsets end %llu beyond the data area (%llu bytes)",
			    name, (unsigned long long)t->end, (unsigned long long)data_len);
	if (t->end - t->begin != count * esize)
		return fail(err, errlen, "tensor \"%s\": %llu data bytes but dtype %s and shape need %llu", name,
			    (unsigned long long)(t->end - t->begin), dts, (unsigned long long)(count * esize));
	t->name = strdup(name);
	if (!t->name)
		return fail(err, errlen, "out of memory");
	return 0;
}

int st_parse(const uint8_t *buf, size_t len, struct st_file *out, char *err, size_t errlen)
{
	if (len < 8)
		return fail(err, errlen, "file too short (%zu bytes): no 8-byte header length", len);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | buf[i];
	if (hlen < 2)
		return fail(err, errlen, "header length %llu is too small for a JSON object",
			    (unsigned long long)hlen);
	if (hlen > ST_MAX_HEADER)
		return fail(err, errlen, "header length %llu exceeds the format's limit of %u bytes",
			    (unsigned long long)hlen, ST_MAX_HEADER);
	if (hlen > len - 8)
		return fail(err, errlen, "header length %llu runs past the end of the file (%zu bytes): truncated?",
			    (unsigned long long)hlen, len);
	if (buf[8] != '{')
		return fail(err, errlen, "header does not start with '{'");
	json_error_t je;
	json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return fail(err, errlen, "header is not valid JSON: %s (at byte %d)", je.text, je.position);
	if (!json_is_object(root)) {
		json_decref(root);
		return fail(err, errlen, "header is not a JSON object");
	}
	struct st_file f = { .data = buf + 8 + hlen, .data_len = len - 8 - hlen };
	size_t cap = json_object_size(root);
	f.t = calloc(cap ? cap : 1, sizeof(*f.t));
	if (!f.t) {
		json_decref(root);
		return fail(err, errlen, "out of memory");
	}
	const char *key;
	json_t *val;
	json_object_foreach(root, key, val) {
		if (!strcmp(key, "__metadata__")) {
			const char *mk;
			json_t *mv;
			if (!json_is_object(val))
				goto bad_meta;
			json_object_foreach(val, mk, mv) {
				if (!json_is_string(mv))
					goto bad_meta;
			}
			f.metadata = json_dumps(val, JSON_COMPACT);
			continue;
		}
		if (!*key) {
			fail(err, errlen, "a tensor has an empty name");
			goto error;
		}
		if (parse_tensor(key, val, f.data_len, &f.t[f.n], err, errlen))
			goto error;
		f.t[f.n].data = f.data + f.t[f.n].begin;
		f.n++;
	}
	json_decref(root);
	qsort(f.t, f.n, sizeof(*f.t), by_begin);
	for (size_t i = 1; i < f.n; i++) {
		if (f.t[i].begin < f.t[i - 1].end && f.t[i].end > f.t[i].begin) {
			fail(err, errlen, "tensors \"%s\" and \"%s\" overlap in the data area", f.t[i - 1].name,
			     f.t[i].name);
			free_tensors(f.t, f.n);
			free(f.metadata);
			return -1;
		}
	}
	*out = f;
	return 0;
bad_meta:
	fail(err, errlen, "\"__metadata__\" must be an object of string values");
error:
	json_decref(root);
	free_tensors(f.t, f.n);
	free(f.metadata);
	return -1;
}

int st_open(const char *path, struct st_file *out, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fail(err, errlen, "open %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return fail(err, errlen, "stat %s: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return fail(err, errlen, "%s is not a regular file", path);
	}
	size_t len = (size_t)st.st_size;
	void *map = NULL;
	if (len > 0) {
		map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED) {
			int e = errno;
			close(fd);
			return fail(err, errlen, "mmap %s: %s", path, strerror(e));
		}
	}
	close(fd);
	char sub[400];
	if (st_parse(map, len, out, sub, sizeof(sub))) {
		if (map)
			munmap(map, len);
		return fail(err, errlen, "%s: %s", path, sub);
	}
	out->map = map;
	out->map_len = len;
	return 0;
}

void st_close(struct st_file *f)
{
	if (!f)
		return;
	free_tensors(f->t, f->n);
	free(f->metadata);
	if (f->map)
		munmap(f->map, f->map_len);
	memset(f, 0, sizeof(*f));
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
		unsigned es = st_dtype_size(ts[i].dtype);
		if (!es || ts[i].ndim > ST_MAX_DIMS || !ts[i].name || !*ts[i].name) {
			fail(err, errlen, "tensor %zu: bad name, dtype or rank", i);
			goto out;
		}
		uint64_t bytes = es;
		json_t *shape = json_array();
		for (unsigned d = 0; d < ts[i].ndim; d++) {
			bytes *= ts[i].shape[d];
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
		uint64_t bytes = st_dtype_size(ts[i].dtype);
		for (unsigned d = 0; d < ts[i].ndim; d++)
			bytes *= ts[i].shape[d];
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
