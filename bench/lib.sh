# Helpers shared by bench/bench.sh and bench/expiry.sh. Sourced, not run.
#
# Everything runs on loopback: one PostgreSQL container (removed at exit), the release build of
# idempay on a free port, pgbench and wrk as load generators.
#
# PostgreSQL is reached the way production reaches it: the container shares the host's network
# (`--network host`) and listens on a free port of 127.0.0.1. A published port (`-p`) would put
# Docker's userland proxy, a process copying every byte, between both sides and the database:
# on two cores that cost pgbench two thirds of its `SELECT 1` rate, and handicapped the limit more
# than idempay. BENCH_PG_TRANSPORT=published measures that path instead, to show the difference.

set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)

# The exact text of the one query in the compile-time query data (what the binary prepares) that
# contains every PATTERN, so the bench never runs a stale copy of it. The workspace's is in .sqlx/,
# the mechanism's in its own crate's.
query_text() {
  python3 - "$REPO_DIR" "$@" <<'PY'
import json, pathlib, sys
root, patterns = pathlib.Path(sys.argv[1]), sys.argv[2:]
files = sorted(root.glob(".sqlx/query-*.json")) + sorted(root.glob("crates/idempotency/.sqlx/query-*.json"))
found = [json.loads(f.read_text())["query"] for f in files]
found = [query for query in found if all(pattern in query for pattern in patterns)]
if len(found) != 1:
    sys.exit(f"{len(found)} queries in the query data contain all of {patterns}")
print(found[0].strip())
PY
}
OUT_DIR="$REPO_DIR/target/bench"
# BENCH_IDEMPAY_BIN runs a binary built elsewhere (another revision) instead of building this tree.
# cargo builds into CARGO_TARGET_DIR when set, the tree's target/ otherwise.
IDEMPAY=${BENCH_IDEMPAY_BIN:-"${CARGO_TARGET_DIR:-$REPO_DIR/target}/release/idempay"}
export SQLX_OFFLINE=true

# The same server settings for both sides of every comparison, with PostgreSQL's durable defaults
# (fsync on, synchronous_commit on): a payment answered 201 survives a crash of the database, so a
# commit waits for its WAL to reach the disk, as production runs. bench.sh measures the table once
# more with synchronous_commit=off (set with ALTER SYSTEM between the rounds), to show what the
# disk costs; BENCH_PG_OPTS replaces the whole set.
#
# The WAL as a server that has been running meets it (bench/README.md, "Stalls"): min_wal_size=1GB
# keeps up to 1 GB of used segments for reuse at each checkpoint, and BENCH_WAL_PREWARM_MB of them
# are made before the first measurement (prewarm_wal), so no measurement waits while a new segment
# is created, whichever side it is. track_wal_io_timing times the WAL's flushes, and each
# measurement reports its mean flush: the disk's share of a stall shows on the side it hit.
BENCH_PG_OPTS=${BENCH_PG_OPTS:-"-c max_connections=500 -c shared_buffers=512MB -c max_wal_size=4GB -c checkpoint_timeout=30min -c min_wal_size=1GB -c track_wal_io_timing=on"}

# Sets synchronous_commit for every session, those already open included (a reload reaches them).
set_synchronous_commit() { # on|off
  sql -c "ALTER SYSTEM SET synchronous_commit = '$1'" -c "SELECT pg_reload_conf()" >/dev/null
  local now
  for _ in $(seq 50); do
    now=$(sql -c "SHOW synchronous_commit")
    [ "$now" = "$1" ] && return 0
    sleep 0.1
  done
  die "synchronous_commit is $now, not $1"
}

PG_CONTAINER=""
PG_PORT=""
DATABASE_URL=""
SERVER_PID=""
SERVER_LOG=""
SAMPLER_PID=""
declare -a BENCH_CLEANUP=()

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

bench_cleanup() {
  local status=$?
  set +e
  [ -z "$SAMPLER_PID" ] || kill "$SAMPLER_PID" 2>/dev/null
  stop_server
  stop_processors
  if [ -n "$PG_CONTAINER" ]; then
    docker rm -f "$PG_CONTAINER" >/dev/null 2>&1
  fi
  local cmd
  for cmd in "${BENCH_CLEANUP[@]}"; do eval "$cmd"; done
  exit "$status"
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM HUP

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is missing${2:+ ($2)}"
}

