"""Harmony eq. (1) and (3) on worked cases (core.colocation)."""

import pytest

from hetsched.core.colocation import group_iteration_s, utilisation


def test_one_job_is_its_own_iteration():
    assert group_iteration_s([2.0], [1.0]) == 3.0


def test_complementary_pair_overlaps():
    # comp-heavy (3 s comp, 1 s comm) with comm-heavy (1 s comp, 3 s comm): 4 s, not 8 s
    assert group_iteration_s([3.0, 1.0], [1.0, 3.0]) == 4.0
    assert utilisation([3.0, 1.0], [1.0, 3.0]) == (1.0, 1.0)


def test_similar_jobs_serialise_on_the_gpu():
    assert group_iteration_s([3.0, 3.0], [1.0, 1.0]) == 6.0
    assert utilisation([3.0, 3.0], [1.0, 1.0]) == pytest.approx((1.0, 2 / 6))


def test_lengths_must_match():
    with pytest.raises(ValueError):
        group_iteration_s([1.0], [])
