"""Run a plan with embedding tables through TorchRec (the one module that imports it; `partita[rec]`).

The model is split once by torch.fx, with its `nn.EmbeddingBag` tables as leaves (a recommendation model's
table inputs never depend on table outputs):

    ids(inputs)              -> the inputs of every table (the IDs, sliced from the batch as the model does)
    dense(inputs, pooled...) -> the model's output, each table call replaced by its pooled vectors

The tables become one TorchRec EmbeddingBagCollection (one feature per table), sharded by the plan's
`embeddings` section (table_wise, column_wise, row_wise, table_row_wise, data_parallel on the listed ranks:
TorchRec's ParameterSharding, `sharding_plan`) and wrapped in DistributedModelParallel with a fused
optimizer (FBGEMM's EXACT_SGD / EXACT_ROWWISE_ADAGRAD / ADAM); the dense part is data-parallel (DDP, as
partita runs a dp plan) or, where the plan shards it (zero_stage 3), FSDP2 over every rank, with the plan's
dense optimizer, and so are data_parallel tables (TorchRec's "dense" kernel leaves their optimizer to the user).

A TorchRec model (costmodel.sparse.kjt.KJTModel: an EmbeddingBagCollection and a KeyedJaggedTensor input) is not
split: DistributedModelParallel shards its collections in place and wraps the rest in DDP, as TorchRec users
run it (shard_collections). Under a sharded dense plan each part of the model without a collection is its own
FSDP2 unit; the collection keeps its data_parallel tables in its own DDP, and what neither holds has its
gradients averaged by hand after the backward (replicated_by_hand).

Gradients: each rank's loss is the mean over its b = B / R samples. DDP (or FSDP2's reduce-scatter) averages
dense gradients over the ranks, which gives the gradient of the mean over B, and TorchRec's backward all-to-all and reduce-scatter
divide the pooled gradients they sum by R (torchrec.distributed.comm_ops' gradient division, on by
default), so a sharded table gets the same: the run trains what single-process training on the global
batch trains. `--verify` checks it step by step (losses within the fp32 tolerance) and, after the last
step, every rank's table pieces against the reference's tables (a piece the run never updated, or updated
at another scale, is off by a large part of the reference's change).

On CPU (gloo) every table runs FBGEMM's CPU kernel ("fused"): the UVM and UVM-caching kernels of a host or
cache placement need a GPU, so a plan that places tables there says so in one line and runs them from
memory; on GPUs the plan's placements become TorchRec's compute kernels and cache load factors.
"""
from __future__ import annotations

import contextlib
import copy
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from partita.costmodel import PartitaError, model_fingerprint
from partita.costmodel.sparse.embeddings import find_tables, table_modules
from partita.planner.plan import Plan, PlanError
from partita.runtime.parallel.apply import average_grads
from partita.runtime.loop.console import STDOUT
from partita.runtime.data import derived_seed
from partita.runtime.rec.shard import (ADAGRAD_EPS, replicated_by_hand, require_torchrec, shard, split,
                                               table_key, table_of)

__all__ = ["build", "check", "replicated_by_hand", "require_torchrec", "run", "split", "table_key"]

FP32_TOLERANCE = 1e-5
PARAM_TOLERANCE = 1e-3
"""Of the reference's largest change to a table (elementwise, after the run): a piece never updated is off by 1."""


_DENSE_ONLY = ("eval_data", "hang_timeout", "checkpoint_dir", "resume", "save_final", "data", "sync_batchnorm",
               "weight_decay", "warmup_steps", "lr_decay", "min_lr_ratio", "clip_grad_norm")
"""RunOptions that TorchRec's loop (`run`) does not apply: refused when given rather than ignored."""


def dense_only(opts) -> list[str]:
    """The flags of `_DENSE_ONLY` set away from their defaults, as `partita run` spells them."""
    from dataclasses import fields
    defaults = {f.name: f.default for f in fields(opts)}
    return [f"--{name.replace('_', '-')}" for name in _DENSE_ONLY if getattr(opts, name) != defaults[name]]