# wrk comes from Debian; install it when absent and we may.
ensure_wrk() {
  command -v wrk >/dev/null 2>&1 && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing wrk"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null ||
      { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
  fi
  need wrk "apt-get install wrk"
}

# The machine's 1-minute load average before a run: anything else using the CPU makes every
# number lower and noisier, as load generator, server and database share the cores.
warn_if_busy() {
  LOADAVG_START=$(cut -d' ' -f1 /proc/loadavg)
  if awk -v l="$LOADAVG_START" 'BEGIN { exit !(l > 1.0) }'; then
    log "warning: load average $LOADAVG_START before the run: other processes use the CPU"
  fi
}

check_tools() {
  need docker
  need psql "PostgreSQL client"
  need pgbench "PostgreSQL client"
  need python3
  need cargo
  ensure_wrk
}

build_release() {
  if [ -n "${BENCH_IDEMPAY_BIN:-}" ]; then
    [ -x "$IDEMPAY" ] || die "BENCH_IDEMPAY_BIN=$IDEMPAY is not executable"
    log "using $IDEMPAY"
    return 0
  fi
  log "building idempay (release)"
  (cd "$REPO_DIR" && cargo build --release --quiet --bin idempay)
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

PG_TRANSPORT=${BENCH_PG_TRANSPORT:-host}

# Starts a PostgreSQL container from the image scripts/pg-image.sh finds or builds. Its data
# directory is a volume (anonymous, removed with the container), as a production database's is: on
# the container's copy-on-write layer a WAL flush cost this machine 0.39 ms, on a volume 0.20 ms.
start_postgres() {
  local image
  image=$(bash "$REPO_DIR/scripts/pg-image.sh" | tail -n 1)
  PG_CONTAINER="idempay-bench-$$-$RANDOM"
  log "starting PostgreSQL ($image, transport: $PG_TRANSPORT) with: $BENCH_PG_OPTS"
  case "$PG_TRANSPORT" in
    host)
      PG_PORT=$(free_port)
      # shellcheck disable=SC2086  # the options are words on purpose
      docker run -d --rm --name "$PG_CONTAINER" --shm-size=1g --network host \
        --volume /var/lib/postgresql/data -e POSTGRES_PASSWORD=postgres \
        "$image" -c listen_addresses=127.0.0.1 -c port="$PG_PORT" $BENCH_PG_OPTS >/dev/null
      ;;
    published)
      # shellcheck disable=SC2086
      docker run -d --rm --name "$PG_CONTAINER" --shm-size=1g \
        --volume /var/lib/postgresql/data -e POSTGRES_PASSWORD=postgres -p 127.0.0.1::5432 \
        "$image" $BENCH_PG_OPTS >/dev/null
      PG_PORT=$(docker port "$PG_CONTAINER" 5432/tcp | sed -n 's/^127\.0\.0\.1:\([0-9]*\)$/\1/p' | head -n 1)
      ;;
    *) die "BENCH_PG_TRANSPORT is host or published, not $PG_TRANSPORT" ;;
  esac
  [ -n "$PG_PORT" ] || die "cannot find the PostgreSQL port"
  DATABASE_URL="postgres://postgres:postgres@127.0.0.1:$PG_PORT/postgres"
  export DATABASE_URL PGHOST=127.0.0.1 PGPORT="$PG_PORT" PGUSER=postgres PGPASSWORD=postgres PGDATABASE=postgres
  local i
  for i in $(seq 1 200); do
    psql -qAtX -c 'SELECT 1' >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  docker logs "$PG_CONTAINER" >&2 || true
  die "PostgreSQL did not accept connections"
}

# psql with errors fatal, quiet, unaligned.
sql() { psql -qAtX -v ON_ERROR_STOP=1 "$@"; }

# Applies the migrations and creates the bench account; sets API_KEY, ACCOUNT_ID, SCOPE, KEY_HASH.
prepare_database() {
  log "migrating and creating the bench account"
  # shellcheck disable=SC2086  # BENCH_MIGRATE_ARGS (`--citus`) is words on purpose
  "$IDEMPAY" migrate ${BENCH_MIGRATE_ARGS:-} 2>/dev/null
  API_KEY=$("$IDEMPAY" account create --name bench 2>/dev/null | tail -n 1)
  [ -n "$API_KEY" ] || die "account create printed no key"
  ACCOUNT_ID=$(sql -c "SELECT id FROM accounts WHERE name = 'bench' ORDER BY created_at DESC LIMIT 1")
  KEY_HASH=$(sql -c "SELECT encode(api_key_hash, 'hex') FROM accounts WHERE id = '$ACCOUNT_ID'")
  SCOPE="$ACCOUNT_ID:POST /v1/payments"
}

