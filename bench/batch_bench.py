"""The batch rows of `make bench` (issue 10 batches), and a run of only them -> RESULTS-batches.md.

    .venv/bin/python -m bench.batch_bench            the batch rows, beanstalkd's reference
                                                     rows and the consume rows (~5 min)
    .venv/bin/python -m bench.batch_bench --quick    1 repetition, small counts

Owns: the rows (put-batch, reserve-batch and cycle-batch on tubeq, bench/batch_load.py; a
consume() worker deleting in batches, through bench/consume_bench.py's worker), their section
of the report, and bench/RESULTS-batches.md. bench/run.py runs the same rows inside `make
bench` and bench/report.py renders the same section there, where beanstalkd's reference rows
are the throughput rows it already ran. Ratios divide by beanstalkd's best pipelined put (put
rows) or cycle (reserve and cycle rows) of the same run, 100 B bodies.

The consume rows use consume_bench's worker as it is: Client.consume() with a handler that only
returns, so every job is deleted; since issue 10 those deletes leave as one delete-many per
connection and loop turn (pipelined deletes against beanstalkd). Its `Redis scripts/job` shows
what batching saves on tubeq (before: about 1 script call per job for the delete alone).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import report
from bench.loadgen import LoadSpec

if TYPE_CHECKING:
    from bench.run import Bench, Row, Scale

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_PATH = BENCH_DIR / "RESULTS-batches.md"
BODY = 100
# Jobs each reserve-batch run fills its tubes with first: enough for warm-up plus window at
# rates up to ~150k jobs/s (the run ends early, and says so, if the consumers drain them).
RESERVE_FILL = {"full": 200_000, "quick": 50_000}
# consume rows: one worker process of concurrency 256 (consume_bench's best single-worker shape)
CONSUME_SHAPES = (("tubeq push", 256, 1), ("tubeq reserve", 256, 1), ("beanstalkd", 256, 1))
CONSUME_JOBS = {"full": 30_000, "quick": 10_000}
# The pipelined single-job rows the ratios divide by, when this module runs on its own: on
# beanstalkd (the reference of issue 10) and on tubeq (what batching gains on tubeq itself).
REFERENCE_ROWS = ("put 64x16 100B", "put 8x16 100B", "cycle 64x16 100B", "cycle 8x16 100B")
RUN_SLACK_S = 30.0


def batch_rows(scale: Scale) -> list[Row]:
    """The tubeq batch rows: `mode connections x in-flight, batch size, body`."""
    from bench.run import Row

    # In flight: 3,200-4,000 jobs per row, more than beanstalkd's deepest single-job rows
    # (64x16 = 1,024), so a round trip's latency does not bound the rate.
    shapes = (("put-batch", 8, 4, 100), ("put-batch", 1, 4, 1000), ("reserve-batch", 8, 4, 100),
              ("cycle-batch", 8, 4, 100))
    rows = []
    for mode, conns, in_flight, batch in shapes:
        fill = mode == "reserve-batch"
        jobs = RESERVE_FILL.get(scale.name, RESERVE_FILL["quick"]) if fill else 2_000_000
        spec = LoadSpec(mode=mode, port=0, connections=conns, in_flight=in_flight,
                        body_size=BODY, batch=batch, jobs=jobs, seconds=scale.window_s,
                        warmup=scale.warmup_s,
                        time_limit=scale.warmup_s + scale.window_s + RUN_SLACK_S)
        rows.append(Row("batches", f"{mode} {conns}x{in_flight} b{batch} {BODY}B", spec,
                        ("tubeq",)))
    return rows


def reference_rows(scale: Scale) -> list[Row]:
    from bench.run import throughput_rows

    by_key = {r.key: r for r in throughput_rows(scale)}
    return [replace(by_key[key], servers=("beanstalkd", "tubeq")) for key in REFERENCE_ROWS]


def consume_runs(scale: Scale, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The consume rows, interleaved over ``scale.repetitions``; consume_bench's entries."""
    from bench import consume_bench as cb

    name = "full" if scale.name == "full" else "quick"
    base = cb.FULL if name == "full" else cb.QUICK
    c_scale = replace(base, repetitions=scale.repetitions, jobs=CONSUME_JOBS[name])
    bench = cb.Bench(c_scale, log)
    rows = [cb.ConsumeRow(target, concurrency, workers)
            for target, concurrency, workers in CONSUME_SHAPES]
    for rep in range(c_scale.repetitions):
        for row in rows if rep % 2 == 0 else list(reversed(rows)):
            bench.consume(row, rep)
    return bench.runs


# -- the report section ---------------------------------------------------------------------------

def _best(runs: report.Runs, results: dict[str, Any], prefix: str,
          server: str = "beanstalkd") -> tuple[float | None, str]:
    """The best median among ``server``'s single-job rows of ``prefix`` ("put ", "cycle ")."""
    keys = dict.fromkeys(r["row"] for r in results["runs"]
                         if r["server"] == server and r["row"].startswith(prefix)
                         and r["row"].endswith(f" {BODY}B") and r["scenario"] == "throughput")
    rates = {key: runs.rate(key, server) for key in keys}
    measured = {k: v for k, v in rates.items() if v}
    if not measured:
        return None, "n/a"
    key = max(measured, key=lambda k: measured[k])
    return measured[key], key


