#!/usr/bin/env bash
# make bench-compare REV=<rev>: this working tree against another revision, side by side in one run.
#
# REV is built in a temporary git worktree (release, into a target directory of its own under
# target/, kept for the next run; a binary built once per commit is reused), the working tree as
# `make bench` builds it. One PostgreSQL container serves both, each build in a database of its own
# (a revision with other migrations cannot share one), each with its processor over HTTP. Then,
# round after round, every workload and concurrency is measured on both, one right after the other,
# the order swapped each round (REV first in odd rounds), so both meet the same moments of the
# machine and neither always follows the other. Each round's pair is printed with its ratio, and
# the report gives the median ratio (working tree / REV) of each measurement.
#
#   BENCH_ROUNDS=5               rounds
#   BENCH_SECONDS=10             seconds per measurement (BENCH_QUICK=1: 2)
#   BENCH_WORKLOADS="new replay" workloads (new, replay, mix)
#   BENCH_CONCURRENCY="16 64"    wrk connections
#   BENCH_COMPARE_MODE=http      where each build charges: http (`idempay processor`, a process of
#                                its own) or embedded (inside idempay)
#   BENCH_COMPARE_DIR            where REV's worktree, target directory and binaries live
#                                (target/bench-compare)
#   BENCH_PG_OPTS, BENCH_POOL, BENCH_WAL_PREWARM_MB  as for make bench (lib.sh)
#
# Results: target/bench/compare/compare.md and compare.json, raw runs in target/bench/compare/raw
# (NAME-idempay-tree.json, NAME-idempay-base.json).

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REV=${1:-${REV:-}}
[ -n "$REV" ] || die "usage: make bench-compare REV=<revision> (a commit, tag or branch)"
if [ "${BENCH_QUICK:-0}" = 1 ]; then
  SECONDS_PER_RUN=${BENCH_SECONDS:-2}
  WAL_PREWARM_MB=${BENCH_WAL_PREWARM_MB:-256}
else
  SECONDS_PER_RUN=${BENCH_SECONDS:-10}
  WAL_PREWARM_MB=${BENCH_WAL_PREWARM_MB:-1024}
fi
ROUNDS=${BENCH_ROUNDS:-5}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "BENCH_ROUNDS is a number of rounds, not $ROUNDS"
read -ra CONCURRENCY <<<"${BENCH_CONCURRENCY:-16 64}"
read -ra WORKLOADS <<<"${BENCH_WORKLOADS:-new replay}"
MODE=${BENCH_COMPARE_MODE:-http}
[[ $MODE == http || $MODE == embedded ]] || die "BENCH_COMPARE_MODE is http or embedded, not $MODE"
COMPARE_DIR=${BENCH_COMPARE_DIR:-"$REPO_DIR/target/bench-compare"}
OUT_DIR="$REPO_DIR/target/bench/compare"
API_REPLAY_KEYS=1000

# REV's release binary, built once per commit: COMPARE_DIR/idempay-<commit>. The worktree lives
# only while cargo runs; the target directory stays, so the next revision rebuilds only what
# changed.
build_revision() {
  local sha src
  sha=$(git -C "$REPO_DIR" rev-parse --verify --quiet "$REV^{commit}") ||
    die "$REV names no commit of this repository"
  REV_SHORT=$(git -C "$REPO_DIR" rev-parse --short "$sha")
  REV_BIN="$COMPARE_DIR/idempay-$sha"
  if [ -x "$REV_BIN" ]; then
    log "using $REV_BIN, built before"
    return 0
  fi
  mkdir -p "$COMPARE_DIR"
  src="$COMPARE_DIR/src-$$"
  log "building $REV ($REV_SHORT, release) in a worktree at $src"
  git -C "$REPO_DIR" worktree add --detach --quiet "$src" "$sha"
  BENCH_CLEANUP+=("git -C '$REPO_DIR' worktree remove --force '$src' 2>/dev/null")
  (cd "$src" && CARGO_TARGET_DIR="$COMPARE_DIR/target" cargo build --release --quiet --bin idempay)
  cp "$COMPARE_DIR/target/release/idempay" "$REV_BIN.tmp"
  mv "$REV_BIN.tmp" "$REV_BIN"
  git -C "$REPO_DIR" worktree remove --force "$src"
}

# A database of the server for each side: the working tree's (postgres, from prepare_stack) and
# REV's (base), each migrated by its own build, with its own bench account. Sets, per side, the
# URL, the API key and the replay keys' file.
declare -A SIDE_URL=() SIDE_API_KEY=() SIDE_KEYS=()
prepare_side_databases() {
  SIDE_URL[tree]=$DATABASE_URL
  SIDE_API_KEY[tree]=$API_KEY
  sql -c "CREATE DATABASE base" >/dev/null
  SIDE_URL[base]="postgres://postgres:postgres@127.0.0.1:$PG_PORT/base"
  local tree_bin=$IDEMPAY
  DATABASE_URL=${SIDE_URL[base]} PGDATABASE=base IDEMPAY=$REV_BIN prepare_database
  SIDE_API_KEY[base]=$API_KEY
  IDEMPAY=$tree_bin
  DATABASE_URL=${SIDE_URL[tree]}
  API_KEY=${SIDE_API_KEY[tree]}
}