# The pool size the server runs with: BENCH_POOL when set, else the build's own default (as its
# --help states it; 16 for builds older than the option).
POOL_SIZE=16
POOL_CONFIGURABLE=false
detect_pool_option() {
  local help
  help=$("$IDEMPAY" serve --help 2>/dev/null)
  if grep -q IDEMPAY_DATABASE_MAX_CONNECTIONS <<<"$help"; then
    POOL_CONFIGURABLE=true
    POOL_SIZE=${BENCH_POOL:-$(grep -A1 -e '--database-max-connections' <<<"$help" |
      sed -n 's/.*\[default: \([0-9]*\)\].*/\1/p' | head -n 1)}
    [ -n "$POOL_SIZE" ] || die "cannot read the default pool size from idempay serve --help"
  else
    POOL_CONFIGURABLE=false
    POOL_SIZE=16
  fi
}

# wait_listening PORT PID LOG WHAT: waits until 127.0.0.1:PORT accepts connections, or fails if
# PID exits.
wait_listening() {
  local port=$1 pid=$2 logfile=$3 what=$4 i
  for i in $(seq 1 200); do
    if python3 - "$port" <<'PY' 2>/dev/null; then
import socket, sys
socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
PY
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$logfile" >&2; die "$what exited"; }
    sleep 0.1
  done
  die "$what did not become ready"
}

# start_processor [BINARY]: `idempay processor` on a free loopback port, its ledger in the bench
# database, as production runs the second hop: a process of its own. Records its pid and URL for
# the binary (PROCESSOR_PIDS, PROCESSOR_URLS); a binary without the processor (an older revision)
# charges in-process, and its URL stays empty.
PROCESSOR_API_KEY=sk_bench_processor
declare -A PROCESSOR_PIDS=() PROCESSOR_URLS=()
start_processor() {
  local bin=${1:-$IDEMPAY} port logfile
  PROCESSOR_URLS[$bin]=""
  "$bin" processor --help >/dev/null 2>&1 || return 0
  port=$(free_port)
  logfile="$OUT_DIR/raw/processor-$port.log"
  local pool=()
  # The processor's pool the size of idempay's: BENCH_POOL sizes both services.
  ! $POOL_CONFIGURABLE || pool=("IDEMPAY_DATABASE_MAX_CONNECTIONS=$POOL_SIZE")
  env "DATABASE_URL=$DATABASE_URL" "IDEMPAY_PROCESSOR_LISTEN=127.0.0.1:$port" \
    "IDEMPAY_PROCESSOR_API_KEY=$PROCESSOR_API_KEY" "RUST_LOG=${BENCH_RUST_LOG:-warn}" \
    "${pool[@]}" "$bin" processor >"$logfile" 2>&1 &
  PROCESSOR_PIDS[$bin]=$!
  PROCESSOR_URLS[$bin]="http://127.0.0.1:$port"
  wait_listening "$port" "${PROCESSOR_PIDS[$bin]}" "$logfile" "idempay processor"
  log "processor ($bin) serving on ${PROCESSOR_URLS[$bin]} (pid ${PROCESSOR_PIDS[$bin]})"
}

# Stops every processor started.
stop_processors() {
  local bin
  for bin in "${!PROCESSOR_PIDS[@]}"; do
    kill -TERM "${PROCESSOR_PIDS[$bin]}" 2>/dev/null && wait "${PROCESSOR_PIDS[$bin]}" 2>/dev/null
  done
  PROCESSOR_PIDS=()
}

# The servers running, by mode, and the one run_wrk measures (see use_server).
declare -A SERVER_PIDS=() SERVER_URLS=() SERVER_PROCESSOR_PIDS=()

