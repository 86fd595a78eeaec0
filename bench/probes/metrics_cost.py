"""The CPU cost of the metrics hooks per command, measured in process (issue 12).

    .venv/bin/python -m bench.probes.metrics_cost

Times each hook the hot path calls with metrics on, many times over, in CPU time of this
process (``process_time``: time other tenants take from the core is not counted; the best of 5
runs is kept): a figure that swings far less with the machine's load than the throughput rows
of ``make bench`` do. Prints one line per hook and the total for the commands
of one put+reserve+delete cycle, with the CPU model.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from time import perf_counter

from bench.harness.machine import cpu_model
from tubeq.protocol import commands as c
from tubeq.server.metrics import Metrics, command_label

ROUNDS = 200_000


def per_call_ns(fn: Callable[[], object], rounds: int = ROUNDS) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.process_time_ns()
        for _ in range(rounds):
            fn()
        best = min(best, (time.process_time_ns() - start) / rounds)
    return best


async def futures_ns(m: Metrics | None, rounds: int = ROUNDS) -> float:
    """Per reply from Redis: a future resolved and its one done-callback run by the loop, as
    tubeq.server.connection does it: plain, or (``m``) through the partial that also tells the
    observer (outcome and slow-command timing)."""
    loop = asyncio.get_running_loop()
    reply = b"INSERTED 123456\r\n"
    label = command_label(c.Put)

    def reply_done(f: asyncio.Future[bytes]) -> None:
        pass  # stands for Connection._reply_done, which runs either way

    def observed(label: str, started: float, f: asyncio.Future[bytes]) -> None:
        assert m is not None
        m.finished("abc:1", label, started, f)
        reply_done(f)

    best = float("inf")
    for _ in range(5):
        start = time.process_time_ns()
        for _ in range(rounds // 1000):
            for _ in range(1000):
                f: asyncio.Future[bytes] = loop.create_future()
                if m is None:
                    f.add_done_callback(reply_done)
                else:
                    f.add_done_callback(functools.partial(observed, label, perf_counter()))
                f.set_result(reply)
            await asyncio.sleep(0)  # the done-callbacks run
        best = min(best, (time.process_time_ns() - start) / rounds)
    return best


async def measure() -> dict[str, float]:
    m = Metrics()
    reply = b"INSERTED 123456\r\n"
    label = command_label(c.Put)
    return {
        "answered (immediate reply)": per_call_ns(lambda: m.answered(label, reply)),
        "observed reply (from Redis)": await futures_ns(m) - await futures_ns(None),
        "command_label": per_call_ns(lambda: command_label(c.Put)),
        "job_reserved (wait histogram)": per_call_ns(lambda: m.job_reserved("default", 3)),
        "job_deleted (run histogram)": per_call_ns(lambda: m.job_deleted("default", 40)),
        "redis_round_trip (per batch)": per_call_ns(lambda: m.redis_round_trip(0.0004)),
    }


def main() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        figures = asyncio.run(measure())
    else:
        figures = uvloop.run(measure())  # as the server runs
    print(f"cpu: {cpu_model()}")
    for name, ns in figures.items():
        print(f"{name:<34} {ns:8.0f} ns")
    # put and delete: an observed reply each; reserve: answered when it answers.
    cycle = (2 * (figures["observed reply (from Redis)"] + figures["command_label"])
             + figures["answered (immediate reply)"]
             + figures["job_reserved (wait histogram)"] + figures["job_deleted (run histogram)"])
    print(f"{'one put+reserve+delete cycle':<34} {cycle:8.0f} ns")


if __name__ == "__main__":
    main()
