"""The batch rows of `make bench` run on their own -> RESULTS-batches.md.

    .venv/bin/python -m bench.batch_bench            the batch rows, beanstalkd's reference
                                                     rows and the consume rows (~5 min)
    .venv/bin/python -m bench.batch_bench --quick    1 repetition, small counts

Owns: a run of only the batch rows (put-batch, reserve-batch and cycle-batch on tubeq,
bench/harness/batch_load.py; a consume() worker deleting in batches, bench/consume_bench.py's
worker) and of the single-job reference rows they are judged against, and
bench/RESULTS-batches.md. The rows themselves are bench/run.py's (`make bench` runs them with the
rest) and their section is bench/report.py's (RESULTS.md carries the same section, where
beanstalkd's reference rows are the throughput rows it already ran). Ratios divide by
beanstalkd's best pipelined put (put rows) or cycle (reserve and cycle rows) of the same run,
100 B bodies.

The consume rows use consume_bench's worker as it is: Client.consume() with a handler that only
returns, so every job is deleted; those deletes leave as one delete-many per
connection and loop turn (pipelined deletes against beanstalkd). Its `Redis scripts/job` shows
what batching saves on tubeq (before: about 1 script call per job for the delete alone).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness.bench import Row
from bench.harness.machine import machine_and_versions
from bench.harness.paths import BENCH_DIR, OUT_DIR
from bench.harness.servers import snapshot_tubeq
from bench.harness.summary import Runs, noise_cell, table
from bench.report import batches_section
from bench.run import FULL, QUICK, CoreBench, CoreScale, batch_rows, consume_runs, throughput_rows

RESULTS_PATH = BENCH_DIR / "RESULTS-batches.md"
# The pipelined single-job rows the ratios divide by, when this module runs on its own: on
# beanstalkd (the reference of issue 10) and on tubeq (what batching gains on tubeq itself).
REFERENCE_ROWS = ("put 64x16 100B", "put 8x16 100B", "cycle 64x16 100B", "cycle 8x16 100B")


def reference_rows(scale: CoreScale) -> list[Row]:
    by_key = {r.key: r for r in throughput_rows(scale)}
    return [replace(by_key[key], servers=("beanstalkd", "tubeq")) for key in REFERENCE_ROWS]


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
    runs = Runs(results)
    lines += batches_section(results, runs)
    ref_rows = [[key, runs.rate_cell(key, "beanstalkd"), runs.rate_cell(key, "tubeq"),
                 f"{runs.server_cpu_cell(key, 'beanstalkd')}; "
                 f"{runs.server_cpu_cell(key, 'tubeq')}",
                 noise_cell(runs, key, ("beanstalkd", "tubeq"))] for key in REFERENCE_ROWS]
    lines += ["The single-job reference rows (bench/harness/loadgen.py put and cycle modes), "
              "same run:", ""]
    lines += table(["row", "beanstalkd jobs/s", "tubeq jobs/s",
                    "CPU % beanstalkd; tubeq / redis", "other cores b / t"], ref_rows)
    if results.get("notes"):
        lines += ["## Notes", ""] + [f"* {note}" for note in results["notes"]] + [""]
    return "\n".join(lines).rstrip() + "\n"


def run(scale: CoreScale, output: Path) -> Path:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    bench = CoreBench(scale, log)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    before = _machine_now()
    machine = machine_and_versions()
    bench.code_dir = snapshot_tubeq(bench.log_dir / "code")
    bench.interleaved([*batch_rows(scale), *reference_rows(scale)])
    consume = consume_runs(scale, log)
    results = {"meta": {"scale": {"name": scale.name, "repetitions": scale.repetitions,
                                  "window_s": scale.window_s, "warmup_s": scale.warmup_s},
                        "started": started.isoformat(timespec="seconds"),
                        "elapsed_s": round(bench.elapsed(), 1), "machine": machine,
                        "before": before, "after": _machine_now()},
               "runs": bench.runs, "batches_consume": consume, "notes": bench.notes}
    raw = OUT_DIR / f"batches-{bench.stamp}.json"
    raw.write_text(json.dumps(results, indent=1))
    output.write_text(render(results))
    log(f"batch bench: done in {bench.elapsed() / 60:.1f} min; raw {raw}, report {output}")
    return output


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batch_bench",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--quick", action="store_true", help="1 repetition, small counts")
    p.add_argument("--output", type=Path, default=None,
                   help="report path (default bench/RESULTS-batches.md; quick: bench/out/)")
    p.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                   help="only re-render a saved results file")
    args = p.parse_args(argv)
    output = args.output or (OUT_DIR / "RESULTS-batches-quick.md" if args.quick
                             else RESULTS_PATH)
    if args.render is not None:
        output.write_text(render(json.loads(args.render.read_text())))
        return 0
    started = time.monotonic()
    run(QUICK if args.quick else FULL, output)
    print(f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
