"""Space sharing: GPUs are split between jobs, re-decided at each reset event."""
