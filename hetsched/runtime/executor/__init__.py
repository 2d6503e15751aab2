"""The pool-mode executor: runs a pool plan's per-GPU task sequences with fast switching.

* :mod:`.plan` — the plan's jobs, GPUs (ids ``NODE-gINDEX``) and task rows (torch-free);
* :mod:`.entry` — ``hetsched exec``: rank/GPU from the environment, ``--local`` mode;
* :mod:`.coordinator` — rank 0's parameter servers, round barriers, failure detection;
* :mod:`.worker` — one GPU's executor loop (get, load, compute, put, clean);
* :mod:`.slots` — pinned host state, layer-by-layer pipelined loading, residency, zeroing;
* :mod:`.state` — flat parameters and round-boundary checkpoints;
* :mod:`.protocol` — the JSON-header + raw-payload messages (nothing unpickled);
* :mod:`.shm` — shared memory segments for executors on the coordinator's node.

See docs/executor.md.
"""
