"""A beanstalkd-protocol load generator: asyncio + uvloop, one Protocol per connection.

    python -m bench.harness.loadgen MODE --port PORT [options]      (from the repository root)

Modes (the method of the performance baseline, ../shared/research/perf-baseline.md section 1):
  put         N connections keep P puts in flight each; latency = the put round trip.
              With --tubes T > 1 (put and cycle) connection n of all processes uses tube
              `<tube>.<n mod T>` and only that one (in cycle, consumer n watches only it): the
              load spread over T tubes, each connection still on one tube (bench/cluster_bench.py).
  cycle       N producer + N consumer connections; a consumer keeps P reserve-with-timeout in
              flight and sends each delete in the same write as its next reserve; a job counts
              when DELETED arrives; latency = put sent -> RESERVED received (body timestamp).
  delayed     one producer puts at --rate jobs/s with a random delay of 0..--max-delay s (whole
              seconds: the protocol's unit); N consumers; latency = lateness, RESERVED received
              minus (put sent + delay).
  delayed-ms  delayed, with tubeq's put-with delay-ms: a random delay of 0..--max-delay s in
              whole milliseconds (tubeq only).
  wake        N consumers already blocked in reserve; one producer puts one job at a time, 1-3 ms
              after the previous one was delivered; latency = put sent -> RESERVED received.
              --producer-port sends the puts to another server process (tubeq on the same Redis
              and prefix) than the consumers' --port.
  many-tubes  cycle where producers `use` --tubes tubes round robin (a new tube every
              --puts-per-use puts) and every consumer watches all of them; with --procs K the
              K processes share those tubes (the only mode that does). --consumers N: N
              consumer connections (default: as many as producers).
  backlog     put --backlog jobs first (no latency), report memory per queued job (VmRSS of every
              --server-pid, Redis used_memory with --redis-url), then, unless --jobs 0, a cycle
              on the same tubes at the same priority (consumers drain the oldest jobs first).
  put-batch, reserve-batch, cycle-batch
              tubeq's put-many / reserve-many + delete-many, --batch jobs per command (tubeq
              only; bench/harness/batch_load.py says what each measures).

Every run is bounded: at most --jobs jobs, a measurement window of --seconds (after --warmup),
and a hard --time-limit after which it stops and reports failure. Only loopback addresses are
accepted. With --procs K the load is split over K generator processes, each on its own tubes
(`<tube>-<index>`; many-tubes and --tubes > 1 excepted); with several --port values generator
process i connects to the i-th (round robin: one process per tubeq of several). Each reports
its own CPU, so a generator at ~100 % of a core shows that the generator, not the server, was
the bottleneck. --server-pid label=PID (repeatable) adds those processes' CPU over the same
window, and ``other_cores`` is what the rest of the machine used.

Output: a human summary on stderr and, with --json, one JSON object on stdout (bench/run.py
reads it).

Every job body starts with a 19-digit CLOCK_MONOTONIC timestamp in ns and one delay digit, so any
process on this machine can compute a job's latency from its body alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import uvloop

from bench.harness import batch_load
from bench.harness.load_core import (
    BODY_HEADER,
    MS_DIGITS,
    MS_MARK,
    PRIORITY,
    RESERVE_TIMEOUT_S,
    TIMESTAMP_DIGITS,
    BeanstalkConnection,
    LoadSpec,
    Role,
    RunState,
    check_setup,
    latency_summary,
    put_command,
    put_ms_command,
)
from bench.harness.procstat import CpuSnapshot, CpuWindow, rss_bytes, watched_pids
from bench.harness.profiling import redis_per_job
from bench.harness.redisinfo import command_stats, redis_command, redis_info

MODES = ("put", "cycle", "delayed", "wake", "many-tubes", "backlog",
         "delayed-ms", "put-batch", "reserve-batch", "cycle-batch")  # batches: batch_load.py
MIN_BODY_SIZE = BODY_HEADER
# Connections are opened in groups of this size: tubeq's listen backlog is asyncio's 100.
CONNECT_GROUP = 32
# Bound on connecting and preparing (use/watch) all connections of one process.
SETUP_TIMEOUT_S = 60.0
# A generator process above this share of one core was (close to) the bottleneck itself.
GENERATOR_BOUND_PCT = 90.0
# The wake mode's pause between a delivery and the next put, drawn uniformly: long enough that
# every consumer is parked in the server again, short enough to keep runs brief.
WAKE_GAP_S = (0.001, 0.003)
# How long the wake producer waits for one delivery before counting the job as lost.
WAKE_DELIVERY_TIMEOUT_S = 2.0
# The paced producer (delayed mode) sends what is due every tick of this length.
PACE_TICK_S = 0.001
# Backlog fill: connections and puts in flight per connection (beanstalkd and Redis saturate
# well below this).
FILL_CONNECTIONS = 8
FILL_IN_FLIGHT = 64
LOOPBACK_PREFIX = "127."



class Producer(BeanstalkConnection):
    """Keeps ``in_flight`` puts outstanding; one new put per INSERTED.

    ``tubes``: the tubes it puts to, a new one every ``puts_per_use`` puts (round robin from
    ``first_tube``). ``completes``: a job is done at INSERTED (put mode). ``rtt``: keep the put
    round trip as the latency.
    """

    def __init__(self, state: RunState, tubes: Sequence[str], in_flight: int, body_size: int,
                 *, completes: bool, rtt: bool, puts_per_use: int = 1, first_tube: int = 0,
                 priority: int = PRIORITY) -> None:
        super().__init__(state)
        self.tubes = [t.encode() for t in tubes]
        self.in_flight = in_flight
        self.completes = completes
        self.rtt = rtt
        self.puts_per_use = puts_per_use
        self._tube_index = first_tube % len(self.tubes)
        self._puts_on_tube = 0
        self._make_put = put_command(body_size, priority=priority)
        self._sent_at: deque[float] = deque()

    async def prepare(self) -> None:
        replies = await self.request([b"use %s\r\n" % self.tubes[self._tube_index]])
        check_setup(replies, (b"USING",))

    def begin(self) -> None:
        self._send(self.in_flight, time.monotonic(), self._out)
        self.flush()

    def _send(self, count: int, now: float, out: list[bytes]) -> None:
        for _ in range(self.state.take(count)):
            if len(self.tubes) > 1:
                if self._puts_on_tube == self.puts_per_use:
                    self._tube_index = (self._tube_index + 1) % len(self.tubes)
                    self._puts_on_tube = 0
                    out.append(b"use %s\r\n" % self.tubes[self._tube_index])
                self._puts_on_tube += 1
            out.append(self._make_put())
            if self.rtt:
                self._sent_at.append(now)

    def on_line(self, line: bytes, now: float, out: list[bytes]) -> None:
        if line.startswith(b"USING"):
            return
        state = self.state
        sent = self._sent_at.popleft() if self.rtt else now
        if line.startswith(b"INSERTED"):
            if state.in_window(now):
                state.puts_counted += 1
                if self.rtt:
                    state.record_latency(now - sent)
            if self.completes:
                state.complete(now)
        else:
            state.error(f"put answered {line[:60]!r}")
        self._send(1, now, out)


class Consumer(BeanstalkConnection):
    """Keeps ``in_flight`` reserve-with-timeout outstanding; each RESERVED is answered with its
    delete and the next reserve in one write.

    ``completes_on``: b"DELETED" (cycle) or b"RESERVED" (delayed, wake). The latency kept is
    RESERVED received minus (timestamp in the body + the body's delay).
    """

    def __init__(self, state: RunState, watch: Sequence[str], in_flight: int,
                 *, completes_on: bytes, on_delivery: Callable[[], None] | None = None) -> None:
        super().__init__(state)
        self.watch = [t.encode() for t in watch]
        self.in_flight = in_flight
        self.completes_on_reserve = completes_on == b"RESERVED"
        self.on_delivery = on_delivery
        self._reserve = b"reserve-with-timeout %d\r\n" % RESERVE_TIMEOUT_S

    async def prepare(self) -> None:
        await self.watch_only(self.watch)

    def begin(self) -> None:
        self._out.extend([self._reserve] * self.in_flight)
        self.flush()

    def on_reserved(self, job_id: bytes, body: bytes, now: float, out: list[bytes]) -> None:
        state = self.state
        delay: float = body[TIMESTAMP_DIGITS] - 0x30
        if delay == MS_MARK - 0x30:  # delayed-ms: the delay in ms follows
            delay = int(body[BODY_HEADER:BODY_HEADER + MS_DIGITS]) / 1000
        if state.in_window(now):
            sent = int(body[:TIMESTAMP_DIGITS]) / 1e9
            state.record_latency(now - sent - delay, delayed=delay > 0)
        out.append(b"delete %s\r\n" % job_id)
        if not state.stopped:
            out.append(self._reserve)
        if self.completes_on_reserve:
            state.complete(now)
        if self.on_delivery is not None:
            self.on_delivery()

    def on_line(self, line: bytes, now: float, out: list[bytes]) -> None:
        if line == b"DELETED":
            if not self.completes_on_reserve:
                self.state.complete(now)
        elif line in (b"TIMED_OUT", b"DEADLINE_SOON"):
            if not self.state.stopped:
                out.append(self._reserve)
        else:
            self.state.error(f"reserve/delete answered {line[:60]!r}")


class DrivenProducer(BeanstalkConnection):
    """A producer on one tube whose puts come from a task of its own (:meth:`_drive`, started
    when the load begins and cancelled on close); every reply it gets must be INSERTED."""

    def __init__(self, state: RunState, tube: str) -> None:
        super().__init__(state)
        self.tube = tube.encode()
        self._task: asyncio.Task[None] | None = None

    async def prepare(self) -> None:
        check_setup(await self.request([b"use %s\r\n" % self.tube]), (b"USING",))

    def begin(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        raise NotImplementedError

    def on_line(self, line: bytes, now: float, out: list[bytes]) -> None:
        if not line.startswith(b"INSERTED"):
            self.state.error(f"put answered {line[:60]!r}")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        super().close()


class PacedProducer(DrivenProducer):
    """delayed mode: puts at ``rate`` jobs/s, each with a random delay of 0..``max_delay`` s."""

    def __init__(self, state: RunState, tube: str, rate: float, max_delay: int,
                 body_size: int) -> None:
        super().__init__(state, tube)
        self.rate = rate
        self._makers = [put_command(body_size, delay) for delay in range(max_delay + 1)]

    async def _drive(self) -> None:
        state, rng = self.state, self.state.rng()
        start, sent = time.monotonic(), 0
        while not state.stopped and state.budget > 0:
            due = int((time.monotonic() - start) * self.rate) - sent
            for _ in range(state.take(due)):
                self._out.append(rng.choice(self._makers)())
                sent += 1
            self.flush()
            await asyncio.sleep(PACE_TICK_S)


class PacedMsProducer(PacedProducer):
    """delayed-ms mode: as PacedProducer, each put a put-with delay-ms of 0..``max_delay`` s in
    whole milliseconds."""

    def __init__(self, state: RunState, tube: str, rate: float, max_delay: int,
                 body_size: int) -> None:
        super().__init__(state, tube, rate, 0, body_size)
        self._makers = [put_ms_command(body_size, ms) for ms in range(max_delay * 1000 + 1)]


class StepProducer(DrivenProducer):
    """wake mode: one put at a time, the next 1-3 ms after the previous one was delivered."""

    def __init__(self, state: RunState, tube: str, body_size: int) -> None:
        super().__init__(state, tube)
        self._make_put = put_command(body_size)
        self._delivered = asyncio.Event()

    def delivered(self) -> None:
        self._delivered.set()

    async def _drive(self) -> None:
        state, rng = self.state, self.state.rng()
        while not state.stopped and state.take(1):
            await asyncio.sleep(rng.uniform(*WAKE_GAP_S))
            self._delivered.clear()
            self._out.append(self._make_put())
            self.flush()
            try:
                await asyncio.wait_for(self._delivered.wait(), WAKE_DELIVERY_TIMEOUT_S)
            except TimeoutError:
                state.lost += 1
                state.error("a put was not delivered within "
                            f"{WAKE_DELIVERY_TIMEOUT_S} s to a blocked consumer")
                state.complete(time.monotonic())


# -- roles per mode ---------------------------------------------------------------------------

def build_roles(spec: LoadSpec, index: int, state: RunState) -> list[Role]:
    """The connections of generator process ``index`` for ``spec.mode``."""
    conns = spec.share(spec.connections, index)
    tube = spec.tube_of(index)
    port = spec.port_of(index)
    producer_port = spec.producer_port or port
    if spec.mode.endswith("-batch"):  # batches (issue 10): put-many, reserve-many, delete-many
        return batch_load.build_roles(spec, index, state)
    if spec.mode in ("put", "cycle"):
        before = sum(spec.share(spec.connections, j) for j in range(index))
        tubes = ([spec.spread_tube(before + i) for i in range(conns)] if spec.tubes > 1
                 else [tube] * conns)
    if spec.mode == "put":
        return [(Producer(state, [t], spec.in_flight, spec.body_size, completes=True,
                          rtt=True), port) for t in tubes]
    if spec.mode == "cycle":
        roles: list[Role] = [(Producer(state, [t], spec.in_flight, spec.body_size,
                                       completes=False, rtt=False), port) for t in tubes]
        roles += [(Consumer(state, [t], spec.in_flight, completes_on=b"DELETED"), port)
                  for t in tubes]
        return roles
    if spec.mode == "many-tubes":
        # One set of tubes for every generator process: each consumer watches all of them (the
        # scenario), and producer connection n of all starts at tube n * tubes / connections.
        tubes = [f"{spec.tube}.{k}" for k in range(spec.tubes)]
        before = sum(spec.share(spec.connections, j) for j in range(index))
        roles = [(Producer(state, tubes, spec.in_flight, spec.body_size, completes=False,
                           rtt=False, puts_per_use=spec.puts_per_use,
                           first_tube=(before + i) * spec.tubes // max(spec.connections, 1)),
                  port)
                 for i in range(conns)]
        consumers = spec.share(spec.consumers, index) if spec.consumers else conns
        roles += [(Consumer(state, tubes, spec.in_flight, completes_on=b"DELETED"), port)
                  for _ in range(consumers)]
        return roles
    if spec.mode in ("delayed", "delayed-ms"):
        paced = PacedProducer if spec.mode == "delayed" else PacedMsProducer
        roles = [(paced(state, tube, spec.rate / spec.procs, spec.max_delay, spec.body_size),
                  producer_port)]
        roles += [(Consumer(state, [tube], 1, completes_on=b"RESERVED"), port)
                  for _ in range(conns)]
        return roles
    if spec.mode == "wake":
        producer = StepProducer(state, tube, spec.body_size)
        roles = [(Consumer(state, [tube], 1, completes_on=b"RESERVED",
                           on_delivery=producer.delivered), port) for _ in range(conns)]
        return [*roles, (producer, producer_port)]
    raise ValueError(f"mode {spec.mode!r} has no roles of its own")


# -- one generator process --------------------------------------------------------------------

@dataclass
class ProcessResult:
    index: int
    pid: int
    jobs: int
    sent: int
    completed: int
    counted: int
    puts_counted: int
    first_completion: float | None
    last_completion: float | None
    latencies: list[float]
    later_latencies: list[float]
    errors: int
    error_samples: list[str]
    lost: int
    stop_reason: str
    cpu_seconds: float


def _factory(conn: BeanstalkConnection) -> Callable[[], BeanstalkConnection]:
    return lambda: conn


async def _generator(spec: LoadSpec, index: int,
                     pipe: multiprocessing.connection.Connection) -> ProcessResult:
    loop = asyncio.get_running_loop()
    jobs = spec.share(spec.jobs, index)
    state = RunState(spec, index, jobs)
    roles = build_roles(spec, index, state)
    async with asyncio.timeout(SETUP_TIMEOUT_S):
        for start in range(0, len(roles), CONNECT_GROUP):
            group = roles[start:start + CONNECT_GROUP]
            await asyncio.gather(*(loop.create_connection(_factory(conn), spec.host, port)
                                   for conn, port in group))
        await asyncio.gather(*(conn.prepare() for conn, _ in roles))
    if spec.mode == "wake":
        # Let every consumer's reserve reach the server and park before the first put.
        for conn, _ in roles:
            if isinstance(conn, Consumer):
                conn.begin()
        await asyncio.sleep(0.2)
    pipe.send(("ready", os.getpid()))
    message = pipe.recv()  # blocking on purpose: nothing runs before the go
    if message[0] != "go":
        raise RuntimeError("aborted by the coordinator")
    go_at: float = message[1]
    state.window_start = go_at + spec.warmup
    if spec.seconds is not None:
        state.window_end = state.window_start + spec.seconds
    cpu_start = time.process_time()
    await asyncio.sleep(max(0.0, go_at - time.monotonic()))
    for conn, _ in roles:
        if not (spec.mode == "wake" and isinstance(conn, Consumer)):
            conn.begin()
    if spec.seconds is not None:
        loop.call_later(state.window_end - time.monotonic(), state.stop, "window over")
    try:
        await asyncio.wait_for(asyncio.shield(state.finished),
                               go_at + spec.time_limit - time.monotonic())
    except TimeoutError:
        state.error(f"time limit of {spec.time_limit} s reached")
        state.stop("time limit")
    cpu_seconds = time.process_time() - cpu_start
    for conn, _ in roles:
        conn.close()
    await asyncio.sleep(0)
    return ProcessResult(
        index=index, pid=os.getpid(), jobs=jobs, sent=jobs - state.budget,
        completed=state.completed, counted=state.counted, puts_counted=state.puts_counted,
        first_completion=state.first_completion, last_completion=state.last_completion,
        latencies=state.latencies, later_latencies=state.later_latencies, errors=state.errors,
        error_samples=state.error_samples, lost=state.lost, stop_reason=state.stop_reason,
        cpu_seconds=cpu_seconds)


def _generator_main(spec: LoadSpec, index: int,
                    pipe: multiprocessing.connection.Connection) -> None:
    try:
        result = uvloop.run(_generator(spec, index, pipe))
        pipe.send(("result", result))
    except BaseException as exc:
        pipe.send(("error", f"generator {index}: {exc!r}"))
    finally:
        pipe.close()


# -- the coordinator ------------------------------------------------------------------------

@dataclass
class LoadResult:
    """A run's merged figures; ``ok`` is false on errors, a lost job or the time limit."""

    mode: str
    spec: dict[str, Any]
    ok: bool
    jobs_per_s: float
    puts_per_s: float  # INSERTED per second in the window (in cycles: what producers got)
    counted: int
    completed: int
    sent: int
    window_s: float
    latency: dict[str, float | int | None]
    later_latency: dict[str, float | int | None] | None
    cpu_pct: dict[str, float | None]
    generator_cpu_pct: list[float]
    generator_bound: bool
    other_cores: float
    errors: int
    error_samples: list[str]
    lost: int
    stop_reasons: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


def run_load(spec: LoadSpec, server_pids: dict[str, int],
             redis_url: str | None = None, node_urls: Sequence[str] = ()) -> LoadResult:
    """Run ``spec`` in ``spec.procs`` generator processes; CPU of ``server_pids`` (label -> PID)
    and of the generators is taken over the measurement window. With ``redis_url`` (a private
    Redis the caller started) its INFO commandstats are reset when the window starts and read
    when it ends: ``extra["redis"]`` is Redis's command time per job counted in the window.
    ``node_urls`` (several Redis, e.g. a cluster's nodes) likewise, each on its own:
    ``extra["redis_nodes"]`` maps each URL to its figures per job."""
    context = multiprocessing.get_context("fork")
    pipes: list[multiprocessing.connection.Connection] = []
    processes: list[multiprocessing.process.BaseProcess] = []
    for index in range(spec.procs):
        ours, theirs = context.Pipe()
        process = context.Process(target=_generator_main, args=(spec, index, theirs), daemon=True)
        process.start()
        theirs.close()
        pipes.append(ours)
        processes.append(process)
    try:
        return _coordinate(spec, server_pids, pipes, processes, redis_url, node_urls)
    finally:
        for child in processes:
            child.join(5.0)
            if child.is_alive():
                child.kill()  # our own child, by its PID
                child.join(5.0)


def _receive(pipe: multiprocessing.connection.Connection, timeout: float) -> tuple[str, Any]:
    if not pipe.poll(max(0.0, timeout)):
        raise TimeoutError("a generator process did not answer in time")
    kind, payload = pipe.recv()
    if kind == "error":
        raise RuntimeError(payload)
    return kind, payload


def _coordinate(spec: LoadSpec, server_pids: dict[str, int],
                pipes: list[multiprocessing.connection.Connection],
                processes: list[multiprocessing.process.BaseProcess],
                redis_url: str | None = None, node_urls: Sequence[str] = ()) -> LoadResult:
    setup_deadline = time.monotonic() + SETUP_TIMEOUT_S + 5
    for pipe in pipes:
        _receive(pipe, setup_deadline - time.monotonic())
    watched = watched_pids(server_pids, processes, "generator")
    go_at = time.monotonic() + 0.02
    for pipe in pipes:
        pipe.send(("go", go_at))
    window_start = go_at + spec.warmup
    time.sleep(max(0.0, window_start - time.monotonic()))
    stats_urls = ([redis_url] if redis_url is not None else []) + list(node_urls)
    for url in stats_urls:
        redis_command(url, "CONFIG", "RESETSTAT")
    cpu_start = CpuSnapshot.take(watched)
    stats_by_url: dict[str, dict[str, dict[str, float]]] = {}
    hard_deadline = go_at + spec.time_limit + 10
    window_end = window_start + spec.seconds if spec.seconds is not None else hard_deadline
    results: dict[int, ProcessResult] = {}
    cpu_end: CpuSnapshot | None = None
    while len(results) < len(pipes):
        now = time.monotonic()
        if cpu_end is None and now >= window_end:
            cpu_end = CpuSnapshot.take(watched)
            stats_by_url = {url: command_stats(url) for url in stats_urls}
        if now >= hard_deadline:
            raise TimeoutError("generator processes did not report before the hard deadline")
        waiting = [p for i, p in enumerate(pipes) if i not in results]
        limit = (window_end if cpu_end is None else hard_deadline) - now
        ready = multiprocessing.connection.wait(waiting, timeout=max(0.0, min(limit, 0.5)))
        for ready_pipe in ready:
            assert isinstance(ready_pipe, multiprocessing.connection.Connection)
            _, result = _receive(ready_pipe, 1.0)
            results[pipes.index(ready_pipe)] = result
    if cpu_end is None:
        cpu_end = CpuSnapshot.take(watched)
        stats_by_url = {url: command_stats(url) for url in stats_urls}
    merged = _merge(spec, [results[i] for i in range(len(pipes))],
                    CpuWindow.between(cpu_start, cpu_end), window_start)
    if redis_url is not None:
        merged.extra["redis"] = redis_per_job(stats_by_url[redis_url], merged.counted)
    if node_urls:
        merged.extra["redis_nodes"] = {url: redis_per_job(stats_by_url[url], merged.counted)
                                       for url in node_urls}
    return merged


def _merge(spec: LoadSpec, parts: list[ProcessResult], cpu: CpuWindow,
           window_start: float) -> LoadResult:
    counted = sum(p.counted for p in parts)
    lasts = [p.last_completion for p in parts if p.last_completion is not None]
    exhausted = all(p.stop_reason == "jobs done" for p in parts)
    if spec.seconds is not None and not exhausted:
        window = spec.seconds
    else:
        window = (max(lasts) - window_start) if lasts else 0.0
    latencies = [v for p in parts for v in p.latencies]
    later = [v for p in parts for v in p.later_latencies]
    generator_pct = [cpu.percent_by_label.get(f"generator{p.index}") or 0.0 for p in parts]
    errors = sum(p.errors for p in parts)
    lost = sum(p.lost for p in parts)
    servers = {label: pct for label, pct in cpu.percent_by_label.items()
               if not label.startswith("generator") and label != "coordinator"}
    return LoadResult(
        mode=spec.mode, spec=asdict(spec), ok=errors == 0 and lost == 0,
        jobs_per_s=counted / window if window > 0 else 0.0,
        puts_per_s=sum(p.puts_counted for p in parts) / window if window > 0 else 0.0,
        counted=counted,
        completed=sum(p.completed for p in parts), sent=sum(p.sent for p in parts),
        window_s=round(window, 4), latency=latency_summary(latencies),
        later_latency=(latency_summary(later) if spec.mode in ("delayed", "delayed-ms")
                       else None),
        cpu_pct={k: None if v is None else round(v, 1) for k, v in servers.items()},
        generator_cpu_pct=[round(v, 1) for v in generator_pct],
        generator_bound=any(v >= GENERATOR_BOUND_PCT for v in generator_pct),
        other_cores=round(cpu.other_cores, 3), errors=errors,
        error_samples=[s for p in parts for s in p.error_samples][:5], lost=lost,
        stop_reasons=sorted({p.stop_reason for p in parts}))


# -- backlog: fill, memory, then a cycle on the same tubes ------------------------------------

def redis_memory(url: str) -> dict[str, int]:
    """used_memory and used_memory_rss from INFO memory of the Redis at ``url``."""
    info = redis_info(url, "memory")
    return {"used_memory": int(info["used_memory"]),
            "used_memory_rss": int(info["used_memory_rss"])}


def memory_snapshot(server_pids: dict[str, int], redis_url: str | None) -> dict[str, int]:
    snapshot = {f"rss:{label}": rss_bytes(pid) or 0 for label, pid in server_pids.items()}
    if redis_url is not None:
        snapshot.update({f"redis:{k}": v for k, v in redis_memory(redis_url).items()})
    return snapshot


def run_backlog(spec: LoadSpec, server_pids: dict[str, int],
                redis_url: str | None) -> LoadResult:
    """Queue ``spec.backlog`` jobs, report memory per job, then cycle on the same tubes."""
    before = memory_snapshot(server_pids, redis_url)
    fill_spec = replace(spec, mode="put", jobs=spec.backlog, seconds=None, warmup=0.0,
                        connections=max(FILL_CONNECTIONS, spec.procs), in_flight=FILL_IN_FLIGHT)
    fill = run_load(fill_spec, server_pids) if spec.backlog > 0 else None
    time.sleep(0.5)  # let allocator statistics settle after the burst
    after = memory_snapshot(server_pids, redis_url)
    per_job = {k: (after[k] - before[k]) / spec.backlog if spec.backlog else None for k in after}
    memory = {"before": before, "after": after, "bytes_per_job": per_job,
              "fill_jobs_per_s": fill.jobs_per_s if fill else None,
              "fill_ok": fill.ok if fill else True}
    if spec.jobs > 0:
        result = run_load(replace(spec, mode="cycle"), server_pids)
        result.mode = "backlog"
    else:
        result = LoadResult(
            mode="backlog", spec=asdict(spec), ok=fill.ok if fill else True, jobs_per_s=0.0,
            puts_per_s=0.0,
            counted=0, completed=0, sent=0, window_s=0.0, latency=latency_summary([]),
            later_latency=None, cpu_pct=fill.cpu_pct if fill else {},
            generator_cpu_pct=fill.generator_cpu_pct if fill else [],
            generator_bound=fill.generator_bound if fill else False,
            other_cores=fill.other_cores if fill else 0.0, errors=fill.errors if fill else 0,
            error_samples=fill.error_samples if fill else [], lost=0,
            stop_reasons=fill.stop_reasons if fill else [])
    result.extra["memory"] = memory
    return result


# -- command line -----------------------------------------------------------------------------

def _require_loopback(host: str) -> None:
    if not (host.startswith(LOOPBACK_PREFIX) or host in ("localhost", "::1")):
        raise SystemExit(f"refusing {host!r}: this load generator only targets loopback")


def _pid_label(text: str) -> tuple[str, int]:
    label, _, pid = text.partition("=")
    if not pid.isdigit():
        raise argparse.ArgumentTypeError(f"expected label=PID, got {text!r}")
    return label, int(pid)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.harness.loadgen",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("mode", choices=MODES)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, action="append",
                   help="repeat for several servers: generator process i uses the i-th")
    p.add_argument("--producer-port", type=int, default=None,
                   help="wake/delayed: send the puts to this port (default --port)")
    p.add_argument("-c", "--connections", type=int, default=8,
                   help="connections (cycle, many-tubes: producers, and as many consumers)")
    p.add_argument("-P", "--in-flight", type=int, default=1,
                   help="commands in flight per connection")
    p.add_argument("-b", "--body-size", type=int, default=100)
    p.add_argument("-n", "--jobs", type=int, default=100_000, help="at most this many jobs")
    p.add_argument("-s", "--seconds", type=float, default=None,
                   help="measurement window; default: until --jobs are done")
    p.add_argument("--warmup", type=float, default=0.0, help="seconds before the window")
    p.add_argument("--time-limit", type=float, default=60.0,
                   help="hard bound on the load; reaching it fails the run")
    p.add_argument("--procs", type=int, default=1, help="generator processes")
    p.add_argument("--tube", default="bench", help="tube name prefix")
    p.add_argument("--tubes", type=int, default=1,
                   help="many-tubes, and put/cycle: tubes (shared by all processes)")
    p.add_argument("--puts-per-use", type=int, default=1,
                   help="many-tubes: puts to one tube before the producer uses the next")
    p.add_argument("--consumers", type=int, default=0,
                   help="many-tubes: consumer connections (default: as many as --connections)")
    p.add_argument("--rate", type=float, default=1000.0, help="delayed: puts per second")
    p.add_argument("--max-delay", type=int, default=2, help="delayed: largest delay, seconds")
    p.add_argument("--backlog", type=int, default=0, help="backlog: jobs to queue first")
    p.add_argument("--server-pid", type=_pid_label, action="append", default=[],
                   metavar="LABEL=PID", help="also report this process's CPU (and RSS)")
    p.add_argument("--redis-url", default=None, help="backlog: report this Redis's memory")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=int, default=100,
                   help="batch modes: jobs per put-many / reserve-many (at most 1000)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    args = p.parse_args(argv)
    _require_loopback(args.host)
    if args.body_size < MIN_BODY_SIZE:
        p.error(f"--body-size must be at least {MIN_BODY_SIZE} (timestamp + delay digit)")
    if not 0 <= args.max_delay <= 9:
        p.error("--max-delay must be 0..9 (one digit in the body)")
    if min(args.connections, args.in_flight, args.procs, args.tubes, args.puts_per_use) < 1:
        p.error("counts must be at least 1")
    if args.connections < args.procs:
        p.error("--connections must be at least --procs")
    if args.consumers and args.consumers < args.procs:
        p.error("--consumers must be at least --procs")
    return args