def section(results: dict[str, Any], runs: report.Runs) -> list[str]:
    """The batches section: each batch row against beanstalkd's best pipelined put / cycle."""
    keys = list(dict.fromkeys(r["row"] for r in results["runs"] if r["scenario"] == "batches"))
    consume = results.get("batches_consume") or []
    if not keys and not consume:
        return []
    best_put, put_key = _best(runs, results, "put ")
    best_cycle, cycle_key = _best(runs, results, "cycle ")
    own_put, own_put_key = _best(runs, results, "put ", "tubeq")
    own_cycle, own_cycle_key = _best(runs, results, "cycle ", "tubeq")
    lines = ["## Batches: put-many, reserve-many, delete-many (issue 10)", "",
             "tubeq only (beanstalkd has no batch commands). Rows are `mode connections x "
             "in-flight commands, b<jobs per command>, body` (bench/batch_load.py): "
             "`put-batch` counts a job at its INSERTED (latency: the put-many round trip); "
             "`reserve-batch` fills the tube first, then consumers keep reserve-many in flight "
             "and answer each batch with one delete-many, a job counts at its DELETED (latency: "
             "put -> RESERVED, so it includes the time queued); `cycle-batch` runs put-many "
             "producers and reserve-many consumers together (one reserve-many in flight per "
             "consumer, so no delete-many waits behind a waiting reserve-many). The ratio "
             "divides by beanstalkd's "
             f"best pipelined put ({report._rate(best_put)} jobs/s, `{put_key}`) for put rows "
             f"and best pipelined cycle ({report._rate(best_cycle)} jobs/s, `{cycle_key}`) for "
             "the others, same run; `/ tubeq single` divides by tubeq's own best single-job "
             f"row (put: {report._rate(own_put)} jobs/s, `{own_put_key}`; cycle: "
             f"{report._rate(own_cycle)} jobs/s, `{own_cycle_key}`): what batching gains.", ""]
    rows = []
    for key in keys:
        ref = best_put if key.startswith("put") else best_cycle
        own = own_put if key.startswith("put") else own_cycle
        lat = runs.latency(key, "tubeq")
        rows.append([key, runs.rate_cell(key, "tubeq"),
                     f"**{report._x(report._ratio(runs.rate(key, 'tubeq'), ref))}**",
                     report._x(report._ratio(runs.rate(key, "tubeq"), own)),
                     f"{report._ms(lat['p50_ms'])} / {report._ms(lat['p99_ms'])}",
                     runs.server_cpu_cell(key, "tubeq"),
                     report._rate(runs.us_per_job(key, "tubeq")),
                     runs.generator_cpu(key, "tubeq"),
                     report._noise(runs, key, ("tubeq",))])
    lines += report._table(["row", "tubeq jobs/s", "/ beanstalkd best", "/ tubeq single",
                            "latency p50 / p99 ms",
                            "CPU % tubeq / redis", "us/job", "gen CPU %", "other cores"], rows)
    if consume:
        lines += _consume_table(consume, best_cycle, cycle_key)
    return lines


def _consume_table(entries: list[dict[str, Any]], best_cycle: float | None,
                   cycle_key: str) -> list[str]:
    lines = ["consume() with batched deletes: one worker process, `Client.consume(tube, "
             "concurrency=256)`, a handler that only returns, on a pre-filled tube (bench/"
             "consume_bench.py's worker and clock: 90 % of the jobs). The deletes of the jobs "
             "finished in one loop turn leave as one delete-many per connection (tubeq) or as "
             "pipelined deletes (beanstalkd, which has no delete-many). Ratio: against "
             f"beanstalkd's best pipelined cycle ({report._rate(best_cycle)} jobs/s, "
             f"`{cycle_key}`).", ""]
    rows = []
    for key in dict.fromkeys(e["row"] for e in entries):
        ok = [e for e in entries if e["row"] == key and e.get("ok")]
        done = [e for e in entries if e["row"] == key]
        rates = [e["jobs_per_s"] for e in ok]
        cell = "n/a" if not rates else report._rate(report._median(rates))
        if len(rates) > 1:
            cell += f" ({report._rate(min(rates))}-{report._rate(max(rates))})"
        if len(ok) < len(done):
            cell += f", {len(done) - len(ok)} of {len(done)} runs failed"
        scripts = report._median((e.get("redis_scripts") or {}).get("calls_per_job")
                                 for e in ok)
        cpu = [(e.get("cpu_pct") or {}) for e in ok]
        server = " / ".join(report._pct(report._median(c.get(label) for c in cpu))
                            for label in (("beanstalkd",) if key.startswith("beanstalkd")
                                          else ("tubeq", "redis")))
        worker = report._pct(report._median((e.get("worker_cpu_pct") or [None])[0]
                                            for e in ok))
        other = report._median(e.get("other_cores") for e in done)
        ratio = report._ratio(report._median(rates), best_cycle)
        rows.append([key, cell, f"**{report._x(ratio)}**",
                     "-" if scripts is None else f"{scripts:.2f}", server, worker,
                     "n/a" if other is None else f"{other:.2f}"])
    return lines + report._table(["row", "jobs/s", "/ beanstalkd best cycle",
                                  "Redis script calls/job", "CPU % server (tubeq / redis)",
                                  "CPU % worker", "other cores"], rows)


