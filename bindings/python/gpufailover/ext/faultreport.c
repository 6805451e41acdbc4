/* SPDX-License-Identifier: Apache-2.0 */
/* install_fault_reporter() / remove_fault_reporter(): names the GMS allocation
 * and metadata key behind a SIGSEGV/SIGBUS (gf_gms_fault_reporter_*). */
#include "common.h"

PyObject *py_install_fault_reporter(PyObject *self, PyObject *arg)
{
	(void)self;
	if (!PyObject_TypeCheck(arg, &GMSType))
		return PyErr_Format(PyExc_TypeError, "install_fault_reporter needs a GMSClient, not %.100s",
				    Py_TYPE(arg)->tp_name);
	GMSObject *g = (GMSObject *)arg;
	if (gms_ready(g) < 0)
		return NULL;
	int rc = gf_gms_fault_reporter_install(g->gms);
	if (rc < 0)
		return raise_gf(rc);
	Py_RETURN_NONE;
}

PyObject *py_remove_fault_reporter(PyObject *self, PyObject *args)
{
	(void)self;
	PyObject *arg = Py_None;
	if (!PyArg_ParseTuple(args, "|O:remove_fault_reporter", &arg))
		return NULL;
	if (arg != Py_None && !PyObject_TypeCheck(arg, &GMSType))
		return PyErr_Format(PyExc_TypeError, "remove_fault_reporter needs a GMSClient or None, not %.100s",
				    Py_TYPE(arg)->tp_name);
	gf_gms_fault_reporter_remove(arg == Py_None ? NULL : ((GMSObject *)arg)->gms);
	Py_RETURN_NONE;
}
