"""A namespace split into shards: its tubes spread over several Redis hash tags (so over the
nodes of a Redis Cluster), one :class:`~tubeq.store.store.Store` per shard behind the one
:class:`~tubeq.store.base.JobStore` interface.

Owns: the layout (which shard holds a tube, which holds a job), the routing of every JobStore
call to the shard it concerns, the merging of the shards' answers for the namespace-wide ones
(stats, list-tubes, the job count), and a reserve over tubes of several shards.

Rules:

* Shard k of n has the key root ``{<prefix>#<k>/<n>}:``: its own hash tag, so its keys share one
  Redis Cluster slot and each script still touches one slot. Its scripts number its jobs k + n,
  k + 2n, ... (``new_job`` in lua/includes/keys.lua): ``id mod n`` is a job's shard, so a
  command that names only an id (delete, release, bury, touch, peek, stats-job, kick-job,
  reserve-job) goes straight to it. Ids stay unique positive integers.
* A tube lives in shard ``crc32(group) mod n``, its group being its name up to the first ``/``
  (``mail/high`` and ``mail/low`` share the shard of ``mail``), else its whole name: tubes a
  consumer watches together belong in one group. n is fixed per namespace: the first process
  records it (``{<prefix>}:shards``) and a process started with another n refuses to start
  (:func:`claim_layout`), since it would see none of the jobs.
* A connection's home is the shard of tube ``default`` (connect.lua counts it there, with the
  process's connection gauges); in the other shards it exists only through its watches, waits
  and reservations (disconnect.lua with ``home`` 0 cleans those).
* Reserve: a connection whose watched tubes are all in one shard reserves there, exactly as on
  an unsplit namespace (hand-over from puts included). Over several shards it asks each for the
  job it would get (best.lua, read only) and reserves in the shard whose job comes first in
  (pri, time put, id) order.
  beanstalkd's order is (pri, id) across all watched tubes; ids of different shards do not
  follow put order, hence the put time between pri and id (Redis's own clock in microseconds,
  field ``cu``, stamped by ``new_job`` in lua/includes/keys.lua). The price: a look per
  watched shard for each reserve, and a count in and out of the waiters per watched shard for
  each wait (bench/RESULTS-cluster.md: consumers watching 64 tubes over 16 shards cost 3.6x
  the Redis CPU per job of consumers whose tubes are in one shard; a taken job sends the
  reserve to the next shard of its look, not to a new look at all of them).
* Waiting over several shards: the connection is counted in every one of them for wake-ups only
  (modes 'h' at home, 'o' elsewhere: lua/includes/waiter_counts.lua); puts never hand it a
  job, their PUBLISH wakes it and its reserve tries again. So one wait never gets two jobs
  from two shards.
* Scheduling: each shard has its own scheduler (timers, TTRs, heartbeat, reaping), run by the
  server (tubeq.server.scheduler.ShardSchedulers); the store knows no scheduler.

With n = 1 nothing of this is used: the namespace keeps its one root ``{<prefix>}:``.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tubeq.model import admin
from tubeq.model.options import Options, OptionValue
from tubeq.model.recurring import DueTick, ScheduleInfo
from tubeq.redisio.client import RedisClient, Reply
from tubeq.redisio.futures import discard, then
from tubeq.store.base import JobStore
from tubeq.store.keys import Keys
from tubeq.store.records import (
    PARENT_FAILED,
    PARENT_LIVING,
    PARENT_UNKNOWN,
    Clock,
    DirectGrants,
    Failed,
    InstanceInfo,
    JobEnd,
    JobInfo,
    JobObserver,
    JobPolicies,
    JobSummary,
    JobTrace,
    NoJob,
    Progress,
    PutOutcome,
    Reservation,
    TubeCounts,
)
from tubeq.store.store import Store, wall_clock_ms

DEFAULT_TUBE = "default"
# A bound on --shards: every namespace-wide read (stats, list-tubes) asks every shard.
MAX_SHARDS = 1024
# How many times a reserve over several shards asks again when the job it chose was taken by
# another connection between its look (best.lua) and its take: each retry means another
# connection got a job, so the bound is for safety, not for progress.
RESERVE_RETRIES = 8


class LayoutMismatch(RuntimeError):
    """The namespace was split into another number of shards than this process was told."""


def shard_prefix(prefix: str, shard: int, shards: int) -> str:
    """The key prefix of shard ``shard`` of ``shards`` (its root is ``{<this>}:``)."""
    return f"{prefix}#{shard}/{shards}"


def shard_of_tube(tube: str, shards: int) -> int:
    """crc32 of the tube's group (its name up to the first ``/``, or the whole name): tubes of
    one group share a shard, so a consumer of all of them reserves in one shard."""
    return zlib.crc32(tube.split("/", 1)[0].encode()) % shards


def shard_of_id(job_id: int, shards: int) -> int:
    return job_id % shards


async def claim_layout(client: RedisClient, prefix: str, shards: int) -> None:
    """Record ``shards`` for the namespace, or check it against the recorded number."""
    key = Keys(prefix).shards
    await client.call("SET", key, shards, "NX")
    recorded = int(await client.call("GET", key))
    if recorded != shards:
        raise LayoutMismatch(
            f"namespace {prefix!r} is split into {recorded} shard(s) (its first process said "
            f"so); this process was started with --shards {shards}: use the same number")


class ShardedStore:
    """A :class:`JobStore` over ``shards`` Stores (see the module header), by composition:
    each method routes to the shard of its tube or job id, or gathers every shard's answer.
    It inherits nothing, so a JobStore member it does not route is a mypy error (checked at
    the end of this module, and wherever the server holds it as a JobStore)."""

    # A reserve's shard and a pipelined delete's job may differ: commands wait behind reserves.
    defers_behind_reserves = False

    def __init__(self, client: RedisClient, prefix: str, instance_id: str, shards: int,
                 clock: Clock = wall_clock_ms, *, events_maxlen: int = 0,
                 clients: Sequence[RedisClient] | None = None, functions: bool = True) -> None:
        """``clients``: the Redis client of each shard (a cluster's node that holds its slot);
        by default all use ``client``. ``functions``: as for Store."""
        if shards < 2:
            raise ValueError("a split namespace has 2 shards or more")
        self.keys = Keys(prefix)  # the unsplit root: only its layout record, claim_layout's
        self.instance_id = instance_id
        self.clock = clock
        self._metrics: JobObserver | None = None
        self._direct_grants: DirectGrants | None = None
        self.count = shards
        self.shards = [
            Store(clients[k] if clients is not None else client,
                  Keys(shard_prefix(prefix, k, shards)), instance_id, clock,
                  events_maxlen=events_maxlen, functions=functions)
            for k in range(shards)]
        self.home = self.shards[shard_of_tube(DEFAULT_TUBE, shards)]
        for shard in self.shards:
            shard.holds_default = shard is self.home
        # Per connection token: the tubes it watches, and every shard it has touched (watched
        # in, or reserved from), which its disconnect must clean.
        self._watched: dict[str, set[str]] = {}
        self._touched: dict[str, set[int]] = {}

    def rebind(self, shard: int, client: RedisClient) -> Store:
        """Serve shard ``shard`` over ``client`` from now on (its slot moved to that node: a
        resharding or a failover, tubeq.redisio.cluster); returns the shard's new Store."""
        old = self.shards[shard]
        new = Store(client, old.keys, self.instance_id, self.clock,
                    events_maxlen=old.events_maxlen, functions=old.wants_functions)
        new.holds_default = old.holds_default
        new.metrics = old.metrics
        new.direct_grants = old.direct_grants
        self.shards[shard] = new
        if old is self.home:
            self.home = new
        return new

    # -- routing ------------------------------------------------------------------------------

    def of_tube(self, tube: str) -> Store:
        return self.shards[shard_of_tube(tube, self.count)]

    def of_id(self, job_id: int) -> Store:
        return self.shards[shard_of_id(job_id, self.count)]

    def _watching(self, token: str) -> list[int]:
        """The shards of the tubes ``token`` watches, in shard order."""
        return sorted({shard_of_tube(t, self.count) for t in self._watched.get(token, ())})

    def _touch(self, token: str, shard: int) -> None:
        self._touched.setdefault(token, set()).add(shard)

    def _gather(self, calls: Sequence[asyncio.Future[Any]]) -> asyncio.Future[list[Any]]:
        return asyncio.gather(*calls)

    async def load_scripts(self) -> bool:
        # One load per Redis serves every shard on it: the others are told how to call.
        functions: dict[int, bool] = {}
        for store in (self.home, *self.shards):
            if id(store.client) not in functions:
                functions[id(store.client)] = await store.load_scripts()
            elif functions[id(store.client)]:
                store.call_functions()
        return functions[id(self.home.client)]

    def call_functions(self) -> None:
        for shard in self.shards:
            shard.call_functions()

    def exact_ms(self) -> float:
        return self.home.exact_ms()

    @property
    def metrics(self) -> JobObserver | None:
        return self._metrics

    @metrics.setter
    def metrics(self, value: JobObserver | None) -> None:
        """Set by the server when metrics are on: every shard reports to them."""
        self._metrics = value
        for shard in self.shards:
            shard.metrics = value

    @property
    def direct_grants(self) -> DirectGrants | None:
        return self._direct_grants

    @direct_grants.setter
    def direct_grants(self, value: DirectGrants | None) -> None:
        """Set by the server: every shard's puts hand their jobs there (Store.direct_grants)."""
        self._direct_grants = value
        for shard in self.shards:
            shard.direct_grants = value

    # -- jobs ---------------------------------------------------------------------------------

    def put(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
            answer: Callable[[int], Any] | None = None) -> asyncio.Future[Any]:
        shard = self.of_tube(tube)
        if answer is None:
            return shard.put(tube, pri, delay, ttr, body)
        return shard.put(tube, pri, delay, ttr, body, answer)

    def burn_id(self, tube: str = DEFAULT_TUBE) -> asyncio.Future[int]:
        return self.of_tube(tube).burn_id(tube)

    def reserve(self, token: str, *, counted_waiting: bool = False,
                number: int = 0) -> asyncio.Future[Reservation | NoJob]:
        shards = self._watching(token)
        if len(shards) == 1:
            return self.shards[shards[0]].reserve(token, counted_waiting=counted_waiting)
        return asyncio.ensure_future(self._reserve_across(token, shards, None, counted_waiting))

    def reserve_many(self, token: str, count: int, *, counted_waiting: bool = False,
                     number: int = 0, each: bool = False, stay: bool = False,
                     direct: bool = True) -> asyncio.Future[list[Reservation]]:
        shards = self._watching(token)
        if len(shards) == 1:
            return self.shards[shards[0]].reserve_many(token, count,
                                                       counted_waiting=counted_waiting,
                                                       stay=stay, direct=direct)
        if stay and not direct and not counted_waiting:
            # A blocked reserve's: its count-in is sent now, so a count-out its wait sends
            # later (it ended meanwhile: a timeout over a stalled Redis) reaches every shard
            # after it; then one try, which counts it out on a grant.
            counting = self.set_waiting(token, 1)
            return asyncio.ensure_future(self._take_counted_in(counting, token, shards, count))
        if stay:
            return asyncio.ensure_future(self._take_staying(token, shards, count,
                                                            counted_waiting))
        return asyncio.ensure_future(self._reserve_across(token, shards, count, counted_waiting))

    async def _take_counted_in(self, counting: asyncio.Future[list[Reservation]], token: str,
                               shards: list[int], count: int) -> list[Reservation]:
        await counting  # over several shards nothing is handed to it: no jobs come with it
        taken: list[Reservation] = await self._reserve_across(token, shards, count, True)
        return taken

    async def _take_staying(self, token: str, shards: list[int], count: int,
                            counted: bool) -> list[Reservation]:
        """``reserve_many(stay=True)`` over several shards, where no one script can take and
        count in together: a try that finds nothing counts the token in (for wake-ups) and
        tries once more, as the push loop did step by step; the token ends counted in iff no
        job came."""
        taken: list[Reservation] = await self._reserve_across(token, shards, count, False)
        if not taken and not counted:
            await self.set_waiting(token, 1)
            counted = True  # a put from now on wakes it: what it missed, this try takes
            taken = await self._reserve_across(token, shards, count, False)
        if taken and counted:
            await self.set_waiting(token, -1)
        return taken

    async def _reserve_across(self, token: str, shards: list[int], count: int | None,
                              counted_waiting: bool) -> Any:
        """Reserve over several shards (see the module header): one job, or with ``count``
        up to that many, each time from the shard whose best job comes first."""
        taken: list[Reservation] = []
        want = 1 if count is None else count
        retries = RESERVE_RETRIES
        while len(taken) < want and retries > 0:
            bests = await asyncio.gather(*(self.shards[k].best(token) for k in shards))
            ranked = sorted((best, k) for k, best in zip(shards, bests, strict=True)
                            if best is not None)
            if not ranked:
                break
            # Best first; a shard whose job another connection took between the look and the
            # take gives way to the next one, before any new look at every shard.
            for _, shard in ranked:
                self._touch(token, shard)
                got = await self.shards[shard].reserve_many(token, want - len(taken))
                if got:
                    taken += got
                    break
            else:
                retries -= 1
        if taken and counted_waiting:
            # Counted in for wake-ups in every shard it watches: it waits no longer.
            for k in shards:
                self.shards[k].set_waiting(token, -1).add_done_callback(discard)
        if count is not None:
            return taken
        return taken[0] if taken else NoJob()

    def reserve_job(self, token: str, job_id: int) -> asyncio.Future[Reservation | NoJob]:
        self._touch(token, shard_of_id(job_id, self.count))
        return self.of_id(job_id).reserve_job(token, job_id)

    def delete(self, token: str, job_id: int,
               answer: Callable[[bool], Any] | None = None, *,
               behind: int = 0) -> asyncio.Future[Any]:
        return self.of_id(job_id).delete(token, job_id, answer)  # type: ignore[arg-type]

    def release(self, token: str, job_id: int, pri: int, delay: int) -> asyncio.Future[bool]:
        return self.of_id(job_id).release(token, job_id, pri, delay)

    def bury(self, token: str, job_id: int, pri: int, *,
             behind: int = 0) -> asyncio.Future[bool]:
        return self.of_id(job_id).bury(token, job_id, pri)

    def touch(self, token: str, job_id: int, *, behind: int = 0) -> asyncio.Future[int]:
        return self.of_id(job_id).touch(token, job_id)

    def finish(self, token: str, job_id: int, result: bytes, keep_ms: int, *,
               behind: int = 0) -> asyncio.Future[bool | int]:
        return self.of_id(job_id).finish(token, job_id, result, keep_ms)

    def hand_back(self, token: str, job_id: int) -> asyncio.Future[int]:
        return self.of_id(job_id).hand_back(token, job_id)

    def cancel(self, job_id: int) -> asyncio.Future[int]:
        return self.of_id(job_id).cancel(job_id)

    def quiet(self, scope: str, target: str = "") -> asyncio.Future[int]:
        return self.shards[0].quiet(scope, target)  # every process hears the first shard

    def fail(self, token: str, job_id: int, error: bytes, *, behind: int = 0,
             worker_policy: Options = ()) -> asyncio.Future[Failed | None]:
        return self.of_id(job_id).fail(token, job_id, error, worker_policy=worker_policy)

    def wait_end(self, job_id: int, keep_ms: int, progress_after: int | None = None
                 ) -> asyncio.Future[JobEnd | Progress | bool]:
        return self.of_id(job_id).wait_end(job_id, keep_ms, progress_after)

    def progress(self, token: str, job_id: int, data: bytes, *,
                 behind: int = 0) -> asyncio.Future[int]:
        return self.of_id(job_id).progress(token, job_id, data)

    def kick(self, tube: str, bound: int) -> asyncio.Future[int]:
        return self.of_tube(tube).kick(tube, bound)

    def kick_job(self, job_id: int) -> asyncio.Future[bool]:
        return self.of_id(job_id).kick_job(job_id)

    def peek(self, job_id: int) -> asyncio.Future[bytes | None]:
        return self.of_id(job_id).peek(job_id)

    def peek_state(self, state: str, tube: str) -> asyncio.Future[tuple[int, bytes] | None]:
        return self.of_tube(tube).peek_state(state, tube)

    def job_info(self, job_id: int) -> asyncio.Future[JobInfo | None]:
        return self.of_id(job_id).job_info(job_id)

    # -- tubes --------------------------------------------------------------------------------

    def tube_counts(self, tube: str) -> asyncio.Future[list[int] | None]:
        return self.of_tube(tube).tube_counts(tube)

    def set_tube(self, tube: str, settings: Options) -> asyncio.Future[Reply]:
        return self.of_tube(tube).set_tube(tube, settings)

    def tube_settings(self, tube: str) -> asyncio.Future[dict[str, OptionValue]]:
        return self.of_tube(tube).tube_settings(tube)

    def count_jobs(self) -> asyncio.Future[int]:
        return then(self._gather([s.count_jobs() for s in self.shards]), sum)

    def recount(self, *, force: bool = False) -> asyncio.Future[int]:
        """Every shard's, in turn (each is O(its tubes)); -1 when no shard counted."""
        async def each() -> int:
            visited = [await shard.recount(force=force) for shard in self.shards]
            return -1 if all(n < 0 for n in visited) else sum(max(n, 0) for n in visited)

        return asyncio.ensure_future(each())

    def list_tubes(self) -> asyncio.Future[list[str]]:
        """Every shard's tubes in the order Redis created them (protocol.md, "Shards")."""
        def merge(lists: list[list[tuple[str, int]]]) -> list[str]:
            tubes = sorted((created, shard, seq, name) for shard, pairs in enumerate(lists)
                           for seq, (name, created) in enumerate(pairs))
            return [name for *_, name in tubes]

        return then(self._gather([s.tubes_created() for s in self.shards]), merge)

    def tubes_created(self) -> asyncio.Future[list[tuple[str, int]]]:
        return then(self._gather([s.tubes_created() for s in self.shards]),
                    lambda parts: sorted((p for part in parts for p in part),
                                         key=lambda pair: pair[1]))

    def pause(self, tube: str, delay: int) -> asyncio.Future[int]:
        return self.of_tube(tube).pause(tube, delay)

    def server_counts(self) -> asyncio.Future[tuple[list[int], dict[str, int]]]:
        """Summed: job counts and tubes per shard; a process's gauges and the stats counters are
        kept at home (connect.lua, bump_gauge, add_counters), 0 elsewhere; waiting connections
        are counted in their home's gauge once (mode 'h')."""
        def merge(parts: list[tuple[list[int], dict[str, int]]]) -> tuple[list[int],
                                                                           dict[str, int]]:
            counts = [sum(values) for values in zip(*(p[0] for p in parts), strict=True)]
            named: dict[str, int] = {}
            for _, fields in parts:
                for name, value in fields.items():
                    named[name] = named.get(name, 0) + value
            return counts, named

        return then(self._gather([s.server_counts() for s in self.shards]), merge)

    def add_counters(self, fields: dict[str, int],
                     refused: Callable[[dict[str, int]], None]) -> None:
        """The command counts go to the home shard (total-jobs is each shard's own, counted
        by its scripts, and summed by server_counts)."""
        self.home.add_counters(fields, refused)

    def overview(self, limit: int) -> asyncio.Future[tuple[int, list[TubeCounts]]]:
        """Rows of every shard's first tubes (at most ``limit`` in all, ``default`` first), and
        one row named "" summing the rest."""
        def merge(parts: list[tuple[int, list[TubeCounts]]]) -> tuple[int, list[TubeCounts]]:
            total = sum(n for n, _ in parts)
            rows = [row for _, shard_rows in parts for row in shard_rows if row.name]
            rows.sort(key=lambda row: row.name != DEFAULT_TUBE)
            rest = [row for _, shard_rows in parts for row in shard_rows if not row.name]
            rest += rows[limit:]
            rows = rows[:limit]
            if rest:
                summed = {f: sum(getattr(row, f) for row in rest) for f in _SUMMED}
                rows.append(TubeCounts(name="", pause_until_ms=0, **summed))
            return total, rows

        return then(self._gather([s.overview(limit) for s in self.shards]), merge)

    def browse(self, tube: str, state: str, limit: int) -> asyncio.Future[list[JobSummary]]:
        return self.of_tube(tube).browse(tube, state, limit)

    async def instances(self) -> list[InstanceInfo]:
        return await self.home.instances()

    # -- connections --------------------------------------------------------------------------

    def connect(self, token: str) -> asyncio.Future[Reply]:
        self._watched[token] = {DEFAULT_TUBE}
        self._touch(token, self.shards.index(self.home))
        return self.home.connect(token)

    def change_watches(self, token: str, ops: Sequence[tuple[str, str]]) -> asyncio.Future[Reply]:
        watched = self._watched.setdefault(token, set())
        by_shard: dict[int, list[tuple[str, str]]] = {}
        for op, tube in ops:
            shard = shard_of_tube(tube, self.count)
            by_shard.setdefault(shard, []).append((op, tube))
            if op == "+w":
                watched.add(tube)
                self._touch(token, shard)
            else:
                watched.discard(tube)
        if not watched:
            # Only a token that is not a connection gets here (a connection cannot ignore its
            # last tube): an HTTP reservation ending. Nothing of it is left to remember.
            self._watched.pop(token, None)
            self._touched.pop(token, None)
        return self._gather([self.shards[k].change_watches(token, shard_ops)
                             for k, shard_ops in by_shard.items()])  # type: ignore[return-value]

    def forget_watch_change(self, token: str, tube: str, *, added: bool) -> None:
        watched = self._watched.get(token)
        if watched is not None:
            if added:
                watched.discard(tube)
            else:
                watched.add(tube)

    def set_using(self, counts: Sequence[tuple[str, int]]) -> asyncio.Future[Reply]:
        by_shard: dict[int, list[tuple[str, int]]] = {}
        for tube, n in counts:
            by_shard.setdefault(shard_of_tube(tube, self.count), []).append((tube, n))
        return self._gather([self.shards[k].set_using(shard_counts)
                             for k, shard_counts in by_shard.items()])  # type: ignore[return-value]

    def set_waiting(self, token: str, delta: int, *, claim: bool = False,
                    mode: str = "1") -> asyncio.Future[list[Reservation]]:
        shards = self._watching(token)
        if len(shards) == 1:
            return self.shards[shards[0]].set_waiting(token, delta, claim=claim, mode=mode)
        home = self.shards.index(self.home)
        first = home if home in shards else shards[0]  # the one whose gauge counts it
        calls = [self.shards[k].set_waiting(token, delta, claim=claim,
                                            mode="h" if k == first else "o") for k in shards]
        return then(self._gather(calls), lambda parts: [job for part in parts for job in part])

    def best(self, token: str) -> asyncio.Future[tuple[int, int, int] | None]:
        def first(parts: list[tuple[int, int, int] | None]) -> tuple[int, int, int] | None:
            return min((p for p in parts if p is not None), default=None)

        return then(self._gather([self.shards[k].best(token) for k in self._watching(token)]),
                    first)

    def describe_instance(self, fields: dict[str, str]) -> asyncio.Future[Reply]:
        return self.home.describe_instance(fields)

    def bump_gauge(self, field: str, delta: int) -> None:
        self.home.bump_gauge(field, delta)

    def disconnect(self, token: str, producer: bool, worker: bool,
                   reserved: Sequence[int], *, home: bool = True,
                   shutdown: bool = False) -> asyncio.Future[Reply]:
        touched = self._touched.get(token, set())
        held: dict[int, list[int]] = {}
        for job_id in reserved:
            held.setdefault(shard_of_id(job_id, self.count), []).append(job_id)
        home_shard = self.shards.index(self.home)
        calls = [self.shards[k].disconnect(token, producer, worker, held.get(k, []),
                                           home=k == home_shard, shutdown=shutdown)
                 for k in sorted(touched | held.keys() | {home_shard})]
        done = self._gather(calls)
        done.add_done_callback(lambda f: self._forget(token, f))
        return then(done, lambda parts: sum(int(p) for p in parts))

    def _forget(self, token: str, disconnected: asyncio.Future[Any]) -> None:
        """A connection's disconnect went through: nothing of it is left to route (one that
        failed is sent again by the connection, to the same shards)."""
        if not disconnected.cancelled() and disconnected.exception() is None:
            self._watched.pop(token, None)
            self._touched.pop(token, None)

    # -- time ---------------------------------------------------------------------------------

    def trim_events(self) -> asyncio.Future[Reply] | None:
        calls = [c for c in (s.trim_events() for s in self.shards) if c is not None]
        return self._gather(calls) if calls else None  # type: ignore[return-value]

    def heartbeat(self) -> asyncio.Future[bool]:
        return then(self._gather([s.heartbeat() for s in self.shards]), any)

    def restore(self, watches: Sequence[tuple[str, bool, Sequence[str]]],
                gauges: tuple[int, int, int] | None) -> asyncio.Future[int]:
        home = self.shards.index(self.home)
        by_shard: dict[int, list[tuple[str, bool, list[str]]]] = {k: [] for k in
                                                                    range(self.count)}
        for token, connection, tubes in watches:
            here: dict[int, list[str]] = {home: []} if connection else {}
            for tube in tubes:
                here.setdefault(shard_of_tube(tube, self.count), []).append(tube)
            for k, shard_tubes in here.items():
                by_shard[k].append((token, connection, shard_tubes))
        calls = [self.shards[k].restore(part, gauges if k == home else None)
                 for k, part in sorted(by_shard.items())]
        return then(self._gather(calls), sum)

    def reap(self, stale_before_ms: int) -> asyncio.Future[int]:
        return then(self._gather([s.reap(stale_before_ms) for s in self.shards]), max)

    def leave(self) -> asyncio.Future[int]:
        return then(self._gather([s.leave() for s in self.shards]), max)

    def promote(self) -> asyncio.Future[tuple[int, list[str]]]:
        return then(self._gather([s.promote() for s in self.shards]), _merge_sweeps)

    def expire(self) -> asyncio.Future[tuple[int, list[str]]]:
        return then(self._gather([s.expire() for s in self.shards]), _merge_sweeps)

    # -- recurring jobs -----------------------------------------------------------------------

    def schedule_add(self, tube: str, name: str, kind: str, spec: str, pri: int, ttr: int,
                     delay_ms: int, body: bytes,
                     first_due_ms: int) -> asyncio.Future[tuple[int, bool]]:
        return self.of_tube(tube).schedule_add(tube, name, kind, spec, pri, ttr, delay_ms, body,
                                               first_due_ms)

    def schedule_remove(self, tube: str, name: str) -> asyncio.Future[bool]:
        return self.of_tube(tube).schedule_remove(tube, name)

    def schedule_list(self, tube: str) -> asyncio.Future[list[ScheduleInfo]]:
        return self.of_tube(tube).schedule_list(tube)

    def schedules_due(self) -> asyncio.Future[tuple[int, list[DueTick]]]:
        def merge(parts: list[tuple[int, list[DueTick]]]) -> tuple[int, list[DueTick]]:
            laters = [later for later, _ in parts if later >= 0]
            return (min(laters) if laters else -1), [t for _, ticks in parts for t in ticks]

        return then(self._gather([s.schedules_due() for s in self.shards]), merge)

    def schedule_tick(self, tick: DueTick, next_due_ms: int) -> asyncio.Future[int]:
        return self.of_tube(tick.tube).schedule_tick(tick, next_due_ms)

    # -- admin verbs --------------------------------------------------------------------------

    def clear_tube_batch(self, tube: str, states: Sequence[str], limit: int = admin.CLEAR_BATCH,
                         ) -> asyncio.Future[tuple[int, bool]]:
        return self.of_tube(tube).clear_tube_batch(tube, states, limit)

    async def clear_tube(self, tube: str, states: Sequence[str]) -> int | None:
        return await self.of_tube(tube).clear_tube(tube, states)

    def list_jobs(self, tube: str, state: str, cursor: tuple[int, int] | None, count: int,
                  ) -> asyncio.Future[admin.JobPage | None]:
        return self.of_tube(tube).list_jobs(tube, state, cursor, count)

    def change_pri(self, job_id: int, pri: int) -> asyncio.Future[bool]:
        return self.of_id(job_id).change_pri(job_id, pri)

    def change_delay(self, job_id: int, delay_ms: int) -> asyncio.Future[int]:
        return self.of_id(job_id).change_delay(job_id, delay_ms)

    def tube_pause(self, tube: str, *, forever: bool) -> asyncio.Future[bool]:
        return self.of_tube(tube).tube_pause(tube, forever=forever)

    def tube_figures(self, tube: str) -> asyncio.Future[admin.TubeFigures | None]:
        return self.of_tube(tube).tube_figures(tube)

    def tube_groups(self, tube: str) -> asyncio.Future[admin.TubeGroups]:
        return self.of_tube(tube).tube_groups(tube)

    # -- batches ------------------------------------------------------------------------------

    def put_many(self, tube: str, jobs: Sequence[tuple[int, int, int, bytes]], *,
                 send_now: bool = False, groups: Sequence[str] | None = None,
                 traceparents: Sequence[str] | None = None) -> asyncio.Future[list[int]]:
        return self.of_tube(tube).put_many(tube, jobs, send_now=send_now, groups=groups,
                                           traceparents=traceparents)

    def put_calls(self, tube: str, jobs: Sequence[tuple[int, int, int, bytes]], keep_ms: int,
                  budget: Sequence[tuple[str, int]]) -> asyncio.Future[list[int]]:
        return self.of_tube(tube).put_calls(tube, jobs, keep_ms, budget)

    def delete_many(self, token: str, ids: Sequence[int], *,
                    behind: int = 0) -> asyncio.Future[list[bool]]:
        """Each shard deletes its own ids in one call; the answers come back in ``ids`` order.
        Nothing is ever deferred here (``behind`` is 0: see defers_behind_reserves)."""
        by_shard: dict[int, list[int]] = {}
        for job_id in ids:
            by_shard.setdefault(shard_of_id(job_id, self.count), []).append(job_id)
        shards = list(by_shard)

        def merge(parts: list[list[bool]]) -> list[bool]:
            # By position: an id given twice is deleted once (DELETED, then NOT_FOUND).
            answers = {k: iter(part) for k, part in zip(shards, parts, strict=True)}
            return [next(answers[shard_of_id(job_id, self.count)]) for job_id in ids]

        return then(self._gather([self.shards[k].delete_many(token, by_shard[k])
                                  for k in shards]), merge)

    def finish_many(self, token: str, jobs: Sequence[tuple[int, bytes]], keep_ms: int, *,
                    behind: int = 0) -> asyncio.Future[list[bool | int]]:
        """Each shard finishes its own jobs in one call; the answers come back in ``jobs``
        order (as delete_many: nothing is deferred here)."""
        by_shard: dict[int, list[tuple[int, bytes]]] = {}
        for job in jobs:
            by_shard.setdefault(shard_of_id(job[0], self.count), []).append(job)
        shards = list(by_shard)

        def merge(parts: list[list[bool | int]]) -> list[bool | int]:
            answers = {k: iter(part) for k, part in zip(shards, parts, strict=True)}
            return [next(answers[shard_of_id(job_id, self.count)]) for job_id, _ in jobs]

        return then(self._gather([self.shards[k].finish_many(token, by_shard[k], keep_ms)
                                  for k in shards]), merge)

    # -- job policies and deduplicated put ----------------------------------------------------

    def put_with(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
                 opts: Options) -> asyncio.Future[PutOutcome]:
        after = dict(opts).get("after")
        if after is not None:
            parents = [int(p) for p in str(after).split(",")]
            if any(shard_of_id(p, self.count) != shard_of_tube(tube, self.count)
                   for p in parents):
                return asyncio.ensure_future(self._put_after_far(tube, pri, delay, ttr, body,
                                                                 opts, parents))
        return self.of_tube(tube).put_with(tube, pri, delay, ttr, body, opts)

    async def _put_after_far(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
                             opts: Options, parents: list[int]) -> PutOutcome:
        """put-with after= naming parents of other shards than the tube's: the new job's id is
        taken first, every other shard's living parents learn of it (add_child.lua), and
        only then is it stored, held, on its own shard, with what they said; so a parent that
        ends meanwhile leaves its end for a child about to exist (Store.tell_children keeps
        such an end a while). A refused put takes the child back from the parents it told."""
        home_index = shard_of_tube(tube, self.count)
        home = self.shards[home_index]
        child = await home.burn_id(tube) * self.count + home_index
        keep = int(dict(opts)["after-keep"])
        near = [p for p in parents if shard_of_id(p, self.count) == home_index]
        far: dict[int, list[int]] = {}
        for p in parents:
            if shard_of_id(p, self.count) != home_index:
                far.setdefault(shard_of_id(p, self.count), []).append(p)
        answers = await asyncio.gather(*(self.shards[k].add_child(child, keep, ps)
                                         for k, ps in far.items()))
        living: list[int] = []
        failed = False
        unknown = 0
        for ps, states in zip(far.values(), answers, strict=True):
            for p, state in zip(ps, states, strict=True):
                if state == PARENT_LIVING:
                    living.append(p)
                elif state == PARENT_FAILED:
                    failed = True
                elif state == PARENT_UNKNOWN and not unknown:
                    unknown = p
        outcome = PutOutcome(0, False, unknown_parent=unknown)
        if not unknown:
            given = [(name, value) for name, value in opts if name != "after"]
            if near:
                given.append(("after", ",".join(map(str, near))))
            if living:
                given.append(("after-far", ",".join(map(str, living))))
            if failed:
                given.append(("after-failed", "1"))
            given.append(("id", child))
            outcome = await home.put_with(tube, pri, delay, ttr, body, tuple(given))
        if not outcome.inserted:  # refused: the parents it told forget it
            await asyncio.gather(*(self.shards[k].add_child(child, keep, ps, undo=True)
                                   for k, ps in far.items()))
        return outcome

    async def tell_children(self) -> tuple[int, int]:
        """Every shard's parents' ends, one batch each, told to children on any shard."""
        told = await asyncio.gather(*(s.tell_children(self.of_id) for s in self.shards))
        dues = [due for _, due in told if due]
        return sum(n for n, _ in told), min(dues, default=0)

    def peek_key(self, key: str) -> asyncio.Future[tuple[int, bytes] | None]:
        """A dedupe key is unique within a shard (protocol.md, "Shards"): the first shard that
        knows it answers."""
        def first(parts: list[tuple[int, bytes] | None]) -> tuple[int, bytes] | None:
            return next((p for p in parts if p is not None), None)

        return then(self._gather([s.peek_key(key) for s in self.shards]), first)

    def job_policies(self, job_id: int) -> asyncio.Future[JobPolicies | None]:
        return self.of_id(job_id).job_policies(job_id)

    def job_trace(self, job_id: int) -> asyncio.Future[JobTrace | None]:
        return self.of_id(job_id).job_trace(job_id)

    def tube_policy_counts(self, tube: str) -> asyncio.Future[list[int]]:
        return self.of_tube(tube).tube_policy_counts(tube)


# TubeCounts fields summed into the "" row, in order, without pause_until_ms.
_SUMMED = ("urgent", "ready", "reserved", "delayed", "buried", "total", "deletes", "waiting",
           "watching", "using")


def _merge_sweeps(parts: list[tuple[int, list[str]]]) -> tuple[int, list[str]]:
    """Sweeps of every shard: the earliest next due time (-1: none), every tube they woke."""
    dues = [due for due, _ in parts if due >= 0]
    return (min(dues) if dues else -1), [t for _, tubes in parts for t in tubes]


if TYPE_CHECKING:
    def _routes_every_member(store: ShardedStore) -> JobStore:
        """mypy's check that the split store implements the whole JobStore (never run)."""
        return store
