"""Groups against a model: hypothesis draws sequences of puts (with and without a group, at two
priorities), reserves, releases, deletes (of reserved and ready jobs), buries, kicks, priority
changes and group-concurrency changes; each runs on the scripts (a real Redis) and on
:class:`Model`, a plain re-statement of protocol.md's "Groups" order written without the
scripts' structures; every reserve must take the job the model names, and after each sequence
the counts and the groups' invariants (tests/support/job_counts.py) must hold."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.job_counts import count_mismatches
from tubeq.redisio.client import RedisClient
from tubeq.redisio.process import RedisProcess
from tubeq.store.keys import Keys
from tubeq.store.records import Reservation
from tubeq.store.store import Store

TOKEN = "inst:1"
TUBE = "m"
_namespaces = itertools.count()


@dataclass
class Job:
    group: str
    pri: int
    state: str = "ready"  # ready | reserved | buried


@dataclass
class Model:
    """protocol.md "Groups": at the best priority the group with the lowest turn number, then
    its oldest job; a group takes the next turn number when it gets a ready job while it had
    none, and when a reserve takes one of its jobs. A group at its group-concurrency cap is
    skipped (its turn kept); the cap holds only in group mode (from a put with a group until a
    put without one finds the tube empty) and counts the reservations made there while a cap
    was set, each until its reservation ends. Jobs without a group are the group ""."""

    jobs: dict[int, Job] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)
    counter: int = 0
    cap: int = 0
    counted: set[int] = field(default_factory=set)  # reserved jobs the cap counts
    grouped: bool = False  # group mode

    def put(self, job_id: int, group: str | None, pri: int) -> None:
        if group is not None:
            self.grouped = True
        elif not self.jobs:
            self.grouped = False
        self.jobs[job_id] = Job(group or "", pri, "new")
        self.became_ready(job_id)

    def ready(self, group: str) -> list[int]:
        return sorted((j.pri, i) for i, j in self.jobs.items()
                      if j.group == group and j.state == "ready")  # type: ignore[misc]

    def reserved_in(self, group: str) -> int:
        return sum(1 for i in self.counted if self.jobs[i].group == group)

    def set_cap(self, cap: int) -> None:
        self.cap = cap

    def _new_turn(self, group: str) -> None:
        self.counter += 1
        self.turns[group] = self.counter

    def became_ready(self, job_id: int) -> None:
        group = self.jobs[job_id].group
        self.jobs[job_id].state = "ready"
        self.counted.discard(job_id)
        if group not in self.turns:
            self._new_turn(group)

    def left_ready(self, job_id: int, state: str | None) -> None:
        job = self.jobs[job_id]
        self.counted.discard(job_id)
        if state is None:
            del self.jobs[job_id]
        else:
            job.state = state
        if not self.ready(job.group):
            self.turns.pop(job.group, None)

    def next_job(self) -> int | None:
        capped = self.cap and self.grouped
        open_groups = [g for g in self.turns if not (capped and self.reserved_in(g) >= self.cap)]
        heads = {g: self.ready(g)[0] for g in open_groups}
        if not heads:
            return None
        best = min(pri for pri, _ in heads.values())
        group = min((g for g, (pri, _) in heads.items() if pri == best), key=self.turns.__getitem__)
        return heads[group][1]

    def reserve(self) -> int | None:
        job_id = self.next_job()
        if job_id is None:
            return None
        group = self.jobs[job_id].group
        self.left_ready(job_id, "reserved")
        if self.cap and self.grouped:
            self.counted.add(job_id)
        if group in self.turns:
            self._new_turn(group)
        return job_id


GROUPS = st.sampled_from(["a", "b", "c", None])
OPS = st.one_of(
    st.tuples(st.just("put"), GROUPS, st.sampled_from([0, 0, 5])),
    st.tuples(st.just("reserve")),
    st.tuples(st.just("release"), st.integers(0, 9), st.sampled_from([0, 5])),
    st.tuples(st.just("delete"), st.integers(0, 9)),
    st.tuples(st.just("bury"), st.integers(0, 9)),
    st.tuples(st.just("kick")),
    st.tuples(st.just("change-pri"), st.integers(0, 9), st.sampled_from([0, 5])),
    st.tuples(st.just("cap"), st.sampled_from([0, 1, 2])),
)


async def _run(url: str, ops: list[tuple[object, ...]]) -> None:
    client = await RedisClient.connect(url)
    store = Store(client, Keys(f"model{next(_namespaces)}"), "inst", lambda: 1_700_000_000_000,
                  events_maxlen=0)
    await store.load_scripts()
    await store.heartbeat()
    await store.connect(TOKEN)
    await store.change_watches(TOKEN, [("+w", TUBE), ("-w", "default")])
    model = Model()
    try:
        for op in ops:
            name = op[0]
            ids = sorted(model.jobs)
            if name == "put":
                group, pri = op[1], int(op[2])  # type: ignore[call-overload]
                opts = (("group", group),) if group is not None else ()
                job_id = (await store.put_with(TUBE, pri, 0, 60, b"x", opts)).id
                model.put(job_id, None if group is None else str(group), pri)
            elif name == "reserve":
                got = await store.reserve(TOKEN)
                want = model.reserve()
                assert (got.id if isinstance(got, Reservation) else None) == want, (ops, op)
            elif name in ("release", "delete", "bury", "change-pri"):
                if not ids:
                    continue
                job_id = ids[int(op[1]) % len(ids)]  # type: ignore[call-overload]
                job = model.jobs[job_id]
                if name == "release" and job.state == "reserved":
                    assert await store.release(TOKEN, job_id, int(op[2]), 0)  # type: ignore[call-overload]
                    job.pri = int(op[2])  # type: ignore[call-overload]
                    model.became_ready(job_id)
                elif name == "delete" and job.state in ("reserved", "ready"):
                    assert await store.delete(TOKEN, job_id)
                    model.left_ready(job_id, None)
                elif name == "bury" and job.state == "reserved":
                    assert await store.bury(TOKEN, job_id, job.pri)
                    model.left_ready(job_id, "buried")
                elif name == "change-pri":
                    assert await store.change_pri(job_id, int(op[2]))  # type: ignore[call-overload]
                    job.pri = int(op[2])  # type: ignore[call-overload]
            elif name == "kick":
                buried = [i for i, j in model.jobs.items() if j.state == "buried"]
                assert await store.kick(TUBE, 1) == min(len(buried), 1)
                if buried:
                    model.became_ready(min(buried))
            elif name == "cap":
                await store.set_tube(TUBE, (("group-concurrency", int(op[1])),))  # type: ignore[call-overload]
                model.set_cap(int(op[1]))  # type: ignore[call-overload]
        # drain: every ready job comes out in the model's order once no cap holds them
        await store.set_tube(TUBE, (("group-concurrency", 0),))
        model.set_cap(0)
        while (want := model.reserve()) is not None:
            got = await store.reserve(TOKEN)
            assert isinstance(got, Reservation) and got.id == want, (ops, "drain")
    finally:
        await client.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=40))
def test_reserves_follow_the_model(redis_process: RedisProcess, ops: list[tuple[object, ...]]
                                   ) -> None:
    asyncio.run(_run(redis_process.url, ops))
    assert count_mismatches(redis_process.url) == []
