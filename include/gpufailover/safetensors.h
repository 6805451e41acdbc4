/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gpufailover/safetensors.h
 * @brief A strict reader of the safetensors weight format, validating as the
 *        reference `safetensors` library does.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON header
 * `{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *   "__metadata__": {"k": "v"}}` (padded with spaces), then the data area.
 * Accepted: the header is a JSON object of at most 100,000,000 bytes;
 * `__metadata__`, when present, is null or an object of string values; each
 * tensor entry has dtype, shape and data_offsets
 * (other keys are ignored, as the reference does); the ranges sorted by
 * (begin, end) start at 0, follow each other without gap or overlap (zero-size
 * tensors included) and end exactly at the end of the file; each range holds
 * exactly prod(shape) elements of its dtype. Stricter than the reference:
 * duplicate keys and empty tensor names are refused (the reference keeps the
 * last duplicate silently). Every other input is refused with
 * GF_ERR_INVALID_ARG and a detail naming the tensor and the rule.
 *
 * Dtypes: BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64,
 * C64, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0, and the sub-byte
 * F4, F6_E2M3, F6_E3M2 (a tensor of those must fill whole bytes).
 *
 * Thread rules: a parsed file is immutable; any thread may read it.
 */
#ifndef GPUFAILOVER_SAFETENSORS_H
#define GPUFAILOVER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../gpufailover.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup safetensors safetensors reader
 *  @{ */

/** Most dimensions a tensor may have here (the format sets no limit). */
#define GF_SAFETENSORS_MAX_DIMS 16
/** The format's limit on the JSON header, in bytes. */
#define GF_SAFETENSORS_MAX_HEADER 100000000u

typedef struct gf_safetensors gf_safetensors; /**< one parsed file */

/** One tensor of a parsed file; every pointer lives as long as the file object. */
struct gf_safetensors_tensor {
	const char *name;
	const char *dtype;      /**< as in the header, e.g. "BF16" */
	unsigned dtype_bits;    /**< bits per element (4 for F4) */
	unsigned ndim;          /**< 0 for a scalar */
	const uint64_t *shape;  /**< ndim entries */
	uint64_t begin;         /**< byte offsets into the data area */
	uint64_t end;
	const void *data;       /**< begin..end inside the parsed buffer */
};

/** Bits per element of dtype name @p dtype; 0 for a name the reader does not know. Never blocks. */
GF_EXPORT unsigned gf_safetensors_dtype_bits(const char *dtype);

/**
 * Parse the @p len bytes at @p buf (a whole file). The buffer is borrowed and
 * must outlive *out, which tensors point into. Errors: GF_ERR_INVALID_ARG
 * (malformed; the detail names the rule), GF_ERR_TOO_BIG (header over the
 * format's limit), GF_ERR_NOMEM. The caller frees *out with
 * gf_safetensors_free(). Never blocks.
 */
GF_EXPORT int gf_safetensors_parse(gf_safetensors **out, const void *buf, size_t len);

/**
 * Map the regular file at @p path read-only and parse it as
 * gf_safetensors_parse() does; the mapping lives until gf_safetensors_free().
 * Errors: those of gf_safetensors_parse() (the detail starts with the path),
 * GF_ERR_IO (open, stat, mmap; not a regular file). Blocks on file I/O.
 */
GF_EXPORT int gf_safetensors_open(gf_safetensors **out, const char *path);

/** Free a parsed file (and its mapping when opened by path). NULL is a no-op. */
GF_EXPORT void gf_safetensors_free(gf_safetensors *st);

/** Number of tensors. */
GF_EXPORT size_t gf_safetensors_count(const gf_safetensors *st);

/**
 * Tensor @p i, in data order (sorted by begin, then end), into *out.
 * Errors: GF_ERR_NOT_FOUND when @p i >= gf_safetensors_count().
 */
GF_EXPORT int gf_safetensors_at(const gf_safetensors *st, size_t i, struct gf_safetensors_tensor *out);

/** The file's `__metadata__` as compact JSON (an object of strings), or NULL when it has none. Owned by @p st. */
GF_EXPORT const char *gf_safetensors_metadata(const gf_safetensors *st);

/** Byte offset of the data area in the file (8 + header length). */
GF_EXPORT uint64_t gf_safetensors_data_offset(const gf_safetensors *st);

/** @} */

#ifdef __cplusplus
}
#endif

#endif
