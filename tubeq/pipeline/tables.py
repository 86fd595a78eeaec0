"""The report's tables: their names, grains, states and columns, shared by the Spark code that
builds them (tubeq.pipeline.report) and the page that shows them (tubeq.pipeline.page).

Rules: vocabulary only; imports nothing of the pipeline but the event schema's names.
"""

from __future__ import annotations

from typing import Final

from tubeq.model.events import EventName

PERCENTILES: Final = (0.5, 0.95, 0.99)
ALL_TUBES: Final = "*"
MINUTE_MS: Final = 60_000
HOUR_MS: Final = 3_600_000

READY: Final = "ready"
DELAYED: Final = "delayed"
RESERVED: Final = "reserved"
BURIED: Final = "buried"
# The states a backlog counts, in the order the tables and charts show them.
STATES: Final = (READY, DELAYED, RESERVED, BURIED)

# The report's names for events told apart by their reason (not event names of the stream): a
# ``timed-out`` whose holder went away (its connection closed, or its process died: not a TTR
# time-out), and a ``buried`` that a job policy did (max-tries, expired), not a client.
DISCONNECTED: Final = "timed-out+disconnect"
REAPED: Final = "timed-out+reaped"
BURIED_MAX_TRIES: Final = "buried+max-tries"
BURIED_EXPIRED: Final = "buried+expired"
# A ``deleted`` by finish (reason "finished"): a delete that answered, with its result's size.
FINISHED: Final = "deleted+finished"

# Events counted per tube and bucket: (column, the events it counts).
COUNTED: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("put", (EventName.PUT,)),
    ("promoted", (EventName.PROMOTED,)),
    ("reserved", (EventName.RESERVED,)),
    ("released", (EventName.RELEASED,)),
    ("timed_out", (EventName.TIMED_OUT,)),  # reason "": the TTR ran out
    ("disconnected", (DISCONNECTED,)),  # reason disconnect or shutdown: its connection closed
    ("reaped", (REAPED,)),  # reason reaped: the process that held it died
    ("touched", (EventName.TOUCHED,)),
    ("buried", (EventName.BURIED, BURIED_MAX_TRIES, BURIED_EXPIRED)),  # for any reason
    ("buried_deliberate", (EventName.BURIED,)),  # by a client's bury
    ("buried_max_tries", (BURIED_MAX_TRIES,)),
    ("buried_expired", (BURIED_EXPIRED,)),
    ("kicked", (EventName.KICKED,)),
    ("deleted", (EventName.DELETED, FINISHED)),  # every delete, finishes included
    ("finished", (FINISHED,)),  # by finish (the server's total-finished)
    # Every fail (the server's total-failed); what became of the job is counted where its own
    # event is: released, buried_max_tries or (an expired job) nowhere.
    ("failed", (EventName.FAILED,)),
)
COUNTED_COLUMNS: Final = tuple(column for column, _ in COUNTED)
# Sums per tube and bucket, beside the counts (the report's tables only; the live table counts):
# result_bytes is the sum of the finished jobs' result sizes (their events' ``size``).
SUMMED: Final = ("result_bytes",)
# The measures, each with p50/p95/p99 and a sample count column: <measure>_p50 ... <measure>_n.
MEASURES: Final = ("wait_ms", "processing_ms", "lateness_ms")

# The result tables, each written as <out>/<name>/ (Parquet).
TABLES: Final = (
    "by_tube",        # tube: counts and percentiles over the whole archive
    "by_minute",      # tube, bucket_ms: the same per minute
    "by_hour",        # tube, bucket_ms: the same per hour
    "tries",          # tube, tries, jobs: how many jobs were reserved that many times
    "backlog",        # tube, bucket_ms: jobs ready/delayed/reserved/buried at the minute's end
    "failing_tubes",  # rank, tube, timed_out, failed, buried, failures (their sum), most first
    "failing_hours",  # rank, tube, bucket_ms, timed_out, failed, buried, failures, most first
)
