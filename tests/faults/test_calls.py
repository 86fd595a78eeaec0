"""Calls (request/reply, ``Client.call``) through faults. Callers on one tubeq process, a worker
(the bundled client's consumer, answering each job with its own body marked) on another, both
over one Redis; then (a) the worker's process is SIGKILLed and started again on its port, (b)
Redis is SIGKILLed and restarted from its append-only file, (c) the callers' process is stopped
for PAUSE_S (SIGSTOP) and resumed.

Expected, every time: every call ends with its result or a documented error (CallTimedOut;
InternalError while Redis is away, saying whether the put ran; a lost connection; a job that
ended otherwise would raise JobNotFinished, which none of these faults may cause), no later
than its timeout plus the client's REPLY_GRACE_S (plus scheduling slack); no result is ever
another job's; and every caller, each on a connection opened before the fault, gets results
again after it. The Redis restart found that a push connection whose loop met a failed store
call was never pushed a job again (tubeq.server.push: the loop now goes on).
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.faults.procs import start_tubeq_on
from tests.support.servers import ServerProcess, start_tubeq, unique_prefix
from tubeq.client import CallTimedOut, Client, ClientError, Job
from tubeq.client.ends import REPLY_GRACE_S
from tubeq.redisio.process import RedisProcess, free_port

CALLERS = 4
CALL_S = 3.0  # each call's timeout
SLACK_S = 1.0  # the test's own scheduling on two shared cores; never a performance figure
PHASE_S = 2.0
AFTER_S = 8.0  # bound on the recovery: every caller must get a result again within it
PAUSE_S = 5.0

pytestmark = pytest.mark.timeout(120)


@dataclass
class Calls:
    """What the callers saw: each call's outcome and duration, by caller."""

    started: float = field(default_factory=time.monotonic)
    fault_at: float | None = None
    # caller, outcome ("ok", "timed-out" or the error's class), when it began, how long it took
    outcomes: list[tuple[int, str, float, float]] = field(default_factory=list)

    def ok_after_fault(self, caller: int) -> bool:
        assert self.fault_at is not None
        return any(c == caller and kind == "ok" and began > self.fault_at
                   for c, kind, began, _ in self.outcomes)

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, kind, _, _ in self.outcomes:
            counts[kind] = counts.get(kind, 0) + 1
        return counts


async def _caller(index: int, address: tuple[str, int], tube: str, calls: Calls,
                  stop: asyncio.Event) -> None:
    async with Client(*address) as client:
        await client.use("default")  # connected before the fault
        number = 0
        while not stop.is_set():
            number += 1
            body = b"%d:%d:%s" % (index, number, secrets.token_hex(4).encode())
            began = time.monotonic()
            try:
                result = await client.call(tube, body, timeout=CALL_S)
            except CallTimedOut:
                kind = "timed-out"
            except ClientError as error:  # a connection lost or refused: told, not hung
                kind = type(error).__name__
                await asyncio.sleep(0.1)
            else:
                assert result == b"done " + body, (result, body)  # never another job's result
                kind = "ok"
            calls.outcomes.append((index, kind, began, time.monotonic() - began))


async def _worker(address: tuple[str, int], tube: str) -> None:
    async with Client(*address) as client:
        async def answer(job: Job) -> bytes:
            return b"done " + job.body

        await client.consume(tube, concurrency=8).run(answer)


@dataclass
class Scene:
    redis: RedisProcess
    callers_server: ServerProcess
    worker_server: ServerProcess
    tube: str = field(default_factory=lambda: f"calls-{secrets.token_hex(3)}")


async def _run_through(scene: Scene, fault: Callable[[], object], recover: Callable[[], object],
                       fault_s: float) -> Calls:
    calls, stop = Calls(), asyncio.Event()
    worker = asyncio.ensure_future(_worker(scene.worker_server.address, scene.tube))
    callers = [asyncio.ensure_future(_caller(i, scene.callers_server.address, scene.tube,
                                             calls, stop)) for i in range(CALLERS)]
    try:
        await asyncio.sleep(PHASE_S)
        assert calls.summary().get("ok", 0) > 0, calls.summary()
        calls.fault_at = time.monotonic()
        fault()
        await asyncio.sleep(fault_s)
        recover()
        deadline = time.monotonic() + AFTER_S
        while time.monotonic() < deadline and not all(
                calls.ok_after_fault(i) for i in range(CALLERS)):
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*callers), CALL_S + REPLY_GRACE_S + 5)
    finally:
        stop.set()
        for task in (*callers, worker):
            task.cancel()
        await asyncio.gather(*callers, worker, return_exceptions=True)
    print(f"calls through the fault: {calls.summary()}")
    for caller in range(CALLERS):  # the connections that were there before the fault
        assert calls.ok_after_fault(caller), f"caller {caller} got no result after the fault"
    bound = CALL_S + REPLY_GRACE_S + SLACK_S
    late = [(c, kind, round(took, 2)) for c, kind, _, took in calls.outcomes if took > bound]
    assert not late, f"calls past their timeout and grace ({bound} s): {late}"
    # documented errors: a call's own timeout; the server's INTERNAL_ERROR while Redis is away
    # (the put did not run, or may have: it says which); a lost connection
    unexpected = {k for k in calls.summary() if k not in ("ok", "timed-out", "InternalError",
                                                           "ClientConnectionError")}
    assert not unexpected, calls.summary()
    return calls


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    redis = RedisProcess(tmp_path / "redis", persistent=True, appendfsync="always")
    redis.start()
    yield redis
    redis.stop()


def _scene(redis: RedisProcess, tmp_path: Path) -> Scene:
    prefix = unique_prefix("tq-calls")
    callers = start_tubeq(redis.url, prefix, tmp_path / "logs", "tubeq-callers")
    worker = start_tubeq_on(free_port(), redis.url, prefix, tmp_path / "logs", "tubeq-worker")
    return Scene(redis, callers, worker)


async def test_calls_through_a_sigkill_of_the_workers_process(
        persistent_redis: RedisProcess, tmp_path: Path) -> None:
    scene = _scene(persistent_redis, tmp_path)
    restarted: list[ServerProcess] = []

    def kill() -> None:
        scene.worker_server.proc.kill()
        scene.worker_server.proc.wait()

    def restart() -> None:
        restarted.append(start_tubeq_on(scene.worker_server.port, persistent_redis.url,
                                        scene.worker_server.extra["prefix"], tmp_path / "logs",
                                        "tubeq-worker-again"))

    try:
        await _run_through(scene, kill, restart, 1.0)
    finally:
        for server in (scene.callers_server, scene.worker_server, *restarted):
            server.stop()


async def test_calls_through_a_redis_restart(persistent_redis: RedisProcess,
                                             tmp_path: Path) -> None:
    scene = _scene(persistent_redis, tmp_path)

    def kill() -> None:
        assert persistent_redis.proc is not None
        persistent_redis.proc.kill()
        persistent_redis.proc.wait()

    try:
        await _run_through(scene, kill, persistent_redis.start, 1.0)
    finally:
        scene.callers_server.stop()
        scene.worker_server.stop()


async def test_calls_through_a_pause_of_the_callers_process(redis: RedisProcess,
                                                            tmp_path: Path) -> None:
    scene = _scene(redis, tmp_path)
    paused = scene.callers_server
    try:
        await _run_through(scene, lambda: paused.send_signal(signal.SIGSTOP),
                           lambda: paused.send_signal(signal.SIGCONT), PAUSE_S)
    finally:
        paused.send_signal(signal.SIGCONT)  # never leave a stopped process behind
        scene.callers_server.stop()
        scene.worker_server.stop()
