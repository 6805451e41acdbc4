/* SPDX-License-Identifier: Apache-2.0 */
/* Tier choice, demotion policy and operation phases (tiers.h): pure functions. */
#include <stdio.h>
#include <string.h>

#include "tiers.h"

const char *gms_tier_name(enum gms_tier t)
{
	switch (t) {
	case GMS_TIER_HOT:
		return "hot";
	case GMS_TIER_WARM:
		return "warm";
	case GMS_TIER_COLD:
		return "cold";
	case GMS_TIER_LOADER:
		return "loader";
	}
	return "unknown";
}

enum gms_tier gms_tier_restore_source(const struct gms_tier_view *v)
{
	if (v->hot)
		return GMS_TIER_HOT;
	if (v->warm)
		return GMS_TIER_WARM;
	if (v->cold)
		return GMS_TIER_COLD;
	return GMS_TIER_LOADER;
}

void gms_tier_demote(const struct gms_demote_in *in, struct gms_demote_out *out)
{
	out->to = in->at;
	if (in->at != GMS_TIER_HOT && in->at != GMS_TIER_WARM) {
		out->reason = in->at == GMS_TIER_COLD ? "cold is the last tier that holds the bytes" : "nothing to demote";
		return;
	}
	if (in->pinned) {
		out->reason = "pinned";
		return;
	}
	if (!in->pressure) {
		out->reason = "no pressure";
		return;
	}
	if (in->resident_us < in->min_resident_us) {
		out->reason = "min_resident not reached";
		return;
	}
	if (in->at == GMS_TIER_HOT && in->warm_room) {
		out->to = GMS_TIER_WARM;
		out->reason = "pressure after min_resident: hot to warm";
	} else if (in->cold_room) {
		out->to = GMS_TIER_COLD;
		out->reason = in->at == GMS_TIER_HOT ? "pressure after min_resident, no room in warm: hot to cold"
						     : "pressure after min_resident: warm to cold";
	} else {
		out->reason = "no room in a lower tier";
	}
}

void gms_demote_plan(const struct gms_demote_facts *f, struct gms_demote_plan *out)
{
	*out = (struct gms_demote_plan){ .step = GMS_DEMOTE_STAY, .to = GMS_TIER_HOT, .err = GF_ERR_STATE };
	if (!f->committed) {
		out->reason = "no committed layout is resident";
		return;
	}
	if ((f->want == GMS_TIER_WARM && !f->warm_kept) || (f->want == GMS_TIER_COLD && !f->cold_kept)) {
		out->err = GF_ERR_INVALID_ARG;
		out->reason = f->want == GMS_TIER_WARM ? "no WARM tier kept (gf-gmsd --warm)" : "no COLD tier kept (gf-gmsd --cold)";
		return;
	}
	if (f->want != GMS_TIER_HOT && f->want != GMS_TIER_WARM && f->want != GMS_TIER_COLD) {
		out->err = GF_ERR_INVALID_ARG;
		out->reason = "a demotion goes to warm or cold";
		return;
	}
	struct gms_demote_in in = {
		.at = GMS_TIER_HOT,
		.pinned = f->pinned,
		.pressure = f->pressure,
		.resident_us = f->resident_us,
		.min_resident_us = f->min_resident_us,
		.warm_room = f->warm_kept && f->warm_room && f->want != GMS_TIER_COLD,
		.cold_room = f->cold_kept && f->cold_room && f->want != GMS_TIER_WARM,
	};
	struct gms_demote_out d;
	gms_tier_demote(&in, &d);
	if (d.to == GMS_TIER_HOT) {
		out->reason = d.reason;
		return;
	}
	if (f->holders) {
		out->err = GF_ERR_BUSY;
		out->reason = "a client holds the RO or RW lock";
		return;
	}
	out->to = d.to;
	out->err = 0;
	out->reason = d.reason;
	bool current = d.to == GMS_TIER_WARM ? f->warm_current : f->cold_current;
	out->step = current ? GMS_DEMOTE_DROP : GMS_DEMOTE_SNAPSHOT;
}

void gms_tier_place(const struct gms_place_in *in, struct gms_place_out *out)
{
	*out = (struct gms_place_out){ .write_cold = in->cold_kept };
	if (!in->warm_kept) {
		out->reason = in->cold_kept ? "no warm tier: cold" : "no tier kept";
	} else if (in->warm_free >= in->bytes) {
		out->write_warm = true;
		out->reason = "warm has room";
	} else if (in->warm_current) {
		out->reason = "warm full, and it already holds this layout";
	} else if (in->warm_other && in->warm_free + in->warm_other_bytes >= in->bytes) {
		out->evict_warm = out->write_warm = true;
		out->reason = "warm full: its older snapshot is evicted to make room";
	} else {
		out->evict_warm = in->warm_other;
		out->reason = in->cold_kept ? "warm full even without its older snapshot: spilled to cold"
					    : "warm full even without its older snapshot and no cold tier: not kept";
	}
}

const char *gms_phase_name(enum gms_phase p)
{
	static const char *const names[] = { "None", "Pending", "Checkpointing", "Checkpointed", "Restoring", "Restored", "Failed" };
	return (unsigned)p < sizeof(names) / sizeof(names[0]) ? names[p] : "unknown";
}

const char *gms_op_name(enum gms_op_kind k)
{
	return k == GMS_OP_SNAPSHOT ? "snapshot" : k == GMS_OP_RESTORE ? "restore" : "unknown";
}

bool gms_phase_final(enum gms_phase p)
{
	return p == GMS_PHASE_NONE || p == GMS_PHASE_CHECKPOINTED || p == GMS_PHASE_RESTORED || p == GMS_PHASE_FAILED;
}

bool gms_op_begin(struct gms_op *op, enum gms_op_kind kind, int64_t now_us)
{
	if ((kind != GMS_OP_SNAPSHOT && kind != GMS_OP_RESTORE) || !gms_phase_final(op->phase))
		return false;
	memset(op, 0, sizeof(*op));
	op->kind = kind;
	op->phase = GMS_PHASE_PENDING;
	op->started_us = now_us;
	return true;
}

bool gms_op_step(struct gms_op *op, enum gms_phase to, const char *reason, int64_t now_us)
{
	enum gms_phase working = op->kind == GMS_OP_SNAPSHOT ? GMS_PHASE_CHECKPOINTING : GMS_PHASE_RESTORING;
	enum gms_phase done = op->kind == GMS_OP_SNAPSHOT ? GMS_PHASE_CHECKPOINTED : GMS_PHASE_RESTORED;
	bool ok = (op->phase == GMS_PHASE_PENDING && to == working) || (op->phase == working && to == done) ||
		  (!gms_phase_final(op->phase) && to == GMS_PHASE_FAILED);
	if (!ok)
		return false;
	op->phase = to;
	snprintf(op->reason, sizeof(op->reason), "%s", reason ? reason : "");
	if (gms_phase_final(to))
		op->ended_us = now_us;
	return true;
}
