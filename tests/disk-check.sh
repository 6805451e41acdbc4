# shellcheck shell=bash
# Sourced by the setup scripts that install gigabytes: warns, before pip
# starts, when the file system that will hold DIR has less free than an
# install needs at its peak, so a full disk is named up front rather than as
# pip's "No space left on device" minutes later. A warning, not a refusal:
# the figures are this project's measurements, not limits.
# Usage: disk_check WHO DIR NEED_GB WHAT
disk_check() {
  local who="$1" dir="$2" need_gb="$3" what="$4" d="$2" free_kb
  while [ ! -e "$d" ]; do d="$(dirname "$d")"; done
  free_kb="$(df -Pk "$d" | awk 'NR == 2 { print $4 }')"
  if [ -n "$free_kb" ] && [ "$free_kb" -lt $((need_gb * 1024 * 1024)) ]; then
    echo "$who: warning: $((free_kb / 1024)) MiB free where $dir is; $what needs about $need_gb GB at its peak, so pip may run out of space" >&2
  fi
}
