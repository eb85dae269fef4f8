#!/usr/bin/env bash
# Installs Debian's `prometheus` package (the server and promtool) where either is missing, for the
# alert rules' tests (tests/api/ops/). Idempotent: with both on the PATH it does nothing.
#
# The package's maintainer scripts would start a prometheus service on :9090 (and its recommended
# node exporter on :9100); the tests start their own Prometheus on ports they choose, so no service
# is started: a policy-rc.d denies it during the install, and a service that started anyway (under
# systemd, which ignores policy-rc.d) is stopped and disabled.
set -euo pipefail

log() { printf 'install-prometheus: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "installing prometheus needs root (or sudo)"
  SUDO=(sudo)
fi
as_root() { "${SUDO[@]}" "$@"; }
command -v apt-get >/dev/null 2>&1 || die "promtool/prometheus are missing and apt-get is unavailable"

POLICY=/usr/sbin/policy-rc.d
policy_backup=""
restore_policy() {
  if [ -n "$policy_backup" ]; then
    as_root mv -f "$policy_backup" "$POLICY"
  else
    as_root rm -f "$POLICY"
  fi
}
if [ -e "$POLICY" ]; then
  policy_backup=$(mktemp)
  as_root cp -p "$POLICY" "$policy_backup"
fi
trap restore_policy EXIT
# 101: "action forbidden by policy"; invoke-rc.d then starts nothing.
printf '#!/bin/sh\nexit 101\n' | as_root tee "$POLICY" >/dev/null
as_root chmod 755 "$POLICY"

log "installing Debian's prometheus package"
apt=(as_root env DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends)
# Refresh the package lists only when installing from the current ones fails.
if ! "${apt[@]}" install prometheus >/dev/null 2>&1; then
  "${apt[@]}" update >/dev/null
  "${apt[@]}" install prometheus >/dev/null
fi

if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

command -v promtool >/dev/null 2>&1 || die "promtool is still missing after the install"
command -v prometheus >/dev/null 2>&1 || die "prometheus is still missing after the install"
log "$(prometheus --version 2>&1 | head -n 1)"