# start_server EXPIRY_INTERVAL [MODE]: serves on a free loopback port and makes it the server
# measured (SERVER_PID, BASE_URL). MODE says where the charge is made:
#   http      `idempay processor`, a process of its own (IDEMPAY_PROCESSOR_URL), as production runs
#             a second service; the default
#   embedded  the processor's code in idempay's own process (no IDEMPAY_PROCESSOR_URL), still
#             called over loopback HTTP with the same key, as `idempay dev` runs it
#   base-http, base-embedded  the same with the binary BENCH_BASELINE_BIN (its own processor too),
#             to measure a change side by side with what it changed
# A binary without the processor (an older revision) charges in-process in either mode.
start_server() {
  local interval=${1:-1000h} mode=${2:-http} port bin=$IDEMPAY
  case "$mode" in
    base-*)
      bin=${BENCH_BASELINE_BIN:?mode $mode needs BENCH_BASELINE_BIN}
      [ -x "$bin" ] || die "BENCH_BASELINE_BIN=$bin is not executable"
      ;;
  esac
  case "${mode#base-}" in
    http) [ -n "${PROCESSOR_PIDS[$bin]:-}" ] || start_processor "$bin" ;;
    embedded) ;;
    *) die "a server's mode is http, embedded, base-http or base-embedded, not $mode" ;;
  esac
  port=$(free_port)
  SERVER_LOG="$OUT_DIR/raw/server-$port.log"
  local env=(
    "DATABASE_URL=$DATABASE_URL"
    "IDEMPAY_LISTEN=127.0.0.1:$port"
    "IDEMPAY_EXPIRY_INTERVAL=$interval"
    # The bench measures the mechanism, not the per-account rate limit (one account sends it all).
    "IDEMPAY_RATE_LIMIT=0"
    "RUST_LOG=${BENCH_RUST_LOG:-warn,idempay::expiry=info}"
  )
  SERVER_PROCESSOR_PIDS[$mode]=""
  if [ "${mode#base-}" = http ] && [ -n "${PROCESSOR_URLS[$bin]}" ]; then
    env+=("IDEMPAY_PROCESSOR_URL=${PROCESSOR_URLS[$bin]}" "IDEMPAY_PROCESSOR_API_KEY=$PROCESSOR_API_KEY")
    SERVER_PROCESSOR_PIDS[$mode]=${PROCESSOR_PIDS[$bin]}
  fi
  if $POOL_CONFIGURABLE; then
    env+=("IDEMPAY_DATABASE_MAX_CONNECTIONS=$POOL_SIZE")
  fi
  env -u IDEMPAY_PROCESSOR_URL "${env[@]}" "$bin" serve >"$SERVER_LOG" 2>&1 &
  SERVER_PIDS[$mode]=$!
  SERVER_URLS[$mode]="http://127.0.0.1:$port"
  use_server "$mode"
  local i
  for i in $(seq 1 200); do
    if python3 - "$BASE_URL/readyz" <<'PY' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=1).read()
PY
      log "idempay ($bin) serving on $BASE_URL (pid $SERVER_PID, mode $mode, pool $POOL_SIZE, expiry every $interval)"
      return 0
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$SERVER_LOG" >&2; die "idempay serve exited"; }
    sleep 0.1
  done
  die "idempay did not become ready"
}

# use_server MODE: the server started in MODE is the one measured from now on (SERVER_PID,
# BASE_URL, and PROCESSOR_PID, the processor it calls, if a process of its own).
use_server() {
  SERVER_PID=${SERVER_PIDS[$1]:?no server runs in mode $1}
  BASE_URL=${SERVER_URLS[$1]}
  PROCESSOR_PID=${SERVER_PROCESSOR_PIDS[$1]}
}

# Stops every server started.
stop_server() {
  local mode
  for mode in "${!SERVER_PIDS[@]}"; do
    kill -TERM "${SERVER_PIDS[$mode]}" 2>/dev/null || true
    wait "${SERVER_PIDS[$mode]}" 2>/dev/null || true
  done
  SERVER_PIDS=()
  SERVER_URLS=()
  SERVER_PID=""
}

