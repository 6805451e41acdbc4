/* SPDX-License-Identifier: Apache-2.0 */
/* The test driver's copy engine (fakecuda_copy.c), looked up by fakecuda.c's cuGetProcAddress. */
#ifndef FAKECUDA_COPY_H
#define FAKECUDA_COPY_H

/* The copy, stream and event entry point named @symbol, or NULL. */
void *fakecuda_copy_proc(const char *symbol);

#endif
