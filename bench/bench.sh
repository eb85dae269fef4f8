#!/usr/bin/env bash
# make bench: idempay over HTTP against two limits, PostgreSQL running a payment's SQL through
# pgbench: "limit", idempay's own schema and statements done the straightforward way, and "seed",
# the seed's design (one key table and the effect's, four statements a hop; pgbench/seed_*.sql).
#
# One PostgreSQL container, started here and removed at exit. For each workload (new keys, replays,
# a 50/50 mix) and concurrency (1, 16, 64): pgbench with each limit's SQL, then wrk against
# idempay. Then the rows and WAL each side writes per payment, the server's memory under load, and
# latency as the key table grows. bench.md has the table, the ratios to both limits and where each
# side's CPU goes; bench.svg draws req/s and p99 against concurrency.
#
#   BENCH_SECONDS=10        seconds per measurement
#   BENCH_SIZE_SECONDS=5    seconds per measurement of the table-size sweep
#   BENCH_MAX_ROWS=5000000  largest key table of the sweep (sizes: 10k, 100k, 1M, 5M)
#   BENCH_QUICK=1           2 s per measurement, at most 100k rows, 256 MB of WAL made ahead: to try it
#   BENCH_WAL_PREWARM_MB=1024  WAL segments made before the first measurement (lib.sh prewarm_wal)
#   BENCH_POOL=N            idempay's pool size (default: the service's own default)
#   BENCH_COMMITS="on off"  synchronous_commit of each round of the table: on (durable commits,
#                           as production runs; the table-size sweep too), then off beside it
#   BENCH_ROUNDS=1          rounds of each measurement of the table: the limit and every mode,
#                           again, one round after the other; the report shows each round and the
#                           median ratio (a stall lands on one side of one round, not on the result)
#   BENCH_CONCURRENCY, BENCH_WORKLOADS, BENCH_PG_OPTS  narrow the matrix, change the server
#   BENCH_PROCESSOR="http embedded"  where idempay's charges are made, each mode measured after
#                           the same limit: `idempay processor` over HTTP, or embedded in idempay
#   BENCH_BASELINE_BIN=PATH another build (e.g. of the commit before a change) measured side by
#                           side, in modes base-http and base-embedded, after the same limit
#   BENCH_IDEMPAY_BIN, BENCH_LABEL  run a binary built elsewhere (another revision), named so
#   BENCH_LIMITS="limit seed"  the limits measured before idempay in each round (the first one is
#                           the table-size sweep's)
#   BENCH_WRITES=1          after the durable table, new keys at c=16 once more on every side
#                           (BENCH_WRITES_SECONDS, 5 s each, 2 with BENCH_QUICK), between two
#                           snapshots of the tables' counters: rows, index entries and WAL written
#                           per payment (0 skips it)
#
# Results: target/bench/bench.json, bench.md (the printed tables) and bench.svg, raw runs in
# target/bench/raw.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ "${BENCH_QUICK:-0}" = 1 ]; then
  SECONDS_PER_RUN=${BENCH_SECONDS:-2}
  SIZE_SECONDS=${BENCH_SIZE_SECONDS:-2}
  MAX_ROWS=${BENCH_MAX_ROWS:-100000}
  WAL_PREWARM_MB=${BENCH_WAL_PREWARM_MB:-256}
else
  SECONDS_PER_RUN=${BENCH_SECONDS:-10}
  SIZE_SECONDS=${BENCH_SIZE_SECONDS:-5}
  MAX_ROWS=${BENCH_MAX_ROWS:-5000000}
  WAL_PREWARM_MB=${BENCH_WAL_PREWARM_MB:-1024}
fi
ROUNDS=${BENCH_ROUNDS:-1}
read -ra LIMITS <<<"${BENCH_LIMITS:-limit seed}"
[ "${#LIMITS[@]}" -gt 0 ] || die "BENCH_LIMITS names at least one of limit and seed"
for limit in "${LIMITS[@]}"; do
  [[ $limit == limit || $limit == seed ]] || die "BENCH_LIMITS lists limit and seed, not $limit"
done
WRITES=${BENCH_WRITES:-1}
WRITES_SECONDS=${BENCH_WRITES_SECONDS:-$([ "${BENCH_QUICK:-0}" = 1 ] && echo 2 || echo 5)}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "BENCH_ROUNDS is a number of rounds, not $ROUNDS"
read -ra CONCURRENCY <<<"${BENCH_CONCURRENCY:-1 16 64}"
read -ra WORKLOADS <<<"${BENCH_WORKLOADS:-new replay mix}"
# synchronous_commit for each round of the table: on (durable, the headline), then off.
read -ra COMMITS <<<"${BENCH_COMMITS:-on off}"
for commits in "${COMMITS[@]}"; do
  [[ $commits == on || $commits == off ]] || die "BENCH_COMMITS lists on and off, not $commits"
