#!/usr/bin/env bash
# make bench-citus: what a request costs on a Citus cluster (a coordinator and two workers, all on
# this machine) against one PostgreSQL server, the same idempay release build measured on each in
# one run, side by side.
#
# On one machine the cluster cannot be faster: its nodes share the same cores, and a routed
# statement takes one more hop (client → coordinator → worker). The ratio shows what routing costs
# a request, not what more machines would gain.
#
# The processor keeps its ledger in a PostgreSQL of its own, the same for both runs: what differs
# is only where idempay's own tables are.
#
#   BENCH_SECONDS=10        seconds per measurement
#   BENCH_CONCURRENCY="16"  connections
#   BENCH_WORKLOADS="new replay"
#
# Results: target/bench/citus.json and citus.md, raw runs in target/bench/raw.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SECONDS_PER_RUN=${BENCH_SECONDS:-10}
read -ra CONCURRENCY <<<"${BENCH_CONCURRENCY:-16}"
read -ra WORKLOADS <<<"${BENCH_WORKLOADS:-new replay}"
API_REPLAY_KEYS=1000
CLUSTER=idempay-bench-citus
# The cluster's nodes run with the one server's settings (and the background workers Citus needs):
# the same durability on both sides, so neither is measured with writes the other must make.
CITUS_OPTS="$BENCH_PG_OPTS -c max_worker_processes=64"

# measure TARGET: every workload and concurrency against the server now running.
measure() {
  local target=$1 workload conns
  for workload in "${WORKLOADS[@]}"; do
    for conns in "${CONCURRENCY[@]}"; do
      settle
      log "$target: $workload keys, c=$conns, ${SECONDS_PER_RUN}s"
      run_wrk "citus-$target-$workload-c$conns" "$workload" "$conns" "$SECONDS_PER_RUN"
    done
  done
}

# Points psql (sql, settle) and idempay at the database URL $1.
use_database() {
  DATABASE_URL=$1
  local rest=${1#*@}
  PGHOST=${rest%%:*}
  rest=${rest#*:}
  PGPORT=${rest%%/*}
  export DATABASE_URL PGHOST PGPORT PGUSER=postgres PGPASSWORD=postgres PGDATABASE=postgres
}

main() {
  check_tools
  mkdir -p "$OUT_DIR/raw"
  build_release
  warn_if_busy
  detect_pool_option

  # The processor: a PostgreSQL of its own, kept for both runs.
  start_postgres
  BENCH_CLEANUP+=("docker rm -f $PG_CONTAINER >/dev/null 2>&1")
  "$IDEMPAY" migrate 2>/dev/null
  start_processor
  PG_CONTAINER=""

  # One server.
  start_postgres
  prepare_database
  start_server 1000h http
  seed_replay_keys "$API_REPLAY_KEYS" "$OUT_DIR/replay-keys.txt"
  run_wrk citus-warmup-single mix 16 2
  measure single
  stop_server
  docker rm -f "$PG_CONTAINER" >/dev/null
  PG_CONTAINER=""

  # The cluster, its tables distributed by account.
  BENCH_CLEANUP+=("IDEMPAY_CITUS_CLUSTER=$CLUSTER bash $REPO_DIR/scripts/citus-cluster.sh down >/dev/null 2>&1")
  local url
  url=$(IDEMPAY_CITUS_CLUSTER=$CLUSTER IDEMPAY_CITUS_PG_OPTS="$CITUS_OPTS" \
    bash "$REPO_DIR/scripts/citus-cluster.sh" up | tail -n 1)
  use_database "$url"
  BENCH_MIGRATE_ARGS=--citus prepare_database
  start_server 1000h http
  seed_replay_keys "$API_REPLAY_KEYS" "$OUT_DIR/replay-keys.txt"
  run_wrk citus-warmup-cluster mix 16 2
  measure cluster
  stop_server

  python3 - "$OUT_DIR" "$(revision_label)" "${WORKLOADS[*]}" "${CONCURRENCY[*]}" <<'PY'
import json, pathlib, sys
out, revision, workloads, concurrency = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
rows = []
for workload in workloads:
    for conns in concurrency:
        one, cluster = (json.load(open(out / "raw" / f"citus-{t}-{workload}-c{conns}.json"))
                        for t in ("single", "cluster"))
        errors = sum(r.get("non_2xx", 0) + sum(r.get("socket_errors", {}).values()) for r in (one, cluster))
        rows.append({
            "workload": workload, "connections": int(conns),
            "one_server_rps": one["rps"], "cluster_rps": cluster["rps"],
            "ratio": cluster["rps"] / one["rps"],
            "one_server_p99_ms": one["p99_ms"], "cluster_p99_ms": cluster["p99_ms"],
            "machine_cpu_us_one": one["machine_cpu_s"] / max(one["requests"], 1) * 1e6,
            "machine_cpu_us_cluster": cluster["machine_cpu_s"] / max(cluster["requests"], 1) * 1e6,
            "errors": errors,
        })
lines = [
    f"# idempay on a Citus cluster against one server ({revision})",
    "",
    "A coordinator and two workers on this one machine, against one PostgreSQL server; the same",
    "build, the same processor (on a PostgreSQL of its own). The ratio is the cost of routing,",
    "not the gain of more machines.",
    "",
    "| workload | c | one server req/s | cluster req/s | cluster / one | p99 one / cluster ms | machine CPU µs/req one / cluster | errors |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
]
for r in rows:
    lines.append(
        f"| {r['workload']} | {r['connections']} | {r['one_server_rps']:.0f} | {r['cluster_rps']:.0f} "
        f"| {r['ratio']:.2f} | {r['one_server_p99_ms']:.1f} / {r['cluster_p99_ms']:.1f} "
        f"| {r['machine_cpu_us_one']:.0f} / {r['machine_cpu_us_cluster']:.0f} | {r['errors']} |")
text = "\n".join(lines) + "\n"
(out / "citus.md").write_text(text)
(out / "citus.json").write_text(json.dumps({"revision": revision, "rows": rows}, indent=1))
print(text)
if any(r["errors"] for r in rows):
    sys.exit("some requests were not answered as expected")
PY
}

main "$@"