def check(plan: Plan, spec, world: int) -> list[str]:
    """The plan against the model and world size, before any process group; notes worth printing."""
    if world != plan.mesh.world_size:
        raise PlanError(f"plan is for {plan.mesh.world_size} ranks but WORLD_SIZE is {world}")
    with torch.device("meta"):
        model = spec.build()
    want = plan.model.get("fingerprint")
    if want is not None and want != (got := model_fingerprint(model)):
        raise PlanError(f"plan was made for model {plan.model.get('name')!r} with fingerprint {want}, but --model "
                        f"{spec.name} has fingerprint {got} (different parameters)")
    have = {t.name: t for t in find_tables(model)}
    plain = [n for n, t in have.items() if not t.key]
    if plain and len(plain) < len(have):
        raise PlanError(f"--model {spec.name} holds TorchRec EmbeddingBagCollections and plain nn.EmbeddingBag tables "
                        f"({plain[0]}); partita runs one kind per model: put {plain[0]} in a collection")
    planned = {t["name"]: t for t in plan.embeddings["tables"]}
    if set(have) != set(planned):
        raise PlanError(f"the plan's tables ({', '.join(sorted(planned)[:4])} ...) are not --model {spec.name}'s "
                        f"({', '.join(sorted(have)[:4])} ...)")
    for name, t in planned.items():
        if (t["rows"], t["dim"]) != (have[name].rows, have[name].dim):
            raise PlanError(f"table {name} is {have[name].rows} x {have[name].dim} in --model {spec.name}, "
                            f"{t['rows']} x {t['dim']} in the plan")
    require_torchrec()
    elsewhere = [t["name"] for t in planned.values() if t.get("placement", "hbm") != "hbm"]
    if elsewhere and not torch.cuda.is_available():
        return [f"{len(elsewhere)} table(s) placed in host memory or an HBM cache ({elsewhere[0]} ...) run from "
                "memory here: UVM kernels need a GPU"]
    return []


# ----------------------------------------------------------------------------------------- training

def build(spec, device: torch.device, tables: bool) -> nn.Module:
    """The model, the same on every rank (seeded). `tables` False: its tables are built on the meta device --
    each rank then holds only its own pieces, initialised by TorchRec -- and everything else as the factory
    builds it (buffers its constructor computes keep their values); True (--verify): the whole model, whose
    tables the pieces are copied from."""
    with contextlib.nullcontext() if tables else _tables_on_meta():
        model = spec.build()
    for m in model.modules():
        if isinstance(m, nn.EmbeddingBag) and not tables:
            continue
        if any(t.is_meta for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]):
            # built on the meta device by the factory (TorchRec's EmbeddingBagCollection(device="meta"))
            m.to_empty(device=device, recurse=False)
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        else:
            m._apply(lambda t: t.to(device), recurse=False)
    return model


@contextlib.contextmanager
def _tables_on_meta():
    """nn.EmbeddingBag built on the meta device whatever device its caller names (TorchRec's
    EmbeddingBagCollection passes its own)."""
    init = nn.EmbeddingBag.__init__

    def on_meta(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "device": torch.device("meta")})
    nn.EmbeddingBag.__init__ = on_meta
    try:
        yield
    finally:
        nn.EmbeddingBag.__init__ = init


def _batch(spec, tables_rows: int, batch: int, step: int, seed: int) -> tuple:
    """The global batch of `step`: dense features N(0, 1), IDs uniform over the smallest table's rows."""
    g = torch.Generator().manual_seed(derived_seed(seed, step, 100_003))
    out = []
    for t in spec.example_inputs(batch):
        if t.is_floating_point():
            out.append(torch.randn(t.shape, generator=g))
        else:
            out.append(torch.randint(0, tables_rows, t.shape, generator=g))
    return tuple(out)


def _loss(spec, module, inputs) -> torch.Tensor:
    if spec.loss_fn is not None:
        return spec.loss_fn(module, *inputs)
    return module(*inputs).float().square().mean()


def _optimizer(name: str, params, lr: float):
    params = list(params)
    if not params:
        return None
    return torch.optim.Adam(params, lr=lr) if name == "adam" else torch.optim.SGD(params, lr=lr)


class _SparseReference:
    """FBGEMM's fused row updates, on the full tables of the single-process reference (rows without a
    gradient do not move: their gradient rows are zero). Row-wise Adagrad keeps one accumulator per row of
    each piece: a column-wise table's k pieces each average their own d / k columns."""

    def __init__(self, kind: str, params: list[tuple[torch.Tensor, int]], lr: float):
        self.kind, self.params, self.lr = kind, params, lr
        self.state = [torch.zeros(p.shape[0], pieces) for p, pieces in params]

    @torch.no_grad()
    def step(self):
        for (p, pieces), state in zip(self.params, self.state):
            g = p.grad
            if self.kind == "sgd":
                p -= self.lr * g
            elif self.kind == "rowwise_adagrad":
                g3 = g.view(g.shape[0], pieces, -1)
                state += g3.square().mean(dim=2)
                p -= (self.lr * g3 / (state.sqrt() + ADAGRAD_EPS)[:, :, None]).view_as(p)
            else:
                raise PartitaError("--verify compares sgd and rowwise_adagrad tables; plan with --sparse-optimizer "
                                   "sgd or rowwise_adagrad to verify")
            p.grad = None


