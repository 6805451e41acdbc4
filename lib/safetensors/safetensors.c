/* SPDX-License-Identifier: Apache-2.0 */
/* The safetensors reader: the rules are the reference library's (header
 * comment of gpufailover/safetensors.h), so a file it refuses is refused here
 * and a file it writes loads here. */
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common.h"
#include "gpufailover/safetensors.h"

struct st_entry {
	char *name;
	const char *dtype; /* static, from the dtype table */
	unsigned bits;
	unsigned ndim;
	uint64_t shape[GF_SAFETENSORS_MAX_DIMS];
	uint64_t begin, end;
};

struct gf_safetensors {
	void *map; /* the file, when opened by path */
	size_t map_len;
	const uint8_t *data;
	uint64_t data_offset;
	size_t n;
	struct st_entry *t; /* sorted by (begin, end) */
	char *metadata;
};

static const struct {
	const char *name;
	unsigned bits;
} dtypes[] = {
	{ "BOOL", 8 },	      { "U8", 8 },	    { "I8", 8 },	   { "U16", 16 },	{ "I16", 16 },
	{ "F16", 16 },	      { "BF16", 16 },	    { "U32", 32 },	   { "I32", 32 },	{ "F32", 32 },
	{ "U64", 64 },	      { "I64", 64 },	    { "F64", 64 },	   { "C64", 64 },	{ "F8_E4M3", 8 },
	{ "F8_E5M2", 8 },     { "F8_E4M3FNUZ", 8 }, { "F8_E5M2FNUZ", 8 }, { "F8_E8M0", 8 }, { "F4", 4 },
	{ "F6_E2M3", 6 },     { "F6_E3M2", 6 },
};

static int dtype_index(const char *dtype)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (!strcmp(dtypes[i].name, dtype))
			return (int)i;
	return -1;
}

unsigned gf_safetensors_dtype_bits(const char *dtype)
{
	int i = dtype ? dtype_index(dtype) : -1;
	return i < 0 ? 0 : dtypes[i].bits;
}

static void free_entries(struct st_entry *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(t[i].name);
	free(t);
}

void gf_safetensors_free(gf_safetensors *st)
{
	if (!st)
		return;
	free_entries(st->t, st->n);
	free(st->metadata);
	if (st->map)
		munmap(st->map, st->map_len);
	free(st);
}

static int by_range(const void *a, const void *b)
{
	const struct st_entry *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return (x->end > y->end) - (x->end < y->end);
}

static int get_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int parse_entry(const char *name, json_t *obj, struct st_entry *t)
{
	if (!json_is_object(obj))
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": entry is not a JSON object", name);
	json_t *dt = json_object_get(obj, "dtype"), *shape = json_object_get(obj, "shape"),
	       *offs = json_object_get(obj, "data_offsets");
	if (!json_is_string(dt))
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": missing or non-string \"dtype\"", name);
	if (!json_is_array(shape))
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": missing or non-array \"shape\"", name);
	if (!json_is_array(offs) || json_array_size(offs) != 2)
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": \"data_offsets\" must be an array [begin, end]",
			      name);
	int di = dtype_index(json_string_value(dt));
	if (di < 0)
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": unknown dtype \"%.32s\"", name,
			      json_string_value(dt));
	if (json_array_size(shape) > GF_SAFETENSORS_MAX_DIMS)
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": %zu dimensions (at most %d supported)", name,
			      json_array_size(shape), GF_SAFETENSORS_MAX_DIMS);
	t->dtype = dtypes[di].name;
	t->bits = dtypes[di].bits;
	t->ndim = (unsigned)json_array_size(shape);
	uint64_t count = 1;
	for (unsigned i = 0; i < t->ndim; i++) {
		if (get_u64(json_array_get(shape, i), &t->shape[i]))
			return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": shape[%u] is not a non-negative integer",
				      name, i);
		if (t->shape[i] && count > UINT64_MAX / t->shape[i])
			return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": shape overflows", name);
		count *= t->shape[i];
	}
	if (count > UINT64_MAX / t->bits)
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": byte size overflows", name);
	if (count * t->bits % 8)
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": %llu elements of %s do not fill whole bytes", name,
			      (unsigned long long)count, t->dtype);
	if (get_u64(json_array_get(offs, 0), &t->begin) || get_u64(json_array_get(offs, 1), &t->end))
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": data_offsets are not non-negative integers", name);
	if (t->begin > t->end)
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": data_offsets begin %llu > end %llu", name,
			      (unsigned long long)t->begin, (unsigned long long)t->end);
	if (t->end - t->begin != count * t->bits / 8)
		return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\": %llu data bytes but dtype %s and shape need %llu",
			      name, (unsigned long long)(t->end - t->begin), t->dtype,
			      (unsigned long long)(count * t->bits / 8));
	t->name = strdup(name);
	return t->name ? 0 : gf_err(GF_ERR_NOMEM, "safetensors: out of memory");
}

static int parse_metadata(json_t *val, char **out)
{
	const char *k;
	json_t *v;
	if (!json_is_object(val))
		return gf_err(GF_ERR_INVALID_ARG, "\"__metadata__\" must be an object of string values");
	json_object_foreach(val, k, v) {
		if (!json_is_string(v))
			return gf_err(GF_ERR_INVALID_ARG, "\"__metadata__\" value of \"%s\" is not a string", k);
	}
	*out = json_dumps(val, JSON_COMPACT | JSON_SORT_KEYS);
	return *out ? 0 : gf_err(GF_ERR_NOMEM, "safetensors: out of memory");
}

/* Sorted ranges must tile the data area exactly: the reference's rule. A
 * check against the previous range only would let an overlap hide behind a
 * zero-size tensor. */
