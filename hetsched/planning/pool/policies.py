"""Pool-mode policies as registered classes (see :mod:`hetsched.planning.base`).

Names are unique across modes: Hare is ``hare``; the baselines, which share
their papers' names with space mode's policies, are ``pool-fifo``,
``pool-srtf``, ``pool-homo`` and ``pool-allox`` (the bare names still work in
pool mode, with a deprecation line).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from hetsched.planning.base import BasePolicy
from hetsched.planning.pool.baselines import BASELINES
from hetsched.planning.pool.evaluator import TaskSchedule
from hetsched.planning.pool.problem import PoolProblem

if TYPE_CHECKING:
    from hetsched.planning.pool.space_seed import SpaceWork

POOL_REGISTRY: dict[str, type[PoolPolicy]] = {}
#: hare's ``space`` choices: how pool mode uses the best space plan
SPACE_CHOICES = ("seed", "keep", "off")


class PoolPolicy(BasePolicy):
    """A pool-mode policy: ``schedule`` returns every task's GPU and start time."""

    mode: ClassVar[str] = "pool"

    def __init__(self) -> None:
        """Policies without parameters take none; others override with keyword-only ones."""

    def schedule(self, pp: PoolProblem, rel: Any) -> TaskSchedule:
        """The task schedule; ``rel`` is the plan's relaxation (bound and round order)."""
        raise NotImplementedError


def register_pool(cls: type[PoolPolicy]) -> type[PoolPolicy]:
    """Class decorator: make a pool-mode policy known by its (globally unique) name."""
    from hetsched.planning.registry import claim

    claim(cls.name, "pool")
    for old in cls.aliases:
        claim(old, "pool", alias_of=cls.name)
    POOL_REGISTRY[cls.name] = cls
    return cls


@register_pool
class Hare(PoolPolicy):
    name = "hare"
    paper = "Hare, HPDC'22 §5.2"
    summary = "Relaxation order + Algorithm 1 list scheduling of tasks (relaxed scale-fixed sync)"
    param_docs = {"pick": "GPU rule: finish, available or best (both, keep the better)",
                  "order": "round order: relaxation, priority, work, seeded or best",
                  "bound": "relaxation: lp, fluid or auto (lp while it fits)",
                  "space": "seed: also plan space mode (on its own costs, and up to 200 "
                           "jobs on the pool's: one exchange per round, no restarts), start "
                           "from the lower of those plans as a task plan (uneven tasks) and "
                           "improve it by backfilling idle GPUs and "
                           "re-placing waiting jobs into the gaps; keep "
                           "Hare's own plan when lower (the plan stays a task plan, never above "
                           "the space plan's task plan); keep: also keep the space plan itself "
                           "when time sharing does not beat it; off: the pool model alone, "
                           "as the paper"}

    def __init__(self, *, pick: str = "best", order: str = "best", bound: str = "auto",
                 space: str = "seed") -> None:
        self.pick, self.order, self.bound = str(pick), str(order), str(bound)
        if space not in SPACE_CHOICES:
            raise ValueError(f"space must be one of {', '.join(SPACE_CHOICES)}, got {space!r}")
        self.space = str(space)
        #: the best space plan and what pool mode makes of it (plan_pool sets it; it may
        #: still be computing): Hare tries its order last, starts from its exact task plan,
        #: improved, and keeps it unless its own plan is lower
        self.space_source: Callable[[], SpaceWork] | None = None

    @property
    def improves_space(self) -> bool:
        """Whether this Hare starts from the space plan's task plan (and so improves it)."""
        return self.space != "off" and self.order in ("best", "seeded")

    def schedule(self, pp: PoolProblem, rel: Any) -> TaskSchedule:
        from hetsched.planning.pool.evaluator import evaluate
        from hetsched.planning.pool.hare import hare_from

        src = self.space_source if self.space != "off" else None

        def late() -> dict[str, TaskSchedule]:  # only asked for where src is set
            seed = src().seed if src is not None else None
            return {} if seed is None else {"space": seed}

        res = hare_from(pp, rel, self.pick, self.order,
                        late_seeds=late if src is not None else None).schedule
        if src is None or not self.improves_space:  # one order asked for: that order
            return res
        work = src()
        if work.improved is None or work.tasks_s is None:
            return res
        im = work.improved
        own = evaluate(pp, res).objective
        if own <= im.objective:
            res.params = {**res.params, "space_tasks_s": round(im.objective, 6)}
            return res
        best = im.schedule
        best.policy = "hare"
        best.params = {"order": work.improved_from, "pick": "backfill",
                       "space_tasks_s": round(work.tasks_s, 6),
                       **({"pool_costs_tasks_s": round(work.pool_costs_tasks_s, 6)}
                          if work.pool_costs_tasks_s is not None else {}),
                       **({"smith_tasks_s": round(work.smith_tasks_s, 6),
                           "smith_efficiency": work.smith_efficiency,
                           "smith_types": work.smith_types}
                          if work.smith_tasks_s is not None else {}),
                       "backfill_tries": im.tries, "backfill_moves": im.accepted,
                       "reinserted_jobs": im.reinserted,
                       "hare_own_s": round(own, 6)}
        return best


def _baseline(key: str, summary: str, paper: str) -> type[PoolPolicy]:
    class Baseline(PoolPolicy):
        def schedule(self, pp: PoolProblem, rel: Any) -> TaskSchedule:
            return BASELINES[key](pp)

    Baseline.name = f"pool-{key}"
    Baseline.aliases = (key,)
    Baseline.summary, Baseline.paper = summary, paper
    Baseline.__name__ = Baseline.__qualname__ = f"Pool{key.capitalize()}"
    return register_pool(Baseline)


PoolFifo = _baseline("fifo", "Gavel_FIFO: arrival order, fastest free GPUs, waits for its P GPUs",
                     "Gavel, OSDI'20")
PoolSrtf = _baseline("srtf", "Shortest remaining time first, preemptive at round boundaries",
                     "Hare §7.1")
PoolHomo = _baseline("homo", "Sched_Homo: Smith's rule, intra-job parallelism, "
                     "heterogeneity-oblivious", "Zhang et al. via Hare §7.1")
PoolAllox = _baseline("allox", "Sched_Allox: one GPU per job, min-cost matching to "
                      "(GPU, position)", "AlloX, EuroSys'20")

__all__ = ["POOL_REGISTRY", "PoolPolicy", "register_pool", "Hare"]
