#!/usr/bin/env bash
# The delivery loop's throughput with 1, 10 and 100 endpoints, in one run: BENCH_DELIVERIES due
# rows (6,000 by default) delivered by one loop to that many loopback endpoints answering 200 at
# once, each line in deliveries a second and its ratio to the 1-endpoint line. PostgreSQL as the
# other benches run it (host network, data on a volume, durable commits: synchronous_commit on);
# the loop is the test build's (tests/api/delivery/throughput.rs, a test the suite ignores and
# this runs with --ignored), as `make test` builds it. About a minute. Results in target/bench/delivery.txt.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

main() {
  need docker; need psql; need cargo
  mkdir -p "$OUT_DIR"
  warn_if_busy
  start_postgres
  set_synchronous_commit on
  log "delivering ${BENCH_DELIVERIES:-6000} rows to 1, 10 and 100 endpoints"
  IDEMPAY_BENCH_DATABASE_URL="$DATABASE_URL" BENCH_DELIVERIES="${BENCH_DELIVERIES:-6000}" \
    cargo test --quiet --features failpoints --test api -- --nocapture --ignored \
    throughput::delivery_throughput_with_1_10_and_100_endpoints 2>&1 |
    grep '^bench-delivery:' | tee "$OUT_DIR/delivery.txt"
}

main "$@"
