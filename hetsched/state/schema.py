"""The state file's SQLite schema and its migrations (the store opens, checks and migrates).

Version 1 is documented in docs/slurm.md, version 2 (the profiler) in docs/runtime.md,
version 3 (ONES's progress history) in docs/elastic.md.
"""

from __future__ import annotations

SCHEMA_VERSION = 3
APPLICATION = "hetsched"

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE plans (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    policy TEXT NOT NULL DEFAULT '',
    source TEXT NOT NULL DEFAULT '',
    active INTEGER NOT NULL DEFAULT 0,
    body TEXT NOT NULL
);
CREATE TABLE submissions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    plan_id TEXT NOT NULL REFERENCES plans(id),
    job TEXT NOT NULL,
    segment INTEGER NOT NULL,
    slurm_id TEXT,
    state TEXT NOT NULL,
    script_hash TEXT NOT NULL,
    script_path TEXT NOT NULL DEFAULT '',
    workers TEXT NOT NULL DEFAULT '[]',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    UNIQUE (plan_id, job, segment)
);
CREATE INDEX submissions_slurm ON submissions (slurm_id);
CREATE INDEX submissions_job ON submissions (job);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    job TEXT,
    node TEXT,
    slurm_id TEXT,
    detail TEXT NOT NULL DEFAULT '',
    handled INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE replans (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started REAL NOT NULL,
    finished REAL,
    old_plan TEXT,
    new_plan TEXT,
    reason TEXT NOT NULL DEFAULT '',
    cancelled TEXT NOT NULL DEFAULT '[]',
    submitted TEXT NOT NULL DEFAULT '[]',
    status TEXT NOT NULL DEFAULT 'running'
);
CREATE TABLE node_states (
    node TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    gpu_type TEXT NOT NULL DEFAULT '',
    gpus INTEGER NOT NULL DEFAULT 0,
    updated REAL NOT NULL
);
CREATE TABLE spool_seen (
    path TEXT PRIMARY KEY,
    sha TEXT NOT NULL,
    seen REAL NOT NULL
);
CREATE TABLE profiles (
    workload TEXT NOT NULL,
    gpu_type TEXT NOT NULL,
    local_batch INTEGER NOT NULL,
    step_time_s REAL NOT NULL,
    sync_time_s REAL,
    source TEXT NOT NULL DEFAULT '',
    updated REAL NOT NULL,
    PRIMARY KEY (workload, gpu_type, local_batch)
);
"""

#: schema changes after version 1, applied in order inside the opening transaction
#: (a new file gets SCHEMA, then every migration). Version 2 (the profiler):
#: profiles gain the memory cap and the number of measurements behind the EWMA,
#: profile_status says which (workload, GPU type) pairs were probed and whether
#: they are usable, report_offsets remembers how far each job report was read.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        "ALTER TABLE profiles ADD COLUMN max_local_batch INTEGER",
        "ALTER TABLE profiles ADD COLUMN samples INTEGER NOT NULL DEFAULT 1",
        """CREATE TABLE profile_status (
            workload TEXT NOT NULL,
            gpu_type TEXT NOT NULL,
            status TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT '',
            slurm_id TEXT,
            probe_s REAL,
            updated REAL NOT NULL,
            PRIMARY KEY (workload, gpu_type)
        )""",
        """CREATE TABLE report_offsets (
            path TEXT PRIMARY KEY,
            offset INTEGER NOT NULL,
            updated REAL NOT NULL
        )""",
    ),
    # Version 3: training history for the ``ones`` progress predictor.
    # One row per job run (its report file) and one per epoch it finished;
    # ``epochs`` is set when the run reported ``done``: a completed job, whose
    # progress after each epoch (k / epochs) trains the regression.
    3: (
        """CREATE TABLE progress_runs (
            run TEXT PRIMARY KEY,
            job TEXT NOT NULL,
            workload TEXT NOT NULL DEFAULT '',
            initial_loss REAL,
            epochs INTEGER,
            finished REAL
        )""",
        """CREATE TABLE progress_epochs (
            run TEXT NOT NULL REFERENCES progress_runs(run),
            epoch INTEGER NOT NULL,
            dataset_size REAL NOT NULL,
            loss REAL,
            updated REAL NOT NULL,
            PRIMARY KEY (run, epoch)
        )""",
    ),
}
