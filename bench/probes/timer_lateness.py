"""How late the scheduler's wake-up comes: the event loop's own timer (what asyncio.timeout
arms on uvloop) against tubeq.server.fine_timer.FineTimer, on the same loop, alternating.

    .venv/bin/python -m bench.probes.timer_lateness [--sleeps 1500] [--reps 2]

Each sleep is a random 0.5-3 ms (the gaps between due instants of the delayed row at 1000
jobs/s); lateness = when the waiter resumed - the instant asked for, in ms (negative: early,
which costs the scheduler a sweep that finds nothing due). Prints p50/p90/p99/max, the count of
early wake-ups and the CPU model. No server, no network; bounded by ``--sleeps``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time

import uvloop

from bench.harness.machine import cpu_model
from tubeq.server.fine_timer import FineTimer


async def lateness_ms(kind: str, sleeps: int, seed: int) -> list[float]:
    """``sleeps`` waits on the loop's timer (``kind`` "loop") or a FineTimer ("fine")."""
    woken = asyncio.Event()
    timer = FineTimer(woken.set) if kind == "fine" else None
    rng = random.Random(seed)
    late: list[float] = []
    try:
        for _ in range(sleeps):
            delay = rng.uniform(0.0005, 0.003)
            due = time.perf_counter() + delay
            woken.clear()
            if timer is not None:
                timer.arm(delay)
                await woken.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await woken.wait()
            late.append((time.perf_counter() - due) * 1000)
    finally:
        if timer is not None:
            timer.close()
    return sorted(late)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sleeps", type=int, default=1500)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    print(f"CPU {cpu_model()}; {args.sleeps} sleeps of 0.5-3 ms per line (ms)")
    for rep in range(args.reps):
        for kind in ("loop", "fine"):
            late = uvloop.run(lateness_ms(kind, args.sleeps, seed=rep))

            def q(p: float, late: list[float] = late) -> float:
                return late[int(p * (len(late) - 1))]

            early = sum(1 for x in late if x < 0)
            print(f"rep {rep} {kind:4s}  p50 {q(0.5):.3f}  p90 {q(0.9):.3f}  p99 {q(0.99):.3f}  "
                  f"max {late[-1]:.3f}  early {early}")


if __name__ == "__main__":
    main()
