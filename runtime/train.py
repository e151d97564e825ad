"""Entry point: train a model under a plan, report measured cost beside the prediction, optionally verify.

    python -m torch.distributed.run --standalone --nproc-per-node W [--max-restarts K] -m partita.runtime.train \\
        PLAN.json --model MODEL --steps N [--verify] [--seed S] [--lr LR] [--losses-out FILE] \\
        [--data FILE [--data-dtype uint16|uint32] | --data package.module:factory] [--sync-batchnorm] \\
        [--log-every N] [--tensorboard DIR] \\
        [--checkpoint-dir DIR [--checkpoint-every N] [--keep N] [--resume]] [--max-restarts K]
    python -m partita.runtime.train PLAN.json --model MODEL --check   # pre-flight checks only, no processes
    python -m partita.runtime.train PLAN.json --model MODEL ...       # a one-rank plan runs without torchrun too
    python -m partita.runtime.train PLAN.json --model MODEL ... --nproc-per-node W \\
        [--nnodes N --rdzv-endpoint HOST:PORT [--rdzv-id ID] [--rdzv-timeout S]]  # starts torchrun on itself

--model is built at the plan's sequence length (train.seq_len): `partita plan --seq 32` and then `run` with the
same MODEL string train 32-token sequences, whatever length the string itself names. A plan priced for another
kind of device (GPUs, run here on CPU processes, or the reverse) says so in one line before training.

With the launcher flags (--nproc-per-node, --nnodes, --rdzv-endpoint) this process is torchrun's agent for
this node (what `partita run` and runtime.api.launch start): the workers' failures reach the user as one
line, `partita: error: rank R: <message>`, and the exit code is the first failing worker's.

Checkpoints (runtime.checkpoint): with --checkpoint-every N, a DCP checkpoint is written atomically to
DIR/step-<k> after every N-th step and after the last (--keep N: only the newest N); --resume continues from
the newest intact one (under any plan and world size; runtime.checkpoint.resume). With --max-restarts K (the same K as
torchrun's), a run that torchrun restarts after a failure resumes from the newest intact checkpoint of its
own run in DIR (runtime.checkpoint.ownership). Data (runtime.data): synthetic by default, windows of the token file
--data FILE, or the samples of a dataset --data package.module:factory (runtime.data.datasets). Progress
(runtime.loop.progress): rank 0 prints a line every --log-every steps, and writes TensorBoard scalars with
--tensorboard DIR; a closed or full stdout turns those lines off, never the training (runtime.loop.console). Faults
for tests: PARTITA_FAULT (runtime.failure.faults). SIGTERM, SIGINT, SIGHUP and SIGQUIT stop every rank after the same
step (runtime.failure.stop).

Exit codes: 0 success; 1 --verify found the losses differ beyond the dtype's tolerance; 2 the plan, data
or checkpoint does not fit the model or world size, or the nodes were started with another plan, model,
flags or data (runtime.launcher.agreement) (one line on stderr, before any step), or a checkpoint could not be
written; 3 a NaN or infinite loss (or weight) stopped training (the step is named; earlier checkpoints are kept); 128 + N a signal N stopped it at a step boundary (129 SIGHUP, 130 SIGINT, 131 SIGQUIT,
143 SIGTERM). Under
plain torchrun a failing worker makes torchrun itself exit non-zero (torchrun's own code is 1).
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun worker: before torch loads,
    from partita.runtime.failure.stop import StopSignal, die_with_parent    # so a signal never prints a traceback
    StopSignal().install()                                          # per rank (runtime.failure.stop)
    if os.environ.get("PARTITA_AGENT"):
        die_with_parent()
# The launcher (torchrun's agent, several nodes): the rendezvous store's C++ warnings -- a page of C++ frames per
# connection retry -- stay off the console, where runtime.launcher.rendezvous says what failed in one line. torch reads
# the level once, when it loads; the workers it starts do not inherit it.
_QUIET_CPP = (__name__ == "__main__" and "TORCHELASTIC_RUN_ID" not in os.environ and "TORCH_CPP_LOG_LEVEL" not in
              os.environ and "--check" not in sys.argv and any(a.startswith("--rdzv-endpoint") for a in sys.argv))
if _QUIET_CPP:
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"

import argparse  # noqa: E402
import gc  # noqa: E402

from partita.costmodel import PartitaError, resolve_model  # noqa: E402
from partita.planner.plan import Plan  # noqa: E402
from partita.runtime.launcher.flags import MODEL, NODE_FLAGS, RECIPE_FLAGS, RUN_FLAGS, add_flags  # noqa: E402
from partita.runtime.launcher.inputs import job_environment_error, option_errors, output_errors, outputs_of  # noqa: E402
from partita.runtime.loop.console import STDOUT, stderr_line  # noqa: E402
from partita.runtime.failure.guards import EXIT_ERROR, EXIT_NONFINITE, EXIT_OK  # noqa: E402
from partita.runtime.launcher.agreement import agree, run_fields  # noqa: E402
from partita.runtime.launcher.mesh import agree_on_attempt, env_world, init_default, teardown  # noqa: E402
from partita.runtime.loop.report import show_library_warnings_once, write_error_file  # noqa: E402
from partita.runtime.failure.stop import StopSignal, die_with_parent  # noqa: E402

if _QUIET_CPP:
    os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
# runtime.loop.session (DCP, FSDP, DTensor: seconds of imports) is not imported here: a spawned worker loads it,
# and a launcher loads it only to fork its workers with it loaded (runtime.launcher.fork.preload)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m partita.runtime.train", description=__doc__.split("\n")[0])
    p.add_argument("plan", help="plan JSON (partita.plan/1)")
    add_flags(p, (MODEL, *RUN_FLAGS), given_only=False)  # runtime.launcher.flags: the same table as `partita run`'s
    p.add_argument("--check", action="store_true",
                   help="only check the plan (and --data, and the checkpoint --resume would load) against the "
                        "model and WORLD_SIZE")
    g = p.add_argument_group("launcher (this process becomes torchrun's agent for this node)")
    g.add_argument("--nproc-per-node", type=int, metavar="W", help="worker processes on this node "
                   "(default: the plan's world size / --nnodes)")
    add_flags(g, NODE_FLAGS, given_only=True)
    return p


LAUNCHER_FLAGS = ("nproc_per_node", *(f.dest for f in NODE_FLAGS))


def argument_errors(args: argparse.Namespace) -> list[str]:
    """Values argparse cannot refuse by type alone."""
    errors = []
    if args.steps < 1:
        errors.append("--steps must be at least 1")
    if args.checkpoint_every < 0:
        errors.append("--checkpoint-every must be >= 0")
    if args.max_restarts < 0:
        errors.append("--max-restarts must be >= 0")
    if args.log_every < 0:
        errors.append("--log-every must be >= 0")
    if args.keep < 0:
        errors.append("--keep must be >= 0")
    if args.snapshot_every < 0:
        errors.append("--snapshot-every must be >= 0")
    if args.hang_timeout is not None and not 0 < args.hang_timeout <= 86400:
        errors.append("--hang-timeout must be more than 0 and at most 86400 seconds")
    if args.rdzv_timeout is not None and not 0 < args.rdzv_timeout <= 86400:
        errors.append("--rdzv-timeout must be more than 0 and at most 86400 seconds")
    for name in ("nproc_per_node", "nnodes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            errors.append(f"--{name.replace('_', '-')} must be at least 1")
    if (args.nnodes or 1) > 1 and not args.rdzv_endpoint and not args.check:
        errors.append(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)")
    errors += option_errors(lr=args.lr, seed=args.seed, **{name: getattr(args, name) for name in RECIPE_FLAGS})
    errors += output_errors(**outputs_of(args), inputs={"the plan": args.plan, "the --data file": args.data,
                                    "the --eval-data file": args.eval_data})
    return errors


def parse_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    errors = argument_errors(args)
    if errors:  # one line, no usage text: these reach users through `partita run` and runtime.api.launch
        print(f"partita: error: {errors[0]}", file=sys.stderr, flush=True)
        sys.exit(EXIT_ERROR)
    return args


def options(args: argparse.Namespace):
    from partita.runtime.loop.session import RunOptions
    return RunOptions(**{f.dest: getattr(args, f.dest) for f in RUN_FLAGS})  # every flag is a field of its name


AGENT_ENV = "PARTITA_AGENT"
"""Set (to 1) by partita's launcher for its workers: a failing worker only writes its error file, and the
launcher prints the first failure once. A worker that ends the job on purpose (an error every rank raised
alike, a NaN, a failed --verify, a stop asked by a signal) records its exit code in that file and exits 0,
so torchrun does not restart an attempt that would end the same way; the launcher exits with the code."""


def _error(rank: int, e: Exception | str, code: int = EXIT_ERROR, origin: int | None = None) -> int:
    """Record and (rank 0, outside partita's launcher) print the line that ends this rank; `origin`: the rank
    whose check said it, when every rank ends with another rank's refusal (default: this one)."""
    write_error_file(rank if origin is None else origin, str(e), exitcode=code)
    if rank == 0 and not os.environ.get(AGENT_ENV):  # a stop asked for (128 + signal) is no error
        stderr_line(f"partita: {'' if code > 128 else 'error: '}{e}")
    return code


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    launcher = any(getattr(args, name) is not None for name in LAUNCHER_FLAGS)
    if launcher and (why := job_environment_error(os.environ)):  # (a worker's variables: runtime.launcher.inputs)
        stderr_line(f"partita: error: {why}")
        return EXIT_ERROR
    if not args.check and launcher:
        if (code := _check_before_launch(args)) != EXIT_OK:
            return code
        from partita.runtime.api import agent_main
        return agent_main(args, argv)
    rank = env_world()[0]
    if StopSignal.current is None:  # a one-process run (no torchrun): stop at a step boundary too
        StopSignal().install()
    code = 1
    try:
        code = _worker(args)
        if code != EXIT_OK and os.environ.get(AGENT_ENV):
            return EXIT_OK  # the error file holds the code (AGENT_ENV); a restart would end the same way
        return code
    except Exception as e:  # unexpected (a bug, a dead peer): the traceback goes into the error file
        import traceback
        write_error_file(rank, f"{type(e).__name__}: {e}".strip().splitlines()[0], traceback.format_exc())
        if not os.environ.get(AGENT_ENV):
            raise
        return 1
    finally:
        gc.collect()  # free FSDP state (reference cycles) while its process groups still exist
        teardown(ok=code == 0)


def _check_before_launch(args: argparse.Namespace) -> int:
    """The pre-flight (`--check`: model fingerprint, world size, module names, data file, the checkpoint
    --resume would load) in the launcher's own process, before torchrun starts a worker: a mismatch is one line
    and exit code 2, not a torchrun failure. It was `partita run`'s first process of its own, a second
    interpreter and torch import (2-3 s of every run). Silent when it passes: the workers print the notes.
    The devices are not looked at here, so the launcher never initialises CUDA. Where the workers will be forked
    (runtime.launcher.fork), the check runs in a forked child while this process imports what they need."""
    import contextlib
    import io

    from partita.runtime.launcher import fork

    from partita.runtime.launcher.elastic import is_elastic

    # a node that joins an elastic job continues the job's checkpoint directory, which the job holds
    joining = {"resume": True} if is_elastic(args.nnodes) else {}

    def check() -> int:
        with contextlib.redirect_stdout(io.StringIO()):
            return _worker(argparse.Namespace(**{**vars(args), "check": True, **joining}), look_at_devices=False)
    return fork.beside_preload(check) if fork.can_fork() else check()


def _worker(args: argparse.Namespace, look_at_devices: bool = True) -> int:
    """One rank of `partita run` (or `--check`): the plan loaded and prepared, every rank agreeing on it,
    then trained (or the check reported)."""
    rank, _, world = env_world()
    show_library_warnings_once(rank)
    opts = options(args)
    refusal, plan, spec, prep = None, None, None, None
    try:
        plan, spec, world, choice = _load(args, opts, world)
        if plan.embeddings is not None:  # tables: TorchRec (runtime.rec.run)
            from partita.runtime.rec.run import dense_only
            if given := dense_only(opts):
                named = " and ".join([", ".join(given[:-1]), given[-1]] if len(given) > 1 else given)
                raise PartitaError(f"{named} apply to dense plans; this plan has embedding tables (TorchRec's loop "
                                   "does not evaluate, watch for hangs, checkpoint, read --data, save weights or "
                                   "apply the recipe's schedule, decay and clipping yet): leave them out")
            return _rec(plan, spec, opts, world, rank, args)
        prep = _prepare(args, plan, spec, opts, world, look_at_devices)
        prep.elastic = choice
    except PartitaError as e:
        refusal = e
    if not args.check and world > 1:
        # Every rank ran these checks alone; they end alike. Checks of shared state can disagree: a rank
        # that looked at --checkpoint-dir just before another run committed its first step found no
        # foreign checkpoint while its peers did, and went on to wait for them forever. And the nodes, each
        # started by its own command, must run the same job (runtime.launcher.agreement): checked here, before the
        # mesh and the model are built.
        init_default()
        fields = run_fields(args, plan, prep.data.describe() if prep is not None and prep.data is not None else None)
        said = agree(str(refusal) if refusal else None, fields)
        if said:
            return _error(rank, said[1], origin=said[0])
    elif refusal:
        return _error(rank, refusal)
    if args.check:
        if rank == 0:
            print(f"plan {args.plan} fits --model {args.model} on {world} rank(s)"
                  + (f"; would resume from {prep.resume.path}" if prep.resume else ""))
            for note in prep.notes + ([prep.device_note] if prep.device_note else []):
                print(note)
        return 0
    return _train(plan, spec, opts, prep, rank)


def _load(args: argparse.Namespace, opts, world: int) -> tuple[Plan, object, int, object]:
    """(the plan, the model at the plan's sequence length, the world size: under --check outside torchrun the
    launcher's if given, else the plan's, and for a plan set the runtime.launcher.elastic.Choice of this round's
    size, else None); PartitaError where the plan's sync mode refuses the run."""
    from partita.planner.plan import planset
    from partita.runtime.loop.session import at_seq_len
    from partita.runtime.loop.sync import run_refusal as sync_run_refusal
    if not args.check:
        agree_on_attempt()  # several nodes: one all-reduce on every rank, whatever its plan and flags say
    choice = None
    if planset.is_plan_set(args.plan):  # an elastic job (runtime.launcher.elastic): the plan of this round's size
        from partita.runtime.launcher import elastic
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or args.nproc_per_node or 1)
        now = world if "WORLD_SIZE" in os.environ else per_node * int(args.nnodes or 1)
        choice = elastic.choose(args.plan, now, per_node)
        plan = choice.plan
    else:
        plan = Plan.load(args.plan)
    if why := sync_run_refusal(plan.sync, opts.checkpoint_every, opts.steps, opts.verify):
        raise PartitaError(why)
    spec = at_seq_len(resolve_model(args.model), plan.train.get("seq_len"))
    if args.check and "WORLD_SIZE" not in os.environ:
        # checking a plan outside torchrun: the launcher's world size if given, else the plan's
        world = (args.nproc_per_node * int(args.nnodes or 1) if args.nproc_per_node else plan.mesh.world_size)
    return plan, spec, world, choice


