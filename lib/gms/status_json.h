/* SPDX-License-Identifier: Apache-2.0 */
#ifndef GF_GMS_STATUS_JSON_H
#define GF_GMS_STATUS_JSON_H

#include "gpufailover.pb.h"

/* The status as the JSON object gf_gms_status_json() documents; *json is
 * malloc'd. Shared by that call and the server's own gf_gmsd_status_json(). */
int gf_gms_status_to_json(const gf_GmsStatus *s, char **json);

#endif
