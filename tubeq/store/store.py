"""The job store: one typed method per Lua script, over the process's one Redis connection.

Methods do not await: each returns a future of its decoded result, so a connection can send the
commands a client pipelined without waiting for each other (the Redis client batches them per
loop tick). Calls keep their order on the one connection, which is what keeps a client's replies
in order. ``now`` (ms) comes from an injectable clock and is passed to every script.

Lifecycle events (:mod:`tubeq.model.events`) are written by the scripts themselves. Whether they
are, and the stream's cap, is fixed per Store: the scripts that write events get the cap and this
process's instance id as bound arguments (encoded once, see ``RedisClient.bind_script``), so
events cost no extra round trip and no per-call lookup.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

import structlog

from tubeq.model import admin
from tubeq.model.options import DEFAULTS, Options, OptionValue
from tubeq.model.recurring import DueTick, ScheduleInfo
from tubeq.redisio.client import (
    Decoder,
    RedisClient,
    RedisReplyError,
    Reply,
    ScriptCall,
    never_ran,
)
from tubeq.redisio.futures import discard
from tubeq.store.keys import JobField, Keys
from tubeq.store.records import (
    CANCELLED,
    FINISHED_HERE,
    Clock,
    Deferred,
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
    ParentEnd,
    Progress,
    PutOutcome,
    Reservation,
    TubeCounts,
)
from tubeq.store.scripts import Library, Script, library, load_all

if TYPE_CHECKING:
    from tubeq.store.base import JobStore

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Scripts that sweep (promote, expire) move at most this many jobs per call, so one call never
# holds Redis's single thread for long; a sweep that hits the limit is called again at once.
SWEEP_LIMIT = 1000

# A kick of more jobs is made of calls of at most this many (kick.lua), and list-tubes reads the
# tubes in pages of TUBE_PAGE (tube_list.lua): however large the bound or the namespace, no one
# call holds Redis's single thread for more than a few ms (a kick of 1,000 jobs: ~5 ms).
KICK_CHUNK = 1000
TUBE_PAGE = 1000

# Dependencies (tell_children): parents' ends drained per call at most.
PARENT_ENDS_BATCH = 200

# pause_until (ms) of a tube paused with no end: lua/includes/jobs.lua's PAUSE_FOREVER.
PAUSE_FOREVER_MS = 10**15
# How stats-tube shows such a pause: pause-time-left 4294967295 (the longest pause-tube can ask),
# for as long as it lasts; the extra second absorbs the read-to-render gap of the clock.
_FOREVER_SHOWN_MS = (2**32 - 1 + 1) * 1000


# Scripts whose result acknowledges no state change to a client: reads, and the process's own
# bookkeeping and sweeps. With --min-replicas every other script's reply waits for the replicas
# (RedisClient.bind_script(durable=True)); these go at full speed, and the sweeps keep running
# while replicas are missing. A script not listed here (a new one) waits: the safe default.
UNACKNOWLEDGED_SCRIPTS = frozenset({
    "best", "tube_list", "peek", "stats", "stats_tube", "heartbeat", "reap", "promote",
    "expire", "counters", "using", "connect", "tubes", "disconnect", "restore", "recount",
    "count_jobs", "overview"})


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


# What job_info reads of a job's hash, in JobInfo's order.
JOB_INFO_FIELDS = (JobField.TUBE, JobField.STATE, JobField.PRI, JobField.CREATED, JobField.DELAY,
                   JobField.TTR, JobField.DUE, JobField.RESERVES, JobField.TIMEOUTS,
                   JobField.RELEASES, JobField.BURIES, JobField.KICKS)


def _as_int(v: Any) -> int:
    return int(v) if v is not None else 0


def _text(v: Any) -> str:
    return "" if v is None else bytes(v).decode(errors="replace")


# What a script returns for a deferred command (DEFERRED in lua/includes/jobs.lua).
DEFERRED_CODE = -1


def _numbered(number: int) -> tuple[int, ...]:
    """The optional trailing argument of a script that takes a reserve's number."""
    return (number,) if number else ()


def _unless_deferred(decode: Callable[[Any], T]) -> Callable[[Any], T]:
    def checked(r: Any) -> T:
        if r == DEFERRED_CODE:
            raise Deferred
        return decode(r)

    return checked


