"""Emulated GPU speeds for the testbed (TEST-ONLY; never set these on a real cluster).

The testbed's fake GPUs are all the same CPU, so every GPU type would measure
the same throughput. Setting

    HETSCHED_EMULATE_SPEED="a100=2,v100=1,t4=0.5"     # relative speed per GPU type
    HETSCHED_EMULATE_COST="0.02,0.004"                 # optional: a, c at speed 1 (seconds)

makes every compute step (forward + backward + optimizer, no synchronisation)
on a GPU of type T take at least ``(a + c*b) / speed[T]`` seconds for local
batch ``b``: the runtime sleeps for the rest of that time after the real
computation. Because the emulated time is a floor rather than a multiple of
the measured time, it does not depend on how busy the shared CPU is, so
probes and training runs on the testbed see stable, affine, type-dependent
step times. Types not listed run unthrottled. Both the probe and the training
loop apply it; sbatch passes the submitting shell's environment to the job.

An emulated slow link between nodes (communication-heavy jobs on a testbed
whose "nodes" share one host):

    HETSCHED_EMULATE_LINK="0.01,0.5"     # A seconds per all-reduce + C seconds per MiB

makes every gradient all-reduce of a job with more than one rank (the COMM
part: ``hetdp.sync_gradients``, a group's communication thread) take at least
``A + C * MiB`` seconds, MiB being the all-reduced buffer's size; again a floor
after the real all-reduce, slept without holding the GIL, so another job's
computation runs meanwhile. It applies to every all-reduce, whether the ranks
sit on one node or several (the testbed's nodes are one host).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from hetsched import config
from hetsched.errors import InputError

SPEED_VAR = config.SETTINGS["emulate_speed"].env
COST_VAR = config.SETTINGS["emulate_cost"].env
LINK_VAR = config.SETTINGS["emulate_link"].env
MIB = float(1 << 20)
DEFAULT_COST = (0.02, 0.004)  # 20 ms per step + 4 ms per sample at speed 1


@dataclass(frozen=True)
class Emulation:
    """The emulated step time of one GPU type: ``(a + c*b) / speed``."""

    gpu_type: str
    speed: float
    a: float
    c: float

    def step_time(self, local_batch: int) -> float:
        return (self.a + self.c * local_batch) / self.speed

    def pad(self, local_batch: int, started: float) -> float:
        """Sleep until the emulated step time since ``started`` (perf_counter) has passed."""
        left = self.step_time(local_batch) - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)
        return max(left, 0.0)


def parse_speeds(text: str, source: str = SPEED_VAR) -> dict[str, float]:
    """``"a100=2,v100=1"`` -> {"a100": 2.0, "v100": 1.0}."""
    out: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, val = item.partition("=")
        try:
            speed = float(val)
        except ValueError:
            speed = -1.0
        if not sep or not name.strip() or not speed > 0:
            raise InputError(source, f"{item!r} is not TYPE=SPEED with a positive speed; "
                             "expected e.g. 'a100=2,v100=1'")
        out[name.strip().lower()] = speed
    return out


def emulation_for(gpu_type: str | None, env: Mapping[str, str] | None = None) -> Emulation | None:
    """The emulation for ``gpu_type`` from the environment, or None (run at real speed)."""
    env = os.environ if env is None else env
    raw = env.get(SPEED_VAR, "")
    if not raw or not gpu_type:
        return None
    speed = parse_speeds(raw).get(gpu_type.lower())
    if speed is None:
        return None
    a, c = DEFAULT_COST
    cost = env.get(COST_VAR, "")
    if cost:
        try:
            a, c = (float(x) for x in cost.split(","))
        except ValueError:
            raise InputError(COST_VAR, f"{cost!r} is not 'A,C' (seconds per step, seconds "
                             "per sample at speed 1), e.g. '0.02,0.004'") from None
        if a < 0 or c <= 0:
            raise InputError(COST_VAR, f"{cost!r}: need A >= 0 and C > 0")
    return Emulation(gpu_type.lower(), speed, a, c)


@dataclass(frozen=True)
class LinkEmulation:
    """The emulated all-reduce time: ``a + c * MiB`` seconds (a floor)."""

    a: float
    c: float

    def comm_time(self, nbytes: int) -> float:
        return self.a + self.c * nbytes / MIB

    def pad(self, nbytes: int, started: float) -> float:
        """Sleep until the emulated all-reduce time since ``started`` (perf_counter)."""
        left = self.comm_time(nbytes) - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)
        return max(left, 0.0)


def link_emulation(env: Mapping[str, str] | None = None) -> LinkEmulation | None:
    """The emulated link from ``HETSCHED_EMULATE_LINK``, or None (the real network)."""
    env = os.environ if env is None else env
    raw = env.get(LINK_VAR, "").strip()
    if not raw:
        return None
    try:
        a, c = (float(x) for x in raw.split(","))
    except ValueError:
        raise InputError(LINK_VAR, f"{raw!r} is not 'A,C' (seconds per all-reduce, seconds "
                         "per MiB of gradients), e.g. '0.01,0.5'") from None
    if not (a >= 0 and c >= 0) or a + c <= 0:
        raise InputError(LINK_VAR, f"{raw!r}: need A >= 0, C >= 0, not both 0")
    return LinkEmulation(a, c)
