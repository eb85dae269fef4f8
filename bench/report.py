"""Arithmetic and tables for bench/bench.sh and bench/expiry.sh (standard library only).

  report.py pgbench-summary ...  one pgbench run: throughput from its output, latency percentiles
                                 from its per-transaction log
  report.py bench --dir D        target/bench/bench.json, bench.md and bench.svg from the raw runs
  report.py compare --dir D      compare.json and compare.md of bench/compare.sh: the working tree
                                 against another revision, round by round, and the median ratios
  report.py expiry --dir D       target/bench/expiry.json and expiry.md
  report.py check --dir D        exits 1, saying why, if a run of idempay had errors: answers that
                                 are not 2xx, socket errors, wrong replays (a replay where a new
                                 key was sent, or a new payment where a replay was due), or keys
                                 left in progress
"""

import argparse
import glob
import json
import math
import os
import re
import sys


def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(micros):
    micros.sort()
    ms = lambda v: round(v / 1000, 3)
    return {
        "p50_ms": ms(percentile(micros, 50)),
        "p90_ms": ms(percentile(micros, 90)),
        "p99_ms": ms(percentile(micros, 99)),
        "p999_ms": ms(percentile(micros, 99.9)),
        "max_ms": ms(micros[-1]) if micros else float("nan"),
        "mean_ms": ms(sum(micros) / len(micros)) if micros else float("nan"),
    }


def pgbench_summary(args):
    text = open(args.stdout).read()
    tps = re.search(r"^tps = ([0-9.]+) \(without initial connection time\)", text, re.M)
    processed = re.search(r"number of transactions actually processed: (\d+)", text)
    failed = re.search(r"number of failed transactions: (\d+)", text)
    duration = re.search(r"duration: (\d+) s", text)
    latencies, per_script, failures = [], {}, 0
    for path in glob.glob(args.log_prefix + ".*"):
        with open(path) as log:
            for line in log:
                fields = line.split()
                if len(fields) < 6:
                    continue
                if not fields[2].isdigit():  # "failed" or "skipped"
                    failures += 1
                    continue
                latency = int(fields[2])
                latencies.append(latency)
                per_script.setdefault(fields[3], []).append(latency)
    result = {
        "name": args.name,
        "connections": args.connections,
        "requests": int(processed.group(1)) if processed else len(latencies),
        "duration_s": float(duration.group(1)) if duration else None,
        "rps": float(tps.group(1)) if tps else None,
        "failed": (int(failed.group(1)) if failed else 0) + failures,
        "non_2xx": (int(failed.group(1)) if failed else 0) + failures,
        "machine_cpu_s": args.machine_cpu_s,
        "postgres_cpu_s": args.postgres_cpu_s,
    }
    result.update(latency_summary(latencies))
    if len(per_script) > 1:
        result["per_script"] = {
            script: dict(count=len(values), **latency_summary(values))
            for script, values in sorted(per_script.items())
        }
    result["loadavg"] = float(open("/proc/loadavg").read().split()[0])
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else round((values[mid - 1] + values[mid]) / 2, 2)


def load(path):
    with open(path) as f:
        return json.load(f)


def ratio(a, b):
    if a is None or b in (None, 0) or (isinstance(a, float) and math.isnan(a)):
        return None
    return round(a / b, 2)


