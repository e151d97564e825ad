"""One call: planner.plan(model, cluster=..., train=TrainConfig(...)) -> Plan.

What-if: fixed choices restrict the search and leave the rest searched, given as a SearchSpace or as
keywords naming its fields (a single value fixes it):

    planner.plan("gpt3-175b", cluster="128x8xA100-80GB", train=TrainConfig(global_batch=1536),
                 tp=8, pp=16, dp=8, recompute="full")
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import TYPE_CHECKING

from partita.costmodel.errors import InfeasibleError, PartitaError
from partita.costmodel.hardware import Cluster, parse_cluster
from partita.costmodel.hardware.resources import with_allocator_headroom
from partita.costmodel.capture import cache as capture_cache, capture
from partita.planner.estimate.build import build_plan
from partita.planner.enumerate.candidates import split_model, use_block_program
from partita.planner.plan import Plan
from partita.planner.plan.planset import PlanSet, Size
from partita.planner.search import SearchResult, TrainConfig, search
from partita.planner.enumerate.space import FIXABLE, SearchSpace, _ByDevice, check_scale, check_space, describe_fixed

if TYPE_CHECKING:
    from partita.costmodel import ModelSpec

# torch loads with the first model this module resolves, builds or captures: a plan whose capture is cached
# (costmodel.capture.cache) runs without it


_LOSS_FN_ALONE = ("loss_fn goes with an nn.Module and its example_inputs; a model factory returns its own as "
                  "(module, example_inputs, loss_fn), and a MODEL string's model has its loss")


def _spec_for(model, example_inputs, loss_fn=None) -> ModelSpec:
    import torch.nn as nn

    from partita.costmodel import ModelSpec, resolve_model
    if loss_fn is not None and not isinstance(model, nn.Module):
        raise PartitaError(_LOSS_FN_ALONE)
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return resolve_model(model)
    if isinstance(model, nn.Module):
        if example_inputs is None:
            raise PartitaError("planning an nn.Module needs example_inputs (a tuple of tensors for forward)")
        inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        return ModelSpec(name=type(model).__name__, build=lambda: model, loss_fn=loss_fn,
                         example_inputs=lambda batch: tuple(t[:1].expand(batch, *t.shape[1:]) for t in inputs))
    if callable(model):  # a model factory, as `package.module:factory` names one: (module, inputs[, loss_fn])
        from partita.costmodel.models.registry import factory_spec
        return factory_spec(model, getattr(model, "__qualname__", "model"))
    raise PartitaError(f"model must be a preset name, a ModelSpec, an nn.Module or a model factory returning "
                       f"(module, example_inputs[, loss_fn]), got {type(model).__name__}")


def plan_search(model, example_inputs=None, *, cluster: str | Cluster, train: TrainConfig,
                progress=None, baselines: bool = False, space: SearchSpace | None = None,
                sparse=None, memory_headroom: float | None = None, loss_fn=None,
                **fixed) -> tuple[SearchResult | None, Plan]:
    """Capture, cost and search; returns the search (every candidate, for notebooks) and the chosen Plan.

    `space` and the keywords `fixed` (SearchSpace fields: tp, pp, dp, zero, recompute, offload,
    sequence_parallel, micro_batch, virtual_stages) restrict the search; a restriction no configuration
    meets raises PartitaError saying why, before any solving, and one that does not fit in memory an
    InfeasibleError with the memory it needs. `memory_headroom`: the fraction of each device's memory
    (after the CUDA context and NCCL reserve) plans leave free for the caching allocator; None keeps the
    device's (costmodel.hardware.DEFAULT_ALLOCATOR_HEADROOM for the presets).

    A model with embedding tables (nn.EmbeddingBag) is planned by planner.sparse.rec_plan, its sparse part from
    `sparse` (a rec_plan.SparseInputs: data sample or Zipf skew, fixed table shardings); the search
    result is then None. `model`: a MODEL string, a ModelSpec, an nn.Module with `example_inputs` (and `loss_fn`),
    or a factory returning (module, example_inputs[, loss_fn]), as `package.module:factory` does."""
    space = _space_for(space, fixed)
    # a MODEL string whose capture may be on disk is resolved only if it is not (the resolved spec imports torch)
    if loss_fn is not None and isinstance(model, str):  # before the capture cache, which never resolves the name
        raise PartitaError(_LOSS_FN_ALONE)
    cached = sparse is None and capture_cache.cacheable(model)
    spec = None if cached else _resolved(model, example_inputs, train, loss_fn)
    cl = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    check_scale(cl)
    cl = with_allocator_headroom(cl, memory_headroom)
    if isinstance(train.dtype, _ByDevice):  # no dtype given: the device kind's, as the CLI chooses it
        train = dataclasses.replace(train, dtype="bf16" if train.master_weights == "none" else default_dtype(cl))
    t0 = time.perf_counter()
    autocast = "cpu" if _on_cpus(cl) else "cuda"  # a bf16 plan without FSDP runs under autocast, with these lists
    key = capture_cache.key(model, seq=train.seq_len, dtype=train.dtype, autocast=autocast) if spec is None else None
    hit = capture_cache.load(key)
    if hit is not None:
        graph, name, config, fingerprint = hit.graph, hit.name, hit.config, hit.fingerprint
    else:
        spec = spec or _resolved(model, example_inputs, train, loss_fn)
        fingerprint, tables = _fingerprint_and_tables(spec)
        if tables or sparse is not None:
            return None, _plan_tables(spec, tables, cl, train, space, sparse, fingerprint, progress, baselines)
        graph = capture(spec, dtype=train.dtype, autocast=autocast)
        capture_cache.store(key, graph, name=spec.name, config=spec.config, fingerprint=fingerprint)
        name, config = spec.name, spec.config
    if graph.g.graph.get("min_micro_batch", 1) > train.min_micro_batch:  # a BatchNorm over the batch alone
        train = dataclasses.replace(train, min_micro_batch=graph.g.graph["min_micro_batch"])
    prefix, layers, suffix = split_model(graph)
    blocks = use_block_program(graph, prefix, layers, suffix)
    check_space(cl, train, space, max_pp=len(graph.groups) if blocks else max(1, len(layers)),
                layers=0 if blocks else len(layers), seq=graph.seq_len)
    try:
        result = search(graph, cl, train, progress=progress, space=space)
    except InfeasibleError as e:
        if not space.fixed():
            raise
        raise InfeasibleError(f"with {describe_fixed(space)} fixed, {e}") from None
    p = _annotated(build_plan(result, name, fingerprint, config), graph, cl, train, space, baselines)
    p.solver["total_s"] = time.perf_counter() - t0
    return result, p


def _annotated(p: Plan, graph, cl, train: TrainConfig, space: SearchSpace, baselines: bool) -> Plan:
    """The plan with what the search knows beside it: the batch coupling, the fixed choices, the baselines."""
    if graph.g.graph.get("batch_coupled"):  # said before training (planner.plan.explain.batch_coupling_warning)
        p.model["batch_coupled"] = graph.g.graph["batch_coupled"]
    if space.fixed():
        p.solver["fixed"] = {k: list(v) if isinstance(v, tuple) else v for k, v in space.fixed().items()}
    if baselines:
        from partita.planner.estimate.baselines import run_baselines
        p.baselines = run_baselines(graph, cl, train, space.kernels, space.stack)
    return p


def _resolved(model, example_inputs, train: TrainConfig, loss_fn=None) -> ModelSpec:
    """`model` as a ModelSpec at the sequence length `train` asks for."""
    from partita.costmodel.models import with_seq
    return with_seq(_spec_for(model, example_inputs, loss_fn), train.seq_len)


def _fingerprint_and_tables(spec: ModelSpec) -> tuple[str, list]:
    """The fingerprint the runtime checks, of the model built on meta as it builds it, and its embedding tables."""
    from partita.costmodel import model_fingerprint
    from partita.costmodel.models.meta import meta_build
    from partita.costmodel.sparse.embeddings import find_tables
    meta = meta_build(spec.build)
    return model_fingerprint(meta), find_tables(meta)


def plan(model, example_inputs=None, *, cluster: str | Cluster, train: TrainConfig, progress=None,
         baselines: bool = False, space: SearchSpace | None = None, sparse=None,
         memory_headroom: float | None = None, loss_fn=None, **fixed) -> Plan:
    """Capture `model`, cost it for `cluster`, and return the fastest plan that fits (see DESIGN.md),
    within `space` and the fixed choices (plan_search): `plan(..., tp=8, pp=16, zero=0)`;
    `memory_headroom=0.1` leaves 10% of each device's memory to the allocator (plan_search)."""
    return plan_search(model, example_inputs, cluster=cluster, train=train, progress=progress,
                       baselines=baselines, space=space, sparse=sparse,
                       memory_headroom=memory_headroom, loss_fn=loss_fn, **fixed)[1]


