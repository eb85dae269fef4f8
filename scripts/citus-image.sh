#!/usr/bin/env bash
# Make sure a Citus (distributed PostgreSQL 15) image is available locally and print its reference
# as the last line of stdout. Progress goes to stderr.
#
# Order of preference:
#   1. $IDEMPAY_CITUS_IMAGE, if set and present locally (or pullable).
#   2. citusdata/citus:$CITUS_VERSION-pg15, present locally or pulled.
#   3. idempay-citus:$CITUS_VERSION, present locally, or built from Citus's source release
#      ($CITUS_SOURCE, by default ../shared/vendor/citus-$CITUS_VERSION.tar.gz) on the project's
#      PostgreSQL 15 image (scripts/pg-image.sh). About four minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly CITUS_VERSION=${CITUS_VERSION:-13.2.2}
readonly UPSTREAM_IMAGE=citusdata/citus:$CITUS_VERSION-pg15
readonly BUILT_IMAGE=idempay-citus:$CITUS_VERSION
readonly CITUS_SOURCE=${CITUS_SOURCE:-../shared/vendor/citus-$CITUS_VERSION.tar.gz}

log() { printf 'citus-image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
use_image() { log "using $1"; printf '%s\n' "$1"; exit 0; }

if [ -n "${IDEMPAY_CITUS_IMAGE:-}" ]; then
  have_image "$IDEMPAY_CITUS_IMAGE" && use_image "$IDEMPAY_CITUS_IMAGE"
  timeout 60 docker pull "$IDEMPAY_CITUS_IMAGE" >&2 ||
    die "IDEMPAY_CITUS_IMAGE=$IDEMPAY_CITUS_IMAGE is not present locally and could not be pulled"
  use_image "$IDEMPAY_CITUS_IMAGE"
fi
have_image "$UPSTREAM_IMAGE" && use_image "$UPSTREAM_IMAGE"
have_image "$BUILT_IMAGE" && use_image "$BUILT_IMAGE"

# Serialise builds across concurrent invocations; whoever waited finds the image made.
exec 9>>/tmp/idempay-citus-image.lock
flock -w 1800 9 || die "timed out waiting for /tmp/idempay-citus-image.lock"
have_image "$BUILT_IMAGE" && use_image "$BUILT_IMAGE"

log "pulling $UPSTREAM_IMAGE"
if timeout 30 docker pull "$UPSTREAM_IMAGE" >/dev/null 2>&1; then
  use_image "$UPSTREAM_IMAGE"
fi

[ -r "$CITUS_SOURCE" ] || die "cannot pull $UPSTREAM_IMAGE and no source release at $CITUS_SOURCE (set CITUS_SOURCE)"
base=$(bash scripts/pg-image.sh | tail -n 1)
context=$(mktemp -d /tmp/idempay-citus-build.XXXXXX)
trap 'rm -rf "$context"' EXIT
cp scripts/citus/Dockerfile "$CITUS_SOURCE" "$context/"

log "building $BUILT_IMAGE from $CITUS_SOURCE on $base (about four minutes)"
# Host networking: the build's apt reaches the machine's Debian mirror the way the host does.
if ! docker build --network host --build-arg BASE="$base" --build-arg CITUS_VERSION="$CITUS_VERSION" \
    -t "$BUILT_IMAGE" "$context" >"$context/build.log" 2>&1; then
  tail -n 30 "$context/build.log" >&2
  die "the build failed; the end of its log is shown above"
fi
version=$(docker run --rm --entrypoint bash "$BUILT_IMAGE" -c \
  'ls /usr/lib/postgresql/15/lib/citus.so >/dev/null && grep -h default_version /usr/share/postgresql/15/extension/citus.control') ||
  die "the built image has no Citus"
log "built $BUILT_IMAGE: citus $version"
use_image "$BUILT_IMAGE"
