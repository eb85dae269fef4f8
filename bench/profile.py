"""Summarizes `perf script` output of idempay: the share of samples by component, the hottest
functions, and the folded stacks for a flame graph.

Usage: perf script | python3 profile.py FOLDED_OUT WRK_JSON > profile.md
"""

import collections
import json
import re
import sys

# Components, by the first pattern that a frame's symbol (or, for "kernel", its object) matches.
# Each sample is charged to the component of the innermost frame that matches one: self time by
# component, which adds up to 100 %.
COMPONENTS = [
    ("kernel: sockets, scheduling, interrupts", "dso", r"kernel|vmlinux"),
    ("allocation (malloc, free)", "symbol", r"^(_int_malloc|_int_free|malloc|free|__libc_(malloc|free|calloc|realloc)|__GI___libc_free|unlink_chunk|tcache_|malloc_consolidate|cfree|realloc|calloc|sysmalloc)"),
    ("memory copies (memcpy, memmove)", "symbol", r"mem(cpy|move|set|cmp)"),
    ("sqlx: PostgreSQL protocol and pool", "symbol", r"sqlx_core|sqlx_postgres"),
    ("HTTP: hyper, axum, tower", "symbol", r"hyper::|hyper_util::|axum::|axum_core::|tower_http::|tower::|http::|httparse::"),
    ("serde_json", "symbol", r"serde_json::"),
    ("SHA-256", "symbol", r"sha2::|Sha256"),
    ("tracing", "symbol", r"tracing::|tracing_core::|tracing_subscriber::"),
    ("metrics", "symbol", r"metrics::|metrics_exporter|metrics_util::|idempay::monitoring"),
    ("tokio: scheduler, timers, I/O driver", "symbol", r"tokio::"),
    ("idempay's own code", "symbol", r"idempay::"),
    ("other user space (std, libc, uuid, rand, ...)", "symbol", r"."),
]


def samples(stream):
    """Yields each sample's frames, leaf first, as (symbol, object) pairs."""
    frames = []
    for line in stream:
        line = line.rstrip("\n")
        if not line.strip():
            if frames:
                yield frames
            frames = []
            continue
        if line.startswith((" ", "\t")):
            parts = line.strip().split(" ", 1)
            rest = parts[1] if len(parts) > 1 else parts[0]
            match = re.match(r"^(.*?)\s+\(([^()]*)\)$", rest)
            symbol, dso = (match.group(1), match.group(2)) if match else (rest, "")
            symbol = re.sub(r"\+0x[0-9a-f]+$", "", symbol)
            frames.append((symbol, dso))
    if frames:
        yield frames


def component(frames):
    for symbol, dso in frames:
        for name, field, pattern in COMPONENTS[:-1]:
            if re.search(pattern, dso if field == "dso" else symbol):
                return name
    return COMPONENTS[-1][0]


def main():
    folded_out, wrk_json = sys.argv[1:3]
    total = 0
    by_component = collections.Counter()
    exclusive = collections.Counter()
    folded = collections.Counter()
    for frames in samples(sys.stdin):
        total += 1
        by_component[component(frames)] += 1
        exclusive[frames[0][0]] += 1
        names = [symbol.replace(";", ",") for symbol, _ in reversed(frames)]
        folded[";".join(names)] += 1
    with open(folded_out, "w") as out:
        for stack, count in folded.most_common():
            out.write(f"{stack} {count}\n")
    load = json.load(open(wrk_json))
    what = "new keys" if load.get("mode", "new") == "new" else "replays"
    print(f"# Where idempay's CPU goes for {what}\n")
    print(
        f"{total} samples of the server (perf, cpu-clock at 499 Hz) while wrk sent {what} at c=16: "
        f"{load['rps']:,.0f} req/s, p50 {load['p50_ms']:.2f} ms, p99 {load['p99_ms']:.2f} ms.\n"
    )
    print("| component (self time: each sample charged to its innermost known frame) | share |")
    print("|---|---:|")
    for name, count in by_component.most_common():
        print(f"| {name} | {100 * count / max(total, 1):.1f} % |")
    print("\n| hottest functions (self time) | share |")
    print("|---|---:|")
    for symbol, count in exclusive.most_common(15):
        shown = symbol if len(symbol) <= 110 else symbol[:107] + "..."
        print(f"| `{shown}` | {100 * count / max(total, 1):.1f} % |")


main()
