"""The placer's replan hint (``prefer_gpus``): a job given the same per-type counts keeps
the GPUs it holds or waits for in Slurm; the hint never changes a policy's decisions."""

from __future__ import annotations

from planner_helpers import make_cluster, make_job, make_table

from hetsched.planning.planner import make_plan

CLUSTER = make_cluster([("v100-1", "v100", 4), ("v100-2", "v100", 4), ("t4-1", "t4", 4)])
TABLE = make_table({("w", "v100"): (0.01, 0.001, 64), ("w", "t4"): (0.04, 0.004, 64)})


def _jobs() -> list:
    return [make_job("a", "w", global_batch=64, min_gpus=2, max_gpus=2, gpu_types=("v100",)),
            make_job("b", "w", global_batch=32, min_gpus=1, max_gpus=1, gpu_types=("v100",))]


def _gpus(plan, name: str) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return sorted((w.node, w.gpu) for w in plan.job(name).segments[0].workers)


def test_same_counts_keep_the_hinted_gpus() -> None:
    plain = make_plan(_jobs(), CLUSTER, TABLE, policy="fifo")
    assert {n for n, _ in _gpus(plain, "a")} == {"v100-1"}  # best fit without a hint
    hint = {"a": [("v100-2", 1), ("v100-2", 3)], "b": [("v100-1", 2)]}
    sticky = make_plan(_jobs(), CLUSTER, TABLE, policy="fifo", prefer_gpus=hint)
    assert _gpus(sticky, "a") == [("v100-2", 1), ("v100-2", 3)]
    assert _gpus(sticky, "b") == [("v100-1", 2)]
    assert sticky.weighted_jct_s == plain.weighted_jct_s  # same types, same node layout


def test_a_hint_that_does_not_fit_the_counts_keeps_what_it_can() -> None:
    hint = {"a": [("v100-2", 3)]}  # one GPU hinted, the plan gives two
    plan = make_plan(_jobs(), CLUSTER, TABLE, policy="fifo", prefer_gpus=hint)
    got = _gpus(plan, "a")
    assert ("v100-2", 3) in got and {n for n, _ in got} == {"v100-2"}


def test_overlapping_hints_go_to_the_first_and_unknown_gpus_are_ignored() -> None:
    hint = {"b": [("v100-1", 0)], "a": [("v100-1", 0), ("v100-1", 1)],
            "ghost": [("v100-9", 0)]}
    plan = make_plan(_jobs(), CLUSTER, TABLE, policy="fifo", prefer_gpus=hint)
    assert _gpus(plan, "b") == [("v100-1", 0)]
    assert ("v100-1", 0) not in _gpus(plan, "a")
    assert len(_gpus(plan, "a")) == 2
