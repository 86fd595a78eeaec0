"""Which tubes this process's connections use: counted here, sent to Redis in batches.

beanstalkd creates a tube on its first reference and removes it with its last, and stats-tube
shows ``current-using``. tubeq keeps those counts in Redis per process, but a producer that
switches tube before every put would otherwise pay one script per ``use``. So the process counts
its connections per tube here and tells Redis (using.lua) the absolute counts:

* at once when a tube gains its first user in this process, because the tube may not exist yet
  and the commands that follow on the same Redis connection must find it;
* otherwise at most USING_FLUSH_S later, in one call for every tube whose count changed. A tube
  this process stopped using keeps its reference until then, so switching among a set of tubes
  costs no Redis call at all;
* and before any command of this process that reads tube references or existence (stats,
  stats-tube, list-tubes, pause-tube), so a connection never sees its own process's stale view.

Holding a reference a little longer must not keep alive a tube beanstalkd would have destroyed:
``use t``, ``pause-tube t 100``, ``use default``, ``use t`` gives a new tube in 1.12 (no pause,
counters at zero), because t lost its last user in between. So when a tube this process had
stopped using (its count here fell to 0, Redis still holds the reference) is used again, Redis is
told at once that the count fell to 0 and rose again (using.lua then removes the tube if nothing
else references it, and creates it anew). That call is skipped when a connection of this process
watches the tube: a watched tube cannot vanish. So a producer switching among tubes its own
process's workers watch (the many-tubes load) still pays no Redis call per ``use``.

What another tubeq process reads can lag by up to USING_FLUSH_S (protocol.md, "Several
processes"). Counts are absolute, so a flush that failed is simply sent again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import structlog

from tubeq.redisio.futures import discard
from tubeq.store.base import JobStore

log = structlog.get_logger(__name__)

# How long a change in this process's use counts may wait before Redis hears of it.
USING_FLUSH_S = 0.1


class UseLedger:
    """This process's count of connections per used tube, and what Redis was last told."""

    def __init__(self, store: JobStore, flush_after_s: float = USING_FLUSH_S) -> None:
        self._store = store
        self._flush_after_s = flush_after_s
        self._counts: Counter[str] = Counter()
        self._told: dict[str, int] = {}  # the count Redis holds for this process, per tube
        self._dirty: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._watching: Counter[str] = Counter()  # this process's connections watching a tube

    def acquire(self, tube: str) -> asyncio.Future[Any] | None:
        """A connection uses ``tube``: a future when Redis must hear of it first, else None."""
        left = not self._counts[tube]  # every connection here had left it
        self._counts[tube] += 1
        if not self._told.get(tube):
            # Only this tube: drops stay pending, so the tubes this process just left stay held.
            self._dirty.discard(tube)
            return self._send([tube])
        if left and tube != "default" and not self._watching[tube]:
            # It may have vanished meanwhile in beanstalkd's eyes: 0, then the count now.
            self._dirty.discard(tube)
            return self._send([tube], through_zero=True)
        self._dirty.add(tube)
        self._schedule()
        return None

    def watch(self, tube: str, delta: int) -> None:
        """A connection of this process started (1) or stopped (-1) watching ``tube``."""
        self._watching[tube] += delta
        if self._watching[tube] <= 0:
            del self._watching[tube]

    def release(self, tube: str) -> None:
        """A connection stopped using ``tube`` (use of another tube, or it went away)."""
        self._counts[tube] -= 1
        if self._counts[tube] <= 0:
            del self._counts[tube]
        self._dirty.add(tube)
        self._schedule()

    def resend(self) -> asyncio.Future[Any] | None:
        """Tell Redis every count again (it lost them: a restore, see
        ServerContext.restore_registrations); counts are absolute, so this is harmless."""
        self._dirty.update(self._counts)
        return self.flush()

    def flush(self) -> asyncio.Future[Any] | None:
        """Send every changed count now; the returned future settles when Redis has them."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._dirty:
            return None
        tubes, self._dirty = list(self._dirty), set()
        return self._send(tubes)

    def _send(self, tubes: list[str], *, through_zero: bool = False) -> asyncio.Future[Any]:
        counts = [(tube, self._counts[tube]) for tube in tubes]
        for tube, n in counts:
            if n:
                self._told[tube] = n
            else:
                self._told.pop(tube, None)
        sent = self._store.set_using([(t, 0) for t in tubes] + counts if through_zero else counts)
        sent.add_done_callback(lambda f: self._sent(f, counts))
        return sent

    def _sent(self, f: asyncio.Future[Any], counts: list[tuple[str, int]]) -> None:
        if f.cancelled() or f.exception() is None:
            return
        log.warning("using counts not stored; sending them again", error=repr(f.exception()))
        for tube, _ in counts:
            self._told.pop(tube, None)  # unknown: the next acquire tells Redis at once
            self._dirty.add(tube)
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flush_after_s,
                                                                self._flush_later)

    def _flush_later(self) -> None:
        self._timer = None
        sent = self.flush()
        if sent is not None:
            sent.add_done_callback(discard)
