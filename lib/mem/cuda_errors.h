/* SPDX-License-Identifier: Apache-2.0 */
#ifndef GF_CUDA_ERRORS_H
#define GF_CUDA_ERRORS_H

/* "CUDA_ERROR_..." for a CUresult value, NULL when cuda.h has no such code. */
const char *gf_cuda_error_name(int code);

#endif
