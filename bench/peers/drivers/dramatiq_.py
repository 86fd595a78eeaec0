"""Dramatiq: ``actor.send()``, ``Worker(worker_threads=C)``, Redis broker.

The broker is ``RedisBroker(url=...)`` with Dramatiq's default middleware (no results backend).
Dramatiq has no batch enqueue (``group`` sends one message per job), so the batched phase is not
run: the report shows n/a. The worker is one process with C worker threads, started in this
process as ``dramatiq --processes 1 --threads C`` would start it.
"""

from __future__ import annotations

import time
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers.common import QUEUE, Phase, Settings, Tally, wait_empty_sync

TALLY = Tally(0)


def _broker(url: str) -> tuple[RedisBroker, Any]:
    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name=QUEUE, broker=broker)
    def noop() -> None:
        TALLY.start()
        TALLY.done()

    return broker, noop


def produce(settings: Settings) -> dict[str, Any]:
    broker, noop = _broker(settings.url)
    with Phase(settings.single, "send, awaited") as single:
        for _ in range(settings.single):
            noop.send()
    if settings.batched:
        raise RuntimeError("Dramatiq has no batch enqueue: run it with --batched 0")
    broker.close()
    return {"single": single.result, "batched": None}


def consume(settings: Settings) -> dict[str, Any]:
    global TALLY
    TALLY = Tally(settings.total)
    deadline = settings.deadline
    broker, _ = _broker(settings.url)
    worker = dramatiq.Worker(broker, worker_threads=settings.concurrency)
    worker.start()

    def remaining() -> dict[str, int]:
        return {"queued and unacked": int(broker.do_qsize(QUEUE))}

    try:
        TALLY.finished.wait(max(0.0, deadline - time.monotonic()))
        if not TALLY.finished.is_set():
            raise RuntimeError(f"time limit: {TALLY.count} of {TALLY.target} jobs")
        empty_at, counts = wait_empty_sync(remaining, deadline)
    finally:
        worker.stop()
        broker.close()
    return TALLY.result(empty_at, counts)
