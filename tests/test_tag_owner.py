"""A submission's tag names a plan (its content hash) and a job, not a user.

Two users who plan the same jobs file on the same partition get the same plan
id, so the same ``--comment`` tags. Where hetsched finds a job by its tag (a
submit killed between sbatch and recording the id, a pool job a lost reply may
have created), it now takes only the caller's own jobs: another user's was
adopted as this user's, or (pool rollback) cancelled.
"""

from __future__ import annotations

import os

from hetsched.app.pool_submit import _find_pool_job
from hetsched.app.space_submit import _find_tagged
from hetsched.slurm.client import JobInfo, parse_job_json
from hetsched.slurm.pool_script import pool_comment


class _Jobs:
    def __init__(self, jobs: list[JobInfo]) -> None:
        self._jobs = jobs

    def jobs(self) -> list[JobInfo]:
        return self._jobs


def test_only_the_callers_tagged_jobs_are_found() -> None:
    me, other = os.getuid(), os.getuid() + 1
    tag = "hetsched:p1:a:0"
    theirs = JobInfo("10", "a", "PENDING", comment=tag, user_id=other)
    assert _find_tagged(_Jobs([theirs]), "p1") == {}  # type: ignore[arg-type]
    mine = JobInfo("11", "a", "PENDING", comment=tag, user_id=me)
    assert _find_tagged(_Jobs([theirs, mine]), "p1") == {tag: "11"}  # type: ignore[arg-type]
    pool = [JobInfo("20", "pool", "RUNNING", comment=pool_comment("p2"), user_id=other)]
    assert _find_pool_job(_Jobs(pool), "p2") is None  # type: ignore[arg-type]
    pool.append(JobInfo("21", "pool", "RUNNING", comment=pool_comment("p2"), user_id=me))
    assert _find_pool_job(_Jobs(pool), "p2") == "21"  # type: ignore[arg-type]


def test_squeue_says_whose_job_it_is() -> None:
    rec = {"job_id": 5, "name": "a", "job_state": "PENDING", "user_id": os.getuid() + 1}
    assert not parse_job_json(rec).mine
    assert parse_job_json({**rec, "user_id": os.getuid()}).mine
    assert parse_job_json({k: v for k, v in rec.items() if k != "user_id"}).mine