class Store:
    """Job state in Redis for one tubeq process (``instance_id``) in namespace ``keys``."""

    # A command pipelined behind a reserve may be sent at once, with the reserve's number
    # (:class:`Deferred`); a split namespace (tubeq.store.shards) cannot tell, as the reserve and
    # the job may live in two shards: its connections hold such commands instead.
    defers_behind_reserves = True

    def __init__(self, client: RedisClient, keys: Keys, instance_id: str,
                 clock: Clock = wall_clock_ms, *, events_maxlen: int = 0,
                 functions: bool = True) -> None:
        """``events_maxlen``: write lifecycle events to ``keys.events``, capped at about that
        many entries (:meth:`trim_events`); 0 writes none. ``functions``: call the scripts as
        the functions of one library where Redis has Functions (:meth:`load_scripts`); False
        keeps EVALSHA."""
        if events_maxlen < 0:
            raise ValueError("events_maxlen must be 0 (off) or positive")
        self.client = client
        self.keys = keys
        self.instance_id = instance_id
        self.clock = clock
        self.events_maxlen = events_maxlen
        # Tube "default" lives here (always, unless this is a shard of a split namespace that
        # does not hold it: tubeq.store.shards); the heartbeat keeps it in existence.
        self.holds_default = True
        # Set by the server when metrics are on: told of waits, holds and lateness the scripts
        # return (tubeq.server.metrics).
        self.metrics: JobObserver | None = None
        # Set by the server: where a put's job goes that put.lua handed straight to a push loop
        # of this process (its direct hand-over); unset, such a job waits for its TTR.
        self.direct_grants: DirectGrants | None = None
        self._scripts: dict[str, Script] = load_all()
        self._library: Library | None = library() if functions else None
        self.calls_functions = False  # set by load_scripts (or call_functions)
        self._described: dict[str, str] = {}  # describe_instance's fields, for restore
        self._calls = self._bind()
        # The calls of a paged read (list-tubes) or a long kick go one at a time per process,
        # whoever asked: a command of another client waits behind one page at most, not behind
        # every page that connections pipelined.
        self._one_page_at_a_time = asyncio.Lock()
        client.add_reconnect_callback(self._on_reconnect)

    @property
    def wants_functions(self) -> bool:
        """Whether this store calls the library's functions where Redis has them."""
        return self._library is not None

    def _bind(self) -> dict[str, ScriptCall]:
        event_args = (self.events_maxlen, self.instance_id)
        functions = self._library.functions if self.calls_functions and self._library else {}
        return {
            name: self.client.bind_script(s.sha, s.source, (self.keys.root,),
                                          event_args if s.records_events else (),
                                          durable=name not in UNACKNOWLEDGED_SCRIPTS,
                                          function=functions.get(name))
            for name, s in self._scripts.items()}

    async def load_scripts(self) -> bool:
        """Load the scripts into Redis, so that calls find them: the library (FUNCTION LOAD)
        where Redis has Functions, then calls go by FCALL; else (a Redis before 7.0, or
        ``functions=False``) every script for EVALSHA. Returns whether calls go by FCALL.

        The library's name is a hash of its code, so a Redis that lists a library of that name
        has this very code: it is loaded only when Redis lacks it (a new Redis, another build of
        tubeq), and a start on a Redis that has it costs one FUNCTION LIST round trip."""
        if self._library is not None:
            try:
                if not await self._has_library(self._library.name):
                    await self.client.call("FUNCTION", "LOAD", "REPLACE", self._library.source)
            except RedisReplyError as error:
                log.info("redis functions unavailable, scripts go by EVALSHA", reason=str(error))
            else:
                self.client.libraries[self._library.name] = self._library.source
                self.call_functions()
                return True
        await asyncio.gather(*(self.client.call("SCRIPT", "LOAD", s.source)
                               for s in self._scripts.values()))
        return False

    async def _has_library(self, name: str) -> bool:
        """Whether Redis has a function library named ``name`` (LIBRARYNAME is a pattern that
        must match the whole name; a name of letters, digits and '_' matches only itself)."""
        listed = await self.client.call("FUNCTION", "LIST", "LIBRARYNAME", name)
        return any(dict(zip(entry[::2], entry[1::2], strict=False)).get(b"library_name")
                   == name.encode() for entry in listed)

    def call_functions(self) -> None:
        """Call the scripts as the library's functions from now on: another Store on the same
        client loaded it (:meth:`load_scripts`)."""
        if self._library is not None and not self.calls_functions:
            self.calls_functions = True
            self._calls = self._bind()

    def exact_ms(self) -> float:
        """The clock with its fraction of a millisecond (the scheduler aims its timer with it)."""
        if self.clock is wall_clock_ms:
            return time.time() * 1000
        return float(self.clock())

    def _on_reconnect(self) -> None:
        # Issued before any later call on the fresh connection, so those find their SHAs. The
        # library of a store that calls functions the client loads itself, once for all stores.
        if self.calls_functions:
            return
        for s in self._scripts.values():
            self.client.call("SCRIPT", "LOAD", s.source).add_done_callback(discard)

    def _eval(self, name: str, *args: bytes | str | int,
              decode: Decoder | None = None) -> asyncio.Future[Any]:
        """Run a script by FCALL or EVALSHA (the client falls back to EVAL if Redis lost it)."""
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
        """``answer``: given the new id (0: the tube is full), straight from the reply (an
        integer reply is an int already; a job handed straight to a push loop of this process
        goes to :attr:`direct_grants` first)."""
        now = self.clock()

        def decode(r: Any) -> Any:
            if type(r) is list:
                r = self._handed_direct(r, tube, pri, ttr, body, now)
            return r if answer is None else answer(r)

        return self._eval("put", tube, pri, delay, ttr, body, now, decode=decode)

    def _handed_direct(self, r: list[Any], tube: str, pri: int, ttr: int, body: bytes,
                       now: int) -> int:
        """put.lua's ``{id, token}``: the new job was handed to that push connection of this
        process, stored reserved by it from ``now`` on; it goes there. Returns its id."""
        job_id = int(r[0])
        job = Reservation(job_id, ttr, body, now + ttr * 1000, 0, tube)
        if self.metrics is not None:
            self.metrics.job_reserved(tube, 0)
        if self.direct_grants is not None:
            self.direct_grants(r[1].decode(), job, pri)
        else:
            log.warning("a put's job was handed to a push connection nobody serves",
                        job=job_id, token=r[1].decode())
        return job_id

    def burn_id(self, tube: str = "default") -> asyncio.Future[int]:
        """Use up one job id (a put that failed after its body arrived, as beanstalkd does);
        ``tube``: the one the put was for (a split namespace burns that shard's next id)."""
        return self.client.call("INCR", self.keys.job_ids, decode=int)

    def reserve(self, token: str, *, counted_waiting: bool = False,
                number: int = 0) -> asyncio.Future[Reservation | NoJob]:
        """The next job for ``token``; if ``counted_waiting``, a grant also counts it out.
        ``number``: the reserve's number on its connection, for its first try (one that finds
        nothing defers the commands pipelined behind it, see :class:`Deferred`)."""
        now = self.clock()
        waiter = self.instance_id if counted_waiting else ""
        return self._eval("reserve", token, now, 1, waiter, *_numbered(number),
                          decode=lambda r: _reservation(r, now, self.metrics))

    def reserve_many(self, token: str, count: int, *, counted_waiting: bool = False,
                     number: int = 0, each: bool = False, stay: bool = False,
                     direct: bool = True) -> asyncio.Future[list[Reservation]]:
        """Up to ``count`` jobs in reserve order, in one script call (the push extension).
        ``each``: the first try of ``count`` pipelined reserves of one job each, numbered from
        ``number`` on (the ones left without a job wait, see :class:`Deferred`). ``stay``:
        the token ends counted in as waiting if no job came, else out, whatever it was (a try
        that finds nothing counts it in, in the same step): ``direct``, a push loop's take,
        which a put of this process may then hand jobs in the put's own reply (mode 'p');
        else a blocked reserve's try, handed jobs the classic way (mode '1': recorded and
        claimed, lua/includes/waiter_counts.lua)."""
        now = self.clock()
        waiter = ((("+" if direct else "=") + self.instance_id) if stay
                  else self.instance_id if counted_waiting else "")
        numbered = (number + count - 1, "each") if each and number else _numbered(number)
        return self._eval("reserve", token, now, count, waiter, *numbered,
                          decode=lambda r: _reservations(r, now, self.metrics))

    def reserve_job(self, token: str, job_id: int) -> asyncio.Future[Reservation | NoJob]:
        now = self.clock()
        return self._eval("reserve_job", token, job_id, now,
                          decode=lambda r: _reservation(r, now, self.metrics))

    @overload
    def delete(self, token: str, job_id: int, *, behind: int = 0) -> asyncio.Future[bool]:
        ...

    @overload
    def delete(self, token: str, job_id: int,
               answer: Callable[[bool], T], *, behind: int = 0) -> asyncio.Future[T]:
        ...

    def delete(self, token: str, job_id: int,
               answer: Callable[[bool], Any] | None = None, *,
               behind: int = 0) -> asyncio.Future[Any]:
        """``behind``: the number of the first unanswered reserve of ``token`` this delete was
        pipelined behind (0: none); the delete is then :class:`Deferred` if one of them waits.
        The same goes for bury, touch and delete_many."""
        metrics = self.metrics

        def decode(r: Any) -> Any:
            if r == DEFERRED_CODE:
                raise Deferred
            deleted = _deleted(r, metrics)
            return deleted if answer is None else answer(deleted)

        return self._eval("delete", token, job_id, self.clock(), *_numbered(behind),
                          decode=decode)

    def release(self, token: str, job_id: int, pri: int, delay: int) -> asyncio.Future[bool]:
        return self._eval("release", token, job_id, pri, delay, self.clock(), decode=bool)

    def finish(self, token: str, job_id: int, result: bytes, keep_ms: int, *,
               behind: int = 0) -> asyncio.Future[bool | int]:
        """True finished, FINISHED_HERE finished and its end told to this process only (the
        caller tells its waits), False not held, CANCELLED."""
        metrics = self.metrics
        return self._eval("finish", token, self.clock(), keep_ms, behind, job_id, result,
                          decode=_unless_deferred(lambda r: _finished(r[0], metrics)))

    def finish_many(self, token: str, jobs: Sequence[tuple[int, bytes]], keep_ms: int, *,
                    behind: int = 0) -> asyncio.Future[list[bool | int]]:
        """Finish each (id, result) as :meth:`finish` would, in one script call; per job, what
        finish answers."""
        metrics = self.metrics
        flat = [v for job_id, result in jobs for v in (job_id, result)]
        return self._eval("finish", token, self.clock(), keep_ms, behind, *flat,
                          decode=_unless_deferred(
                              lambda r: [_finished(v, metrics) for v in r]))

    def hand_back(self, token: str, job_id: int) -> asyncio.Future[int]:
        return self._eval("hand_back", token, job_id, self.clock(), decode=int)

    def cancel(self, job_id: int) -> asyncio.Future[int]:
        return self._eval("cancel", job_id, self.clock(), decode=int)

    def quiet(self, scope: str, target: str = "") -> asyncio.Future[int]:
        return self._eval("quiet", f"{scope} {target}" if target else scope, decode=int)

    def fail(self, token: str, job_id: int, error: bytes, *, behind: int = 0,
             worker_policy: Options = ()) -> asyncio.Future[Failed | None]:
        def decode(r: Any) -> Failed | None:
            return Failed(r[0].decode(), int(r[1])) if r else None

        policy = [x for pair in worker_policy for x in pair]
        return self._eval("fail", token, job_id, self.clock(), error, behind, *policy,
                          decode=_unless_deferred(decode))

    def wait_end(self, job_id: int, keep_ms: int, progress_after: int | None = None
                 ) -> asyncio.Future[JobEnd | Progress | bool]:
        extra = () if progress_after is None else (progress_after,)
        return self._eval("wait", job_id, keep_ms, *extra, decode=_job_end)

    # -- dependencies (put-with after=, lua/includes/after.lua) -------------------------------

    def add_child(self, child_id: int, keep_ms: int, parents: Sequence[int], *,
                  undo: bool = False) -> asyncio.Future[list[int]]:
        """Tell this shard's living ``parents`` of a child about to be put on another shard:
        what each is (PARENT_UNKNOWN ... PARENT_FAILED); ``undo``: forget the child again."""
        return self._eval("add_child", child_id, keep_ms, int(undo), *parents,
                          decode=lambda r: [int(v) for v in r])

    def parent_ends(self, limit: int) -> asyncio.Future[list[ParentEnd]]:
        """The oldest parents' ends not yet told to their children."""
        def decode(r: Any) -> list[ParentEnd]:
            return [ParentEnd.parse(bytes(r[i]), float(r[i + 1])) for i in range(0, len(r), 2)]

        return self.client.call("ZRANGE", self.keys.parent_ends, 0, limit - 1, "WITHSCORES",
                                decode=decode)

    def after_end(self, ends: Sequence[ParentEnd], *, early: bool) -> asyncio.Future[int]:
        """Tell this shard's children of their parents' ``ends``: the earliest due instant of
        a child released into delayed (0: none). ``early``: the parents are another shard's,
        so an end whose child is not found may have come before the child's put, which reads
        it (lua/includes/after.lua); else such a child is gone and its end dropped."""
        flat = [x for e in ends for x in (e.child, e.parent, int(e.done))]
        return self._eval("after_end", self.clock(), int(early), *flat, decode=int)

    async def tell_children(self, store_of: Callable[[int], Store] | None = None,
                            limit: int = PARENT_ENDS_BATCH) -> tuple[int, int]:
        """One batch of this shard's parents' ends, told to their children (``store_of``: the
        store of a child's id, this one by default): the ends handled, and the earliest due
        instant of a child released into delayed (0: none). Every end read is handled: a
        child of another shard not stored yet (tubeq.store.shards tells the parents before it
        stores the child) finds it on its own shard when it is put. Telling twice changes
        nothing, so any number of processes may drain at once."""
        ends = await self.parent_ends(limit)
        if not ends:
            return 0, 0
        by_store: dict[int, tuple[Store, list[ParentEnd]]] = {}
        for end in ends:
            store = self if store_of is None else store_of(end.child)
            by_store.setdefault(id(store), (store, []))[1].append(end)
        dues = await asyncio.gather(*(s.after_end(batch, early=s is not self)
                                      for s, batch in by_store.values()))
        await self.client.call("ZREM", self.keys.parent_ends, *(end.member for end in ends))
        return len(ends), min((due for due in dues if due), default=0)

    def progress(self, token: str, job_id: int, data: bytes, *,
                 behind: int = 0) -> asyncio.Future[int]:
        return self._eval("progress", token, job_id, self.clock(), data, *_numbered(behind),
                          decode=_unless_deferred(int))

    def bury(self, token: str, job_id: int, pri: int, *,
             behind: int = 0) -> asyncio.Future[bool]:
        return self._eval("bury", token, job_id, pri, self.clock(), *_numbered(behind),
                          decode=_unless_deferred(bool))

    def touch(self, token: str, job_id: int, *, behind: int = 0) -> asyncio.Future[int]:
        """The new deadline (ms), or 0 when the job is not reserved by ``token``, or
        CANCELLED (the job was cancelled: it is gone now)."""
        return self._eval("touch", token, job_id, self.clock(), *_numbered(behind),
                          decode=_unless_deferred(int))

    def kick(self, tube: str, bound: int) -> asyncio.Future[int]:
        """Kick up to ``bound`` jobs of ``tube`` (buried ones if it has any, else delayed), in
        calls of at most KICK_CHUNK, each going on from the set the first chose."""
        if bound <= KICK_CHUNK:
            return self._eval("kick", tube, bound, self.clock(), decode=lambda r: int(r[0]))
        return asyncio.ensure_future(self._kick_in_chunks(tube, bound))

    async def _kick_in_chunks(self, tube: str, bound: int) -> int:
        kicked, chosen = 0, ""
        while kicked < bound:
            asked = min(KICK_CHUNK, bound - kicked)
            async with self._one_page_at_a_time:
                n, chosen = await self._eval("kick", tube, asked, self.clock(), chosen,
                                             decode=lambda r: (int(r[0]), r[1].decode()))
            kicked += n
            if n < asked:
                break
        return kicked

    def kick_job(self, job_id: int) -> asyncio.Future[bool]:
        return self._eval("kick_job", job_id, self.clock(), decode=bool)

    def peek(self, job_id: int) -> asyncio.Future[bytes | None]:
        return self.client.call("HGET", self.keys.job(job_id), JobField.BODY,
                                decode=_bytes_or_none)

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

        return self.client.call("HMGET", self.keys.job(job_id), *JOB_INFO_FIELDS, decode=decode)

    # -- tubes --------------------------------------------------------------------------------

    def tube_counts(self, tube: str) -> asyncio.Future[list[int] | None]:
        def decode(r: Any) -> list[int] | None:
            counts = [int(v) for v in r]
            # A pause with no end (tube-pause) shows as the longest pause-tube, never ending.
            if counts and counts[-1] >= PAUSE_FOREVER_MS:
                counts[-1] = self.clock() + _FOREVER_SHOWN_MS
            return counts or None

        return self._eval("stats_tube", tube, decode=decode)

    def set_tube(self, tube: str, settings: Options) -> asyncio.Future[Reply]:
        """Change a tube's settings (tubeq.model.options.TUBE_SETTINGS); defaults remove them."""
        flat = [x for pair in settings for x in pair]
        return self._eval("tube_set", tube, self.clock(), *flat)

    def tube_settings(self, tube: str) -> asyncio.Future[dict[str, OptionValue]]:
        """Every setting of ``tube``: its own value, else the default."""
        def decode(r: Any) -> dict[str, OptionValue]:
            values: dict[str, OptionValue] = dict(DEFAULTS)
            for name, raw in zip(r[::2], r[1::2], strict=True):
                text = raw.decode()
                values[name.decode()] = text if not text.isdigit() else int(text)
            return values

        return self.client.call("HGETALL", self.keys.settings(tube), decode=decode)

    def count_jobs(self) -> asyncio.Future[int]:
        """Every job of the namespace, in every state (count_jobs.lua: O(1))."""
        return self._eval("count_jobs", decode=int)

    def recount(self, *, force: bool = False) -> asyncio.Future[int]:
        """Set the namespace's jobs by state from its tubes where they are not known to be
        whole, or always with ``force`` (recount.lua; O(tubes), at start only). Returns the
        tubes visited, -1 when nothing was done."""
        return self._eval("recount", "1" if force else "0", decode=int)

    def list_tubes(self) -> asyncio.Future[list[str]]:
        """Every tube in creation order, read in pages of TUBE_PAGE."""
        return asyncio.ensure_future(self._list_tubes())

    async def _list_tubes(self) -> list[str]:
        tubes: list[str] = []
        while True:
            async with self._one_page_at_a_time:
                page = await self.client.call(
                    "ZRANGE", self.keys.tubes, len(tubes), len(tubes) + TUBE_PAGE - 1,
                    decode=lambda r: [v.decode() for v in r])
            tubes += page
            if len(page) < TUBE_PAGE:
                return tubes

    def tubes_created(self) -> asyncio.Future[list[tuple[str, int]]]:
        """Every tube in creation order, with its creation time by Redis's clock (us), read in
        pages of TUBE_PAGE."""
        return asyncio.ensure_future(self._tubes_created())

    async def _tubes_created(self) -> list[tuple[str, int]]:
        def decode(r: Any) -> list[tuple[str, int]]:
            return [(r[i].decode(), int(r[i + 1])) for i in range(0, len(r), 2)]

        tubes: list[tuple[str, int]] = []
        while True:
            async with self._one_page_at_a_time:
                page = await self._eval("tube_list", len(tubes), TUBE_PAGE, decode=decode)
            tubes += page
            if len(page) < TUBE_PAGE:
                return tubes

    def pause(self, tube: str, delay: int) -> asyncio.Future[int]:
        """The pause end (ms), -1 when resumed at once, 0 when the tube does not exist."""
        return self._eval("pause", tube, delay, self.clock(), decode=int)

    def server_counts(self) -> asyncio.Future[tuple[list[int], dict[str, int]]]:
        def decode(r: Any) -> tuple[list[int], dict[str, int]]:
            pairs = r[10:]
            named = {pairs[i].decode(): int(pairs[i + 1]) for i in range(0, len(pairs), 2)}
            return [int(v) for v in r[:10]], named

        return self._eval("stats", decode=decode)

    def add_counters(self, fields: dict[str, int],
                     refused: Callable[[dict[str, int]], None]) -> None:
        """Add one process's command counts (server stats fields, cmd-*) to the shared
        counters. Counts that surely did not reach Redis (refused, or no connection) go back
        to ``refused``; nothing else is waited for."""
        flat: list[str | int] = []
        for name, delta in fields.items():
            flat += (name, delta)

        def sent(call: asyncio.Future[Any]) -> None:
            if call.cancelled():
                return
            error = call.exception()
            if error is not None and never_ran(error):
                refused(fields)

        self._eval("counters", *flat).add_done_callback(sent)

    def overview(self, limit: int) -> asyncio.Future[tuple[int, list[TubeCounts]]]:
        """The first tubes' counts in one read (overview.lua, O(limit)): the number of tubes,
        and a row for each of the first ``limit`` tubes in creation order plus, if there are
        more, one row named "" with the rest's job counts (its deletes, waiting, watching and
        using are 0: not summed)."""
        def decode(r: Any) -> tuple[int, list[TubeCounts]]:
            rows = [TubeCounts(r[i].decode(), *(int(v) for v in r[i + 1:i + 12]))
                    for i in range(1, len(r), 12)]
            return int(r[0]), rows

        return self._eval("overview", limit, decode=decode)

    def browse(self, tube: str, state: str, limit: int) -> asyncio.Future[list[JobSummary]]:
        """The first ``limit`` jobs of ``tube`` in ``state``, in that state's order."""
        def decode(r: Any) -> list[JobSummary]:
            return [JobSummary(int(r[i]), int(r[i + 1]), int(r[i + 2]), int(r[i + 3]),
                               int(r[i + 4]), bytes(r[i + 5])) for i in range(0, len(r), 6)]

        return self._eval("browse", tube, state, limit, decode=decode)

    async def instances(self) -> list[InstanceInfo]:
        """The tubeq processes of this namespace (heartbeat.lua's registry), oldest first."""
        beats = await self.client.call("ZRANGE", self.keys.instances, 0, -1, "WITHSCORES")
        names = [beats[i].decode() for i in range(0, len(beats), 2)]
        fields = ("addr", "http", "conns", "producers", "workers", "waiting")
        rows = await asyncio.gather(*(self.client.call("HMGET", self.keys.instance(name), *fields)
                                      for name in names))
        return [InstanceInfo(name, int(float(beats[2 * i + 1])),
                             _text(row[0]), _text(row[1]), *(_as_int(v) for v in row[2:]))
                for i, (name, row) in enumerate(zip(names, rows, strict=True))]

    # -- connections --------------------------------------------------------------------------

    def connect(self, token: str) -> asyncio.Future[Reply]:
        return self._eval("connect", self.instance_id, token, self.clock())

    def change_watches(self, token: str, ops: Sequence[tuple[str, str]]) -> asyncio.Future[Reply]:
        """Apply ``(op, tube)`` pairs to a connection's watch list; op is ``+w`` or ``-w``."""
        flat = [x for op in ops for x in op]
        return self._eval("tubes", self.instance_id, token, self.clock(), *flat)

    def forget_watch_change(self, token: str, tube: str, *, added: bool) -> None:
        """A change_watches call failed: nothing here remembers it (a split namespace's store
        does: tubeq.store.shards)."""

    def set_using(self, counts: Sequence[tuple[str, int]]) -> asyncio.Future[Reply]:
        """How many of this process's connections use each tube (absolute counts)."""
        flat = [x for pair in counts for x in pair]
        return self._eval("using", self.instance_id, self.clock(), *flat)

    def set_waiting(self, token: str, delta: int, *, claim: bool = False,
                    mode: str = "1") -> asyncio.Future[list[Reservation]]:
        """Count ``token`` in (1) or out (-1) of the waiters; with ``claim``, also take the jobs
        a put handed to it while it waited (put.lua), which are its already. ``mode`` (counting
        in): "1" puts may hand it a job; "h" / "o" wake-ups only, for a connection that waits on
        several shards (tubeq.store.shards; lua/includes/waiter_counts.lua)."""
        now = self.clock()
        return self._eval("count_waiting", self.instance_id, token, delta,
                          "1" if claim else "0", mode,
                          decode=lambda r: _reservations(r, now, self.metrics))

    def best(self, token: str) -> asyncio.Future[tuple[int, int, int] | None]:
        """(pri, created ms, id) of the job :meth:`reserve` would give ``token`` now, without
        taking it; (-1, 0, 0) when a put handed it one; None when nothing is reservable."""
        def decode(r: Any) -> tuple[int, int, int] | None:
            return (int(r[0]), int(r[1]), int(r[2])) if r else None

        return self._eval("best", token, decode=decode)

    def describe_instance(self, fields: dict[str, str]) -> asyncio.Future[Reply]:
        """Where this process listens (``addr``, ``http``), for the dashboard's server list;
        kept in its instance hash, which reap.lua removes with the instance (:meth:`restore`
        writes it again)."""
        self._described = dict(fields)
        flat = [x for pair in fields.items() for x in pair]
        return self.client.call("HSET", self.keys.instance(self.instance_id), *flat)

    def bump_gauge(self, field: str, delta: int) -> None:
        call = self.client.call("HINCRBY", self.keys.instance(self.instance_id), field, delta)
        call.add_done_callback(discard)

    def disconnect(self, token: str, producer: bool, worker: bool,
                   reserved: Sequence[int], *, home: bool = True,
                   shutdown: bool = False) -> asyncio.Future[Reply]:
        """``home``: :meth:`connect` counted the connection in this store (a split namespace's
        other shards only saw its watches: tubeq.store.shards)."""
        return self._eval("disconnect", token, int(producer), int(worker), self.clock(),
                          int(home), int(shutdown), *reserved)

    # -- time ---------------------------------------------------------------------------------

    def trim_events(self) -> asyncio.Future[Reply] | None:
        """Trim the event stream to about ``events_maxlen`` entries (XTRIM MAXLEN ~: whole
        stream nodes). The scheduler calls it once a second: a MAXLEN on every XADD cost
        ~0.35 us of Redis per event (bench/RESULTS-pipeline.md), the stream may now pass the
        cap by a second's worth of events. None when events are off."""
        if not self.events_maxlen:
            return None
        return self.client.call("XTRIM", self.keys.events, "MAXLEN", "~", self.events_maxlen)

    def heartbeat(self) -> asyncio.Future[bool]:
        """Say this process is alive; True when it was not registered (its first beat, or it
        was reaped or lost meanwhile: see :meth:`restore`)."""
        return self._eval("heartbeat", self.instance_id, self.clock(),
                          int(self.holds_default), decode=lambda r: bool(int(r)))

    def restore(self, watches: Sequence[tuple[str, bool, Sequence[str]]],
                gauges: tuple[int, int, int] | None) -> asyncio.Future[int]:
        """Make Redis hold this process's registrations again after a reap or a lost Redis
        (restore.lua): ``watches`` lists every token of the process (its connections, flagged
        True, and its HTTP reservations) with the tubes it watches in this store; with
        ``gauges`` (connections, producers, workers; None: a shard of a split namespace that is
        not the connections' home) also the connection set, the gauges and
        :meth:`describe_instance`'s fields. Idempotent; the future gives the number of watches
        created anew. One script call: a process of thousands of connections holds Redis for
        a few milliseconds, once."""
        home = gauges is not None
        conns, producers, workers = gauges or (0, 0, 0)
        flat: list[str | int] = []
        for token, connection, tubes in watches:
            flat += [token, "c" if connection else "r", len(tubes), *tubes]
        restored = self._eval("restore", self.instance_id, self.clock(), int(home),
                              conns, producers, workers, *flat, decode=int)
        if home and self._described:
            self.describe_instance(self._described).add_done_callback(discard)
        return restored

    def reap(self, stale_before_ms: int) -> asyncio.Future[int]:
        return self._eval("reap", stale_before_ms, self.clock(), decode=int)

    def leave(self) -> asyncio.Future[int]:
        """Take this process out of the namespace (clean shutdown)."""
        return self._eval("reap", 0, self.clock(), self.instance_id, decode=int)

    def promote(self) -> asyncio.Future[tuple[int, list[str]]]:
        metrics = self.metrics

        def decode(r: Any) -> tuple[int, list[str]]:
            # promote.lua: {next due, {tube, ...}, {lateness ms, ...}}
            if metrics is not None and r[2]:
                metrics.jobs_promoted([int(v) for v in r[2]])
            return int(r[0]), [v.decode() for v in r[1]]

        return self._eval("promote", self.clock(), SWEEP_LIMIT, decode=decode)

    def expire(self) -> asyncio.Future[tuple[int, list[str]]]:
        return self._eval("expire", self.clock(), SWEEP_LIMIT, decode=_sweep)

    # -- recurring jobs (tubeq.model.recurring) -----------------------------------------------

    def schedule_add(self, tube: str, name: str, kind: str, spec: str, pri: int, ttr: int,
                     delay_ms: int, body: bytes, first_due_ms: int,
                     ) -> asyncio.Future[tuple[int, bool]]:
        """Create or replace a schedule; (its first due time, whether it is new)."""
        return self._eval("schedule_add", tube, name, kind, spec, pri, ttr, delay_ms, body,
                          first_due_ms, self.clock(),
                          decode=lambda r: (int(r[0]), bool(r[1])))

    def schedule_remove(self, tube: str, name: str) -> asyncio.Future[bool]:
        return self._eval("schedule_remove", tube, name, decode=bool)

    def schedule_list(self, tube: str) -> asyncio.Future[list[ScheduleInfo]]:
        def decode(r: Any) -> list[ScheduleInfo]:
            return [ScheduleInfo(r[i].decode(), r[i + 1].decode(), r[i + 2].decode(),
                                 *(int(v) for v in r[i + 3:i + 11]))
                    for i in range(0, len(r), 11)]

        return self._eval("schedule_list", tube, decode=decode)

    def schedules_due(self) -> asyncio.Future[tuple[int, list[DueTick]]]:
        """The schedules due now, and the earliest due time after now (-1: none)."""
        def decode(r: Any) -> tuple[int, list[DueTick]]:
            due = [DueTick(r[i].decode(), r[i + 1].decode(), int(r[i + 2]), int(r[i + 3]),
                           r[i + 4].decode(), r[i + 5].decode(), int(r[i + 6]))
                   for i in range(1, len(r), 7)]
            return int(r[0]), due

        return self._eval("schedule_due", self.clock(), SWEEP_LIMIT, decode=decode)

    def schedule_tick(self, tick: DueTick, next_due_ms: int) -> asyncio.Future[int]:
        """Run ``tick``: the id of the job it put, or 0 if it was not this caller's to run."""
        return self._eval("schedule_tick", tick.tube, tick.name, tick.generation, tick.due_ms,
                          next_due_ms, self.clock(), decode=int)

    # -- admin verbs and figures (tubeq.model.admin) ------------------------------------------

    def clear_tube_batch(self, tube: str, states: Sequence[str], limit: int = admin.CLEAR_BATCH,
                         ) -> asyncio.Future[tuple[int, bool]]:
        """Delete up to ``limit`` jobs of ``tube`` in ``states`` (ready, delayed, buried);
        returns (deleted, whether those states are now empty), or (-1, True) with no tube."""
        letters = "".join(state[0] for state in states)
        return self._eval("clear_tube", tube, letters, limit, self.clock(),
                          decode=lambda r: (int(r[0]), bool(r[1])))

    async def clear_tube(self, tube: str, states: Sequence[str]) -> int | None:
        """Delete every job of ``tube`` in ``states``, a batch per script call, until they are
        empty (jobs put meanwhile into them go too); the count, or None when no such tube."""
        total = 0
        while True:
            deleted, done = await self.clear_tube_batch(tube, states)
            if deleted < 0:  # the tube went away after a batch (its last job was deleted)
                return None if total == 0 else total
            total += deleted
            if done:
                return total

    def list_jobs(self, tube: str, state: str, cursor: tuple[int, int] | None, count: int,
                  ) -> asyncio.Future[admin.JobPage | None]:
        """A page of up to ``count`` jobs of ``tube`` in ``state`` after ``cursor`` (None: from
        the start), in the state's order; None when no such tube."""
        score, job_id = ("", "") if cursor is None else cursor
        return self._eval("list_jobs", tube, state, score, job_id, count,
                          admin.LIST_SCAN_BUDGET,
                          decode=lambda r: admin.job_page(r[1:]) if int(r[0]) else None)

    def change_pri(self, job_id: int, pri: int) -> asyncio.Future[bool]:
        """Give a job a new priority (any state); False when there is no such job."""
        return self._eval("change_pri", job_id, pri, self.clock(), decode=bool)

    def change_delay(self, job_id: int, delay_ms: int) -> asyncio.Future[int]:
        """A delayed job becomes due ``delay_ms`` from now: its new due time (ms), -1 when it
        became ready at once (0 ms), 0 when there is no such delayed job."""
        return self._eval("change_delay", job_id, delay_ms, self.clock(), decode=int)

    def tube_pause(self, tube: str, *, forever: bool) -> asyncio.Future[bool]:
        """Pause ``tube`` with no end (``forever``), or end its pause; False: no such tube."""
        return self._eval("tube_pause", tube, "pause" if forever else "resume", self.clock(),
                          decode=bool)

    def tube_figures(self, tube: str) -> asyncio.Future[admin.TubeFigures | None]:
        """tubeq's own stats-tube figures; None when no such tube."""
        def decode(r: Any) -> admin.TubeFigures | None:
            if not r:
                return None
            oldest = int(r[-1])
            return admin.TubeFigures(tuple(int(v) for v in r[:-1]),
                                     None if oldest < 0 else oldest)

        return self._eval("tube_figures", tube, self.clock(), *admin.DELAY_BOUNDS_MS,
                          admin.OLDEST_READY_LEVELS, decode=decode)

    def tube_groups(self, tube: str) -> asyncio.Future[admin.TubeGroups]:
        """A tube's groups (put-with group=): how many have ready jobs, the busiest first."""
        def decode(r: Any) -> admin.TubeGroups:
            loads = tuple(admin.GroupLoad(bytes(r[i]).decode(), int(r[i + 1]), int(r[i + 2]))
                          for i in range(1, len(r), 3))
            return admin.TubeGroups(int(r[0]), loads)

        return self._eval("group_stats", tube, admin.BUSIEST_GROUPS, admin.GROUP_SCAN_BUDGET,
                          decode=decode)

    # -- batches ------------------------------------------------------------------------------

    def put_many(self, tube: str, jobs: Sequence[tuple[int, int, int, bytes]], *,
                 send_now: bool = False, groups: Sequence[str] | None = None,
                 traceparents: Sequence[str] | None = None) -> asyncio.Future[list[int]]:
        """Put ``(pri, delay, ttr, body)`` jobs into ``tube`` in one script call; their ids, in
        order. ``send_now``: written to Redis at once, not at the end of the loop's turn.
        ``groups``: each job's group ("" for none; None: no job has one); ``traceparents``
        the same of their traceparents."""
        flat: list[bytes | str | int] = []
        if traceparents is not None:
            flat.append("t")  # put_many.lua: each job with its group and its traceparent
            for (pri, delay, ttr, body), group, traceparent in zip(
                    jobs, groups or [""] * len(jobs), traceparents, strict=True):
                flat += (pri, delay, ttr, group, traceparent, body)
        elif groups is None:
            for job in jobs:
                flat += job
        else:
            flat.append("g")  # put_many.lua: each job with its group
            for (pri, delay, ttr, body), group in zip(jobs, groups, strict=True):
                flat += (pri, delay, ttr, group, body)
        call = self._eval("put_many", tube, self.clock(), *flat,
                          decode=lambda r: [int(v) for v in r])
        if send_now:
            self.client.send_now()
        return call

    def put_calls(self, tube: str, jobs: Sequence[tuple[int, int, int, bytes]], keep_ms: int,
                  budget: Sequence[tuple[str, int]]) -> asyncio.Future[list[int]]:
        """Put ``(pri, delay, ttr, body)`` jobs into ``tube`` in one script call, each waited
        for by this process from its birth, its end kept ``keep_ms`` (put-with notify-ms's
        calls, as :meth:`put_with` with the option ``waited``); their ids, in order (0: the
        tube was full). A ready job may go straight to a push loop of this process
        (``direct_grants``), at most as many to a token as ``budget`` pairs with it (and no
        more by another hand-over: past it, the job stays ready for its process to take)."""
        now = self.clock()
        flat: list[bytes | str | int] = ["w", keep_ms, len(budget)]
        for token, free in budget:
            flat += (token, free)
        for job in jobs:
            flat += job

        def decode(r: Any) -> list[int]:
            ids = []
            for (pri, _, ttr, body), v in zip(jobs, r, strict=True):
                ids.append(self._handed_direct(v, tube, pri, ttr, body, now)
                           if isinstance(v, list) else int(v))
            return ids

        return self._eval("put_many", tube, now, *flat, decode=decode)

    def delete_many(self, token: str, ids: Sequence[int], *,
                    behind: int = 0) -> asyncio.Future[list[bool]]:
        """Delete each id as :meth:`delete` would, in one script call; per id, whether it was
        deleted."""
        metrics = self.metrics
        return self._eval("delete_many", token, self.clock(), behind, *ids,
                          decode=_unless_deferred(lambda r: _deleted_many(r, metrics)))

    # -- job policies and deduplicated put (lua/includes/policies.lua) ------------------------

    def put_with(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
                 opts: Options) -> asyncio.Future[PutOutcome]:
        """A put with options (tubeq.model.options.PUT_OPTIONS): the new job, or the living job
        whose dedupe key the options name (then nothing was stored)."""
        flat = [x for pair in opts for x in pair]
        now = self.clock()

        def decode(r: Any) -> PutOutcome:
            if isinstance(r, list):
                if r[0] == b"unknown":  # {'unknown', parent}: after= names a job tubeq lacks
                    return PutOutcome(0, False, unknown_parent=int(r[1]))
                return PutOutcome(self._handed_direct(r, tube, pri, ttr, body, now), True)
            job_id = int(r)
            return PutOutcome(abs(job_id), inserted=job_id > 0)

        return self._eval("put", tube, pri, delay, ttr, body, now, *flat, decode=decode)

    def peek_key(self, key: str) -> asyncio.Future[tuple[int, bytes] | None]:
        """The living job put with dedupe ``key``: (id, body), or None."""
        def decode(r: Any) -> tuple[int, bytes] | None:
            return (int(r[0]), bytes(r[1])) if r else None

        return self._eval("peek_key", key, decode=decode)

    def job_policies(self, job_id: int) -> asyncio.Future[JobPolicies | None]:
        """The policy state stats-job shows a tubeq client, or None if the job is gone."""
        def decode(r: Any) -> JobPolicies | None:
            if not r:
                return None
            return JobPolicies(bytes(r[0]).decode(), int(r[1]), int(r[2]), int(r[3]),
                               bytes(r[4]).decode(), int(r[5]), bytes(r[6]), int(r[7]),
                               bytes(r[8]), int(r[9]), bytes(r[10]).decode())

        return self._eval("job_policies", job_id, decode=decode)

    def job_trace(self, job_id: int) -> asyncio.Future[JobTrace | None]:
        """A job's trace context and the instants its spans need (a plain read, asked only
        by a process that exports traces: tubeq.server.tracing); None when it has no
        traceparent or is gone."""
        def decode(r: Any) -> JobTrace | None:
            if r[0] is None:
                return None
            return JobTrace(r[0].decode(), _as_int(r[1]), _as_int(r[2]), _as_int(r[3]))

        return self.client.call("HMGET", self.keys.job(job_id), JobField.TRACEPARENT,
                                JobField.CREATED, JobField.READY_SINCE, JobField.RESERVES,
                                decode=decode)

    def tube_policy_counts(self, tube: str) -> asyncio.Future[list[int]]:
        """A tube's jobs expired, dead-lettered (max-tries), deduplicated puts, its jobs
        finished and failures reported (finish, fail), its jobs held now and buried because a
        parent failed (put-with after=)."""
        return self.client.call("HMGET", self.keys.tube(tube), "nexp", "ndl", "ndd", "nfin",
                                "nfail", "nheld", "npf",
                                decode=lambda r: [_as_int(v) for v in r])


