"""What the search may choose: the training configuration, the restricted search space, and the
enumeration of meshes (pp x dp x tp, ZeRO stage, micro-batch size) and pipeline schedules it yields.

Meshes are pp x dp x tp = number of devices with tp inside a node (tp | devices per node), pp <= layers,
dp | global batch, a ZeRO stage (0-3, only 0 when dp = 1), and micro-batch sizes b | global_batch / dp
giving m = global_batch / (dp b) micro-batches, each within the SearchSpace's restrictions. m may be below pp
(a 2-stage pipeline fed one micro-batch per step): the schedules decide, each by its own rule
(planner.plan.schedules: `refusal`, and `searched` for what --schedule auto tries -- GPipe there).

What-if (DESIGN.md): a user fixes some choices (SearchSpace fields, `partita plan --tp/--pp/...`) and the
rest are searched; `check_space` walks the same constraints one by one before any solving and names, in
one line, the first that a fixed configuration breaks.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from partita.costmodel.errors import PartitaError
from partita.costmodel.price.fusion import KERNELS
from partita.costmodel.price.memory import MASTER_WEIGHTS
from partita.costmodel.hardware import Cluster
from partita.costmodel.hardware.stacks import STACKS, get_stack
from partita.planner.enumerate.options import RECOMPUTE
from partita.planner.plan import fixed_text  # noqa: F401 (re-exported: the flags of fixed choices)
from partita.planner.plan import MAX_DEVICES, MAX_GLOBAL_BATCH  # noqa: F401 -- what a plan may hold is what is planned
from partita.planner.plan.schedules import AUTO, SCHEDULES, virtual_schedules
from partita.planner.plan.sync import mode_problem


SCHEDULE_CHOICES = (AUTO, *SCHEDULES)
"""TrainConfig.schedule and --schedule: "auto" or a schedule of the registry (planner.plan.schedules)."""
VIRTUAL_STAGES = (2, 4)
"""Model chunks per device tried for interleaved 1F1B, beside the deepest the layers allow (deepest_virtual)."""
MAX_VIRTUAL_STAGES = 8


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

    global_batch: int
    """Samples per optimizer step, over all data-parallel replicas and micro-batches."""
    seq_len: int | None = None
    """Tokens per sample; None keeps the model's own."""
    dtype: str = BY_DEVICE
    """"bf16" (bf16 parameters and activations, fp32 master weights) or "fp32". Not given: by the
    cluster's device kind when planned through planner.api (fp32 on CPU, bf16 on accelerators; `BY_DEVICE`)."""
    master_weights: str = "fp32"
    """Where a bf16 model's optimizer keeps its weights: "fp32" (a master copy; with Adam 2 + 2 + 12 bytes of
    state per parameter, ZeRO's mixed precision) or "none" (pure bf16: bf16 parameters, gradients and Adam
    moments, 2 + 2 + 2 + 2 = 8 bytes, as nanotron, some Megatron-LM configurations and torchtitan on a bf16
    model run; costmodel.price.memory). A field beside `dtype`, not a third dtype: the compute dtype is bf16
    either way (every reader of `dtype` -- peaks, captures, exporters -- stays right), and what changes is
    the optimizer's state. "none" needs dtype "bf16" (given, or by device: it then chooses bf16 on CPUs too)."""
    optimizer: str = "adam"
    schedule: str = "auto"
    """Pipeline schedule: "auto" (the planner picks 1F1B or interleaved 1F1B, and GPipe where there are fewer
    micro-batches than stages) or a name of planner.plan.schedules' registry: "1F1B", "GPipe", "Interleaved1F1B"."""
    max_micro_batch: int = 64
    min_micro_batch: int = 1
    """The fewest samples a micro-batch may hold: 2 for a model with a BatchNorm over one value per channel per
    sample, which training refuses on one sample (planner.api sets it from the capture,
    costmodel.capture._note_batch_statistics)."""
    autocast: bool = True
    """How a bf16 plan without FSDP computes: under torch.autocast over fp32 parameters, as partita's
    runtime runs it (True: fp32 parameters, gradients and moments, and the bf16 casts and fp32 activations
    autograd saves; costmodel.capture.trace), or on a bf16 model with fp32 master weights in the optimizer (False:
    Megatron-LM's bf16, for pricing a published run as it ran). FSDP plans (ZeRO-2/3) compute on FSDP2's
    bf16 gathered parameters either way."""

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

    name: str = "partita"
    tp: tuple[int, ...] | None = None
    """Tensor-parallel degrees; None: every divisor of the node size (tensor parallelism stays in a node).
    A fixed degree is priced even where splitting the layers never pays (a searched one is then dropped)."""
    pp: tuple[int, ...] | None = None
    """Pipeline stages; None: every degree up to the number of layers."""
    dp: tuple[int, ...] | None = None
    """Data-parallel degrees; None: whatever tp x pp x cp leaves of the devices (dp = devices / (tp pp cp))."""
    cp: tuple[int, ...] | None = None
    """Context-parallel degrees (each sequence split over cp ranks, planner.enumerate.cp_ep); None: 1, and for
    sequences of cp_ep.CP_SEARCH_MIN_SEQ tokens or more the powers of two cp_ep.default_cp gives."""
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees (a MoE layer's experts sharded over ep of the dp ranks, planner.enumerate.cp_ep);
    None: 1 for dense models, and for MoE models every divisor of dp and of the expert count up to 8."""
    zero: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages to consider: 0 (DDP), 1 (optimizer state sharded: torch's ZeroRedundancyOptimizer, on
    meshes planner.plan.executable.zero_refusal allows unless the user fixes the mesh), 2 and 3 (FSDP2). ZeRO
    shards over data-parallel ranks, so a dp = 1 mesh (where every stage is stage 0) is considered only
    when 0 is in the set."""
    recompute: tuple[str, ...] = RECOMPUTE
    """Activation recompute policies ("none", "selective", "op", "full") a layer may take; one value fixes every
    layer's policy."""
    full_recompute_layers: int | None = None
    """How many of the repeated layers take full recompute, the others one of the other allowed policies
    (Megatron-LM's --recompute-num-layers; fms-fsdp's every k-th block); None: searched per layer. Needs
    "full" among `recompute`. Where the model is not a stack of identical layers it counts every block."""
    offload: bool = True
    """True: offload variants (activations to host, FSDP2 CPU offload of ZeRO-3 states) are allowed and
    searched per layer, alongside not offloading; False: nothing is offloaded. (Forcing every layer to
    offload is rarely feasible and is not what a user pricing their setup means by "offload on".)"""
    kernels: str = "eager"
    """How the operators run (costmodel.price.fusion.KERNELS): "eager", as partita's runtime runs them, or
    "compiled", each block torch.compile'd so its connected elementwise operators and reductions are one
    kernel each (costmodel.price.fusion). A setting, not a choice: the search does not weigh compile time or
    graph breaks. It prices a compiled run (torchtitan's `compile`, fms-fsdp's `use_torch_compile`) beside
    partita's plan, and the runtime compiles each layer of such a plan (runtime.parallel.blocks)."""
    sequence_parallel: tuple[bool, ...] = (False, True)
    """With tp > 1: plain Megatron tensor parallelism (False) and/or with sequence parallelism (True), a
    choice per candidate (every layer of a candidate has the same activation layout, so no layer pays a
    resharding of its neighbour's output; the embeddings and head pay theirs, planner.enumerate.strategies).
    Without False, tp = 1 meshes are not considered (sequence parallelism splits over the tp ranks)."""
    micro_batch: tuple[int, ...] | None = None
    """Micro-batch sizes b (samples per micro-batch per data-parallel rank); None: every divisor of
    global_batch / dp up to TrainConfig.max_micro_batch (a fixed size may exceed that cap)."""
    virtual_stages: tuple[int, ...] | None = None
    """Model chunks per device: 1 is no interleaving, v > 1 interleaved 1F1B with v chunks (so a set
    without 1 implies TrainConfig.schedule "Interleaved1F1B", and pp > 1); None: 1 and VIRTUAL_STAGES as
    the schedule allows."""
    stage_layers: tuple[int, ...] | None = None
    """The repeated layers each pipeline stage holds, first stage first (a pinned split: Megatron-LM's
    --decoder-first-pipeline-num-layers, torchtitan's pipeline split points), summing to the model's layers;
    the prefix (embeddings) stays on the first stage and the suffix (norm, head) on the last. It fixes pp to
    its length and one model chunk per device (virtual_stages 1); the stage program prices exactly these
    counts (planner.solve.milp: sum_o h[s, o] = n_s), its other choices still searched. None: searched."""
    min_pp: bool = False
    """Keep only the smallest pipeline depth that fits (Megatron practice: as few stages as memory allows)."""
    keep_gathered: bool = True
    """In a ZeRO-3 plan a layer may keep its parameters gathered from forward to backward (its own ZeRO-2,
    chosen per layer where memory allows; the runtime's reshard_after_forward=False). False: every ZeRO-3
    layer reshards after its forward and gathers again for its backward, as FSDP's FULL_SHARD runs --
    how a published FULL_SHARD run is priced as it ran (benchmarks.published)."""
    stack: str | None = None
    """The software stack the plan is priced for (costmodel.hardware.stacks): its kernel constants (the cluster's
    devices take that stack's, costmodel.hardware.cluster_on_stack), which overlaps it can run (below) and
    how it runs ZeRO-1 (planner.enumerate.options). None: the cluster's own (a preset's is "pytorch", partita's
    runtime); a plan for another stack ("te-2024": Megatron-Core with Transformer Engine, ...) is priced,
    not run by partita. `search` resolves it (resolve_stack)."""
    tp_comm_overlap: tuple[bool, ...] | None = None
    """Overlap the tensor-parallel collectives of sequence parallelism with the GEMMs they feed (True;
    Megatron-Core's --tp-comm-overlap, torch's async TP) or keep them on the critical path (False), a choice
    per candidate (costmodel.price.streams.tp_overlap prices it). None: by the stack (`overlap_choices`)."""
    p2p_overlap: tuple[bool, ...] | None = None
    """Overlap an interleaved pipeline's sends and receives with the next chunk's compute (True; Megatron-Core's
    --overlap-p2p-communication) or wait for them (False), a choice per candidate. None: by the stack."""
    p2p_scatter_gather: bool = False
    """Price pipeline sends as Megatron-LM runs them with tensor parallelism (Narayanan et al. SC'21, §4.1,
    scatter/gather): each of the t ranks sends 1/t of the boundary activation and the receiving ranks
    all-gather it over the node's links. partita's runtime sends whole tensors (1/t only under sequence
    parallelism), so this is off except when pricing a Megatron-LM configuration (benchmarks)."""
    sync: str | tuple = "auto"
    """How the data-parallel replicas agree on the weights (planner.plan.sync.SYNC_MODES): one mode, a tuple of modes
    the planner chooses the fastest of (planner.estimate.sync.choose), or "auto": every mode. "auto" is the default
    because it is today's synchronous plan wherever there is nothing to trade: on a cluster without islands every
    other mode is refused (DiLoCo has no slow link to save) and the plan is synchronous, byte for byte as before;
    on a cluster with islands the modes are priced against each other."""
    sync_every: int | None = None
    """DiLoCo's H (inner steps per outer step); None: the planner picks it (planner.estimate.sync.DILOCO_EVERY_LADDER)."""
    sync_bits: int | None = None
    """Bit width of DiLoCo's outer all-reduce, 16 or 32; None: 32 (the mode's default)."""
    sync_allow_any_every: bool = False
    """Price a DiLoCo H above the published envelope (planner.plan.sync.DILOCO_MAX_EVERY)."""

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
        if self.sync_bits is not None and self.sync_bits not in (16, 32):
            raise PartitaError(f"sync-bits is the bit width of DiLoCo's outer all-reduce, 16 or 32; got {self.sync_bits!r}")

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
           "stage_layers", "sync_every", "sync_bits", "sync_allow_any_every")