def fmt(value, digits=2):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def bench(args):
    raw = os.path.join(args.dir, "raw")
    meta = load(os.path.join(raw, "meta.json"))
    results = []
    modes = meta.get("processor_modes", ["http"])
    # Rounds of the table by synchronous_commit: "on" (durable, the headline) runs are named
    # main-…, "off" runs async-….
    rounds = meta.get("synchronous_commit", ["on"])
    measure_rounds = meta.get("rounds", 1)
    for commits, workload, conns, rnd in (
        (c, w, n, r) for c in rounds for w in meta["workloads"] for n in meta["concurrency"]
        for r in range(1, measure_rounds + 1)
    ):
        prefix = "main" if commits == "on" else "async"
        # round 1 keeps the raw runs' old names, later rounds end in -rN
        name = f"{prefix}-{workload}-c{conns}" + (f"-r{rnd}" if rnd > 1 else "")
        # Each limit measured in this round (BENCH_LIMITS): "limit", idempay's schema and
        # statements done the straightforward way, and "seed", the seed's design.
        sides = {}
        for which in ("limit", "seed"):
            path = os.path.join(raw, f"{name}-{which}.json")
            sides[which] = load(path) if os.path.exists(path) else {}
            for part in ("machine", "postgres"):
                if sides[which].get("requests") and sides[which].get(f"{part}_cpu_s") is not None:
                    sides[which][f"{part}_cpu_us_per_request"] = round(
                        sides[which][f"{part}_cpu_s"] / sides[which]["requests"] * 1e6, 1
                    )
        limit, seed = sides["limit"], sides["seed"]
        for mode in modes:
            suffix = "" if mode == "http" else f"-{mode}"
            idem = load(os.path.join(raw, f"{name}-idempay{suffix}.json"))
            if idem.get("requests"):
                for part in ("server", "processor", "machine", "postgres"):
                    if idem.get(f"{part}_cpu_s") is not None:
                        idem[f"{part}_cpu_us_per_request"] = round(
                            idem[f"{part}_cpu_s"] / idem["requests"] * 1e6, 1
                        )
            results.append(
                {
                    "synchronous_commit": commits,
                    "workload": workload,
                    "concurrency": conns,
                    "processor": mode,
                    "round": rnd,
                    "limit": limit,
                    "seed": seed,
                    "idempay": idem,
                    "ratio": {
                        "rps": ratio(idem["rps"], limit.get("rps")),
                        "p50": ratio(idem["p50_ms"], limit.get("p50_ms")),
                        "p99": ratio(idem["p99_ms"], limit.get("p99_ms")),
                    },
                    "ratio_seed": {
                        "rps": ratio(idem["rps"], seed.get("rps")),
                        "p50": ratio(idem["p50_ms"], seed.get("p50_ms")),
                        "p99": ratio(idem["p99_ms"], seed.get("p99_ms")),
                    },
                }
            )
    # With several rounds: the median of each round's ratio, per measurement and mode.
    medians = []
    if measure_rounds > 1:
        groups = {}
        for r in results:
            key = (r["synchronous_commit"], r["workload"], r["concurrency"], r["processor"])
            groups.setdefault(key, []).append(r)
        for (commits, workload, conns, mode), rs in groups.items():
            entry = {"synchronous_commit": commits, "workload": workload, "concurrency": conns,
                     "processor": mode, "rounds": len(rs)}
            for k in ("rps", "p50", "p99"):
                values = [r["ratio"][k] for r in rs if r["ratio"][k] is not None]
                entry[f"{k}_ratios"] = values
                entry[f"{k}_median"] = median(values)
                values = [r["ratio_seed"][k] for r in rs if r["ratio_seed"][k] is not None]
                entry[f"{k}_seed_ratios"] = values
                entry[f"{k}_seed_median"] = median(values)
            entry["limit_p99_ms"] = [r["limit"].get("p99_ms") for r in rs]
            entry["seed_p99_ms"] = [r["seed"].get("p99_ms") for r in rs]
            entry["idempay_p99_ms"] = [r["idempay"]["p99_ms"] for r in rs]
            entry["flush_ms"] = [(r["limit"].get("wal_flush_ms_mean"), r["idempay"].get("wal_flush_ms_mean"))
                                 for r in rs]
            medians.append(entry)
    rss = []
    rss_path = os.path.join(raw, "rss.txt")
    if os.path.exists(rss_path):
        for line in open(rss_path):
            values = dict(re.findall(r"(VmRSS|VmHWM): (\d+)", line))
            if values:
                rss.append({k: int(v) for k, v in values.items()})
    rss_summary = {
        "samples": len(rss),
        "idle_rss_kb": meta.get("idle_rss_kb"),
        "max_vmrss_kb": max((r.get("VmRSS", 0) for r in rss), default=None),
        "vmhwm_kb": max((r.get("VmHWM", 0) for r in rss), default=None),
    }
    sizes = []
    for rows in meta.get("sizes", []):
        entry = {"rows": rows}
        for workload in ("new", "replay"):
            for side in ("limit", "idempay"):
                path = os.path.join(raw, f"size-{rows}-{workload}-{side}.json")
                if os.path.exists(path):
                    entry[f"{workload}_{side}"] = load(path)
        entry["actual_rows"] = meta.get("size_actual_rows", {}).get(str(rows))
        sizes.append(entry)
    cpu = cpu_summary(results)
    writes = writes_summary(raw, meta)
    report = {"meta": meta, "results": results, "medians": medians, "rss": rss_summary,
              "table_size": sizes, "cpu": cpu, "writes": writes}
    with open(os.path.join(args.dir, "bench.json"), "w") as out:
        json.dump(report, out, indent=1)

    loads = [r[side].get("loadavg") for r in results for side in ("limit", "idempay")]
    loads = [l for l in loads if l is not None]
    load_note = f", {min(loads)}–{max(loads)} after the measurements" if loads else ""
    md = []
    md.append(
        f"Run {meta['started']}, commit {meta['commit']}, {meta['cores']} cores shared by the load "
        f"generator, idempay and PostgreSQL (1-minute load average {meta.get('loadavg_before')} "
        f"before the run{load_note}); {meta['seconds']} s per measurement"
        f"{'' if measure_rounds == 1 else f', {measure_rounds} rounds of each (the limit and every mode, again)'}; idempay pool "
        f"{meta['pool_size']} connections{'' if meta['pool_configurable'] else ' (fixed)'}; "
        f"PostgreSQL `{meta['pg_opts']}`"
        + (f"; {meta['wal_prewarm_mb']} MB of WAL segments made before the first measurement "
           f"({meta.get('wal_files_after_prewarm')} files in pg_wal then, "
           f"{meta.get('wal_files_at_end')} at the end); a `CHECKPOINT` before each side of each "
           "measurement" if meta.get("wal_prewarm_mb") is not None else "")
        + "."
    )
    md.append("")
    md.append(
        f"Commits: fsync **{meta.get('fsync', '?')}**; the table is measured with "
        + " and then ".join(
            f"`synchronous_commit={c}`"
            + (" (durable: a commit waits for its WAL on disk, as production runs)" if c == "on"
               else " (a commit does not wait for the disk; shown for comparison)")
            for c in meta.get("synchronous_commit", ["on"])
        )
        + ", both sides alike; the table-size sweep with the first. The WAL's disk flushes "
        + f"{fmt(meta.get('fdatasync_per_s'), 0)} times per second (`pg_test_fsync`, fdatasync "
        + "of one 8 kB write)."
    )
    md.append("")
    transport = meta.get("pg_transport", "published")
    md.append(
        f"Transport to PostgreSQL: **{transport}** "
        + ("(`--network host`, PostgreSQL on 127.0.0.1, as production reaches it)"
           if transport == "host" else "(a published port, through Docker's userland proxy)")
        + (f"; pgbench `SELECT 1` at c=16: **{meta['select1_tps']:,.0f} tps**."
           if meta.get("select1_tps") else ".")
    )
    md.append("")
    if meta.get("two_hop"):
        md.append(
            "Path: **two hops**. For every new key idempay calls the processor over loopback HTTP "
            "with its own key: `http` is `idempay processor`, a process of its own, as production "
            "runs a second service; `embedded` is the same processor inside idempay's process (as "
            "`idempay dev` runs it). Both are measured after the same limit, which runs both "
            "services' SQL for one payment (the processor's five statements for the charge, then "
            "idempay's five), nothing in between. idempay's CPU is its own process's: in `http` "
            "mode the processor's is not in it, in `embedded` mode it is."
        )
        md.append("")
    if meta.get("baseline_bin"):
        md.append(
            f"Side by side: the modes `base-http` and `base-embedded` run "
            f"{meta.get('baseline_label') or meta['baseline_bin']} (idempay and its processor), "
            f"right after the same limit as this build's `http` and `embedded`."
        )
        md.append("")
    md.append(
        "Limits: pgbench running a payment's SQL (prepared), nothing in between. **limit** is "
        "idempay's own schema and statements done the straightforward way (`new_key.sql`, "
        "`replay.sql`); **seed** is the seed's design (`seed_new_key.sql`, `seed_replay.sql`): one key "
        "table (scope, idem_key, request_hash, status, response_code, response_body, expires_at, "
        "UNIQUE (scope, idem_key)) and the effect's, per hop `INSERT … ON CONFLICT DO NOTHING`, then "
        "`BEGIN`, the effect's `INSERT`, the key's `UPDATE`, `COMMIT`; a replay the one `SELECT` of "
        "the stored response. idempay: wrk over HTTP on loopback. Ratios are idempay / limit "
        "(throughput: higher is better; latency: lower is better)."
    )
    md.append("")
    md += both_limits_md(results, medians, meta)
    rows = []
    for r in results:
        lim, idem, rat = r["limit"], r["idempay"], r["ratio"]
        errors = idem.get("non_2xx", 0) + sum(idem.get("socket_errors", {}).values())
        rows.append(
            [
                r.get("synchronous_commit", "on"),
                r["workload"],
                r["concurrency"],
                r.get("processor", "http"),
                r.get("round", 1),
                fmt(lim.get("rps"), 0),
                fmt(lim.get("p50_ms")),
                fmt(lim.get("p99_ms")),
                fmt(idem["rps"], 0),
                fmt(idem["p50_ms"]),
                fmt(idem["p99_ms"]),
                fmt(rat["rps"]),
                fmt(rat["p50"]),
                fmt(rat["p99"]),
                fmt(idem.get("server_cpu_us_per_request"), 0),
                f"{fmt(lim.get('machine_cpu_us_per_request'), 0)} / "
                f"{fmt(idem.get('machine_cpu_us_per_request'), 0)}",
                f"{fmt(lim.get('postgres_cpu_us_per_request'), 0)} / "
                f"{fmt(idem.get('postgres_cpu_us_per_request'), 0)}",
                f"{fmt(lim.get('wal_flush_ms_mean'), 3)} / {fmt(idem.get('wal_flush_ms_mean'), 3)}",
                f"{100 * idem.get('replayed', 0) / max(idem.get('answers', 0), 1):.0f} %",
                f"{errors} / {lim.get('failed', 0)}",
            ]
        )
    md.append(
        md_table(
            [
                "synchronous_commit",
                "workload",
                "c",
                "processor",
                "round",
                "limit req/s",
                "limit p50 ms",
                "limit p99 ms",
                "idempay req/s",
                "idempay p50 ms",
                "idempay p99 ms",
                "req/s ratio",
                "p50 ratio",
                "p99 ratio",
                "idempay CPU µs/req",
                "machine CPU µs/req limit / idempay",
                "PostgreSQL CPU µs/req limit / idempay",
                "mean WAL flush ms limit / idempay",
                "replayed",
                "errors idempay / limit",
            ],
            rows,
        )
    )
    md.append("")
    if medians:
        md.append(
            f"Each measurement in {measure_rounds} rounds, each round the limit then every mode; "
            "the median of the rounds' ratios, and each round's:"
        )
        md.append("")
        md.append(
            md_table(
                ["synchronous_commit", "workload", "c", "processor", "req/s ratio (median)",
                 "p99 ratio (median)", "p99 ratio each round", "limit p99 ms each round",
                 "idempay p99 ms each round", "mean WAL flush ms each round, limit / idempay"],
                [
                    [m["synchronous_commit"], m["workload"], m["concurrency"], m["processor"],
                     fmt(m["rps_median"]), fmt(m["p99_median"]),
                     ", ".join(fmt(v) for v in m["p99_ratios"]),
                     ", ".join(fmt(v, 1) for v in m["limit_p99_ms"]),
                     ", ".join(fmt(v, 1) for v in m["idempay_p99_ms"]),
                     ", ".join(f"{fmt(a, 2)} / {fmt(b, 2)}" for a, b in m["flush_ms"])]
                    for m in medians
                ],
            )
        )
        md.append("")
    md += cpu_md(cpu)
    md += writes_md(writes)
    svg = os.path.join(args.dir, "bench.svg")
    write_svg(results, meta, svg)
    md.append(f"Req/s and p99 against concurrency: `{os.path.basename(svg)}`, beside this file.")
    md.append("")
    if rss_summary["max_vmrss_kb"]:
        md.append(
            f"idempay memory: idle RSS {fmt((rss_summary['idle_rss_kb'] or 0) / 1024, 1)} MiB; "
            f"under the c=64 runs VmRSS at most {fmt(rss_summary['max_vmrss_kb'] / 1024, 1)} MiB, "
            f"VmHWM {fmt(rss_summary['vmhwm_kb'] / 1024, 1)} MiB ({rss_summary['samples']} samples)."
        )
        md.append("")
    if sizes:
        md.append("Latency as the key table grows (c=16, completed keys seeded with SQL):")
        md.append("")
        size_rows = []
        for s in sizes:
            cells = [fmt(s["actual_rows"] or s["rows"])]
            for key in ("new_limit", "new_idempay", "replay_limit", "replay_idempay"):
                v = s.get(key)
                cells.append(
                    f"{fmt(v['rps'], 0)} / {fmt(v['p50_ms'])} / {fmt(v['p99_ms'])}" if v else "–"
                )
            size_rows.append(cells)
        md.append(
            md_table(
                [
                    "rows",
                    "new, limit (req/s / p50 / p99 ms)",
                    "new, idempay",
                    "replay, limit",
                    "replay, idempay",
                ],
                size_rows,
            )
        )
        md.append("")
    publish(md, os.path.join(args.dir, "bench.md"))