def _job_end(r: Any) -> JobEnd | Progress | bool:
    """wait.lua's reply: {how, data} | {'progress', count, data} | 1 | 0."""
    if isinstance(r, list):
        if len(r) == 3:
            return Progress(int(r[1]), r[2])
        return JobEnd(r[0].decode(), r[1])
    return bool(r)


def _finished(r: Any, metrics: JobObserver | None) -> bool | int:
    """What finish.lua answered for one job: True finished,
    FINISHED_HERE finished and its end told to this process only, False not held, CANCELLED;
    the held time of a finished job goes to the metrics as a delete's does."""
    if r == CANCELLED:
        return CANCELLED
    if _deleted(r, metrics) and len(r) > 2:
        return FINISHED_HERE
    return bool(r)


def _deleted(r: Any, metrics: JobObserver | None) -> bool:
    """Whether delete.lua (or delete_many.lua, for one id) deleted the job: {held_ms, tube} |
    0; its held time goes to the metrics (the reserved->deleted histogram)."""
    if not r:
        return False
    if metrics is not None:
        metrics.job_deleted(r[1], r[0])  # the tube's name as Redis sent it; an int
    return True


def _deleted_many(r: Any, metrics: JobObserver | None) -> list[bool]:
    """Per id, whether delete_many.lua deleted it ({held_ms, tube} | 0); the held times go to
    the metrics together."""
    if metrics is not None:
        metrics.jobs_deleted(r)
    return list(map(bool, r))


