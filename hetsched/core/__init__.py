"""The pure domain: job and cluster types, the step-time model, the planning problem, the plan.

No file, process or Slurm access here; everything above imports it.
"""