# use_side tree|base: the server, database and account run_wrk measures from now on.
use_side() {
  case "$1" in
    tree) use_server "$MODE" ;;
    base) use_server "base-$MODE" ;;
  esac
  API_KEY=${SIDE_API_KEY[$1]}
  REPLAY_KEYS_FILE=${SIDE_KEYS[$1]:-}
}

main() {
  check_tools
  rm -rf "$OUT_DIR/raw"
  mkdir -p "$OUT_DIR/raw"
  local started tree_label
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  tree_label=$(revision_label)
  build_revision
  prepare_stack
  export BENCH_BASELINE_BIN=$REV_BIN
  measure_select1
  measure_fsync
  prepare_side_databases
  local side
  for side in tree base; do
    DATABASE_URL=${SIDE_URL[$side]}
    case "$side" in
      tree) start_server 1000h "$MODE" ;;
      base) start_server 1000h "base-$MODE" ;;
    esac
  done
  DATABASE_URL=${SIDE_URL[tree]}
  for side in tree base; do
    use_side "$side"
    SIDE_KEYS[$side]="$OUT_DIR/raw/replay-keys-$side.txt"
    seed_replay_keys "$API_REPLAY_KEYS" "${SIDE_KEYS[$side]}"
  done
  log "making ${WAL_PREWARM_MB} MB of WAL segments ahead (reused by every measurement)"
  BENCH_WAL_PREWARM_MB=$WAL_PREWARM_MB prewarm_wal

  # Every replay key answered once before the first measurement, on both sides: a replay is
  # answered from memory after an instance's first, and neither side should pay its first ones
  # inside a measurement.
  log "warming up"
  for side in tree base; do
    use_side "$side"
    run_wrk "warmup-idempay-$side-replay" replay 16 2
    run_wrk "warmup-idempay-$side-new" new 16 2
  done

  local round workload conns order name
  for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order=(base tree); else order=(tree base); fi
    for workload in "${WORKLOADS[@]}"; do
      for conns in "${CONCURRENCY[@]}"; do
        log "round $round of $ROUNDS: $workload keys, c=$conns, ${SECONDS_PER_RUN}s each, ${order[0]} first"
        name="$workload-c$conns-r$round"
        for side in "${order[@]}"; do
          settle
          use_side "$side"
          run_wrk "$name-idempay-$side" "$workload" "$conns" "$SECONDS_PER_RUN"
        done
        python3 - "$OUT_DIR/raw/$name-idempay-tree.json" "$OUT_DIR/raw/$name-idempay-base.json" "$REV_SHORT" <<'PY' >&2
import json, sys
t, b = (json.load(open(p)) for p in sys.argv[1:3])
errors = lambda r: r.get("non_2xx", 0) + sum(r.get("socket_errors", {}).values())
print(f"    {sys.argv[3]} {b['rps']:8.0f} req/s p99 {b['p99_ms']:7.2f} ms | working tree {t['rps']:8.0f} req/s "
      f"p99 {t['p99_ms']:7.2f} ms | ratio {t['rps'] / b['rps']:.2f}x, p99 {t['p99_ms'] / b['p99_ms']:.2f}x"
      f" | errors {errors(t)} / {errors(b)}")
PY
      done
    done
  done

  local stuck=0 db
  for db in postgres base; do
    stuck=$((stuck + $(PGDATABASE=$db sql -c "SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'")))
  done
  python3 - "$OUT_DIR/raw/meta.json" <<PY
import json, os, sys
json.dump({
    "started": "$started",
    "tree": "$tree_label",
    "rev": "$REV",
    "rev_commit": "$REV_SHORT",
    "rev_bin": "$REV_BIN",
    "tree_bin": "$IDEMPAY",
    "mode": "$MODE",
    "cores": os.cpu_count(),
    "seconds": $SECONDS_PER_RUN,
    "rounds": $ROUNDS,
    "workloads": "${WORKLOADS[*]}".split(),
    "concurrency": [int(c) for c in "${CONCURRENCY[*]}".split()],
    "pool_size": $POOL_SIZE,
    "pg_opts": "$BENCH_PG_OPTS",
    "pg_transport": "$PG_TRANSPORT",
    "select1_tps": float("$SELECT1_TPS"),
    "fdatasync_per_s": float("${FDATASYNC_PER_S:-nan}"),
    "synchronous_commit": "$(sql -c 'SHOW synchronous_commit')",
    "fsync": "$(sql -c 'SHOW fsync')",
    "loadavg_before": float("$LOADAVG_START"),
    "keys_left_in_progress": $stuck,
}, open(sys.argv[1], "w"), indent=1)
PY
  echo
  python3 "$BENCH_DIR/report.py" compare --dir "$OUT_DIR"
  log "written: $OUT_DIR/compare.json, $OUT_DIR/compare.md"
  python3 "$BENCH_DIR/report.py" check --dir "$OUT_DIR" ||
    die "a build answered with errors (listed above): the run failed"
}

main "$@"
