#!/usr/bin/env bash
# make profile: where a request's CPU time goes in idempay, for new keys or for replays.
#
# Starts PostgreSQL and idempay (release) as make bench does, puts wrk's new-key load on it at
# c=16, and samples the server with `perf record` (a software clock, so it works where hardware
# counters do not; DWARF call graphs, so inlined Rust frames are named). Prints the share of the
# samples spent under each part of the stack (inclusive) and the hottest functions (exclusive).
#
#   BENCH_PROFILE_SECONDS=10        seconds of sampling
#   BENCH_PROFILE_WORKLOAD=new      new or replay (keys made through the API, answered from memory)
#
# Results: target/bench/profile.md, and target/bench/profile.folded (one line per stack, the
# input of inferno-flamegraph or flamegraph.pl for a flame graph).

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SECONDS_TO_SAMPLE=${BENCH_PROFILE_SECONDS:-10}
WORKLOAD=${BENCH_PROFILE_WORKLOAD:-new}
case "$WORKLOAD" in new | replay) ;; *) die "BENCH_PROFILE_WORKLOAD is new or replay" ;; esac

# perf comes from Debian's linux-perf; install it when absent and we may.
ensure_perf() {
  command -v perf >/dev/null 2>&1 && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing linux-perf"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null ||
      { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null; }
  fi
  need perf "apt-get install linux-perf"
}

main() {
  check_tools
  ensure_perf
  mkdir -p "$OUT_DIR/raw"
  prepare_stack
  start_server 1000h
  [ "$WORKLOAD" = new ] || seed_replay_keys 1000 "$OUT_DIR/replay-keys.txt"
  log "warming up"
  run_wrk profile-warmup "$WORKLOAD" 16 2

  log "sampling idempay for ${SECONDS_TO_SAMPLE}s under $WORKLOAD-key load, c=16"
  local data="$OUT_DIR/raw/profile.perf"
  run_wrk profile-load "$WORKLOAD" 16 $((SECONDS_TO_SAMPLE + 2)) &
  local load=$!
  sleep 1
  perf record -q -e cpu-clock -F 499 --call-graph dwarf,16384 -p "$SERVER_PID" -o "$data" \
    -- sleep "$SECONDS_TO_SAMPLE" 2>"$OUT_DIR/raw/profile.perf.log" ||
    { cat "$OUT_DIR/raw/profile.perf.log" >&2; die "perf record failed"; }
  wait "$load"
  log "summarizing"
  perf script -i "$data" 2>/dev/null |
    python3 "$BENCH_DIR/profile.py" "$OUT_DIR/profile.folded" "$OUT_DIR/raw/profile-load.json" \
      >"$OUT_DIR/profile.md"
  cat "$OUT_DIR/profile.md"
  log "written: $OUT_DIR/profile.md, $OUT_DIR/profile.folded"
}

main "$@"
