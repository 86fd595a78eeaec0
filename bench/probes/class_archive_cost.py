"""What Spark's class archive saves a short pipeline run: ``tubeq-pipeline report`` of a small
archive in its own process, with the archive mapped and without it, interleaved.

    .venv/bin/python -m bench.probes.class_archive_cost [--events 1000] [--pairs 3]

A generated archive of EVENTS events (bench.pipeline_report_bench's generator); a first report
in a cache directory of the probe's own writes the class archive (tubeq.pipeline.class_archive)
and is shown apart; then PAIRS pairs of reports, one mapping the archive and one with
``TUBEQ_SPARK_CLASS_ARCHIVE=0``, the order alternating. Each report is the installed command on
``local[2]``, wall including Spark's start, and the CPU seconds of its process tree. Prints the
CPU model and the load average before each run. Bounded by PAIRS; the folders are removed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from bench import pipeline_report_bench as report_bench
from bench.harness.machine import cpu_model
from bench.pipeline_bench import private_cache
from tubeq.pipeline.class_archive import SWITCH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tubeq-class-archive-"))
    saved = os.environ.get(SWITCH)
    try:
        spark = report_bench.spark_session()
        report_bench.generate_archive(spark, args.events, work / "archive")
        spark.stop()  # type: ignore[attr-defined]
        print(f"CPU: {cpu_model()}; a report of {args.events:,} events, own process, "
              "local[2], wall with Spark's start (CPU-s of its tree; 1-min load before)")
        runs: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        with private_cache(work / "cache"):
            os.environ[SWITCH] = "1"
            load = os.getloadavg()[0]
            wall, cpu = report_bench.run_report(work / "archive", work / "first")
            print(f"first run, writes the archive: {wall:.1f} s ({cpu:.0f} CPU-s; {load:.1f})",
                  flush=True)
            for pair in range(args.pairs):
                for side in ("on", "off") if pair % 2 == 0 else ("off", "on"):
                    os.environ[SWITCH] = "1" if side == "on" else "0"
                    load = os.getloadavg()[0]
                    wall, cpu = report_bench.run_report(work / "archive", work / f"{side}{pair}")
                    runs[side].append((wall, cpu))
                    print(f"pair {pair}, archive {side}: {wall:.1f} s ({cpu:.0f} CPU-s; "
                          f"{load:.1f})", flush=True)
        for side, done in runs.items():
            walls = [w for w, _ in done]
            print(f"archive {side}: median {statistics.median(walls):.1f} s "
                  f"({min(walls):.1f}-{max(walls):.1f}), "
                  f"{statistics.median(c for _, c in done):.0f} CPU-s")
    finally:
        if saved is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = saved
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
