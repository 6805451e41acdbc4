/* SPDX-License-Identifier: Apache-2.0 */
/* A small, strict reader and writer of the safetensors format:
 * 8-byte little-endian header length N, N bytes of JSON header
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {"k": "v"}}, then the data area. Every field is checked;
 * errors come back as text for the user. */
#ifndef GF_SAFETENSORS_H
#define GF_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 16
/* The format's own limit on the header (100 MB), so a hostile length never
 * makes us allocate or parse more than that. */
#define ST_MAX_HEADER (100u * 1000 * 1000)

struct st_tensor {
	char *name;
	char dtype[16];
	unsigned dtype_size; /* bytes per element */
	unsigned ndim;
	uint64_t shape[ST_MAX_DIMS];
	uint64_t begin; /* offsets into the data area */
	uint64_t end;
	const uint8_t *data; /* points into the parsed buffer */
};

struct st_file {
	void *map; /* whole file when opened by st_open() (munmap'ed by st_close()) */
	size_t map_len;
	const uint8_t *data; /* data area */
	uint64_t data_len;
	size_t n;
	struct st_tensor *t; /* sorted by begin offset */
	char *metadata;      /* "__metadata__" as compact JSON, or NULL */
};

/* Bytes per element of a dtype name, 0 when unknown. */
unsigned st_dtype_size(const char *dtype);
/* Parse @len bytes at @buf (borrowed; must outlive @out). Returns 0, or -1
 * with a message in @err. */
int st_parse(const uint8_t *buf, size_t len, struct st_file *out, char *err, size_t errlen);
/* Map and parse the file at @path. */
int st_open(const char *path, struct st_file *out, char *err, size_t errlen);
void st_close(struct st_file *f);

/* One tensor to write: @data holds exactly prod(shape) * dtype size bytes. */
struct st_tensor_in {
	const char *name;
	const char *dtype;
	unsigned ndim;
	const uint64_t *shape;
	const void *data;
};
/* Write tensors in the given order, contiguous, header padded with spaces
 * to a multiple of 8 bytes. Returns 0, or -1 with @err. */
int st_write(const char *path, const struct st_tensor_in *ts, size_t n, char *err, size_t errlen);

#endif