def _plan_tables(spec, tables, cluster, train, space, sparse, fingerprint, progress, baselines) -> Plan:
    """A model with embedding tables: planner.sparse.rec_plan (the dense part replicated or sharded over every rank,
    chosen with the tables' placement; `--zero 0` or `--zero 3` fixes that choice)."""
    from partita.planner.sparse.rec_plan import DENSE_ZERO, SparseInputs, plan_rec
    if not tables:
        raise PartitaError(f"--data, --zipf, --pooling, --sparse-optimizer, --embedding-sharding and --embedding-costs "
                           f"apply to models with embedding tables (nn.EmbeddingBag); {spec.name} has none")
    fixed = space.fixed()
    if set(fixed) - {"zero"} or not set(space.zero) & set(DENSE_ZERO) or baselines:
        raise PartitaError(f"{spec.name} has embedding tables: its dense part is planned over every rank, replicated "
                           "or sharded (--zero 0 or --zero 3 fixes which), so the other dense what-if flags and "
                           "--baselines do not apply; fix tables with --embedding-sharding "
                           "TABLE=SHARDING[:K][@PLACEMENT]")
    zero = tuple(z for z in DENSE_ZERO if z in space.zero)
    return plan_rec(spec, tables, cluster, train, sparse or SparseInputs(), fingerprint, progress, dense_zero=zero)