def side_names(results):
    """The sides of a run, in the order the report shows them: the limits, then idempay's modes."""
    names = [n for n in ("limit", "seed") if any(r[n] for r in results)]
    for r in results:
        if r["processor"] not in names:
            names.append(r["processor"])
    return names


def side_of(r, name):
    """One side of a result: a limit's run, or idempay's when name is a mode of it."""
    if name in ("limit", "seed"):
        return r[name]
    return r["idempay"] if r["processor"] == name else {}


def label(name):
    return {"limit": "limit", "seed": "seed limit"}.get(name, f"idempay `{name}`")


def durable_results(results):
    """The results of the table's first synchronous_commit setting (durable, when measured)."""
    if not results:
        return []
    first = results[0]["synchronous_commit"]
    return [r for r in results if r["synchronous_commit"] == first]


def by_measurement(results):
    """Results grouped by (synchronous_commit, workload, concurrency), in the order measured."""
    groups = {}
    for r in results:
        groups.setdefault((r["synchronous_commit"], r["workload"], r["concurrency"]), []).append(r)
    return groups


def median_of(results, name, key):
    """The median over rounds of one side's value (a limit's runs appear once per mode: each round's
    run counts once)."""
    seen, values = set(), []
    for r in results:
        side = side_of(r, name)
        if not side or (name in ("limit", "seed") and r["round"] in seen):
            continue
        seen.add(r["round"])
        if side.get(key) is not None:
            values.append(side[key])
    return median(values)