# CPU seconds (user + system) the process has used so far.
cpu_seconds() {
  python3 - "$1" <<'PY'
import os, sys
fields = open(f"/proc/{sys.argv[1]}/stat").read().rsplit(")", 1)[1].split()
print((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
PY
}

# CPU seconds the whole machine has been busy so far (every process, the kernel's interrupts
# included): what a request costs the machine, whoever spends it (load generator, idempay, the
# processor, PostgreSQL).
machine_cpu_seconds() {
  python3 - <<'PY'
import os
user, nice, system, idle, iowait, irq, softirq, steal = map(int, open("/proc/stat").readline().split()[1:9])
print((user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"))
PY
}

# CPU seconds PostgreSQL has used so far, every process of its container (backends, the WAL
# writer, the checkpointer…), from the container's cgroup (v1 cpuacct or v2 cpu.stat); empty where
# neither can be read. Tells how much of a request's machine CPU is the database's.
postgres_cpu_seconds() {
  local id file
  id=$(docker inspect -f '{{.Id}}' "$PG_CONTAINER" 2>/dev/null) || return 0
  for file in "/sys/fs/cgroup/cpuacct/docker/$id/cpuacct.usage" \
    "/sys/fs/cgroup/system.slice/docker-$id.scope/cpu.stat" "/sys/fs/cgroup/docker/$id/cpu.stat"; do
    [ -r "$file" ] || continue
    case "$file" in
      *cpuacct.usage) awk '{ printf "%.6f\n", $1 / 1e9 }' "$file" ;;
      *) awk '$1 == "usage_usec" { printf "%.6f\n", $2 / 1e6 }' "$file" ;;
    esac
    return 0
  done
}

# Samples VmRSS and VmHWM (kB) of the server every 200 ms into FILE until stopped.
start_rss_sampler() {
  local file=$1 pid=$SERVER_PID
  (
    while kill -0 "$pid" 2>/dev/null; do
      awk '/^VmRSS|^VmHWM/ { printf "%s %s ", $1, $2 } END { print "" }' "/proc/$pid/status" 2>/dev/null
      sleep 0.2
    done
  ) >>"$file" &
  SAMPLER_PID=$!
}

stop_rss_sampler() {
  [ -z "$SAMPLER_PID" ] || kill "$SAMPLER_PID" 2>/dev/null || true
  wait "$SAMPLER_PID" 2>/dev/null || true
  SAMPLER_PID=""
}

# Creates N completed keys through the API, for replays; writes "key amount" lines to FILE.
seed_replay_keys() {
  local count=$1 file=$2
  log "creating $count keys through the API for the replay workloads"
  python3 "$BENCH_DIR/seed_keys.py" --base-url "$BASE_URL" --api-key "$API_KEY" \
    --count "$count" --out "$file"
}

# The WAL flushes so far and the milliseconds spent in them ("syncs ms", from pg_stat_wal; the time
# needs track_wal_io_timing, else 0): how long the disk took to flush, whichever side was measured.
wal_flushes() {
  sql -F ' ' -c "SELECT wal_sync, wal_sync_time FROM pg_stat_wal" 2>/dev/null || echo "0 0"
}

# add_wal_flushes FILE BEFORE AFTER: adds the measurement's WAL flushes and their mean time to its
# result: a latency stall that is the disk's shows as slow flushes in the same measurement.
add_wal_flushes() {
  python3 - "$@" <<'PY'
import json, sys
path, (s0, t0), (s1, t1) = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
result = json.load(open(path))
flushes = int(s1) - int(s0)
result["wal_flushes"] = flushes
result["wal_flush_ms_mean"] = round((float(t1) - float(t0)) / flushes, 3) if flushes else None
json.dump(result, open(path, "w"), indent=1)
PY
}

# What the database has written so far, as one JSON object: each table's counters of inserted,
# updated (HOT among them) and deleted rows with its number of indexes (pg_stat_user_tables), the
# WAL's position, records and full-page images, and the key rows by hop (idempay's, the
# processor's) with those that carry a recovery point, which lives on idempay's key row, not in a
# table of its own. The seed limit's keys (schema seed) when SEED_TABLES is true.
SEED_TABLES=false
table_writes() {
  local seed_keys=NULL
  $SEED_TABLES && seed_keys="(SELECT json_build_object(
      'idempay', count(*) FILTER (WHERE NOT starts_with(scope, 'processor:')),
      'processor', count(*) FILTER (WHERE starts_with(scope, 'processor:'))) FROM seed.idempotency_keys)"
  sql -c "SELECT json_build_object(
    'wal_lsn_bytes', pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'),
    'wal', (SELECT json_build_object('records', wal_records, 'fpi', wal_fpi, 'bytes', wal_bytes)
            FROM pg_stat_wal),
    'tables', (SELECT json_object_agg(s.schemaname || '.' || s.relname, json_build_object(
                 'ins', s.n_tup_ins, 'upd', s.n_tup_upd, 'hot', s.n_tup_hot_upd, 'del', s.n_tup_del,
                 'indexes', (SELECT count(*) FROM pg_index i WHERE i.indrelid = s.relid)))
               FROM pg_stat_user_tables s),
    'keys', (SELECT json_build_object(
               'idempay', count(*) FILTER (WHERE account_id <> 'processor'),
               'processor', count(*) FILTER (WHERE account_id = 'processor'),
               'recovery_points', count(*) FILTER (WHERE recovery_point IS NOT NULL))
             FROM idempotency_keys),
    'seed_keys', $seed_keys)"
}

