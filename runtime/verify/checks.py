"""--verify: the single-process reference (the unpartitioned model trained on the same batches) and the checks.

What is judged. A run is compared with the reference on two things, each a `Check`:

- losses: the largest |loss - reference loss| over the steps, against `TOLERANCE[dtype]`; where that fails, step
  by step against 10x the reference's own rounding drift (`rounding_drift`: the reference trained again from
  initial weights nudged by fp32's unit roundoff), when that is larger -- training that amplifies rounding;
- parameters after the last step: per parameter tensor, RMS(p - p_ref) divided by the RMS of the
  reference's update over the whole model (RMS(p_ref - p_init) over all elements), the largest over the
  tensors and over ranks, against `PARAM_TOLERANCE`; the failure names the tensor. The last update is
  thus checked too, and `--steps 1` checks one. A wrong update (gradients not averaged, a tp reduction
  dropped) moves a tensor by about as much as a right one, so the measure is ~1 (measured 0.9-1.25 after
  3 steps on tiny-gpt); a correct fp32 run stays below 2e-5 except where the gradient is zero in exact
  arithmetic (attention key biases: softmax ignores them), whose update is rounding noise that Adam
  scales towards lr: measured 4e-4 (dp=2) and 1.3e-3 (tp=2). Scaled by the whole model's update, not
  the tensor's own, for that reason: a tensor whose own update is noise would divide noise by noise.
  Where that noise reaches Adam's eps (1e-8) -- larger activations, more tokens -- such a tensor moves by
  up to ~lr per step in a random direction, and the measure above would fail a correct run (issue 30: a
  tied-head LM's attention key bias at 3.8e-2, a bias before a normalisation with equal losses). So, under
  Adam, a tensor whose reference gradient stays at rounding level -- its RMS, the largest over the steps,
  at most `NOISE_GRADIENT` x the whole model's RMS gradient (`GradientRMS`) -- is judged by a measure
  noise cannot fail: its largest |p - p_ref| against what two runs of Adam steps can drift apart,
  2 x `ADAM_STEP_BOUND` x lr per step (`noise_check`). Such a tensor cannot show a wrong sync (its true
  gradient is zero); every other tensor keeps the measure above, which the injected bugs fail.

Why a bf16 run is verified in fp32. bf16 keeps 8 significant bits: unit roundoff u = 2^-8 = 3.9e-3 per
rounding, and a forward/backward pass compounds many roundings (a growth factor of the depth and the
dot-product lengths). A bound derived from that -- the loss tolerance a correct bf16 run can be promised
against fp32 -- is at least u x the loss (~2e-2 near ln(256) = 5.5), while a run whose data-parallel
gradients are never averaged drifts only 3.5e-3 in 3 steps (measured; tests/e2e/test_plan_elements.py):
no such bound separates the two, and a tight empirical one would fail correct runs on other models or
hardware. So for a bf16 plan --verify (session.execute) does two things:

1. the bf16 run itself against the fp32 reference, losses at `TOLERANCE[bf16]` (1e-2): bf16 is applied and
   trains sanely; its parameter differences are reported, not judged;
2. an fp32 verification pass: the same layout (mesh, stages, schedule, placements, ZeRO, recompute,
   offload -- the plan with only its dtype set to fp32), the same init and batches, trained from step 0
   and judged like an fp32 run (losses 1e-5, parameters `PARAM_TOLERANCE`). This is what sees a missing
   gradient sync or a wrong tensor-parallel reduction. What it cannot see is a bug in the bf16 wrappers
   themselves (autocast, FSDP's MixedPrecisionPolicy), which the first check bounds only coarsely.

`param_stats` also gives every run a checksum (the sum of all parameter elements in float64, each element
counted once however the plan shards or replicates it).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from partita.runtime.loop.recipe import is_dtensor
from partita.costmodel.models import ModelSpec
from partita.runtime.parallel import ep as expert_parallel
from partita.runtime.loop.recipe import Recipe, RecipeTrace, build_model, current_lr, loss_for, make_optimizer, make_schedule

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}
"""Largest |loss - reference loss| a run in this dtype may show against the fp32 reference."""
PARAM_TOLERANCE = 2e-2
"""Largest RMS(p - p_ref) / RMS(p_ref - p_init) of any parameter tensor that trains, in an fp32 run: 15x above
the rounding noise of gradient-free tensors (which, under Adam, `noise_check` judges instead: the tensors
that train then differ by ~1e-5, tiny-gpt dp=2 and tp=2), 50x below the wrong updates of the injected bugs
(module docstring; tests/runtime/test_verify_injected_bugs.py measures both)."""
NOISE_GRADIENT = 1e-5
"""A parameter tensor's reference gradient RMS at most this fraction of the model's is rounding noise: fp32's
unit roundoff is 6e-8, so 1e-5 is ~170 roundings, while a tensor that trains has a gradient within a few
orders of magnitude of the model's (module docstring)."""
ADAM_STEP_BOUND = (1 - 0.9) / math.sqrt(1 - 0.999)
"""The largest |update| / lr of one AdamW step (betas 0.9, 0.999: |m_hat| / sqrt(v_hat) <= (1 - b1) /
sqrt(1 - b2) = 3.16; Kingma & Ba 2015, section 2.1)."""
VERIFY_DTYPE = torch.float32
"""The dtype verification is judged in: runs in other dtypes get an extra pass in this one."""