def quiet_torchrec() -> None:
    """TorchRec's and FBGEMM's deprecation notices and sharding logs, once per rank, are not the user's."""
    import logging
    import warnings
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    for module in ("torchrec", "fbgemm_gpu", "torch.distributed", "torch.autograd", "torch.fx"):
        warnings.filterwarnings("ignore", module=module)
    warnings.filterwarnings("ignore", message=".*autograd kernel was not registered.*")
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


def run(plan: Plan, spec, opts, world: int) -> int:
    """Train under the plan on the torchrun ranks; print losses (and the reference's) on rank 0."""
    from partita.runtime.launcher.mesh import init_default
    quiet_torchrec()
    device = init_default()
    rank = dist.get_rank()
    torch.manual_seed(opts.seed)
    model = build(spec, device, tables=opts.verify)
    reference = copy.deepcopy(model) if opts.verify else None  # every rank: each checks its own pieces
    # the tables before training (sharding a TorchRec model replaces its collections in place)
    initial = {n: m.weight.detach().clone() for n, m in table_modules(model).items()} if opts.verify else {}
    rec = shard(plan, model, device, opts.lr)
    sharded_tables = {t["name"] for t in plan.embeddings["tables"] if t["sharding"] != "data_parallel"}
    # the dense parameters and data_parallel tables: TorchRec's "dense" kernel leaves their update to the user
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    opt = _optimizer(plan.train.get("optimizer", "adam"),
                     [p for _, p in in_backward_optimizer_filter(rec.named_parameters())], opts.lr)
    by_hand = replicated_by_hand(rec)
    rows = min(t["rows"] for t in plan.embeddings["tables"])
    B, b = plan.train["global_batch"], plan.train["global_batch"] // world
    from torch.distributed.fsdp import FSDPModule
    dense_kind = "sharded (FSDP2)" if any(isinstance(m, FSDPModule) for m in rec.modules()) else "data-parallel"
    if rank == 0 and opts.print_report:  # said before the progress lines, as a dense run does
        STDOUT.line(_header(plan, spec, world, opts, dense_kind))
    losses, times = [], []
    progress = _progress(opts, rank, B)
    for step in range(opts.steps):
        inputs = tuple(x[rank * b:(rank + 1) * b].to(device) for x in _batch(spec, rows, B, step, opts.seed))
        t0 = time.perf_counter()
        loss = _loss(spec, rec, inputs)
        loss.backward()
        if by_hand:
            average_grads(by_hand, None, world)
        if opt is not None:
            opt.step()
            opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        times.append(time.perf_counter() - t0)
        losses.append(float(total) / world)
        progress.step(step + 1, losses[-1], times[-1], device)
    progress.close()
    ref = _reference(plan, spec, reference, sharded_tables, rows, opts) if reference is not None else None
    gap, seen = _table_gap(rec, reference, initial) if reference is not None else (0.0, 0)
    t = torch.tensor([max(times[1:] or times), gap])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    checked = torch.tensor([seen], dtype=torch.float64)
    dist.all_reduce(checked)
    if rank != 0:
        return 0
    # every element of every table lies in one rank's piece (a data_parallel table in every rank's copy): the
    # pieces checked must cover exactly that, or some table went unchecked
    unchecked = sum(t["rows"] * t["dim"] * (world if t["sharding"] == "data_parallel" else 1)
                    for t in plan.embeddings["tables"]) - int(checked) if ref else 0
    if opts.losses_out:
        _write_losses(opts.losses_out, losses, ref, float(t[0]))
    return _report(plan, losses, ref, float(t[0]), float(t[1]), unchecked)


def _write_losses(path: str, losses: list[float], ref: list[float] | None, step_s: float) -> None:
    """--losses-out: every step's loss (and the reference's under --verify) and the step time, as JSON."""
    import json
    from pathlib import Path

    from partita.runtime.checkpoint import atomic_write
    atomic_write(Path(path), json.dumps({"losses": losses, "reference_losses": ref, "step_time_s": step_s}))


