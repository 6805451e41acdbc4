/* SPDX-License-Identifier: Apache-2.0 */
/* Exceptions: the GpuFailoverError hierarchy and library error -> exception. */
#include "common.h"

PyObject *gfpy_GpuFailoverError, *gfpy_LockLostError, *gfpy_GMSLostError, *gfpy_StaleLayoutError, *gfpy_TimeoutError,
	*gfpy_ProtocolError, *gfpy_PermissionError, *gfpy_UnreachableError, *gfpy_NotSupportedError, *gfpy_OutOfMemoryError,
	*gfpy_StateError, *gfpy_NotFoundError, *gfpy_InterruptedError;

static PyObject *error_class(int err)
{
	switch (err) {
	case GF_ERR_LOCK_LOST:
		return gfpy_LockLostError;
	case GF_ERR_GMS_LOST:
		return gfpy_GMSLostError;
	case GF_ERR_STALE_LAYOUT:
		return gfpy_StaleLayoutError;
	case GF_ERR_TIMEOUT:
		return gfpy_TimeoutError;
	case GF_ERR_PROTOCOL:
	case GF_ERR_VERSION:
		return gfpy_ProtocolError;
	case GF_ERR_PERMISSION:
		return gfpy_PermissionError;
	case GF_ERR_UNREACHABLE:
	case GF_ERR_CLOSED:
		return gfpy_UnreachableError;
	case GF_ERR_NOT_SUPPORTED:
		return gfpy_NotSupportedError;
	case GF_ERR_OUT_OF_MEMORY:
		return gfpy_OutOfMemoryError;
	case GF_ERR_STATE:
	case GF_ERR_BUSY:
		return gfpy_StateError;
	case GF_ERR_NOT_FOUND:
		return gfpy_NotFoundError;
	case GF_ERR_INTERRUPTED:
		return gfpy_InterruptedError;
	default:
		return gfpy_GpuFailoverError;
	}
}

/* Raise for a library error; the detail must be read on the thread that failed
 * (it is per-thread), which is this one because calls run on the caller's thread. */
PyObject *gfpy_raise_gf(int err)
{
	return gfpy_raise_gf_detail(err, gf_error_detail());
}

PyObject *gfpy_raise_gf_detail(int err, const char *detail)
{
	if (err == GF_ERR_NOMEM)
		return PyErr_NoMemory();
	if (err == GF_ERR_INVALID_ARG) {
		PyErr_Format(PyExc_ValueError, "%s", detail && *detail ? detail : gf_strerror(err));
		return NULL;
	}
	PyObject *exc_args = Py_BuildValue("(s)", detail && *detail ? detail : gf_strerror(err));
	if (!exc_args)
		return NULL;
	PyObject *cls = error_class(err);
	PyObject *exc = PyObject_Call(cls, exc_args, NULL);
	Py_DECREF(exc_args);
	if (!exc)
		return NULL;
	PyObject *code = PyLong_FromLong(err);
	PyObject *name = PyUnicode_FromString(gf_error_name(err) ? gf_error_name(err) : "GF_ERR_UNKNOWN");
	if (code && name) {
		PyObject_SetAttrString(exc, "code", code);
		PyObject_SetAttrString(exc, "name", name);
	}
	Py_XDECREF(code);
	Py_XDECREF(name);
	PyErr_SetObject(cls, exc);
	Py_DECREF(exc);
	return NULL;
}

static int add_exc(PyObject *m, PyObject **slot, const char *name, PyObject *bases, const char *doc)
{
	char full[128];
	snprintf(full, sizeof(full), "gpufailover.%s", name);
	*slot = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
	if (!*slot)
		return -1;
	Py_INCREF(*slot);
	return PyModule_AddObject(m, name, *slot);
}

/* Create the exception classes and add them to module m. */
int gfpy_errors_add(PyObject *m)
{
	if (add_exc(m, &gfpy_GpuFailoverError, "GpuFailoverError", NULL, "Base of every libgpufailover error.") < 0)
		return -1;
#define SUB(slot, name, extra, doc)                                                            \
	do {                                                                                   \
		PyObject *b = (extra) ? PyTuple_Pack(2, gfpy_GpuFailoverError, (extra))        \
				      : PyTuple_Pack(1, gfpy_GpuFailoverError);                \
		if (!b || add_exc(m, &slot, name, b, doc) < 0) {                               \
			Py_XDECREF(b);                                                         \
			return -1;                                                             \
		}                                                                              \
		Py_DECREF(b);                                                                  \
	} while (0)
	SUB(gfpy_LockLostError, "LockLostError", NULL, "The lock was held and is lost.");
	SUB(gfpy_GMSLostError, "GMSLostError", NULL, "The GPU memory service went away while connected.");
	SUB(gfpy_StaleLayoutError, "StaleLayoutError", NULL, "The GMS holds a different committed layout.");
	SUB(gfpy_TimeoutError, "TimeoutError", PyExc_TimeoutError, "The deadline passed (also a builtin TimeoutError).");
	SUB(gfpy_ProtocolError, "ProtocolError", NULL, "The peer violated the protocol or speaks another version.");
	SUB(gfpy_PermissionError, "PermissionError", PyExc_PermissionError, "Refused (also a builtin PermissionError).");
	SUB(gfpy_UnreachableError, "UnreachableError", PyExc_ConnectionError, "The server could not be reached.");
	SUB(gfpy_NotSupportedError, "NotSupportedError", NULL, "Not available here (backend, device, feature).");
	SUB(gfpy_OutOfMemoryError, "OutOfMemoryError", NULL, "Device (or backend) memory exhausted.");
	SUB(gfpy_StateError, "StateError", NULL, "The call is not valid in the object's current state.");
	SUB(gfpy_NotFoundError, "NotFoundError", PyExc_LookupError, "Unknown id, key or device.");
	SUB(gfpy_InterruptedError, "InterruptedError", NULL, "A blocking call was interrupted.");
#undef SUB
	return 0;
}