@dataclass
class GradientRMS:
    """The reference's gradients: per parameter tensor, the largest RMS over the steps, and the model's."""

    tensors: dict[str, float] = field(default_factory=dict)
    model: float = 0.0

    def record(self, model: nn.Module) -> None:
        total, count = 0.0, 0
        for name, p in model.named_parameters():
            g = p.grad.detach().double() if p.grad is not None else torch.zeros((), dtype=torch.float64)
            sq = float(g.square().sum())
            total, count = total + sq, count + p.numel()
            self.tensors[name] = max(self.tensors.get(name, 0.0), math.sqrt(sq / max(p.numel(), 1)))
        self.model = max(self.model, math.sqrt(total / max(count, 1)))

    def at_rounding_level(self) -> list[str]:
        """The tensors whose gradient never rose above rounding noise (NOISE_GRADIENT)."""
        return [n for n, g in self.tensors.items() if g <= NOISE_GRADIENT * self.model]


def shared_names(chosen: list[str] | None, names: list[tuple[str, torch.Size]], device: torch.device) -> list[str]:
    """Collective: the names rank 0 chose (`chosen`, None elsewhere), among the model's `names`, on every rank."""
    flags = torch.zeros(len(names), dtype=torch.float64, device=device)
    if chosen is not None:
        picked = set(chosen)
        for i, (n, _) in enumerate(names):
            flags[i] = float(n in picked)
    dist.broadcast(flags, src=0)
    return [n for (n, _), f in zip(names, flags.tolist()) if f]


def reference_run(spec: ModelSpec, data, steps: int, seed: int, lr: float, device: torch.device,
                  optimizer: str = "adam", gradients: GradientRMS | None = None, recipe: Recipe | None = None,
                  trace: RecipeTrace | None = None, nudge: float = 0.0) -> tuple[list[float], nn.Module]:
    """Full-batch training in one process: same init, batches, loss, optimizer and recipe (runtime.loop.recipe;
    default: lr throughout, no decay, no clipping) as the distributed run, clipping with torch's own
    `clip_grad_norm_`. Returns the losses of steps 1..`steps` and the trained model; `gradients` records the
    gradients' scale, `trace` the learning rates and the norms before clipping."""
    recipe = recipe or Recipe(lr=lr, steps=steps)
    trace = trace if trace is not None else RecipeTrace()
    model = build_model(spec, seed).to(device)
    if nudge:
        _nudge(model, nudge, seed)
    opt = make_optimizer(model.parameters(), recipe.lr, optimizer, recipe.weight_decay)
    schedule = make_schedule(opt, recipe)
    loss_fn = loss_for(spec)
    losses = []
    for k in range(steps):
        batch = tuple(t.to(device) for t in data.batch(k))
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        if gradients is not None:
            gradients.record(model)
        trace.learning_rates.append(current_lr(opt))
        if recipe.clip_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_grad_norm, foreach=False)
            trace.grad_norms.append(float(norm))
        opt.step()
        schedule.step()
        losses.append(loss.item())
    return losses, model


def reference_losses(spec: ModelSpec, data, steps: int, seed: int, lr: float, device: torch.device,
                     optimizer: str = "adam") -> list[float]:
    return reference_run(spec, data, steps, seed, lr, device, optimizer)[0]


