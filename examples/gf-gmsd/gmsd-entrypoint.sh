#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Example container entrypoint: one gf-gmsd per device, and the container
# exits as soon as any of them dies (docs/design.md, decision 1) so Kubernetes
# restarts the whole set and engines re-initialise cleanly.
#
# usage: gmsd-entrypoint.sh [DEVICE...]
#   DEVICE: an index or a UUID. Without arguments, $GF_GMS_DEVICES
#   (comma- or space-separated) is used, else $CUDA_VISIBLE_DEVICES, else 0.
# env: GF_GMS_SOCKET_DIR (default /run/gpufailover): sockets are
#      $GF_GMS_SOCKET_DIR/gms-<DEVICE>.sock
#      GF_GMS_BACKEND (auto), GF_GMS_OOM_RETRY (e.g. 10s), GF_GMSD (gf-gmsd binary),
#      GF_GMS_LOCK (the lock server's URI: fence the committed weights, docs/gms.md)
#      Residency tiers (docs/tiers.md), each device in its own subdirectory:
#      GF_GMS_WARM_DIR, GF_GMS_COLD_DIR (--warm/--cold DIR/gms-<DEVICE>),
#      GF_GMS_MIN_RESIDENT (e.g. 10m), GF_GMS_PIN (1: never demote),
#      GF_GMS_DEMOTE_BELOW_FREE (e.g. 8G)
set -u

devices=("$@")
if [ ${#devices[@]} -eq 0 ]; then
	list="${GF_GMS_DEVICES:-${CUDA_VISIBLE_DEVICES:-0}}"
	IFS=', ' read -r -a devices <<<"$list"
fi
dir="${GF_GMS_SOCKET_DIR:-/run/gpufailover}"
gmsd="${GF_GMSD:-gf-gmsd}"
mkdir -p "$dir"

pids=()
stop() {
	kill -TERM "${pids[@]}" 2>/dev/null
	wait
	exit "${1:-0}"
}
trap 'stop 0' TERM INT

i=0
for dev in "${devices[@]}"; do
	[ -n "$dev" ] || continue
	args=(--listen "unix://$dir/gms-$dev.sock" --backend "${GF_GMS_BACKEND:-auto}")
	# Under CUDA_VISIBLE_DEVICES the process sees the listed devices renumbered 0..n-1.
	if [ $# -eq 0 ] && [ -z "${GF_GMS_DEVICES:-}" ] && [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
		args+=(--device "$i")
	else
		args+=(--device "$dev")
	fi
	[ -n "${GF_GMS_OOM_RETRY:-}" ] && args+=(--oom-retry "$GF_GMS_OOM_RETRY")
	[ -n "${GF_GMS_LOCK:-}" ] && args+=(--lock "$GF_GMS_LOCK")
	for tier in warm cold; do
		var="GF_GMS_${tier^^}_DIR"
		if [ -n "${!var:-}" ]; then
			mkdir -p "${!var}/gms-$dev" || stop 2
			args+=("--$tier" "${!var}/gms-$dev")
		fi
	done
	[ -n "${GF_GMS_MIN_RESIDENT:-}" ] && args+=(--min-resident "$GF_GMS_MIN_RESIDENT")
	[ "${GF_GMS_PIN:-0}" = 1 ] && args+=(--pin)
	[ -n "${GF_GMS_DEMOTE_BELOW_FREE:-}" ] && args+=(--demote-below-free "$GF_GMS_DEMOTE_BELOW_FREE")
	"$gmsd" "${args[@]}" &
	pids+=($!)
	i=$((i + 1))
done
[ ${#pids[@]} -gt 0 ] || { echo "gmsd-entrypoint: no devices" >&2; exit 2; }

# Any one dying takes the container down: a partial set of services would
# leave engines with some devices' weights gone.
wait -n
rc=$?
echo "gmsd-entrypoint: a gf-gmsd exited (status $rc); stopping the others" >&2
stop "$([ $rc -eq 0 ] && echo 1 || echo $rc)"
