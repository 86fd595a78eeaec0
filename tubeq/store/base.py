"""The job store as the layers above hold it: :class:`JobStore`, a typing Protocol.

Owns: the list of what a store offers the server and the HTTP API: every public method of
:class:`tubeq.store.store.Store` and the attributes the server reads, in the store's feature
order (jobs, tubes, connections, time, recurring jobs, admin verbs, batches, job policies).
What belongs to one Redis root only (its client, its script loading state) is not listed.

Rules:

* Two classes implement it, neither by inheritance: :class:`~tubeq.store.store.Store` (one
  Redis root) and :class:`~tubeq.store.shards.ShardedStore` (a namespace split into shards,
  holding a Store per shard). mypy checks both wherever one is held as a JobStore, so a member
  added here and not routed by the split store is a type error, not a runtime surprise.
* Typing only: code above the store annotates ``JobStore`` and calls the object it was given,
  so an unsplit namespace's put, reserve and delete call Store's methods directly.
* The result records are tubeq.store.records'; this module imports no implementation (each
  implementation checks itself against it: the end of tubeq.store.store and of
  tubeq.store.shards).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, overload

from tubeq.model import admin
from tubeq.model.options import Options, OptionValue
from tubeq.model.recurring import DueTick, ScheduleInfo
from tubeq.redisio.client import Reply
from tubeq.store.keys import Keys
from tubeq.store.records import (
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

T = TypeVar("T")


class JobStore(Protocol):
    """Job state in Redis for one tubeq process in one namespace (the method contracts are
    Store's, tubeq.store.store)."""

    keys: Keys  # the namespace's own root (a split namespace keeps its shards' elsewhere)
    instance_id: str
    clock: Clock
    # Whether a command pipelined behind a reserve may be sent at once (records.Deferred).
    defers_behind_reserves: bool
    metrics: JobObserver | None
    direct_grants: DirectGrants | None

    async def load_scripts(self) -> bool: ...

    def call_functions(self) -> None: ...

    def exact_ms(self) -> float: ...

    # -- jobs ---------------------------------------------------------------------------------

    @overload
    def put(self, tube: str, pri: int, delay: int, ttr: int,
            body: bytes) -> asyncio.Future[int]: ...

    @overload
    def put(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
            answer: Callable[[int], T]) -> asyncio.Future[T]: ...

    def burn_id(self, tube: str = ...) -> asyncio.Future[int]: ...

    def reserve(self, token: str, *, counted_waiting: bool = False,
                number: int = 0) -> asyncio.Future[Reservation | NoJob]: ...

    def reserve_many(self, token: str, count: int, *, counted_waiting: bool = False,
                     number: int = 0, each: bool = False, stay: bool = False,
                     direct: bool = True) -> asyncio.Future[list[Reservation]]: ...

    def reserve_job(self, token: str, job_id: int) -> asyncio.Future[Reservation | NoJob]: ...

    @overload
    def delete(self, token: str, job_id: int, *, behind: int = 0) -> asyncio.Future[bool]: ...

    @overload
    def delete(self, token: str, job_id: int,
               answer: Callable[[bool], T], *, behind: int = 0) -> asyncio.Future[T]: ...

    def release(self, token: str, job_id: int, pri: int,
                delay: int) -> asyncio.Future[bool]: ...

    def bury(self, token: str, job_id: int, pri: int, *,
             behind: int = 0) -> asyncio.Future[bool]: ...

    def touch(self, token: str, job_id: int, *, behind: int = 0) -> asyncio.Future[int]: ...

    def kick(self, tube: str, bound: int) -> asyncio.Future[int]: ...

    def kick_job(self, job_id: int) -> asyncio.Future[bool]: ...

    def peek(self, job_id: int) -> asyncio.Future[bytes | None]: ...

    def peek_state(self, state: str,
                   tube: str) -> asyncio.Future[tuple[int, bytes] | None]: ...

    def job_info(self, job_id: int) -> asyncio.Future[JobInfo | None]: ...

    # -- tubes --------------------------------------------------------------------------------

    def tube_counts(self, tube: str) -> asyncio.Future[list[int] | None]: ...

    def set_tube(self, tube: str, settings: Options) -> asyncio.Future[Reply]: ...

    def tube_settings(self, tube: str) -> asyncio.Future[dict[str, OptionValue]]: ...

    def count_jobs(self) -> asyncio.Future[int]: ...

    def recount(self, *, force: bool = False) -> asyncio.Future[int]: ...

    def list_tubes(self) -> asyncio.Future[list[str]]: ...

    def tubes_created(self) -> asyncio.Future[list[tuple[str, int]]]: ...

    def pause(self, tube: str, delay: int) -> asyncio.Future[int]: ...

    def server_counts(self) -> asyncio.Future[tuple[list[int], dict[str, int]]]: ...

    def add_counters(self, fields: dict[str, int],
                     refused: Callable[[dict[str, int]], None]) -> None: ...

    def overview(self, limit: int) -> asyncio.Future[tuple[int, list[TubeCounts]]]: ...

    def browse(self, tube: str, state: str, limit: int) -> asyncio.Future[list[JobSummary]]: ...

    async def instances(self) -> list[InstanceInfo]: ...

    # -- connections --------------------------------------------------------------------------

    def connect(self, token: str) -> asyncio.Future[Reply]: ...

    def change_watches(self, token: str,
                       ops: Sequence[tuple[str, str]]) -> asyncio.Future[Reply]: ...

    def forget_watch_change(self, token: str, tube: str, *, added: bool) -> None: ...

    def set_using(self, counts: Sequence[tuple[str, int]]) -> asyncio.Future[Reply]: ...

    def set_waiting(self, token: str, delta: int, *, claim: bool = False,
                    mode: str = "1") -> asyncio.Future[list[Reservation]]: ...

    def best(self, token: str) -> asyncio.Future[tuple[int, int, int] | None]: ...

    def describe_instance(self, fields: dict[str, str]) -> asyncio.Future[Reply]: ...

    def bump_gauge(self, field: str, delta: int) -> None: ...

    def disconnect(self, token: str, producer: bool, worker: bool,
                   reserved: Sequence[int], *, home: bool = True,
                   shutdown: bool = False) -> asyncio.Future[Reply]:
        """The connection is gone: its ``reserved`` jobs back to ready, each ending a try,
        unless ``shutdown`` (its process stopping closed it: no try counted)."""
        ...

    # -- time ---------------------------------------------------------------------------------

    def trim_events(self) -> asyncio.Future[Reply] | None: ...

    def heartbeat(self) -> asyncio.Future[bool]: ...

    def restore(self, watches: Sequence[tuple[str, bool, Sequence[str]]],
                gauges: tuple[int, int, int] | None) -> asyncio.Future[int]: ...

    def reap(self, stale_before_ms: int) -> asyncio.Future[int]: ...

    def leave(self) -> asyncio.Future[int]: ...

    def promote(self) -> asyncio.Future[tuple[int, list[str]]]: ...

    def expire(self) -> asyncio.Future[tuple[int, list[str]]]: ...

    # -- recurring jobs (tubeq.model.recurring) -----------------------------------------------

    def schedule_add(self, tube: str, name: str, kind: str, spec: str, pri: int, ttr: int,
                     delay_ms: int, body: bytes,
                     first_due_ms: int) -> asyncio.Future[tuple[int, bool]]: ...

    def schedule_remove(self, tube: str, name: str) -> asyncio.Future[bool]: ...

    def schedule_list(self, tube: str) -> asyncio.Future[list[ScheduleInfo]]: ...

    def schedules_due(self) -> asyncio.Future[tuple[int, list[DueTick]]]: ...

    def schedule_tick(self, tick: DueTick, next_due_ms: int) -> asyncio.Future[int]: ...

    # -- admin verbs (tubeq.model.admin) ------------------------------------------------------

    def clear_tube_batch(self, tube: str, states: Sequence[str], limit: int = ...,
                         ) -> asyncio.Future[tuple[int, bool]]: ...

    async def clear_tube(self, tube: str, states: Sequence[str]) -> int | None: ...

    def list_jobs(self, tube: str, state: str, cursor: tuple[int, int] | None, count: int,
                  ) -> asyncio.Future[admin.JobPage | None]: ...

    def change_pri(self, job_id: int, pri: int) -> asyncio.Future[bool]: ...

    def change_delay(self, job_id: int, delay_ms: int) -> asyncio.Future[int]: ...

    def tube_pause(self, tube: str, *, forever: bool) -> asyncio.Future[bool]: ...

    def tube_figures(self, tube: str) -> asyncio.Future[admin.TubeFigures | None]: ...

    def tube_groups(self, tube: str) -> asyncio.Future[admin.TubeGroups]: ...

    # -- batches ------------------------------------------------------------------------------

    def put_many(self, tube: str, jobs: Sequence[tuple[int, int, int, bytes]], *,
                 send_now: bool = False, groups: Sequence[str] | None = None,
                 traceparents: Sequence[str] | None = None) -> asyncio.Future[list[int]]: ...

    def put_calls(self, tube: str, jobs: Sequence[tuple[int, int, int, bytes]], keep_ms: int,
                  budget: Sequence[tuple[str, int]]) -> asyncio.Future[list[int]]:
        """put_many of jobs waited for by this process (put-with notify-ms's calls): ids, 0 for
        a tube full; a ready job may go to a push loop of this process (``budget``: how many
        at most per token)."""
        ...

    def delete_many(self, token: str, ids: Sequence[int], *,
                    behind: int = 0) -> asyncio.Future[list[bool]]: ...

    # -- ends: finish and wait (lua/finish.lua, lua/wait.lua) ----------------------------------

    def finish(self, token: str, job_id: int, result: bytes, keep_ms: int, *,
               behind: int = 0) -> asyncio.Future[bool | int]:
        """Delete a job ``token`` holds, as ``delete``, keeping its end with ``result`` for
        ``keep_ms``; False when ``token`` does not hold it; CANCELLED when it was cancelled
        (it is gone, the result dropped)."""
        ...

    def finish_many(self, token: str, jobs: Sequence[tuple[int, bytes]], keep_ms: int, *,
                    behind: int = 0) -> asyncio.Future[list[bool | int]]:
        """Finish each (id, result) as ``finish`` would, in order; per job, what it answers."""
        ...

    def hand_back(self, token: str, job_id: int) -> asyncio.Future[int]:
        """A job ``token`` holds goes back to ready at once, its try not counted (its holder
        is shutting down): 1 handed back, HANDED_BACK_EXPIRED (past its TTL, it expired
        instead), 0 not held, CANCELLED (it was cancelled: gone)."""
        ...

    def cancel(self, job_id: int) -> asyncio.Future[int]:
        """The job is not to run again: 1 deleted now, 2 reserved (marked: its holder hears
        it), 0 no such job."""
        ...

    def quiet(self, scope: str, target: str = "") -> asyncio.Future[int]:
        """Ask every process of the namespace to quiet its push consumers in ``scope`` ("all",
        "tube" ``target``, "conn" ``target``): the processes that heard it."""
        ...

    def fail(self, token: str, job_id: int, error: bytes, *, behind: int = 0,
             worker_policy: Options = ()) -> asyncio.Future[Failed | None]:
        """A job ``token`` holds failed with ``error``: it follows its policies (as a TTR
        timeout; ``worker_policy`` where the job and its tube have none); None when ``token``
        does not hold it."""
        ...

    def wait_end(self, job_id: int, keep_ms: int, progress_after: int | None = None
                 ) -> asyncio.Future[JobEnd | Progress | bool]:
        """How the job ended (also while it lies buried); True while it lives, marked so that
        its end is kept ``keep_ms`` and published; False: no such job and no end kept. With
        ``progress_after``: a living job's progress once its count is past that number."""
        ...

    def progress(self, token: str, job_id: int, data: bytes, *,
                 behind: int = 0) -> asyncio.Future[int]:
        """A job ``token`` holds reports ``data`` as its progress and gets a full TTR (as
        ``touch``: the new deadline, 0 not held, CANCELLED)."""
        ...

    # -- job policies and deduplicated put (lua/includes/policies.lua) ------------------------

    async def tell_children(self) -> tuple[int, int]:
        """One batch of the parents' ends on their way to held children (put-with after=),
        told: the ends handled and the earliest due of a child released into delayed."""
        ...

    def put_with(self, tube: str, pri: int, delay: int, ttr: int, body: bytes,
                 opts: Options) -> asyncio.Future[PutOutcome]: ...

    def peek_key(self, key: str) -> asyncio.Future[tuple[int, bytes] | None]: ...

    def job_policies(self, job_id: int) -> asyncio.Future[JobPolicies | None]: ...

    def job_trace(self, job_id: int) -> asyncio.Future[JobTrace | None]: ...

    def tube_policy_counts(self, tube: str) -> asyncio.Future[list[int]]: ...