def compare(losses: list[float], reference: list[float], tol: float) -> tuple[float, bool]:
    """(largest absolute difference, within tolerance). NaN/inf or unequal lengths never pass."""
    if len(losses) != len(reference) or not losses:
        return math.inf, False
    diffs = [abs(a - b) for a, b in zip(losses, reference)]
    if not all(math.isfinite(d) for d in diffs):  # max() would silently skip a NaN
        return math.inf, False
    diff = max(diffs)
    return diff, diff <= tol


@dataclass(frozen=True)
class Check:
    """One comparison --verify makes; `tolerance` None: reported, not judged."""

    what: str
    """What was compared, e.g. "fp32 pass, parameters after step 3"."""
    metric: str
    """How the difference is measured, e.g. "|loss - reference|"."""
    diff: float
    """The largest difference (inf for NaN, or a missing value)."""
    worst: str
    """Where the largest difference is: "step 2", "'blocks.0.ln1.weight'"."""
    tolerance: float | None

    @property
    def passed(self) -> bool:
        return self.tolerance is None or (math.isfinite(self.diff) and self.diff <= self.tolerance)

    def line(self) -> str:
        where = f" at {self.worst}" if self.worst else ""
        if self.tolerance is None:
            return f"verify: {self.what}: max {self.metric} = {self.diff:.2e}{where} (reported, not judged)"
        verdict = "OK" if self.passed else "FAILED"
        return (f"verify: {self.what}: max {self.metric} = {self.diff:.2e}{where} "
                f"(tolerance {self.tolerance:.0e}): {verdict}")

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


ROUNDING_NUDGE = 2.0 ** -24
"""fp32's unit roundoff: the relative change `rounding_drift`'s second reference makes to every initial weight."""
ROUNDING_MARGIN = 10.0
"""A loss may differ from the reference by this many times the nudged reference's drift (`loss_check`)."""


def rounding_drift(reference_losses: list[float], nudged_losses: list[float]) -> list[float]:
    """How far the reference's own losses move when every initial weight moves by one rounding (ROUNDING_NUDGE):
    per step, the largest |nudged - reference| so far. A correct run differs from the reference by rounding
    (another summation order), and training can amplify rounding: Adam's first steps are about lr x sign(g) per
    element, whatever g's size, and a contrastive loss's temperature or BatchNorm's division by a batch statistic
    scale it further (measured: the example CNN's nudged drift reaches 5.6e-6 by step 5 and a correct dp=2
    --sync-batchnorm run 1.8e-5; hf:clip at lr 1e-3, 2.7e-5 and a correct tp=2 run 1.7e-5; tiny-gpt stays at
    4.8e-7). The drift measures that amplification on the reference itself."""
    out, worst = [], 0.0
    for a, b in zip(reference_losses, nudged_losses):
        worst = max(worst, abs(a - b) if math.isfinite(a - b) else math.inf)
        out.append(worst)
    return out


def allowances(tol: float, drift: list[float]) -> list[float]:
    """Per step, the largest |loss - reference| a correct run may show: max(tol, ROUNDING_MARGIN x drift)."""
    return [max(tol, ROUNDING_MARGIN * d) for d in drift]


def loss_check(what: str, losses: list[float], reference: list[float], tol: float | None,
               first_step: int = 0, drift: list[float] | None = None) -> Check:
    """The losses of steps first_step+1.. against the reference's; unequal lengths or NaN: diff inf. With the
    reference's `rounding_drift` (steps first_step+1.. too), step k may differ by max(tol, ROUNDING_MARGIN x
    drift[k]): the amplified rounding of a correct run, which a wrong gradient or update exceeds by orders of
    magnitude (and the parameter checks judge apart). The failure or pass names the step nearest its allowance."""
    if len(losses) != len(reference) or not losses:
        return Check(what, "|loss - reference|", math.inf, f"{len(losses)} losses vs {len(reference)}", tol)
    diffs = [abs(a - b) if math.isfinite(a - b) else math.inf for a, b in zip(losses, reference)]
    if tol is None or drift is None:
        i = max(range(len(diffs)), key=lambda j: diffs[j])
        return Check(what, "|loss - reference|", diffs[i], f"step {first_step + i + 1}", tol)
    allowed = allowances(tol, drift)
    i = max(range(len(diffs)), key=lambda j: diffs[j] / allowed[j])
    said = (f"step {first_step + i + 1}; the reference, its weights nudged by fp32's unit roundoff, drifts "
            f"{drift[i]:.1e} by then" if allowed[i] > tol else f"step {first_step + i + 1}")
    return Check(what, "|loss - reference|", diffs[i], said, allowed[i])


