"""A real, loopback-only Slurm test cluster started and stopped by hetsched.

``up`` writes slurm.conf/gres.conf/cgroup.conf into ``DIR/etc``, starts a
private munged (its own key and socket in DIR), one slurmctld and one slurmd
per node (``slurmd -f CONF -N name``, all on 127.0.0.1 with ports derived from
DIR so two testbeds never collide), then waits until every node is idle.
GPUs are fake but typed: gres.conf ``File=`` points at symlinks named
``nvidiaN`` to ``/dev/null`` (slurmd needs a character device to set
``CUDA_VISIBLE_DEVICES``).

Size: one daemon manager; the config it writes and the processes it starts and
stops share every path, port and pid file, so they stay in one class.

``down`` stops exactly the daemons this testbed started, found by their pid
files and checked against ``/proc/PID/cmdline`` so a recycled pid is never
signalled. Nothing here builds a shell string.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hetsched.core.spec import GPU_TYPE_RE
from hetsched.errors import HetschedError, InputError, UnsafeFileError
from hetsched.io.files import check_private, private_dir
from hetsched.slurm.client import UNTYPED
from hetsched.slurm.runner import CommandError, Runner
from hetsched.slurm.templates import package_data

DEFAULT_NODES = "a100:2x2,v100:2x4,t4:1x4"
PARTITION = "gpu"
#: Unix socket paths are limited to 108 bytes; longer DIRs get their munge socket and
#: slurmd spool (each job step's socket: SPOOL/NODE/NODE_JOBID.STEPID) in /tmp.
MAX_SOCKET_PATH = 100
#: the longest "_JOBID.STEPID" a step socket's name ends in (Slurm's default MaxJobId;
#: the batch step's id), and the longest such path (108 bytes with its NUL)
STEP_SOCKET_TAIL = len("_67043328.4294967291")
MAX_STEP_SOCKET = 107
#: a character slurm.conf takes in a path as it is (no blank, '#', '%', quote or '=')
CONF_PATH_RE = re.compile(r"[A-Za-z0-9._/+@,:~-]")
NODE_SPEC_RE = re.compile(r"^([A-Za-z0-9_-]+):(\d+)x(\d+)$")


class TestbedError(HetschedError):
    """The testbed could not be started, or is in a state we cannot act on."""

    __test__ = False  # not a pytest test class despite the name
    exit_code = 5


@dataclass(frozen=True)
class NodeGroup:
    """``count`` nodes of one GPU type with ``gpus`` GPUs each."""

    gpu_type: str
    count: int
    gpus: int


@dataclass(frozen=True)
class NodeConf:
    name: str
    gpu_type: str
    gpus: int
    port: int


def parse_nodes(spec: str) -> list[NodeGroup]:
    """Parse ``a100:2x2,v100:2x4`` (type:nodes x gpus-per-node; type ``gpu``: GPUs
    with no GRES type, ``Gres=gpu:N``)."""
    groups: list[NodeGroup] = []
    seen: set[str] = set()
    for part in spec.split(","):
        part = part.strip()
        m = NODE_SPEC_RE.match(part)
        if not m:
            raise InputError("--nodes", f"bad group {part!r}; expected TYPE:NODESxGPUS, "
                             f"e.g. {DEFAULT_NODES}")
        gpu_type, count, gpus = m.group(1), int(m.group(2)), int(m.group(3))
        if not GPU_TYPE_RE.match(gpu_type):
            raise InputError("--nodes", f"bad GPU type {gpu_type!r}")
        if gpu_type.lower() in seen:  # hetsched's GPU types are case-insensitive
            raise InputError("--nodes", f"GPU type {gpu_type!r} is listed twice")
        if not 1 <= count <= 32 or not 1 <= gpus <= 16:
            raise InputError("--nodes", f"{part!r}: 1-32 nodes and 1-16 GPUs per node")
        seen.add(gpu_type.lower())
        groups.append(NodeGroup(gpu_type, count, gpus))
    if not groups:
        raise InputError("--nodes", f"no node groups; e.g. {DEFAULT_NODES}")
    return groups


def default_port_base(directory: Path) -> int:
    """A port block (100 ports) derived from DIR, inside 10000-29999."""
    return 10000 + (zlib.crc32(str(directory).encode()) % 200) * 100


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_base(start: int, ports: int) -> int:
    """The first 100-port block from ``start`` on whose first ``ports`` ports are free."""
    for k in range(200):
        base = 10000 + ((start - 10000) // 100 + k) % 200 * 100
        if all(_port_free(base + i) for i in range(ports)):
            return base
    return start  # all taken: up() reports the busy port


class Testbed:
    """A Slurm test cluster living in one directory."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, directory: str | Path, nodes: str = DEFAULT_NODES,
                 port_base: int | None = None, lua: bool = False,
                 lua_script: str | Path | None = None,
                 spank_plugin: str | Path | None = None) -> None:
        self.dir = Path(directory).expanduser().resolve()
        self.groups = parse_nodes(nodes)
        self.nodes_spec = ",".join(f"{g.gpu_type}:{g.count}x{g.gpus}" for g in self.groups)
        if port_base is None:
            # a testbed that exists keeps its ports; a new one takes the block
            # its DIR hashes to, or the next free one (two DIRs collide 1 in 200)
            saved = self._saved_config()
            saved_base = saved.get("port_base") if saved else None
            port_base = saved_base if isinstance(saved_base, int) else free_port_base(
                default_port_base(self.dir), 1 + sum(g.count for g in self.groups))
        self.port_base = port_base
        self.lua = lua
        self.lua_script = Path(lua_script) if lua_script else (
            package_data("plugins") / "job_submit.lua")
        self.spank_plugin = Path(spank_plugin).resolve() if spank_plugin else None
        self.etc = self.dir / "etc"
        self.run_dir = self.dir / "run"
        self.log_dir = self.dir / "log"
        self.conf = self.etc / "slurm.conf"
        self.munge_dir = self.dir / "munge"
        sock = self.munge_dir / "munge.socket"
        if len(str(sock)) > MAX_SOCKET_PATH:
            tag = f"{zlib.crc32(str(self.dir).encode()):08x}"
            sock = Path("/tmp") / f"hetsched-munge-{tag}" / "munge.socket"
        self.munge_socket = sock
        self.runner = Runner(env={"SLURM_CONF": str(self.conf)}, timeout_s=20, retries=0)

    # -- layout ----------------------------------------------------------
    @property
    def node_confs(self) -> list[NodeConf]:
        out: list[NodeConf] = []
        port = self.port_base + 1
        for g in self.groups:
            for i in range(1, g.count + 1):
                out.append(NodeConf(f"{g.gpu_type}-{i}", g.gpu_type, g.gpus, port))
                port += 1
        return out

    @property
    def slurmd_spool(self) -> Path:
        """The slurmd spool (one folder per node): in DIR, or in /tmp where a job step's
        socket there would pass the Unix socket limit. Every job failed to launch on a
        testbed in a deep directory ("Unix socket path ... is too long. (124 > 108)")."""
        spool = self.dir / "state" / "slurmd"
        longest = max((2 * len(n.name) for n in self.node_confs), default=0)
        if len(str(spool)) + 2 + longest + STEP_SOCKET_TAIL > MAX_STEP_SOCKET:
            spool = Path("/tmp") / f"hetsched-slurmd-{zlib.crc32(str(self.dir).encode()):08x}"
        return spool

    @property
    def state_db(self) -> Path:
        return self.dir / "state.db"

    @property
    def spool(self) -> Path:
        return self.dir / "spool"

    def env(self) -> dict[str, str]:
        """Variables that point Slurm's commands and hetsched at this testbed."""
        return {
            "SLURM_CONF": str(self.conf),
            "HETSCHED_STATE": str(self.state_db),
            "HETSCHED_SPOOL": str(self.spool),
            "HETSCHED_TESTBED": str(self.dir),
            "HETSCHED_PARTITION": PARTITION,
        }

    def env_lines(self) -> str:
        """``export K=V`` lines, quoted, safe for ``eval``."""
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env().items())

    # -- configuration -----------------------------------------------------
    def slurm_conf(self) -> str:
        d = self.dir
        host = socket.gethostname().split(".")[0]
        cluster = f"hs{zlib.crc32(str(d).encode()) % 100000:05d}"
        lines = [
            "# Written by `hetsched testbed up`; rewritten on every start.",
            f"ClusterName={cluster}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.port_base}",
            f"SlurmdPort={self.port_base + 1}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state/ctld",
            f"SlurmdSpoolDir={self.slurmd_spool}/%n",
            f"SlurmctldPidFile={self.run_dir}/slurmctld.pid",
            f"SlurmdPidFile={self.run_dir}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # no systemd / cgroup control on these machines (TESTBED.md)
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            # hetjobs start only via backfill; 1 s instead of the 30 s default
            "SchedulerParameters=bf_interval=1",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "ReturnToService=2",
            # keep finished jobs visible to `scontrol show job` for an hour
            "MinJobAge=3600",
            "KillWait=2",
            "SlurmdTimeout=60",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            "GresTypes=gpu",
            # fake nodes claim more CPUs than the host has
            "SlurmdParameters=config_overrides",
        ]
        if self.lua:
            lines.append("JobSubmitPlugins=lua")
        if self.spank_plugin:
            lines.append(f"PlugStackConfig={self.etc}/plugstack.conf")
        for n in self.node_confs:
            cpus = max(2, 2 * n.gpus)
            gres = f"gpu:{n.gpus}" if n.gpu_type == UNTYPED else f"gpu:{n.gpu_type}:{n.gpus}"
            lines.append(
                f"NodeName={n.name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={n.port} "
                f"CPUs={cpus} RealMemory={1024 * n.gpus} Gres={gres} "
                f"Feature={n.gpu_type} State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE "
                     "State=UP OverSubscribe=NO")
        return "\n".join(lines) + "\n"

    def gres_conf(self) -> str:
        lines = ["AutoDetect=off"]
        for n in self.node_confs:
            devdir = self.dir / "dev" / n.name
            last = n.gpus - 1
            files = f"{devdir}/nvidia0" if last == 0 else f"{devdir}/nvidia[0-{last}]"
            typed = "" if n.gpu_type == UNTYPED else f" Type={n.gpu_type}"
            lines.append(f"NodeName={n.name} Name=gpu{typed} File={files}")
        return "\n".join(lines) + "\n"

    def _own_outside(self, folder: Path) -> None:
        """A folder put in /tmp for a deep DIR (a name any local user can guess): made
        private, and refused unless it is a real folder of this user, never a link."""
        if folder.is_relative_to(self.dir):
            return
        why = "a link" if folder.is_symlink() else "not a folder" if folder.exists() and \
            not folder.is_dir() else None
        if why is None:  # io.files: created 0700; owner and mode as every private file's
            try:
                check_private(private_dir(folder), "testbed folder")
            except UnsafeFileError as e:
                why = e.message
        if why is not None:
            raise TestbedError(f"{folder} exists and is not a folder of this user's ({why}); "
                               "remove it, or use a shorter --dir")

    def _write_files(self) -> None:
        self._own_outside(self.munge_socket.parent)
        self._own_outside(self.slurmd_spool)
        for p in (self.etc, self.run_dir, self.log_dir, self.munge_dir,
                  self.munge_socket.parent, self.dir / "state" / "ctld", self.spool):
            p.mkdir(parents=True, exist_ok=True)
        os.chmod(self.munge_dir, 0o700)
        os.chmod(self.munge_socket.parent, 0o755)
        for n in self.node_confs:
            (self.slurmd_spool / n.name).mkdir(parents=True, exist_ok=True)
            devdir = self.dir / "dev" / n.name
            devdir.mkdir(parents=True, exist_ok=True)
            for i in range(n.gpus):
                link = devdir / f"nvidia{i}"
                if not link.is_symlink():
                    link.symlink_to("/dev/null")
        self.conf.write_text(self.slurm_conf())
        (self.etc / "gres.conf").write_text(self.gres_conf())
        # slurmd refuses CgroupPlugin=disabled in 22.05 (TESTBED.md)
        (self.etc / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        lua_dst = self.etc / "job_submit.lua"
        if self.lua:
            if not self.lua_script.is_file():
                raise TestbedError(f"--lua: {self.lua_script} not found")
            shutil.copyfile(self.lua_script, lua_dst)
            # the GPU types per partition that job_submit.lua checks requests against
            types = " ".join(sorted(g.gpu_type for g in self.groups))
            (self.etc / "hetsched_gpu_types.conf").write_text(f"{PARTITION} {types}\n")
        elif lua_dst.exists():
            lua_dst.unlink()
        if self.spank_plugin:
            if not self.spank_plugin.is_file():
                raise TestbedError(f"--spank: {self.spank_plugin} not found")
            (self.etc / "plugstack.conf").write_text(f"required {self.spank_plugin}\n")
        key = self.munge_dir / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
        (self.dir / "testbed.json").write_text(json.dumps(
            {"nodes": self.nodes_spec, "port_base": self.port_base, "lua": self.lua,
             "spank": str(self.spank_plugin or "")}) + "\n")

    # -- processes ---------------------------------------------------------
    def _pidfiles(self) -> dict[str, Path]:
        files = {"munged": self.run_dir / "munged.pid",
                 "slurmctld": self.run_dir / "slurmctld.pid"}
        for n in self.node_confs:
            files[f"slurmd:{n.name}"] = self.run_dir / f"slurmd-{n.name}.pid"
        return files

    def _alive(self, pidfile: Path, marker: str) -> int | None:
        """The pid in ``pidfile`` if that process runs and its cmdline contains ``marker``."""
        try:
            pid = int(pidfile.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            return None
        return pid if marker in cmdline else None

    def _marker(self, key: str) -> str:
        return str(self.munge_socket) if key == "munged" else str(self.conf)

    def processes(self) -> dict[str, int | None]:
        """Each daemon of this testbed and its pid (None when not running)."""
        return {k: self._alive(p, self._marker(k)) for k, p in self._pidfiles().items()}

    def is_up(self) -> bool:
        return all(pid is not None for pid in self.processes().values())

    def _start_munged(self) -> None:
        if self.processes()["munged"]:
            return
        self.runner.run([
            "munged", "--force", f"--socket={self.munge_socket}",
            f"--key-file={self.munge_dir / 'munge.key'}",
            f"--log-file={self.log_dir / 'munged.log'}",
            f"--pid-file={self.run_dir / 'munged.pid'}",
            f"--seed-file={self.munge_dir / 'munged.seed'}",
        ], output_path=self.log_dir / "launch.log")

    def start_controller(self, clear_state: bool = False) -> None:
        """Start slurmctld (no-op when it runs). ``clear_state`` drops saved jobs."""
        if self.processes()["slurmctld"]:
            return
        argv = ["slurmctld", "-f", str(self.conf)]
        if clear_state:
            argv.append("-c")
        self.runner.run(argv, output_path=self.log_dir / "launch.log")

    def stop_controller(self) -> None:
        """Stop slurmctld only (used to test that clients wait and resume)."""
        self._stop("slurmctld")

    def start_node(self, name: str) -> None:
        key = f"slurmd:{name}"
        if self.processes().get(key):
            return
        self.runner.run(["slurmd", "-f", str(self.conf), "-N", name],
                        output_path=self.log_dir / "launch.log")

    def stop_node(self, name: str) -> None:
        """Stop one node's slurmd (the node then goes down after SlurmdTimeout)."""
        self._stop(f"slurmd:{name}")

    def _stop(self, key: str, wait_s: float = 10.0) -> None:
        pidfile = self._pidfiles()[key]
        marker = self._marker(key)
        pid = self._alive(pidfile, marker)
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        # wait for the process itself: a daemon removes its pid file before it
        # exits, and a late unlink would delete a restarted daemon's pid file
        if not _wait_gone(pid, marker, wait_s):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, marker, 5.0)
        pidfile.unlink(missing_ok=True)

    def _stray_steps(self) -> list[int]:
        """slurmstepd processes of this testbed (they outlive a stopped slurmd), and
        their descendants (the job's tasks). Found by SLURM_CONF in their environment,
        which they inherit from the slurmd this testbed started."""
        want = f"SLURM_CONF={self.conf}".encode()
        parent: dict[int, int] = {}
        steps: list[int] = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                parent[int(d.name)] = ppid
                if "(slurmstepd)" in stat and want in (d / "environ").read_bytes().split(b"\0"):
                    steps.append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
        found = set(steps)
        changed = True
        while changed:  # descendants of those steps
            changed = False
            for pid, ppid in parent.items():
                if ppid in found and pid not in found:
                    found.add(pid)
                    changed = True
        return sorted(found)

    def up(self, timeout_s: float = 60.0,
           progress: Callable[[str], None] | None = None) -> None:
        """Start what is not running and wait until every node is idle (idempotent)."""
        say = progress or (lambda _m: None)
        if os.geteuid() != 0:  # slurmctld would stop at "Can not set uid to SlurmUser"
            raise TestbedError("the testbed runs slurmctld and slurmd as root (SlurmUser="
                               "root, as slurmd must be to start jobs): run it as root, e.g. "
                               "in a container or a VM")
        bad = next((c for c in str(self.dir) if not CONF_PATH_RE.match(c)), None)
        if bad is not None:  # slurm.conf splits at blanks, '#' comments, '%' expands
            raise InputError("--dir", f"{self.dir} holds {bad!r}, which slurm.conf cannot "
                             "take in a path; choose a directory of letters, digits and "
                             "._-+@,:~/")
        prev = self._saved_config()
        if prev and prev.get("nodes") != self.nodes_spec and any(self.processes().values()):
            raise TestbedError(
                f"testbed in {self.dir} runs with --nodes {prev.get('nodes')}; "
                f"run `hetsched testbed down --dir {self.dir}` first to change it")
        if prev and bool(prev.get("lua")) != self.lua and self.processes()["slurmctld"]:
            raise TestbedError(f"testbed in {self.dir} runs with lua={prev.get('lua')}; "
                               "run `hetsched testbed down` first to change it")
        for n in self.node_confs:
            self._check_port(n.port, f"slurmd {n.name}")
        self._check_port(self.port_base, "slurmctld")
        changed = prev is not None and prev.get("nodes") != self.nodes_spec
        self._write_files()
        try:
            self._start_munged()
            say("munged started")
            self.start_controller(clear_state=changed)
            say("slurmctld started")
            for n in self.node_confs:
                self.start_node(n.name)
            say(f"{len(self.node_confs)} slurmd started")
        except CommandError as e:
            raise TestbedError(f"could not start the testbed: {e}\n{self.log_tail()}") from None
        self.wait_idle(timeout_s)

    def _check_port(self, port: int, what: str) -> None:
        """Fail early with a clear message when another program holds our port."""
        if what == "slurmctld" and self.processes()["slurmctld"]:
            return
        if what.startswith("slurmd ") and self.processes().get(f"slurmd:{what[7:]}"):
            return
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                raise TestbedError(
                    f"port {port} for {what} is in use; pick another --port-base "
                    f"(this DIR derives {self.port_base})") from None

    def _saved_config(self) -> dict[str, object] | None:
        try:
            data = json.loads((self.dir / "testbed.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def node_states(self, timeout_s: float = 10.0) -> dict[str, str]:
        """Node name -> Slurm state (lower case, flags like ``*`` stripped)."""
        res = self.runner.run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %T"],
                              timeout_s=timeout_s)
        out: dict[str, str] = {}
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1].lower().rstrip("*~#!%$@^-")
        return out

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Wait until every node reports idle; on timeout quote the logs."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        last_err = ""
        while time.monotonic() < deadline:
            try:
                # sinfo itself retries ~10 s against a dead controller
                states = self.node_states(max(1.0, deadline - time.monotonic()))
                last_err = ""
            except CommandError as e:
                last_err = str(e)
            if states and len(states) == len(self.node_confs) and all(
                    s == "idle" for s in states.values()):
                return
            time.sleep(0.5)
        not_idle = {k: v for k, v in states.items() if v != "idle"} or "no answer"
        raise TestbedError(
            f"testbed nodes not idle after {timeout_s:g} s: {not_idle}"
            f"{'; ' + last_err if last_err else ''}\n{self.log_tail()}")

    def log_tail(self, lines: int = 8) -> str:
        """The last lines of slurmctld's and the slurmd logs, for error messages."""
        parts = []
        logs = [self.log_dir / "slurmctld.log", self.log_dir / "launch.log"]
        logs += [self.log_dir / f"slurmd-{n.name}.log" for n in self.node_confs[:2]]
        for p in logs:
            try:
                tail = p.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {p}:\n" + "\n".join(tail))
        return "\n".join(parts)

    def down(self, cancel_jobs: bool = True) -> list[str]:
        """Cancel remaining jobs, stop every daemon of this testbed. Returns what stopped."""
        procs = self.processes()
        if cancel_jobs and procs.get("slurmctld"):
            try:
                self.runner.run(["scancel", "--partition", PARTITION, "--full"], timeout_s=10,
                                check=False)
                # let slurmstepd reap the job processes before slurmd goes away
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    res = self.runner.run(["squeue", "-h", "-t", "R,CG", "-o", "%i"],
                                          check=False, timeout_s=5)
                    if res.returncode != 0 or not res.stdout.strip():
                        break
                    time.sleep(0.3)
            except CommandError:
                pass
        stopped = []
        order = [k for k in procs if k.startswith("slurmd:")] + ["slurmctld", "munged"]
        for key in order:
            if procs.get(key):
                self._stop(key)
                stopped.append(key)
        strays = self._stray_steps()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in strays:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            if sig == signal.SIGTERM and strays:
                time.sleep(0.5)
        if strays:
            stopped.append(f"{len(strays)} job step processes")
        left = self.processes()
        # the spool and munge socket put in /tmp for a deep DIR: nothing of them is kept
        if not self.slurmd_spool.is_relative_to(self.dir) and not left.get("slurmctld"):
            shutil.rmtree(self.slurmd_spool, ignore_errors=True)
        sock_dir = self.munge_socket.parent
        if not sock_dir.is_relative_to(self.dir) and not left.get("munged"):
            shutil.rmtree(sock_dir, ignore_errors=True)
        return stopped

    def status(self) -> dict[str, object]:
        """Daemons with pids, and node states when slurmctld answers."""
        procs = self.processes()
        info: dict[str, object] = {"dir": str(self.dir), "nodes": self.nodes_spec,
                                   "port_base": self.port_base, "processes": procs,
                                   "up": all(procs.values())}
        if procs.get("slurmctld"):
            try:
                info["node_states"] = self.node_states()
            except CommandError as e:
                info["node_states"] = str(e)
        return info


def _wait_gone(pid: int, marker: str, wait_s: float) -> bool:
    """Wait until ``pid`` no longer runs a command containing ``marker``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return True
        if marker not in cmd or not cmd:  # exited (zombie: empty cmdline) or pid reused
            return True
        time.sleep(0.1)
    return False


def open_testbed(directory: str | Path, nodes: str | None = None,
                 port_base: int | None = None, lua: bool | None = None,
                 spank: str | None = None) -> Testbed:
    """A Testbed for DIR; unspecified options come from the DIR's saved config."""
    d = Path(directory).expanduser().resolve()
    saved: dict[str, object] = {}
    try:
        raw = json.loads((d / "testbed.json").read_text())
        saved = raw if isinstance(raw, dict) else {}
    except (OSError, ValueError):
        pass
    saved_port = saved.get("port_base")
    return Testbed(
        d, nodes=nodes or str(saved.get("nodes") or DEFAULT_NODES),
        port_base=port_base if port_base is not None else (
            saved_port if isinstance(saved_port, int) else None),
        lua=lua if lua is not None else bool(saved.get("lua", False)),
        spank_plugin=spank if spank is not None else (str(saved.get("spank") or "") or None),
    )