# writes_begin / writes_end: with WRITES_FILE set, a snapshot of table_writes before and after the
# measurement, into that file, and the WAL written in between by kind of record (`pg_waldump
# --stats` in the container: heap, B-tree, transaction… records, their bytes and those of their
# full-page images). A backend reports its counters when it has been idle a while (up to 10 s after
# its last report, PostgreSQL's PGSTAT_IDLE_INTERVAL, for a pool's connections that stay open), so
# the second snapshot waits that long; the WAL's position is read at once, so the WAL of that wait
# (autovacuum, the services' idle polling) is not counted.
WRITES_START_LSN=""
writes_begin() {
  [ -n "${WRITES_FILE:-}" ] || return 0
  WRITES_START_LSN=$(sql -c "SELECT pg_current_wal_lsn()")
  table_writes >"$WRITES_FILE.before"
}
writes_end() {
  [ -n "${WRITES_FILE:-}" ] || return 0
  local lsn end_lsn
  end_lsn=$(sql -c "SELECT pg_current_wal_lsn()")
  lsn=$(sql -c "SELECT pg_wal_lsn_diff('$end_lsn', '0/0')")
  # The WAL up to end_lsn is written by the time it is read (a durable commit flushes its own and
  # all before it), so pg_waldump reads it from the segments; its stderr (a record cut at end_lsn)
  # is not an error of the run.
  docker exec "$PG_CONTAINER" bash -c \
    'pg_waldump --stats -p "$PGDATA/pg_wal" -s "$1" -e "$2"' _ "$WRITES_START_LSN" "$end_lsn" \
    >"$WRITES_FILE.waldump" 2>/dev/null || true
  sleep "${BENCH_STATS_WAIT:-11}"
  python3 - "$WRITES_FILE" "$lsn" "$(table_writes)" <<'PY'
import json, re, sys
path, lsn, after = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
before = json.load(open(path + ".before"))
# "Type  N (%)  Record size (%)  FPI size (%)  Combined size (%)" lines of pg_waldump --stats
waldump = {}
for line in open(path + ".waldump"):
    m = re.match(r"^(\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(", line)
    if m and m.group(1) != "Total":
        waldump[m.group(1)] = {"records": int(m.group(2)), "record_bytes": int(m.group(3)),
                               "fpi_bytes": int(m.group(4))}
json.dump({"before": before, "after": after, "wal_lsn_bytes_at_end": float(lsn), "waldump": waldump},
          open(path, "w"), indent=1)
PY
  rm -f "$WRITES_FILE.before" "$WRITES_FILE.waldump"
}

# run_wrk NAME MODE CONNECTIONS SECONDS: writes the done() JSON of one wrk run to $OUT_DIR/raw/NAME.json.
# Replays are of the keys in REPLAY_KEYS_FILE (default $OUT_DIR/replay-keys.txt, seed_replay_keys).
run_wrk() {
  local name=$1 mode=$2 conns=$3 secs=$4 threads=2
  [ "$conns" -ge "$threads" ] || threads=$conns
  local out="$OUT_DIR/raw/$name.json" cpu0 cpu1 machine0 machine1 processor0=0 processor1=0
  local postgres0 postgres1
  cpu0=$(cpu_seconds "$SERVER_PID")
  [ -z "${PROCESSOR_PID:-}" ] || processor0=$(cpu_seconds "$PROCESSOR_PID")
  postgres0=$(postgres_cpu_seconds)
  machine0=$(machine_cpu_seconds)
  local wal0 wal1
  writes_begin
  wal0=$(wal_flushes)
  BENCH_API_KEY="$API_KEY" BENCH_MODE="$mode" BENCH_KEYS_FILE="${REPLAY_KEYS_FILE:-$OUT_DIR/replay-keys.txt}" \
    wrk -t"$threads" -c"$conns" -d"${secs}s" --latency --timeout 10s \
    -s "$BENCH_DIR/wrk/payments.lua" "$BASE_URL/v1/payments" >"$OUT_DIR/raw/$name.wrk.txt" 2>&1 ||
    { cat "$OUT_DIR/raw/$name.wrk.txt" >&2; die "wrk failed ($name)"; }
  wal1=$(wal_flushes)
  machine1=$(machine_cpu_seconds)
  postgres1=$(postgres_cpu_seconds)
  cpu1=$(cpu_seconds "$SERVER_PID")
  [ -z "${PROCESSOR_PID:-}" ] || processor1=$(cpu_seconds "$PROCESSOR_PID")
  writes_end
  python3 - "$OUT_DIR/raw/$name.wrk.txt" "$out" "$cpu0" "$cpu1" "$conns" "$mode" \
    "$machine0" "$machine1" "$processor0" "$processor1" "$postgres0" "$postgres1" <<'PY'
import json, sys
(text, out, cpu0, cpu1, conns, mode, machine0, machine1, processor0, processor1, postgres0,
 postgres1) = sys.argv[1:]
line = next(l for l in open(text) if l.startswith("BENCH_JSON "))
result = json.loads(line[len("BENCH_JSON "):])
result.update(server_cpu_s=float(cpu1) - float(cpu0), connections=int(conns), mode=mode,
              machine_cpu_s=float(machine1) - float(machine0),
              processor_cpu_s=float(processor1) - float(processor0),
              postgres_cpu_s=float(postgres1) - float(postgres0) if postgres0 and postgres1 else None,
              loadavg=float(open("/proc/loadavg").read().split()[0]))
json.dump(result, open(out, "w"), indent=1)
PY
  add_wal_flushes "$out" "$wal0" "$wal1"
}

