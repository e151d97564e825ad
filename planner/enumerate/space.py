"""What the search may choose: the training configuration, the restricted search space (both in
planner.enumerate.config, re-exported here), and the enumeration of meshes (pp x dp x tp, ZeRO stage, micro-batch size) and pipeline schedules it yields.

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

from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import Cluster
from partita.costmodel.hardware.stacks import get_stack
from partita.planner.enumerate.config import (  # noqa: F401 (re-exported: the config's names moved there)
    BY_DEVICE, FIXABLE, MAX_VIRTUAL_STAGES, SCHEDULE_CHOICES, VIRTUAL_STAGES, ZERO_STAGES, SearchSpace, TrainConfig,
    _ByDevice, deepest_virtual)
from partita.planner.plan import fixed_text  # noqa: F401 (re-exported: the flags of fixed choices)
from partita.planner.plan import MAX_DEVICES, MAX_GLOBAL_BATCH  # noqa: F401 -- what a plan may hold is what is planned
from partita.planner.plan.schedules import AUTO, SCHEDULES, virtual_schedules


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
    if why := _why_no_overlap(train, space) or _why_no_chunks(train, space):
        return why
    if cluster.groups and cluster.heterogeneous:  # enumerated by groups (planner.enumerate.hetero)
        return _why_not_heterogeneous(train, space)
    if why := _why_not_degrees(cluster, space):
        return why
    shapes = _fixed_shapes(cluster, train, space, max_pp, seq)
    if isinstance(shapes, str):
        return shapes
    return _why_no_runs(train, space, shapes, layers)


def _fixed_one(space: SearchSpace, name: str):
    """The one value the space fixes for `name`, else None."""
    return getattr(space, name)[0] if getattr(space, name) and len(getattr(space, name)) == 1 else None


def _why_no_chunks(train: TrainConfig, space: SearchSpace) -> str | None:
    """Why the fixed virtual stages and schedule disagree (chunks without an interleaved schedule, or one
    without chunks); None when they agree."""
    v = space.virtual_stages
    chunked = train.schedule != AUTO and SCHEDULES[train.schedule].virtual
    if v is not None and 1 not in v and train.schedule != AUTO and not chunked:
        return (f"virtual stages {'|'.join(map(str, v))} interleave model chunks, which is the "
                f"{' or '.join(virtual_schedules())} schedule, not {train.schedule}")
    if v is not None and set(v) == {1} and chunked:
        return f"the {train.schedule} schedule needs more than one virtual stage per device (virtual stages > 1)"
    return None


def _why_not_heterogeneous(train: TrainConfig, space: SearchSpace) -> str | None:
    """Why a heterogeneous cluster's search (one chunk per rank, no sp, cp or ep) has nothing; None if not."""
    v = space.virtual_stages
    if False not in space.sequence_parallel:
        return "sequence parallelism is not planned on heterogeneous clusters"
    if (v is not None and 1 not in v) or (train.schedule != AUTO and SCHEDULES[train.schedule].virtual):
        return "interleaved 1F1B is not planned on heterogeneous clusters"
    if (space.cp and max(space.cp) > 1) or (space.ep and max(space.ep) > 1):
        return "context and expert parallelism are not planned on heterogeneous clusters"
    return None


def _why_not_degrees(cluster: Cluster, space: SearchSpace) -> str | None:
    """Why a fixed cp, tp, pp or dp cannot be laid out on the cluster's devices and nodes; None when each can."""
    n, node = cluster.num_devices, cluster.devices_per_node
    tp, pp, dp = _fixed_one(space, "tp"), _fixed_one(space, "pp"), _fixed_one(space, "dp")
    cp = _fixed_one(space, "cp") or 1
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
    return None


def _fixed_shapes(cluster: Cluster, train: TrainConfig, space: SearchSpace, max_pp: int,
                  seq) -> list[tuple[int, int, int]] | str:
    """The (tp, pp, dp) shapes left by the fixed choices, the model's depth, the global batch, ZeRO and
    sequence parallelism, in that order; or why none is left (the first constraint that empties them)."""
    n, gb = cluster.num_devices, train.global_batch
    tp, pp, dp = _fixed_one(space, "tp"), _fixed_one(space, "pp"), _fixed_one(space, "dp")
    cp = _fixed_one(space, "cp") or 1
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
    return shapes


def _why_no_runs(train: TrainConfig, space: SearchSpace, shapes: list[tuple[int, int, int]],
                 layers: int) -> str | None:
    """Why no shape has a micro-batch size and a schedule that runs; None when one has."""
    gb, v = train.global_batch, space.virtual_stages
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
