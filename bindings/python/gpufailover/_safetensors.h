/* SPDX-License-Identifier: Apache-2.0 */
#ifndef GF_PY_SAFETENSORS_H
#define GF_PY_SAFETENSORS_H

#include <Python.h>

/* Adds safetensors_header() to @module; -1 with an exception set on failure. */
int gfpy_safetensors_add(PyObject *module);

#endif