# run_pgbench NAME CONNECTIONS SECONDS SCRIPT...: the limit, with a per-transaction log.
run_pgbench() {
  local name=$1 conns=$2 secs=$3; shift 3
  local threads=2 scripts=() s
  [ "$conns" -ge "$threads" ] || threads=$conns
  for s in "$@"; do scripts+=(-f "$BENCH_DIR/pgbench/$s"); done
  mkdir -p "$OUT_DIR/raw/pgbench"
  rm -f "$OUT_DIR/raw/pgbench/$name".*
  local machine0 machine1 postgres0 postgres1
  postgres0=$(postgres_cpu_seconds)
  machine0=$(machine_cpu_seconds)
  local wal0 wal1
  writes_begin
  wal0=$(wal_flushes)
  pgbench -n -M prepared -T "$secs" -c "$conns" -j "$threads" \
    -l --log-prefix="$OUT_DIR/raw/pgbench/$name" \
    -D "account_id=$ACCOUNT_ID" -D "scope=$SCOPE" -D "processor_scope=processor:POST /v1/charges" \
    -D "request_hash=\\x$REQUEST_HASH_HEX" \
    -D "response_headers=$RESPONSE_HEADERS" -D "response_body=\\x$RESPONSE_BODY_HEX" \
    -D "lease_ms=30000" -D "ttl_ms=86400000" -D "replay_keys=$PGBENCH_REPLAY_KEYS" \
    -D "currency=eur" -D "payment_method=pm_card_visa" -D "payment_status=succeeded" \
    "${scripts[@]}" >"$OUT_DIR/raw/$name.pgbench.txt" 2>&1 ||
    { cat "$OUT_DIR/raw/$name.pgbench.txt" >&2; die "pgbench failed ($name)"; }
  wal1=$(wal_flushes)
  machine1=$(machine_cpu_seconds)
  postgres1=$(postgres_cpu_seconds)
  writes_end
  python3 "$BENCH_DIR/report.py" pgbench-summary --name "$name" --connections "$conns" \
    --machine-cpu-s "$(python3 -c "print($machine1 - $machine0)")" \
    ${postgres0:+${postgres1:+--postgres-cpu-s "$(python3 -c "print($postgres1 - $postgres0)")"}} \
    --stdout "$OUT_DIR/raw/$name.pgbench.txt" --log-prefix "$OUT_DIR/raw/pgbench/$name" \
    --out "$OUT_DIR/raw/$name.json"
  add_wal_flushes "$OUT_DIR/raw/$name.json" "$wal0" "$wal1"
  rm -f "$OUT_DIR/raw/pgbench/$name".*
}

# What a payment's stored response looks like, for rows made with SQL rather than the API: the
# same sizes as the real thing.
RESPONSE_HEADERS='{"content-type": "application/json", "location": "/v1/payments/pay_Rhuo97HReZH9kf4DtZplUvm6"}'
RESPONSE_BODY='{"id":"pay_Rhuo97HReZH9kf4DtZplUvm6","object":"payment","amount":1000,"currency":"eur","status":"succeeded","payment_method":"pm_card_visa","order":null,"description":null,"amount_refunded":0,"amount_disputed":0,"created_at":"2026-11-29T20:35:27.773012Z"}'
RESPONSE_BODY_HEX=$(printf '%s' "$RESPONSE_BODY" | od -An -v -tx1 | tr -d ' \n')
REQUEST_HASH_HEX=$(printf 'bench' | sha256sum | cut -d' ' -f1)

