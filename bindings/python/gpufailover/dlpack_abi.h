/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The DLPack ABI (https://dmlc.github.io/dlpack), versions 0.x (unversioned
 * DLManagedTensor, capsule "dltensor") and 1.x (DLManagedTensorVersioned,
 * capsule "dltensor_versioned", which has the read-only flag we need for RO
 * weight mappings). Debian's libdlpack-dev is 0.6 and lacks the 1.x structs,
 * so the layouts the standard fixes are spelled out here.
 */
#ifndef GF_DLPACK_ABI_H
#define GF_DLPACK_ABI_H

#include <stdint.h>

#define GF_DLPACK_MAJOR 1
#define GF_DLPACK_MINOR 0
#define GF_DLPACK_FLAG_READ_ONLY (1ULL << 0)

enum { GF_DL_CPU = 1, GF_DL_CUDA = 2 };
enum { GF_DL_INT = 0, GF_DL_UINT = 1, GF_DL_FLOAT = 2, GF_DL_BFLOAT = 4 };

typedef struct {
	int32_t device_type;
	int32_t device_id;
} gf_DLDevice;

typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} gf_DLDataType;

typedef struct {
	void *data;
	gf_DLDevice device;
	int32_t ndim;
	gf_DLDataType dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} gf_DLTensor;

typedef struct gf_DLManagedTensor {
	gf_DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct gf_DLManagedTensor *self);
} gf_DLManagedTensor;

typedef struct {
	uint32_t major;
	uint32_t minor;
} gf_DLPackVersion;

typedef struct gf_DLManagedTensorVersioned {
	gf_DLPackVersion version;
	void *manager_ctx;
	void (*deleter)(struct gf_DLManagedTensorVersioned *self);
	uint64_t flags;
	gf_DLTensor dl_tensor;
} gf_DLManagedTensorVersioned;

#endif
