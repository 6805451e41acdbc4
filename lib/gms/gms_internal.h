/* SPDX-License-Identifier: Apache-2.0 */
/* Internals of the GMS client exposed to tests and benchmarks. */
#ifndef GF_GMS_INTERNAL_H
#define GF_GMS_INTERNAL_H

#include <stdint.h>

#include "gpufailover/gms.h"

/* Request/reply exchanges this client made since it was created (a bulk list counts once). */
uint64_t gf_gms_round_trips(const gf_gms *gms);

#endif
