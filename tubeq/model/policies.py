"""Job policies: the retry backoff schedule, computed as lua/includes/policies.lua does.

The Lua scripts are the truth (they enforce max-tries, backoff and TTL inside Redis, so two
processes never disagree); this module holds the same arithmetic in Python so tests, clients and
operators can know a job's retry schedule in advance. ``tests/extensions/test_policies.py``
keeps the two equal.

The backoff after a job's ``tries``-th try (a reservation that ended in a TTR timeout or a
disconnect) is ``backoff-ms * 2^(tries-1)``, capped at ``backoff-max-ms`` when that is set, less
a jitter of up to half of it. The jitter is a deterministic fraction of the job id and the try
number: Redis gives a script no randomness worth having, and the id spreads jobs that timed out
together.
"""

from __future__ import annotations

import math
from typing import Final

from tubeq.model.options import MAX_MS
from tubeq.model.states import JobState

# A Mersenne prime and the multipliers of a Lehmer generator: every product below 2^53, so the
# Lua side (doubles) computes exactly what Python (integers) does.
_P: Final = 2**31 - 1
_A: Final = 48271


def jitter(job_id: int, tries: int) -> float:
    """The fraction in [0, 1) that takes up to half of a backoff away."""
    h = ((job_id % _P) * _A + tries * 69621 + 12345) % _P
    h = (h * _A) % _P
    h = (h * _A) % _P
    return h / _P


def backoff_delay(job_id: int, tries: int, backoff_ms: int, backoff_max_ms: int = 0) -> int:
    """The retry delay (ms) after the ``tries``-th try of job ``job_id``; 0 without a backoff."""
    if backoff_ms <= 0 or tries <= 0:
        return 0
    cap = backoff_max_ms if backoff_max_ms > 0 else MAX_MS
    base: int = min(cap, backoff_ms * 2 ** min(tries - 1, 52))
    return base - math.floor(base * jitter(job_id, tries) / 2)


# The transitions the job policies add to tubeq.model.states.TRANSITIONS, in the same shape:
# (state before, what happened) -> state after, None for a job gone. "timeout", "release" and
# "disconnect" end a try; "ttl" is the TTL sweep (promote.lua). protocol.md (put-with) tells the
# rules; tests/extensions/test_policies_lua.py walks every row through the scripts.
POLICY_TRANSITIONS: Final[dict[tuple[JobState, str], JobState | None]] = {
    (JobState.RESERVED, "timeout at max-tries"): JobState.BURIED,
    (JobState.RESERVED, "release at max-tries"): JobState.BURIED,
    (JobState.RESERVED, "disconnect at max-tries"): JobState.BURIED,
    (JobState.RESERVED, "timeout with backoff"): JobState.DELAYED,
    (JobState.RESERVED, "disconnect with backoff"): JobState.DELAYED,
    (JobState.READY, "ttl, on-expire=bury"): JobState.BURIED,
    (JobState.DELAYED, "ttl, on-expire=bury"): JobState.BURIED,
    (JobState.BURIED, "ttl, on-expire=bury"): JobState.BURIED,
    (JobState.RESERVED, "ttl, on-expire=bury"): JobState.RESERVED,
    (JobState.READY, "ttl, on-expire=delete"): None,
    (JobState.DELAYED, "ttl, on-expire=delete"): None,
    (JobState.BURIED, "ttl, on-expire=delete"): None,
    (JobState.RESERVED, "ttl, on-expire=delete"): JobState.RESERVED,
    (JobState.RESERVED, "timeout after ttl, on-expire=bury"): JobState.BURIED,
    (JobState.RESERVED, "release after ttl, on-expire=delete"): None,
}
