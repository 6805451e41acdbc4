/* SPDX-License-Identifier: Apache-2.0 */
#include "fence.h"

enum gms_fence gms_fence_next(enum gms_fence s, enum gms_fence_event ev)
{
	switch (ev) {
	case GMS_FENCE_ASK_ADMISSION:
		return s == GMS_FENCE_NONE ? GMS_FENCE_ADMITTING : GMS_FENCE_NONE;
	case GMS_FENCE_ASK_GRANT:
		return s == GMS_FENCE_NONE ? GMS_FENCE_ASKING
		       : s == GMS_FENCE_ADMITTED ? GMS_FENCE_ADMITTED_ASKING
						 : GMS_FENCE_NONE;
	case GMS_FENCE_ASK_COMMIT:
		return s == GMS_FENCE_NONE ? GMS_FENCE_COMMITTING : GMS_FENCE_NONE;
	case GMS_FENCE_YES:
		switch (s) {
		case GMS_FENCE_ADMITTING:
			return GMS_FENCE_ADMITTED;
		case GMS_FENCE_ASKING:
			return GMS_FENCE_PASSED;
		case GMS_FENCE_ADMITTED_ASKING:
			return GMS_FENCE_ADMITTED_PASSED;
		default:
			return GMS_FENCE_NONE; /* a commit's answer ends its wait */
		}
	case GMS_FENCE_NO:
	case GMS_FENCE_RESET:
		return GMS_FENCE_NONE;
	}
	return GMS_FENCE_NONE;
}

bool gms_fence_asking(enum gms_fence s)
{
	return s == GMS_FENCE_ADMITTING || s == GMS_FENCE_ASKING || s == GMS_FENCE_ADMITTED_ASKING ||
	       s == GMS_FENCE_COMMITTING;
}

bool gms_fence_admitted(enum gms_fence s)
{
	return s == GMS_FENCE_ADMITTED || s == GMS_FENCE_ADMITTED_ASKING || s == GMS_FENCE_ADMITTED_PASSED;
}

bool gms_fence_passed(enum gms_fence s)
{
	return s == GMS_FENCE_PASSED || s == GMS_FENCE_ADMITTED_PASSED;
}