"""The SearchSpace fields a user fixes (planner.api.plan keywords, `partita plan` flags)."""


def resolve_stack(cluster, space: SearchSpace):
    """(cluster, space) priced on one stack: the space's where it names one (the cluster's devices take
    its kernel constants), else the cluster's own; the space then names it."""
    from partita.costmodel.hardware import cluster_on_stack
    stack = space.stack or cluster.device.stack
    if stack != cluster.device.stack:
        cluster = cluster_on_stack(cluster, stack)
    return cluster, dataclasses.replace(space, stack=stack)


def overlap_choices(space: SearchSpace) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """(TP overlap, pipeline-send overlap) values the search tries: the space's where given; by default
    both where the stack runs that overlap (costmodel.hardware.stacks) and partita's runtime does not run the stack
    -- a user pricing a Megatron-Core run gets the overlap it runs --, and none for the stack partita runs:
    its runtime overlaps neither (DTensor's collectives and torch.distributed.pipelining's sends are
    waited for before the next operator), and a plan `partita run` refuses is not what `partita plan`
    should hand back unasked. Asking for one (`--tp-comm-overlap on`) prices it, with a plan note."""
    stack = get_stack(space.stack)
    default = lambda runs: (False, True) if runs and not stack.partita_runs else (False,)
    return (space.tp_comm_overlap if space.tp_comm_overlap is not None else default(stack.tp_comm_overlap),
            space.p2p_overlap if space.p2p_overlap is not None else default(stack.p2p_overlap))


