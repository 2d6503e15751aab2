"""hetsched's state: one SQLite file (plans, submissions, events, replans, profiles).

Why SQLite: cron-driven replans, ``watch`` and ``submit`` may run at the same
time; SQLite's transactions (WAL mode, ``BEGIN IMMEDIATE``, a busy timeout)
keep the file consistent when any of them is killed mid-write, and it needs
no server.

Safety rules:

* the file is created with mode 0600 (it holds job commands);
* a file that is not a hetsched state file, is corrupted, or has a *newer*
  schema than this code reads is refused with a clear error and left
  untouched: nothing is written before the checks pass (even switching to WAL
  mode writes the header, so that comes after them);
* every multi-row change happens in one transaction.

The schema and its migrations are in schema.py.

Size: one class with a short method per read or write of each table; split by
table, a use case's transaction would span modules.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsched import config
from hetsched.errors import EXIT_STATE_CORRUPT, HetschedError
from hetsched.state import guard
from hetsched.state.schema import APPLICATION, MIGRATIONS, SCHEMA, SCHEMA_VERSION

_log = logging.getLogger(__name__)

#: submission states hetsched sets itself (Slurm's own states are stored as Slurm spells them)
SUBMITTING = "SUBMITTING"  # row written, sbatch not yet answered
SUBMIT_FAILED = "SUBMIT_FAILED"
SUPERSEDED = "SUPERSEDED"  # cancelled by hetsched because a newer plan replaced it
GONE = "GONE"  # Slurm forgot the job and hetsched never saw it finish
CANCELLED = "CANCELLED"  # Slurm's word; for hetsched a user's cancel: final, never resubmitted
GAVE_UP = "GAVE_UP"  # failed more than --max-failures times: replan stopped resubmitting it


class StoreError(HetschedError):
    """The state file cannot be used; the message says why and what to do."""

    exit_code = EXIT_STATE_CORRUPT


def default_path() -> Path:
    """The configured state file (:func:`hetsched.config.state_path`)."""
    return config.state_path()


@dataclass(frozen=True)
class Submission:
    """One (plan, job, segment) handed to Slurm."""

    id: int
    plan_id: str
    job: str
    segment: int
    slurm_id: str | None
    state: str
    script_hash: str
    script_path: str
    workers: list[dict[str, Any]]
    created: float
    updated: float


def _submission(row: sqlite3.Row) -> Submission:
    return Submission(row["id"], row["plan_id"], row["job"], row["segment"], row["slurm_id"],
                      row["state"], row["script_hash"], row["script_path"],
                      json.loads(row["workers"] or "[]"), row["created"], row["updated"])


class Store:
    """An open state file. Use :func:`open_store`; close with ``close()`` or ``with``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.conn = self._open()

    # -- opening and checks ------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        p = self.path
        self.journal, self.journal_reason = _journal(p)
        _check_locks(p)  # before SQLite waits out its busy timeout on refused locks
        if not p.exists():
            self._create(p)  # filled first, then linked in place: never seen empty
        guard.preflight(p)  # empty, read-only, unreadable: refused before SQLite writes
        try:
            conn = sqlite3.connect(str(p), timeout=30.0, isolation_level=None)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open state file {p}: {e}") from None
        conn.row_factory = sqlite3.Row
        try:
            self._check(conn, p)
            self._configure(conn, self.journal)
            self._init_schema(conn)
        except sqlite3.DatabaseError as e:
            conn.close()
            full = _no_space(p, e)
            if full is not None:
                raise full from None
            raise StoreError(
                f"state file {p} is corrupted or not a SQLite file ({e}); it was left "
                f"untouched: {guard.restore_hint(p)}") from None
        except BaseException:
            conn.close()
            raise
        self._changes_at_open = conn.total_changes
        return conn

    @staticmethod
    def _configure(conn: sqlite3.Connection, journal: str) -> None:
        """Busy timeout, the journal (fs.py: WAL on a local file system, a rollback
        journal on a network one), full fsync, foreign keys."""
        conn.execute("PRAGMA busy_timeout = 30000")
        try:
            got = conn.execute(f"PRAGMA journal_mode = {'WAL' if journal == 'wal' else 'DELETE'}"
                               ).fetchone()[0]
        except sqlite3.OperationalError as e:  # a switch needs the file to itself
            if "locked" not in str(e):
                raise
            got = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if str(got).lower() != journal:
            _log.warning("the state file stays in %s mode for now: another hetsched process "
                         "has it open; it switches to %s when opened alone", got, journal)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")

    @classmethod
    def _create(cls, p: Path) -> None:
        """A new state file with its schema, put in place atomically (0600)."""
        tmp = guard.create_atomically(p)
        try:
            conn = sqlite3.connect(str(tmp), timeout=30.0, isolation_level=None)
            try:  # one self-contained file (no -wal beside it); the first open sets the journal
                cls._configure(conn, "delete")
                cls._init_schema(conn)
            finally:
                conn.close()
            guard.publish(tmp, p)
        except sqlite3.Error as e:
            full = _no_space(p, e)
            raise (full or StoreError(f"cannot create state file {p}: {e}; nothing was "
                                      "created")) from None
        finally:
            for leftover in (tmp, *(Path(f"{tmp}{s}") for s in ("-journal", "-wal", "-shm"))):
                leftover.unlink(missing_ok=True)

    @staticmethod
    def _check(conn: sqlite3.Connection, p: Path) -> None:
        """Refuse foreign, corrupted or newer files before anything is written."""
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return  # new, empty database
        if "meta" not in tables:
            raise StoreError(f"{p} is a SQLite file but not a hetsched state file (no 'meta' "
                             "table); it was left untouched. Point HETSCHED_STATE elsewhere.")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("application") != APPLICATION:
            raise StoreError(f"{p} is not a hetsched state file (application="
                             f"{meta.get('application')!r}); it was left untouched")
        try:
            version = int(meta.get("schema_version", "0"))
        except ValueError:
            version = -1
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"state file {p} has schema version {version}, written by a newer hetsched; "
                f"this one reads up to {SCHEMA_VERSION}. Upgrade hetsched; the file was left "
                "untouched.")
        if version < 1:
            raise StoreError(f"state file {p} has an invalid schema version "
                             f"{meta.get('schema_version')!r}; it was left untouched")
        guard.check_tables(p, tables, guard.expected_tables(SCHEMA, [
            stmt for v in range(2, version + 1) for stmt in MIGRATIONS.get(v, ())]), version)
        bad = conn.execute("PRAGMA quick_check").fetchone()[0]
        if bad != "ok":
            raise StoreError(f"state file {p} failed SQLite's integrity check ({bad}); it "
                             f"was left untouched: {guard.restore_hint(p)}")

    @staticmethod
    def _init_schema(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            has_meta = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
            if not has_meta:
                # statement by statement: executescript() would COMMIT first
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [
                    ("application", APPLICATION), ("schema_version", "1"),
                    ("created", repr(time.time()))])
            version = int(conn.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])
            # _check refused newer and invalid versions before anything was written
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for stmt in MIGRATIONS[v]:
                    conn.execute(stmt)
                conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(v),))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # SQLite may have rolled back itself (disk full)
                conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close; when this connection changed the store, refresh its backup first."""
        try:
            if self.conn.total_changes > self._changes_at_open and not self.conn.in_transaction:
                self.backup()
        except (OSError, sqlite3.Error):
            pass  # a failed backup never fails the command that did the work
        finally:
            self.conn.close()

    def backup(self, dest: str | Path | None = None) -> Path:
        """Copy the store with SQLite's backup API (default ``<state>.bak``)."""
        out = Path(dest) if dest else guard.backup_path(self.path)
        try:
            return guard.write_backup(self.conn, out)
        except sqlite3.Error as e:  # the copy is written whole or not at all (guard.py)
            full = _no_space(out, e, "write the backup", "back it up elsewhere (--to)")
            raise (full or StoreError(f"cannot back up {self.path} to {out}: {e}")) from None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it lands, or none of it (also on a crash)."""
        if self.conn.in_transaction:  # nested use joins the outer transaction
            yield self.conn
            return
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:  # SQLite may have rolled back itself (disk full)
                    self.conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as e:
            full = _no_space(self.path, e)
            if full is None:
                raise
            raise full from None

    @property
    def schema_version(self) -> int:
        return int(self.conn.execute(
            "SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])

    # -- plans -------------------------------------------------------------
    def add_plan(self, plan: Mapping[str, Any], source: str = "", active: bool = True) -> str:
        """Store a plan (idempotent on its id); make it the active one."""
        pid = str(plan["plan_id"])
        body = json.dumps(plan, sort_keys=True)
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO plans (id, created, policy, source, body) "
                      "VALUES (?, ?, ?, ?, ?)",
                      (pid, time.time(), str(plan.get("policy", "")), source, body))
            if active:
                c.execute("UPDATE plans SET active = (id = ?)", (pid,))
        return pid

    def plan(self, plan_id: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT body FROM plans WHERE id = ?", (plan_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def active_plan(self) -> dict[str, Any] | None:
        """The plan Slurm is being kept in line with (the latest submitted/replanned)."""
        row = self.conn.execute("SELECT body FROM plans WHERE active = 1 "
                                "ORDER BY created DESC LIMIT 1").fetchone()
        return json.loads(row[0]) if row else None

    def plans(self) -> list[dict[str, Any]]:
        rows = self.conn.execute("SELECT id, created, policy, source, active FROM plans "
                                 "ORDER BY created").fetchall()
        return [dict(r) for r in rows]

    # -- submissions -------------------------------------------------------
    def submission(self, plan_id: str, job: str, segment: int) -> Submission | None:
        row = self.conn.execute(
            "SELECT * FROM submissions WHERE plan_id = ? AND job = ? AND segment = ?",
            (plan_id, job, segment)).fetchone()
        return _submission(row) if row else None

    def begin_submission(self, plan_id: str, job: str, segment: int, script_hash: str,
                         script_path: str, workers: list[dict[str, Any]]) -> Submission:
        """Record the intent to submit *before* calling sbatch (crash-safe ordering)."""
        now = time.time()
        with self.tx() as c:
            c.execute(
                "INSERT INTO submissions (plan_id, job, segment, state, script_hash, "
                "script_path, workers, created, updated) VALUES (?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (plan_id, job, segment) DO UPDATE SET state = excluded.state, "
                "slurm_id = NULL, script_hash = excluded.script_hash, "
                "script_path = excluded.script_path, workers = excluded.workers, updated = excluded.updated",
                (plan_id, job, segment, SUBMITTING, script_hash, script_path,
                 json.dumps(workers), now, now))
        sub = self.submission(plan_id, job, segment)
        assert sub is not None
        return sub

    def set_submitted(self, sub_id: int, slurm_id: str, state: str = "PENDING") -> None:
        with self.tx() as c:
            c.execute("UPDATE submissions SET slurm_id = ?, state = ?, updated = ? WHERE id = ?",
                      (slurm_id, state, time.time(), sub_id))

    def set_state(self, sub_id: int, state: str) -> None:
        with self.tx() as c:
            c.execute("UPDATE submissions SET state = ?, updated = ? WHERE id = ?",
                      (state, time.time(), sub_id))

    def delete_submission(self, sub_id: int) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM submissions WHERE id = ?", (sub_id,))

    def submissions(self, plan_id: str | None = None, job: str | None = None
                    ) -> list[Submission]:
        q, args = "SELECT * FROM submissions WHERE 1=1", []
        if plan_id is not None:
            q += " AND plan_id = ?"
            args.append(plan_id)
        if job is not None:
            q += " AND job = ?"
            args.append(job)
        return [_submission(r) for r in self.conn.execute(q + " ORDER BY id", args)]

    # -- events --------------------------------------------------------------
    def add_event(self, kind: str, *, job: str | None = None, node: str | None = None,
                  slurm_id: str | None = None, detail: str = "", handled: bool = False) -> int:
        """Record an event; ``handled`` ones are for the record only (not reset events)."""
        with self.tx() as c:
            cur = c.execute("INSERT INTO events (at, kind, job, node, slurm_id, detail, "
                            "handled) VALUES (?,?,?,?,?,?,?)",
                            (time.time(), kind, job, node, slurm_id, detail, int(handled)))
        return int(cur.lastrowid or 0)

    def events(self, unhandled_only: bool = False, limit: int = 1000) -> list[dict[str, Any]]:
        q = "SELECT * FROM events"
        if unhandled_only:
            q += " WHERE handled = 0"
        q += " ORDER BY id DESC LIMIT ?"
        return [dict(r) for r in reversed(self.conn.execute(q, (limit,)).fetchall())]

    def has_event(self, kind: str, job: str | None, slurm_id: str | None) -> bool:
        """Whether an event of ``kind`` for this job and Slurm id was ever recorded."""
        return self.event_count(kind, job, slurm_id) > 0

    def event_count(self, kind: str, job: str | None, slurm_id: str | None) -> int:
        """How many events of ``kind`` were recorded for this job and Slurm id."""
        return int(self.conn.execute(
            "SELECT COUNT(*) FROM events WHERE kind = ? AND job IS ? AND slurm_id IS ?",
            (kind, job, slurm_id)).fetchone()[0])

    def mark_handled(self, event_ids: list[int]) -> None:
        if not event_ids:
            return
        with self.tx() as c:
            c.executemany("UPDATE events SET handled = 1 WHERE id = ?",
                          [(i,) for i in event_ids])

    # -- replans -------------------------------------------------------------
    def begin_replan(self, reason: str, old_plan: str | None) -> int:
        with self.tx() as c:
            cur = c.execute("INSERT INTO replans (started, old_plan, reason) VALUES (?,?,?)",
                            (time.time(), old_plan, reason))
        return int(cur.lastrowid or 0)

    def finish_replan(self, replan_id: int, status: str, new_plan: str | None = None,
                      cancelled: list[str] | None = None,
                      submitted: list[str] | None = None) -> None:
        with self.tx() as c:
            c.execute("UPDATE replans SET finished = ?, status = ?, new_plan = ?, "
                      "cancelled = ?, submitted = ? WHERE id = ?",
                      (time.time(), status, new_plan, json.dumps(cancelled or []),
                       json.dumps(submitted or []), replan_id))

    def replans(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM replans ORDER BY id")]

    # -- monitor snapshots ---------------------------------------------------
    def node_snapshot(self) -> dict[str, dict[str, Any]]:
        return {r["node"]: dict(r) for r in self.conn.execute("SELECT * FROM node_states")}

    def put_node_snapshot(self, nodes: list[tuple[str, str, str, int]]) -> None:
        """Replace the last-seen node states: (node, state, gpu_type, gpus)."""
        now = time.time()
        with self.tx() as c:
            c.execute("DELETE FROM node_states")
            c.executemany("INSERT INTO node_states VALUES (?,?,?,?,?)",
                          [(n, s, t, g, now) for n, s, t, g in nodes])

    def spool_seen(self) -> dict[str, str]:
        return {r[0]: r[1] for r in self.conn.execute("SELECT path, sha FROM spool_seen")}

    def mark_spool_seen(self, path: str, sha: str) -> None:
        with self.tx() as c:
            c.execute("INSERT OR REPLACE INTO spool_seen VALUES (?,?,?)", (path, sha, time.time()))

    def forget_spool_seen(self, paths: Iterable[str]) -> None:
        """Drop the marks of files gone from the spool: a file put there again later, even
        the same one, is new (a second batch of the same jobs file)."""
        with self.tx() as c:
            c.executemany("DELETE FROM spool_seen WHERE path = ?", [(p,) for p in paths])

    # -- profiles (filled by the profiler) -------------------------------------
    def put_profile(self, workload: str, gpu_type: str, local_batch: int, step_time_s: float,
                    sync_time_s: float | None = None, source: str = "",
                    max_local_batch: int | None = None, samples: int = 1) -> None:
        with self.tx() as c:
            c.execute("INSERT OR REPLACE INTO profiles (workload, gpu_type, local_batch, "
                      "step_time_s, sync_time_s, source, updated, max_local_batch, samples) "
                      "VALUES (?,?,?,?,?,?,?,?,?)",
                      (workload, gpu_type, local_batch, step_time_s, sync_time_s, source,
                       time.time(), max_local_batch, samples))

    def profiles(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute(
            "SELECT * FROM profiles ORDER BY workload, gpu_type, local_batch")]


def _no_space(p: Path, e: sqlite3.Error, what: str = "use the state file",
              elsewhere: str = "set HETSCHED_STATE to a file elsewhere"
              ) -> guard.StateAccessError | None:
    """The error to raise when SQLite failed because the disk or quota is full (fs.py),
    else None: the caller's own error stands."""
    from hetsched.state.fs import space_problem

    full = "database or disk is full" in str(e)  # SQLITE_FULL says so itself
    why = "No space left on device" if full else space_problem(p.parent)
    if why is None:
        return None
    return guard.StateAccessError(
        f"cannot {what} {p} ({e}): {why} in {p.parent}; nothing was changed: free some "
        f"space (the disk or your quota is full), or {elsewhere}")