done
# The raw runs of the durable round keep the names they always had.
commit_prefix() { case "$1" in on) echo main ;; *) echo "async" ;; esac; }
if [ -n "${BENCH_BASELINE_BIN:-}" ]; then
  read -ra MODES <<<"${BENCH_PROCESSOR:-base-http http base-embedded embedded}"
else
  read -ra MODES <<<"${BENCH_PROCESSOR:-http embedded}"
fi
SIZES=()
for rows in 10000 100000 1000000 5000000; do
  [ "$rows" -le "$MAX_ROWS" ] && SIZES+=("$rows")
done
# Keys the limit replays (seeded with SQL) and keys idempay replays (created through the API).
PGBENCH_REPLAY_KEYS=10000
API_REPLAY_KEYS=1000

pgbench_scripts() { # LIMIT WORKLOAD
  local prefix=""
  [ "$1" = limit ] || prefix="$1_"
  case "$2" in
    new) echo "${prefix}new_key.sql" ;;
    replay) echo "${prefix}replay.sql" ;;
    mix) echo "${prefix}new_key.sql@1 ${prefix}replay.sql@1" ;;
  esac
}

has_limit() { # LIMIT: whether this run measures it
  local limit
  for limit in "${LIMITS[@]}"; do [ "$limit" = "$1" ] && return 0; done
  return 1
}

# The limit's replay keys: completed keys '1' … 'N' in the bench account's scope.
seed_pgbench_replay_keys() {
  sql -v scope="$SCOPE" -v n="$PGBENCH_REPLAY_KEYS" -v hash="\\x$REQUEST_HASH_HEX" \
    -v headers="$RESPONSE_HEADERS" -v body="$RESPONSE_BODY" <<'SQL'
INSERT INTO idempotency_keys
    (account_id, scope, idem_key, request_hash, status, response_code, response_headers, response_body,
     expires_at)
SELECT split_part(:'scope', ':', 1), :'scope', i::text, :'hash'::bytea, 'completed', 201, :'headers'::jsonb,
       convert_to(:'body', 'UTF8'), now() + interval '24 hours'
FROM generate_series(1, :n) AS i;
SQL
}

# The seed limit's tables (pgbench/seed_schema.sql) and its replay keys: '1' … 'N' in the same scope
# as the limit's, completed with the same response.
prepare_seed_limit() {
  sql -f "$BENCH_DIR/pgbench/seed_schema.sql" >/dev/null
  sql -v scope="$SCOPE" -v n="$PGBENCH_REPLAY_KEYS" -v hash="\\x$REQUEST_HASH_HEX" \
    -v body="$RESPONSE_BODY" <<'SQL'
INSERT INTO seed.idempotency_keys
    (scope, idem_key, request_hash, status, response_code, response_body, expires_at)
SELECT :'scope', i::text, :'hash'::bytea, 'completed', 201, convert_to(:'body', 'UTF8'),
       now() + interval '24 hours'
FROM generate_series(1, :n) AS i;
SQL
  SEED_TABLES=true
}

# Replay keys for both sides, in an empty or freshly truncated table.
seed_replay_sets() {
  seed_pgbench_replay_keys
  seed_replay_keys "$API_REPLAY_KEYS" "$OUT_DIR/replay-keys.txt"
}

# The file name of one idempay measurement: the processor over HTTP keeps the name it always had.
idempay_run() { # NAME MODE
  case "$2" in http) echo "$1-idempay" ;; *) echo "$1-idempay-$2" ;; esac
}

# Each limit, then idempay in each processor mode, one after the other. The raw runs are
# NAME-limit, NAME-seed and NAME-idempay[-MODE].
measure_pair() { # NAME WORKLOAD CONNECTIONS SECONDS
  local name=$1 workload=$2 conns=$3 secs=$4 mode limit
  for limit in "${LIMITS[@]}"; do
    settle
    # shellcheck disable=SC2046  # one word per script
    run_pgbench "$name-$limit" "$conns" "$secs" $(pgbench_scripts "$limit" "$workload")
  done
  for mode in "${MODES[@]}"; do
    settle
    use_server "$mode"
    run_wrk "$(idempay_run "$name" "$mode")" "$workload" "$conns" "$secs"
    python3 - "$OUT_DIR/raw/$(idempay_run "$name" "$mode").json" "$mode" \
      "${LIMITS[@]/#/$OUT_DIR/raw/$name-}" <<'PY' >&2
import json, sys
i, mode = json.load(open(sys.argv[1])), sys.argv[2]
limits = [(p.rsplit("-", 1)[1], json.load(open(p + ".json"))) for p in sys.argv[3:]]
errors = i.get("non_2xx", 0) + sum(i.get("socket_errors", {}).values())
print("    " + " | ".join(f"{n} {l['rps']:7.0f} req/s p99 {l['p99_ms']:7.2f} ms" for n, l in limits)
      + f" | idempay ({mode:>8}) {i['rps']:7.0f} req/s p50 {i['p50_ms']:6.2f} p99 {i['p99_ms']:7.2f} ms ("
      + ", ".join(f"{i['rps'] / l['rps']:.2f}x {n}" for n, l in limits)
      + f") | errors {errors}{' (' + i['first_error'][:120] + ')' if errors else ''}")
PY
  done
}

