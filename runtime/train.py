"""Entry point: train a model under a plan, report measured cost beside the prediction, optionally verify.

    python -m torch.distributed.run --standalone --nproc-per-node W -m runtime.train PLAN.json \\
        --model MODEL --steps N [--verify] [--seed S] [--lr LR] [--losses-out FILE]
    python -m runtime.train PLAN.json --model MODEL --check     # pre-flight checks only, no processes

Exit codes: 0 success; 1 --verify found the losses differ beyond the dtype's tolerance; 2 the plan does
not fit the model or world size (one line on stderr, before any step). Under torchrun a failing
worker makes torchrun itself exit non-zero (torchrun's own code is 1).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from costmodel import PartitaError, resolve_model
from planner.plan import Plan
from runtime import memory
from runtime.apply import make_executor
from runtime.checks import optimizer_name, preflight
from runtime.data import SyntheticTokens
from runtime.mesh import Topology, env_world, init
from runtime.precision import train_dtype
from runtime.recipe import build_model, make_optimizer
from runtime.report import RunResult, render
from runtime.verify import TOLERANCE, compare, reference_losses


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m runtime.train", description=__doc__.split("\n")[0])
    p.add_argument("plan", help="plan JSON (partita.plan/1)")
    p.add_argument("--model", required=True, help="model preset or MODEL string, e.g. tiny-gpt")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--verify", action="store_true", help="also train the unpartitioned model on rank 0 and compare")
    p.add_argument("--losses-out", metavar="FILE", help="write losses, reference, step time and memory as JSON")
    p.add_argument("--check", action="store_true", help="only check the plan against the model and WORLD_SIZE")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allreduce(values: list[float], op, device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def train(plan: Plan, spec, topo: Topology, steps: int, seed: int, lr: float) -> RunResult:
    """Train `steps` steps under the plan on this rank; every rank returns the same RunResult, except
    `applied`, which says what this rank's executor applied."""
    data = SyntheticTokens(spec, plan.train["global_batch"], seed)
    model = build_model(spec, seed).to(topo.device)
    executor = make_executor(model, plan, topo, spec.seq_len)
    del model
    opt = make_optimizer(executor.params, lr, optimizer_name(plan))
    saved = memory.SavedActivations(executor.params)
    if topo.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(topo.device)
    local_losses, times, state = [], [], 0
    for k in range(steps):
        inputs, targets = (t.to(topo.device) for t in data.shard(k, topo.dp_rank, topo.dp))
        _sync(topo.device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with saved:
            loss = executor.step(inputs, targets)
        opt.step()
        held = loss if executor.holds_loss else torch.zeros_like(loss)
        dist.all_reduce(held)  # one holder per dp rank: the sum over them / dp is the global mean
        local_losses.append(held.item() / topo.dp)
        _sync(topo.device)
        times.append(time.perf_counter() - t0)
        state = max(state, memory.state_bytes(executor.params, opt))
    if topo.device.type == "cuda":
        peak, method = torch.cuda.max_memory_allocated(topo.device), memory.GPU_METHOD
    else:
        peak, method = state + saved.peak, memory.CPU_METHOD
    maxed = _allreduce(times + [peak, memory.peak_rss_bytes()], dist.ReduceOp.MAX, topo.device)
    return RunResult(losses=local_losses, step_times=maxed[:steps], peak_memory_bytes=int(maxed[steps]),
                     memory_method=method, peak_rss_bytes=int(maxed[steps + 1]),
                     tokens_per_step=plan.train["global_batch"] * spec.seq_len,
                     applied={**asdict(executor.applied), "summary": executor.applied.summary()})


def run(args: argparse.Namespace, plan: Plan, spec, notes: list[str]) -> int:
    """Everything after the pre-flight checks, inside an initialised process group."""
    topo = init(plan)
    try:
        result = train(plan, spec, topo, args.steps, args.seed, args.lr)
        result.notes = notes
        code = torch.zeros((), dtype=torch.long, device=topo.device)
        if args.verify:
            if topo.rank == 0:
                data = SyntheticTokens(spec, plan.train["global_batch"], args.seed)
                result.reference_losses = reference_losses(spec, data, args.steps, args.seed, args.lr, topo.device,
                                                           optimizer_name(plan))
                result.tolerance = TOLERANCE[train_dtype(plan)]
                result.max_abs_diff, ok = compare(result.losses, result.reference_losses, result.tolerance)
                code.fill_(0 if ok else 1)
            dist.broadcast(code, src=0)
        if topo.rank == 0:
            m = plan.mesh
            header = (f"partita run: {spec.name} on {m.world_size} rank(s) (pp={m.pp} dp={m.dp} tp={m.tp}, "
                      f"{plan.schedule.name} x{plan.schedule.num_microbatches} microbatches, zero_stage "
                      f"{plan.zero_stage}, {plan.train.get('dtype') or 'fp32'}, {optimizer_name(plan)}), "
                      f"{dist.get_backend()}/{topo.device.type}, global batch {plan.train['global_batch']} "
                      f"x {spec.seq_len} tokens, {args.steps} steps")
            print(render(result, header, plan.predicted), flush=True)
            if args.losses_out:
                with open(args.losses_out, "w") as f:
                    json.dump(result.to_json(), f, indent=2)
        return int(code.item())
    except PartitaError as e:  # raised identically on every rank (e.g. the split contradicts the plan)
        if topo.rank == 0:
            print(f"partita: error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        gc.collect()  # free FSDP state (reference cycles) while its process groups still exist
        dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, _, world = env_world()
    try:
        plan = Plan.load(args.plan)
        spec = resolve_model(args.model)
        if args.check and "WORLD_SIZE" not in os.environ:
            world = plan.mesh.world_size  # checking a plan outside torchrun: the world size is not known
        notes = preflight(plan, spec, world)
        if spec.vocab is None or spec.seq_len is None:
            raise PartitaError(f"model {args.model!r} gives no vocab/seq_len; the runtime's synthetic "
                               "token data needs both")
    except PartitaError as e:
        if rank == 0:
            print(f"partita: error: {e}", file=sys.stderr, flush=True)
        return 2
    if args.check:
        if rank == 0:
            print(f"plan {args.plan} fits --model {args.model} on {world} rank(s)")
        return 0
    return run(args, plan, spec, notes)


if __name__ == "__main__":
    sys.exit(main())