def both_limits_md(results, medians, meta):
    """The headline: idempay against each limit, req/s and p99, with the ratios to both."""
    limits = [n for n in ("limit", "seed") if any(r[n] for r in results)]
    if not limits:
        return []
    md = ["**idempay against both limits**, each round (req/s; p99 ms; ratios idempay / that limit):", ""]
    header = ["synchronous_commit", "workload", "c", "processor", "round"]
    for n in limits:
        header += [f"{label(n)} req/s", f"{label(n)} p99 ms"]
    header += ["idempay req/s", "idempay p99 ms"]
    for n in limits:
        header += [f"req/s ratio to {label(n)}", f"p99 ratio to {label(n)}"]
    rows = []
    for r in results:
        row = [r["synchronous_commit"], r["workload"], r["concurrency"], r["processor"], r["round"]]
        for n in limits:
            row += [fmt(r[n].get("rps"), 0), fmt(r[n].get("p99_ms"))]
        row += [fmt(r["idempay"]["rps"], 0), fmt(r["idempay"]["p99_ms"])]
        for n in limits:
            rat = r["ratio"] if n == "limit" else r["ratio_seed"]
            row += [f"**{fmt(rat['rps'])}**", fmt(rat["p99"])]
        rows.append(row)
    md += [md_table(header, rows), ""]
    if medians:
        md.append(f"The median of the {meta.get('rounds')} rounds' ratios:")
        md.append("")
        header = ["synchronous_commit", "workload", "c", "processor"]
        for n in limits:
            header += [f"req/s ratio to {label(n)}", f"p99 ratio to {label(n)}"]
        rows = []
        for m in medians:
            row = [m["synchronous_commit"], m["workload"], m["concurrency"], m["processor"]]
            for n in limits:
                k = "" if n == "limit" else "_seed"
                row += [f"**{fmt(m[f'rps{k}_median'])}** ({', '.join(fmt(v) for v in m[f'rps{k}_ratios'])})",
                        f"{fmt(m[f'p99{k}_median'])} ({', '.join(fmt(v) for v in m[f'p99{k}_ratios'])})"]
            rows.append(row)
        md += [md_table(header, rows), ""]
    return md


def cpu_summary(results):
    """µs of CPU per request of each process on each side, durable runs, median over rounds."""
    out = []
    for (commits, workload, conns), rs in by_measurement(durable_results(results)).items():
        for name in side_names(rs):
            entry = {"synchronous_commit": commits, "workload": workload, "concurrency": conns,
                     "side": name, "rps": median_of(rs, name, "rps")}
            for part in ("server", "processor", "postgres", "machine"):
                entry[part] = median_of(rs, name, f"{part}_cpu_us_per_request")
            if name in ("limit", "seed"):
                entry["server"] = entry["processor"] = None
            elif name.endswith("embedded"):
                entry["processor"] = None  # in idempay's own process
            parts = [entry[p] for p in ("server", "processor", "postgres") if entry[p] is not None]
            entry["rest"] = (round(entry["machine"] - sum(parts), 1)
                             if entry["machine"] is not None and parts else None)
            out.append(entry)
    return out


def cpu_md(cpu):
    if not cpu:
        return []
    md = [
        "**Where a request's CPU goes** (durable runs; µs of CPU per request, the median over "
        "rounds): idempay's and the processor's from their processes (`/proc/<pid>/stat`), "
        "PostgreSQL's from its container's cgroup (every backend, the WAL writer, the "
        "checkpointer…), the machine's from `/proc/stat`; *rest* is the machine's less the ones "
        "named: the load generator (wrk or pgbench), the kernel's interrupts, and anything else "
        "running on the machine. In `embedded` mode the processor's CPU is in idempay's. Two cores "
        "give 2,000,000 µs per second: req/s × machine µs/req near that means the CPU is the wall.",
        "",
    ]
    rows = []
    for e in cpu:
        rows.append([e["workload"], e["concurrency"], label(e["side"]), fmt(e["rps"], 0),
                     fmt(e["server"], 0), fmt(e["processor"], 0), fmt(e["postgres"], 0),
                     fmt(e["rest"], 0), fmt(e["machine"], 0)])
    md += [md_table(["workload", "c", "side", "req/s", "idempay µs", "processor µs",
                     "PostgreSQL µs", "rest µs", "machine µs"], rows), ""]
    return md


def writes_summary(raw, meta):
    """Rows, index entries and WAL per payment on each side, from the snapshots of measure_writes."""
    sides = {}
    names = [f"writes-{n}" for n in meta.get("limits", ["limit"])]
    names += ["writes-idempay" + ("" if m == "http" else f"-{m}") for m in meta.get("processor_modes", [])]
    for name in names:
        path = os.path.join(raw, f"{name}.writes.json")
        if not os.path.exists(path):
            continue
        snap = load(path)
        before, after = snap["before"], snap["after"]
        side = name[len("writes-"):]
        side = side if side in ("limit", "seed") else (side[len("idempay-"):] if "-" in side else "http")
        tables = {}
        for table, a in (after.get("tables") or {}).items():
            b = (before.get("tables") or {}).get(table, {})
            delta = {k: a[k] - b.get(k, 0) for k in ("ins", "upd", "hot", "del")}
            if any(delta.values()):
                tables[table] = dict(delta, indexes=a["indexes"])
        effect = "seed.payments" if side == "seed" else "public.payments"
        payments = tables.get(effect, {}).get("ins", 0)
        per = (lambda v: round(v / payments, 2)) if payments else (lambda v: None)
        keys_name = "seed_keys" if side == "seed" else "keys"
        keys = {k: after[keys_name][k] - before[keys_name][k]
                for k in (after.get(keys_name) or {})} if after.get(keys_name) else {}
        index_entries = sum((t["ins"] + t["upd"] - t["hot"]) * t["indexes"] for t in tables.values())
        sides[side] = {
            "payments": payments,
            "tables": {t: {k: per(v) if k != "indexes" else v for k, v in d.items()}
                       for t, d in tables.items()},
            "keys": {k: per(v) for k, v in keys.items()},
            "index_entries_at_most": per(index_entries),
            "wal_bytes": per(snap["wal_lsn_bytes_at_end"] - before["wal_lsn_bytes"]),
            "wal_records": per(after["wal"]["records"] - before["wal"]["records"]),
            "wal_fpi": per(after["wal"]["fpi"] - before["wal"]["fpi"]),
            # pg_waldump --stats over the measurement: each kind of record, per payment
            "wal_by_kind": {kind: {k: per(v) for k, v in d.items()}
                            for kind, d in (snap.get("waldump") or {}).items() if d["records"]},
        }
    return sides


