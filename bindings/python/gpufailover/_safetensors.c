/* SPDX-License-Identifier: Apache-2.0 */
/* gpufailover.safetensors_header(): the library's safetensors reader for
 * Python, so both example engines accept and refuse the same files. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gpufailover.h"
#include "gpufailover/safetensors.h"

#include "_safetensors.h"

static PyObject *entry_tuple(const struct gf_safetensors_tensor *t)
{
	PyObject *shape = PyTuple_New((Py_ssize_t)t->ndim);
	if (!shape)
		return NULL;
	for (unsigned d = 0; d < t->ndim; d++) {
		PyObject *v = PyLong_FromUnsignedLongLong(t->shape[d]);
		if (!v) {
			Py_DECREF(shape);
			return NULL;
		}
		PyTuple_SET_ITEM(shape, d, v);
	}
	return Py_BuildValue("(ssNKK)", t->name, t->dtype, shape, (unsigned long long)t->begin,
			     (unsigned long long)t->end);
}

static PyObject *metadata_dict(const char *json)
{
	if (!json)
		Py_RETURN_NONE;
	PyObject *mod = PyImport_ImportModule("json");
	if (!mod)
		return NULL;
	PyObject *d = PyObject_CallMethod(mod, "loads", "s", json);
	Py_DECREF(mod);
	return d;
}

static PyObject *build_result(const gf_safetensors *st)
{
	size_t n = gf_safetensors_count(st);
	PyObject *list = PyList_New((Py_ssize_t)n);
	if (!list)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		struct gf_safetensors_tensor t;
		PyObject *e = gf_safetensors_at(st, i, &t) == 0 ? entry_tuple(&t) : NULL;
		if (!e) {
			Py_DECREF(list);
			return PyErr_Occurred() ? NULL : PyErr_NoMemory();
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, e);
	}
	PyObject *meta = metadata_dict(gf_safetensors_metadata(st));
	if (!meta) {
		Py_DECREF(list);
		return NULL;
	}
	return Py_BuildValue("(KNN)", (unsigned long long)gf_safetensors_data_offset(st), meta, list);
}

static PyObject *py_safetensors_header(PyObject *self, PyObject *arg)
{
	(void)self;
	Py_buffer view;
	if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
		return NULL;
	gf_safetensors *st;
	int rc = gf_safetensors_parse(&st, view.buf, (size_t)view.len);
	PyObject *out = NULL;
	if (rc == GF_ERR_NOMEM)
		PyErr_NoMemory();
	else if (rc)
		PyErr_Format(PyExc_ValueError, "safetensors: %s", gf_error_detail());
	else
		out = build_result(st);
	gf_safetensors_free(st);
	PyBuffer_Release(&view);
	return out;
}

static PyMethodDef safetensors_methods[] = {
	{ "safetensors_header", py_safetensors_header, METH_O,
	  "safetensors_header(data, /) -> (data_offset, metadata, tensors)\n\n"
	  "Validate a whole safetensors file held in a bytes-like object, as the C engine does.\n"
	  "metadata is the __metadata__ dict (or None); tensors lists (name, dtype, shape,\n"
	  "begin, end) in data order, offsets relative to data_offset. Raises ValueError\n"
	  "naming the problem for a malformed file." },
	{ NULL },
};

int gfpy_safetensors_add(PyObject *module)
{
	return PyModule_AddFunctions(module, safetensors_methods);
}
