#!/usr/bin/env bash
# make bench-expiry: what the expiry job costs the requests while it drains a large backlog.
#
# A fresh database with BENCH_EXPIRY_ROWS keys (5 million), the older half of them expired, as a
# table whose job never ran. Then, under the same steady load (wrk, c=16, 50 % new keys, 50 %
# replays):
#   (a) idempay with the expiry job off (IDEMPAY_EXPIRY_INTERVAL=1000h): the baseline;
#   (b) idempay with the job on (every 1s), starting the drain as the load starts;
# the drain's rows/s, and the plans of the key lookup and of the batch delete (EXPLAIN ANALYZE,
# the delete in a rolled-back transaction).
#
#   BENCH_EXPIRY_ROWS=5000000  keys seeded
#   BENCH_EXPIRY_SECONDS=30    seconds of load per phase
#   BENCH_QUICK=1              200k rows, 5 s per phase
#
# Results: target/bench/expiry.json and expiry.md.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ "${BENCH_QUICK:-0}" = 1 ]; then
  ROWS=${BENCH_EXPIRY_ROWS:-200000}
  LOAD_SECONDS=${BENCH_EXPIRY_SECONDS:-5}
else
  ROWS=${BENCH_EXPIRY_ROWS:-5000000}
  LOAD_SECONDS=${BENCH_EXPIRY_SECONDS:-30}
fi
CONNECTIONS=16
DRAIN_TIMEOUT=${BENCH_EXPIRY_DRAIN_TIMEOUT:-900}

# The statements under study, as idempay sends them (prepared: the server runs a generic plan once
# a statement has run a few times, so both plans are shown).
explain_plans() {
  local key=$1 dir="$OUT_DIR/raw/plans"
  mkdir -p "$dir"
  local lookup reserve expire
  # The lookup half of the reservation, on its own; the reservation and the batch delete are
  # taken from the query data, the exact text the binary prepares.
  lookup="SELECT id, FALSE, request_hash, status, response_code, response_headers,
       response_body, expires_at <= now(),
       (EXTRACT(EPOCH FROM locked_until - now()) * 1000)::bigint,
       (EXTRACT(EPOCH FROM expires_at - now()) * 1000)::bigint
FROM idempotency_keys
WHERE scope = \$1 AND idem_key = \$2"
  reserve=$(query_text "WITH reserved AS" "INSERT INTO idempotency_keys")
  expire=$(query_text "DELETE FROM idempotency_keys" "SKIP LOCKED")
  # Each statement: its first execution (a custom plan), its seventh (after five executions the
  # plan cache may switch to a generic plan, so this is the plan the server keeps running) and the
  # generic plan forced. Deletes happen in a transaction that is rolled back.
  explain_three() { # NAME STATEMENT ARGS
    local name=$1 statement=$2 args=$3
    sql -v scope="$SCOPE" -v key="$key" -v hash="\\x$REQUEST_HASH_HEX" >"$dir/$name.txt" <<SQL
BEGIN;
PREPARE s AS $statement;
\\echo '-- first execution'
EXPLAIN (ANALYZE, BUFFERS) EXECUTE s$args;
\\o /dev/null
EXECUTE s$args; EXECUTE s$args; EXECUTE s$args; EXECUTE s$args; EXECUTE s$args;
\\o
\\echo '-- seventh execution'
EXPLAIN (ANALYZE, BUFFERS) EXECUTE s$args;
SET LOCAL plan_cache_mode = force_generic_plan;
\\echo '-- generic plan forced'
EXPLAIN (ANALYZE, BUFFERS) EXECUTE s$args;
ROLLBACK;
SQL
    python3 - "$dir/$name.txt" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
parts = text.split("-- ")
for part in parts[1:]:
    title, _, body = part.partition("\n")
    stem = {"first execution": "first", "seventh execution": "seventh", "generic plan forced": "generic"}[title.strip()]
    open(path[:-4] + "-" + stem + ".txt", "w").write(body)
PY
  }
  explain_three lookup "$lookup" "(:'scope', :'key')"
  explain_three reserve "$reserve" "(:'scope', :'key', :'hash', gen_random_uuid(), 30000, 86400000, NULL, NULL, NULL, NULL, split_part(:'scope', ':', 1), NULL)"
  explain_three expire "$expire" ""
  local args=() f label
  for f in lookup reserve expire; do
    case $f in
      lookup) label="key lookup (SELECT by scope + idem_key)" ;;
      reserve) label="reservation (INSERT … ON CONFLICT DO NOTHING … UNION ALL SELECT), existing key" ;;
      expire) label="expiry batch DELETE (LIMIT 1000, FOR UPDATE SKIP LOCKED)" ;;
    esac
    args+=("$dir/$f-first.txt" "$label, 1st execution (custom plan)"
           "$dir/$f-seventh.txt" "$label, 7th execution (the plan the server keeps)"
           "$dir/$f-generic.txt" "$label, generic plan forced")
  done
  python3 "$BENCH_DIR/report.py" plans --out "$OUT_DIR/raw/expiry-plans.json" "${args[@]}"
  for f in lookup-seventh reserve-seventh expire-seventh expire-generic; do
    printf '\n-- %s\n' "$f" >&2
    cat "$dir/$f.txt" >&2
  done
}

