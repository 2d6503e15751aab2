"""Ctrl-C (or SIGTERM) during `hetsched profile`: the probes still queued or running are
cancelled, those that finished are recorded, and the exit code says which signal.

Before, an interrupted profile left every probe job in the queue: they ran later on
the partition's GPUs, nobody read their results, and the next `profile` submitted
them all again. The real path (a busy testbed, a real SIGINT to the CLI) is
tests/slurm/test_profile_interrupt_tb.py.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hetsched.app.probe_run import ProbesInterrupted, run_probes
from hetsched.app.profile import NOT_RUN, ProbeSpec, render_probes
from hetsched.slurm.client import JobInfo
from hetsched.state.history import statuses
from hetsched.state.store import open_store

# SIGHUP reaches these tests as a terminal sends it (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("hangups_delivered")


CSV = "workload,gpu_type,local_batch,step_time_s\nmlp,a100,8,0.02\nmlp,a100,16,0.03\n"


class _Client:
    """Stands in for Slurm to drive run_probes' bookkeeping: the a100 probe ends with
    results at the first poll, the others keep running; ``signal_at`` sends a signal
    to this process at that sbatch (``("sbatch", n)``) or squeue (``("squeue", n)``)."""

    def __init__(self, signal_at: tuple[str, int], sig: int) -> None:
        self.signal_at, self.sig = signal_at, sig
        self.scripts: dict[str, str] = {}
        self.cancelled: list[list[str]] = []
        self.polls = 0

    def _maybe_signal(self, what: str, n: int) -> None:
        if (what, n) == self.signal_at:
            os.kill(os.getpid(), self.sig)

    def submit(self, script: str, extra_args: tuple[str, ...] = ()) -> str:
        jid = str(len(self.scripts) + 1)
        self.scripts[jid] = script
        self._maybe_signal("sbatch", len(self.scripts))
        return jid

    def jobs(self) -> list[JobInfo]:
        self.polls += 1
        out = []
        for jid, script in self.scripts.items():
            if "a100" in Path(script).name:
                Path(script).with_suffix(".csv").write_text(CSV)
                out.append(JobInfo(jid, "p", "COMPLETED"))
            elif not any(jid in c for c in self.cancelled):
                out.append(JobInfo(jid, "p", "RUNNING"))
        self._maybe_signal("squeue", self.polls)
        return out

    def cancel(self, ids: list[str]) -> None:
        self.cancelled.append(list(ids))


def _probes(tmp_path: Path) -> list:
    specs = [ProbeSpec("mlp", g, (8, 16)) for g in ("a100", "v100", "t4")]
    return render_probes(specs, tmp_path / "files", partition=None, time_limit_s=30,
                         warmup=1, steps=1, hetsched="hetsched")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_probes_run_cancels_them_and_keeps_the_finished(
        tmp_path: Path, sig: int) -> None:
    client = _Client(("squeue", 2), sig)  # after the a100 probe was collected
    outs = _probes(tmp_path)
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(ProbesInterrupted) as e:
            run_probes(outs, client, st, time_limit_s=30, queue_wait_s=30, poll_s=0.01)
        assert e.value.exit_code == 128 + sig
        kept = statuses(st)
    assert client.cancelled == [["2", "3"]]  # one scancel, only the unfinished
    assert {g: s["status"] for (_, g), s in kept.items()} == {"a100": "ok"}
    by = {o.spec.gpu_type: o for o in outs}
    assert by["v100"].status == by["t4"].status == NOT_RUN
    assert f"interrupted by {signal.Signals(sig).name}" in by["v100"].reason
    msg = str(e.value)
    assert msg == (f"profile interrupted by {signal.Signals(sig).name}: cancelled 2 probe "
                   "job(s) (Slurm 2, 3); 1 finished probe(s) recorded; `hetsched profile` "
                   "again probes the rest")


def test_a_signal_during_the_sbatch_loop_submits_no_more(tmp_path: Path) -> None:
    """The sbatch in flight is answered and recorded, then cancelled; the rest are never
    submitted."""
    client = _Client(("sbatch", 1), signal.SIGINT)
    outs = _probes(tmp_path)
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(ProbesInterrupted, match=r"cancelled 1 probe job\(s\) \(Slurm 1\); "
                           r"0 finished"):
            run_probes(outs, client, st, time_limit_s=30, queue_wait_s=30, poll_s=0.01)
        assert statuses(st) == {}
    assert list(client.scripts) == ["1"] and client.cancelled == [["1"]]
    assert client.polls == 0
    assert [o.reason for o in outs[1:]] == ["not submitted: profile was interrupted"] * 2


def test_a_probe_that_wrote_its_results_before_the_signal_still_counts(
        tmp_path: Path) -> None:
    """It ended between the last squeue and the signal: its file is read, not thrown
    away (the v100 probe's here, and the a100 one's, which the fake writes at that
    squeue)."""
    client = _Client(("squeue", 1), signal.SIGINT)
    outs = _probes(tmp_path)
    outs[1].out.write_text(CSV.replace("a100", "v100"))  # type: ignore[union-attr]
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(ProbesInterrupted, match=r"cancelled 1 probe job\(s\) \(Slurm 3\); "
                           r"2 finished"):
            # the signal comes during the first squeue, whose answer is still read
            run_probes(outs, client, st, time_limit_s=30, queue_wait_s=30, poll_s=0.01)
        got = {g: s["status"] for (_, g), s in statuses(st).items()}
    assert got == {"a100": "ok", "v100": "ok"}
    assert client.cancelled == [["2", "3"]]


def test_a_signal_while_slurm_is_down_names_the_probes_left_queued(tmp_path: Path) -> None:
    """scancel cannot reach the controller: the message names the jobs to cancel by hand
    rather than claiming they were cancelled."""
    from hetsched.slurm.runner import SlurmUnavailable

    class _Down(_Client):
        def cancel(self, ids: list[str]) -> None:
            raise SlurmUnavailable(["scancel", *ids], None, "Unable to contact slurm controller")

    client = _Down(("squeue", 2), signal.SIGINT)
    outs = _probes(tmp_path)
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(ProbesInterrupted) as e:
            run_probes(outs, client, st, time_limit_s=30, queue_wait_s=30, poll_s=0.01)
        assert {g for (_, g) in statuses(st)} == {"a100"}
    assert str(e.value) == ("profile interrupted by SIGINT: could not cancel Slurm job(s) "
                            "2, 3: scancel them; 1 finished probe(s) recorded; `hetsched "
                            "profile` again probes the rest")
