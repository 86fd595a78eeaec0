"""What one hop between two processes of this machine costs (bench.harness.hops), as a table:
python <-> python and python -> redis-server, free and both pinned to one CPU.

    .venv/bin/python -m bench.probes.hop_cost [--messages 20000] [--reps 3]

Each run is ``--messages`` round trips on one connection after a warm-up; the runs of the four
kinds are interleaved, ``--reps`` of each, and the table gives medians (min-max of the round
trip). The figures are what every round-trip-bound benchmark row stands on: read them with the
CPU model, and compare only within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from bench.harness.hops import measure
from bench.harness.machine import cpu_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.hop_cost")
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    rows: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    for rep in range(args.reps):
        for kind in ("python", "redis"):
            for pin in ((False, True) if rep % 2 == 0 else (True, False)):
                rows.setdefault((kind, pin), []).append(measure(kind, pin, args.messages))
    print(f"{cpu_model()}, {os.cpu_count()} CPUs; {args.messages} round trips a run, "
          f"{args.reps} runs interleaved; medians (min-max of the round trip)")
    print("| hop | CPUs | round trip us | CPU us per message: sender / peer |")
    print("|---|---|---|---|")
    for (kind, pin), runs in rows.items():
        rtts = [r[0] for r in runs]
        name = "python <-> python (uvloop, TCP)" if kind == "python" else \
            "python -> redis-server PING"
        print(f"| {name} | {'both on CPU 0' if pin else 'free'} | "
              f"{statistics.median(rtts):.1f} ({min(rtts):.1f}-{max(rtts):.1f}) | "
              f"{statistics.median(r[1] for r in runs):.1f} / "
              f"{statistics.median(r[2] for r in runs):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