deleted_so_far() {
  sql -c "SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'"
}

# Every second: seconds since START, rows deleted since, "-" (the expired count is taken only
# after the load, as counting would itself load the database).
start_timeline() {
  local file=$1 start=$2 base=$3
  (
    while :; do
      now=$(date +%s.%N)
      d=$(deleted_so_far 2>/dev/null) || exit 0
      awk -v now="$now" -v start="$start" -v d="$((d - base))" 'BEGIN { printf "%.1f %d -\n", now - start, d }'
      sleep 1
    done
  ) >>"$file" &
  SAMPLER_PID=$!
}

main() {
  check_tools
  mkdir -p "$OUT_DIR/raw"
  rm -rf "$OUT_DIR/raw/plans" "$OUT_DIR/raw"/expiry-*
  local started commit
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  commit=$(revision_label)

  prepare_stack

  # (a) The job off. Its first run comes at once when the server starts, whatever the interval
  # (tokio's interval fires its first tick immediately), so the backlog is seeded after that run,
  # and the next one is 1000 h away. The replay keys are live (24 h), created through the API.
  start_server 1000h
  sleep 1
  seed_replay_keys 1000 "$OUT_DIR/replay-keys.txt"
  log "seeding $ROWS keys, half of them expired"
  seed_keys "$ROWS" 0.5
  # Rows expired as of now; rows that expire during the run are left out of the drain's count.
  local cutoff expired_before
  cutoff=$(sql -c "SELECT now()")
  expired_before=$(sql -c "SELECT count(*) FROM idempotency_keys WHERE expires_at <= '$cutoff'")
  log "$expired_before of $ROWS keys expired"

  explain_plans "$(head -n 1 "$OUT_DIR/replay-keys.txt" | cut -d' ' -f1)"
  log "warming up"
  run_wrk expiry-warmup mix "$CONNECTIONS" 2
  settle
  log "(a) expiry job off: ${LOAD_SECONDS}s of load"
  run_wrk expiry-baseline mix "$CONNECTIONS" "$LOAD_SECONDS"
  stop_server
  local still
  still=$(sql -c "SELECT count(*) FROM idempotency_keys WHERE expires_at <= '$cutoff'")
  [ "$still" = "$expired_before" ] || die "rows were deleted with the job off ($still left)"

  # (b) The job on: its first run starts with the server, and drains batch after batch.
  settle
  local base start
  base=$(deleted_so_far)
  start=$(date +%s.%N)
  start_timeline "$OUT_DIR/raw/expiry-timeline.txt" "$start" "$base"
  start_server 1s
  log "(b) expiry job draining: ${LOAD_SECONDS}s of load"
  run_wrk expiry-drain mix "$CONNECTIONS" "$LOAD_SECONDS"
  local left_after_load
  left_after_load=$(sql -c "SELECT count(*) FROM idempotency_keys WHERE expires_at <= '$cutoff'")
  log "$left_after_load expired rows left when the load ended; waiting for the drain"
  # The drain has ended when no row of the backlog is left; counted every 2 s once the load is
  # over (the count would load the database during the measurement).
  local waited=0 left=$left_after_load drain_seconds=""
  while [ "$left" -gt 0 ] && [ "$waited" -lt "$DRAIN_TIMEOUT" ]; do
    sleep 2; waited=$((waited + 2))
    left=$(sql -c "SELECT count(*) FROM idempotency_keys WHERE expires_at <= '$cutoff'")
  done
  if [ "$left" = 0 ]; then
    if [ "$left_after_load" = 0 ]; then
      # Over during the load: when the deletions reached the backlog (1 s resolution; the
      # statistics lag a little, hence 99 %).
      drain_seconds=$(awk -v want="$expired_before" '$2 >= 0.99 * want { print $1; exit }' \
        "$OUT_DIR/raw/expiry-timeline.txt")
    else
      drain_seconds=$(awk -v now="$(date +%s.%N)" -v start="$start" 'BEGIN { printf "%.1f", now - start }')
    fi
  fi
  sleep 1
  stop_rss_sampler
  stop_server
  local finished=false
  [ "$left" -gt 0 ] || finished=true
  log "drain finished: $finished after ${drain_seconds:-?}s"

  python3 - "$OUT_DIR/raw/expiry-meta.json" <<PY
import json, os, sys
drain = "$drain_seconds"
json.dump({
    "started": "$started",
    "commit": "$commit",
    "cores": os.cpu_count(),
    "rows": $ROWS,
    "expired_before": $expired_before,
    "connections": $CONNECTIONS,
    "load_seconds": $LOAD_SECONDS,
    "pool_size": $POOL_SIZE,
    "pg_opts": "$BENCH_PG_OPTS",
    "drain_seconds": float(drain) if drain else None,
    "drain_finished": "$finished" == "true",
    "expired_left_after_load": $left_after_load,
    "batch": 1000,
    "idempay_bin": "$IDEMPAY",
    "loadavg_before": float("$LOADAVG_START"),
}, open(sys.argv[1], "w"), indent=1)
PY
  echo
  python3 "$BENCH_DIR/report.py" expiry --dir "$OUT_DIR"
  log "written: $OUT_DIR/expiry.json, $OUT_DIR/expiry.md"
}

main "$@"
