"""The job store: one typed method per Lua script, over the process's one Redis connection.

Methods do not await: each returns a future of its decoded result, so a connection can send the
commands a client pipelined without waiting for each other (the Redis client batches them per
loop tick). Calls keep their order on the one connection, which is what keeps a client's replies
in order. ``now`` (ms) comes from an injectable clock and is passed to every script.

Lifecycle events (:mod:`tubeq.events`) are written by the scripts themselves. Whether they are,
and the stream's cap, is fixed per Store: the scripts that write events get the cap and this
process's instance id as bound arguments (encoded once, see ``RedisClient.bind_script``), so
events cost no extra round trip and no per-call lookup.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from tubeq.futures import discard
from tubeq.keys import Keys
from tubeq.options import DEFAULTS, Options, OptionValue
from tubeq.resp import Decoder, RedisClient, Reply, ScriptCall
from tubeq.scripts import Script, load_all

Clock = Callable[[], int]
T = TypeVar("T")

# Scripts that sweep (promote, expire) move at most this many jobs per call, so one call never
# holds Redis's single thread for long; a sweep that hits the limit is called again at once.
SWEEP_LIMIT = 1000


# Scripts whose result acknowledges no state change to a client: reads, and the process's own
# bookkeeping and sweeps. With --min-replicas every other script's reply waits for the replicas
# (RedisClient.bind_script(durable=True)); these go at full speed, and the sweeps keep running
# while replicas are missing. A script not listed here (a new one) waits: the safe default.
UNACKNOWLEDGED_SCRIPTS = frozenset({
    "peek", "stats", "stats_tube", "heartbeat", "reap", "promote", "expire", "counters",
    "using", "connect", "tubes", "disconnect"})


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Reservation:
    id: int
    ttr: int
    body: bytes
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class NoJob:
    """Nothing reservable."""


JOB_FIELDS = ("t", "s", "p", "c", "d", "r", "u", "nr", "nt", "nl", "nb", "nk")


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The raw fields behind stats-job."""

    id: int
    tube: str
    state: str
    pri: int
    created_ms: int
    delay: int
    ttr: int
    due_ms: int
    reserves: int
    timeouts: int
    releases: int
    buries: int
    kicks: int


def _as_int(v: Any) -> int:
    return int(v) if v is not None else 0