def param_check(what: str, relative: dict[str, float], tol: float | None) -> Check:
    """The parameter tensor whose difference from the reference (`ParamStats.relative`) is largest."""
    metric = "RMS(p - ref) / RMS of the reference's update"
    if not relative:
        return Check(what, metric, math.inf, "no parameters compared", tol)
    name = max(relative, key=lambda n: relative[n] if not math.isnan(relative[n]) else math.inf)
    value = relative[name] if not math.isnan(relative[name]) else math.inf
    return Check(what, metric, value, repr(name), tol)


def noise_check(what: str, stats: "ParamStats", noise: list[str], lr: float, steps: int) -> Check | None:
    """The tensors whose reference gradient is rounding noise, under Adam (module docstring): the largest
    |p - p_ref| / (2 x ADAM_STEP_BOUND x lr x steps), at most 1 for any two runs of Adam; None if there are none."""
    if not noise:
        return None
    bound = 2 * ADAM_STEP_BOUND * lr * steps
    name = max(noise, key=lambda n: stats.peak[n])
    return Check(f"{what}, {len(noise)} with rounding-level gradients", "|p - ref| / (2 x Adam's largest step x steps)",
                 stats.peak[name] / bound if bound > 0 else math.inf, repr(name), 1.0)


def param_checks(what: str, stats: "ParamStats", tol: float | None, optimizer: str, noise: list[str], lr: float,
                 steps: int) -> list[Check]:
    """The parameter checks of a run: `param_check` over the tensors that train, and under Adam `noise_check`
    over those whose reference gradient is rounding noise (under SGD such a tensor barely moves: one check)."""
    noise = [n for n in noise if n in stats.relative] if optimizer == "adam" else []
    judged = {n: v for n, v in stats.relative.items() if n not in noise}
    extra = noise_check(what, stats, noise, lr, steps) if tol is not None else None
    return [param_check(what, judged, tol)] + ([extra] if extra is not None else [])


GRAD_NORM_TOLERANCE = 1e-3
"""Largest |norm - reference norm| / reference norm of the gradients' global norm at any step (with clipping, in
an fp32 run). Correct runs differ by the order of fp32 sums and the trajectory's drift: measured 1.1e-7 and 1.2e-7
(tiny-gpt dp=2 and pp=2, 6 steps) up to 9.3e-5 (the BatchNorm CNN of docs/own-models.md under SGD, dp=2, step 7 of 8),
so 10x above the largest; a pp=2 run whose stages each clip by their own norm is off by 0.41 (tests/e2e/
test_training_recipe.py), 400x above. Judged because a wrong norm can hide from the loss and parameter checks:
Adam's update hardly depends on the gradients' scale."""


def grad_norm_check(what: str, norms: list[float], reference: list[float], first_step: int = 0) -> Check:
    """The global gradient norms before clipping, step by step, against the reference's."""
    metric = "|grad norm - reference| / reference"
    if len(norms) != len(reference) or not norms:
        return Check(what, metric, math.inf, f"{len(norms)} norms vs {len(reference)}", GRAD_NORM_TOLERANCE)
    rel = [abs(a - b) / abs(b) if b and math.isfinite(a - b) else (0.0 if a == b else math.inf)
           for a, b in zip(norms, reference)]
    i = max(range(len(rel)), key=lambda j: rel[j])
    return Check(what, metric, rel[i], f"step {first_step + i + 1}", GRAD_NORM_TOLERANCE)


def failures(checks: list[Check]) -> str:
    """One line naming what diverged, or "" when every check passed."""
    bad = [f"{c.what}, {c.worst} ({c.diff:.2e} > {c.tolerance:.0e})" for c in checks if not c.passed]
    return ("verify FAILED: " + "; ".join(bad)) if bad else ""


def checksum(model: nn.Module) -> float:
    """Sum of every parameter element of an unsharded model, in float64."""
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _counted_here(p: torch.Tensor, coords: dict[str, int]) -> bool:
    """Whether this rank's copy of `p` counts towards the checksum: along each of the dp, cp and tp axes,
    either `p` is sharded over it (also over a flattened mesh axis such as "dp_cp", runtime.parallel.cp) or this rank
    is its first coordinate."""
    names, placements = (), ()
    coords = expert_parallel.checksum_coords(p, coords)  # an expert shard counts on ep group 0
    if is_dtensor(p):
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.placement_types import _StridedShard  # FSDP2's dp shard of a tp-sharded dim
        names, placements = p.device_mesh.mesh_dim_names or (), p.placements
    for axis, coord in coords.items():
        sharded = any(axis in name.split("_") and isinstance(pl, (Shard, _StridedShard))
                      for name, pl in zip(names, placements))
        if not sharded and coord != 0:
            return False
    return True


