/* SPDX-License-Identifier: Apache-2.0 */
/* The example engine's "model": a list of tensors and a deterministic
 * inference over them (a chain of matrix-vector products with tanh). */
#ifndef GF_C_ENGINE_MODEL_H
#define GF_C_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

struct model_tensor {
	char *name;
	char dtype[16];
	unsigned ndim;
	uint64_t shape[GF_SAFETENSORS_MAX_DIMS];
	uint64_t nbytes;
	const void *data; /* borrowed: a file mapping, a generated buffer or GMS memory */
};

struct model {
	size_t n;
	struct model_tensor *t; /* in order: the order the chain is computed in */
};

/* Deterministic example weights: @layers layers of F32 dim x dim matrices
 * and dim biases from a fixed-seed PRNG. *buf (malloc'd) holds the data the
 * tensors point to. */
int model_generate(struct model *m, unsigned layers, unsigned dim, void **buf);
/* The tensors of a parsed safetensors file (data stays in the file). */
int model_from_safetensors(struct model *m, const gf_safetensors *f);
/* Write @m as safetensors. */
int model_write(const struct model *m, const char *path, char *err, size_t errlen);
void model_clear(struct model *m);

/*
 * Inference: x0 is a vector derived from @seed (length: the columns of the
 * first F32 2-D tensor, 8 without one); for every F32 2-D tensor W in order
 * whose column count equals the current length, y = W x, plus the next
 * tensor if it is an F32 1-D bias of matching length, x = tanh(y). Other
 * tensors are carried, not used. *out (malloc'd) gets the final vector.
 */
int model_infer(const struct model *m, uint64_t seed, float **out, size_t *out_len);

#endif