def _check_locks(p: Path) -> None:
    """Refuse, in one line, a state file whose file system refuses POSIX locks (fs.py)."""
    from hetsched.state.fs import lock_problem

    why = lock_problem(p.parent)
    if why is not None:
        raise no_locks(p, why)


def no_locks(p: Path, why: str) -> guard.StateAccessError:
    """The error for a state file (or its replan lock) on a file system without locks."""
    from hetsched.state.fs import filesystem_type

    return guard.StateAccessError(
        f"cannot lock {p} ({why}); nothing was changed: the file system there "
        f"({filesystem_type(p) or 'unknown'}) refuses file locks (NFS without its lock "
        "daemon, Lustre without the flock mount option); set HETSCHED_STATE to a file on "
        "one that has them")


def _journal(p: Path) -> tuple[str, str]:
    """The journal the state file at ``p`` gets, and why (fs.py; the ``state_journal``
    setting overrides it)."""
    from hetsched.state.fs import journal_mode

    return journal_mode(p, str(config.get("state_journal")))


def open_store_readonly(path: str | Path | None = None) -> Store | None:
    """Open the state file for reading only (``status``); None when there is none.

    Nothing is created or written: no file, no schema, no WAL switch. A file
    hetsched cannot read is refused with the same checks as :class:`Store`.
    """
    p = Path(path if path is not None else default_path())
    if not p.exists() and not p.is_symlink():  # a dangling link is refused by preflight
        return None
    try:
        guard.preflight(p)  # empty, unreadable: the same clear refusals as for writers
    except guard.StateReadOnly:
        pass  # reading is all status needs
    _check_locks(p)  # a reader takes shared locks too
    store = Store.__new__(Store)
    store.path = p
    try:
        # on a read-only mount nothing can change it, and SQLite could not make the WAL
        # index it wants beside it: read it as immutable (no locks, no -shm)
        frozen = "&immutable=1" if guard.read_only_mount(p) else ""
        conn = sqlite3.connect(guard.sqlite_uri(p, f"mode=ro{frozen}"), uri=True, timeout=30.0,
                               isolation_level=None)
        conn.row_factory = sqlite3.Row
        Store._check(conn, p)
    except sqlite3.DatabaseError as e:
        full = _no_space(p, e)
        if full is not None:
            raise full from None
        raise StoreError(f"state file {p} is corrupted or not a SQLite file ({e}); it was "
                         f"left untouched: {guard.restore_hint(p)}") from None
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
        conn.close()
        return None  # a database with no tables: nothing was ever recorded
    store.conn = conn
    store._changes_at_open = conn.total_changes  # never changes: close() backs up nothing
    return store


def open_store(path: str | Path | None = None) -> Store:
    """Open (creating if needed) the state file at ``path`` or :func:`default_path`."""
    return Store(path if path is not None else default_path())
