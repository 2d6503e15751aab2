"""unique_rows: the distinct rows of an int matrix, as np.unique(axis=0) finds them, fast."""

from __future__ import annotations

import numpy as np
import pytest

from hetsched.planning.pool.uneven import unique_rows


def _same_partition(a: np.ndarray) -> None:
    first, inv = unique_rows(a)
    assert (a[first][inv] == a).all()  # every row is its distinct row
    assert len(first) == len({tuple(r) for r in a.tolist()})  # and no two distinct rows merge
    assert (inv[first] == np.arange(len(first))).all()


@pytest.mark.parametrize("seed", range(20))
def test_small_values_use_one_key_per_row(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, int(rng.integers(1, 6)), size=(int(rng.integers(1, 60)), 4))
    _same_partition(a)


def test_values_too_wide_for_one_key_fall_back() -> None:
    a = np.array([[2 ** 40, 2 ** 30, 5], [1, 2, 3], [2 ** 40, 2 ** 30, 5], [1, 2, 4]])
    _same_partition(a)
    inv = unique_rows(a)[1]
    assert inv[0] == inv[2] and len({int(x) for x in inv}) == 3


def test_no_rows() -> None:
    first, inv = unique_rows(np.zeros((0, 3), dtype=np.int64))
    assert len(first) == 0 and len(inv) == 0