def spec_from_args(args: argparse.Namespace) -> LoadSpec:
    return LoadSpec(
        mode=args.mode, host=args.host, port=args.port[0], producer_port=args.producer_port,
        ports=tuple(args.port) if len(args.port) > 1 else (),
        connections=args.connections, in_flight=args.in_flight, body_size=args.body_size,
        jobs=args.jobs, seconds=args.seconds, warmup=args.warmup, time_limit=args.time_limit,
        procs=args.procs, tube=args.tube, tubes=args.tubes, puts_per_use=args.puts_per_use,
        consumers=args.consumers, rate=args.rate, max_delay=args.max_delay,
        backlog=args.backlog, seed=args.seed, batch=args.batch)


def describe(result: LoadResult) -> str:
    lat = result.latency
    lines = [
        f"{result.mode}: {result.jobs_per_s:,.0f} jobs/s ({result.counted} jobs in "
        f"{result.window_s} s; puts acknowledged {result.puts_per_s:,.0f}/s), ok={result.ok}",
        f"  latency p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, max {lat['max_ms']} ms "
        f"(n={lat['n']})",
    ]
    if result.later_latency is not None:
        later = result.later_latency
        lines.append(f"  delay >= 1 s only: p50 {later['p50_ms']} ms, p99 {later['p99_ms']} ms,"
                     f" max {later['max_ms']} ms (n={later['n']})")
    lines.append(f"  CPU %: servers {result.cpu_pct}, generators {result.generator_cpu_pct}"
                 f"{' (GENERATOR-BOUND)' if result.generator_bound else ''}, "
                 f"other cores {result.other_cores}")
    if result.errors or result.lost:
        lines.append(f"  errors {result.errors} lost {result.lost}: {result.error_samples}")
    if "memory" in result.extra:
        per_job = result.extra["memory"]["bytes_per_job"]
        lines.append("  bytes per queued job: " + ", ".join(
            f"{k} {v:,.0f}" for k, v in per_job.items() if v is not None))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    spec = spec_from_args(args)
    server_pids = dict(args.server_pid)
    if spec.mode == "backlog":
        result = run_backlog(spec, server_pids, args.redis_url)
    else:
        result = run_load(spec, server_pids)
    print(describe(result), file=sys.stderr)
    if args.json:
        print(json.dumps(asdict(result)))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
