"""RQ: ``Queue.enqueue``, ``Queue.enqueue_many``, ``SimpleWorker`` (burst).

Jobs are enqueued with ``result_ttl=0`` (RQ deletes a finished job at once: as BullMQ's
removeOnComplete). The batched phase is RQ's batch API, ``enqueue_many`` of ``chunk`` jobs
prepared with ``Queue.prepare_data`` (one Redis pipeline per call). The worker is a
``SimpleWorker`` (no fork per job) in burst mode: it stops when the queue is empty. RQ has no
concurrency within a worker: it runs one job at a time, whatever the other systems get.

Request/reply (bench.peers.call): a caller is ``job = queue.enqueue(echo, payload)`` then
``job.latest_result(timeout=...)`` (RQ >= 1.12: a blocking XREAD on the job's result stream, no
polling), one thread per caller, each with its own Redis client (a blocked read holds its
connection). Results are kept by RQ's default ``result_ttl``. The worker: one SimpleWorker, not
in burst mode, until killed: one job at a time.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from redis import Redis
from rq import Queue, SimpleWorker
from rq.registry import StartedJobRegistry

from bench.peers.call_common import (
    CALL_QUEUE,
    CALL_TIMEOUT_S,
    CallSettings,
    echo,
    phases_threads,
    serve_until,
)
from bench.peers.common import QUEUE, Phase, Settings, Tally, chunks, wait_empty_sync

TALLY = Tally(0)
FUNCTION = f"{__name__}.noop"


def noop() -> None:
    TALLY.start()
    TALLY.done()


def produce(settings: Settings) -> dict[str, Any]:
    queue = Queue(QUEUE, connection=Redis.from_url(settings.url))
    with Phase(settings.single, "enqueue, awaited") as single:
        for _ in range(settings.single):
            queue.enqueue(FUNCTION, result_ttl=0)
    with Phase(settings.batched, f"enqueue_many of {settings.chunk}") as batched:
        for size in chunks(settings.batched, settings.chunk):
            queue.enqueue_many([Queue.prepare_data(FUNCTION, result_ttl=0)
                                for _ in range(size)])
    return {"single": single.result, "batched": batched.result}


def consume(settings: Settings) -> dict[str, Any]:
    global TALLY
    TALLY = Tally(settings.total)
    deadline = settings.deadline
    redis = Redis.from_url(settings.url)
    queue = Queue(QUEUE, connection=redis)
    worker = SimpleWorker([queue], connection=redis)
    watcher = Redis.from_url(settings.url)
    watched_queue = Queue(QUEUE, connection=watcher)
    started = StartedJobRegistry(QUEUE, connection=watcher)
    seen: list[tuple[float | None, dict[str, int]]] = []

    def remaining() -> dict[str, int]:
        return {"queued": watched_queue.count, "started": started.count}

    def watch() -> None:
        # On a connection of its own, while the worker runs: the worker's own teardown after
        # its last job (up to ~1 s in burst mode) is not the queue's state.
        if TALLY.finished.wait(max(0.0, deadline - time.monotonic())):
            seen.append(wait_empty_sync(remaining, deadline))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    # Burst: the worker returns once the queue is empty; max_jobs bounds it in count.
    worker.work(burst=True, max_jobs=settings.total, logging_level="WARNING")
    if TALLY.finished.is_set():
        thread.join(max(0.0, deadline - time.monotonic()))
    if not seen:
        raise RuntimeError(f"time limit or early exit: {TALLY.count} of {TALLY.target} jobs")
    empty_at, counts = seen[0]
    return TALLY.result(empty_at, counts)


# -- request/reply (bench.peers.call) -----------------------------------------------------------

ECHO = f"{__name__}.echo_job"


def echo_job(payload: str) -> str:
    return echo(payload)


def serve(settings: CallSettings) -> dict[str, Any]:
    deadline = settings.deadline
    redis = Redis.from_url(settings.url)
    worker = SimpleWorker([Queue(CALL_QUEUE, connection=redis)], connection=redis)
    # RQ's work loop runs in the main thread (it installs signal handlers); the watcher ends
    # the process at the time limit if the orchestrator has not killed it before.
    thread = threading.Thread(target=lambda: _exit_at(deadline), daemon=True)
    thread.start()
    worker.work(burst=False, logging_level="WARNING")
    return {"stopped": "worker ended"}


def _exit_at(deadline: float) -> None:
    serve_until(deadline)
    os._exit(0)


def call(settings: CallSettings) -> dict[str, Any]:
    queues = [Queue(CALL_QUEUE, connection=Redis.from_url(settings.url))
              for _ in range(settings.callers)]

    def one(caller: int, request: str) -> str:
        job = queues[caller].enqueue(ECHO, request)
        result = job.latest_result(timeout=CALL_TIMEOUT_S)
        if result is None:
            raise TimeoutError(f"no result of job {job.id} in {CALL_TIMEOUT_S} s")
        if result.type != result.Type.SUCCESSFUL:
            raise RuntimeError(f"job {job.id}: {result.type}: {result.exc_string}")
        answer: str = result.return_value
        return answer

    return phases_threads(settings, one)
