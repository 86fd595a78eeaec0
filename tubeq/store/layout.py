"""A namespace's data layout record: which layout of keys and job fields its data has.

Owns: :func:`claim_layout_version`, run once per namespace at start-up, after the Redis checks
(tubeq.redisio.checks, whose :class:`StartupError` it raises too), and
:func:`count_jobs_by_state`, the one migration a layout upgrade needs (layout 3's job counts).

Rules:
* A namespace's data layout version (tubeq.store.keys.LAYOUT_VERSION) is recorded in it. A process
  records its own in a namespace without one, takes over a record of an older layout it reads
  as it is, and refuses to start on a newer one (it would misread what that layout wrote) or on
  one too old to read as it is. There is no flag to override that: README, "Upgrades and
  rollback", says how to set the record by hand and what that risks.
"""

from __future__ import annotations

import structlog

from tubeq import __version__
from tubeq.redisio.checks import StartupError
from tubeq.redisio.client import RedisClient, RedisReplyError
from tubeq.store.base import JobStore
from tubeq.store.keys import (
    COUNTS_SINCE_LAYOUT,
    LAYOUT_VERSION,
    UPGRADES_IN_PLACE_FROM,
    Keys,
)
from tubeq.store.scripts import load_all

log = structlog.get_logger(__name__)


async def claim_layout_version(client: RedisClient, keys: Keys, where: str) -> bool:
    """Record LAYOUT_VERSION for the namespace of ``keys`` (its unsplit root), or take over the
    record of an older layout this build reads as it is; raise :class:`StartupError` when the
    record is newer than this build, too old for it, or unreadable (lua/layout.lua, which also
    re-arms the TTL timer a layout-1 process may have removed). Returns whether the namespace
    must have its jobs by state counted anew (:func:`count_jobs_by_state`): it had no record,
    or one older than COUNTS_SINCE_LAYOUT."""
    script = load_all()["layout"]
    try:
        before, now = await client.call("EVAL", script.source, 1, keys.root, LAYOUT_VERSION,
                                        UPGRADES_IN_PLACE_FROM)
    except RedisReplyError as error:
        raise StartupError(f"the Redis at {where} refused the data layout record "
                           f"{keys.layout}: {error}") from None
    recorded = now.decode(errors="replace")
    namespace = f"namespace {keys.prefix!r} at {where}"
    if not recorded.isdigit():
        raise StartupError(
            f"{namespace} has an unreadable data layout record ({keys.layout} = {recorded!r}): "
            f"set it to the layout its data has (tubeq {__version__} writes {LAYOUT_VERSION}); "
            "see README, Upgrades and rollback")
    version = int(recorded)
    if version > LAYOUT_VERSION:
        raise StartupError(
            f"{namespace} has data layout {version}, newer than tubeq {__version__} knows "
            f"(layout {LAYOUT_VERSION}): run a tubeq that knows layout {version} (the version "
            "that wrote it, or later); see README, Upgrades and rollback")
    if version < LAYOUT_VERSION:
        raise StartupError(
            f"{namespace} has data layout {version}, older than tubeq {__version__} reads as it "
            f"is (layouts {UPGRADES_IN_PLACE_FROM} to {LAYOUT_VERSION}): upgrade it with a "
            "tubeq in between first; see README, Upgrades and rollback")
    if before and before != now:
        log.info("namespace data layout upgraded", namespace=keys.prefix,
                 layout_from=before.decode(errors="replace"), layout_to=version)
    return not before.isdigit() or int(before) < COUNTS_SINCE_LAYOUT


async def count_jobs_by_state(store: JobStore, prefix: str, *, force: bool) -> None:
    """Count the namespace's jobs by state from its tubes (recount.lua) where they are not
    known to be whole, or with ``force`` (a namespace taken over from an older layout): once,
    at start, before the process serves it. O(tubes); logged when it counted. A Redis that
    refuses it (over maxmemory, a replica) stops the start with :class:`StartupError`."""
    try:
        visited = await store.recount(force=force)
    except RedisReplyError as error:
        raise StartupError(f"the Redis of namespace {prefix!r} refused to count its jobs by "
                           f"state: {error}") from None
    if visited > 0:  # not for a new namespace
        log.info("namespace jobs counted by state", namespace=prefix, tubes=visited)
