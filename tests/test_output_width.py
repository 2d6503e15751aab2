"""Lines are never cut for no reason.

Piped (a file, a pipe, CI), output has no width: a table is as wide as its
content, a name is whole on its line, a stderr note is one line. In a
terminal, tables fold their other columns before they split a job's name.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from rich.console import Console
from test_tty import REPO, run_tty

from hetsched import config
from hetsched.cli.progress import RichReporter

LONG = ["a-rather-long-job-name-for-resnet", "another-long-name-for-the-transformer",
        "lm", "recsys-with-a-name-longer-than-usual", "x" * 12, "resnet18-arriving-late"]


def long_names_jobs(examples: dict[str, Path], tmp_path: Path) -> Path:
    doc = yaml.safe_load(examples["jobs"].read_text())
    for job, name in zip(doc["jobs"], LONG, strict=True):
        job["name"] = name
    p = tmp_path / "jobs.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def piped(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "hetsched", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240, check=False)


def test_piped_plan_keeps_every_line_whole(examples, tmp_path) -> None:
    jobs = long_names_jobs(examples, tmp_path)
    res = piped(["plan", str(jobs), "--cluster", str(examples["cluster"]), "--throughputs",
                 str(examples["throughputs"])], tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for name in LONG:  # the whole name on one table row
        assert any(f" {name} " in line for line in lines), name
    cand = [line for line in lines if "auto candidates" in line]
    assert len(cand) == 1 and cand[0].rstrip().endswith("x"), cand  # one line, all of them
    following = lines[lines.index(cand[0]) + 1]
    assert "x," not in following  # nothing of it wrapped onto the next line
    assert all(line == line.rstrip() for line in lines)  # no padding to a made-up width


def test_piped_config_show_cuts_no_setting(tmp_path) -> None:
    res = piped(["config", "show"], tmp_path)
    assert res.returncode == 0, res.stderr
    for r in config.show():
        assert any(f" {r['key']} " in line and r["env"] in line
                   for line in res.stdout.splitlines()), r["key"]


def test_piped_stderr_note_is_one_line() -> None:
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=False, width=80)
    note = "a note that is much longer than eighty columns " * 3
    with RichReporter(con) as rep:
        assert not rep.live
        rep.note(note.strip())
        rep.candidate_skipped("exhaustive", "too many jobs for an exhaustive search " * 3)
    out = buf.getvalue().splitlines()
    assert len(out) == 2 and note.strip() in out[0], out


def test_terminal_table_folds_columns_before_names(examples, tmp_path) -> None:
    """100 columns keep 37-character names whole; 80 keep the examples' names whole."""
    long_jobs = long_names_jobs(examples, tmp_path)
    example_names = [j["name"] for j in yaml.safe_load(examples["jobs"].read_text())["jobs"]]
    for jobs, names, cols in ((long_jobs, LONG, 100), (examples["jobs"], example_names, 80)):
        rc, text = run_tty(["-q", "plan", str(jobs), "--cluster", str(examples["cluster"]),
                            "--throughputs", str(examples["throughputs"]), "--no-gantt"],
                           tmp_path, cols=cols)
        assert rc == 0, text
        lines = text.splitlines()
        for name in names:
            assert any(f"{name} " in line for line in lines), (cols, name, text)
        assert max(len(line.rstrip()) for line in lines) <= cols
        # the lists folded instead: a GPU list went on on the next line
        assert any(re.match(r"\s+[a-z0-9]+-\d+:\d+", line) for line in lines), text