def _on_cpus(cluster: Cluster) -> bool:
    return all(g.device.name == "cpu" for g in cluster.group_list())


def default_dtype(cluster: Cluster) -> str:
    """The training dtype when none is given: fp32 on CPUs (no fast bf16 there, and the runtime's fp32
    numerics are what `--verify` checks), bf16 on accelerators (mixed precision, as they train). A pure-bf16
    TrainConfig (master_weights "none") is bf16 wherever it runs."""
    return "fp32" if _on_cpus(cluster) else "bf16"


def _space_for(space: SearchSpace | None, fixed: dict) -> SearchSpace:
    """`space` (default: the full space) with the keyword restrictions applied over it."""
    unknown = sorted(set(fixed) - set(FIXABLE))
    if unknown:
        raise TypeError(f"plan() got unexpected keyword argument(s) {', '.join(unknown)}; "
                        f"the choices it fixes are {', '.join(FIXABLE)}")
    return dataclasses.replace(space or SearchSpace(), **fixed)


def _fingerprint(spec: ModelSpec) -> str:
    """The fingerprint the runtime checks, from the model built the same way (runtime.launcher.checks.build_meta:
    on the meta device, ~10x faster than under fake mode)."""
    return _fingerprint_and_tables(spec)[0]


def plan_set(model, example_inputs=None, *, cluster: str | Cluster, train: TrainConfig, nnodes: tuple[int, int],
             progress=None, space: SearchSpace | None = None, memory_headroom: float | None = None,
             mtbf_h: float | None = None, storage_bw: float | None = None, restart_s: float | None = None,
             snapshot_bw: float | None = None, **fixed) -> PlanSet:
    """One plan per node count from nnodes = (MIN, MAX), for an elastic job: `cluster` is the full allocation (MAX
    nodes); each smaller size keeps its node shape and the global batch (more accumulation on fewer ranks). The
    model is captured once and searched per size. A size no plan fits is kept with the reason; `mtbf_h`, the job's
    mean hours between interruptions at the full size, adds each size's checkpoint interval and expected time lost
    (planner.estimate.resilience; a job of N nodes fails N/MAX as often)."""
    lo, hi = nnodes
    cl = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    _check_nnodes(cl, lo, hi)
    result, full = plan_search(model, example_inputs, cluster=cl, train=train, progress=progress, space=space,
                               memory_headroom=memory_headroom, **fixed)
    if result is None:
        raise PartitaError("plan sets (--nnodes) are for dense models; a model with embedding tables is planned for "
                           "one cluster size")
    sizes = [_size_of_set(result, full, n) for n in range(lo, hi)] + [Size(hi, full)]
    if mtbf_h is not None:
        from partita.planner.estimate import resilience
        for s in sizes:
            if s.plan is not None:
                mtbf_s = mtbf_h * resilience.HOUR * hi / s.nodes
                s.resilience = resilience.price_plan(s.plan, nodes=s.nodes, mtbf_s=mtbf_s, storage_bw=storage_bw,
                                                     restart_s=restart_s, cluster=cl, snapshot_bw=snapshot_bw)
                s.plan.predicted["resilience"] = s.resilience.to_dict()
    return PlanSet(sizes)


def _check_nnodes(cl: Cluster, lo: int, hi: int) -> None:
    if not 1 <= lo <= hi:
        raise PartitaError(f"--nnodes {lo}:{hi}: MIN must be at least 1 and at most MAX")
    if cl.groups or cl.islands > 1:
        raise PartitaError("--nnodes plans one kind of node on one fabric; a resource list of several groups or a "
                           "cluster of islands is planned for one size (leave out --nnodes)")
    if hi != cl.nodes:
        raise PartitaError(f"--nnodes {lo}:{hi} and --cluster {cl.spec!r} ({cl.nodes} node(s)) disagree: the cluster "
                           f"is the full allocation, so MAX must be its node count (or give --cluster with {hi} nodes)")


def _size_of_set(result: SearchResult, full: Plan, nodes: int) -> Size:
    """The plan for `nodes` nodes of the captured model in `result`, or why none fits."""
    cl = result.cluster
    spec = re.sub(r"^\d+x(?=\d+x)", f"{nodes}x", cl.spec) if re.match(r"^\d+x\d+x", cl.spec) else \
        f"{cl.spec} ({nodes} of {cl.nodes} nodes)"
    smaller = dataclasses.replace(cl, nodes=nodes, spec=spec)
    try:
        found = search(result.graph, smaller, result.train, space=result.space)
    except PartitaError as e:
        return Size(nodes, None, why=str(e))
    p = build_plan(found, full.model["name"], full.model.get("fingerprint", ""), full.model.get("config", {}))
    if full.solver.get("fixed"):
        p.solver["fixed"] = full.solver["fixed"]
    return Size(nodes, p)
