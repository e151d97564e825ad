"""The training configuration (TrainConfig) and the restricted search space (SearchSpace) a search walks, with
their validation: what a user fixes (`partita plan --tp/--pp/...`, planner.api.plan keywords) and what the
search may choose. planner.enumerate.space enumerates the meshes and schedules they yield and re-exports
these names."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from partita.costmodel.errors import PartitaError
from partita.costmodel.fields import flag, no_flag
from partita.costmodel.hardware.stacks import DEFAULT_STACK, KERNELS, STACKS, get_stack
from partita.costmodel.price.memory import MASTER_WEIGHTS
from partita.planner.plan import MAX_GLOBAL_BATCH, RECOMPUTE
from partita.planner.plan.schedules import AUTO, SCHEDULES
from partita.planner.plan.sync import SYNC_MODES, SYNCHRONOUS, mode_problem


SCHEDULE_CHOICES = (AUTO, *SCHEDULES)
"""TrainConfig.schedule and --schedule: "auto" or a schedule of the registry (planner.plan.schedules)."""
VIRTUAL_STAGES = (2, 4)
"""Model chunks per device tried for interleaved 1F1B, beside the deepest the layers allow (deepest_virtual)."""
MAX_VIRTUAL_STAGES = 8


WHAT_IF = "what-if"
"""The group of the flags that fix a choice the search would otherwise make (`partita plan --tp 8 ...`)."""


def one(value) -> tuple:
    """A flag's one value as the set of one a SearchSpace field holds."""
    return (value,)


def on(value: str) -> bool:
    return value == "on"


def one_on(value: str) -> tuple:
    return (value == "on",)


def sync_modes(value: str):
    """--sync's value: one mode (or auto), or several separated by commas (checked by SearchSpace, in one line)."""
    return tuple(value.split(",")) if "," in value else value


def policies(text: str) -> tuple[str, ...]:
    """--recompute's value: one policy, or a comma list of them."""
    found = tuple(dict.fromkeys(x.strip() for x in text.split(",")))
    bad = [x for x in found if x not in RECOMPUTE]
    if bad or not found:
        raise argparse.ArgumentTypeError(f"{', '.join(bad) or repr(text)} is not a recompute policy; "
                                         f"choose among {', '.join(RECOMPUTE)} (or a comma list of them)")
    return found


