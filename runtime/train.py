"""Entry point: train a model under a plan, report measured cost beside the prediction, optionally verify.

    python -m torch.distributed.run --standalone --nproc-per-node W [--max-restarts K] -m runtime.train \\
        PLAN.json --model MODEL --steps N [--verify] [--seed S] [--lr LR] [--losses-out FILE] \\
        [--data FILE [--data-dtype uint16|uint32]] \\
        [--checkpoint-dir DIR [--checkpoint-every N] [--resume]] [--max-restarts K]
    python -m runtime.train PLAN.json --model MODEL --check   # pre-flight checks only, no processes
    python -m runtime.train PLAN.json --model MODEL ...       # a one-rank plan runs without torchrun too

Checkpoints (runtime.checkpoint): with --checkpoint-every N, a DCP checkpoint is written atomically to
DIR/step-<k> after every N-th step and after the last; --resume continues from the latest complete one
(under any plan and world size). With --max-restarts K (the same K as torchrun's), a run that torchrun
restarts after a failure resumes from the latest checkpoint in DIR. Data (runtime.data): synthetic by
default, or windows of the token file --data FILE. Faults for tests: PARTITA_FAULT (runtime.faults).

Exit codes: 0 success; 1 --verify found the losses differ beyond the dtype's tolerance; 2 the plan, data
or checkpoint does not fit the model or world size (one line on stderr, before any step); 3 a NaN or
infinite loss stopped training (the step is named; earlier checkpoints are kept). Under torchrun a failing
worker makes torchrun itself exit non-zero (torchrun's own code is 1).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

import torch.distributed as dist

from costmodel import PartitaError, resolve_model
from planner.plan import Plan
from runtime.data import DTYPES
from runtime.mesh import env_world
from runtime.session import EXIT_ERROR, EXIT_NONFINITE, NonFiniteLoss, RunOptions, execute, prepare


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runtime.train", description=__doc__.split("\n")[0])
    p.add_argument("plan", help="plan JSON (partita.plan/1)")
    p.add_argument("--model", required=True, help="model preset or MODEL string, e.g. tiny-gpt")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--verify", action="store_true", help="also train the unpartitioned model on rank 0 and compare")
    p.add_argument("--losses-out", metavar="FILE", help="write losses, reference, step time and memory as JSON")
    p.add_argument("--check", action="store_true",
                   help="only check the plan (and --data, and the checkpoint --resume would load) against the "
                        "model and WORLD_SIZE")
    p.add_argument("--data", metavar="FILE", help="token file: .npy, or raw little-endian uint16/uint32 tokens")
    p.add_argument("--data-dtype", choices=list(DTYPES), default=None, help="token type of a raw --data file "
                   "(default uint16)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="where DCP checkpoints are written and resumed from")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="save a checkpoint after every N steps and after the last (0: never)")
    p.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint in DIR")
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="torchrun's --max-restarts: a restarted attempt resumes from the latest checkpoint")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(steps=args.steps, seed=args.seed, lr=args.lr, verify=args.verify,
                      checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                      resume=args.resume, max_restarts=args.max_restarts, data=args.data,
                      data_dtype=args.data_dtype, losses_out=args.losses_out)


def _error(rank: int, e: Exception) -> None:
    if rank == 0:
        print(f"partita: error: {e}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, _, world = env_world()
    opts = options(args)
    try:
        plan = Plan.load(args.plan)
        spec = resolve_model(args.model)
        if args.check and "WORLD_SIZE" not in os.environ:
            world = plan.mesh.world_size  # checking a plan outside torchrun: the world size is not known
        prep = prepare(plan, spec, opts, world)
    except PartitaError as e:
        _error(rank, e)
        return EXIT_ERROR
    if args.check:
        if rank == 0:
            print(f"plan {args.plan} fits --model {args.model} on {world} rank(s)"
                  + (f"; would resume from {prep.resume.path}" if prep.resume else ""))
            for note in prep.notes:
                print(note)
        return 0
    try:
        return execute(plan, spec, opts, prep)[1]
    except NonFiniteLoss as e:  # raised on every rank at the same step
        _error(rank, e)
        return EXIT_NONFINITE
    except PartitaError as e:  # raised identically on every rank (e.g. the split contradicts the plan)
        _error(rank, e)
        return EXIT_ERROR
    finally:
        gc.collect()  # free FSDP state (reference cycles) while its process groups still exist
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