class Store:
    """Job state in Redis for one tubeq process (``instance_id``) in namespace ``keys``."""

    def __init__(self, client: RedisClient, keys: Keys, instance_id: str,
                 clock: Clock = wall_clock_ms, *, events_maxlen: int = 0) -> None:
        """``events_maxlen``: write lifecycle events to ``keys.events``, capped at about that
        many entries (XADD MAXLEN ~); 0 writes none."""
        if events_maxlen < 0:
            raise ValueError("events_maxlen must be 0 (off) or positive")
        self.client = client
        self.keys = keys
        self.instance_id = instance_id
        self.clock = clock
        self.events_maxlen = events_maxlen
        self._scripts: dict[str, Script] = load_all()
        event_args = (events_maxlen, instance_id)
        self._calls: dict[str, ScriptCall] = {
            name: client.bind_script(s.sha, s.source, (keys.root,),
                                     event_args if s.records_events else (),
                                     durable=name not in UNACKNOWLEDGED_SCRIPTS)
            for name, s in self._scripts.items()}
        client.add_reconnect_callback(self._on_reconnect)

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script, so calls by SHA succeed."""
        await asyncio.gather(*(self.client.call("SCRIPT", "LOAD", s.source)
                               for s in self._scripts.values()))

    def exact_ms(self) -> float:
        """The clock with its fraction of a millisecond (the scheduler aims its timer with it)."""
        if self.clock is wall_clock_ms:
            return time.time() * 1000
        return float(self.clock())

    def _on_reconnect(self) -> None:
        # Issued before any later call on the fresh connection, so those find their SHAs.
        for s in self._scripts.values():
            self.client.call("SCRIPT", "LOAD", s.source).add_done_callback(discard)

    def _eval(self, name: str, *args: bytes | str | int,
              decode: Decoder | None = None) -> asyncio.Future[Any]:
        """Run a script by SHA (the client falls back to EVAL if Redis lost it)."""
        return self._calls[name](*args, decode=decode)

    # -- jobs ---------------------------------------------------------------------------------

    # put and delete take an optional ``answer``: the future then resolves to ``answer(result)``
    # (the handler's reply bytes) straight from the Redis reply, with no second future.
    @overload
    def put(self, tube: str, pri: int, delay: int, ttr: int, body: bytes) -> asyncio.Future[int]:
        ...

    @overload
    def put(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
            answer: Callable[[int], T]) -> asyncio.Future[T]:
        ...

    def put(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
            answer: Callable[[int], Any] | None = None) -> asyncio.Future[Any]:
        decode: Decoder = int if answer is None else (lambda r: answer(int(r)))
        return self._eval("put", tube, pri, delay, ttr, body, self.clock(), decode=decode)

    def burn_id(self) -> asyncio.Future[int]:
        """Use up one job id (a put that failed after its body arrived, as beanstalkd does)."""
        return self.client.call("INCR", self.keys.job_ids, decode=int)

    def reserve(self, token: str, *,
                counted_waiting: bool = False) -> asyncio.Future[Reservation | NoJob]:
        """The next job for ``token``; if ``counted_waiting``, a grant also counts it out."""
        now = self.clock()
        waiter = self.instance_id if counted_waiting else ""
        return self._eval("reserve", token, now, 1, waiter,
                          decode=lambda r: _reservation(r, now))

    def reserve_many(self, token: str, count: int, *,
                     counted_waiting: bool = False) -> asyncio.Future[list[Reservation]]:
        """Up to ``count`` jobs in reserve order, in one script call (the push extension)."""
        now = self.clock()
        waiter = self.instance_id if counted_waiting else ""
        return self._eval("reserve", token, now, count, waiter,
                          decode=lambda r: _reservations(r, now))

    def reserve_job(self, token: str, job_id: int) -> asyncio.Future[Reservation | NoJob]:
        now = self.clock()
        return self._eval("reserve_job", token, job_id, now,
                          decode=lambda r: _reservation(r, now))

    @overload
    def delete(self, token: str, job_id: int) -> asyncio.Future[bool]:
        ...

    @overload
    def delete(self, token: str, job_id: int,
               answer: Callable[[bool], T]) -> asyncio.Future[T]:
        ...

    def delete(self, token: str, job_id: int,
               answer: Callable[[bool], Any] | None = None) -> asyncio.Future[Any]:
        decode: Decoder = bool if answer is None else (lambda r: answer(bool(r)))
        return self._eval("delete", token, job_id, self.clock(), decode=decode)

    def release(self, token: str, job_id: int, pri: int, delay: int) -> asyncio.Future[bool]:
        return self._eval("release", token, job_id, pri, delay, self.clock(), decode=bool)

    def bury(self, token: str, job_id: int, pri: int) -> asyncio.Future[bool]:
        return self._eval("bury", token, job_id, pri, self.clock(), decode=bool)

    def touch(self, token: str, job_id: int) -> asyncio.Future[int]:
        """The new deadline (ms), or 0 when the job is not reserved by ``token``."""
        return self._eval("touch", token, job_id, self.clock(), decode=int)

    def kick(self, tube: str, bound: int) -> asyncio.Future[int]:
        return self._eval("kick", tube, bound, self.clock(), decode=int)

    def kick_job(self, job_id: int) -> asyncio.Future[bool]:
        return self._eval("kick_job", job_id, self.clock(), decode=bool)

    def peek(self, job_id: int) -> asyncio.Future[bytes | None]:
        return self.client.call("HGET", self.keys.job(job_id), "b", decode=_bytes_or_none)

    def peek_state(self, state: str, tube: str) -> asyncio.Future[tuple[int, bytes] | None]:
        def decode(r: Any) -> tuple[int, bytes] | None:
            return (int(r[0]), bytes(r[1])) if r else None

        return self._eval("peek", state, tube, decode=decode)

    def job_info(self, job_id: int) -> asyncio.Future[JobInfo | None]:
        def decode(r: Any) -> JobInfo | None:
            if r[0] is None:
                return None
            tube, state = r[0].decode(), r[1].decode()
            n = [_as_int(v) for v in r[2:]]
            return JobInfo(job_id, tube, state, *n)

        return self.client.call("HMGET", self.keys.job(job_id), *JOB_FIELDS, decode=decode)

    # -- tubes --------------------------------------------------------------------------------

    def tube_counts(self, tube: str) -> asyncio.Future[list[int] | None]:
        return self._eval("stats_tube", tube, decode=lambda r: [int(v) for v in r] or None)

    def set_tube(self, tube: str, settings: Options) -> asyncio.Future[Reply]:
        """Change a tube's settings (tubeq.options.TUBE_SETTINGS); defaults remove them."""
        flat = [x for pair in settings for x in pair]
        return self._eval("tube_set", tube, *flat)

    def tube_settings(self, tube: str) -> asyncio.Future[dict[str, OptionValue]]:
        """Every setting of ``tube``: its own value, else the default."""
        def decode(r: Any) -> dict[str, OptionValue]:
            values: dict[str, OptionValue] = dict(DEFAULTS)
            for name, raw in zip(r[::2], r[1::2], strict=True):
                text = raw.decode()
                values[name.decode()] = text if not text.isdigit() else int(text)
            return values

        return self.client.call("HGETALL", self.keys.settings(tube), decode=decode)

    def list_tubes(self) -> asyncio.Future[list[str]]:
        return self.client.call("ZRANGE", self.keys.tubes, 0, -1,
                                decode=lambda r: [v.decode() for v in r])

    def pause(self, tube: str, delay: int) -> asyncio.Future[int]:
        """The pause end (ms), -1 when resumed at once, 0 when the tube does not exist."""
        return self._eval("pause", tube, delay, self.clock(), decode=int)

    def server_counts(self) -> asyncio.Future[tuple[list[int], dict[str, int]]]:
        def decode(r: Any) -> tuple[list[int], dict[str, int]]:
            pairs = r[10:]
            named = {pairs[i].decode(): int(pairs[i + 1]) for i in range(0, len(pairs), 2)}
            return [int(v) for v in r[:10]], named

        return self._eval("stats", decode=decode)

    def add_counters(self, fields: dict[str, int], tube_jobs: dict[str, int]) -> None:
        """Add one process's counts to the shared counters (fire and forget): server stats
        fields (cmd-*, total-jobs) and jobs put per tube."""
        flat: list[str | int] = [len(fields)]
        for pairs in (fields, tube_jobs):
            for name, delta in pairs.items():
                flat += (name, delta)
        self._eval("counters", *flat).add_done_callback(discard)

    # -- connections --------------------------------------------------------------------------

    def connect(self, token: str) -> asyncio.Future[Reply]:
        return self._eval("connect", self.instance_id, token, self.clock())

    def change_watches(self, token: str, ops: Sequence[tuple[str, str]]) -> asyncio.Future[Reply]:
        """Apply ``(op, tube)`` pairs to a connection's watch list; op is ``+w`` or ``-w``."""
        flat = [x for op in ops for x in op]
        return self._eval("tubes", self.instance_id, token, self.clock(), *flat)

    def set_using(self, counts: Sequence[tuple[str, int]]) -> asyncio.Future[Reply]:
        """How many of this process's connections use each tube (absolute counts)."""
        flat = [x for pair in counts for x in pair]
        return self._eval("using", self.instance_id, self.clock(), *flat)

    def set_waiting(self, token: str, delta: int, *,
                    claim: bool = False) -> asyncio.Future[list[Reservation]]:
        """Count ``token`` in (1) or out (-1) of the waiters; with ``claim``, also take the jobs
        a put handed to it while it waited (put.lua), which are its already."""
        now = self.clock()
        return self._eval("wait", self.instance_id, token, delta, "1" if claim else "0",
                          decode=lambda r: _reservations(r, now))

    def bump_gauge(self, field: str, delta: int) -> None:
        call = self.client.call("HINCRBY", self.keys.instance(self.instance_id), field, delta)
        call.add_done_callback(discard)

    def disconnect(self, token: str, producer: bool, worker: bool,
                   reserved: Sequence[int]) -> asyncio.Future[Reply]:
        return self._eval("disconnect", token, int(producer), int(worker), self.clock(),
                          *reserved)

    # -- time ---------------------------------------------------------------------------------

    def heartbeat(self) -> asyncio.Future[Reply]:
        return self._eval("heartbeat", self.instance_id, self.clock())

    def reap(self, stale_before_ms: int) -> asyncio.Future[int]:
        return self._eval("reap", stale_before_ms, self.clock(), decode=int)

    def leave(self) -> asyncio.Future[int]:
        """Take this process out of the namespace (clean shutdown)."""
        return self._eval("reap", 0, self.clock(), self.instance_id, decode=int)

    def promote(self) -> asyncio.Future[tuple[int, list[str]]]:
        return self._eval("promote", self.clock(), SWEEP_LIMIT, decode=_sweep)

    def expire(self) -> asyncio.Future[tuple[int, list[str]]]:
        return self._eval("expire", self.clock(), SWEEP_LIMIT, decode=_sweep)


def _reservations(r: Any, now: int) -> list[Reservation]:
    """Jobs as reserve.lua and wait.lua return them: {id, ttr, body, ...}."""
    return [Reservation(int(r[i]), int(r[i + 1]), bytes(r[i + 2]), now + int(r[i + 1]) * 1000)
            for i in range(0, len(r), 3)]


def _reservation(r: Any, now: int) -> Reservation | NoJob:
    if not r:
        return NoJob()
    ttr = int(r[1])
    return Reservation(int(r[0]), ttr, bytes(r[2]), now + ttr * 1000)


def _sweep(r: Any) -> tuple[int, list[str]]:
    return int(r[0]), [v.decode() for v in r[1:]]


def _bytes_or_none(v: Any) -> bytes | None:
    return None if v is None else bytes(v)
