/* SPDX-License-Identifier: Apache-2.0 */
/* The example's safetensors writer (for --write-weights and the tests). The
 * reader is the library's: gpufailover/safetensors.h. */
#ifndef GF_C_ENGINE_SAFETENSORS_H
#define GF_C_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "gpufailover/safetensors.h"

/* One tensor to write: @data holds exactly st_nbytes() bytes. */
struct st_tensor_in {
	const char *name;
	const char *dtype;
	unsigned ndim;
	const uint64_t *shape;
	const void *data;
};

/* Bytes of a tensor: prod(shape) elements of its dtype. */
uint64_t st_nbytes(const struct st_tensor_in *t);
/* Write tensors in the given order, contiguous, header padded with spaces
 * to a multiple of 8 bytes. Returns 0, or -1 with @err. */
int st_write(const char *path, const struct st_tensor_in *ts, size_t n, char *err, size_t errlen);

#endif
