/* SPDX-License-Identifier: Apache-2.0 */
/* Tier choice, demotion policy and operation phases (tiers.h): pure functions. */
#include <stdio.h>
#include <string.h>

#include "tiers.h"

const char *tier_name(enum tier t)
{
	switch (t) {
	case TIER_HOT:
		return "hot";
	case TIER_WARM:
		return "warm";
	case TIER_COLD:
		return "cold";
	case TIER_LOADER:
		return "loader";
	}
	return "unknown";
}

enum tier tier_restore_source(const struct tier_view *v)
{
	if (v->hot)
		return TIER_HOT;
	if (v->warm)
		return TIER_WARM;
	if (v->cold)
		return TIER_COLD;
	return TIER_LOADER;
}

void tier_demote(const struct tiers_demote_in *in, struct tiers_demote_out *out)
{
	out->to = in->at;
	if (in->at != TIER_HOT && in->at != TIER_WARM) {
		out->reason = in->at == TIER_COLD ? "cold is the last tier that holds the bytes" : "nothing to demote";
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
	if (in->at == TIER_HOT && in->warm_room) {
		out->to = TIER_WARM;
		out->reason = "pressure after min_resident: hot to warm";
	} else if (in->cold_room) {
		out->to = TIER_COLD;
		out->reason = in->at == TIER_HOT ? "pressure after min_resident, no room in warm: hot to cold"
						     : "pressure after min_resident: warm to cold";
	} else {
		out->reason = "no room in a lower tier";
	}
}

void tiers_demote_plan(const struct tiers_demote_facts *f, struct tiers_demote_plan *out)
{
	*out = (struct tiers_demote_plan){ .step = TIERS_DEMOTE_STAY, .to = TIER_HOT, .err = GF_ERR_STATE };
	if (!f->committed) {
		out->reason = "no committed layout is resident";
		return;
	}
	if ((f->want == TIER_WARM && !f->warm_kept) || (f->want == TIER_COLD && !f->cold_kept)) {
		out->err = GF_ERR_INVALID_ARG;
		out->reason = f->want == TIER_WARM ? "no WARM tier kept (gf-gmsd --warm)" : "no COLD tier kept (gf-gmsd --cold)";
		return;
	}
	if (f->want != TIER_HOT && f->want != TIER_WARM && f->want != TIER_COLD) {
		out->err = GF_ERR_INVALID_ARG;
		out->reason = "a demotion goes to warm or cold";
		return;
	}
	struct tiers_demote_in in = {
		.at = TIER_HOT,
		.pinned = f->pinned,
		.pressure = f->pressure,
		.resident_us = f->resident_us,
		.min_resident_us = f->min_resident_us,
		.warm_room = f->warm_kept && f->warm_room && f->want != TIER_COLD,
		.cold_room = f->cold_kept && f->cold_room && f->want != TIER_WARM,
	};
	struct tiers_demote_out d;
	tier_demote(&in, &d);
	if (d.to == TIER_HOT) {
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
	bool current = d.to == TIER_WARM ? f->warm_current : f->cold_current;
	out->step = current ? TIERS_DEMOTE_DROP : TIERS_DEMOTE_SNAPSHOT;
}

void tier_place(const struct tiers_place_in *in, struct tiers_place_out *out)
{
	*out = (struct tiers_place_out){ .write_cold = in->cold_kept };
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

const char *tiers_phase_name(enum tiers_phase p)
{
	static const char *const names[] = { "None", "Pending", "Checkpointing", "Checkpointed", "Restoring", "Restored", "Failed" };
	return (unsigned)p < sizeof(names) / sizeof(names[0]) ? names[p] : "unknown";
}

const char *tiers_op_name(enum tiers_op_kind k)
{
	return k == TIERS_OP_SNAPSHOT ? "snapshot" : k == TIERS_OP_RESTORE ? "restore" : "unknown";
}

bool tiers_phase_final(enum tiers_phase p)
{
	return p == TIERS_PHASE_NONE || p == TIERS_PHASE_CHECKPOINTED || p == TIERS_PHASE_RESTORED || p == TIERS_PHASE_FAILED;
}

bool tiers_op_begin(struct tiers_op *op, enum tiers_op_kind kind, int64_t now_us)
{
	if ((kind != TIERS_OP_SNAPSHOT && kind != TIERS_OP_RESTORE) || !tiers_phase_final(op->phase))
		return false;
	memset(op, 0, sizeof(*op));
	op->kind = kind;
	op->phase = TIERS_PHASE_PENDING;
	op->started_us = now_us;
	return true;
}

bool tiers_op_step(struct tiers_op *op, enum tiers_phase to, const char *reason, int64_t now_us)
{
	enum tiers_phase working = op->kind == TIERS_OP_SNAPSHOT ? TIERS_PHASE_CHECKPOINTING : TIERS_PHASE_RESTORING;
	enum tiers_phase done = op->kind == TIERS_OP_SNAPSHOT ? TIERS_PHASE_CHECKPOINTED : TIERS_PHASE_RESTORED;
	bool ok = (op->phase == TIERS_PHASE_PENDING && to == working) || (op->phase == working && to == done) ||
		  (!tiers_phase_final(op->phase) && to == TIERS_PHASE_FAILED);
	if (!ok)
		return false;
	op->phase = to;
	snprintf(op->reason, sizeof(op->reason), "%s", reason ? reason : "");
	if (tiers_phase_final(to))
		op->ended_us = now_us;
	return true;
}