def _progress(opts, rank: int, global_batch: int):
    """The progress lines and TensorBoard scalars of a dense run (runtime.loop.progress), on rank 0."""
    from partita.runtime.loop.progress import Progress
    return Progress(opts.steps, 0, global_batch, "samples", console=rank == 0 and opts.print_report,
                    every=opts.log_every, tensorboard=opts.tensorboard if rank == 0 else None)


@torch.no_grad()
def _table_gap(rec: nn.Module, reference: nn.Module, initial: dict[str, torch.Tensor]) -> tuple[float, int]:
    """Largest |this rank's piece - the reference's rows| of a table, over the largest change the reference
    made to that table: 0 for pieces trained as the reference trained them, about 1 for a piece never updated;
    and the table elements this rank's pieces hold (all checked)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    worst, seen = 0.0, 0
    after = table_modules(reference)
    for name, value in rec.state_dict().items():
        fqn = table_of(name, after)
        if fqn is None:
            continue
        full = after[fqn].weight
        moved = float((full - initial[fqn]).abs().max()) or 1.0
        pieces = ([(s.tensor, s.metadata.shard_offsets, s.metadata.shard_sizes) for s in value.local_shards()]
                  if isinstance(value, ShardedTensor) else [(value, (0, 0), tuple(full.shape))])
        for local, (r0, c0), (nr, nc) in pieces:
            worst = max(worst, float((local - full[r0:r0 + nr, c0:c0 + nc]).abs().max()) / moved)
            seen += nr * nc
    return worst, seen


def _reference(plan, spec, model, sharded_tables: set[str], rows: int, opts) -> list[float]:
    """Single-process training on the global batches: dense parameters and data_parallel tables under the
    plan's dense optimizer, sharded tables under FBGEMM's fused update (_SparseReference)."""
    pieces = {t["name"]: t.get("shards", 1) if t["sharding"] == "column_wise" else 1 for t in plan.embeddings["tables"]}
    sparse = [(m.weight, pieces[fqn]) for fqn, m in table_modules(model).items() if fqn in sharded_tables]
    others = [p for p in model.parameters() if not any(p is w for w, _ in sparse)]
    dense_opt = _optimizer(plan.train.get("optimizer", "adam"), others, opts.lr)
    sparse_opt = _SparseReference(plan.embeddings.get("optimizer", "sgd"), sparse, opts.lr)
    out = []
    for step in range(opts.steps):
        inputs = _batch(spec, rows, plan.train["global_batch"], step, opts.seed)
        loss = _loss(spec, model, inputs)
        loss.backward()
        if dense_opt is not None:
            dense_opt.step()
            dense_opt.zero_grad()
        sparse_opt.step()
        out.append(float(loss.detach()))
    return out


def _header(plan, spec, world: int, opts, dense_kind: str) -> str:
    kinds = sorted({t["sharding"] for t in plan.embeddings["tables"]})
    return (f"partita run: {spec.name} on {world} rank(s), {len(plan.embeddings['tables'])} embedding tables through "
            f"TorchRec DistributedModelParallel ({', '.join(kinds)}; {plan.embeddings.get('optimizer')}), dense part "
            f"{dense_kind}, global batch {plan.train['global_batch']}, {opts.steps} steps")


def _report(plan, losses, ref, step_s, param_gap: float, unchecked: int = 0) -> int:
    """The losses (beside the reference's under --verify), the step time and the verdict, on rank 0."""
    from partita.runtime.loop.report import loss_table
    say = STDOUT.line
    worst = max((abs(a - b) for a, b in zip(losses, ref)), default=0.0) if ref else 0.0
    for line in loss_table(losses, ref):
        say(line)
    say(f"step time  measured {step_s:.4g} s, predicted {plan.predicted.get('step_time_s', float('nan')):.4g} s "
        "(slowest rank)")
    if not all(math.isfinite(x) for x in losses):
        say("partita: error: a loss is not finite")
        return 3
    if ref:
        ok = worst <= FP32_TOLERANCE
        say(f"verify: max |loss - reference| = {worst:.2e} (tolerance {FP32_TOLERANCE:g}): {'OK' if ok else 'FAILED'}")
        fine = param_gap <= PARAM_TOLERANCE and not unchecked
        missing = f"; the pieces checked hold {-unchecked:+d} table elements against the tables'" if unchecked else ""
        say(f"verify: tables after step {len(losses)}: max |piece - reference| / the reference's largest change = "
            f"{param_gap:.2e} (tolerance {PARAM_TOLERANCE:g}){missing}: {'OK' if fine else 'FAILED'}")
        return 0 if ok and fine else 1
    return 0