def writes_md(writes):
    if not writes:
        return []
    names = list(writes)
    md = [
        "**What a new payment writes**, each side alone for a few seconds at c=16 after the durable "
        "table, per payment: key rows by hop (counted in the table); each table's rows inserted / "
        "updated, of which HOT (`pg_stat_user_tables`; a HOT update writes no index entry), with the "
        "table's indexes; index entries written at most ((inserts + non-HOT updates) × indexes, "
        "partial indexes counted as full); the WAL written (bytes, records, full-page images: the "
        "first change of a page after a checkpoint, and a `CHECKPOINT` precedes each side, so a "
        "short measurement has more of them than a server that checkpoints every 30 minutes), and "
        "by kind of record (`pg_waldump --stats`; Heap and Btree are rows and index entries, "
        "Transaction the commits). A recovery point is columns of idempay's key row, written with "
        "it, not a row of its own.",
        "",
    ]
    rows = [["payments written"] + [fmt(writes[n]["payments"]) for n in names]]
    for key, what in (("idempay", "key rows, idempay's hop"), ("processor", "key rows, the processor's hop"),
                      ("recovery_points", "keys with a recovery point")):
        rows.append([what] + [fmt(writes[n]["keys"].get(key)) for n in names])
    tables = []
    for n in names:
        tables += [t for t in writes[n]["tables"] if t not in tables]
    for t in sorted(tables):
        indexes = next(writes[n]["tables"][t]["indexes"] for n in names if t in writes[n]["tables"])
        cells = []
        for n in names:
            d = writes[n]["tables"].get(t)
            cells.append("–" if not d else
                         f"{fmt(d['ins'])} / {fmt(d['upd'])} ({fmt(d['hot'])})"
                         + (f", {fmt(d['del'])} deleted" if d["del"] else ""))
        rows.append([f"`{t}` ({indexes} {'index' if indexes == 1 else 'indexes'}): inserted / updated (HOT)"] + cells)
    rows.append(["index entries, at most"] + [fmt(writes[n]["index_entries_at_most"]) for n in names])
    rows.append(["WAL bytes"] + [fmt(writes[n]["wal_bytes"], 0) for n in names])
    rows.append(["WAL records"] + [fmt(writes[n]["wal_records"], 1) for n in names])
    rows.append(["WAL full-page images"] + [fmt(writes[n]["wal_fpi"]) for n in names])
    kinds = []
    for n in names:
        kinds += [k for k in writes[n].get("wal_by_kind", {}) if k not in kinds]
    for kind in kinds:
        cells = []
        for n in names:
            d = writes[n].get("wal_by_kind", {}).get(kind)
            cells.append("–" if not d else f"{fmt(d['records'], 1)} / {fmt(d['record_bytes'], 0)} / "
                                           f"{fmt(d['fpi_bytes'], 0)}")
        rows.append([f"WAL, {kind} records: count / bytes / full-page image bytes"] + cells)
    if kinds:
        rows.append(["WAL bytes without full-page images"] + [
            fmt(sum(d["record_bytes"] or 0 for d in writes[n].get("wal_by_kind", {}).values()), 0)
            if writes[n].get("wal_by_kind") else "–" for n in names])
    md += [md_table(["per payment"] + [label(n) for n in names], rows), ""]
    return md


WORKLOAD_TITLES = {"new": "new keys", "replay": "replays", "mix": "50/50 mix"}
SVG_COLORS = {"limit": "#1f77b4", "seed": "#ff7f0e", "http": "#2ca02c", "embedded": "#d62728",
              "base-http": "#9467bd", "base-embedded": "#8c564b"}


