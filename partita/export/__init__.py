"""A plan in other tools' words: `partita export PLAN --to {slurm,megatron,torchtitan}`.

Pure functions from a loaded Plan to text; nothing here runs, imports the runtime or touches the network.

- `to_slurm`: a bash batch script for `sbatch`. `#SBATCH --nodes` = plan world size / devices per node,
  one task per node; after a one-process pre-flight check (`partita.runtime.train ... --check`), `srun` starts
  `python -m partita.runtime.train PLAN ... --nproc-per-node G --nnodes N --rdzv-endpoint HEAD:PORT --rdzv-id JOB`
  on every node: runtime.train's launcher mode, torchrun's agent for its node with a c10d rendezvous on
  the job's first node (as `partita run --nnodes` does), which reports the first failing rank as one line.
  The plan's path is written into the script, so the plan must be readable at that path on every node
  (a shared filesystem).
- `to_megatron`: Megatron-LM command-line arguments, one per line (names checked against
  megatron/training/arguments.py and the config dataclasses it builds arguments from):
    mesh tp, pp                     --tensor-model-parallel-size, --pipeline-model-parallel-size (dp is
                                    derived by Megatron: world size / (tp pp))
    virtual stages (even layers)    --num-layers-per-virtual-pipeline-stage
    uneven stage layers             --pipeline-model-parallel-layout "Et*5|t*7|...|t*4L" (recent Megatron)
    layers sharded "sequence"       --sequence-parallel
    recompute selective / full      --recompute-granularity selective | full --recompute-method uniform
    (op: as full, noted)
                                    --recompute-num-layers 1; the same count of full layers per stage:
                                    --recompute-method block --recompute-num-layers k
    schedule micro-batch, batch     --micro-batch-size, --global-batch-size; train.seq_len --seq-length
    ZeRO 1 or 2 (and 3, partly)     --use-distributed-optimizer
    overlap tp_comm / p2p           --tp-comm-overlap / --overlap-p2p-communication
    dtype bf16                      --bf16 (fp32 is Megatron's default)
  What has no Megatron-LM equivalent (ZeRO-3 / per-layer ZeRO stages, offload, per-layer mixed recompute
  or tensor sharding, the GPipe schedule) is a line `# partita: ... has no Megatron-LM equivalent: ...`.
- `to_torchtitan`: TOML overrides of torchtitan's job config (the TOML JobConfig of torchtitan up to
  v0.2.2, torchtitan/config/job_config.py; later torchtitan configures in Python with mostly the same
  field names):
    [parallelism] ZeRO 0/1 -> data_parallel_replicate_degree = dp; ZeRO 2 -> data_parallel_shard_degree = dp
                  with fsdp_reshard_after_forward = "never" (parameters stay gathered forward to backward,
                  as partita's ZeRO-2 does with FSDP2); ZeRO 3 -> data_parallel_shard_degree = dp,
                  "always"; tp -> tensor_parallel_degree; pp -> pipeline_parallel_degree, the schedule by
                  name (partita uses torch.distributed.pipelining's names: 1F1B, GPipe, Interleaved1F1B),
                  pipeline_parallel_microbatch_size, module_fqns_per_model_part = the plan's stages
                  enable_async_tensor_parallel = the plan's tensor-parallel overlap (torch's async TP; needs
                  torchtitan's compile)
    [activation_checkpoint] mode none | selective (selective_ac_option "op": partita's op exactly, its
                  selective approximately) | full; full on every n-th
                  layer -> selective with selective_ac_option "n"
    [training]    local_batch_size (per data-parallel rank and optimizer step, or per micro-batch when
                  partita accumulates gradients without a pipeline), global_batch_size, seq_len,
                  mixed_precision_param; offloaded model states on every layer -> enable_cpu_offload
  What has no torchtitan equivalent is a `# partita: ...` comment.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from partita.costmodel.errors import PartitaError
from partita.planner.plan import RECOMPUTE, BlockChoice, Plan, one_line
from partita.planner.plan.schedules import schedule

FORMATS = ("slurm", "megatron", "torchtitan", "torchrec")


class ExportError(PartitaError):
    """A plan or an option that the asked-for export cannot express."""


# ---- what the plan's layers look like (shared by the formats) -----------------------------------------

_NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def layer_blocks(plan: Plan) -> list[BlockChoice]:
    """The repeated transformer layers: the largest family of blocks named `<prefix>.<n>` (blocks.0,
    model.layers.3, ...); embeddings, final norm and head are not layers. Empty when nothing repeats."""
    families: dict[str, list[BlockChoice]] = {}
    for b in plan.blocks:
        m = _NUMBERED.match(b.fqn)
        if m:
            families.setdefault(m.group(1), []).append(b)
    return max(families.values(), key=len) if families else []


def layers_per_stage(plan: Plan) -> list[int]:
    """Layers in each (virtual) pipeline stage, in model order (stage i runs on pipeline rank i % pp)."""
    layers = layer_blocks(plan)
    return [sum(1 for b in layers if b.stage == s) for s in range(len(plan.stages))]


def layer_zero(plan: Plan) -> tuple[int, list[str]]:
    """The ZeRO stage the layers run at (their own stage where all layers agree, else the plan's) and the
    blocks whose stage differs from it (a sharded plan may keep some blocks gathered: ZeRO-2 in a ZeRO-3
    plan)."""
    def stage(b: BlockChoice) -> int:
        return b.zero_stage if b.zero_stage is not None else plan.zero_stage
    stages = {stage(b) for b in layer_blocks(plan)}
    zero = stages.pop() if len(stages) == 1 else plan.zero_stage
    return zero, [b.fqn for b in plan.blocks if stage(b) != zero]


def _no_equivalent(tool: str, what: str, why: str) -> str:
    return f"# partita: {what} has no {tool} equivalent: {why}"


def _mesh_line(plan: Plan) -> str:
    m, s = plan.mesh, plan.schedule
    cp = f" x cp={m.cp}" if m.cp > 1 else ""
    ep = f" (ep={m.ep} of the dp ranks)" if m.ep > 1 else ""
    return (f"# mesh pp={m.pp} x dp={m.dp}{cp} x tp={m.tp} = {m.world_size} ranks{ep}; schedule {s.name}, "
            f"{s.num_microbatches} micro-batch(es) of {s.micro_batch_size}"
            + (f", {s.virtual_stages} virtual stages per rank" if s.virtual_stages > 1 else ""))


# ---- SLURM --------------------------------------------------------------------------------------------

@dataclass(kw_only=True, slots=True)
class SlurmOptions:
    """What the batch script needs beyond the plan."""

    model: str
    """MODEL string runtime.train builds on every node (the model the plan was made for)."""
    steps: int = 10
    """Training steps (runtime.train --steps)."""
    gpus_per_node: int | None = None
    """Processes (devices) per node; None: the plan's cluster devices_per_node."""
    partition: str | None = None
    time: str | None = None
    """SLURM time limit, e.g. 04:00:00."""
    account: str | None = None
    job_name: str = "partita"
    port: int = 29500
    """Rendezvous port on the job's first node."""
    python: str = "python"
    """The interpreter with partita installed, as seen from the compute nodes (overridable by $PYTHON at
    submission); never the exporting machine's own interpreter, whose path need not exist there."""
    data: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    max_restarts: int = 0


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


# ---- Megatron-LM --------------------------------------------------------------------------------------

MEGATRON = "Megatron-LM"


class _Args:
    """Lines of `--flag value` and comments."""

    def __init__(self):
        self.lines: list[str] = []

    def arg(self, flag: str, value=None) -> None:
        self.lines.append(flag if value is None else f"{flag} {shlex.quote(str(value))}")

    def note(self, text: str) -> None:
        text = one_line(text, 1000)  # plan text inside: a newline must not end the comment
        self.lines.append(text if text.startswith("#") else "# " + text)


_HF_KEYS = {"hidden": "hidden_size", "heads": "num_attention_heads", "ffn": "intermediate_size",
            "kv_heads": "num_key_value_heads", "layers": "num_hidden_layers", "vocab": "vocab_size"}
"""partita's model config keys (GPTConfig) and the HuggingFace config attributes a plan of an hf: model records."""
LLAMA_LIKE = {"llama": False, "mistral": False, "qwen2": True}
"""HuggingFace model types built as Llama is (RMSNorm, SwiGLU, rotary positions, no linear biases), and
whether their q, k, v projections have biases (Qwen2)."""
ROPE_BASE = 10000.0
"""The rotary base of partita's llama family (costmodel.models.gpt), and Megatron-LM's default --rotary-base."""


def model_shape(plan: Plan) -> dict:
    """The plan's model sizes under GPTConfig's names (layers, hidden, heads, ffn, kv_heads, vocab), for
    partita's own models and hf: ones alike."""
    c = plan.model.get("config") or {}
    if c.get("family") != "hf":
        return dict(c)
    return {**c, **{k: c[hf] for k, hf in _HF_KEYS.items() if c.get(hf)}}


def architecture(plan: Plan) -> dict | None:
    """The decoder's building blocks -- llama: RMSNorm, SwiGLU, rotary positions (base), no linear biases;
    gpt: LayerNorm, GELU, learned positions, biases -- and whether the embeddings are tied; None when the plan's
    model is neither (an hf: model of another type, a factory)."""
    c = plan.model.get("config") or {}
    if c.get("family") in ("gpt", "llama"):  # GPTConfig: input and output embeddings never tied
        return {"llama": c["family"] == "llama", "rope_base": ROPE_BASE, "qkv_bias": False, "tied": False,
                "experts": c.get("experts") or 0, "top_k": c.get("top_k")}
    if c.get("family") == "hf" and c.get("arch") in LLAMA_LIKE and c.get("task") == "causal":
        return {"llama": True, "rope_base": c.get("rope_theta", ROPE_BASE), "qkv_bias": LLAMA_LIKE[c["arch"]],
                "tied": bool(c.get("tie_word_embeddings")), "experts": 0, "top_k": None}
    return None


def _megatron_architecture(plan: Plan, out: _Args) -> None:
    """The flags that make Megatron-LM build the plan's architecture rather than its default GPT (LayerNorm,
    GELU, learned absolute positions, linear biases, tied embeddings; megatron/training/arguments.py)."""
    a = architecture(plan)
    if a is None:
        out.note(f"# partita: the architecture of {plan.model.get('name', '?')} is not translated, only its sizes: "
                 f"add the flags that build it ({MEGATRON} builds a GPT by default)")
        return
    if a["llama"]:
        out.arg("--swiglu")
        out.arg("--normalization", "RMSNorm")
        out.arg("--position-embedding-type", "rope")
        out.arg("--rotary-base", int(a["rope_base"]) if float(a["rope_base"]).is_integer() else a["rope_base"])
        out.arg("--disable-bias-linear")
        if a["qkv_bias"]:
            out.arg("--add-qkv-bias")
    if not a["tied"]:
        out.arg("--untie-embeddings-and-output-weights")
    if a["experts"]:
        out.arg("--num-experts", a["experts"])
        out.arg("--moe-router-topk", a["top_k"])


def _megatron_model(plan: Plan, out: _Args) -> None:
    c = model_shape(plan)
    layers = len(layer_blocks(plan)) or c.get("layers")
    if layers:
        out.arg("--num-layers", layers)
    for flag, key in (("--hidden-size", "hidden"), ("--num-attention-heads", "heads"), ("--ffn-hidden-size", "ffn")):
        if c.get(key):
            out.arg(flag, c[key])
    if c.get("kv_heads") and c.get("heads") and c["kv_heads"] != c["heads"]:
        out.arg("--group-query-attention")
        out.arg("--num-query-groups", c["kv_heads"])
    _megatron_architecture(plan, out)
    seq = plan.train.get("seq_len")
    if seq:
        out.arg("--seq-length", seq)
        out.arg("--max-position-embeddings", max(seq, c.get("seq") or 0))
    if not c.get("hidden"):
        out.note("the plan records no model shape: add Megatron-LM's model arguments (--hidden-size ...)")
    elif c.get("vocab"):
        out.note(f"vocabulary {c['vocab']}: Megatron-LM takes it from the tokenizer")


def _megatron_pipeline(plan: Plan, out: _Args) -> None:
    pp, v = plan.mesh.pp, plan.schedule.virtual_stages
    counts = layers_per_stage(plan)
    if pp > 1 and layer_blocks(plan):
        if len(set(counts)) > 1:
            stages = ["E" * (i == 0) + (f"t*{n}" if n > 1 else "t" * n) + "L" * (i == len(counts) - 1)
                      for i, n in enumerate(counts)]
            out.arg("--pipeline-model-parallel-layout", "|".join(stages))
            out.note(f"uneven stages ({counts} layers per stage): --pipeline-model-parallel-layout needs a recent "
                     f"{MEGATRON}; older releases split layers evenly and have no equivalent")
        elif v > 1:
            out.arg("--num-layers-per-virtual-pipeline-stage", counts[0])
    if gap := schedule(plan.schedule.name).megatron_gap:
        out.note(_no_equivalent(MEGATRON, f"the {plan.schedule.name} schedule", gap))


def _megatron_tensor(plan: Plan, out: _Args) -> None:
    if plan.mesh.tp == 1:
        return
    layers = layer_blocks(plan)
    shardings = {b.sharding for b in layers}
    if "sequence" in shardings:
        out.arg("--sequence-parallel")
        if len(shardings) > 1:
            out.note(_no_equivalent(MEGATRON, "sequence parallelism on some layers only",
                                    "--sequence-parallel applies to every layer"))
    unsplit = [b.fqn for b in layers if b.sharding == "replicate"]
    if unsplit:
        out.note(_no_equivalent(MEGATRON, f"replicated (not tensor-parallel) layers {_names(unsplit)}",
                                f"Megatron-LM splits every layer over tp={plan.mesh.tp}"))


def _names(fqns: list[str], most: int = 4) -> str:
    return ", ".join(fqns[:most]) + (f" and {len(fqns) - most} more" if len(fqns) > most else "")


def _full_per_stage(plan: Plan, policies: list[str]) -> list[int]:
    """Layers per stage with policy "full" (`policies`: one per layer block, in layer_blocks order)."""
    full = [b for b, p in zip(layer_blocks(plan), policies) if p == "full"]
    return [sum(1 for b in full if b.stage == s) for s in range(len(plan.stages))]


def _megatron_recompute(plan: Plan, out: _Args) -> None:
    policies = [b.recompute for b in layer_blocks(plan)]
    if "op" in policies:  # Megatron's selective keeps more than "op" would: full is the choice that fits
        out.note(_no_equivalent(MEGATRON, f"per-op selective recompute ({policies.count('op')} layers)",
                                "those layers recompute in full (fits, more recompute than planned)"))
        policies = ["full" if p == "op" else p for p in policies]
    kinds = set(policies)
    if "full" in kinds:
        per_stage = _full_per_stage(plan, policies)
        out.arg("--recompute-granularity", "full")
        if kinds == {"full"}:
            out.arg("--recompute-method", "uniform")
            out.arg("--recompute-num-layers", 1)
            return
        out.arg("--recompute-method", "block")
        out.arg("--recompute-num-layers", max(per_stage))
        if len(set(per_stage)) > 1 or "selective" in kinds:
            out.note(_no_equivalent(MEGATRON, f"per-layer mixed recompute (full layers per stage {per_stage}"
                                    + (f", {policies.count('selective')} selective layers" if "selective" in kinds
                                       else "") + ")",
                                    f"block recompute takes the same count in every stage: {max(per_stage)}, the "
                                    "largest, so every stage fits (more recompute than planned)"))
        else:
            out.note(f"full recompute on {per_stage[0]} layer(s) of each stage: Megatron-LM recomputes the first "
                     "ones, the plan any; the cost is the same for identical layers")
    elif "selective" in kinds:
        out.arg("--recompute-granularity", "selective")
        if kinds != {"selective"}:
            out.note(_no_equivalent(MEGATRON, "selective recompute on some layers only",
                                    "Megatron-LM's selective recompute applies to every layer"))


def _sync_note(tool: str, plan: Plan) -> str | None:
    """The note for a plan whose sync mode (planner.plan.sync) the tool's arguments do not carry; None: synchronous."""
    if plan.sync.mode == "synchronous":
        return None
    every = plan.sync.options.get("every")
    return _no_equivalent(tool, f"the {plan.sync.mode} sync mode (H = {every})",
                          "these arguments train synchronous data parallelism; the prediction assumed the plan's mode")


def _megatron_states(plan: Plan, out: _Args) -> None:
    if note := _sync_note(MEGATRON, plan):
        out.note(note)
    zero, differ = layer_zero(plan)
    if zero in (1, 2, 3):
        out.arg("--use-distributed-optimizer")
    if zero == 2:
        out.note(_no_equivalent(MEGATRON, "ZeRO-2 gradient sharding", "the distributed optimizer shards optimizer "
                                "state but keeps each rank's whole gradient buffer (more memory than predicted)"))
    if zero == 3:
        out.note(_no_equivalent(MEGATRON, "ZeRO-3 / FSDP (parameters sharded, gathered layer by layer)",
                                "the distributed optimizer shards optimizer state only (more memory than "
                                "predicted); the nearest is Megatron-FSDP (--use-megatron-fsdp "
                                "--data-parallel-sharding-strategy optim_grads_params), not emitted"))
    if differ:
        out.note(_no_equivalent(MEGATRON, f"per-layer ZeRO stages ({_names(differ)} differ from the layers' "
                                f"ZeRO-{zero})", "data-parallel sharding is one choice for the whole model"))
    _offload_notes(plan, MEGATRON, out)


def _offload_notes(plan: Plan, tool: str, out: _Args, *, states_mapped: bool = False) -> None:
    acts = [b.fqn for b in plan.blocks if b.offload_activations]
    states = [b.fqn for b in plan.blocks if b.offload_states]
    if acts:
        out.note(_no_equivalent(tool, f"activation offload to host memory ({_names(acts)})",
                                "the activations stay on the device (more memory than predicted)"))
    if states and not states_mapped:
        out.note(_no_equivalent(tool, f"model-state offload to host memory ({_names(states)})",
                                "parameters, gradients and optimizer state stay on the device"))


def to_megatron(plan: Plan) -> str:
    """Megatron-LM arguments for the plan, one per line; `#` lines are comments
    (use: `ARGS=$(grep -v '^#' megatron.args)`, then `pretrain_gpt.py $ARGS ...`)."""
    out = _Args()
    out.note(f"{MEGATRON} arguments for partita plan of {plan.model.get('name', '?')} on "
             f"{plan.cluster.get('spec', '?')}")
    out.note(_mesh_line(plan))
    out.note(f"data parallel {plan.mesh.dp} = world size / (tp pp cp): {MEGATRON} derives it from the ranks it "
             "is started on")
    _megatron_model(plan, out)
    out.arg("--tensor-model-parallel-size", plan.mesh.tp)
    out.arg("--pipeline-model-parallel-size", plan.mesh.pp)
    if plan.mesh.cp > 1:
        out.arg("--context-parallel-size", plan.mesh.cp)
    if plan.mesh.ep > 1:
        out.arg("--expert-model-parallel-size", plan.mesh.ep)
    _megatron_pipeline(plan, out)
    _megatron_tensor(plan, out)
    if plan.overlap.get("tp_comm"):
        out.arg("--tp-comm-overlap")
    if plan.overlap.get("p2p"):
        out.arg("--overlap-p2p-communication")
    out.arg("--micro-batch-size", plan.schedule.micro_batch_size)
    out.arg("--global-batch-size", plan.train["global_batch"])
    if plan.train.get("dtype") == "bf16":
        out.arg("--bf16")
    if plan.train.get("optimizer"):
        out.arg("--optimizer", plan.train["optimizer"])
    _megatron_recompute(plan, out)
    _megatron_states(plan, out)
    return "\n".join(out.lines) + "\n"


# ---- torchtitan ---------------------------------------------------------------------------------------

TORCHTITAN = "torchtitan"


def _torchtitan_parallelism(plan: Plan, notes: _Args) -> dict:
    m, s = plan.mesh, plan.schedule
    if note := _sync_note(TORCHTITAN, plan):
        notes.note(note)
    zero, differ = layer_zero(plan)
    sharded = zero in (2, 3) and m.dp > 1
    par = {"data_parallel_replicate_degree": 1 if sharded else m.dp,
           "data_parallel_shard_degree": m.dp if sharded else 1}
    if sharded:
        par["fsdp_reshard_after_forward"] = "never" if zero == 2 else "always"
    if zero == 1:
        notes.note(_no_equivalent(TORCHTITAN, "ZeRO-1", "data_parallel_replicate_degree replicates the optimizer "
                                  "state too (more memory than predicted)"))
    if differ:
        notes.note(_no_equivalent(TORCHTITAN, f"per-layer ZeRO stages ({_names(differ)} differ from the layers' "
                                  f"ZeRO-{zero})", "fsdp_reshard_after_forward is one policy for the model"))
    par["tensor_parallel_degree"] = m.tp
    par["enable_async_tensor_parallel"] = bool(plan.overlap.get("tp_comm"))
    if plan.overlap.get("tp_comm"):
        notes.note("enable_async_tensor_parallel needs torchtitan's compile of the model (torch.compile finds the "
                   "all-gather / matmul and matmul / reduce-scatter pairs to overlap)")
    if plan.overlap.get("p2p"):
        notes.note(_no_equivalent(TORCHTITAN, "pipeline sends overlapped with compute", "torch.distributed."
                                  "pipelining waits for each step's sends (slower than predicted)"))
    if m.tp > 1:
        par["disable_loss_parallel"] = not _loss_parallel(plan)
        layers = layer_blocks(plan)
        for kind, why in (("replicate", "torchtitan splits every layer over tensor_parallel_degree"),
                          ("tensor", "torchtitan's tensor parallelism is always sequence-parallel")):
            fqns = [b.fqn for b in layers if b.sharding == kind]
            if fqns:
                what = "replicated (not tensor-parallel) layers" if kind == "replicate" else \
                    "tensor parallelism without sequence parallelism on"
                notes.note(_no_equivalent(TORCHTITAN, f"{what} {_names(fqns)}", why))
    par["pipeline_parallel_degree"] = m.pp
    if m.pp > 1:
        par["pipeline_parallel_schedule"] = s.name
        par["pipeline_parallel_microbatch_size"] = s.micro_batch_size
        par["module_fqns_per_model_part"] = [list(st.modules) for st in plan.stages]
        notes.note("module_fqns_per_model_part holds the plan's module names; torchtitan's own models name them "
                   "differently (tok_embeddings, layers.N, norm, output): rename to the model torchtitan trains")
    par["context_parallel_degree"] = m.cp
    if m.ep > 1:  # torchtitan borrows expert ranks from the data-parallel (shard) ranks, as partita does
        par["expert_parallel_degree"] = m.ep
    return par


def _loss_parallel(plan: Plan) -> bool:
    """The plan splits the LM head by vocabulary (a parallel cross-entropy): a `vocab` placement after the
    last layer."""
    layers = layer_blocks(plan)
    if not layers:
        return False
    last = max(i for i, b in enumerate(plan.blocks) if b is layers[-1])
    after = [b.fqn for b in plan.blocks[last + 1:]]
    return any(style == "vocab" and any(fqn == a or fqn.startswith(a + ".") for a in after)
               for fqn, style in plan.placements.items())


def _torchtitan_checkpointing(plan: Plan, notes: _Args) -> dict:
    policies = [b.recompute for b in layer_blocks(plan)]
    kinds = set(policies)
    if kinds <= {"none"}:
        return {"mode": "none"}
    if kinds == {"full"}:
        return {"mode": "full"}
    if kinds == {"op"}:
        return {"mode": "selective", "selective_ac_option": "op"}
    if kinds == {"selective"}:
        notes.note("selective recompute -> per-op selective checkpointing (\"op\"): torchtitan saves matmul "
                   "outputs and recomputes the rest, close to, not the same as, partita's selective")
        return {"mode": "selective", "selective_ac_option": "op"}
    full = policies.count("full")
    if kinds == {"full", "none"} and len(policies) % full == 0:
        every = len(policies) // full
        notes.note(f"full recompute on {full} of {len(policies)} layers -> every {every}-th layer (torchtitan "
                   "picks which; the cost is the same for identical layers)")
        return {"mode": "selective", "selective_ac_option": str(every)}
    strongest = max(kinds, key=RECOMPUTE.index)
    notes.note(_no_equivalent(TORCHTITAN, "per-layer mixed recompute ("
                              + ", ".join(f"{policies.count(k)} {k}" for k in RECOMPUTE if k in kinds) + ")",
                              f"every layer takes {strongest}, the most memory-saving of them"
                              + (" (as per-op selective checkpointing)" if strongest == "selective" else "")))
    if strongest == "full":
        return {"mode": "full"}
    return {"mode": "selective", "selective_ac_option": "op"}


def _torchtitan_training(plan: Plan, notes: _Args) -> dict:
    s, dp, gb = plan.schedule, plan.mesh.dp, plan.train["global_batch"]
    # with a pipeline, a rank's batch is split into micro-batches; without one, partita accumulates
    # gradients over micro-batches, which torchtitan does when global > local x dp
    local = gb // dp if plan.mesh.pp > 1 else s.micro_batch_size
    train = {"local_batch_size": local, "global_batch_size": gb}
    if plan.train.get("seq_len"):
        train["seq_len"] = plan.train["seq_len"]
    train["mixed_precision_param"] = "bfloat16" if plan.train.get("dtype") == "bf16" else "float32"
    train["mixed_precision_reduce"] = "float32"
    layers = layer_blocks(plan) or plan.blocks
    states = [b.offload_states for b in layers]
    if states and all(states):
        train["enable_cpu_offload"] = True
    elif any(states):
        notes.note(_no_equivalent(TORCHTITAN, "model-state offload on some layers only",
                                  "enable_cpu_offload is for the whole model; left off"))
    _offload_notes(plan, TORCHTITAN, notes, states_mapped=True)
    return train


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: the same escapes as JSON
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


TORCHTITAN_LLAMA3 = {"8B": (4096, 32, 32, 8, 14336), "70B": (8192, 80, 64, 8, 28672),
                     "405B": (16384, 126, 128, 8, 53248)}
"""torchtitan's llama3 flavours (torchtitan/models/llama3/__init__.py): dim, n_layers, n_heads, n_kv_heads, and the
FFN size its ffn_dim_multiplier and multiple_of give; vocabulary 128256, rope_theta 500000."""


def _torchtitan_model(plan: Plan, notes: _Args) -> dict:
    """The model torchtitan trains: its llama3 model and the flavour with the plan's shape."""
    a, c = architecture(plan), model_shape(plan)
    if a is None or not a["llama"] or a["experts"]:
        notes.note(_no_equivalent(TORCHTITAN, f"the model {plan.model.get('name', '?')}", "torchtitan trains its own "
                                  "model definitions (llama3, deepseek_v3 ...); name one with these sizes in [model]"))
        return {}
    shape = (c.get("hidden"), len(layer_blocks(plan)) or c.get("layers"), c.get("heads"), c.get("kv_heads"), c.get("ffn"))
    flavor = next((f for f, s in TORCHTITAN_LLAMA3.items() if s == shape), None)
    if flavor is None:
        dims = ", ".join(f"{k}={v}" for k, v in zip(("dim", "n_layers", "n_heads", "n_kv_heads", "ffn"), shape))
        notes.note(_no_equivalent(TORCHTITAN, f"a llama3 flavour with {dims}",
                                  "add one to torchtitan's llama3 flavours and name it here"))
        return {"name": "llama3"}
    differ = ([f"rotary base {a['rope_base']:g} (torchtitan's: 500000)"] if a["rope_base"] != 500000.0 else []) + (
        [f"vocabulary {c['vocab']} (torchtitan's: its tokenizer's, 128256)"] if c.get("vocab") not in (None, 128256) else [])
    if differ:
        notes.note(f"torchtitan's llama3 {flavor} has the plan's shapes; the plan's model differs in {', '.join(differ)}, "
                   "which changes no cost")
    return {"name": "llama3", "flavor": flavor}


def to_torchtitan(plan: Plan) -> str:
    """torchtitan job-config overrides (TOML) for the plan: merge into a torchtitan train config."""
    sections = []
    for name, build in (("model", _torchtitan_model), ("parallelism", _torchtitan_parallelism),
                        ("activation_checkpoint", _torchtitan_checkpointing), ("training", _torchtitan_training)):
        notes = _Args()
        values = build(plan, notes)
        sections.append("\n".join([f"[{name}]", *notes.lines, *(f"{k} = {_toml_value(v)}" for k, v in values.items())]))
    head = [one_line(f"# {TORCHTITAN} job-config overrides for partita plan of {plan.model.get('name', '?')} on "
                     f"{plan.cluster.get('spec', '?')} (TOML JobConfig fields, torchtitan <= v0.2.2)", 1000),
            one_line(_mesh_line(plan), 1000)]
    return "\n".join(head) + "\n\n" + "\n\n".join(sections) + "\n"


def export(plan: Plan, fmt: str, *, plan_path: str = "plan.json", slurm: SlurmOptions | None = None) -> str:
    """The plan as `fmt` (one of FORMATS); `slurm` options are required for, and only for, "slurm"."""
    if fmt == "slurm":
        if slurm is None:
            raise ExportError("--to slurm needs --model MODEL (the model runtime.train builds on every node)")
        return to_slurm(plan, plan_path, slurm)
    if fmt == "megatron":
        return to_megatron(plan)
    if fmt == "torchtitan":
        return to_torchtitan(plan)
    if fmt == "torchrec":
        from partita.export.torchrec import to_torchrec  # a plan's embedding tables
        return to_torchrec(plan)
    raise ExportError(f"unknown export format {fmt!r}; accepted: {', '.join(FORMATS)}")
