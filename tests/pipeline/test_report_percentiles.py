"""The report's exact percentiles (``report.exact_percentiles``) against numpy, without Spark.

Every table's percentiles come out of that one function (per minute, hour and whole archive), so
it is checked here on its own: many small groups in one call, weights (a histogram's counts),
ties, one-sample groups, negative values, and the empty input.
"""

from __future__ import annotations

import numpy as np
import pytest

from tubeq.pipeline import report


def expected(values: np.ndarray, weights: np.ndarray) -> list[float]:
    samples = np.repeat(values, weights)
    return [float(np.percentile(samples, fraction * 100)) for fraction in report.PERCENTILES]


@pytest.mark.parametrize("seed", range(20))
def test_matches_numpy_percentile_per_group(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 400))
    keys = rng.integers(0, 12, size) * 1_000_003  # sparse keys, as the report's encodings are
    values = rng.integers(-300, 20_000, size)
    weights = rng.integers(1, 4, size) if seed % 2 else np.ones(size, np.int64)
    got_keys, counts, figures = report.exact_percentiles(keys, values, weights)
    assert list(got_keys) == sorted(set(keys.tolist()))
    for index, key in enumerate(got_keys):
        mine = keys == key
        assert counts[index] == weights[mine].sum()
        want = expected(values[mine], weights[mine])
        assert [figure[index] for figure in figures] == pytest.approx(want, abs=1e-9)


def test_ties_and_single_samples() -> None:
    keys = np.array([5, 5, 5, 5, 9], np.int64)
    values = np.array([7, 7, 7, 1, 42], np.int64)
    got_keys, counts, figures = report.exact_percentiles(keys, values, np.ones(5, np.int64))
    assert got_keys.tolist() == [5, 9] and counts.tolist() == [4, 1]
    assert [figure.tolist() for figure in figures] == [[7.0, 42.0], [7.0, 42.0], [7.0, 42.0]]


def test_a_histogram_equals_its_samples() -> None:
    values = np.array([3, 10, 11, 500], np.int64)
    weights = np.array([4, 1, 2, 3], np.int64)
    _, counts, figures = report.exact_percentiles(np.zeros(4, np.int64), values, weights)
    samples = np.repeat(values, weights)
    _, sample_counts, sample_figures = report.exact_percentiles(
        np.zeros(len(samples), np.int64), samples, np.ones(len(samples), np.int64))
    assert counts.tolist() == sample_counts.tolist() == [10]
    assert [f.tolist() for f in figures] == [f.tolist() for f in sample_figures]


def test_empty_input() -> None:
    empty = np.zeros(0, np.int64)
    keys, counts, figures = report.exact_percentiles(empty, empty, empty)
    assert len(keys) == len(counts) == 0
    assert [len(figure) for figure in figures] == [0] * len(report.PERCENTILES)