@dataclass
class ParamStats:
    checksum: float
    max_abs_diff: float | None = None
    """Largest |parameter - reference| over all elements and ranks (None without a reference)."""
    gap: dict[str, float] | None = None
    """Per parameter tensor, ||p - p_ref||, the largest over the ranks holding it."""
    update: dict[str, float] | None = None
    """Per parameter tensor, the reference's update ||p_ref - p_init||."""
    numel: dict[str, int] | None = None
    peak: dict[str, float] | None = None
    """Per parameter tensor, the largest |p - p_ref| of its elements, over the ranks holding it."""

    @property
    def relative(self) -> dict[str, float]:
        """Per tensor, RMS(p - p_ref) / the RMS of the reference's update over all parameters."""
        total = sum(self.numel.values())
        scale = math.sqrt(sum(u * u for u in self.update.values()) / total) if total else 0.0
        out = {}
        for n, g in self.gap.items():
            rms = g / math.sqrt(self.numel[n]) if self.numel[n] else 0.0
            out[n] = rms / scale if scale > 0 else (0.0 if rms == 0 else math.inf)
        return out


def param_stats(modules: list[nn.Module], coords: dict[str, int], names: list[tuple[str, torch.Size]],
                reference: nn.Module | None, device: torch.device, compare_params: bool,
                initial: nn.Module | None = None) -> ParamStats:
    """Collective over all ranks: the checksum of the trained parameters and, with `compare_params`, their
    differences from the reference. `names` lists every parameter of the whole model (name, shape) in one
    order on all ranks; `reference` and `initial` are the trained reference model and the model as
    initialised, on rank 0 (None elsewhere)."""
    local = {n: p for m in modules for n, p in m.named_parameters()}
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in local.values():
        if _counted_here(p, coords):
            t = p.to_local() if is_dtensor(p) else p
            total += t.detach().double().sum()
    dist.all_reduce(total)
    if not compare_params:
        return ParamStats(float(total))
    ref = dict(reference.named_parameters()) if reference is not None else {}
    init = dict(initial.named_parameters()) if initial is not None else {}
    update = torch.zeros(len(names), dtype=torch.float64, device=device)
    if ref:  # rank 0
        for i, (name, _) in enumerate(names):
            base = init[name].detach() if name in init else torch.zeros_like(ref[name])
            update[i] = (ref[name].detach().double() - base.double()).norm()
    dist.broadcast(update, src=0)
    gap = torch.zeros(len(names), dtype=torch.float64, device=device)
    peak = torch.zeros(len(names), dtype=torch.float64, device=device)
    for i, (name, shape) in enumerate(names):
        buf = ref[name].detach().float().clone() if name in ref else torch.empty(shape, device=device)
        dist.broadcast(buf, src=0)
        if name in local:
            p = local[name]
            full = expert_parallel.full_tensor(p)  # DTensors and expert shards gathered
            delta = full.detach().double() - buf.double()
            peak[i] = delta.abs().max() if delta.numel() else 0.0
            gap[i] = delta.norm()
    both = torch.nan_to_num(torch.cat((gap, peak)), nan=math.inf)  # a NaN would vanish in MAX
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    gap, peak = both[:len(names)], both[len(names):]
    keys = [n for n, _ in names]
    return ParamStats(float(total), float(peak.max()) if len(names) else 0.0, dict(zip(keys, gap.tolist())),
                      dict(zip(keys, update.tolist())), {n: math.prod(s) for n, s in names},
                      dict(zip(keys, peak.tolist())))


@torch.no_grad()
def _nudge(model: nn.Module, relative: float, seed: int) -> None:
    """Every parameter element times (1 +- `relative`), the signs drawn from `seed`: a rounding-sized change."""
    gen = torch.Generator().manual_seed(seed + 1)
    for p in model.parameters():
        sign = torch.randint(0, 2, p.shape, generator=gen).to(p.dtype).mul_(2).sub_(1)
        p.mul_(1 + relative * sign.to(p.device))