def layer_counts(text: str) -> tuple[int, ...]:
    """--stage-layers' value: a comma list of whole numbers (SearchSpace.stage_layers says what else it must be)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of layer counts (e.g. 10,11,11,10)") from None


ON_OFF = ("on", "off")


def deepest_virtual(pp: int, layers: int) -> int:
    """The most model chunks per device (up to MAX_VIRTUAL_STAGES) that still give every chunk a layer: the
    smallest bubble interleaving reaches, (pp - 1) / (m v) of a stage's work (Narayanan et al. SC'21), at
    the price of v x the point-to-point sends."""
    return min(MAX_VIRTUAL_STAGES, layers // pp) if pp > 1 else 1


class _ByDevice(str):
    """TrainConfig's dtype when none is given: "bf16" to code that reads it, and replaced by the cluster's
    default (planner.api.default_dtype: fp32 on CPU, bf16 on accelerators, as the CLI does) when planning
    through planner.api."""


BY_DEVICE = _ByDevice("bf16")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """What is trained, and how."""

    global_batch: int = field(metadata=flag("samples per optimizer step", required=True))
    """Samples per optimizer step, over all data-parallel replicas and micro-batches."""
    seq_len: int | None = field(default=None, metadata=flag("sequence length (default: the model's)", option="seq",
                                                                           metavar="SEQ"))
    """Tokens per sample; None keeps the model's own."""
    dtype: str = field(default=BY_DEVICE, metadata=flag("training precision (default: bf16 on GPUs, fp32 on cpu)",
                                                        choices=("bf16", "fp32")))
    """"bf16" (bf16 parameters and activations, fp32 master weights) or "fp32". Not given: by the
    cluster's device kind when planned through planner.api (fp32 on CPU, bf16 on accelerators; `BY_DEVICE`)."""
    master_weights: str = field(default="fp32", metadata=flag(
        "fp32 (default): a bf16 model's optimizer steps an fp32 master copy, 16 bytes of state per parameter with "
        "Adam; none: pure bf16, parameters, gradients and Adam moments in bf16, 8 bytes (nanotron, torchtitan on a "
        "bf16 model); implies --dtype bf16", choices=tuple(MASTER_WEIGHTS)))
    """Where a bf16 model's optimizer keeps its weights: "fp32" (a master copy; with Adam 2 + 2 + 12 bytes of
    state per parameter, ZeRO's mixed precision) or "none" (pure bf16: bf16 parameters, gradients and Adam
    moments, 2 + 2 + 2 + 2 = 8 bytes, as nanotron, some Megatron-LM configurations and torchtitan on a bf16
    model run; costmodel.price.memory). A field beside `dtype`, not a third dtype: the compute dtype is bf16
    either way (every reader of `dtype` -- peaks, captures, exporters -- stays right), and what changes is
    the optimizer's state. "none" needs dtype "bf16" (given, or by device: it then chooses bf16 on CPUs too)."""
    optimizer: str = field(default="adam", metadata=flag("the optimizer (default adam)", choices=("adam", "sgd")))
    schedule: str = field(default="auto", metadata=flag(
        "pipeline schedule (default auto: the planner picks 1F1B or interleaved 1F1B)", choices=SCHEDULE_CHOICES,
        group=WHAT_IF))
    """Pipeline schedule: "auto" (the planner picks 1F1B or interleaved 1F1B, and GPipe where there are fewer
    micro-batches than stages) or a name of planner.plan.schedules' registry: "1F1B", "GPipe", "Interleaved1F1B"."""
    max_micro_batch: int = field(default=64, metadata=no_flag("a search bound; --micro-batch fixes the size"))
    min_micro_batch: int = field(default=1, metadata=no_flag("set by planner.api from the capture"))
    """The fewest samples a micro-batch may hold: 2 for a model with a BatchNorm over one value per channel per
    sample, which training refuses on one sample (planner.api sets it from the capture,
    costmodel.capture._note_batch_statistics)."""
    autocast: bool = field(default=True, metadata=no_flag("pricing a published run as it ran (benchmarks)"))
    """How a bf16 plan without FSDP computes: under torch.autocast over fp32 parameters, as partita's
    runtime runs it (True: fp32 parameters, gradients and moments, and the bf16 casts and fp32 activations
    autograd saves; costmodel.capture.trace), or on a bf16 model with fp32 master weights in the optimizer (False:
    Megatron-LM's bf16, for pricing a published run as it ran). FSDP plans (ZeRO-2/3) compute on FSDP2's
    bf16 gathered parameters either way."""

    fp32_grads: bool = field(default=False, metadata=no_flag("pricing a published run as it ran (benchmarks)"))
    """A bf16 model with fp32 master weights keeps its gradients in an fp32 buffer (Megatron-LM's bf16 default:
    costmodel.price.memory), 4 bytes per parameter rather than 2; False: in the parameters' dtype, as FSDP2's
    gathered bf16 parameters and NeMo's distributed optimizer keep them. For pricing a published run as it ran."""

    def __post_init__(self):
        if not isinstance(self.global_batch, int) or self.global_batch < 1:
            raise PartitaError(f"global batch must be a positive integer, got {self.global_batch!r}")
        if self.global_batch > MAX_GLOBAL_BATCH:
            raise PartitaError(f"global batch {self.global_batch:,} is beyond what partita plans: at most "
                               f"{MAX_GLOBAL_BATCH:,} (2^30) samples per step")
        if self.dtype not in ("bf16", "fp32"):
            raise PartitaError(f"dtype {self.dtype!r} not supported; accepted: bf16, fp32 (fp16 would need loss "
                               "scaling, which the runtime does not do)")
        if self.master_weights not in MASTER_WEIGHTS:
            raise PartitaError(f"master weights {self.master_weights!r} not supported; accepted: "
                               f"{', '.join(MASTER_WEIGHTS)} (none: pure bf16, no fp32 copy)")
        if self.master_weights == "none" and self.dtype != "bf16":
            raise PartitaError(f"master weights none (pure bf16) needs dtype bf16, got {self.dtype}: "
                               "fp32 parameters are their own master weights")
        if self.schedule not in SCHEDULE_CHOICES:
            raise PartitaError(f"schedule {self.schedule!r} not supported; accepted: {', '.join(SCHEDULE_CHOICES)}")


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Which choices the search may make (the full space by default).

    Each restriction is the set of values the search may take (a single value is shorthand for a set of
    one: `SearchSpace(tp=2, zero=3)`); None means searched. Fixing some choices and searching the rest is
    how a user prices the configuration they run today beside partita's own plan (DESIGN.md, what-if):
    `check_space` says in one line why a fixed configuration cannot run.
    """

    name: str = field(default="partita", metadata=no_flag("the plan's label (baselines name theirs)"))
    tp: tuple[int, ...] | None = field(default=None, metadata=flag(
        'tensor-parallel degree (divides the devices per node)',
        type=int, metavar="N", form=one, group=WHAT_IF))
    """Tensor-parallel degrees; None: every divisor of the node size (tensor parallelism stays in a node).
    A fixed degree is priced even where splitting the layers never pays (a searched one is then dropped)."""
    pp: tuple[int, ...] | None = field(default=None, metadata=flag(
        'pipeline stages',
        type=int, metavar="N", form=one, group=WHAT_IF))
    """Pipeline stages; None: every degree up to the number of layers."""
    dp: tuple[int, ...] | None = field(default=None, metadata=flag(
        'data-parallel degree (tp x pp x dp x cp = number of devices)',
        type=int, metavar="N", form=one, group=WHAT_IF))
    """Data-parallel degrees; None: whatever tp x pp x cp leaves of the devices (dp = devices / (tp pp cp))."""
    cp: tuple[int, ...] | None = field(default=None, metadata=flag(
        'context-parallel degree: each sequence split over N ranks (long sequences)',
        type=int, metavar="N", form=one, group=WHAT_IF))
    """Context-parallel degrees (each sequence split over cp ranks, planner.enumerate.cp_ep); None: 1, and for
    sequences of cp_ep.CP_SEARCH_MIN_SEQ tokens or more the powers of two cp_ep.default_cp gives."""
    ep: tuple[int, ...] | None = field(default=None, metadata=flag(
        "expert-parallel degree: each MoE layer's experts sharded over N of the dp ranks",
        type=int, metavar="N", form=one, group=WHAT_IF))
    """Expert-parallel degrees (a MoE layer's experts sharded over ep of the dp ranks, planner.enumerate.cp_ep);
    None: 1 for dense models, and for MoE models every divisor of dp and of the expert count up to 8."""
    zero: tuple[int, ...] = field(default=(0, 1, 2, 3), metadata=flag(
        "ZeRO stage (1-3 need dp > 1): 1 shards optimizer state (torch's ZeroRedundancyOptimizer; exported as "
        "Megatron's --use-distributed-optimizer), 2 gradients too, 3 parameters too", type=int, choices=(0, 1, 2, 3),
        form=one, group=WHAT_IF))
    """ZeRO stages to consider: 0 (DDP), 1 (optimizer state sharded: torch's ZeroRedundancyOptimizer, on
    meshes planner.plan.executable.zero_refusal allows unless the user fixes the mesh), 2 and 3 (FSDP2). ZeRO
    shards over data-parallel ranks, so a dp = 1 mesh (where every stage is stage 0) is considered only
    when 0 is in the set."""
    recompute: tuple[str, ...] = field(default=RECOMPUTE, metadata=flag(
        "activation recompute policy of every layer (op: torchtitan's per-op selective checkpointing, every other "
        "matmul output kept), or a comma list the search picks from per layer (none,full)", type=policies,
        metavar="{" + ",".join(RECOMPUTE) + "}", group=WHAT_IF))
    """Activation recompute policies ("none", "selective", "op", "full") a layer may take; one value fixes every
    layer's policy."""
    full_recompute_layers: int | None = field(default=None, metadata=flag(
        "exactly N layers recompute in full, the rest take the other allowed policies (Megatron-LM's "
        "--recompute-num-layers; with --recompute none,full: N checkpointed blocks, the rest keep their activations)",
        type=int, metavar="N", group=WHAT_IF))
    """How many of the repeated layers take full recompute, the others one of the other allowed policies
    (Megatron-LM's --recompute-num-layers; fms-fsdp's every k-th block); None: searched per layer. Needs
    "full" among `recompute`. Where the model is not a stack of identical layers it counts every block."""
    offload: bool = field(default=True, metadata=flag(
        "off: nothing offloaded to host memory; on: offload allowed and searched per layer (the default; forcing "
        "every layer to offload is rarely feasible)", choices=ON_OFF, form=on, group=WHAT_IF))
    """True: offload variants (activations to host, FSDP2 CPU offload of ZeRO-3 states) are allowed and
    searched per layer, alongside not offloading; False: nothing is offloaded. (Forcing every layer to
    offload is rarely feasible and is not what a user pricing their setup means by "offload on".)"""
    kernels: str = field(default="eager", metadata=flag(
        "how the layers run: eager (the default) or compiled (torch.compile per layer fuses elementwise ops and norms "
        "and saves fewer activations; prices a compiled run such as torchtitan's --compile, and `partita run` "
        "compiles each layer of such a plan)", choices=KERNELS, group=WHAT_IF))
    """How the operators run (costmodel.price.fusion.KERNELS): "eager", as partita's runtime runs them, or
    "compiled", each block torch.compile'd so its connected elementwise operators and reductions are one
    kernel each (costmodel.price.fusion). A setting, not a choice: the search does not weigh compile time or
    graph breaks. It prices a compiled run (torchtitan's `compile`, fms-fsdp's `use_torch_compile`) beside
    partita's plan, and the runtime compiles each layer of such a plan (runtime.parallel.blocks)."""
    sequence_parallel: tuple[bool, ...] = field(default=(False, True), metadata=flag(
        "Megatron sequence parallelism in the tensor-parallel layers (on needs tp > 1)", choices=ON_OFF, form=one_on,
        group=WHAT_IF))
    """With tp > 1: plain Megatron tensor parallelism (False) and/or with sequence parallelism (True), a
    choice per candidate (every layer of a candidate has the same activation layout, so no layer pays a
    resharding of its neighbour's output; the embeddings and head pay theirs, planner.enumerate.strategies).
    Without False, tp = 1 meshes are not considered (sequence parallelism splits over the tp ranks)."""
    micro_batch: tuple[int, ...] | None = field(default=None, metadata=flag(
        'samples per micro-batch per data-parallel rank',
        type=int, metavar="N", form=one, group=WHAT_IF))
    """Micro-batch sizes b (samples per micro-batch per data-parallel rank); None: every divisor of
    global_batch / dp up to TrainConfig.max_micro_batch (a fixed size may exceed that cap)."""
    virtual_stages: tuple[int, ...] | None = field(default=None, metadata=flag(
        'model chunks per device: N > 1 is interleaved 1F1B with N chunks, 1 no interleaving',
        type=int, metavar="N", form=one, group=WHAT_IF))
    """Model chunks per device: 1 is no interleaving, v > 1 interleaved 1F1B with v chunks (so a set
    without 1 implies TrainConfig.schedule "Interleaved1F1B", and pp > 1); None: 1 and VIRTUAL_STAGES as
    the schedule allows."""
    stage_layers: tuple[int, ...] | None = field(default=None, metadata=flag(
        "pin the pipeline split: repeated layers per stage, first stage first (10,11,11,10), summing to the model's "
        "layers; fixes --pp to their number (Megatron-LM's --decoder-first-pipeline-num-layers, torchtitan's split "
        "points)", type=layer_counts, metavar="N,N,...", group=WHAT_IF))
    """The repeated layers each pipeline stage holds, first stage first (a pinned split: Megatron-LM's
    --decoder-first-pipeline-num-layers, torchtitan's pipeline split points), summing to the model's layers;
    the prefix (embeddings) stays on the first stage and the suffix (norm, head) on the last. It fixes pp to
    its length and one model chunk per device (virtual_stages 1); the stage program prices exactly these
    counts (planner.solve.milp: sum_o h[s, o] = n_s), its other choices still searched. None: searched."""
    min_pp: bool = field(default=False, metadata=no_flag("a baseline's rule (Megatron practice)"))
    """Keep only the smallest pipeline depth that fits (Megatron practice: as few stages as memory allows)."""
    keep_gathered: bool = field(default=True, metadata=no_flag("pricing a published FULL_SHARD run (benchmarks)"))
    """In a ZeRO-3 plan a layer may keep its parameters gathered from forward to backward (its own ZeRO-2,
    chosen per layer where memory allows; the runtime's reshard_after_forward=False). False: every ZeRO-3
    layer reshards after its forward and gathers again for its backward, as FSDP's FULL_SHARD runs --
    how a published FULL_SHARD run is priced as it ran (benchmarks.published)."""
    stack: str | None = field(default=None, metadata=flag(
        f"software stack the plan is priced for (default {DEFAULT_STACK}, partita's runtime); te-2024 (Megatron-Core "
        "+ Transformer Engine) also searches its TP and pipeline-send overlaps and prices its distributed optimizer "
        "-- a plan partita prices but does not run", choices=tuple(STACKS)))
    """The software stack the plan is priced for (costmodel.hardware.stacks): its kernel constants (the cluster's
    devices take that stack's, costmodel.hardware.cluster_on_stack), which overlaps it can run (below) and
    how it runs ZeRO-1 (planner.enumerate.options). None: the cluster's own (a preset's is "pytorch", partita's
    runtime); a plan for another stack ("te-2024": Megatron-Core with Transformer Engine, ...) is priced,
    not run by partita. `search` resolves it (resolve_stack)."""
    tp_comm_overlap: tuple[bool, ...] | None = field(default=None, metadata=flag(
        "on: sequence parallelism's collectives pipelined with the GEMMs they feed (Megatron-Core --tp-comm-overlap, "
        "torch async TP; priced, not run by partita run). Default: as the stack allows, off for the pytorch stack "
        "partita runs", choices=ON_OFF, form=one_on, group=WHAT_IF))
    """Overlap the tensor-parallel collectives of sequence parallelism with the GEMMs they feed (True;
    Megatron-Core's --tp-comm-overlap, torch's async TP) or keep them on the critical path (False), a choice
    per candidate (costmodel.price.streams.tp_overlap prices it). None: by the stack (`overlap_choices`)."""
    p2p_overlap: tuple[bool, ...] | None = field(default=None, metadata=flag(
        "on: an interleaved pipeline's sends overlapped with compute (Megatron-Core --overlap-p2p-communication; "
        "priced, not run by partita run). Default: as the stack allows", choices=ON_OFF, form=one_on, group=WHAT_IF))
    """Overlap an interleaved pipeline's sends and receives with the next chunk's compute (True; Megatron-Core's
    --overlap-p2p-communication) or wait for them (False), a choice per candidate. None: by the stack."""
    p2p_scatter_gather: bool = field(default=False, metadata=no_flag("pricing a Megatron-LM run (benchmarks)"))
    """Price pipeline sends as Megatron-LM runs them with tensor parallelism (Narayanan et al. SC'21, §4.1,
    scatter/gather): each of the t ranks sends 1/t of the boundary activation and the receiving ranks
    all-gather it over the node's links. partita's runtime sends whole tensors (1/t only under sequence
    parallelism), so this is off except when pricing a Megatron-LM configuration (benchmarks)."""
    sync: str | tuple = field(default="auto", metadata=flag(
        f"how data-parallel replicas agree on the weights (planner.plan.sync): a mode, several separated by commas, "
        f"or auto (default: every mode, the fastest within its quality envelope; {SYNCHRONOUS} on a cluster without "
        f"islands)", metavar="{auto," + ",".join(SYNC_MODES) + "}", type=str, form=sync_modes))
    """How the data-parallel replicas agree on the weights (planner.plan.sync.SYNC_MODES): one mode, a tuple of modes
    the planner chooses the fastest of (planner.estimate.sync.choose), or "auto": every mode. "auto" is the default
    because it is today's synchronous plan wherever there is nothing to trade: on a cluster without islands every
    other mode is refused (DiLoCo has no slow link to save) and the plan is synchronous, byte for byte as before;
    on a cluster with islands the modes are priced against each other."""
    sync_every: int | None = field(default=None, metadata=flag(
        "DiLoCo's inner steps per outer step (default: the planner picks H)", metavar="H"))
    """DiLoCo's H (inner steps per outer step); None: the planner picks it (planner.estimate.sync.DILOCO_EVERY_LADDER)."""
    sync_bits: int | None = field(default=None, metadata=flag(
        "bit width of DiLoCo's outer all-reduce (default 32; 4: blockwise 4-bit)", type=int, choices=(4, 16, 32)))
    """Bit width of DiLoCo's outer all-reduce, 4, 16 or 32; None: 32 (the mode's default)."""
    sync_allow_any_every: bool = field(default=False, metadata=flag(
        "price an H above DiLoCo's published envelope (500)"))
    """Price a DiLoCo H above the published envelope (planner.plan.sync.DILOCO_MAX_EVERY)."""
    sync_fragments: int | None = field(default=None, metadata=flag(
        "streaming DiLoCo's fragments, synchronised in turn (default 4)", metavar="F"))
    """Streaming DiLoCo's fragments (planner.plan.sync, option `fragments`); None: the mode's default."""
    sync_delay: int | None = field(default=None, metadata=flag(
        "inner steps each streaming DiLoCo all-reduce overlaps (tau; 0 blocks; default 1)", metavar="TAU"))
    """Streaming DiLoCo's overlap in inner steps (option `delay`); None: the mode's default."""

    def _check_sync(self):
        if isinstance(self.sync, list):
            object.__setattr__(self, "sync", tuple(self.sync))
        modes = (self.sync,) if isinstance(self.sync, str) else self.sync
        if self.sync != "auto":
            if not isinstance(modes, tuple) or not modes:
                raise PartitaError(f"sync must be a mode, a tuple of modes or 'auto'; got {self.sync!r}")
            for mode in modes:
                if why := mode_problem(mode, "sync"):
                    raise PartitaError(why + ", auto")
        every = self.sync_every
        if every is not None and (not _is_int(every) or every < 1):
            raise PartitaError(f"sync-every is DiLoCo's H, the inner steps per outer step: 1 or more; got {every!r}")
        for name, low in (("sync_fragments", 1), ("sync_delay", 0)):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < low):
                raise PartitaError(f"{name.replace('_', '-')} must be a whole number from {low}; got {value!r}")
        if self.sync_bits is not None and self.sync_bits not in (4, 16, 32):
            raise PartitaError(f"sync-bits is the bit width of DiLoCo's outer all-reduce, 4, 16 or 32; got "
                               f"{self.sync_bits!r}")

    def __post_init__(self):
        for name in ("tp", "pp", "dp", "cp", "ep", "zero", "recompute", "sequence_parallel", "micro_batch",
                     "virtual_stages", "tp_comm_overlap", "p2p_overlap"):
            object.__setattr__(self, name, _as_tuple(getattr(self, name)))
        for name in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "virtual_stages"):
            values = getattr(self, name)
            if values is not None and (not values or not all(_is_int(x) and x >= 1 for x in values)):
                got = values[0] if len(values) == 1 else values
                raise PartitaError(f"{name.replace('_', '-')} must be a positive integer, got {got!r}")
        if self.stage_layers is not None:
            self._pin_stages()
        if not self.zero or not all(_is_int(z) and z in ZERO_STAGES for z in self.zero):
            raise PartitaError(f"zero must be ZeRO stages among {ZERO_STAGES}, got {self.zero!r}")
        if not self.recompute or not all(r in RECOMPUTE for r in self.recompute):
            raise PartitaError(f"recompute must be policies among {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        n = self.full_recompute_layers
        if n is not None and not (_is_int(n) and n >= 0):
            raise PartitaError(f"full-recompute-layers must be a number of layers (0 or more), got {n!r}")
        if n and "full" not in self.recompute:
            raise PartitaError(f"full-recompute-layers={n} fixes how many layers recompute in full, but recompute="
                               f"{'|'.join(self.recompute)} leaves out full: allow it (--recompute none,full)")
        if not self.sequence_parallel or not all(isinstance(s, bool) for s in self.sequence_parallel):
            raise PartitaError(f"sequence_parallel must be True and/or False, got {self.sequence_parallel!r}")
        if not isinstance(self.keep_gathered, bool):
            raise PartitaError("keep_gathered must be True (searched per layer) or False (none), got "
                               f"{self.keep_gathered!r}")
        if self.kernels not in KERNELS:
            raise PartitaError(f"kernels must be one of {', '.join(KERNELS)}, got {self.kernels!r}")
        if not isinstance(self.offload, bool):
            raise PartitaError(f"offload must be True (allowed, searched) or False (none), got {self.offload!r}")
        self._check_sync()
        if self.stack is not None and self.stack not in STACKS:
            raise PartitaError(f"stack must be one of {', '.join(STACKS)}, got {self.stack!r}")
        stack = get_stack(self.stack)
        for name, what in (("tp_comm_overlap", "overlap tensor-parallel collectives with GEMMs"),
                           ("p2p_overlap", "overlap pipeline sends with compute")):
            values = getattr(self, name)
            if values is not None and (not values or not all(isinstance(x, bool) for x in values)):
                raise PartitaError(f"{name} must be True and/or False (or None: by the stack), got {values!r}")
            if values and True in values and not getattr(stack, name):
                able = [s.name for s in STACKS.values() if getattr(s, name)]
                raise PartitaError(f"{name.replace('_', '-')}=on: the {stack.name} stack does not {what} "
                                   f"(costmodel.hardware.stacks); stacks that do: {', '.join(able)} (--stack)")

    def _pin_stages(self) -> None:
        """Check `stage_layers` against itself and pp/virtual_stages, then fix those to it (its docstring)."""
        n = _as_tuple(self.stage_layers)
        if not n or not all(_is_int(x) and x >= 0 for x in n):
            raise PartitaError(f"stage-layers must be whole numbers of layers per stage, got {self.stage_layers!r}")
        if 0 in n:
            raise PartitaError(f"stage-layers {','.join(map(str, n))}: stage {n.index(0)} holds no layer; every "
                               "pipeline stage needs at least one (use fewer stages)")
        if self.pp is not None and self.pp != (len(n),):
            raise PartitaError(f"stage-layers {','.join(map(str, n))} gives {len(n)} pipeline stages but pp="
                               f"{'|'.join(map(str, self.pp))}: give one count per stage (or leave pp out)")
        if self.virtual_stages is not None and self.virtual_stages != (1,):
            raise PartitaError(f"stage-layers pins one model chunk per pipeline stage, but virtual stages="
                               f"{'|'.join(map(str, self.virtual_stages))}: leave virtual stages out (or 1)")
        object.__setattr__(self, "stage_layers", n)
        object.__setattr__(self, "pp", (len(n),))
        object.__setattr__(self, "virtual_stages", (1,))

    def fixed(self) -> dict:
        """The choices this space restricts, relative to the full space: {field: values}."""
        full = SearchSpace()
        return {f: getattr(self, f) for f in FIXABLE if getattr(self, f) != getattr(full, f)}


ZERO_STAGES = (0, 1, 2, 3)
FIXABLE = ("tp", "pp", "dp", "cp", "ep", "zero", "recompute", "full_recompute_layers", "offload", "kernels",
           "sequence_parallel", "micro_batch", "virtual_stages", "stack", "tp_comm_overlap", "p2p_overlap", "sync",
           "stage_layers", "sync_every", "sync_bits", "sync_allow_any_every",
           "sync_fragments", "sync_delay")
"""The SearchSpace fields a user fixes (planner.api.plan keywords, `partita plan` flags)."""


def _as_tuple(v):
    """A set of values as a tuple: a list becomes a tuple, a single value a tuple of one; None stays."""
    if v is None or isinstance(v, tuple):
        return v
    return tuple(v) if isinstance(v, list) else (v,)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