def nice_ticks(top, count=5):
    """Round tick values from 0 to at least top."""
    if not top or top <= 0:
        return [0, 1]
    raw_step = top / count
    magnitude = 10 ** math.floor(math.log10(raw_step))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw_step)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def write_svg(results, meta, path):
    """req/s (linear) and p99 (logarithmic) against concurrency, one row of panels per workload,
    a line per side (both limits, idempay's modes), the median over rounds of the durable runs;
    hand-written SVG, so the bench needs nothing beyond the standard library."""
    rs = durable_results(results)
    groups = by_measurement(rs)
    workloads = list(dict.fromkeys(r["workload"] for r in rs))
    concurrency = list(dict.fromkeys(r["concurrency"] for r in rs))
    names = side_names(rs)
    if not workloads or not concurrency:
        return
    pw, ph, ml, mr, mt, mb, gap = 360, 220, 70, 20, 30, 45, 30
    legend_h = 30
    width = 2 * (ml + pw + mr) + gap
    height = 40 + legend_h + len(workloads) * (mt + ph + mb)
    esc = lambda t: t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">'
           + esc(f"idempay and both limits, commit {meta.get('commit')}, {meta.get('started')}, "
                 f"{meta.get('seconds')} s per measurement, synchronous_commit="
                 f"{rs[0]['synchronous_commit']}")
           + "</text>"]
    x = 10
    for n in names:
        out.append(f'<line x1="{x}" y1="46" x2="{x + 24}" y2="46" stroke="{SVG_COLORS.get(n, "#333")}" '
                   'stroke-width="2.5"/>')
        out.append(f'<text x="{x + 30}" y="50">{esc(label(n).replace("`", ""))}</text>')
        x += 40 + 8 * len(label(n))
    for row, workload in enumerate(workloads):
        top = 40 + legend_h + row * (mt + ph + mb) + mt
        for col, (key, title, log_scale) in enumerate((("rps", "req/s", False), ("p99_ms", "p99 ms", True))):
            left = col * (ml + pw + mr + gap) + ml
            series = {}
            for n in names:
                points = []
                for i, c in enumerate(concurrency):
                    v = median_of(groups.get((rs[0]["synchronous_commit"], workload, c), []), n, key)
                    if v is not None and v > 0:
                        points.append((i, v))
                if points:
                    series[n] = points
            values = [v for pts in series.values() for _, v in pts]
            if not values:
                continue
            if log_scale:
                lo = 10 ** math.floor(math.log10(min(values)))
                hi = 10 ** math.ceil(math.log10(max(values)))
                hi = hi * 10 if hi == lo else hi
                decades = int(round(math.log10(hi / lo)))
                # 1, 2 and 5 of each decade when there are few of them, so the scale can be read
                steps = (1, 2, 5) if decades <= 2 else (1,)
                ticks = [lo * 10 ** k * m for k in range(decades) for m in steps] + [hi]
                ypos = lambda v: top + ph - (math.log10(v / lo) / math.log10(hi / lo)) * ph
            else:
                ticks = nice_ticks(max(values) * 1.05)
                ypos = lambda v, t=ticks[-1]: top + ph - v / t * ph
            xpos = lambda i: left + (pw * (i + 0.5) / len(concurrency))
            out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
            out.append(f'<text x="{left + pw / 2}" y="{top - 8}" text-anchor="middle" font-weight="bold">'
                       f'{esc(WORKLOAD_TITLES.get(workload, workload))}: {title}{" (log scale)" if log_scale else ""}</text>')
            for t in ticks:
                y = ypos(t)
                out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#eee"/>')
                text = f"{t:,.0f}" if t >= 1 else f"{t:g}"
                out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{text}</text>')
            for i, c in enumerate(concurrency):
                out.append(f'<text x="{xpos(i):.1f}" y="{top + ph + 18}" text-anchor="middle">c={c}</text>')
            out.append(f'<text x="{left + pw / 2}" y="{top + ph + 36}" text-anchor="middle" fill="#555">'
                       'concurrent connections</text>')
            for n, pts in series.items():
                color = SVG_COLORS.get(n, "#333")
                coords = " ".join(f"{xpos(i):.1f},{ypos(v):.1f}" for i, v in pts)
                out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
                for i, v in pts:
                    out.append(f'<circle cx="{xpos(i):.1f}" cy="{ypos(v):.1f}" r="3" fill="{color}">'
                               f'<title>{esc(label(n).replace("`", ""))}, c={concurrency[i]}: '
                               f'{v:,.2f} {title}</title></circle>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def compare(args):
    """bench/compare.sh: the working tree against REV, each round's pair and the median ratios."""
    raw = os.path.join(args.dir, "raw")
    meta = load(os.path.join(raw, "meta.json"))
    per_request = lambda r, part: (round(r[f"{part}_cpu_s"] / r["requests"] * 1e6, 1)
                                   if r.get("requests") and r.get(f"{part}_cpu_s") is not None else None)
    measurements = []
    for workload in meta["workloads"]:
        for conns in meta["concurrency"]:
            rounds = []
            for rnd in range(1, meta["rounds"] + 1):
                sides = {}
                for side in ("tree", "base"):
                    r = load(os.path.join(raw, f"{workload}-c{conns}-r{rnd}-idempay-{side}.json"))
                    cpu = [per_request(r, p) for p in ("server", "processor")]
                    sides[side] = {k: r.get(k) for k in ("rps", "p50_ms", "p99_ms", "wal_flush_ms_mean")}
                    sides[side]["cpu_us_per_request"] = (round(sum(c for c in cpu if c is not None), 1)
                                                         if cpu[0] is not None else None)
                    sides[side]["postgres_cpu_us_per_request"] = per_request(r, "postgres")
                rounds.append({
                    "round": rnd, "first": "base" if rnd % 2 else "tree", **sides,
                    "rps_ratio": ratio(sides["tree"]["rps"], sides["base"]["rps"]),
                    "p99_ratio": ratio(sides["tree"]["p99_ms"], sides["base"]["p99_ms"]),
                })
            measurements.append({
                "workload": workload, "concurrency": conns, "rounds": rounds,
                "rps_ratio_median": median([r["rps_ratio"] for r in rounds]),
                "p99_ratio_median": median([r["p99_ratio"] for r in rounds]),
                "tree_rps_median": median([r["tree"]["rps"] for r in rounds]),
                "base_rps_median": median([r["base"]["rps"] for r in rounds]),
                "tree_cpu_median": median([r["tree"]["cpu_us_per_request"] for r in rounds]),
                "base_cpu_median": median([r["base"]["cpu_us_per_request"] for r in rounds]),
            })
    with open(os.path.join(args.dir, "compare.json"), "w") as out:
        json.dump({"meta": meta, "measurements": measurements}, out, indent=1)
    rev = meta["rev_commit"]
    md = [
        f"Run {meta['started']}: the working tree ({meta['tree']}) against {meta['rev']}"
        + ("" if meta["rev"] == rev else f" ({rev})") + ", "
        f"side by side in one run, {meta['rounds']} rounds, {meta['seconds']} s per measurement, "
        f"each build with its processor (`{meta['mode']}` mode) and a database of its own on one "
        f"PostgreSQL (fsync {meta['fsync']}, synchronous_commit {meta['synchronous_commit']}, "
        f"transport {meta['pg_transport']}, pgbench `SELECT 1` at c=16: {fmt(meta['select1_tps'], 0)} "
        f"tps; {fmt(meta.get('fdatasync_per_s'), 0)} fdatasync/s); pool {meta['pool_size']}; "
        f"{meta['cores']} cores, load average {meta['loadavg_before']} before the run. Each round "
        f"measures both one right after the other, {rev} first in odd rounds. Ratios are working "
        f"tree / {rev}.",
        "",
    ]
    rows = []
    for m in measurements:
        rs = m["rounds"]
        rows.append([
            m["workload"], m["concurrency"],
            ", ".join(fmt(r["base"]["rps"], 0) for r in rs),
            ", ".join(fmt(r["tree"]["rps"], 0) for r in rs),
            ", ".join(fmt(r["rps_ratio"]) for r in rs),
            f"**{fmt(m['rps_ratio_median'])}**",
            ", ".join(f"{fmt(r['base']['p99_ms'])} / {fmt(r['tree']['p99_ms'])}" for r in rs),
            fmt(m["p99_ratio_median"]),
            f"{fmt(m['base_cpu_median'], 0)} / {fmt(m['tree_cpu_median'], 0)}",
        ])
    md.append(md_table(
        ["workload", "c", f"{rev} req/s each round", "working tree req/s each round",
         "req/s ratio each round", "req/s ratio (median)", f"p99 ms each round, {rev} / working tree",
         "p99 ratio (median)", f"idempay + processor CPU µs/req (median), {rev} / working tree"],
        rows))
    md.append("")
    publish(md, os.path.join(args.dir, "compare.md"))


def publish(lines, path):
    """Writes the report's Markdown lines to `path` and prints them."""
    text = "\n".join(lines)
    with open(path, "w") as out:
        out.write(text)
    print(text)


def expiry(args):
    raw = os.path.join(args.dir, "raw")
    meta = load(os.path.join(raw, "expiry-meta.json"))
    base = load(os.path.join(raw, "expiry-baseline.json"))
    drain = load(os.path.join(raw, "expiry-drain.json"))
    # Deletions over time: "seconds_since_start deleted_total expired_left" lines.
    timeline = []
    for line in open(os.path.join(raw, "expiry-timeline.txt")):
        parts = line.split()
        if len(parts) == 3:
            timeline.append([float(parts[0]), int(parts[1]), int(parts[2]) if parts[2] != "-" else None])
    expired_before = meta["expired_before"]
    drain_seconds = meta.get("drain_seconds")
    rows_per_s = round(expired_before / drain_seconds) if drain_seconds else None
    # Rows per second while the load ran, from the deletion counter.
    load_window = [t for t in timeline if t[0] <= meta["load_seconds"]]
    during_load = None
    if len(load_window) >= 2:
        (t0, d0, _), (t1, d1, _) = load_window[0], load_window[-1]
        during_load = round((d1 - d0) / (t1 - t0)) if t1 > t0 else None
    after_window = [t for t in timeline if t[0] > meta["load_seconds"] + 1]
    after_load = None
    if len(after_window) >= 2:
        (t0, d0, _), (t1, d1, _) = after_window[0], after_window[-1]
        after_load = round((d1 - d0) / (t1 - t0)) if t1 > t0 else None
    plans = load(os.path.join(raw, "expiry-plans.json"))
    report = {
        "meta": meta,
        "baseline": base,
        "during_drain": drain,
        "ratio": {
            "p50": ratio(drain["p50_ms"], base["p50_ms"]),
            "p99": ratio(drain["p99_ms"], base["p99_ms"]),
            "rps": ratio(drain["rps"], base["rps"]),
        },
        "drain": {
            "expired_rows": expired_before,
            "seconds": drain_seconds,
            "rows_per_s": rows_per_s,
            "rows_per_s_during_load": during_load,
            "rows_per_s_after_load": after_load,
            "finished": meta.get("drain_finished"),
            "expired_left_at_end_of_load": meta.get("expired_left_after_load"),
            "timeline": timeline,
        },
        "plans": plans,
    }
    with open(os.path.join(args.dir, "expiry.json"), "w") as out:
        json.dump(report, out, indent=1)
    md = []
    md.append(
        f"Run {meta['started']}, commit {meta['commit']}, {meta['cores']} cores shared by wrk, "
        f"idempay and PostgreSQL. {fmt(meta['rows'])} keys seeded, {fmt(expired_before)} of them "
        f"expired; load: wrk c={meta['connections']}, 50 % new keys / 50 % replays, "
        f"{meta['load_seconds']} s per phase."
    )
    md.append("")
    rows = []
    for label, r in (("expiry job off", base), ("expiry job draining", drain)):
        errors = r.get("non_2xx", 0) + sum(r.get("socket_errors", {}).values())
        rows.append([label, fmt(r["rps"], 0), fmt(r["p50_ms"]), fmt(r["p99_ms"]), errors])
    rat = report["ratio"]
    rows.append(["ratio drain / off", fmt(rat["rps"]), fmt(rat["p50"]), fmt(rat["p99"]), ""])
    md.append(md_table(["phase", "req/s", "p50 ms", "p99 ms", "errors"], rows))
    md.append("")
    d = report["drain"]
    if d["seconds"]:
        md.append(
            f"Drain: {fmt(expired_before)} expired rows deleted in {fmt(d['seconds'], 1)} s, "
            f"{fmt(d['rows_per_s'])} rows/s overall"
            + (f", {fmt(during_load)} rows/s while the load ran" if during_load else "")
            + (f", {fmt(after_load)} rows/s after it" if after_load else "")
            + "."
        )
    else:
        md.append(
            f"Drain did not finish within the measurement: {fmt(d['expired_left_at_end_of_load'])} "
            f"expired rows left; {fmt(during_load)} rows/s while the load ran."
        )
    md.append("")
    for plan in plans:
        md.append(
            f"- {plan['name']}: {'index scan' if plan['index_scan'] else 'NO index scan'}"
            f"{', seq scan present' if plan['seq_scan'] else ''}"
            f" ({plan['summary']})"
        )
    md.append("")
    publish(md, os.path.join(args.dir, "expiry.md"))


def plans(args):
    """Reads EXPLAIN outputs (FILE NAME pairs) and writes a JSON list with scan types."""
    result = []
    for path, name in zip(args.files[::2], args.files[1::2]):
        text = open(path).read()
        nodes = re.findall(r"(Index Only Scan|Index Scan|Bitmap Index Scan|Seq Scan)(?: Backward)?(?: using (\S+))? on (\S+)", text)
        summary = ", ".join(
            f"{kind}{' using ' + index if index else ''} on {table}" for kind, index, table in nodes
        )
        execution = re.search(r"Execution Time: ([0-9.]+) ms", text)
        if execution:
            summary += f"; execution {execution.group(1)} ms"
        result.append(
            {
                "name": name,
                "index_scan": any(kind != "Seq Scan" for kind, _, _ in nodes),
                "seq_scan": any(kind == "Seq Scan" for kind, _, _ in nodes),
                "summary": summary,
                "plan": text,
            }
        )
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)


