"""Whole-namespace reads are bounded: stats, the --max-jobs count and the scrapes' overview read
the namespace's jobs by state ({p}:counts, kept as jobs move) instead of every tube; list-tubes
reads the tubes in pages; a kick of many jobs is made of bounded calls. Each is checked by the
Redis commands one call runs (INFO commandstats counts the commands a script calls too), which
grows with the tubes only when the call walks them; and each answer against the sets themselves.

Against a real Redis (the scripts are the proof); the teardown of ``redis_url`` also checks the
counts against the sets (tests/support/job_counts.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio

from tests.store.test_lua import ALICE, Env, open_env
from tubeq.redisio.checks import StartupError
from tubeq.redisio.client import RedisClient
from tubeq.store import store as store_module
from tubeq.store.keys import Keys
from tubeq.store.layout import claim_layout_version, count_jobs_by_state
from tubeq.store.records import Reservation, TubeCounts
from tubeq.store.shards import ShardedStore

TUBES = 600


@pytest.fixture
async def env(redis_url: str) -> AsyncIterator[Env]:
    async with open_env(redis_url, 0) as opened:
        yield opened


async def commands_run(raw: redis.asyncio.Redis) -> int:
    """Every command Redis has run so far, those scripts called included."""
    stats = await raw.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


async def cost_of(raw: redis.asyncio.Redis, call: Callable[[], asyncio.Future[Any]]) -> int:
    """The Redis commands ``call()`` ran (less the INFO that measures it); made only once the
    count before it is read, as the store sends a call on its own connection at once."""
    before = await commands_run(raw)
    await call()
    return await commands_run(raw) - before - 1


async def fill(env: Env, tubes: int) -> None:
    """``tubes`` tubes, each with a ready job (urgent in every third), a delayed job in every
    second, and a buried one in every fifth."""
    s = env.store
    await asyncio.gather(*(s.put(f"t{i}", 5 if i % 3 == 0 else 2000, 0, 60, b"x")
                           for i in range(tubes)))
    await asyncio.gather(*(s.put(f"t{i}", 1, 30, 60, b"x") for i in range(0, tubes, 2)))
    for i in range(0, tubes, 5):
        head = await s.peek_state("ready", f"t{i}")
        assert head is not None
        r = await s.reserve_job(ALICE, head[0])
        assert isinstance(r, Reservation)
        assert await s.bury(ALICE, r.id, 7)


async def walked_counts(env: Env) -> list[int]:
    """urgent, ready, reserved, delayed, buried, tubes: the slow way, from every tube's sets."""
    raw, k = env.raw, env.keys
    out = [0, 0, await raw.zcard(k.reserved), 0, 0, 0]
    for t in [m.decode() for m in await raw.zrange(k.tubes, 0, -1)]:
        out[0] += await raw.zcount(k.ready(t), "-inf", "(1024")
        out[1] += await raw.zcard(k.ready(t))
        out[3] += await raw.zcard(k.delayed(t))
        out[4] += await raw.zcard(k.buried(t))
        out[5] += 1
    return out


async def test_stats_and_the_job_count_read_no_tube(env: Env) -> None:
    await fill(env, 20)
    small = await cost_of(env.raw, env.store.server_counts)
    small_count = await cost_of(env.raw, env.store.count_jobs)
    await fill(env, TUBES)  # 30 times the tubes
    assert await cost_of(env.raw, env.store.server_counts) == small
    assert await cost_of(env.raw, env.store.count_jobs) == small_count
    gauges, _ = await env.store.server_counts()
    walked = await walked_counts(env)
    assert gauges[:6] == walked
    assert await env.store.count_jobs() == sum(walked[1:5])


async def test_overview_reads_its_rows_and_sums_the_rest_from_the_counts(env: Env) -> None:
    await fill(env, 20)
    small = await cost_of(env.raw, lambda: env.store.overview(10))
    await fill(env, TUBES)
    assert await cost_of(env.raw, lambda: env.store.overview(10)) == small
    count, rows = await env.store.overview(10)
    assert count == TUBES + 1  # t0 ... t599 and "default"
    assert [row.name for row in rows[:-1]] == (
        ["default"] + [f"t{i}" for i in range(9)])
    rest = rows[-1]
    assert rest.name == ""
    walked = await walked_counts(env)
    listed = [sum(getattr(r, f) for r in rows[:-1])
              for f in ("urgent", "ready", "reserved", "delayed", "buried")]
    assert [rest.urgent, rest.ready, rest.reserved, rest.delayed, rest.buried] == [
        w - n for w, n in zip(walked[:5], listed, strict=True)]
    stats_total = int(await env.raw.hget(env.keys.stats, "total-jobs"))
    assert rest.total == stats_total - sum(r.total for r in rows[:-1])
    assert (rest.deletes, rest.pause_until_ms, rest.waiting, rest.watching, rest.using) == (
        0, 0, 0, 0, 0)


