"""A full disk or quota (a login node's home directory): every command says so in one
line, leaves the user's files and the state file as they were, and works again once
space is freed. On a real size-limited tmpfs where the machine allows the mount (root),
and on a file size limit (RLIMIT_FSIZE) everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PLAN_ARGS = [str(EXAMPLES / "jobs.yaml"), "--cluster", str(EXAMPLES / "cluster.yaml"),
             "--throughputs", str(EXAMPLES / "gavel_throughputs.csv"), "--policy", "fifo"]


def _hetsched(*args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HETSCHED_STATE_JOURNAL"}
    if state is not None:
        env["HETSCHED_STATE"] = str(state)
    return subprocess.run([sys.executable, "-m", "hetsched", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def _one_line(out: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code and len(lines) == 1, (out.returncode, out.stderr)
    assert all(w in lines[0] for w in words), lines[0]


def test_a_refused_write_keeps_the_users_file_whole(tmp_path: Path) -> None:
    """A file size limit makes the kernel refuse the write (EFBIG) part-way, as a full
    disk does: the previous plan file is left as it was and no temporary file stays."""
    out = tmp_path / "plan.json"
    out.write_text("the previous plan\n")
    code = ("import resource, sys\nfrom hetsched.io.files import write_user_file\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "write_user_file(sys.argv[1], 'x' * 100_000)\n")
    res = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode != 0 and "cannot write: File too large" in res.stderr, res.stderr
    assert out.read_text() == "the previous plan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted at tmp_path/disk (skipped where mounts are refused)."""
    d = tmp_path / "disk"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)],
            capture_output=True).returncode:
        pytest.skip("needs root and a tmpfs mount")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)  # lazy: also when busy


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_nothing_lost(disk: Path) -> None:
    state = disk / "state.db"
    csv = disk / "profiles.csv"
    csv.write_text("workload,gpu_type,local_batch,step_time_s\nmlp,v100,32,0.1\n")
    assert _hetsched("profiles", "import", str(csv), state=state).returncode == 0
    plan, png = disk / "plan.json", disk / "plan.png"
    plan.write_text("the previous plan\n")
    png.write_bytes(b"the previous picture")
    one = disk / "one.csv"
    one.write_text("workload,gpu_type,local_batch,step_time_s\nmlp,t4,32,0.3\n")
    filler = _fill(disk)

    for args in (("profiles", "import", str(one)), ("status",), ("state", "check"),
                 ("profiles", "list")):
        _one_line(_hetsched(*args, state=state), 8, "free some space", str(state))
    roomy = disk.parent / "roomy.db"  # a state file with room, backed up onto the full disk
    assert _hetsched("profiles", "import", str(csv), state=roomy).returncode == 0
    _one_line(_hetsched("state", "backup", "--to", str(disk / "b.db"), state=roomy), 8,
              "cannot write the backup", "back it up elsewhere")
    _one_line(_hetsched("plan", *PLAN_ARGS, "--out", str(plan)), 2, str(plan),
              "the file was left as it was")
    _one_line(_hetsched("plan", *PLAN_ARGS, "--gantt", str(png)), 2, str(png))
    new = disk / "new" / "state.db"
    _one_line(_hetsched("profiles", "import", str(csv), state=new), 8, "free some space")
    assert plan.read_text() == "the previous plan\n"
    assert png.read_bytes() == b"the previous picture"
    assert not new.exists()
    left = {p.name for p in disk.rglob("*")} - {"state.db-shm", "state.db-wal"}
    assert left == {"state.db", "state.db.bak", "profiles.csv", "one.csv", "plan.json",
                    "plan.png", "filler", "new"}, left

    filler.unlink()  # space again: the same commands work, nothing was lost
    listed = _hetsched("profiles", "list", state=state)
    assert listed.returncode == 0 and "mlp" in listed.stdout and "v100" in listed.stdout
    assert _hetsched("plan", *PLAN_ARGS, "--out", str(plan)).returncode == 0
    assert '"policy": "fifo"' in plan.read_text()


def test_a_full_disk_under_any_command_is_one_line() -> None:
    """The last net (cli/main.py): a job file, a plan copy or a script hetsched writes
    for itself on a full disk ends the command in one line, not a traceback."""
    import errno

    import click
    from click.testing import CliRunner

    from hetsched.cli.main import main

    @click.command("write-on-a-full-disk")
    def boom() -> None:
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/home/u/.state.files/x.sh")

    main.add_command(boom)
    try:
        res = CliRunner().invoke(main, ["write-on-a-full-disk"])
    finally:
        main.commands.pop("write-on-a-full-disk")
    assert res.exit_code == 1, res.output
    assert res.output.strip() == ("hetsched: error: cannot write /home/u/.state.files/x.sh: "
                                  "Disk quota exceeded (the disk or your quota is full); free "
                                  "some space and run again")