static int check_tiling(const gf_safetensors *st, uint64_t data_len)
{
	uint64_t at = 0;
	for (size_t i = 0; i < st->n; i++) {
		const struct st_entry *t = &st->t[i];
		if (t->begin > at)
			return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\" starts at %llu: a hole of %llu bytes before it",
				      t->name, (unsigned long long)t->begin, (unsigned long long)(t->begin - at));
		if (t->begin < at)
			return gf_err(GF_ERR_INVALID_ARG, "tensor \"%s\" starts at %llu: it overlaps \"%s\" (ends at %llu)",
				      t->name, (unsigned long long)t->begin, i ? st->t[i - 1].name : "",
				      (unsigned long long)at);
		at = t->end;
	}
	if (at != data_len)
		return gf_err(GF_ERR_INVALID_ARG, "the tensors cover %llu bytes but the data area has %llu",
			      (unsigned long long)at, (unsigned long long)data_len);
	return 0;
}

static int parse_header(gf_safetensors *st, json_t *root, uint64_t data_len)
{
	size_t cap = json_object_size(root);
	st->t = calloc(cap ? cap : 1, sizeof(*st->t));
	if (!st->t)
		return gf_err(GF_ERR_NOMEM, "safetensors: out of memory");
	const char *key;
	json_t *val;
	int rc;
	json_object_foreach(root, key, val) {
		if (!strcmp(key, "__metadata__")) {
			rc = json_is_null(val) ? 0 : parse_metadata(val, &st->metadata);
		} else if (!*key) {
			rc = gf_err(GF_ERR_INVALID_ARG, "a tensor has an empty name");
		} else {
			rc = parse_entry(key, val, &st->t[st->n]);
			if (rc == 0)
				st->n++;
		}
		if (rc)
			return rc;
	}
	qsort(st->t, st->n, sizeof(*st->t), by_range);
	return check_tiling(st, data_len);
}

int gf_safetensors_parse(gf_safetensors **out, const void *buf, size_t len)
{
	if (!out || (!buf && len))
		return gf_err(GF_ERR_INVALID_ARG, "safetensors: NULL argument");
	*out = NULL;
	const uint8_t *b = buf;
	if (len < 8)
		return gf_err(GF_ERR_INVALID_ARG, "file too short (%zu bytes): no 8-byte header length", len);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | b[i];
	if (hlen > GF_SAFETENSORS_MAX_HEADER)
		return gf_err(GF_ERR_TOO_BIG, "header length %llu exceeds the format's limit of %u bytes",
			      (unsigned long long)hlen, GF_SAFETENSORS_MAX_HEADER);
	if (hlen > len - 8)
		return gf_err(GF_ERR_INVALID_ARG, "header length %llu runs past the end of the file (%zu bytes): truncated?",
			      (unsigned long long)hlen, len);
	json_error_t je;
	json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return gf_err(GF_ERR_INVALID_ARG, "header is not valid JSON: %s (at byte %d)", je.text, je.position);
	gf_safetensors *st = calloc(1, sizeof(*st));
	if (!st) {
		json_decref(root);
		return gf_err(GF_ERR_NOMEM, "safetensors: out of memory");
	}
	st->data_offset = 8 + hlen;
	st->data = b + st->data_offset;
	int rc = json_is_object(root) ? parse_header(st, root, len - st->data_offset)
				      : gf_err(GF_ERR_INVALID_ARG, "header is not a JSON object");
	json_decref(root);
	if (rc) {
		gf_safetensors_free(st);
		return rc;
	}
	*out = st;
	return 0;
}

int gf_safetensors_open(gf_safetensors **out, const char *path)
{
	if (!out || !path)
		return gf_err(GF_ERR_INVALID_ARG, "safetensors: NULL argument");
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gf_err(GF_ERR_IO, "open %s: %s", path, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) < 0) {
		int e = errno;
		gf_close(fd);
		return gf_err(GF_ERR_IO, "stat %s: %s", path, strerror(e));
	}
	if (!S_ISREG(sb.st_mode)) {
		gf_close(fd);
		return gf_err(GF_ERR_IO, "%s is not a regular file", path);
	}
	size_t len = (size_t)sb.st_size;
	void *map = NULL;
	if (len > 0) {
		map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED) {
			int e = errno;
			gf_close(fd);
			return gf_err(GF_ERR_IO, "mmap %s: %s", path, strerror(e));
		}
	}
	gf_close(fd);
	int rc = gf_safetensors_parse(out, map, len);
	if (rc) {
		char why[512];
		snprintf(why, sizeof(why), "%s", gf_error_detail());
		if (map)
			munmap(map, len);
		return gf_err(rc, "%s: %s", path, why);
	}
	(*out)->map = map;
	(*out)->map_len = len;
	return 0;
}

size_t gf_safetensors_count(const gf_safetensors *st)
{
	return st ? st->n : 0;
}

int gf_safetensors_at(const gf_safetensors *st, size_t i, struct gf_safetensors_tensor *out)
{
	if (!st || !out)
		return gf_err(GF_ERR_INVALID_ARG, "safetensors: NULL argument");
	if (i >= st->n)
		return gf_err(GF_ERR_NOT_FOUND, "safetensors: tensor %zu of %zu", i, st->n);
	const struct st_entry *t = &st->t[i];
	*out = (struct gf_safetensors_tensor){ .name = t->name,
					       .dtype = t->dtype,
					       .dtype_bits = t->bits,
					       .ndim = t->ndim,
					       .shape = t->shape,
					       .begin = t->begin,
					       .end = t->end,
					       .data = st->data + t->begin };
	return 0;
}

const char *gf_safetensors_metadata(const gf_safetensors *st)
{
	return st ? st->metadata : NULL;
}

uint64_t gf_safetensors_data_offset(const gf_safetensors *st)
{
	return st ? st->data_offset : 0;
}
