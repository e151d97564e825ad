"""--verify's checks of a finished run (runtime.verify.checks has the comparisons and their tolerances): rank 0
trains the unpartitioned reference and every rank compares the run's losses and final parameters with it
(`verify_run`); a run in another dtype than VERIFY_DTYPE also gets a `verification_pass` of the same layout in
VERIFY_DTYPE, which is what is judged tightly. Without --verify, the run's parameter checksum (`check_run`)."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from partita.runtime.launcher.checks import optimizer_name
from partita.runtime.launcher.mesh import Topology
from partita.runtime.loop.clip import clip_grad_norm
from partita.runtime.failure.guards import EXIT_OK, EXIT_VERIFY
from partita.runtime.loop.options import RunOptions
from partita.runtime.loop.recipe import recipe_of
from partita.runtime.loop.recipe import RecipeTrace, build_model, make_schedule
from partita.runtime.loop.stepping import build, pp_group, reduce_loss
from partita.runtime.verify.checks import (PARAM_TOLERANCE, ROUNDING_NUDGE, TOLERANCE, VERIFY_DTYPE, Check, GradientRMS,
                                         allowances, compare, grad_norm_check, loss_check, param_checks, param_stats, reference_run,
                                         rounding_drift, shared_names)
from partita.runtime.parallel.apply import make_executor, make_plan_optimizer
from partita.runtime.parallel.precision import train_dtype

if TYPE_CHECKING:
    from partita.costmodel.models import ModelSpec
    from partita.planner.plan import Plan
    from partita.runtime.loop.session import CheckedResult, _Built


def check_run(result: CheckedResult, plan: Plan, spec: ModelSpec, opts: RunOptions, data, topo: Topology,
           built: _Built) -> int:
    """--verify's checks (`verify_run`, and for a run in another dtype `verification_pass`); without --verify the
    run's parameter checksum. Returns the exit code."""
    if not opts.verify:
        result.param_checksum = param_stats(built.executor.modules, coords(topo), built.names, None, topo.device,
                                            compare_params=False).checksum
        return EXIT_OK
    reference = verify_run(result, plan, spec, opts, data, topo, built.executor, built.names)
    if train_dtype(plan) != VERIFY_DTYPE:
        built.release()  # the pass builds its own copy of the model
        result.checks += verification_pass(plan, spec, opts, data, topo, built.names, *reference)
    return EXIT_OK if result.verified else EXIT_VERIFY


def coords(topo: Topology) -> dict[str, int]:
    return {"dp": topo.dp_rank, "cp": topo.cp_rank, "tp": topo.tp_rank}  # cp ranks hold replicas (runtime.parallel.cp)


def verify_run(result: CheckedResult, plan: Plan, spec: ModelSpec, opts: RunOptions, data, topo: Topology,
            executor, names: list) -> tuple:
    """--verify's checks of the run itself, on every rank: rank 0 trains the reference; the run's losses
    and final parameters are compared with it (judged when the run is in VERIFY_DTYPE; a run in another
    dtype then gets `verification_pass`, runtime.verify.checks's docstring says why). Fills `result.checks`;
    returns (reference model, initial model, reference losses, rounding-level tensors, reference grad norms or
    None) for the pass (the
    models on rank 0 only)."""
    dtype, start, device = train_dtype(plan), result.first_step, topo.device
    reference = initial = None
    clipped = opts.clip_grad_norm is not None
    shared = torch.zeros(1 + opts.steps * (2 if clipped else 1), dtype=torch.float64, device=device)
    gradients = GradientRMS() if topo.rank == 0 else None
    if topo.rank == 0:
        initial = build_model(spec, opts.seed).to(device)
        trace = RecipeTrace()
        ref_losses, reference = reference_run(spec, data, opts.steps, opts.seed, opts.lr, device,
                                              optimizer_name(plan), gradients, recipe_of(opts), trace)
        shared[0] = sum(p.detach().double().sum() for p in reference.parameters())
        shared[1:] = torch.tensor(ref_losses + (trace.grad_norms if clipped else []), dtype=torch.float64)
    dist.broadcast(shared, src=0)  # the reference's checksum, losses and grad norms on every rank
    ref_losses = shared[1:1 + opts.steps].tolist()
    ref_norms = shared[1 + opts.steps:].tolist() if clipped else None
    noise = shared_names(gradients.at_rounding_level() if gradients else None, names, device)
    result.reference_param_checksum = float(shared[0])
    result.reference_losses = ref_losses[start:]
    result.tolerance = TOLERANCE[dtype]
    result.max_abs_diff, _ = compare(result.losses, result.reference_losses, result.tolerance)
    stats = param_stats(executor.modules, coords(topo), names, reference, device, compare_params=True,
                        initial=initial)
    result.param_checksum, result.param_max_abs_diff = stats.checksum, stats.max_abs_diff
    judged = dtype == VERIFY_DTYPE
    run = "" if judged else f"{_DTYPE_NAMES.get(dtype, str(dtype))} run, "
    result.checks = [loss_check(f"{run}losses", result.losses, result.reference_losses, result.tolerance, start),
                     *param_checks(f"{run}parameters after step {opts.steps}", stats, PARAM_TOLERANCE if judged else None,
                                   optimizer_name(plan), noise, opts.lr, opts.steps)]
    if judged and (drift := rounding_allowance(topo, not result.checks[0].passed,
                                               lambda: _nudged_losses(plan, spec, opts, data, device))):
        drifts = rounding_drift(ref_losses, drift)[start:]
        result.checks[0] = loss_check(f"{run}losses", result.losses, result.reference_losses, result.tolerance, start,
                                      drifts)
        diffs = [abs(a - b) for a, b in zip(result.losses, result.reference_losses)]
        result.tolerance = allowances(result.tolerance, drifts)[diffs.index(max(diffs))]  # the report's line
    if clipped:
        result.reference_grad_norms = ref_norms[start:]
        norms = grad_norm_check(f"{run}grad norms before clipping", result.grad_norms, result.reference_grad_norms,
                                start)
        result.checks.append(norms if judged else dataclasses.replace(norms, tolerance=None))
    return reference, initial, ref_losses, noise, ref_norms


