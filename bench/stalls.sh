#!/usr/bin/env bash
# Where the limit's latency stalls come from: pgbench with new_key.sql against the bench's
# PostgreSQL (host network, data on a volume, durable commits), no idempay build needed, with
# what PostgreSQL and the machine did each second beside each second's worst latency.
#
#   STALLS_PG_OPTS   server settings (default: the bench's BENCH_PG_OPTS)
#   STALLS_SECONDS=60 STALLS_CONNECTIONS=16 STALLS_RUNS=1
#   STALLS_PREPARE=none|checkpoint|prewarm  before each run: nothing, a CHECKPOINT, or a CHECKPOINT
#                    after WAL segments were made for the run (see prewarm_wal in lib.sh)
#   STALLS_LABEL     names the output: target/bench/stalls/LABEL-runN.{tsv,waits.txt,pg.log}
#
# Per run, one line per second: transactions, worst latency (ms), WAL files in pg_wal, WAL bytes,
# WAL syncs and their time (track_wal_io_timing), checkpoints, buffers the backends wrote, the
# host's Dirty and Writeback (kB, /proc/meminfo), the disk's write time (ms, /proc/diskstats), and
# the wait events seen on client backends sampled every 50 ms. The server's log (log_checkpoints,
# log_autovacuum_min_duration=0) is kept beside it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SECS=${STALLS_SECONDS:-60}
CONNS=${STALLS_CONNECTIONS:-16}
RUNS=${STALLS_RUNS:-1}
PREPARE=${STALLS_PREPARE:-none}
LABEL=${STALLS_LABEL:-stalls}
DIR="$OUT_DIR/stalls"
BENCH_PG_OPTS="${STALLS_PG_OPTS:-$BENCH_PG_OPTS} -c log_checkpoints=on -c log_autovacuum_min_duration=0 -c track_wal_io_timing=on"

disk_dev=$(lsblk -no PKNAME "$(df --output=source "$REPO_DIR" | tail -n 1)" 2>/dev/null | head -n 1)
[ -n "$disk_dev" ] || disk_dev=$(basename "$(df --output=source "$REPO_DIR" | tail -n 1)")

sample_seconds() { # FILE: one line a second until killed
  while :; do
    local db mem disk
    db=$(sql -F ' ' -c "SELECT (SELECT count(*) FROM pg_ls_waldir()), w.wal_bytes, w.wal_sync,
        round(w.wal_sync_time::numeric, 1), round(w.wal_write_time::numeric, 1),
        b.checkpoints_timed + b.checkpoints_req, b.buffers_backend
      FROM pg_stat_wal w, pg_stat_bgwriter b" 2>/dev/null || echo "- - - - - - -")
    mem=$(awk '/^Dirty:|^Writeback:/ { printf "%s ", $2 }' /proc/meminfo)
    disk=$(awk -v d="$disk_dev" '$3 == d { print $11 }' /proc/diskstats)
    echo "$(date +%s) $db $mem$disk"
    sleep 1
  done >"$1"
}

sample_waits() { # FILE: client backends' wait events every 50 ms
  sql -F ' ' <<'SQL' >"$1" 2>/dev/null
SELECT extract(epoch FROM clock_timestamp())::int AS s,
       coalesce(string_agg(w, ',' ORDER BY w), '') FROM (
  SELECT coalesce(wait_event_type || ':' || wait_event, 'cpu') AS w FROM pg_stat_activity
  WHERE backend_type = 'client backend' AND state = 'active' AND pid <> pg_backend_pid()) x
\watch 0.05
SQL
}

main() {
  need docker; need psql; need pgbench; need python3
  mkdir -p "$DIR" "$OUT_DIR/raw"
  warn_if_busy
  # migrations and the bench account with SQL, so no build is needed
  start_postgres
  local m
  for m in "$REPO_DIR"/migrations/*.sql; do sql -f "$m" >/dev/null; done
  ACCOUNT_ID=acct_stalls
  SCOPE="$ACCOUNT_ID:POST /v1/payments"
  sql -c "INSERT INTO accounts (id, name, api_key_hash) VALUES ('$ACCOUNT_ID', 'stalls', sha256('x'))" >/dev/null
  log "settings: $BENCH_PG_OPTS; prepare: $PREPARE; $RUNS runs of ${SECS}s at c=$CONNS"
  local run
  for run in $(seq 1 "$RUNS"); do
    local base="$DIR/$LABEL-run$run"
    case "$PREPARE" in
      none) ;;
      checkpoint) settle ;;
      prewarm) prewarm_wal; settle ;;
      *) die "STALLS_PREPARE is none, checkpoint or prewarm" ;;
    esac
    sample_seconds "$base.seconds" & local s1=$!
    sample_waits "$base.waits" & local s2=$!
    local logs_from
    logs_from=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    rm -f "$base".pgb*
    pgbench -n -M prepared -T "$SECS" -c "$CONNS" -j 2 -l --log-prefix="$base.pgb" \
      -D "account_id=$ACCOUNT_ID" -D "scope=$SCOPE" -D "processor_scope=processor:POST /v1/charges" \
      -D "request_hash=\\x$REQUEST_HASH_HEX" \
      -D "response_headers=$RESPONSE_HEADERS" -D "response_body=\\x$RESPONSE_BODY_HEX" \
      -D "lease_ms=30000" -D "ttl_ms=86400000" \
      -D "currency=eur" -D "payment_method=pm_card_visa" -D "payment_status=succeeded" \
      -f "$BENCH_DIR/pgbench/new_key.sql" >"$base.pgbench.txt" 2>&1 || { cat "$base.pgbench.txt"; die pgbench; }
    kill "$s1" "$s2" 2>/dev/null; wait "$s1" "$s2" 2>/dev/null || true
    docker logs --since "$logs_from" "$PG_CONTAINER" >"$base.pg.log" 2>&1
    python3 "$BENCH_DIR/report.py" stalls --prefix "$base" --label "$LABEL run $run" | tee "$base.txt"
  done
}

main "$@"
