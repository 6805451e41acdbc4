/* SPDX-License-Identifier: Apache-2.0 */
/* Mapping: zero-copy views of GMS mappings (buffer protocol and DLPack). */
#include "common.h"

static void Mapping_dealloc(MappingObject *self)
{
	Py_XDECREF(self->owner);
	PyObject_Free(self);
}

static int Mapping_getbuffer(MappingObject *self, Py_buffer *view, int flags)
{
	if (self->device_type != GF_DL_CPU) {
		PyErr_SetString(PyExc_BufferError, "device memory has no host buffer: use __dlpack__ (torch/cupy.from_dlpack)");
		return -1;
	}
	if (!self->owner->gms || gf_gms_granted_mode(self->owner->gms) == 0) {
		PyErr_SetString(PyExc_BufferError, "the mapping is asleep (unmapped)");
		return -1;
	}
	if ((flags & PyBUF_WRITABLE) && self->readonly) {
		PyErr_SetString(PyExc_BufferError, "read-only mapping");
		return -1;
	}
	if (!self->format[0]) {
		PyErr_SetString(PyExc_BufferError, "bfloat16 has no buffer-protocol format: use __dlpack__");
		return -1;
	}
	view->obj = (PyObject *)self;
	Py_INCREF(self);
	view->buf = (void *)(uintptr_t)self->addr;
	view->len = self->size;
	view->readonly = self->readonly;
	view->itemsize = self->itemsize;
	view->format = (flags & PyBUF_FORMAT) ? self->format : NULL;
	view->ndim = self->ndim;
	view->shape = (flags & PyBUF_ND) ? self->pyshape : NULL;
	view->strides = NULL;
	view->suboffsets = NULL;
	view->internal = NULL;
	self->owner->exports++;
	return 0;
}

static void Mapping_releasebuffer(MappingObject *self, Py_buffer *view)
{
	self->owner->exports--;
}

static PyBufferProcs Mapping_as_buffer = {
	.bf_getbuffer = (getbufferproc)Mapping_getbuffer,
	.bf_releasebuffer = (releasebufferproc)Mapping_releasebuffer,
};

/* One allocation holds the managed tensor, its shape and the owner reference. */
struct dl_ctx {
	MappingObject *mapping;
	int64_t shape[GFPY_MAX_DIMS];
};

static void dl_release_ctx(struct dl_ctx *ctx)
{
	PyGILState_STATE st = PyGILState_Ensure();
	ctx->mapping->owner->exports--;
	Py_DECREF(ctx->mapping);
	PyGILState_Release(st);
	PyMem_RawFree(ctx);
}

static void dl_deleter(gf_DLManagedTensor *t)
{
	struct dl_ctx *ctx = t->manager_ctx;
	PyMem_RawFree(t);
	dl_release_ctx(ctx);
}

static void dl_deleter_v(gf_DLManagedTensorVersioned *t)
{
	struct dl_ctx *ctx = t->manager_ctx;
	PyMem_RawFree(t);
	dl_release_ctx(ctx);
}

static void capsule_destructor(PyObject *cap)
{
	/* A capsule never consumed (renamed "used_dltensor") still owns its tensor. */
	if (PyCapsule_IsValid(cap, "dltensor")) {
		gf_DLManagedTensor *t = PyCapsule_GetPointer(cap, "dltensor");
		if (t && t->deleter)
			t->deleter(t);
	} else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		gf_DLManagedTensorVersioned *t = PyCapsule_GetPointer(cap, "dltensor_versioned");
		if (t && t->deleter)
			t->deleter(t);
	}
}

