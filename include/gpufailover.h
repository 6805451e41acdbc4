/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gpufailover.h
 * @brief libgpufailover umbrella header: includes the base (version, error
 * model, logging hook; gpufailover/base.h) and every component header.
 */
#ifndef GPUFAILOVER_H
#define GPUFAILOVER_H

#include "gpufailover/base.h"
#include "gpufailover/mem.h"
#include "gpufailover/lock.h"
#include "gpufailover/gms.h"
#include "gpufailover/engine.h"
#include "gpufailover/supervise.h"

#endif