# What one payment writes, on every side: new keys at c=16 once more, each side alone between two
# snapshots of the tables' counters (table_writes in lib.sh), after the durable table.
measure_writes() {
  local limit mode name
  log "rows written per payment: new keys, c=16, ${WRITES_SECONDS}s on each side"
  for limit in "${LIMITS[@]}"; do
    settle
    WRITES_FILE="$OUT_DIR/raw/writes-$limit.writes.json" \
      run_pgbench "writes-$limit" 16 "$WRITES_SECONDS" "$(pgbench_scripts "$limit" new)"
  done
  for mode in "${MODES[@]}"; do
    settle
    use_server "$mode"
    name=$(idempay_run writes "$mode")
    WRITES_FILE="$OUT_DIR/raw/$name.writes.json" run_wrk "$name" new 16 "$WRITES_SECONDS"
  done
}

main() {
  check_tools
  mkdir -p "$OUT_DIR"
  rm -rf "$OUT_DIR/raw"
  mkdir -p "$OUT_DIR/raw"
  local started commit
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  commit=$(revision_label)

  prepare_stack
  ! has_limit seed || prepare_seed_limit
  $POOL_CONFIGURABLE ||
    log "this build has no IDEMPAY_DATABASE_MAX_CONNECTIONS: the pool is its fixed 16 connections"
  measure_select1
  measure_fsync
  local mode idle_rss
  "$IDEMPAY" processor --help >/dev/null 2>&1 || MODES=(http) # an older binary charges in-process
  MEASURED_MODES=("${MODES[@]}") # the sweep below narrows MODES; the report names them all
  MEASURED_LIMITS=("${LIMITS[@]}") # and LIMITS
  # This build's first mode: its server's memory is sampled, and the table-size sweep uses it.
  local own_mode=${MODES[0]}
  for mode in "${MODES[@]}"; do [[ $mode == base-* ]] || { own_mode=$mode; break; }; done
  for mode in "${MODES[@]}"; do start_server 1000h "$mode"; done
  use_server "$own_mode"
  idle_rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$SERVER_PID/status")
  seed_replay_sets
  log "making ${WAL_PREWARM_MB} MB of WAL segments ahead (reused by every measurement)"
  BENCH_WAL_PREWARM_MB=$WAL_PREWARM_MB prewarm_wal
  WAL_FILES=$(sql -c "SELECT count(*) FROM pg_ls_waldir()")

  log "warming up"
  local limit
  for limit in "${LIMITS[@]}"; do
    # shellcheck disable=SC2046  # one word per script
    run_pgbench "warmup-$limit" 16 2 $(pgbench_scripts "$limit" mix)
  done
  for mode in "${MODES[@]}"; do
    use_server "$mode"
    run_wrk "warmup-idempay-$mode" mix 16 2
  done

  # The whole table with durable commits (the headline: as production runs), then again with
  # synchronous_commit=off, in the same run on the same server, so both are known.
  local workload conns commits prefix
  for commits in "${COMMITS[@]}"; do
    set_synchronous_commit "$commits"
    prefix=$(commit_prefix "$commits")
    for workload in "${WORKLOADS[@]}"; do
      for conns in "${CONCURRENCY[@]}"; do
        local round name
        for round in $(seq 1 "$ROUNDS"); do
          # round 1 keeps the name the raw runs always had
          name="$prefix-$workload-c$conns"
          [ "$round" = 1 ] || name="$name-r$round"
          log "synchronous_commit=$commits: $workload keys, c=$conns, ${SECONDS_PER_RUN}s each side, round $round of $ROUNDS"
          if [ "$conns" = 64 ] && [ "$commits" = on ]; then
            use_server "$own_mode" # sampled all along, idle while the other modes run
            start_rss_sampler "$OUT_DIR/raw/rss.txt"
            measure_pair "$name" "$workload" "$conns" "$SECONDS_PER_RUN"
            stop_rss_sampler
          else
            measure_pair "$name" "$workload" "$conns" "$SECONDS_PER_RUN"
          fi
        done
      done
    done
  done
  set_synchronous_commit on
  [ "$WRITES" = 0 ] || measure_writes

  # Latency as the table grows: start again from an empty key table, so the smallest size is
  # really small, and grow it with SQL between measurements.
  local size_actual="{}" rows actual
  if [ "${#SIZES[@]}" -gt 0 ]; then
    log "table-size sweep: ${SIZES[*]} rows, c=16, ${SIZE_SECONDS}s each"
    sql -c "TRUNCATE idempotency_keys" >/dev/null
    local MODES=("$own_mode") # this build's first mode only, from here on
    local LIMITS=("${LIMITS[0]}") # and the first limit
    use_server "$own_mode"
    seed_replay_sets
    for rows in "${SIZES[@]}"; do
      log "seeding the key table to $rows rows"
      seed_keys "$rows"
      actual=$(sql -c "SELECT count(*) FROM idempotency_keys")
      size_actual=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d[sys.argv[2]]=int(sys.argv[3]); print(json.dumps(d))' \
        "$size_actual" "$rows" "$actual")
      for workload in new replay; do
        log "$rows rows: $workload keys"
        measure_pair "size-$rows-$workload" "$workload" 16 "$SIZE_SECONDS"
      done
    done
  fi

  local stuck
  stuck=$(sql -c "SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'")
  [ "$stuck" = 0 ] || log "error: $stuck keys left in progress (the run fails after the report)"

  python3 - "$OUT_DIR/raw/meta.json" <<PY
import json, os, sys
json.dump({
    "started": "$started",
    "commit": "$commit",
    "cores": os.cpu_count(),
    "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None),
    "seconds": $SECONDS_PER_RUN,
    "rounds": $ROUNDS,
    "size_seconds": $SIZE_SECONDS,
    "quick": "${BENCH_QUICK:-0}" == "1",
    "pool_size": $POOL_SIZE,
    "pool_configurable": "$POOL_CONFIGURABLE" == "true",
    "pg_opts": "$BENCH_PG_OPTS",
    "wal_prewarm_mb": $WAL_PREWARM_MB,
    "wal_files_after_prewarm": int("$WAL_FILES"),
    "wal_files_at_end": int("$(sql -c "SELECT count(*) FROM pg_ls_waldir()")"),
    "pg_transport": "$PG_TRANSPORT",
    "two_hop": "${PROCESSOR_URLS[$IDEMPAY]:-}" != "",
    "baseline_bin": "${BENCH_BASELINE_BIN:-}",
    "baseline_label": "${BENCH_BASELINE_LABEL:-}",
    "processor_modes": "${MEASURED_MODES[*]}".split(),
    "limits": "${MEASURED_LIMITS[*]}".split(),
    "writes_seconds": $WRITES_SECONDS if "$WRITES" != "0" else None,
    "select1_tps": float("$SELECT1_TPS"),
    "fdatasync_per_s": float("${FDATASYNC_PER_S:-nan}"),
    "workloads": "${WORKLOADS[*]}".split(),
    "synchronous_commit": "${COMMITS[*]}".split(),
    "fsync": "$(sql -c 'SHOW fsync')",
    "concurrency": [int(c) for c in "${CONCURRENCY[*]}".split()],
    "sizes": [int(s) for s in "${SIZES[*]}".split()],
    "size_actual_rows": json.loads('$size_actual'),
    "idle_rss_kb": int("$idle_rss"),
    "pgbench_replay_keys": $PGBENCH_REPLAY_KEYS,
    "api_replay_keys": $API_REPLAY_KEYS,
    "keys_left_in_progress": int("$stuck"),
    "idempay_bin": "$IDEMPAY",
    "loadavg_before": float("$LOADAVG_START"),
    "wrk": "$(wrk -v 2>&1 | head -n 1 | cut -d' ' -f1-2)",
    "pgbench": "$(pgbench --version)",
}, open(sys.argv[1], "w"), indent=1)
PY
  echo
  python3 "$BENCH_DIR/report.py" bench --dir "$OUT_DIR"
  log "written: $OUT_DIR/bench.json, $OUT_DIR/bench.md, $OUT_DIR/bench.svg"
  # Errors, wrong replays and keys left in progress fail the run, once the report is written.
  python3 "$BENCH_DIR/report.py" check --dir "$OUT_DIR" ||
    die "idempay answered with errors (listed above): the run failed"
}

main "$@"