def _reservations(r: Any, now: int, metrics: JobObserver | None) -> list[Reservation]:
    """Jobs as reserve.lua and count_waiting.lua return them: {id, ttr, body, waited, tube,
    ...} (grant in lua/includes/jobs.lua)."""
    out = []
    for i in range(0, len(r), 5):
        ttr = int(r[i + 1])
        out.append(Reservation(int(r[i]), ttr, bytes(r[i + 2]), now + ttr * 1000,
                               int(r[i + 3]), r[i + 4].decode()))
    if metrics is not None:
        metrics.jobs_reserved(out)
    return out


def _reservation(r: Any, now: int, metrics: JobObserver | None) -> Reservation | NoJob:
    if not r:
        return NoJob()
    ttr, waited, tube = int(r[1]), int(r[3]), r[4].decode()
    if metrics is not None:
        metrics.job_reserved(tube, waited)
    return Reservation(int(r[0]), ttr, bytes(r[2]), now + ttr * 1000, waited, tube)


def _sweep(r: Any) -> tuple[int, list[str]]:
    return int(r[0]), [v.decode() for v in r[1:]]


def _bytes_or_none(v: Any) -> bytes | None:
    return None if v is None else bytes(v)


if TYPE_CHECKING:
    def _one_root_is_a_job_store(store: Store) -> JobStore:
        """mypy's check that Store implements the whole JobStore (never run)."""
        return store
