"""Celery: ``task.delay()``, a worker with the threads pool (concurrency C), Redis broker only.

The app has a Redis broker and no result backend (``task_ignore_result``). Celery has no batch
enqueue (a ``group`` still sends one message per task, and its apply_async wants a result
backend), so the batched phase is not run: the report shows n/a. The worker is one process,
``celery worker --pool threads --concurrency C`` started in this process with
``worker_main``; gossip, mingle and heartbeats off (one worker has no peers); every other
setting Celery's default (acks on receipt, prefetch multiplier 4).

Request/reply (bench.peers.call): the app gets a Redis result backend (the broker's Redis); a
caller is ``echo.delay(payload).get(timeout=...)`` (the Redis backend waits on pub/sub, no
polling), one thread per caller, each with an app of its own (its own broker connection and
result consumer: Celery's result consumer is not shared between threads). The worker: as
above, a threads pool of concurrency C, results stored.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from celery import Celery

from bench.peers.call_common import (
    CALL_QUEUE,
    CALL_TIMEOUT_S,
    CallSettings,
    echo,
    phases_threads,
)
from bench.peers.common import QUEUE, Phase, Settings, Tally, wait_empty_sync, write

TALLY = Tally(0)


def _app(url: str) -> Celery:
    app = Celery("peers", broker=url)
    app.conf.update(task_ignore_result=True, task_default_queue=QUEUE,
                    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    return app


def _task(app: Celery) -> Any:
    @app.task(name="noop")
    def noop() -> None:
        TALLY.start()
        TALLY.done()
    return noop


def produce(settings: Settings) -> dict[str, Any]:
    app = _app(settings.url)
    noop = _task(app)
    with Phase(settings.single, "delay, awaited") as single:
        for _ in range(settings.single):
            noop.delay()
    if settings.batched:
        raise RuntimeError("Celery has no batch enqueue: run it with --batched 0")
    return {"single": single.result, "batched": None}


def consume(settings: Settings) -> dict[str, Any]:
    global TALLY
    TALLY = Tally(settings.total)
    deadline = settings.deadline
    app = _app(settings.url)
    _task(app)

    def remaining() -> dict[str, int]:
        with app.connection_for_write() as conn:
            client = conn.default_channel.client
            return {"queued": int(client.llen(QUEUE)), "unacked": int(client.hlen("unacked"))}

    def watch() -> None:
        # worker_main blocks this process's main thread until the worker exits; the result is
        # written from here, then the process ends (os._exit: the worker has no clean stop
        # that a thread can trigger without a remote-control broadcast).
        TALLY.finished.wait(max(0.0, deadline - time.monotonic()))
        if TALLY.finished.is_set():
            empty_at, counts = wait_empty_sync(remaining, deadline)
            write(settings, TALLY.result(empty_at, counts))
        else:
            write(settings, {"error": f"time limit: {TALLY.count} of {TALLY.target} jobs"})
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    app.worker_main(["worker", "--pool", "threads", "--concurrency", str(settings.concurrency),
                     "--without-gossip", "--without-mingle", "--without-heartbeat",
                     "--loglevel", "WARNING", "--queues", QUEUE])
    raise RuntimeError("the Celery worker exited before the jobs were processed")


# -- request/reply (bench.peers.call) -----------------------------------------------------------

def _call_app(url: str) -> tuple[Celery, Any]:
    app = Celery("calls", broker=url, backend=url)
    app.conf.update(task_default_queue=CALL_QUEUE, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False)

    @app.task(name="echo")
    def echo_task(payload: str) -> str:
        return echo(payload)

    return app, echo_task


def serve(settings: CallSettings) -> dict[str, Any]:
    deadline = settings.deadline
    app, _ = _call_app(settings.url)

    def watch() -> None:
        # As in consume(): worker_main holds the main thread; the orchestrator kills this
        # process by PID, and this ends it at the time limit if it has not.
        time.sleep(max(0.0, deadline - time.monotonic()))
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    app.worker_main(["worker", "--pool", "threads", "--concurrency", str(settings.concurrency),
                     "--without-gossip", "--without-mingle", "--without-heartbeat",
                     "--loglevel", "WARNING", "--queues", CALL_QUEUE])
    return {"stopped": "worker ended"}


def call(settings: CallSettings) -> dict[str, Any]:
    tasks = [_call_app(settings.url)[1] for _ in range(settings.callers)]

    def one(caller: int, request: str) -> str:
        answer: str = tasks[caller].delay(request).get(timeout=CALL_TIMEOUT_S)
        return answer

    return phases_threads(settings, one)
