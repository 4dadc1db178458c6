"""The phases' block bootstrap: its replicates' order statistics, selected
natively one replicate at a time, are numpy's partition of the replicate
matrix, value for value; and bad input to the native selection is refused."""

from __future__ import annotations

import numpy as np
import pytest

from loopscope import _native
from loopscope.analysis import compare as C

METRICS = ["p50", "p99", "p999", "mean"]


@pytest.mark.parametrize("lengths", [[4000, 4000], [1, 5, 0, 300], [2500], [7, 0, 33]])
def test_the_native_replicates_quantiles_equal_numpys_partition_of_the_replicate_matrix(lengths: list[int]) -> None:
    rng = np.random.default_rng(11)
    parts = [rng.lognormal(10, 1, n).round() for n in lengths]  # rounded: ties, as latencies in ns have
    native = C._boot_stats(parts, METRICS, 200, 32, np.random.default_rng(5))
    matrix = C._stats(C.block_resample(parts, 200, 32, np.random.default_rng(5)), METRICS)
    for m in ("p50", "p99", "p999"):
        assert np.array_equal(native[m], matrix[m]), m
    assert np.allclose(native["mean"], matrix["mean"], rtol=1e-12, atol=0)


def test_the_native_selection_refuses_starts_that_do_not_fit_their_series() -> None:
    v = np.arange(10, dtype=np.float64)
    with pytest.raises(ValueError, match="do not fit"):
        _native.boot_select(v, [10], [np.full((3, 1), 12, dtype=np.int64)], 32, [4], False)
    with pytest.raises(ValueError, match="ascending"):
        _native.boot_select(v, [10], [np.zeros((3, 1), dtype=np.int64)], 32, [5, 4], False)
