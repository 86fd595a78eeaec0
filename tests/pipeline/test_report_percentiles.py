"""The report's exact percentiles (``rollup.exact_percentiles``) against numpy, without Spark.

Every table's percentiles come out of that one function (per minute, hour and whole archive), so
it is checked here on its own: many small groups in one call, weights (a histogram's counts),
ties, one-sample groups, negative values, and the empty input.
"""

from __future__ import annotations

import numpy as np
import pytest

from tubeq.pipeline import rollup
from tubeq.pipeline.tables import ALL_TUBES, HOUR_MS, MINUTE_MS, PERCENTILES


def expected(values: np.ndarray, weights: np.ndarray) -> list[float]:
    samples = np.repeat(values, weights)
    return [float(np.percentile(samples, fraction * 100)) for fraction in PERCENTILES]


@pytest.mark.parametrize("seed", range(20))
def test_matches_numpy_percentile_per_group(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 400))
    keys = rng.integers(0, 12, size) * 1_000_003  # sparse keys, as the report's encodings are
    values = rng.integers(-300, 20_000, size)
    weights = rng.integers(1, 4, size) if seed % 2 else np.ones(size, np.int64)
    got_keys, counts, figures = rollup.exact_percentiles(keys, values, weights)
    assert list(got_keys) == sorted(set(keys.tolist()))
    for index, key in enumerate(got_keys):
        mine = keys == key
        assert counts[index] == weights[mine].sum()
        want = expected(values[mine], weights[mine])
        assert [figure[index] for figure in figures] == pytest.approx(want, abs=1e-9)


def test_ties_and_single_samples() -> None:
    keys = np.array([5, 5, 5, 5, 9], np.int64)
    values = np.array([7, 7, 7, 1, 42], np.int64)
    got_keys, counts, figures = rollup.exact_percentiles(keys, values, np.ones(5, np.int64))
    assert got_keys.tolist() == [5, 9] and counts.tolist() == [4, 1]
    assert [figure.tolist() for figure in figures] == [[7.0, 42.0], [7.0, 42.0], [7.0, 42.0]]


def test_a_histogram_equals_its_samples() -> None:
    values = np.array([3, 10, 11, 500], np.int64)
    weights = np.array([4, 1, 2, 3], np.int64)
    _, counts, figures = rollup.exact_percentiles(np.zeros(4, np.int64), values, weights)
    samples = np.repeat(values, weights)
    _, sample_counts, sample_figures = rollup.exact_percentiles(
        np.zeros(len(samples), np.int64), samples, np.ones(len(samples), np.int64))
    assert counts.tolist() == sample_counts.tolist() == [10]
    assert [f.tolist() for f in figures] == [f.tolist() for f in sample_figures]


def test_empty_input() -> None:
    empty = np.zeros(0, np.int64)
    keys, counts, figures = rollup.exact_percentiles(empty, empty, empty)
    assert len(keys) == len(counts) == 0
    assert [len(figure) for figure in figures] == [0] * len(PERCENTILES)


def test_the_drivers_figures_are_the_workers() -> None:
    """``rollup.figures_of`` (in the driver, for few samples) gives the rows Spark's Python
    workers give from the same samples: ``minute_and_hour_figures`` per hour, and
    ``whole_archive_figures`` per tube and all tubes from their histograms."""
    import pyarrow as pa

    rng = np.random.default_rng(7)
    size = 3000
    samples = pa.table({
        "tube": pa.array([f"t{i}" for i in rng.integers(0, 5, size)]),
        "bucket_ms": pa.array(rng.integers(0, 4 * 60, size) * MINUTE_MS),  # four hours
        "measure": pa.array(rng.integers(0, 3, size).astype(np.int32)),
        "value": pa.array(rng.integers(0, 50, size)),  # values repeat: histograms are short
    })
    hours = samples.column("bucket_ms").to_numpy() // HOUR_MS
    expected = [rollup.minute_and_hour_figures(samples.filter(pa.array(hours == hour)))
                for hour in sorted(set(hours.tolist()))]
    rows = samples.to_pylist()
    for tube in [*sorted({row["tube"] for row in rows}), ALL_TUBES]:
        counted: dict[tuple[int, int], int] = {}
        for row in rows:
            if tube in (row["tube"], ALL_TUBES):
                key = (row["measure"], row["value"])
                counted[key] = counted.get(key, 0) + 1
        histogram = pa.table({"tube": [tube] * len(counted),
                              "measure": [measure for measure, _ in counted],
                              "value": [value for _, value in counted],
                              "n": list(counted.values())})
        expected.append(rollup.whole_archive_figures(histogram))

    def key(row: dict[str, object]) -> tuple[object, ...]:
        return (row["tube"], row["grain"], row["bucket_ms"], row["measure"])

    got = sorted(rollup.figures_of(samples).to_pylist(), key=key)
    assert got == sorted(pa.concat_tables(expected).to_pylist(), key=key)
    assert len(got) > 100


@pytest.mark.parametrize("seed", range(12))
def test_samples_sorted_packed_give_the_weighted_figures(seed: int) -> None:
    """``rollup.sample_percentiles`` (one sort of ``(key, value)`` packed in an int64) gives
    ``exact_percentiles``'s figures to the last bit, negative values included, and where the
    pair does not fit in 63 bits (seeds 8 and up: values ~2^60 apart) falls back to it."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 2000))
    keys = rng.integers(0, 40, size) * 7 - 100
    spread = 2**60 if seed >= 8 else 50_000
    values = rng.integers(-spread, spread, size)
    assert (rollup._packed(keys, values) is None) == (seed >= 8)
    got_keys, counts, figures = rollup.sample_percentiles(keys, values)
    want_keys, want_counts, want_figures = rollup.exact_percentiles(
        keys, values, np.ones(size, np.int64))
    assert got_keys.tolist() == want_keys.tolist()
    assert counts.tolist() == want_counts.tolist()
    assert [f.tolist() for f in figures] == [f.tolist() for f in want_figures]
    for index, key in enumerate(got_keys):
        want = expected(values[keys == key], np.ones(int(counts[index]), np.int64))
        assert [figure[index] for figure in figures] == pytest.approx(want, rel=1e-12)
