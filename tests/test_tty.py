"""Every command that can show progress, run as a user runs it: in a terminal.

Each test starts ``hetsched`` in a real subprocess whose stdin, stdout and
stderr are a pseudo-terminal (``os.openpty``) of a fixed size, so rich sees a
terminal and draws its live bars. The command must exit 0, print what it
prints piped, and never a traceback.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from hetsched.cli.progress import RichReporter

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def run_tty(args: list[str], cwd: Path, cols: int = 100, rows: int = 40,
            timeout_s: float = 240) -> tuple[int, str]:
    """Run ``hetsched ARGS`` with a pty of COLS x ROWS as its terminal; (rc, text without ANSI)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env.update(TERM="xterm-256color", PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-m", "hetsched", *args], cwd=cwd, env=env,
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = bytearray()
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the slave side has closed it
                break
            if not chunk:
                break
            out += chunk
        rc = proc.wait(timeout=timeout_s)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, ANSI.sub("", out.decode("utf-8", "replace"))


def example_args(examples: dict[str, Path]) -> list[str]:
    return [str(examples["jobs"]), "--cluster", str(examples["cluster"]),
            "--throughputs", str(examples["throughputs"])]


def assert_clean(rc: int, text: str) -> None:
    assert "Traceback" not in text, text
    assert rc == 0, text


def test_plan_auto_in_a_terminal(examples, tmp_path) -> None:
    rc, text = run_tty(["plan", *example_args(examples)], tmp_path)
    assert_clean(rc, text)
    assert "total weighted JCT" in text and "lower bound" in text
    assert "auto candidates" in text
    # the live bars went by: each candidate printed its one result line
    assert re.search(r"exhaustive: weighted JCT [\d,.]+ s", text), text


def test_plan_one_policy_verbose_in_a_terminal(examples, tmp_path) -> None:
    rc, text = run_tty(["-v", "plan", *example_args(examples), "--policy", "has"], tmp_path)
    assert_clean(rc, text)
    assert "total weighted JCT" in text


def test_plan_pool_in_a_terminal(examples, tmp_path) -> None:
    rc, text = run_tty(["plan", "--mode", "pool", *example_args(examples)], tmp_path)
    assert_clean(rc, text)
    assert "resnet18-cifar" in text and "idle" in text


def test_simulate_in_a_terminal(examples, tmp_path) -> None:
    rc, text = run_tty(["simulate", *example_args(examples)], tmp_path)
    assert_clean(rc, text)
    assert "policy opd online" in text and "weighted JCT" in text


def test_profile_dry_run_in_a_terminal(examples, tmp_path) -> None:
    rc, text = run_tty(["profile", "--dry-run", str(examples["jobs"]), "--cluster",
                        str(examples["cluster"]), "--state", str(tmp_path / "s.db")], tmp_path)
    assert_clean(rc, text)
    assert "#SBATCH" in text or "nothing to probe" in text, text


@pytest.mark.parametrize("total_first", [None, 6])
def test_reporter_draws_every_hook_on_a_terminal(total_first: int | None) -> None:
    """The hooks `profile` (probes) and the planners call, drawn on a terminal console.

    A candidate's task has no total until its first event; rich renders the
    bar on each refresh, so the columns must draw a task without a total.
    """
    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=100)
    with RichReporter(con) as rep:
        assert rep.live
        rep.probes(pending=2, running=1, done=0, total=3)
        rep.planning_started("space", "auto", ["has", "jps"])
        rep.candidate_started("has")
        if total_first is not None:
            rep.event("has", 0.0, 1, 0, total_first)
        assert rep.progress is not None
        rep.progress.refresh()  # renders every task now, total or not
        rep.event("has", 10.0, 1, 3, 6)
        rep.probes(pending=0, running=0, done=3, total=3)
        rep.progress.refresh()
        rep.candidate_done("has", 123.4, 0.5)
        rep.candidate_skipped("jps", "too many jobs")
    text = ANSI.sub("", buf.getvalue())
    assert "has: weighted JCT 123.4 s" in text
    assert "jps: skipped" in text
    assert "3/6 jobs" in text


def test_ctrl_c_in_a_terminal_exits_130_in_one_line(examples, tmp_path) -> None:
    """SIGINT while the live bars draw: the bars are taken down, the cursor is shown
    again, one line says so, exit 130 (the documented code; click alone said "Aborted!"
    and 1)."""
    import signal
    import time

    import yaml

    specs = yaml.safe_load(examples["jobs"].read_text())["jobs"]
    many = [{**specs[k % len(specs)], "name": f"j{k}", "arrival_s": 60 * k,
             "epochs": 1 + k % 5} for k in range(400)]
    jobs = tmp_path / "many.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": many}))
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env.update(TERM="xterm-256color")
    proc = subprocess.Popen([sys.executable, "-m", "hetsched", "plan", str(jobs),
                             *example_args(examples)[1:]], cwd=tmp_path, env=env,
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                            # a terminal's user: Ctrl-C not ignored, even where the tests
                            # run in the background (a shell's `&` ignores SIGINT)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    out = bytearray()
    try:
        deadline = time.monotonic() + 120
        while b"jobs" not in out and time.monotonic() < deadline:  # a bar is drawn
            out += os.read(master, 65536)
        proc.send_signal(signal.SIGINT)
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        rc = proc.wait(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    raw = out.decode("utf-8", "replace")
    text = ANSI.sub("", raw)
    assert rc == 130, text
    assert "Traceback" not in text and "Aborted" not in text, text
    assert text.rstrip().endswith("hetsched: interrupted"), text[-300:]
    assert "\x1b[?25h" in raw  # the cursor the bars hid is shown again
