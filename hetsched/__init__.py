"""hetsched: heterogeneity-aware batch planning for deep-learning training on Slurm."""

__version__ = "0.1.0"
