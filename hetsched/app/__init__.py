"""Use cases: profile, submit, monitor, replan. They wire planning, state and the Slurm adapter."""
