"""The report's tables, rolled up in the driver from what Spark aggregated over the events.

Owns the exact percentiles (numpy: the same functions run in Spark's Python workers for a large
archive and in the driver for a small one) and the seven result tables (``tables.TABLES``) built
from the three aggregates ``report.py`` has Spark compute: the flows per tube and minute (event
counts, sums and each state's net change), the percentile figures (``FIGURES_DDL`` rows) and the
jobs per number of tries per tube. Those are small whatever the archive's length (rows per tube
and minute, not per event; the page holds them all anyway), so rolling them up into hours,
tubes, all tubes, the backlog's running sums and the rankings takes milliseconds here, where
each of those steps was a Spark plan of its own, a job or more in a fresh JVM
(bench/RESULTS-pipeline.md, issue 33).

Rules:

* Imports neither pyspark nor anything of the pipeline but ``tables``: what runs in a Python
  worker imports only this (and numpy, pyarrow).
* Every table has a fixed Arrow schema (:data:`SCHEMAS`, the types Spark wrote them with:
  counts BIGINT, percentiles DOUBLE, a rank INT), also when it is empty, and its rows sorted by
  its keys (a ranking by rank); strings sort by their UTF-8 bytes, as Spark's did.
* Sums are of integers, and every percentile is a figure ``exact_percentiles`` returned, moved
  and never recomputed: a table's numbers do not depend on where they were rolled up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from numpy.typing import NDArray

from tubeq.pipeline.tables import (
    ALL_TUBES,
    COUNTED_COLUMNS,
    HOUR_MS,
    MEASURES,
    MINUTE_MS,
    PERCENTILES,
    STATES,
    SUMMED,
)

# ---------------------------------------------------------------------------------------------
# Exact percentiles. The groups are bounded: an hour of samples (every tube's minutes and hour,
# and the same for all tubes together), or one tube's samples (or histogram of distinct values)
# over the whole archive.
# ---------------------------------------------------------------------------------------------

# One row per tube (or "*"), grain, bucket and measure: grain is MINUTE_MS, HOUR_MS or
# WHOLE_ARCHIVE (bucket_ms 0); p<i> is PERCENTILES[i]; measure is an index in MEASURES.
FIGURES_DDL: Final = ("tube STRING, grain BIGINT, bucket_ms BIGINT, measure INT, n BIGINT, "
                      + ", ".join(f"p{index} DOUBLE" for index in range(len(PERCENTILES))))
WHOLE_ARCHIVE: Final = 0
_MINUTES_PER_HOUR: Final = HOUR_MS // MINUTE_MS
FIGURES_SCHEMA: Final = pa.schema(
    [("tube", pa.string()), ("grain", pa.int64()), ("bucket_ms", pa.int64()),
     ("measure", pa.int32()), ("n", pa.int64())]
    + [(f"p{index}", pa.float64()) for index in range(len(PERCENTILES))])
# The samples the figures are read from: one row per event that measures something.
SAMPLES_SCHEMA: Final = pa.schema([("tube", pa.string()), ("bucket_ms", pa.int64()),
                                   ("measure", pa.int32()), ("value", pa.int64())])


def exact_percentiles(key: NDArray[np.int64], value: NDArray[np.int64],
                      weight: NDArray[np.int64]
                      ) -> tuple[NDArray[np.int64], NDArray[np.int64], list[NDArray[np.float64]]]:
    """Per distinct ``key`` (ascending): the samples' count and their ``PERCENTILES``, where each
    ``value`` counts ``weight`` times.

    Linear interpolation between the two nearest ranks, as ``numpy.percentile``'s default: at
    position ``(n - 1) * fraction`` between 0-based ranks ``lo`` and ``hi``,
    ``v[lo] + (v[hi] - v[lo]) * (position - lo)``. The figures depend on the multiset of
    values only, not on their order nor on how equal values are grouped into weights.
    """
    if len(key) == 0:
        return key, key, [np.zeros(0) for _ in PERCENTILES]
    packed = _packed(key, value)
    order = np.lexsort((value, key)) if packed is None else np.argsort(packed[0])
    key, value, weight = key[order], value[order], weight[order]
    running = np.cumsum(weight)
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    earlier = (running - weight)[first]  # the weight of the groups before each group
    counts = np.add.reduceat(weight, first)
    figures = []
    for fraction in PERCENTILES:
        position = (counts - 1) * fraction
        low, high = np.floor(position), np.ceil(position)
        # A group's sample at rank r is its first whose running weight passes r.
        at_low = value[np.searchsorted(running, earlier + low, side="right")]
        at_high = value[np.searchsorted(running, earlier + high, side="right")]
        figures.append(at_low + (at_high - at_low) * (position - low))
    return key[first], counts, figures


def sample_percentiles(key: NDArray[np.int64], value: NDArray[np.int64]
                       ) -> tuple[NDArray[np.int64], NDArray[np.int64], list[NDArray[np.float64]]]:
    """:func:`exact_percentiles` of samples that count once each (``weight`` 1): the same
    figures, from one sort of the packed ``(key, value)`` pairs instead of a sort of indexes and
    three gathers, where the pairs fit in 63 bits (else by :func:`exact_percentiles` itself)."""
    packed = _packed(key, value) if len(key) else None
    if packed is None:
        return exact_percentiles(key, value, np.ones_like(value))
    pairs, key_min, value_min, value_bits = packed
    pairs.sort()
    key = (pairs >> value_bits) + key_min
    value = (pairs & ((1 << value_bits) - 1)) + value_min
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    counts = np.diff(np.r_[first, len(key)])
    figures = []
    for fraction in PERCENTILES:
        # The same arithmetic as exact_percentiles, so the figures are equal to the last bit:
        # with weight 1 the sample at a group's rank r is its (first + r)-th.
        position = (counts - 1) * fraction
        low, high = np.floor(position), np.ceil(position)
        at_low = value[first + low.astype(np.int64)]
        at_high = value[first + high.astype(np.int64)]
        figures.append(at_low + (at_high - at_low) * (position - low))
    return key[first], counts, figures


def _packed(key: NDArray[np.int64], value: NDArray[np.int64]
            ) -> tuple[NDArray[np.int64], int, int, int] | None:
    """Each ``(key, value)`` pair as one int64 that sorts as the pair does (the key's offset
    from the least key in the high bits, the value's in the low ones), with that least key,
    the least value and the value's bit count; None where the offsets need more than 63 bits.
    numpy sorts one int64 array several times faster than ``lexsort`` sorts two
    (bench/RESULTS-pipeline.md)."""
    key_min, key_max = int(key.min()), int(key.max())
    value_min, value_max = int(value.min()), int(value.max())
    value_bits = (value_max - value_min).bit_length()
    if (key_max - key_min).bit_length() + value_bits > 63:
        return None
    pairs = ((key - key_min) << value_bits) | (value - value_min)
    return pairs.astype(np.int64, copy=False), key_min, value_min, value_bits


def _figures_table(tubes: Any, grain: int, bucket_ms: NDArray[np.int64],
                   measure: NDArray[np.int64], counts: NDArray[np.int64],
                   figures: Sequence[NDArray[np.float64]]) -> Any:
    """An Arrow table of ``FIGURES_SCHEMA`` rows (``tubes``: an Arrow string array)."""
    columns = [tubes, pa.array(np.full(len(counts), grain, np.int64)),
               pa.array(bucket_ms, pa.int64()), pa.array(measure, pa.int32()),
               pa.array(counts, pa.int64()), *[pa.array(f, pa.float64()) for f in figures]]
    return pa.Table.from_arrays(columns, schema=FIGURES_SCHEMA)


def _tube_codes(tube: Any) -> tuple[Any, NDArray[np.int64], NDArray[np.int64]]:
    """The tube names with "*" after them, each row's index in them, and "*"'s index for each."""
    encoded = tube.combine_chunks().dictionary_encode()
    names = pa.concat_arrays([encoded.dictionary, pa.array([ALL_TUBES])])
    own = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return names, own, np.full_like(own, len(names) - 1)


def minute_and_hour_figures(samples: Any) -> Any:
    """The figures of one hour's samples (an Arrow table of ``SAMPLES_SCHEMA`` columns, every
    ``bucket_ms`` a minute of that hour): per tube and minute, tube and hour, and the same for
    all tubes together."""
    names, own, every = _tube_codes(samples.column("tube"))
    minute_ms = samples.column("bucket_ms").to_numpy()
    hour_ms = int(minute_ms[0]) // HOUR_MS * HOUR_MS
    measure = samples.column("measure").to_numpy().astype(np.int64)
    value = samples.column("value").to_numpy()
    tables = []
    for grain, slot in ((MINUTE_MS, (minute_ms - hour_ms) // MINUTE_MS),
                        (HOUR_MS, np.zeros_like(minute_ms))):
        for who in (own, every):
            # One integer key per (tube, minute of the hour, measure).
            key = (who * _MINUTES_PER_HOUR + slot) * len(MEASURES) + measure
            keys, counts, figures = sample_percentiles(key, value)
            bucket = hour_ms + keys // len(MEASURES) % _MINUTES_PER_HOUR * grain
            tables.append(_figures_table(
                names.take(pa.array(keys // len(MEASURES) // _MINUTES_PER_HOUR)), grain, bucket,
                keys % len(MEASURES), counts, figures))
    return pa.concat_tables(tables)


def whole_archive_figures(histogram: Any) -> Any:
    """The figures of one tube (or "*") over the whole archive, from its histogram (an Arrow
    table: tube, measure, value, n; one row per distinct value)."""
    measure = histogram.column("measure").to_numpy().astype(np.int64)
    keys, counts, figures = exact_percentiles(measure, histogram.column("value").to_numpy(),
                                              histogram.column("n").to_numpy())
    tubes = pa.array([histogram.column("tube")[0].as_py()] * len(keys), pa.string())
    return _figures_table(tubes, WHOLE_ARCHIVE, np.zeros_like(keys), keys, counts, figures)


def figures_of(samples: Any) -> Any:
    """Every figure (``FIGURES_SCHEMA``: per minute, hour and the whole archive, every tube and
    all tubes) of ``samples`` (``SAMPLES_SCHEMA``), in this process: what Spark's Python
    workers compute from the same samples (``report.py``), hour by hour and from each tube's
    histogram, for an archive whose samples are few. Each grain is one sort of all the samples
    (a minute's or an hour's key never spans two hours, so the groups are the workers')."""
    if samples.num_rows == 0:
        return FIGURES_SCHEMA.empty_table()
    names, own, every = _tube_codes(samples.column("tube"))
    minute_ms = samples.column("bucket_ms").to_numpy()
    measure = samples.column("measure").to_numpy().astype(np.int64)
    value = samples.column("value").to_numpy()
    tables = []
    for grain in (MINUTE_MS, HOUR_MS):
        bucket = minute_ms // grain
        first = int(bucket.min())
        slots = int(bucket.max()) - first + 1
        for who in (own, every):
            key = (who * slots + (bucket - first)) * len(MEASURES) + measure
            keys, counts, figures = sample_percentiles(key, value)
            tables.append(_figures_table(
                names.take(pa.array(keys // len(MEASURES) // slots)), grain,
                (first + keys // len(MEASURES) % slots) * grain, keys % len(MEASURES), counts,
                figures))
    for who in (own, every):
        keys, counts, figures = sample_percentiles(who * len(MEASURES) + measure, value)
        tables.append(_figures_table(names.take(pa.array(keys // len(MEASURES))),
                                     WHOLE_ARCHIVE, np.zeros_like(keys), keys % len(MEASURES),
                                     counts, figures))
    return pa.concat_tables(tables)


# ---------------------------------------------------------------------------------------------
# The tables.
# ---------------------------------------------------------------------------------------------

COUNTS: Final = (*COUNTED_COLUMNS, *SUMMED)
DELTAS: Final = tuple(f"d_{state}" for state in STATES)
SHARES: Final = tuple(f"{measure}_p{round(fraction * 100)}"
                      for measure in MEASURES for fraction in PERCENTILES)
# What report.py hands over: flows per tube and minute (no "*" rows), jobs per tries per tube.
FLOWS_SCHEMA: Final = pa.schema([("tube", pa.string()), ("bucket_ms", pa.int64())]
                                + [(column, pa.int64()) for column in (*COUNTS, *DELTAS)])
TRIES_SCHEMA: Final = pa.schema([("tube", pa.string()), ("tries", pa.int64()),
                                 ("jobs", pa.int64())])


def _metrics_schema(keys: Sequence[str]) -> Any:
    return pa.schema(
        [("tube", pa.string())] + [("bucket_ms", pa.int64()) for key in keys if key != "tube"]
        + [(column, pa.int64()) for column in COUNTS]
        + [pa.field(f"{measure}_n", pa.int64(), nullable=False) for measure in MEASURES]
        + [(column, pa.float64()) for column in SHARES])


def _ranked_schema(keys: Sequence[str]) -> Any:
    return pa.schema(
        [pa.field("rank", pa.int32(), nullable=False), ("tube", pa.string())]
        + [("bucket_ms", pa.int64()) for key in keys if key != "tube"]
        + [(column, pa.int64()) for column in ("timed_out", "failed", "buried", "failures")])


SCHEMAS: Final = {
    "by_tube": _metrics_schema(["tube"]),
    "by_minute": _metrics_schema(["tube", "bucket_ms"]),
    "by_hour": _metrics_schema(["tube", "bucket_ms"]),
    "tries": TRIES_SCHEMA,
    "backlog": pa.schema([("tube", pa.string()),
                          pa.field("bucket_ms", pa.int64(), nullable=False)]
                         + [(state, pa.int64()) for state in (*STATES, "total")]),
    "failing_tubes": _ranked_schema(["tube"]),
    "failing_hours": _ranked_schema(["tube", "bucket_ms"]),
}


def report_tables(flows: Any, figures: Any, tries: Any) -> dict[str, Any]:
    """The seven tables (Arrow, ``SCHEMAS``) from the flows (``FLOWS_SCHEMA``), the figures
    (``FIGURES_SCHEMA``) and the tries (``TRIES_SCHEMA``)."""
    flows, figures, tries = (_as(flows, FLOWS_SCHEMA), _as(figures, FIGURES_SCHEMA),
                             _as(tries, TRIES_SCHEMA))
    per_tube, per_hour = _counts(flows, None), _counts(flows, HOUR_MS)
    return {
        "by_tube": _metrics(per_tube, figures, None),
        "by_minute": _metrics(_counts(flows, MINUTE_MS), figures, MINUTE_MS),
        "by_hour": _metrics(per_hour, figures, HOUR_MS),
        "tries": _sorted(_with_all_tubes(tries, ["tube", "tries"], ["jobs"]), "tries",
                         ["tube", "tries"]),
        "backlog": _backlog(flows),
        "failing_tubes": _ranked(per_tube, ["tube"], "failing_tubes"),
        "failing_hours": _ranked(per_hour, ["tube", "bucket_ms"], "failing_hours"),
    }


def _keys(grain_ms: int | None) -> list[str]:
    """The grouping columns of a table per ``grain_ms`` (a bucket size; None: whole archive)."""
    return ["tube"] if grain_ms is None else ["tube", "bucket_ms"]


def _as(table: Any, schema: Any) -> Any:
    """``table``'s columns named in ``schema``, in its order and of its types."""
    return pa.Table.from_arrays([table.column(field.name).cast(field.type) for field in schema],
                                schema=schema)


def _conformed(table: Any, name: str) -> Any:
    """``table``'s columns in ``SCHEMAS[name]``'s order and types."""
    return _as(table, SCHEMAS[name])


def _sorted(table: Any, name: str, keys: Sequence[str]) -> Any:
    return _conformed(table, name).sort_by([(key, "ascending") for key in keys])


def _summed(table: Any, keys: Sequence[str], columns: Sequence[str]) -> Any:
    """One row per distinct ``keys``, each of ``columns`` summed."""
    out = table.group_by(list(keys), use_threads=False).aggregate(
        [(column, "sum") for column in columns])
    return out.rename_columns([name.removesuffix("_sum") for name in out.column_names]).select(
        [*keys, *columns])


def _with_all_tubes(per_tube: Any, keys: Sequence[str], columns: Sequence[str]) -> Any:
    """``per_tube`` (one row per ``keys``) and the sums of ``columns`` over every tube, as tube
    ``ALL_TUBES``: summed from the per-tube rows. No rows give no ``*`` row."""
    every = per_tube.set_column(per_tube.schema.get_field_index("tube"), "tube",
                                pa.array([ALL_TUBES] * per_tube.num_rows, pa.string()))
    return pa.concat_tables([per_tube.select([*keys, *columns]),
                             _summed(every, keys, columns)])


def _counts(flows: Any, grain_ms: int | None) -> Any:
    """Event counts and ``SUMMED`` sums per tube (and bucket of ``grain_ms``), all tubes
    included."""
    keys = _keys(grain_ms)
    table = flows.select(["tube", "bucket_ms", *COUNTS])
    if grain_ms is None:
        table = table.drop_columns(["bucket_ms"])
    elif grain_ms != MINUTE_MS:
        bucket = table.column("bucket_ms").to_numpy() // grain_ms * grain_ms
        table = table.set_column(1, "bucket_ms", pa.array(bucket, pa.int64()))
    if grain_ms != MINUTE_MS:  # flows are per minute already
        table = _summed(table, keys, COUNTS)
    return _with_all_tubes(table, keys, COUNTS)


def _metrics(counts: Any, figures: Any, grain_ms: int | None) -> Any:
    """The counts (per tube, and bucket) with each measure's samples and percentiles; a measure
    with no samples there has 0 samples and no figures (null)."""
    keys = _keys(grain_ms)
    chosen = figures.filter(pc.equal(figures.column("grain"), grain_ms or WHOLE_ARCHIVE))
    out = counts
    for index, measure in enumerate(MEASURES):
        mine = chosen.filter(pc.equal(chosen.column("measure"), index))
        shares = [f"p{position}" for position in range(len(PERCENTILES))]
        out = out.join(mine.select([*keys, "n", *shares]).rename_columns(
            [*keys, f"{measure}_n", *[f"{measure}_p{round(f * 100)}" for f in PERCENTILES]]),
            keys, join_type="left outer")
        out = out.set_column(out.schema.get_field_index(f"{measure}_n"), f"{measure}_n",
                             pc.fill_null(out.column(f"{measure}_n"), 0))
    name = {None: "by_tube", MINUTE_MS: "by_minute", HOUR_MS: "by_hour"}[grain_ms]
    return _sorted(out, name, keys)


def _backlog(flows: Any) -> Any:
    """Jobs per state at the end of each minute, every minute from the first to the last, per
    tube and all tubes: the running sums of the states' net changes."""
    per_minute = _with_all_tubes(flows.select(["tube", "bucket_ms", *DELTAS]),
                                 ["tube", "bucket_ms"], DELTAS)
    if per_minute.num_rows == 0:
        return SCHEMAS["backlog"].empty_table()
    minute = per_minute.column("bucket_ms").to_numpy() // MINUTE_MS
    first = int(minute.min())
    width = int(minute.max()) - first + 1
    tubes, tube = np.unique(per_minute.column("tube").to_numpy(zero_copy_only=False),
                            return_inverse=True)
    columns: dict[str, Any] = {
        "tube": pa.array(np.repeat(tubes, width), pa.string()),
        "bucket_ms": pa.array(np.tile(np.arange(first, first + width, dtype=np.int64)
                                      * MINUTE_MS, len(tubes))),
    }
    total = np.zeros(len(tubes) * width, np.int64)
    for state, delta in zip(STATES, DELTAS, strict=True):
        grid = np.zeros((len(tubes), width), np.int64)
        grid[tube, minute - first] = per_minute.column(delta).to_numpy()
        running = np.cumsum(grid, axis=1).reshape(-1)
        columns[state] = pa.array(running)
        total += running
    columns["total"] = pa.array(total)
    return _conformed(pa.table(columns), "backlog")


def _ranked(counts: Any, keys: Sequence[str], name: str) -> Any:
    """The tubes (or tube-hours) with failures (``timed_out + failed + buried``), most first,
    then by keys; rank 1, 2, ..."""
    failures = pc.add(pc.add(counts.column("timed_out"), counts.column("failed")),
                      counts.column("buried"))
    failing = counts.append_column("failures", failures).filter(
        pc.and_(pc.not_equal(counts.column("tube"), ALL_TUBES), pc.greater(failures, 0)))
    failing = failing.sort_by([("failures", "descending"),
                               *[(key, "ascending") for key in keys]])
    ranks = pa.array(np.arange(1, failing.num_rows + 1, dtype=np.int32))
    return _conformed(failing.append_column("rank", ranks), name)
