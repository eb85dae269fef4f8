#!/usr/bin/env bash
# make bench-pools: new keys with durable commits at c=1, 16 and 64 for each pool size, to choose
# the default (IDEMPAY_DATABASE_MAX_CONNECTIONS; the lot beside the pool has as many again). One
# `make bench` per size (new keys only, synchronous_commit=on, no table-size sweep), each after the
# same limit; the curve is printed and written to target/bench/pools.md.
#
#   BENCH_POOLS="4 8 16 32"   the pool sizes, of both services
#   BENCH_PROCESSOR=http      the processor modes measured (see bench.sh)
#   BENCH_SECONDS=5           seconds per measurement
set -euo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT="$BENCH_DIR/../target/bench"
mkdir -p "$OUT/pools"
read -ra POOLS <<<"${BENCH_POOLS:-4 8 16 32}"
for pool in "${POOLS[@]}"; do
  BENCH_POOL=$pool BENCH_WORKLOADS=new BENCH_COMMITS=on BENCH_MAX_ROWS=0 BENCH_LIMITS=limit BENCH_WRITES=0 \
    BENCH_PROCESSOR=${BENCH_PROCESSOR:-http} BENCH_SECONDS=${BENCH_SECONDS:-5} \
    bash "$BENCH_DIR/bench.sh" >/dev/null
  cp "$OUT/bench.json" "$OUT/pools/pool-$pool.json"
done
python3 - "$OUT" "${POOLS[@]}" <<'PY'
import json, sys
out, pools = sys.argv[1], sys.argv[2:]
runs = {p: json.load(open(f"{out}/pools/pool-{p}.json")) for p in pools}
lines = ["New keys, durable commits (fsync on, synchronous_commit=on), each pool size after its own "
         "limit; req/s and p99 ms, ratio to the limit in parentheses.", "",
         "| pool | mode | " + " | ".join(f"c={r['concurrency']}" for r in runs[pools[0]]["results"]
                                         if r["processor"] == runs[pools[0]]["results"][0]["processor"]) + " |"]
lines.append("|---:|---|" + "---:|" * (len(lines[-1].split("|")) - 4))
for p in pools:
    by_mode = {}
    for r in runs[p]["results"]:
        by_mode.setdefault(r["processor"], []).append(r)
    for mode, results in by_mode.items():
        cells = [f"{r['idempay']['rps']:,.0f} ({r['ratio']['rps']:.2f}×), p99 {r['idempay']['p99_ms']:.1f} "
                 f"(limit {r['limit']['p99_ms']:.1f})" for r in results]
        lines.append(f"| {p} | {mode} | " + " | ".join(cells) + " |")
text = "\n".join(lines)
open(f"{out}/pools.md", "w").write(text + "\n")
print(text)
PY
