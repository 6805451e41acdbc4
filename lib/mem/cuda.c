/* SPDX-License-Identifier: Apache-2.0 */
/* The cuda backend; the driver binding follows in the next commit. */
#include "backend.h"

static int cuda_device_count(int *out)
{
	(void)out;
	return gf_err(GF_ERR_NOT_SUPPORTED, "cuda backend: not implemented yet");
}

static int cuda_open(gf_mem *m, int device)
{
	(void)m;
	(void)device;
	return gf_err(GF_ERR_NOT_SUPPORTED, "cuda backend: not implemented yet");
}

const struct gf_mem_backend gf_mem_cuda_backend = {
	.name = "cuda",
	.kind = GF_MEM_CUDA,
	.device_count = cuda_device_count,
	.uuid_prefix = "GPU-",
	.open = cuda_open,
};
