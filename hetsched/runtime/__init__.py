"""The training runtime: what runs inside a Slurm step (``hetsched run``, ``hetsched probe``).

This is the only package of hetsched that imports torch, and only in the
modules that need it (``hetdp``, ``checkpoint``, ``workloads``, ``trainer``,
``probe``). ``launcher`` (environment parsing), ``sampler``, ``emulate`` and
``reporting`` are torch-free so the CLI, the profiler and the monitor can use
them without paying for a torch import. See docs/runtime.md.
"""