def run_errors(result):
    """What went wrong in one wrk run against idempay (its done() JSON): a list of reasons."""
    errors = []
    non_2xx = result.get("non_2xx", 0)
    if non_2xx:
        errors.append(
            f"{non_2xx} answers were not 2xx (first: {result.get('first_error', '')[:120]!r})"
        )
    sockets = {kind: n for kind, n in result.get("socket_errors", {}).items() if n}
    if sockets:
        errors.append(f"socket errors {sockets}")
    mode = result.get("mode")
    replayed, answers = result.get("replayed", 0), result.get("answers", 0)
    sent_replay, conns = result.get("sent_replay", 0), result.get("connections", 0)
    if mode == "new" and replayed:
        errors.append(f"{replayed} new keys were answered as replays")
    if mode == "replay" and replayed != answers:
        errors.append(f"{answers - replayed} of {answers} replays were not answered as replays")
    if mode == "mix":
        # Requests still in flight when wrk stops are sent but never answered: one per connection.
        if replayed > sent_replay:
            errors.append(f"{replayed} replays answered for {sent_replay} replays sent")
        elif sent_replay - replayed > conns:
            errors.append(f"only {replayed} replays answered for {sent_replay} replays sent")
    return errors


def check(args):
    """Fails the run if idempay answered a run with errors; the report is written before."""
    raw = os.path.join(args.dir, "raw")
    problems = []
    for path in sorted(glob.glob(os.path.join(raw, "*-idempay*.json"))):
        name = os.path.basename(path)[: -len(".json")]
        problems += [f"{name}: {error}" for error in run_errors(load(path))]
    meta_path = os.path.join(raw, "meta.json")
    if os.path.exists(meta_path):
        stuck = load(meta_path).get("keys_left_in_progress", 0)
        if stuck:
            problems.append(f"{stuck} keys left in progress after the runs")
    for problem in problems:
        print(f"bench: error: {problem}", file=sys.stderr)
    if problems:
        print(
            f"bench: FAILED: {len(problems)} errors in the runs above; the numbers do not count",
            file=sys.stderr,
        )
        return 1
    return 0


