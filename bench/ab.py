"""A/B: the tubeq of a base revision against the working tree's, on make bench's rows, interleaved.

    .venv/bin/python -m bench.ab --base REV [--reps 3] [--only put,cycle] [--output FILE]
    .venv/bin/python -m bench.ab --base REV --only metrics     section 4c: metrics on and off

A change that touches the hot path is judged by this: both sides on one CPU, interleaved, in one
run (bench/README.md says why no other comparison counts).
Both versions run from snapshots of their ``tubeq/`` (the base one from ``git archive``), each
run on a fresh private Redis, with make bench's load generator, rows and windows. Every
repetition walks every row and runs both versions back to back, the order alternating, so a
noisy minute hurts both sides of a row alike. The table gives medians with min-max and
new / base; rows whose runs shared the machine (other processes >= 0.5 cores) are marked.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness.bench import Row
from bench.harness.loadgen import run_load
from bench.harness.machine import cpu_model
from bench.harness.paths import OUT_DIR, REPO_ROOT
from bench.harness.servers import make_server, snapshot_revision, snapshot_tubeq
from bench.run import (
    FULL,
    CoreBench,
    delayed_ms_row,
    delayed_row,
    many_tube_rows,
    metrics_rows,
    throughput_rows,
    wake_row,
)

SHARED_CORES = 0.5


def rows_for(only: list[str] | None) -> list[Row]:
    """make bench's rows; the metrics pass's rows (section 4c: the same load on tubeq with
    ``--metrics`` and without) only when ``only`` names them, each as two rows, one per
    server, so new / base of each and on / off of each side can be read off the table."""
    rows = [*throughput_rows(FULL), *many_tube_rows(FULL), delayed_row(FULL),
            delayed_ms_row(FULL), wake_row(FULL)]
    if only:
        rows = [r for r in rows if any(r.key.startswith(prefix) for prefix in only)]
        rows += [replace(r, key=f"{r.key} [{server.removeprefix('tubeq ')}]", servers=(server,))
                 for r in metrics_rows(FULL) for server in r.servers
                 if any(r.key.startswith(prefix) for prefix in only)]
    return rows


def measure(bench: CoreBench, row: Row, code_dir: Path) -> dict[str, Any]:
    kind = ("tubeq x2" if row.scenario == "wake"
            else row.servers[0] if row.scenario == "metrics" else "tubeq")
    server = make_server(kind, bench.log_dir, code_dir)
    try:
        server.start()
        quiet = bench.quiet()
        spec = replace(row.spec, port=server.port, producer_port=server.producer_port)
        result = run_load(spec, server.pids)
    finally:
        server.stop()
    # CPU per job of each server process (us): steadier than the rate on a machine whose
    # speed drifts, and what the CPU targets are set in.
    cpu = {name: pct / 100 * 1e6 / result.jobs_per_s
           for name, pct in result.cpu_pct.items() if pct is not None and result.jobs_per_s}
    return {"rate": result.jobs_per_s, "p99": result.latency["p99_ms"],
            "p50": result.latency["p50_ms"], "ok": result.ok,
            "other": max(quiet, result.other_cores or 0.0), "cpu_us": cpu}


def _cell(values: list[float], unit: str = "") -> str:
    if not values:
        return "n/a"
    fmt = ",.2f" if unit else ",.0f"
    return (f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"
            f"{unit}")


def render(results: dict[str, dict[str, list[dict[str, Any]]]], meta: dict[str, str]) -> str:
    lines = [f"# A/B: tubeq {meta['base']} (base) vs {meta['new']} (new)", "",
             f"{meta['started']} UTC, CPU {meta['cpu']}, {meta['reps']} interleaved "
             "repetitions per row, make bench's rows and windows (bench/ab.py). Cells: jobs/s "
             "median (min-max); delayed and wake rows: p99 latency in ms, and p50 on a "
             "row of its own.", "",
             "| row | base | new | new / base | shared |", "|---|---|---|---|---|"]
    for key, sides in results.items():
        latency_row = key.startswith(("delayed", "wake"))
        # A latency row's p50 too (a change can move the median within the p99's noise);
        # results written before it was recorded have none.
        for field in ("p99", "p50") if latency_row else ("rate",):
            base = [r[field] for r in sides["base"] if r["ok"] and r.get(field) is not None]
            new = [r[field] for r in sides["new"] if r["ok"] and r.get(field) is not None]
            ratio = (statistics.median(new) / statistics.median(base)
                     if base and new and statistics.median(base) else None)
            shared = any(r["other"] >= SHARED_CORES for side in sides.values() for r in side)
            unit = " ms" if latency_row else ""
            label = f"{key} (p50)" if field == "p50" else key
            lines.append(f"| {label} | {_cell(base, unit)} | {_cell(new, unit)} | "
                         f"{'n/a' if ratio is None else f'{ratio:.2f}x'} | "
                         f"{'shared' if shared else ''} |")
    lines += ["", "CPU per job, us (median over the repetitions; CPU of the process from /proc "
              "over the window / jobs counted in it):", "",
              "| row | process | base | new | new / base |", "|---|---|---|---|---|"]
    for key, sides in results.items():
        names = sorted({n for side in sides.values() for r in side for n in r.get("cpu_us", {})})
        for name in names:
            base = [r["cpu_us"][name] for r in sides["base"] if r["ok"] and name in r["cpu_us"]]
            new = [r["cpu_us"][name] for r in sides["new"] if r["ok"] and name in r["cpu_us"]]
            ratio = (statistics.median(new) / statistics.median(base)
                     if base and new and statistics.median(base) else None)
            lines.append(f"| {key} | {name} | {_cell(base, ' us')} | {_cell(new, ' us')} | "
                         f"{'n/a' if ratio is None else f'{ratio:.2f}x'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--base", required=True, help="git revision of the base tubeq")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated row key prefixes")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    bench = CoreBench(FULL, lambda message: print(message, file=sys.stderr, flush=True))
    stamp = bench.stamp
    work = OUT_DIR / f"ab-{stamp}"
    base_dir = snapshot_revision(args.base, work / "base")
    new_dir = snapshot_tubeq(work / "new")
    new_label = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO_ROOT,
                               capture_output=True, text=True).stdout.strip()
    rows = rows_for([s for s in args.only.split(",") if s])
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        r.key: {"base": [], "new": []} for r in rows}
    started = datetime.now(UTC).isoformat(timespec="seconds")
    for rep in range(args.reps):
        for i, row in enumerate(rows):
            order = [("base", base_dir), ("new", new_dir)]
            if (rep + i) % 2:
                order.reverse()
            for side, code_dir in order:
                measured = measure(bench, row, code_dir)
                results[row.key][side].append(measured)
                bench.log(f"[{bench.elapsed():6.0f}s] rep {rep} {row.key:<28} {side:<4} "
                          f"{measured['rate']:>9,.0f} jobs/s p99 {measured['p99']} ms "
                          f"other {measured['other']:.2f}")
    meta = {"base": args.base, "new": new_label, "started": started, "cpu": cpu_model(),
            "reps": str(args.reps)}
    text = render(results, meta)
    output = args.output or OUT_DIR / f"ab-{stamp}.md"
    output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
