/* SPDX-License-Identifier: Apache-2.0 */
/* Memory: one memory backend bound to one device. */
#include "common.h"

int gfpy_backend_arg(PyObject *obj, int *kind)
{
	if (!obj || obj == Py_None) {
		*kind = GF_MEM_AUTO;
		return 0;
	}
	if (!PyUnicode_Check(obj)) {
		PyErr_Format(PyExc_TypeError, "backend must be 'auto', 'cuda' or 'host', not %.100s",
			     Py_TYPE(obj)->tp_name);
		return -1;
	}
	const char *s = PyUnicode_AsUTF8(obj);
	if (!s)
		return -1;
	if (!strcmp(s, "auto"))
		*kind = GF_MEM_AUTO;
	else if (!strcmp(s, "cuda"))
		*kind = GF_MEM_CUDA;
	else if (!strcmp(s, "host"))
		*kind = GF_MEM_HOST;
	else {
		PyErr_Format(PyExc_ValueError, "backend must be 'auto', 'cuda' or 'host', not '%s'", s);
		return -1;
	}
	return 0;
}

static int Memory_init(MemoryObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "backend", "device", NULL };
	PyObject *bobj = NULL;
	int device = 0, kind;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|Oi", kwlist, &bobj, &device))
		return -1;
	if (gfpy_backend_arg(bobj, &kind) < 0)
		return -1;
	if (device < 0) {
		PyErr_SetString(PyExc_ValueError, "device must be >= 0");
		return -1;
	}
	if (self->mem) {
		PyErr_SetString(PyExc_RuntimeError, "Memory is already initialized");
		return -1;
	}
	gf_mem *m = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = gf_mem_open(&m, kind, device);
	Py_END_ALLOW_THREADS
	if (rc < 0) {
		gfpy_raise_gf(rc);
		return -1;
	}
	self->mem = m;
	return 0;
}

static void Memory_dealloc(MemoryObject *self)
{
	gf_mem_free(self->mem);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

int gfpy_memory_ready(MemoryObject *self)
{
	if (!self->mem) {
		PyErr_SetString(PyExc_ValueError, "Memory is not initialized");
		return -1;
	}
	return 0;
}

static PyObject *Memory_get_backend(MemoryObject *self, void *c)
{
	if (gfpy_memory_ready(self) < 0)
		return NULL;
	return PyUnicode_FromString(gf_mem_kind_name(gf_mem_kind(self->mem)));
}

static PyObject *Memory_get_device(MemoryObject *self, void *c)
{
	if (gfpy_memory_ready(self) < 0)
		return NULL;
	return PyLong_FromLong(gf_mem_device(self->mem));
}

static PyObject *Memory_get_uuid(MemoryObject *self, void *c)
{
	char buf[64];
	if (gfpy_memory_ready(self) < 0)
		return NULL;
	int rc = gf_mem_device_uuid(self->mem, buf, sizeof(buf));
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return PyUnicode_FromString(buf);
}

static PyObject *Memory_get_granularity(MemoryObject *self, void *c)
{
	size_t mn, rec;
	if (gfpy_memory_ready(self) < 0)
		return NULL;
	int rc = gf_mem_granularity(self->mem, &mn, &rec);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return Py_BuildValue("(nn)", (Py_ssize_t)mn, (Py_ssize_t)rec);
}

static PyObject *Memory_info(MemoryObject *self, PyObject *unused)
{
	uint64_t fr, tot;
	if (gfpy_memory_ready(self) < 0)
		return NULL;
	int rc = gf_mem_info(self->mem, &fr, &tot);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	return Py_BuildValue("(KK)", (unsigned long long)fr, (unsigned long long)tot);
}

static PyGetSetDef Memory_getset[] = {
	{ "backend", (getter)Memory_get_backend, NULL, "'cuda' or 'host'", NULL },
	{ "device", (getter)Memory_get_device, NULL, "device index", NULL },
	{ "uuid", (getter)Memory_get_uuid, NULL, "device UUID", NULL },
	{ "granularity", (getter)Memory_get_granularity, NULL, "(minimum, recommended) allocation granularity", NULL },
	{ NULL },
};

static PyMethodDef Memory_methods[] = {
	{ "info", (PyCFunction)Memory_info, METH_NOARGS, "info($self, /)\n--\n\n"
	  "info() -> (free_bytes, total_bytes)" },
	{ NULL },
};

PyTypeObject gfpy_MemoryType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.Memory",
	.tp_basicsize = sizeof(MemoryObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Memory(backend='auto', device=0)\n--\n\n"
	  "A memory backend bound to one device: 'cuda' (CUDA VMM via the\n"
		  "driver, loaded at run time) or 'host' (memfd). 'auto' picks cuda when usable.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Memory_init,
	.tp_dealloc = (destructor)Memory_dealloc,
	.tp_getset = Memory_getset,
	.tp_methods = Memory_methods,
};