static PyObject *Mapping_dlpack(MappingObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "stream", "max_version", "dl_device", "copy", NULL };
	PyObject *stream = Py_None, *maxv = Py_None, *dldev = Py_None, *copy = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO", kwlist, &stream, &maxv, &dldev, &copy))
		return NULL;
	if (copy == Py_True)
		return PyErr_Format(PyExc_BufferError, "GMS mappings are exported without copying (copy=True refused)");
	if (!self->owner->gms || gf_gms_granted_mode(self->owner->gms) == 0)
		return PyErr_Format(PyExc_BufferError, "the mapping is asleep (unmapped)");
	int versioned = 0;
	if (maxv != Py_None) {
		long major = PyLong_AsLong(PyTuple_Check(maxv) && PyTuple_GET_SIZE(maxv) > 0 ? PyTuple_GET_ITEM(maxv, 0) : maxv);
		if (major == -1 && PyErr_Occurred())
			return NULL;
		versioned = major >= 1;
	}
	if (self->readonly && !versioned)
		return PyErr_Format(PyExc_BufferError,
				    "read-only mapping: the consumer must support DLPack >= 1.0 (max_version) to be told it is read-only");
	struct dl_ctx *ctx = PyMem_RawCalloc(1, sizeof(*ctx));
	if (!ctx)
		return PyErr_NoMemory();
	ctx->mapping = self;
	memcpy(ctx->shape, self->shape, sizeof(ctx->shape));
	gf_DLTensor tensor = {
		.data = (void *)(uintptr_t)self->addr,
		.device = { self->device_type, self->device_id },
		.ndim = self->ndim,
		.dtype = self->dtype,
		.shape = ctx->shape,
		.strides = NULL,
		.byte_offset = 0,
	};
	PyObject *cap;
	if (versioned) {
		gf_DLManagedTensorVersioned *t = PyMem_RawCalloc(1, sizeof(*t));
		if (!t) {
			PyMem_RawFree(ctx);
			return PyErr_NoMemory();
		}
		t->version = (gf_DLPackVersion){ GF_DLPACK_MAJOR, GF_DLPACK_MINOR };
		t->manager_ctx = ctx;
		t->deleter = dl_deleter_v;
		t->flags = self->readonly ? GF_DLPACK_FLAG_READ_ONLY : 0;
		t->dl_tensor = tensor;
		cap = PyCapsule_New(t, "dltensor_versioned", capsule_destructor);
		if (!cap) {
			PyMem_RawFree(t);
			PyMem_RawFree(ctx);
			return NULL;
		}
	} else {
		gf_DLManagedTensor *t = PyMem_RawCalloc(1, sizeof(*t));
		if (!t) {
			PyMem_RawFree(ctx);
			return PyErr_NoMemory();
		}
		t->manager_ctx = ctx;
		t->deleter = dl_deleter;
		t->dl_tensor = tensor;
		cap = PyCapsule_New(t, "dltensor", capsule_destructor);
		if (!cap) {
			PyMem_RawFree(t);
			PyMem_RawFree(ctx);
			return NULL;
		}
	}
	Py_INCREF(self);
	self->owner->exports++;
	return cap;
}

static PyObject *Mapping_dlpack_device(MappingObject *self, PyObject *unused)
{
	return Py_BuildValue("(ii)", self->device_type, self->device_id);
}

static PyObject *Mapping_get_addr(MappingObject *self, void *c)
{
	return PyLong_FromUnsignedLongLong(self->addr);
}

static PyObject *Mapping_get_nbytes(MappingObject *self, void *c)
{
	return PyLong_FromSsize_t(self->size);
}

static PyObject *Mapping_get_readonly(MappingObject *self, void *c)
{
	return PyBool_FromLong(self->readonly);
}

static PyMethodDef Mapping_methods[] = {
	{ "__dlpack__", (PyCFunction)(void (*)(void))Mapping_dlpack, METH_VARARGS | METH_KEYWORDS,
	  "__dlpack__($self, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
	  "DLPack export (zero-copy). Read-only mappings need a consumer speaking DLPack >= 1.0." },
	{ "__dlpack_device__", (PyCFunction)Mapping_dlpack_device, METH_NOARGS, "__dlpack_device__($self, /)\n--\n\n"
	  "(device_type, device_id)" },
	{ NULL },
};

static PyGetSetDef Mapping_getset[] = {
	{ "addr", (getter)Mapping_get_addr, NULL, "address of the first byte", NULL },
	{ "nbytes", (getter)Mapping_get_nbytes, NULL, "size in bytes", NULL },
	{ "readonly", (getter)Mapping_get_readonly, NULL, "True for read-only mappings", NULL },
	{ NULL },
};

PyTypeObject gfpy_MappingType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpufailover._gpufailover.Mapping",
	.tp_basicsize = sizeof(MappingObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A zero-copy view of GMS-mapped memory (made by GMSClient.buffer()).",
	.tp_dealloc = (destructor)Mapping_dealloc,
	.tp_as_buffer = &Mapping_as_buffer,
	.tp_methods = Mapping_methods,
	.tp_getset = Mapping_getset,
};
