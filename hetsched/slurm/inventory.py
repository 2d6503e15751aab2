"""A Slurm partition as a :class:`hetsched.core.spec.Cluster`.

Nodes keep their Slurm state (idle, mixed, allocated, drained, draining,
down, ...), so ``Cluster.gpus`` counts only usable nodes. Free GPUs per node
(configured minus allocated gres) are kept beside the Cluster for display and
for replanning around running work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hetsched.core.spec import GPU_TYPE_RE, NAME_RE, Cluster, Node
from hetsched.errors import HetschedError
from hetsched.slurm.client import NodeInfo, SlurmClient, type_names


class InventoryError(HetschedError):
    """The partition cannot be turned into a cluster (no GPU nodes, unknown name)."""

    exit_code = 2


@dataclass
class TypeRow:
    """Totals for one GPU type of a partition."""

    gpu_type: str
    nodes: int = 0
    gpus: int = 0
    usable: int = 0
    free: int = 0
    states: dict[str, int] = field(default_factory=dict)


@dataclass
class Inventory:
    """A partition: the planner's Cluster plus what only Slurm knows (free GPUs)."""

    cluster: Cluster
    free: dict[str, int] = field(default_factory=dict)  # node -> free GPUs
    skipped: list[str] = field(default_factory=list)  # why some nodes were left out
    #: GPU type -> as Slurm spells it (GRES types are case-sensitive; hetsched's are lower)
    gres_names: dict[str, str] = field(default_factory=dict)

    def by_type(self) -> list[TypeRow]:
        """One row per GPU type: nodes, GPUs, usable GPUs, free GPUs, node states."""
        rows: dict[str, TypeRow] = {}
        for n in self.cluster.nodes:
            r = rows.setdefault(n.gpu_type, TypeRow(n.gpu_type))
            r.nodes += 1
            r.gpus += n.gpus
            if n.usable:
                r.usable += n.gpus
                r.free += self.free.get(n.name, 0)
            r.states[n.state] = r.states.get(n.state, 0) + 1
        return [rows[t] for t in sorted(rows)]

    def to_dict(self) -> dict[str, object]:
        d = self.cluster.to_dict()
        d["free_gpus"] = dict(self.free)
        d["by_type"] = [asdict(r) for r in self.by_type()]
        if self.skipped:
            d["skipped"] = list(self.skipped)
        return d


def from_nodes(infos: list[NodeInfo], partition: str | None = None,
               name: str = "slurm") -> Inventory:
    """Build the Inventory from sinfo records (pure; tested without Slurm)."""
    nodes: list[Node] = []
    free: dict[str, int] = {}
    skipped: list[str] = []
    for info in sorted(infos, key=lambda n: n.name):
        if not info.gres:
            skipped.append(f"{info.name}: no GPUs")
            continue
        if not NAME_RE.match(info.name):
            skipped.append(f"{info.name}: node name not usable in a plan")
            continue
        # a node has one GPU type in hetsched's model; take the largest group
        gpu_type, count = max(info.gres.items(), key=lambda kv: (kv[1], kv[0]))
        if len(info.gres) > 1:
            skipped.append(f"{info.name}: mixed GPU types {info.gres}; only {gpu_type} used")
        if not GPU_TYPE_RE.match(gpu_type):
            skipped.append(f"{info.name}: GPU type {gpu_type!r} not usable")
            continue
        nodes.append(Node(name=info.name, gpu_type=gpu_type, gpus=count, state=info.state))
        free[info.name] = info.free_gpus.get(gpu_type, 0)
    if not nodes:
        where = f"partition {partition!r}" if partition else "the cluster"
        raise InventoryError(f"{where} has no GPU nodes (sinfo showed {len(infos)} nodes)")
    cluster = Cluster(nodes=tuple(nodes), name=name, partition=partition)
    return Inventory(cluster, free, skipped, type_names(infos))


def load_inventory(client: SlurmClient, partition: str | None = None) -> Inventory:
    """Query Slurm (one ``sinfo --json``) and build the partition's Inventory."""
    infos = client.nodes(partition)
    if partition and not infos:
        raise InventoryError(f"partition {partition!r} has no nodes or does not exist "
                             "(see `sinfo -s` for the partitions)")
    return from_nodes(infos, partition, name=partition or "slurm")


def load_cluster_from_slurm(client: SlurmClient, partition: str | None = None) -> Cluster:
    """The planner's Cluster for ``partition``: what `plan` uses when no file is given."""
    return load_inventory(client, partition).cluster