_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def rounding_allowance(topo: Topology, needed: bool, nudged) -> list[float] | None:
    """Collective: when rank 0's loss check failed at the fixed tolerance (`needed` there), rank 0 trains the
    reference again from initial weights nudged by one rounding (`nudged()`: its losses) and every rank gets
    those losses; None (no second reference, one broadcast of a flag) otherwise. runtime.verify.checks.rounding_drift
    says why: a failure within the amplified rounding of the reference itself is no failure."""
    flag = torch.tensor([1.0 if needed and topo.rank == 0 else 0.0], dtype=torch.float64, device=topo.device)
    dist.broadcast(flag, src=0)
    if not flag.item():
        return None
    losses = torch.tensor(nudged() if topo.rank == 0 else [], dtype=torch.float64, device=topo.device)
    n = torch.tensor([losses.numel()], dtype=torch.int64, device=topo.device)
    dist.broadcast(n, src=0)
    if topo.rank != 0:
        losses = torch.zeros(int(n.item()), dtype=torch.float64, device=topo.device)
    dist.broadcast(losses, src=0)
    return losses.tolist()


def _nudged_losses(plan: Plan, spec: ModelSpec, opts: RunOptions, data, device) -> list[float]:
    """The reference's losses from initial weights nudged by fp32's unit roundoff (runtime.verify.checks)."""
    return reference_run(spec, data, opts.steps, opts.seed, opts.lr, device, optimizer_name(plan), recipe=recipe_of(opts),
                         nudge=ROUNDING_NUDGE)[0]


def verification_pass(plan: Plan, spec: ModelSpec, opts: RunOptions, data, topo: Topology, names: list,
                       reference, initial, ref_losses: list[float], noise: list[str],
                       ref_norms: list[float] | None) -> list[Check]:
    """The plan's layout trained in VERIFY_DTYPE from the same init on the same batches (steps 1..steps, no
    checkpoints, no faults), judged against the reference: losses and final parameters."""
    verify_plan = dataclasses.replace(plan, train={**plan.train, "dtype": _DTYPE_NAMES[VERIFY_DTYPE]})
    model = build(spec, opts, topo)
    executor = make_executor(model, verify_plan, topo, spec)
    del model
    opt = make_plan_optimizer(executor, verify_plan, opts.lr, optimizer_name(plan), opts.weight_decay)
    recipe = recipe_of(opts)
    schedule = make_schedule(opt, recipe)
    losses, norms = [], []
    for k in range(opts.steps):
        batch = tuple(t.to(topo.device) for t in data.shard(k, topo.dp_rank, topo.dp))
        opt.zero_grad(set_to_none=True)
        losses.append(reduce_loss(executor, executor.step(batch), topo))
        if recipe.clip_grad_norm is not None:
            norms.append(clip_grad_norm(executor.params, recipe.clip_grad_norm, pp_group(topo), executor.norm_params))
        opt.step()
        schedule.step()
    stats = param_stats(executor.modules, coords(topo), names, reference, topo.device, compare_params=True,
                        initial=initial)
    what = f"{_DTYPE_NAMES[VERIFY_DTYPE]} pass of the same layout"
    first = loss_check(f"{what}, losses", losses, ref_losses, TOLERANCE[VERIFY_DTYPE])
    if drift := rounding_allowance(topo, not first.passed, lambda: _nudged_losses(plan, spec, opts, data, topo.device)):
        first = loss_check(f"{what}, losses", losses, ref_losses, TOLERANCE[VERIFY_DTYPE], 0,
                           rounding_drift(ref_losses, drift))
    return [first,
            *param_checks(f"{what}, parameters after step {opts.steps}", stats, PARAM_TOLERANCE, optimizer_name(plan),
                          noise, opts.lr, opts.steps),
            *([grad_norm_check(f"{what}, grad norms before clipping", norms, ref_norms)] if ref_norms else [])]
