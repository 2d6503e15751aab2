"""The share sampler: every sample exactly once per epoch, for any shares; resumable."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hetsched.runtime.sampler import ShareSampler, split_counts


def _epoch(samplers: list[ShareSampler]) -> list[int]:
    seen: list[int] = []
    for _ in range(samplers[0].steps_per_epoch):
        for s in samplers:
            idx, _n = s.next()
            seen.extend(int(i) for i in idx)
    return seen


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 400), shares=st.lists(st.integers(1, 40), min_size=1, max_size=7),
       seed=st.integers(0, 3))
def test_every_sample_exactly_once_per_epoch(n: int, shares: list[int], seed: int) -> None:
    samplers = [ShareSampler(n, shares, r, seed=seed) for r in range(len(shares))]
    for epoch in range(2):
        seen = _epoch(samplers)
        assert sorted(seen) == list(range(n)), f"epoch {epoch}"
        assert all(s.state.epoch == epoch + 1 and s.state.offset == 0 for s in samplers)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 300), shares=st.lists(st.integers(1, 30), min_size=1, max_size=5),
       k=st.integers(0, 30), new_ranks=st.integers(1, 5), data=st.data())
def test_resume_on_another_split_continues_exactly(n: int, shares: list[int], k: int,
                                                   new_ranks: int, data: st.DataObject) -> None:
    """Stop after k steps, resume with other shares of the same global batch: the
    remaining samples of the epoch are the ones not yet seen, each once."""
    B = sum(shares)
    if new_ranks > B:
        new_ranks = B
    cuts = sorted(data.draw(st.lists(st.integers(1, B - 1), min_size=new_ranks - 1,
                                     max_size=new_ranks - 1, unique=True))) if B > 1 else []
    new_shares = [b - a for a, b in zip([0, *cuts], [*cuts, B], strict=True)]
    old = [ShareSampler(n, shares, r, seed=1) for r in range(len(shares))]
    k = min(k, old[0].steps_per_epoch)
    seen: list[int] = []
    for _ in range(k):
        for s in old:
            seen.extend(int(i) for i in s.next()[0])
    state = old[0].state_dict()
    if state["epoch"] == 1:  # the whole epoch was consumed before the stop
        assert sorted(seen) == list(range(n))
        return
    new = [ShareSampler(n, new_shares, r, seed=99) for r in range(len(new_shares))]
    for s in new:
        s.load_state_dict(state)
    while new[0].state.epoch == 0:
        for s in new:
            seen.extend(int(i) for i in s.next()[0])
    assert sorted(seen) == list(range(n))
    # and the permutation is the one an uninterrupted run uses
    straight = [ShareSampler(n, shares, r, seed=1) for r in range(len(shares))]
    assert sorted(_epoch(straight)) == list(range(n))


def test_deterministic_and_contiguous() -> None:
    a = [ShareSampler(50, [5, 3], r, seed=7) for r in range(2)]
    b = [ShareSampler(50, [5, 3], r, seed=7) for r in range(2)]
    assert _epoch(a) == _epoch(b)
    s0, s1 = ShareSampler(16, [5, 3], 0, shuffle=False), ShareSampler(16, [5, 3], 1, shuffle=False)
    assert list(s0.next()[0]) == [0, 1, 2, 3, 4] and list(s1.next()[0]) == [5, 6, 7]


@given(n=st.integers(0, 100), shares=st.lists(st.integers(1, 30), min_size=1, max_size=6))
def test_split_counts_sums_and_is_proportional(n: int, shares: list[int]) -> None:
    n = min(n, sum(shares))
    c = split_counts(n, shares)
    assert sum(c) == n
    assert all(abs(ci - n * s / sum(shares)) < 1 for ci, s in zip(c, shares, strict=True))