# -- running only these rows ----------------------------------------------------------------------

def _machine_now() -> dict[str, str]:
    """uptime and lscpu's model name now (the machine is shared: figures come with both)."""
    def first(command: list[str], prefix: str = "") -> str:
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=10,
                                 check=False).stdout
        except OSError:
            return "n/a"
        lines = [line for line in out.splitlines() if line.strip().startswith(prefix)]
        return lines[0].split(":", 1)[1].strip() if prefix and lines else \
            (lines[0].strip() if lines else "n/a")

    return {"uptime": first(["uptime"]), "cpu_model": first(["lscpu"], "Model name")}


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = ["# Batches (issue 10): put-many, reserve-many, delete-many, consume()", "",
             f"Written by `python -m bench.batch_bench` (bench/batch_bench.py) on "
             f"{meta['started']} (UTC); the run took {meta['elapsed_s'] / 60:.1f} min. Scale "
             f"**{meta['scale']['name']}**: {meta['scale']['repetitions']} interleaved "
             f"repetition(s), windows of {meta['scale']['window_s']} s after "
             f"{meta['scale']['warmup_s']} s of warm-up. Only these rows and beanstalkd's "
             "reference rows ran (`make bench` runs them with the rest).", "",
             "**Shared machine**: these figures were taken while other work ran on the same "
             "2 cores (see `other cores` per row, and the load averages below); the integrator "
             "re-runs `make bench` on a quiet machine.", "",
             "| when | uptime (load averages) | CPU model (lscpu) |", "|---|---|---|",
             f"| start | {meta['before']['uptime']} | {meta['before']['cpu_model']} |",
             f"| end | {meta['after']['uptime']} | {meta['after']['cpu_model']} |", "",
             "| what | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in meta["machine"].items()]
    lines.append("")
    runs = report.Runs(results)
    lines += section(results, runs)
    ref_rows = [[key, runs.rate_cell(key, "beanstalkd"), runs.rate_cell(key, "tubeq"),
                 f"{runs.server_cpu_cell(key, 'beanstalkd')}; "
                 f"{runs.server_cpu_cell(key, 'tubeq')}",
                 report._noise(runs, key, ("beanstalkd", "tubeq"))] for key in REFERENCE_ROWS]
    lines += ["The single-job reference rows (bench/loadgen.py put and cycle modes), same run:", ""]
    lines += report._table(["row", "beanstalkd jobs/s", "tubeq jobs/s",
                            "CPU % beanstalkd; tubeq / redis", "other cores b / t"], ref_rows)
    if results.get("notes"):
        lines += ["## Notes", ""] + [f"* {note}" for note in results["notes"]] + [""]
    return "\n".join(lines).rstrip() + "\n"


def run(scale: Scale, output: Path) -> Path:
    from bench import run as bench_run

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    bench: Bench = bench_run.Bench(scale, log)
    bench_run.OUT_DIR.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    before = _machine_now()
    machine = bench_run.machine_and_versions()
    bench.code_dir = bench_run.snapshot_tubeq(bench.log_dir / "code")
    bench.interleaved([*batch_rows(scale), *reference_rows(scale)])
    consume = consume_runs(scale, log)
    results = {"meta": {"scale": {"name": scale.name, "repetitions": scale.repetitions,
                                  "window_s": scale.window_s, "warmup_s": scale.warmup_s},
                        "started": started.isoformat(timespec="seconds"),
                        "elapsed_s": round(bench.elapsed(), 1), "machine": machine,
                        "before": before, "after": _machine_now()},
               "runs": bench.runs, "batches_consume": consume, "notes": bench.notes}
    raw = bench_run.OUT_DIR / f"batches-{bench.stamp}.json"
    raw.write_text(json.dumps(results, indent=1))
    output.write_text(render(results))
    log(f"batch bench: done in {bench.elapsed() / 60:.1f} min; raw {raw}, report {output}")
    return output


def main(argv: list[str] | None = None) -> int:
    from bench import run as bench_run

    p = argparse.ArgumentParser(prog="python -m bench.batch_bench",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--quick", action="store_true", help="1 repetition, small counts")
    p.add_argument("--output", type=Path, default=None,
                   help="report path (default bench/RESULTS-batches.md; quick: bench/out/)")
    p.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                   help="only re-render a saved results file")
    args = p.parse_args(argv)
    output = args.output or (bench_run.OUT_DIR / "RESULTS-batches-quick.md" if args.quick
                             else RESULTS_PATH)
    if args.render is not None:
        output.write_text(render(json.loads(args.render.read_text())))
        return 0
    started = time.monotonic()
    run(bench_run.QUICK if args.quick else bench_run.FULL, output)
    print(f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