def _as_tuple(v):
    """A set of values as a tuple: a list becomes a tuple, a single value a tuple of one; None stays."""
    if v is None or isinstance(v, tuple):
        return v
    return tuple(v) if isinstance(v, list) else (v,)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def divisors(n: int, up_to: int | None = None) -> list[int]:
    """The divisors of n, ascending, those <= `up_to` only when given: O(min(up_to, sqrt n)) steps, so a
    global batch of 1e12 or a cluster of 1e8 devices costs milliseconds, not hours of range(n)."""
    if up_to is not None and up_to * up_to <= n:
        return [d for d in range(1, up_to + 1) if n % d == 0]
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    found = sorted({*small, *(n // d for d in small)})
    return found if up_to is None else [d for d in found if d <= up_to]


def micro_batch_cap(train: TrainConfig, space: SearchSpace) -> int:
    """The largest micro-batch size the search may consider (`_micro_batch_allowed`)."""
    return train.max_micro_batch if space.micro_batch is None else max(space.micro_batch)


def tp_degrees(cluster: Cluster, space: SearchSpace) -> list[int]:
    """The tensor-parallel degrees the search considers: every divisor of a node's devices, and a fixed degree
    that spans whole nodes (published runs use TP=16 over two 8-GPU nodes), its collectives then priced on
    the inter-node link (costmodel.price.comm.group_for: a group of tp ranks, a node's worth on each node).
    The search itself keeps tp inside a node: its activations' all-reduces on every layer cost more over a
    NIC than any split they buy, so only a user's choice goes beyond."""
    n, node = cluster.num_devices, cluster.devices_per_node
    spanning = sorted(t for t in (space.tp or ()) if t > node and t % node == 0 and n % t == 0)
    return divisors(min(n, node)) + spanning


def _meshes(cluster: Cluster, train: TrainConfig, space: SearchSpace, max_pp: int, cps: tuple[int, ...] = (1,)):
    """Every (pp, dp, tp, ZeRO stage, micro-batch size, micro-batches, cp) the search considers, cp among
    `cps` (the caller's: the space's fixed degrees or cp_ep.default_cp)."""
    n = cluster.num_devices
    for tp in tp_degrees(cluster, space):
        if n % tp or (space.tp is not None and tp not in space.tp):
            continue
        for pp in divisors(n // tp, max_pp):
            if pp > max_pp or (space.pp is not None and pp not in space.pp):
                continue
            for cp in cps:
                if (n // (tp * pp)) % cp:
                    continue
                dp = n // (tp * pp * cp)
                if train.global_batch % dp or (space.dp is not None and dp not in space.dp):
                    continue
                if tp == 1 and (False not in space.sequence_parallel or False not in overlap_choices(space)[0]):
                    continue  # sequence parallelism (and the TP overlap of its collectives) splits over tp ranks
                local = train.global_batch // dp
                for zero in (space.zero if dp * cp > 1 else (0,) if 0 in space.zero else ()):
                    for b in divisors(local, micro_batch_cap(train, space)):
                        m = local // b
                        if _micro_batch_allowed(b, train, space):  # m < pp too: the schedules decide
                            yield pp, dp, tp, zero, b, m, cp


def _micro_batch_allowed(b: int, train: TrainConfig, space: SearchSpace) -> bool:
    if b < train.min_micro_batch:
        return False
    return b <= train.max_micro_batch if space.micro_batch is None else b in space.micro_batch


def _schedules(requested: str, pp: int, m: int, layers: int,
               virtual: tuple[int, ...] | None = None) -> list[tuple[str, int]]:
    """(schedule, virtual stages) pairs to try: the requested schedule, or under "auto" every one of the
    registry `searched` for (m, pp) (GPipe only where m < pp); a schedule of chunks with v among `virtual`
    (None: VIRTUAL_STAGES and the deepest), the others with v = 1 when `virtual` allows it; each within its
    refusal rule (planner.plan.schedules: 1F1B needs m >= pp, interleaving m divisible by pp and at least v
    layers per device)."""
    plain_ok = virtual is None or 1 in virtual
    if pp == 1:
        return [("1F1B", 1)] if plain_ok else []
    tried = (tuple(sorted({*VIRTUAL_STAGES, deepest_virtual(pp, layers)} - {1})) if virtual is None
             else tuple(v for v in virtual if v > 1))
    names = [n for n, s in SCHEDULES.items() if s.searched(m, pp)] if requested == AUTO else [requested]
    return [(n, v) for n in names for v in (tried if SCHEDULES[n].virtual else (1,) if plain_ok else ())
            if SCHEDULES[n].refusal(m, pp, v, layers) is None]


def describe_fixed(space: SearchSpace) -> str:
    """The space's fixed choices as a user wrote them: "tp=2, pp=2, zero=3, recompute=full"."""
    return fixed_text(space.fixed())


def check_scale(cluster: Cluster) -> None:
    """PartitaError, before any capture, for a cluster beyond MAX_DEVICES."""
    if cluster.num_devices > MAX_DEVICES:
        raise PartitaError(f"the cluster has {cluster.num_devices:,} devices, beyond what partita plans: at most "
                           f"{MAX_DEVICES:,} (2^20)")


def check_space(cluster: Cluster, train: TrainConfig, space: SearchSpace, *, max_pp: int, layers: int,
                seq: int | None) -> None:
    """Raise PartitaError, one line saying why, when the fixed choices of `space` leave no mesh and
    schedule to price -- before any solving. `max_pp`: the most stages the model splits into; `layers`:
    its repeated layers (0 when it is not a stack of them: no interleaving); `seq`: tokens per sample
    (None: not a sequence model). Whether a configuration fits in memory is the search's to say."""
    why = stage_layers_refusal(space.stage_layers, layers) or _why_nothing(cluster, train, space, max_pp, layers, seq)
    if why is None and layers and (space.full_recompute_layers or 0) > layers:
        why = (f"full-recompute-layers={space.full_recompute_layers} but the model has {layers} repeated layers: "
               f"fix at most {layers}")
    homogeneous = not (cluster.groups and cluster.heterogeneous)
    if why is None and homogeneous and not any(_schedules(train.schedule, pp, m, layers, space.virtual_stages)
                                               for pp, dp, tp, zero, b, m, cp
                                               in _meshes(cluster, train, space, max_pp, space.cp or (1,))):
        why = f"no mesh of the {cluster.num_devices} devices has {describe_fixed(space) or 'the requested choices'}"
    if why:
        raise PartitaError(why)


def stage_layers_refusal(stage_layers: tuple[int, ...] | None, layers: int) -> str | None:
    """Why a pinned split (SearchSpace.stage_layers) does not fit a model of `layers` repeated layers (0: not
    a stack of identical layers); None when it does."""
    if stage_layers is None:
        return None
    split = ",".join(map(str, stage_layers))
    if not layers:
        return (f"stage-layers {split} counts repeated layers, and the model is not a stack of identical layers: "
                "leave the split to the planner (--pp N)")
    if sum(stage_layers) != layers:
        return (f"stage-layers {split} places {sum(stage_layers)} layers but the model has {layers} repeated "
                f"layers: the counts must sum to {layers}")
    return None


def no_candidates_reason(cluster: Cluster, train: TrainConfig, space: SearchSpace, kinds: set[str] = frozenset()) -> str:
    """Why a search found no candidate although check_space passed (or was not asked); `kinds`: the operator
    kinds of the model's repeated layers (OpGraph node "kind")."""
    fixed_tp = space.tp is not None and min(space.tp) > 1
    if fixed_tp and any(k.startswith("conv") for k in kinds) and "linear" not in kinds:
        tp = "|".join(map(str, space.tp))
        return (f"--tp {tp}: tensor parallelism splits Linear layers (Megatron's column/row split) and the model's "
                f"repeated layers have none: their {', '.join(sorted(k for k in kinds if k.startswith('conv')))} operators "
                "get no tensor-parallel split in partita; use --tp 1 (data parallelism, ZeRO or a pipeline "
                "spread a CNN over devices)")
    if fixed_tp:
        sp = " with sequence parallelism" if False not in space.sequence_parallel else ""
        return (f"the model's layers cannot be split over tp={'|'.join(map(str, space.tp))} tensor-parallel "
                f"ranks{sp} (their heads or hidden sizes are not divisible by it): choose another --tp")
    return (f"no mesh of {cluster.num_devices} devices divides global batch {train.global_batch}"
            + (f" with {describe_fixed(space)}" if space.fixed() else "")
            + f": choose a global batch divisible by the data-parallel degree (e.g. a multiple of "
            f"{cluster.num_devices})")


def _why_nothing(cluster, train, space, max_pp, layers, seq) -> str | None:
    """The funnel of _meshes and _schedules, constraint by constraint, naming the first that leaves
    nothing; None when something is left."""
    if why := _why_no_overlap(train, space):
        return why
    v = space.virtual_stages
    chunked = train.schedule != AUTO and SCHEDULES[train.schedule].virtual
    if v is not None and 1 not in v and train.schedule != AUTO and not chunked:
        return (f"virtual stages {'|'.join(map(str, v))} interleave model chunks, which is the "
                f"{' or '.join(virtual_schedules())} schedule, not {train.schedule}")
    if v is not None and set(v) == {1} and chunked:
        return f"the {train.schedule} schedule needs more than one virtual stage per device (virtual stages > 1)"
    if cluster.groups and cluster.heterogeneous:  # enumerated by groups (planner.enumerate.candidates)
        if False not in space.sequence_parallel:
            return "sequence parallelism is not planned on heterogeneous clusters"
        if (v is not None and 1 not in v) or chunked:
            return "interleaved 1F1B is not planned on heterogeneous clusters"
        if (space.cp and max(space.cp) > 1) or (space.ep and max(space.ep) > 1):
            return "context and expert parallelism are not planned on heterogeneous clusters"
        return None
    n, node, gb = cluster.num_devices, cluster.devices_per_node, train.global_batch
    one = lambda name: getattr(space, name)[0] if getattr(space, name) and len(getattr(space, name)) == 1 else None
    tp, pp, dp = one("tp"), one("pp"), one("dp")
    cp = one("cp") or 1
    if cp > 1 and (n % cp or cp > n):
        return f"cp={cp} does not divide the {n} devices"
    if tp is not None and tp > n:
        return f"tp={tp} exceeds the cluster's {n} devices"
    if tp is not None and tp > node and (tp % node or n % tp):
        return (f"tp={tp} spans nodes of {node} devices, so it must be a whole number of nodes that divides the "
                f"{n} devices (e.g. tp={2 * node}), each node holding {node} of its ranks")
    if tp is not None and tp <= node and node % tp:
        return f"tp={tp} does not divide the {node} devices per node (a tensor-parallel group within a node)"
    for name, x in (("pp", pp), ("dp", dp)):
        if x is not None and (x > n or n % x):
            return f"{name}={x} does not divide the {n} devices"
    shapes = [(t, p, n // (t * p * cp)) for t in tp_degrees(cluster, space) for p in _pp_choices(n // t, max_pp, space, cp)
              if (n // (t * p)) % cp == 0]
    shapes = [s for s in shapes if all(getattr(space, k) is None or x in getattr(space, k)
                                       for k, x in zip(("tp", "pp", "dp"), s))]
    if not shapes:
        named = [(k, x) for k, x in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp if cp > 1 else None))
                 if x is not None]
        prod = math.prod(x for _, x in named)
        expr = f"{' x '.join(k for k, _ in named)} = {' x '.join(str(x) for _, x in named)} = {prod}"
        if len(named) >= 3 and all(x is not None for x in (tp, pp, dp)):
            return f"{expr}, but the cluster has {n} devices"
        if named and n % prod:
            return f"{expr} does not divide the {n} devices"
        return f"no tp x pp x dp mesh of the {n} devices has {describe_fixed(space)}"
    if not (kept := [s for s in shapes if s[1] <= max_pp]):
        p = min(s[1] for s in shapes)
        return (f"pp={p} exceeds the model's {max_pp} layers (a pipeline stage holds at least one)" if pp else
                f"{describe_fixed(space)} leaves pp={p} pipeline stages, more than the model's {max_pp} layers")
    if not (shapes := [s for s in kept if gb % s[2] == 0]):
        d = min(s[2] for s in kept)
        return (f"dp={d} does not divide the global batch {gb}: choose a global batch divisible by the "
                f"data-parallel degree (e.g. a multiple of {d})")
    if 0 not in space.zero and not (shapes := [s for s in shapes if s[2] * cp > 1]):
        return (f"ZeRO-{min(space.zero)} shards model states over data-parallel ranks and needs dp > 1, "
                f"but the fixed choices ({describe_fixed(space)}) leave dp=1")
    if False not in space.sequence_parallel:
        if not (before := [s for s in shapes if s[0] > 1]):
            return "sequence parallelism splits activations over tensor-parallel ranks and needs tp > 1"
        if seq and not (shapes := [s for s in before if seq % s[0] == 0]):
            return (f"sequence parallelism splits the {seq}-token sequence over tp ranks, and {seq} is not "
                    f"divisible by tp={'|'.join(str(t) for t in sorted({s[0] for s in before}))}")
    runs = [(t, p, d, b, gb // d // b) for t, p, d in shapes for b in divisors(gb // d, micro_batch_cap(train, space))
            if _micro_batch_allowed(b, train, space)]
    if not runs and train.min_micro_batch > 1 and (space.micro_batch is None or
                                                   min(space.micro_batch) < train.min_micro_batch):
        d = shapes[0][2]
        return (f"the model normalises over the batch (a BatchNorm over one value per channel per sample), so a "
                f"micro-batch needs at least {train.min_micro_batch} samples; "
                + (f"micro-batch {'|'.join(map(str, space.micro_batch))} is fixed: fix {train.min_micro_batch} or "
                   "more" if space.micro_batch else
                   f"global batch / dp = {gb} / {d} leaves {gb // d} per data-parallel rank: a larger global "
                   "batch, or fewer data-parallel ranks"))
    if not runs:
        t, p, d = shapes[0]
        return (f"micro-batch {'|'.join(map(str, space.micro_batch))} does not divide global batch / dp = "
                f"{gb} / {d} = {gb // d} samples per data-parallel rank")
    if not any(_schedules(train.schedule, p, m, layers, v) for t, p, d, b, m in runs):
        if train.schedule != AUTO and not SCHEDULES[train.schedule].virtual:
            return _why_not_plain(runs, train.schedule)
        return _why_no_interleaving(runs, layers, v, train.schedule)
    return None


def _why_no_overlap(train: TrainConfig, space: SearchSpace) -> str | None:
    """Why an overlap the space fixes on has nothing to overlap; None when it can run."""
    tp_overlap, p2p_overlap = overlap_choices(space)
    if False not in tp_overlap:
        if False in space.sequence_parallel and True not in space.sequence_parallel:
            return ("tp-comm-overlap=on overlaps sequence parallelism's all-gathers and reduce-scatters with the "
                    "GEMMs they feed (Megatron-Core and torch's async TP overlap no other): it needs "
                    "--sequence-parallel on, or searched")
        if space.tp is not None and max(space.tp) == 1:
            return "tp-comm-overlap=on overlaps tensor-parallel collectives: it needs tp > 1"
    if False not in p2p_overlap:
        if (train.schedule != AUTO and not SCHEDULES[train.schedule].virtual) or space.virtual_stages == (1,) \
                or space.pp == (1,):
            return ("p2p-overlap=on overlaps an interleaved pipeline's sends with the next chunk's compute "
                    "(Megatron-Core's --overlap-p2p-communication runs with interleaved 1F1B only): it needs "
                    "pp > 1 and the Interleaved1F1B schedule (virtual stages > 1)")
    return None


def _pp_choices(devices: int, max_pp: int, space: SearchSpace, cp: int) -> list[int]:
    """Pipeline degrees over `devices` (those left by tp) worth a message: up to the model's `max_pp` layers,
    and those the fixed pp or dp imply (a too-deep one is then named)."""
    ps = set(divisors(devices, max_pp)) | {x for x in space.pp or () if devices % x == 0}
    ps |= {devices // (d * cp) for d in space.dp or () if devices % (d * cp) == 0}
    return sorted(ps)


def _why_not_plain(runs, requested: str) -> str:
    """Why no run takes the requested one-chunk schedule: its own refusal (planner.plan.schedules) for the
    run closest to what it needs, the one with the most micro-batches per stage (1F1B: m >= pp)."""
    record = SCHEDULES[requested]
    t, p, d, b, m = max((r for r in runs if r[1] > 1), key=lambda r: r[4] / r[1], default=runs[0])
    return record.refusal(m, p) or f"no mesh runs {record.name}"


def _why_no_interleaving(runs, layers: int, v: tuple[int, ...] | None, requested: str = AUTO) -> str:
    """Why no run takes a schedule of model chunks: the pipeline or layers missing, else the schedule's own
    refusal (planner.plan.schedules) for the closest run."""
    piped = [r for r in runs if r[1] > 1]
    if not piped:
        return "interleaved 1F1B needs pipeline stages (pp > 1)"
    if layers == 0:
        return "interleaved 1F1B is planned only for models that are a stack of repeated layers"
    record = SCHEDULES[requested if requested != AUTO and SCHEDULES[requested].virtual else "Interleaved1F1B"]
    chunks = min((x for x in v or VIRTUAL_STAGES if x > 1), default=2)
    runnable = [r for r in piped if record.refusal(r[4], r[1], chunks) is None]
    if not runnable:
        t, p, d, b, m = piped[0]
        return record.refusal(m, p, chunks)
    p = min(r[1] for r in runnable)
    m = next(r[4] for r in runnable if r[1] == p)
    return record.refusal(m, p, chunks, layers) or f"no mesh runs {record.name} with {chunks} model chunks per device"
