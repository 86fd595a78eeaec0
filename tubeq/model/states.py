"""Job states and the transitions between them: the state machine the Lua scripts implement.

``TRANSITIONS`` is the table protocol.md draws and ``tests/store/test_lua.py`` walks: each row is
(state before, operation) -> state after, and each operation is one Lua script.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """The states; values are the wire names used in stats-job. beanstalkd has the first four;
    a job is HELD only when it was put with ``after=`` (protocol.md "Dependencies")."""

    READY = "ready"
    DELAYED = "delayed"
    RESERVED = "reserved"
    BURIED = "buried"
    HELD = "held"


# (state before or None for a new job, operation name, variant) -> state after or None (deleted).
TRANSITIONS: dict[tuple[JobState | None, str], JobState | None] = {
    (None, "put"): JobState.READY,
    (None, "put delay>0"): JobState.DELAYED,
    (JobState.DELAYED, "promote"): JobState.READY,
    (JobState.READY, "reserve"): JobState.RESERVED,
    (JobState.READY, "reserve_job"): JobState.RESERVED,
    (JobState.DELAYED, "reserve_job"): JobState.RESERVED,
    (JobState.BURIED, "reserve_job"): JobState.RESERVED,
    (JobState.RESERVED, "release"): JobState.READY,
    (JobState.RESERVED, "release delay>0"): JobState.DELAYED,
    (JobState.RESERVED, "bury"): JobState.BURIED,
    (JobState.RESERVED, "touch"): JobState.RESERVED,
    (JobState.RESERVED, "expire"): JobState.READY,
    (JobState.RESERVED, "disconnect"): JobState.READY,
    # quiet shutdowns: given back with no try counted (lua/hand_back.lua, disconnect.lua)
    (JobState.RESERVED, "hand-back"): JobState.READY,
    (JobState.RESERVED, "disconnect at shutdown"): JobState.READY,
    (JobState.BURIED, "kick"): JobState.READY,
    (JobState.DELAYED, "kick"): JobState.READY,
    (JobState.BURIED, "kick_job"): JobState.READY,
    (JobState.DELAYED, "kick_job"): JobState.READY,
    (JobState.READY, "delete"): None,
    (JobState.DELAYED, "delete"): None,
    (JobState.RESERVED, "delete"): None,
    (JobState.BURIED, "delete"): None,
    # put-with after= (lua/includes/after.lua): held until every parent finished
    (None, "put after=living parent"): JobState.HELD,
    (None, "put after=failed parent"): JobState.BURIED,
    (JobState.HELD, "last parent finished"): JobState.READY,
    (JobState.HELD, "last parent finished delay>0"): JobState.DELAYED,
    (JobState.HELD, "a parent failed"): JobState.BURIED,
    (JobState.HELD, "delete"): None,
    (JobState.HELD, "cancel"): None,
}
