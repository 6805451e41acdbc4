/* SPDX-License-Identifier: Apache-2.0 */
/* install_fault_reporter() / remove_fault_reporter(): names the GMS allocation
 * and metadata key behind a SIGSEGV/SIGBUS (gf_gms_fault_reporter_*). */
#include "common.h"

PyObject *gfpy_install_fault_reporter(PyObject *self, PyObject *arg)
{
	(void)self;
	if (!PyObject_TypeCheck(arg, &gfpy_GMSType))
		return PyErr_Format(PyExc_TypeError, "install_fault_reporter needs a GMSClient, not %.100s",
				    Py_TYPE(arg)->tp_name);
	GMSObject *g = (GMSObject *)arg;
	if (gfpy_gms_ready(g) < 0)
		return NULL;
	int rc = gf_gms_fault_reporter_install(g->gms);
	if (rc < 0)
		return gfpy_raise_gf(rc);
	Py_RETURN_NONE;
}

PyObject *gfpy_remove_fault_reporter(PyObject *self, PyObject *args)
{
	(void)self;
	PyObject *arg = Py_None;
	if (!PyArg_ParseTuple(args, "|O:remove_fault_reporter", &arg))
		return NULL;
	if (arg != Py_None && !PyObject_TypeCheck(arg, &gfpy_GMSType))
		return PyErr_Format(PyExc_TypeError, "remove_fault_reporter needs a GMSClient or None, not %.100s",
				    Py_TYPE(arg)->tp_name);
	gf_gms_fault_reporter_remove(arg == Py_None ? NULL : ((GMSObject *)arg)->gms);
	Py_RETURN_NONE;
}