def _prepare(args: argparse.Namespace, plan: Plan, spec, opts, world: int, look_at_devices: bool):
    """The session's preparation (runtime.loop.session.prepare); under --check, PartitaError where another
    run holds --checkpoint-dir."""
    from partita.runtime.checkpoint import ownership
    from partita.runtime.launcher.elastic import is_elastic
    from partita.runtime.loop.session import prepare
    prep = prepare(plan, spec, opts, world, args.nproc_per_node if args.check else None,
                   look_at_devices=look_at_devices)
    if args.check and args.checkpoint_dir and args.checkpoint_every and not is_elastic(args.nnodes) and \
            (holder := ownership.is_locked(args.checkpoint_dir)):
        raise PartitaError(f"--checkpoint-dir {args.checkpoint_dir} is in use by another run ({holder}): wait "
                           "for it to end, or choose another directory")
    return prep


def _train(plan: Plan, spec, opts, prep, rank: int) -> int:
    """Train the prepared plan; the exit code, each failure written as one line by every rank alike."""
    from partita.runtime.loop.session import NonFiniteLoss, Stopped, execute
    try:
        result, code = execute(plan, spec, opts, prep)
        if code != EXIT_OK:  # --verify: the report (rank 0) shows the curves; the error file says why
            write_error_file(rank, result.failure, exitcode=code)  # the same line on every rank
        return code
    except NonFiniteLoss as e:  # raised on every rank at the same step
        return _error(rank, e, EXIT_NONFINITE)
    except Stopped as e:  # raised on every rank after the same step
        return _error(rank, e, e.exit_code)
    except PartitaError as e:  # raised identically on every rank (e.g. the split contradicts the plan)
        return _error(rank, e)


def _rec(plan, spec, opts, world: int, rank: int, args) -> int:
    from partita.runtime.rec import run as rec
    notes = rec.check(plan, spec, world)
    if args.check:
        if rank == 0:
            print(f"plan {args.plan} fits --model {args.model} on {world} rank(s)", *notes, sep="\n")
        return 0
    if rank == 0 and notes:
        STDOUT.line(*notes)
    return rec.run(plan, spec, opts, world)


def exit_now(code: int):
    """End this process as the interpreter does -- non-daemon threads joined, atexit handlers run, the standard
    streams flushed -- but without tearing down its modules: once torch is loaded that teardown alone takes
    about 2 s of CPU per process (measured on this project's 2-core machine: a worker's `main` returned at
    5.8 s and its process ended at 7.6 s, with 0.02 s of that in atexit handlers). Every `partita run` starts
    a pre-flight, an agent and W workers, and the workers end one after another on shared cores."""
    import atexit
    import threading
    shutdown = getattr(threading, "_shutdown", None)  # what Py_Finalize calls first: joins non-daemon threads
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: the interpreter would ignore it too
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
