"""EVALSHA calls/s through tubeq.redisio.client.RedisClient: N tasks, one connection, a
`return 1` script.

    python -m bench.probes.resp_throughput redis://127.0.0.1:PORT/0 [--tasks 64] [--seconds 3]
        [--flush-at 16] [--loop uvloop|asyncio]

(from the repository root; ``python bench/probes/resp_throughput.py`` also works once tubeq is
installed, e.g. by ``make``.)

Point it only at a Redis you own: it loads one script and runs it, nothing else. The figure
to compare is research/perf-baseline.md 3c, "raw conc(64 tasks) flush-at 16 put" (there the script
is put.lua, heavier than `return 1`).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from tubeq.redisio.client import RedisClient


async def measure(url: str, tasks: int, seconds: float, flush_at: int) -> tuple[float, float]:
    """Return (calls per second, Python CPU microseconds per call) over ``seconds``."""
    client = await RedisClient.connect(url, flush_at=flush_at)
    sha = await client.execute("SCRIPT", "LOAD", "return 1")
    assert isinstance(sha, bytes)
    done = 0
    running = True

    async def worker() -> None:
        nonlocal done
        while running:
            await client.call(b"EVALSHA", sha, 0)
            done += 1

    workers = [asyncio.create_task(worker()) for _ in range(tasks)]
    await asyncio.sleep(0.2)  # warm-up, not measured
    start_done, start_wall, start_cpu = done, time.perf_counter(), time.process_time()
    await asyncio.sleep(seconds)
    calls = done - start_done
    wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    running = False
    await asyncio.gather(*workers)
    await client.close()
    return calls / wall, cpu / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("url", help="redis://host:port/db of a Redis you own")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--flush-at", type=int, default=16)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()
    coro = measure(args.url, args.tasks, args.seconds, args.flush_at)
    if args.loop == "uvloop":
        import uvloop
        rate, cpu_us = uvloop.run(coro)
    else:
        rate, cpu_us = asyncio.run(coro)
    print(f"{rate:,.0f} EVALSHA calls/s ({args.tasks} tasks, flush_at={args.flush_at}, "
          f"{args.loop}, {args.seconds:g} s; Python CPU {cpu_us:.1f} us/call)")


if __name__ == "__main__":
    main()