def stalls(args):
    """bench/stalls.sh: one pgbench run's worst seconds beside what PostgreSQL and the disk did."""
    import datetime
    per_second, latencies = {}, []
    for path in glob.glob(args.prefix + ".pgb.*"):
        for line in open(path):
            f = line.split()
            if len(f) >= 15:  # --aggregate-interval=1: second, count, sum, sum², min, max
                sec, count, worst = int(f[0]), int(f[1]), int(f[5])
                n, w = per_second.get(sec, (0, 0))
                per_second[sec] = (n + count, max(w, worst))
                continue
            if len(f) < 6 or not f[2].isdigit():
                continue
            lat, sec = int(f[2]), int(f[4])
            latencies.append(lat)
            n, worst = per_second.get(sec, (0, 0))
            per_second[sec] = (n + 1, max(worst, lat))
    samples = {}
    for line in open(args.prefix + ".seconds"):
        f = line.split()
        if len(f) == 11 and f[1] != "-":
            samples[int(f[0])] = [float(x) for x in f[1:]]
    waits = {}
    for line in open(args.prefix + ".waits"):
        f = line.split(" ", 1)
        if len(f) == 2 and f[0].isdigit():
            for w in f[1].strip().split(","):
                if w and w != "cpu" and w != "Client:ClientRead":
                    waits.setdefault(int(f[0]), {}).setdefault(w, 0)
                    waits[int(f[0])][w] += 1
    events = {}
    for line in open(args.prefix + ".pg.log"):
        m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\d+ UTC \[\d+\] LOG:  (.*)", line)
        if m and re.match(r"checkpoint|automatic (auto)?vacuum|automatic analyze", m.group(2)):
            t = int(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
                    .replace(tzinfo=datetime.timezone.utc).timestamp())
            events.setdefault(t, []).append(m.group(2)[:90])
    s = latency_summary(latencies)
    secs = sorted(per_second)
    times = sorted(samples)
    def delta(t, i):  # the change of sampled column i over second t (sample at t+1 minus at t)
        a = samples.get(t)
        b = samples.get(t + 1)
        return None if a is None or b is None else b[i] - a[i]
    walfiles = (samples[times[-1]][0] - samples[times[0]][0]) if times else None
    print(f"{args.label}: {sum(n for n, _ in per_second.values())} tx in {len(secs)} s, p50 {s['p50_ms']} p99 {s['p99_ms']} "
          f"max {s['max_ms']} ms; WAL files in pg_wal {fmt(samples[times[0]][0] if times else None, 0)}"
          f" -> {fmt(samples[times[-1]][0] if times else None, 0)}; "
          f"checkpoints {fmt(delta(times[0], 5) if False else (samples[times[-1]][5] - samples[times[0]][5]) if times else None, 0)}; "
          f"log events: {sum(len(v) for v in events.values())}")
    # Each second's mean WAL flush (sync time / syncs) and disk write time, for the 5 worst seconds
    # by latency and for the rest: a stall that is the disk's shows as slower flushes.
    rows = []
    for t in secs:
        a, b = samples.get(t - 1), samples.get(t)
        if a and b and b[2] > a[2]:
            rows.append((per_second[t][1], (b[3] - a[3]) / (b[2] - a[2]), b[9] - a[9], b[2] - a[2]))
    if len(rows) > 5:
        rows.sort(reverse=True)
        avg = lambda xs: sum(xs) / len(xs)
        worst, rest = rows[:5], rows[5:]
        print(f"  mean WAL flush (fdatasync): 5 worst seconds {avg([r[1] for r in worst]):.2f} ms "
              f"({avg([r[3] for r in worst]):.0f} flushes/s, disk busy writing "
              f"{avg([r[2] for r in worst]):.0f} ms/s), other {len(rest)} sampled seconds "
              f"{avg([r[1] for r in rest]):.2f} ms ({avg([r[3] for r in rest]):.0f}/s, "
              f"{avg([r[2] for r in rest]):.0f} ms/s)")
    print("  second  tx  worst_ms  walfiles+ wal_MB syncs sync_ms write_ms ckpt  hostDirtyMB hostWbMB disk_wr_ms  waits (50 ms samples) | log")
    slow = args.slow_ms * 1000
    for t in secs:
        n, worst = per_second[t]
        if worst < slow and not args.all:
            continue
        d = [delta(t - 1, i) for i in range(10)]  # the sample at t-1 .. t covers second t's end
        cur = samples.get(t)
        w = " ".join(f"{k}x{v}" for k, v in sorted(waits.get(t, {}).items(), key=lambda kv: -kv[1])[:4])
        ev = "; ".join(events.get(t, []) + events.get(t - 1, []))
        def c(v, digits=0, scale=1):
            return "–" if v is None else f"{v / scale:.{digits}f}"
        print(f"  {t % 100000:>6} {n:>4} {worst / 1000:>8.1f}  {c(d[0]):>8} {c(d[1], 1, 2**20):>6} "
              f"{c(d[2]):>5} {c(d[3], 1):>7} {c(d[4], 1):>8} {c(d[5]):>4}  "
              f"{c(cur[7] if cur else None, 0, 1024):>10} {c(cur[8] if cur else None, 0, 1024):>8} "
              f"{c(d[9]):>10}  {w} | {ev}")


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pgbench-summary")
    p.add_argument("--name", required=True)
    p.add_argument("--connections", type=int, required=True)
    p.add_argument("--stdout", required=True)
    p.add_argument("--log-prefix", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--machine-cpu-s", type=float, default=None)
    p.add_argument("--postgres-cpu-s", type=float, default=None)
    p.set_defaults(func=pgbench_summary)
    p = sub.add_parser("bench")
    p.add_argument("--dir", required=True)
    p.set_defaults(func=bench)
    p = sub.add_parser("compare")
    p.add_argument("--dir", required=True)
    p.set_defaults(func=compare)
    p = sub.add_parser("expiry")
    p.add_argument("--dir", required=True)
    p.set_defaults(func=expiry)
    p = sub.add_parser("check")
    p.add_argument("--dir", required=True)
    p.set_defaults(func=check)
    p = sub.add_parser("plans")
    p.add_argument("--out", required=True)
    p.add_argument("files", nargs="+")
    p.set_defaults(func=plans)
    p = sub.add_parser("stalls")
    p.add_argument("--prefix", required=True)
    p.add_argument("--label", default="")
    p.add_argument("--slow-ms", type=float, default=100)
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=stalls)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