# seed_keys TARGET_ROWS [EXPIRED_FRACTION]: adds completed keys with SQL until the table holds
# TARGET_ROWS rows. With a fraction, keys are spread over the last 48 h by age, the oldest
# FRACTION of them already past expires_at (TTL 24 h), as a table that was never drained.
seed_keys() {
  local target=$1 expired=${2:-0} have chunk=1000000 n
  have=$(sql -c "SELECT count(*) FROM idempotency_keys")
  while [ "$have" -lt "$target" ]; do
    n=$((target - have)); [ "$n" -le "$chunk" ] || n=$chunk
    sql -v scope="$SCOPE" -v n="$n" -v start="$have" -v total="$target" -v expired="$expired" \
      -v headers="$RESPONSE_HEADERS" -v body="$RESPONSE_BODY" <<'SQL'
INSERT INTO idempotency_keys
    (account_id, scope, idem_key, request_hash, status, response_code, response_headers, response_body,
     created_at, expires_at)
SELECT split_part(:'scope', ':', 1), :'scope', gen_random_uuid()::text, sha256(int8send(i)), 'completed', 201,
       :'headers'::jsonb, convert_to(:'body', 'UTF8'), t.created_at, t.created_at + interval '24 hours'
FROM generate_series(:start + 1, :start + :n) AS i,
     LATERAL (SELECT CASE WHEN :expired > 0
                          -- the oldest first: the first `expired` share of the rows is over 24 h old
                          THEN now() - interval '24 hours' * ((1 - i::float8 / :total) / (1 - :expired))
                          ELSE now() END AS created_at) AS t;
SQL
    have=$((have + n))
    log "  idempotency_keys: $have rows"
  done
  sql -c "VACUUM ANALYZE idempotency_keys" >/dev/null
}

# The transport's own cost: pgbench `SELECT 1` at c=16 for a few seconds, printed with the report so
# that a limit measured through a slow path shows. Sets SELECT1_TPS.
measure_select1() {
  local out="$OUT_DIR/raw/select1.pgbench.txt"
  printf 'SELECT 1;\n' >"$OUT_DIR/raw/select1.sql"
  pgbench -n -M prepared -T "${BENCH_SELECT1_SECONDS:-5}" -c 16 -j 2 -f "$OUT_DIR/raw/select1.sql" \
    >"$out" 2>&1 || { cat "$out" >&2; die "pgbench SELECT 1 failed"; }
  SELECT1_TPS=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$out" | head -n 1)
  log "transport $PG_TRANSPORT: pgbench SELECT 1 at c=16: $SELECT1_TPS tps"
}

# The disk's flushes per second where the WAL lives (pg_test_fsync, one 8 kB write and fdatasync
# each): with durable commits, the wall a commit that waits meets when no other commit shares its
# flush.
measure_fsync() {
  local report
  report=$(docker exec "$PG_CONTAINER" bash -c \
    'pg_test_fsync -s 2 -f "$PGDATA/fsync-probe"; rm -f "$PGDATA/fsync-probe"' 2>/dev/null) || true
  FDATASYNC_PER_S=$(awk '/fdatasync/ && /ops\/sec/ { print $2; exit }' <<<"$report")
  log "the WAL's disk: ${FDATASYNC_PER_S:-?} fdatasync/s (pg_test_fsync)"
}

# A quiet start for each measurement: dirty pages written, statistics current.
settle() {
  sql -c "CHECKPOINT" >/dev/null
}

# What the results are of: the commit, marked when src/ differs from it, or BENCH_LABEL for a
# binary built elsewhere (e.g. the revision it was built from).
revision_label() {
  local commit
  commit=$(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)
  git -C "$REPO_DIR" diff --quiet HEAD -- src migrations Cargo.toml Cargo.lock 2>/dev/null ||
    commit="$commit+local-changes"
  [ -z "${BENCH_IDEMPAY_BIN:-}" ] || commit=${BENCH_LABEL:-"$BENCH_IDEMPAY_BIN"}
  echo "$commit"
}

# The release binary, and a database for it with its account: what every run starts from.
prepare_stack() {
  build_release
  warn_if_busy
  detect_pool_option
  start_postgres
  prepare_database
}

# WAL segments made ahead of a measurement: BENCH_WAL_PREWARM_MB of WAL is written (a small record
# and a segment switch, over and over) and the CHECKPOINT that settle() runs next recycles the
# segments as the next ones to use, kept while min_wal_size allows. So no commit during the
# measurement waits while a backend creates (and, with wal_init_zero, zero-fills and fsyncs) a new
# 16 MB segment. 0 makes none; more than min_wal_size is not kept.
prewarm_wal() {
  local mb=${BENCH_WAL_PREWARM_MB:-1024}
  [ "$mb" -gt 0 ] || return 0
  sql -c "DO \$\$ BEGIN FOR i IN 1..($mb / 16) LOOP
            PERFORM pg_logical_emit_message(false, 'bench', 'prewarm'); PERFORM pg_switch_wal();
          END LOOP; END \$\$" >/dev/null
  sql -c "CHECKPOINT" >/dev/null
}
