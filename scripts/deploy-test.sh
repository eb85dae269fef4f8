#!/usr/bin/env bash
# make deploy-test: a rolling deploy from the previous release to this build, proven under faults.
#
# Builds the previous release (the commit in scripts/previous-release) in a worktree of its own
# under target/previous/ (a debug build without debug info: only its behaviour is judged), then
# runs one schedule of the explorer twice with it (tests/explore/deploy.rs): a deploy rolled out
# (the previous release migrates and serves, the processor and each instance are replaced by this
# build one by one), and a deploy rolled back once done (every instance back on the previous
# release, which then answers every intent). Each run checks the explorer's invariants, that every
# process of either release starts on the schema the other left, and that no answer is a 5xx but
# the retryable 503.
#
# Settings: DEPLOY_SEED (the schedule, default 16: three instances, each killed or paused on one
# release or the other, the database crashed, the processor killed after its roll).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'deploy-test: %s\n' "$*" >&2; }

commit=$(grep -v '^#' scripts/previous-release | tr -d '[:space:]')
[[ -n $commit ]] || { log "no commit in scripts/previous-release"; exit 2; }
seed=${DEPLOY_SEED:-16}
root=${CARGO_TARGET_DIR:-$PWD/target}/previous
source=$root/source
binary=$root/debug/idempay

if [[ ! -x $binary || $(cat "$root/commit" 2>/dev/null) != "$commit" ]]; then
  log "building the previous release, $commit, into $root (about five minutes)"
  git cat-file -e "$commit^{commit}" 2>/dev/null ||
    { log "$commit is not in this clone's history: fetch it first"; exit 2; }
  git worktree remove --force "$source" 2>/dev/null || rm -rf "$source"
  git worktree prune
  git worktree add --detach --quiet "$source" "$commit"
  # Its own target directory: its crates are other versions of this one's, and its binary must
  # not replace this build's target/debug/idempay.
  (cd "$source" && SQLX_OFFLINE=true CARGO_PROFILE_DEV_DEBUG=0 CARGO_TARGET_DIR=$root \
    cargo build --locked --quiet --bin idempay)
  echo "$commit" >"$root/commit"
fi

status=0
for rollback in 0 1; do
  if ((rollback)); then what="rolled out, then back"; else what="rolled out"; fi
  log "seed $seed: $commit $what"
  EXPLORE_PREVIOUS_BIN=$binary EXPLORE_ROLLBACK=$rollback EXPLORE_SEED=$seed EXPLORE_SCHEDULES=1 \
    cargo test --features failpoints --test explore || status=1
done
exit "$status"
