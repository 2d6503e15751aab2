"""Job files where only the submitting machine can read them.

A user who keeps the state file in /tmp (or on a tmpfs) of a login node, say
to keep SQLite off NFS, had every job fail at start: the job's layout file
and plan copy are in the state file's folder, which the compute nodes do not
have, and its log was written on the compute node where `status` cannot read
it. Submit now says so first.
"""

from __future__ import annotations

import os
from pathlib import Path

from hetsched.app.runnable import host_local_files
from hetsched.slurm.client import NodeInfo


def _node(name: str, address: str) -> NodeInfo:
    return NodeInfo(name, "idle", {"a100": 1}, {}, address=address)


def test_files_in_tmp_with_remote_nodes_are_named(tmp_path: Path) -> None:
    files = Path("/tmp") / f"hetsched-test-{os.getpid()}" / "state.db.files"
    remote = [_node("gpu-01", "10.0.0.11"), _node("gpu-02", "gpu-02.cluster")]
    note = host_local_files(files, remote)
    assert note is not None and str(files) in note and "gpu-01, gpu-02" in note
    assert "HETSCHED_STATE" in note and ("under /tmp" in note or "a tmpfs" in note)


def test_nothing_to_say_where_the_nodes_are_this_machine_or_unknown(tmp_path: Path) -> None:
    files = Path("/tmp") / "x" / "state.db.files"
    assert host_local_files(files, [_node("a100-1", "127.0.0.1"),
                                    _node("a100-2", "localhost")]) is None  # the testbed
    assert host_local_files(files, [_node("gpu-01", "")]) is None  # address not said


def test_nothing_to_say_for_a_folder_outside_tmp_on_a_disk() -> None:
    import pytest

    from hetsched.app.runnable import HOST_LOCAL
    from hetsched.state.fs import filesystem_type

    home = Path.home()
    if filesystem_type(home) == "tmpfs" or os.path.realpath(home).startswith(HOST_LOCAL):
        pytest.skip("this machine's home directory is itself host-local")
    assert host_local_files(home / "state.db.files", [_node("gpu-01", "10.0.0.11")]) is None
