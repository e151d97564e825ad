"""`partita export --to slurm`: a bash batch script for `sbatch` (partita.export's docstring says what it runs)."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from partita.costmodel.fields import flag
from partita.planner.plan import Plan, one_line
from partita.export.common import ExportError, _mesh_line


@dataclass(kw_only=True, slots=True)
class SlurmOptions:
    """What the batch script needs beyond the plan. `partita export --to slurm`'s flags are generated from these
    fields (`slurm_flags`): the run's own (model, steps, data, checkpoints, restarts) from `partita run`'s table,
    the others from each field's metadata."""

    model: str
    """MODEL string runtime.train builds on every node (the model the plan was made for)."""
    steps: int = 10
    """Training steps (runtime.train --steps)."""
    gpus_per_node: int | None = field(default=None, metadata=flag(
        "processes per node (default: the plan's devices per node)", metavar="G"))
    partition: str | None = field(default=None, metadata=flag("SLURM partition (#SBATCH --partition)", metavar="P"))
    time: str | None = field(default=None, metadata=flag("SLURM time limit, e.g. 04:00:00", metavar="T"))
    account: str | None = field(default=None, metadata=flag("SLURM account (#SBATCH --account)", metavar="A"))
    job_name: str = field(default="partita", metadata=flag("SLURM job name (default partita)", metavar="NAME"))
    port: int = field(default=29500, metadata=flag("rendezvous port on the job's first node (default 29500)",
                                               metavar="PORT"))
    python: str = field(default="python", metadata=flag(
        "the interpreter with partita installed on the compute nodes (default: python from the job's PATH; "
        "$PYTHON overrides either at submission)", metavar="PATH"))
    """Never the exporting machine's own interpreter, whose path need not exist there."""
    data: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    max_restarts: int = 0


RUN_FIELDS = ("steps", "data", "checkpoint_dir", "checkpoint_every", "max_restarts")
"""SlurmOptions' fields that are `partita run`'s flags too: the script passes them on to it."""


def slurm_flags() -> tuple:
    """`partita export --to slurm`'s flags: --model (not required: other targets take none) and RUN_FIELDS from
    `partita run`'s table (runtime.launcher.flags), the rest generated from SlurmOptions' fields."""
    from dataclasses import replace

    from partita.runtime.launcher.flags import MODEL, RUN_FLAGS, dataclass_flags, select
    return (replace(MODEL, required=False), *select(RUN_FLAGS, *RUN_FIELDS),
            *dataclass_flags(SlurmOptions, skip=("model", *RUN_FIELDS)))


def slurm_nodes(plan: Plan, gpus_per_node: int | None = None) -> tuple[int, int]:
    """(nodes, processes per node) for the plan. Raises ExportError when the plan's ranks are not a whole
    number of identical nodes."""
    cluster, world = plan.cluster, plan.mesh.world_size
    if cluster.get("groups"):
        names = ", ".join(str(g.get("name")) for g in cluster["groups"])
        raise ExportError(f"the plan's cluster is heterogeneous ({names}), not nodes x devices: one SLURM job of "
                          "identical nodes cannot hold it; write a heterogeneous job (#SBATCH hetjob) by hand")
    devices = cluster.get("num_devices")
    if devices is not None and devices != world:
        raise ExportError(f"the plan's mesh uses {world} ranks but its cluster {cluster.get('spec')!r} has "
                          f"{devices} devices")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise ExportError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    per_node = gpus_per_node if gpus_per_node is not None else cluster.get("devices_per_node")
    if not isinstance(per_node, int) or isinstance(per_node, bool) or per_node < 1:
        raise ExportError(f"the plan's cluster {cluster.get('spec')!r} records no devices per node; "
                          "give --gpus-per-node G")
    if world % per_node:
        raise ExportError(f"the plan's {world} ranks are not whole nodes of {per_node} devices (cluster "
                          f"{cluster.get('spec')!r}); give a --gpus-per-node that divides {world}")
    return world // per_node, per_node


def _slurm_notes(plan: Plan, per_node: int) -> list[str]:
    planned, tp = plan.cluster.get("devices_per_node"), plan.mesh.tp
    notes = []
    if planned is not None and planned != per_node:
        notes.append(f"# note: the plan was priced for {planned} devices per node; this job runs {per_node}")
    if per_node % tp:
        notes.append(f"# note: tensor-parallel groups of {tp} span nodes with {per_node} processes per node "
                     "(the plan's predictions assume them inside a node)")
    return notes


def _train_flags(opts: SlurmOptions) -> list[str]:
    flags = ["--model", opts.model, "--steps", str(opts.steps)]
    for name in ("data", "checkpoint_dir", "checkpoint_every"):
        value = getattr(opts, name)
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    if opts.max_restarts:
        flags += ["--max-restarts", str(opts.max_restarts)]
    return flags


_SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.:,+=@/-]+")
"""What a value written after `#SBATCH --key=` may hold: names, lists and times, nothing a shell or sbatch reads
as syntax (#SBATCH lines are not quoted by sbatch)."""


def _check_slurm(opts: SlurmOptions) -> None:
    """Options land in the script as #SBATCH values and shell words: refuse what could escape them."""
    if opts.steps < 1:
        raise ExportError(f"--steps must be at least 1, got {opts.steps}")
    for name in ("job_name", "partition", "time", "account"):
        value = getattr(opts, name)
        if value is not None and not _SBATCH_VALUE.fullmatch(value):
            raise ExportError(f"--{name.replace('_', '-')} {one_line(repr(value), 60)} holds characters a SLURM "
                              "option cannot: use letters, digits and _ . : , + = @ / -")
    if not isinstance(opts.port, int) or not 1 <= opts.port <= 65535:
        raise ExportError(f"--port must be a TCP port from 1 to 65535, got {opts.port!r}")


def to_slurm(plan: Plan, plan_path: str, opts: SlurmOptions) -> str:
    """The sbatch script that trains `plan` (saved at `plan_path`, absolute or relative to the directory
    `sbatch` is run from) with runtime.train's launcher (torchrun's agent) on every node and a c10d
    rendezvous on the first node. Every plan text and option is a quoted shell word or a one-line comment
    (plan.one_line): nothing in a plan file or an option runs as a command."""
    _check_slurm(opts)
    nodes, per_node = slurm_nodes(plan, opts.gpus_per_node)
    device = one_line(plan.cluster.get("device", "?"), 60)
    gpu = device != "cpu"
    sbatch = [f"--job-name={opts.job_name}", f"--nodes={nodes}", "--ntasks-per-node=1"]
    sbatch += [f"--gpus-per-node={per_node}"] if gpu else []
    sbatch += [f"--{k}={v}" for k, v in (("partition", opts.partition), ("time", opts.time),
                                         ("account", opts.account)) if v]
    sbatch.append(f"--output={opts.job_name}-%j.out")
    q = shlex.quote
    flags = " ".join(q(f) for f in _train_flags(opts))
    lines = [
        "#!/bin/bash",
        f"# partita plan {one_line(plan_path, 1000)} as a SLURM job: {nodes} node(s) x {per_node} {device} = "
        f"{plan.mesh.world_size} ranks",
        one_line(_mesh_line(plan), 1000),
        *(one_line(n, 1000) for n in _slurm_notes(plan, per_node)),
        *([] if gpu else ["# the plan is for cpu devices: no GPUs are requested; each node runs "
                          f"{per_node} processes on gloo"]),
        "# submit with sbatch; the plan must be readable at PLAN on every node (a shared filesystem)",
        *(f"#SBATCH {s}" for s in sbatch),
        "set -euo pipefail",
        "",
        f"PLAN={q(plan_path)}",
        "# the interpreter with partita installed on the compute nodes: export PYTHON=... before sbatch, or",
        "# activate the environment in this script; python from the job's PATH otherwise",
        f"DEFAULT_PYTHON={q(opts.python)}",
        'PYTHON="${PYTHON:-$DEFAULT_PYTHON}"',
        f"PORT={int(opts.port)}",
        f"NNODES={nodes}",
        'if [ "${SLURM_NNODES:-0}" != "$NNODES" ]; then',
        '    echo "partita: error: the plan needs $NNODES node(s), this job has ${SLURM_NNODES:-none}" >&2; exit 2',
        "fi",
        'if [ ! -r "$PLAN" ]; then',
        '    echo "partita: error: cannot read plan $PLAN on $(hostname)" >&2; exit 2',
        "fi",
        # sed reads every name (head would exit early: SIGPIPE to scontrol, which pipefail makes fatal)
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "",
        "# pre-flight in one process: plan, model, data and world size agree (one line and exit 2 if not)",
        f'"$PYTHON" -m partita.runtime.train "$PLAN" {flags} --nproc-per-node {per_node} --nnodes "$SLURM_NNODES" --check',
        "",
        "# on every node runtime.train is torchrun's agent for its processes (c10d rendezvous at the first node,",
        "# a fresh rendezvous store per restart); the first failing rank is one line on stderr",
        f'srun --ntasks-per-node=1 "$PYTHON" -m partita.runtime.train "$PLAN" {flags} \\',
        f'    --nproc-per-node {per_node} --nnodes "$SLURM_NNODES" --rdzv-endpoint "$HEAD_NODE:$PORT" '
        '--rdzv-id "$SLURM_JOB_ID"',
    ]
    return "\n".join(lines) + "\n"