async def test_no_summed_row_when_every_tube_has_one(env: Env) -> None:
    await fill(env, 5)
    count, rows = await env.store.overview(100)
    assert count == 6 and all(isinstance(r, TubeCounts) and r.name for r in rows)


async def test_list_tubes_reads_pages(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    await fill(env, 50)
    monkeypatch.setattr(store_module, "TUBE_PAGE", 7)
    whole = [m.decode() for m in await env.raw.zrange(env.keys.tubes, 0, -1)]
    assert await env.store.list_tubes() == whole
    assert [name for name, _ in await env.store.tubes_created()] == whole
    monkeypatch.setattr(store_module, "TUBE_PAGE", 51)  # the last page exactly full
    assert await env.store.list_tubes() == whole


async def test_a_long_kick_goes_on_from_the_set_its_first_call_chose(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "KICK_CHUNK", 3)
    s = env.store
    buried = []
    for _ in range(8):
        job_id = await env.put("k")
        assert isinstance(await s.reserve_job(ALICE, job_id), Reservation)
        assert await s.bury(ALICE, job_id, 0)
        buried.append(job_id)
    delayed = [await env.put("k", delay=100) for _ in range(4)]
    assert await s.kick("k", 5) == 5  # two calls: 3 + 2
    assert await s.kick("k", 10) == 3  # the rest of the buried jobs, not one delayed job
    for job_id in buried:
        assert (await s.job_info(job_id)).state == "ready"  # type: ignore[union-attr]
    assert await s.kick("k", 10) == 4  # now the delayed ones (two calls: 3 + 1)
    for job_id in delayed:
        assert (await s.job_info(job_id)).state == "ready"  # type: ignore[union-attr]
    assert await s.kick("k", 10) == 0


async def test_counts_are_recounted_when_a_namespace_is_taken_over(env: Env) -> None:
    """A namespace an older layout wrote has no counts: the process that takes it over counts
    them (once; a later start finds them whole and reads no tube)."""
    await fill(env, 30)
    walked = await walked_counts(env)
    await env.raw.delete(env.keys.counts)
    await env.raw.set(env.keys.layout, 2)
    recount = await claim_layout_version(env.store.client, env.keys, "test")
    assert recount
    await count_jobs_by_state(env.store, "test", force=recount)
    gauges, _ = await env.store.server_counts()
    assert gauges[:6] == walked
    assert not await claim_layout_version(env.store.client, env.keys, "test")
    assert await env.store.recount() == -1  # whole: nothing read
    # Counts lost by themselves (a key deleted by hand): counted again at the next start.
    await env.raw.delete(env.keys.counts)
    assert await env.store.recount() == 31
    assert (await env.store.server_counts())[0][:6] == walked


async def test_a_split_namespace_counts_each_shard(redis_url: str) -> None:
    client = await RedisClient.connect(redis_url)
    try:
        store = ShardedStore(client, "split", "inst", 4)
        await store.load_scripts()
        await store.heartbeat()
        await asyncio.gather(*(store.put(f"s{i}", i, 0, 60, b"x") for i in range(40)))
        await asyncio.gather(*(store.put(f"s{i}", 1, 10, 60, b"x") for i in range(0, 40, 4)))
        gauges, _ = await store.server_counts()
        assert gauges[:5] == [40, 40, 0, 10, 0]
        assert await store.count_jobs() == 50
        raw = redis.asyncio.Redis.from_url(redis_url)
        try:
            for shard in store.shards:
                await raw.delete(shard.keys.counts)
        finally:
            await raw.aclose()
        assert await store.recount() == 40 + 1  # every shard's tubes, 'default' in its home
        assert (await store.server_counts())[0][:5] == [40, 40, 0, 10, 0]
        assert await store.recount() == -1
        count, rows = await store.overview(5)
        assert count == 41 and rows[-1].name == "" and rows[-1].ready == 40 - sum(
            r.ready for r in rows[:-1])
    finally:
        await client.close()


def test_keys_name_the_counts() -> None:
    assert Keys("p").counts == "{p}:counts"


async def test_a_recount_redis_refuses_stops_the_start_with_one_line(env: Env) -> None:
    """The start's recount on a Redis over maxmemory: a StartupError naming the namespace (one
    line on stderr, exit 1, as every start failure), not a traceback."""
    await env.raw.delete(env.keys.counts)
    await env.raw.config_set("maxmemory", 1)
    try:
        with pytest.raises(StartupError, match="refused to count its jobs by state"):
            await count_jobs_by_state(env.store, "test", force=True)
    finally:
        await env.raw.config_set("maxmemory", 0)
    await count_jobs_by_state(env.store, "test", force=True)  # counted once Redis takes it
