"""What many watchers over many tubes cost Redis and tubeq per job (issue 33 item 7): bench.run's
64x16 rows over 100 tubes with 8, 64 and 256 consumer connections (each watching all 100) and
their plain cycle, with Redis's commands per job by name from INFO commandstats.

    .venv/bin/python -m bench.probes.watchers_cost [--base REV] [--reps 2] [--consumers 64,256]

Per row and side: jobs/s, tubeq's and Redis's CPU us per job (/proc), puts acknowledged per job
completed (producers outrun consumers: each put is a script call of its own when every put goes
to another tube), script calls (FCALL) and the commands the scripts ran per job, by name. The
command counts hardly depend on the host's speed, only on how often a consumer had to wait and
how far the producers ran ahead, so they judge a change where the rates of a shared machine
cannot; each line also prints the load average and the CPU other processes used (``other``).
With ``--base REV`` the tubeq of ``REV`` runs too, interleaved, the order alternating. Loopback
only: each run starts its own redis-server and tubeq and stops them by PID;
every load is bounded by bench.run's window and time limit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.harness.loadgen import run_load
from bench.harness.machine import cpu_model
from bench.harness.servers import EVENTS_ON, Tubeq, snapshot_revision, snapshot_tubeq
from bench.run import FULL, MANY_TUBES_64_BASE, many_tube_rows, many_tubes_key

# Commands printed per row beside the totals: the ones whose count follows the waiters.
SHOWN = ("fcall", "smembers", "zadd", "zrem", "hincrby", "hsetnx", "hdel", "publish", "lpop",
         "rpush", "zrange", "sismember")


def measure(code_dir: Path, log_dir: Path, key: str) -> dict[str, Any]:
    row = next(r for r in many_tube_rows(FULL) if r.key == key)
    server = Tubeq(log_dir, code_dir=code_dir, flags=EVENTS_ON)
    try:
        server.start()
        spec = replace(row.spec, port=server.port, producer_port=server.producer_port)
        result = run_load(spec, server.pids, server.redis_url)
    finally:
        server.stop()
    redis = result.extra.get("redis", {})
    calls = {name: c for name, c, _ in redis.get("by_command", [])}
    cpu = {name: pct / 100 * 1e6 / result.jobs_per_s
           for name, pct in result.cpu_pct.items() if pct is not None and result.jobs_per_s}
    inner = redis.get("total_calls_per_job", 0.0) - redis.get("top_level_calls_per_job", 0.0)
    puts = result.puts_per_s / result.jobs_per_s if result.jobs_per_s else 0.0
    return {"rate": result.jobs_per_s, "ok": result.ok, "cpu_us": cpu, "calls": calls,
            "puts": puts,
            "inner": inner, "other": result.other_cores, "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.watchers_cost",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--base", default=None, help="also run the tubeq of this git revision")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--consumers", default="8,64,256",
                   help="comma-separated consumer counts (of 8, 64, 256)")
    p.add_argument("--no-plain", action="store_true", help="leave out the plain cycle row")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="watchers-cost-"))
    sides = {"new": snapshot_tubeq(work / "new")}
    if args.base:
        sides = {"base": snapshot_revision(args.base, work / "base"), **sides}
    keys = [] if args.no_plain else [MANY_TUBES_64_BASE]
    keys += [many_tubes_key(int(n)) for n in args.consumers.split(",") if n]
    print(f"CPU {cpu_model()}; {args.reps} interleaved repetitions", file=sys.stderr)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        for i, key in enumerate(keys):
            order = list(sides.items())
            if (rep + i) % 2:
                order.reverse()
            for side, code_dir in order:
                m = measure(code_dir, work / "logs", key)
                results.setdefault((key, side), []).append(m)
                shown = " ".join(f"{c} {m['calls'].get(c, 0):.2f}" for c in SHOWN
                                 if m["calls"].get(c))
                cpu = " ".join(f"{n} {v:.1f}" for n, v in m["cpu_us"].items())
                print(f"rep {rep} {key:<32} {side:<4} {m['rate']:>8,.0f} jobs/s ok={m['ok']} "
                      f"us/job {cpu} | puts/job {m['puts']:.2f} | inner cmds/job {m['inner']:.1f}: "
                      f"{shown} | "
                      f"load {m['load']:.2f} other {m['other']:.2f}", flush=True)
    print("\n| row | side | jobs/s median (min-max) | tubeq us/job | redis us/job | puts/job | "
          "script calls/job | commands in scripts/job |\n|---|---|---|---|---|---|---|---|")
    for (key, side), ms in results.items():
        rates = [m["rate"] for m in ms]

        def med(values: list[float]) -> float:
            return statistics.median(values) if values else float("nan")

        print(f"| {key} | {side} | {med(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | "
              f"{med([m['cpu_us'].get('tubeq', 0) for m in ms]):.1f} | "
              f"{med([m['cpu_us'].get('redis', 0) for m in ms]):.1f} | "
              f"{med([m['puts'] for m in ms]):.2f} | "
              f"{med([m['calls'].get('fcall', 0) for m in ms]):.2f} | "
              f"{med([m['inner'] for m in ms]):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
