"""The Python API (DESIGN.md): train under a plan from a script, or launch torchrun on the entry point.

    # in a script started by torchrun (or a plain `python` for a one-rank plan):
    result = runtime.run(plan, model_fn, dataset=None, steps=100, verify=True)
    # from anywhere: spawn torchrun on runtime.train and wait for it
    code = runtime.launch("plan.json", "tiny-gpt", steps=100, verify=True, checkpoint_dir="ckpt")
    # the same on each of several nodes (c10d rendezvous; processes per node = world size / nnodes)
    code = runtime.launch("plan.json", "tiny-gpt", steps=100, nnodes=2, rdzv_endpoint="node0:29400")

`run` initialises the default process group from the torchrun environment if none
exists (and destroy it again at the end); a group the caller created is used and left alone, so one
script can run several plans. They raise PartitaError (one line) where the entry point exits 2 or 3,
print the run report on rank 0, and return the RunResult on every rank; with `verify=True` a run that
differs from one process raises VerifyFailed on every rank (the entry point exits 1), its `result` attached.
"""
from __future__ import annotations

import dataclasses
import gc
import os
import sys
from pathlib import Path
from typing import Callable

import torch.distributed as dist
import torch.nn as nn

from partita.costmodel import PartitaError, resolve_model
from partita.costmodel.models import ModelSpec
from partita.runtime.launcher.agent import (PROGRESS_FILE, _AgentLog, agent,  # noqa: F401 (re-exported:
                                            watch_failures)  # torchrun's agent moved there)
from partita.runtime.launcher.child import run_forwarding_signals
from partita.runtime.launcher.elastic import (DEFAULT_RESTARTS, is_elastic, launch_refusal, node_count,
                                             procs_per_node as elastic_procs_per_node)
from partita.planner.plan import Plan
from partita.runtime.loop.console import stderr_line
from partita.runtime.launcher.mesh import agree_on_attempt, env_world, teardown
from partita.runtime.loop.report import RunResult, show_library_warnings_once
from partita.runtime.loop.progress import DEFAULT_EVERY
from partita.runtime.failure.guards import EXIT_OK
from partita.runtime.failure.stop import die_with_parent

ModelArg = str | ModelSpec | Callable[[], nn.Module] | Callable[[], tuple]
"""A MODEL string, a ModelSpec, a function building the module, or a model factory returning (module,
example_inputs[, loss_fn]) as `package.module:factory` does for the CLI."""


class VerifyFailed(PartitaError):
    """`run(..., verify=True)` found the run differs from single-process training beyond tolerance; the message
    names what diverged, `result` holds the run (its `checks`, losses and reference)."""

    def __init__(self, result: RunResult):
        super().__init__(result.failure or "verify FAILED")
        self.result = result


def _plan(plan: Plan | dict | str | os.PathLike) -> Plan:
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return Plan.from_dict(plan)
    return Plan.load(plan)


def _as_factory(model_fn, name: str | None) -> ModelSpec | None:
    """The ModelSpec of a `model_fn` that is a model factory -- it returns (module, example_inputs[, loss_fn]),
    as `package.module:factory` does for the CLI -- probed on the meta device; None for a function returning the
    module alone (or one that cannot run without memory: it is then taken as that)."""
    from partita.costmodel.models.registry import _probe_without_memory, factory_spec
    label = name or getattr(model_fn, "__qualname__", "model")
    try:
        probe = _probe_without_memory(model_fn, label)
    except PartitaError:
        return None
    return factory_spec(model_fn, label, probe) if isinstance(probe, tuple) else None


def model_spec(model: ModelArg, name: str | None = None, *, example_inputs=None, loss_fn=None,
               vocab: int | None = None, seq_len: int | None = None) -> ModelSpec:
    """The ModelSpec for a MODEL string, a ModelSpec, or a `model_fn` building the user's module.

    A `model_fn` keeps what the model called `name` (a MODEL string, e.g. the plan's model name) says
    about batches and loss -- only the module comes from `model_fn` -- unless `example_inputs`
    (batch -> tuple of tensors) and `loss_fn` (module, *batch -> loss) are given; `vocab` bounds token
    ids in the example batch (a token model given `vocab` trains on token cross-entropy without a `loss_fn`). `name` is read as data only: a preset, family or hf: name, never an import
    path (a plan file must not choose code; the plan's fingerprint is checked against `model_fn`'s module
    by the pre-flight instead). `seq_len` (the plan's): a MODEL string's model is built at that length
    (runtime.loop.session.at_seq_len), a given ModelSpec is taken as it is."""
    from partita.runtime.loop.session import at_seq_len  # loaded on use: the launcher (agent) never needs it
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return at_seq_len(resolve_model(model), seq_len)
    if isinstance(model, nn.Module) or not callable(model):
        raise PartitaError("model_fn must build the module (a callable returning an nn.Module), or be a MODEL "
                           f"string or ModelSpec; got {type(model).__name__}")
    own = example_inputs is not None and (loss_fn is not None or vocab is not None)  # a token model needs no loss_fn
    if not own and (factory := _as_factory(model, name)) is not None:
        return factory
    base = None
    if name is not None and not own:
        try:
            base = resolve_model(name, imports=False)
        except PartitaError:
            base = None
    if base is not None:
        return dataclasses.replace(at_seq_len(base, seq_len), build=model)
    if not own:
        raise PartitaError(f"the plan's model {name!r} is not one of partita's own or HuggingFace's models (a plan "
                           "never makes partita import code): pass example_inputs (batch -> tuple of tensors) and "
                           "loss_fn (module, *batch -> scalar loss), or the MODEL string itself as model_fn")
    return ModelSpec(name=name or getattr(model, "__name__", "model"), build=model, example_inputs=example_inputs,
                     loss_fn=loss_fn, seq_len=seq_len, vocab=vocab)


def run(plan: Plan | dict | str | os.PathLike, model_fn: ModelArg, dataset=None,
        steps: int = 100, *, seed: int = 0, lr: float = 1e-3, verify: bool = False,
        checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0, keep: int = 0, resume: bool = False,
        snapshot_every: int = 0, max_restarts: int = 0, data_dtype: str | None = None, losses_out: str | None = None,
        sync_batchnorm: bool = False, log_every: int = DEFAULT_EVERY, tensorboard: str | os.PathLike | None = None,
        print_report: bool = True, example_inputs=None, loss_fn=None, vocab: int | None = None,
        weight_decay: float = 0.0, warmup_steps: int = 0, lr_decay: str = "none", min_lr_ratio: float = 0.1,
        clip_grad_norm: float | None = None, save_final: str | os.PathLike | None = None,
        return_model: bool = False) -> RunResult:
    """Train `steps` steps of the model `model_fn` builds under `plan`, on every rank of the job.

    `dataset`: None for the model's synthetic batches, a token file, a `package.module:factory` name of a
    dataset, or a map-style or iterable dataset itself (torch, HuggingFace, a list; runtime.data.datasets).
    The other keywords are runtime.train's flags; progress lines (runtime.loop.progress) go out with the report
    (`print_report`). `save_final`: a file gets one state dict; a folder -- a str ending in "/", or a directory
    that exists (a pathlib.Path drops the trailing "/") -- a transformers model's save_pretrained output.
    `return_model`: rank 0's RunResult.model is then the trained model in one process (the module `model_fn`
    builds, on the CPU, every shard and stage gathered into it); it holds a second whole copy of the model.
    Raises PartitaError for a plan, data or checkpoint that does not fit (before any step), session.NonFiniteLoss
    for a NaN/inf loss, and VerifyFailed (on every rank, after the report) when `verify` finds the run differs
    from one process -- where the CLI exits 1."""
    from partita.runtime.loop.session import RunOptions, execute, prepare
    p = _plan(plan)
    spec = model_spec(model_fn, p.model.get("name"), example_inputs=example_inputs, loss_fn=loss_fn, vocab=vocab,
                      seq_len=p.train.get("seq_len"))
    opts = RunOptions(steps=steps, seed=seed, lr=lr, verify=verify,
                      checkpoint_dir=str(checkpoint_dir) if checkpoint_dir is not None else None,
                      checkpoint_every=checkpoint_every, keep=keep, resume=resume, snapshot_every=snapshot_every,
                      max_restarts=max_restarts,
                      data=str(dataset) if isinstance(dataset, os.PathLike) else dataset, data_dtype=data_dtype,
                      losses_out=losses_out, sync_batchnorm=sync_batchnorm, log_every=log_every,
                      tensorboard=str(tensorboard) if tensorboard is not None else None, print_report=print_report,
                      weight_decay=weight_decay, warmup_steps=warmup_steps, lr_decay=lr_decay,
                      min_lr_ratio=min_lr_ratio, clip_grad_norm=clip_grad_norm,
                      save_final=str(save_final) if save_final is not None else None, return_model=return_model)
    world = dist.get_world_size() if dist.is_initialized() else env_world()[2]
    show_library_warnings_once(dist.get_rank() if dist.is_initialized() else env_world()[0])
    own = not dist.is_initialized()
    ok = False
    try:
        agree_on_attempt()  # several nodes with restarts: the same attempt number on every rank
        prep = prepare(p, spec, opts, world)
        result, code = execute(p, spec, opts, prep)
        ok = True
        if code != EXIT_OK:
            raise VerifyFailed(result)
        return result
    finally:
        if own:
            gc.collect()  # free FSDP state (reference cycles) while its process groups still exist
            teardown(ok)


def procs_per_node(world: int, nnodes: int) -> int:
    """Worker processes per node: the plan's world size shared equally by the nodes."""
    if nnodes < 1:
        raise PartitaError("--nnodes must be at least 1")
    if world % nnodes:
        fits = ", ".join(str(n) for n in range(1, world + 1) if world % n == 0)
        raise PartitaError(f"the plan is for {world} ranks, which {nnodes} nodes cannot share equally "
                           f"(processes per node = world size / nnodes): use --nnodes {fits}")
    return world // nnodes


def launch(plan_path: str | os.PathLike, model: str, steps: int, nproc: int | None = None, *,
           nnodes: int | str = 1, rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
           rdzv_timeout: float | None = None, max_restarts: int | None = None, rescale_every: float | None = None,
           env: dict | None = None, **flags) -> int:
    """Start torchrun on runtime.train for the plan at `plan_path` on this node and wait; returns its exit
    code (0; 1 --verify failed; 2 plan/data/checkpoint does not fit; 3 NaN loss; 128 + N a signal N stopped
    it; else 1). A failing rank's message is printed once, as `partita: error: rank R: ...` on stderr.

    One node: `nproc` defaults to the plan's world size. Several nodes: call it with the same arguments on
    every node, `nnodes=N, rdzv_endpoint="host:port"` (c10d rendezvous on a port of one of the nodes) and
    optionally `rdzv_id` (one per job) and `rdzv_timeout` (seconds to wait for the other nodes, default
    runtime.launcher.rendezvous.DEFAULT_TIMEOUT); `nproc` defaults to world size / nnodes. `max_restarts` goes to
    torchrun and runtime.train; other keywords are runtime.train flags (verify=True, checkpoint_dir="ckpt",
    checkpoint_every=2, resume=True, data="tokens.bin", losses_out="out.json", seed=..., lr=...). Raises
    PartitaError for a value that cannot run (steps < 1, nnodes not dividing the world size) before any
    process starts.

    An elastic job (runtime.launcher.elastic): `plan_path` a plan set directory, `nnodes="MIN:MAX"`, a checkpoint
    directory and interval in `flags`; `max_restarts` defaults to elastic.DEFAULT_RESTARTS, `rescale_every` to
    elastic.DEFAULT_RESCALE_EVERY."""
    from partita.runtime.launcher.flags import RUN_FLAGS, names, to_argv
    from partita.runtime.train import argument_errors, build_parser
    known = names(RUN_FLAGS) - {"steps", "max_restarts"}
    unknown = sorted(k for k in flags if k not in known)
    if unknown:
        raise TypeError(f"launch() got flags runtime.train does not take: {', '.join(unknown)}")
    nnodes = _node_count(nnodes)
    if is_elastic(nnodes):
        if why := launch_refusal(str(plan_path), nnodes, flags.get("checkpoint_dir"), flags.get("checkpoint_every")):
            raise PartitaError(why)
        nproc = nproc or elastic_procs_per_node(str(plan_path), nnodes)
        max_restarts = DEFAULT_RESTARTS if max_restarts is None else max_restarts
    elif rescale_every is not None:
        raise PartitaError("rescale_every is for elastic jobs (nnodes='MIN:MAX' with a plan set)")
    nproc = nproc or procs_per_node(Plan.load(plan_path).mesh.world_size, nnodes)
    argv = [str(plan_path), "--model", model, "--steps", str(steps), "--nproc-per-node", str(nproc),
            "--nnodes", str(nnodes)]
    if rdzv_endpoint:
        argv += ["--rdzv-endpoint", rdzv_endpoint, *(["--rdzv-id", rdzv_id] if rdzv_id else []),
                 *(["--rdzv-timeout", str(rdzv_timeout)] if rdzv_timeout else [])]
    if max_restarts:
        argv += ["--max-restarts", str(max_restarts)]
    if rescale_every is not None:
        argv += ["--rescale-every", str(rescale_every)]
    argv += to_argv(flags, RUN_FLAGS)
    errors = argument_errors(build_parser().parse_args(argv))
    if errors:
        raise PartitaError(errors[0])
    full_env = {**os.environ, **(env or {})}
    root = str(Path(__file__).resolve().parents[1])  # so `-m partita.runtime.train` resolves from a source checkout
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, full_env.get("PYTHONPATH")]))
    return run_forwarding_signals([sys.executable, "-m", "partita.runtime.train", *argv], full_env)


def _node_count(nnodes: int | str):
    """launch()'s nnodes as runtime.train parses --nnodes: an int, or "MIN:MAX" (runtime.launcher.elastic)."""
    import argparse
    try:
        return node_count(str(nnodes))
    except argparse.ArgumentTypeError as e:
        raise PartitaError(str(e)) from None


def agent_main(args, argv: list[str]) -> int:
    """partita.runtime.train's launcher mode: torchrun's agent for this node on the same command minus the launcher
    flags (runtime.train.LAUNCHER_FLAGS)."""
    from partita.runtime.launcher.flags import RUN_FLAGS, to_argv
    try:
        nnodes = args.nnodes or 1
        nproc = args.nproc_per_node or (elastic_procs_per_node(args.plan, nnodes) if is_elastic(nnodes) else
                                        procs_per_node(Plan.load(args.plan).mesh.world_size, nnodes))
    except PartitaError as e:
        stderr_line(f"partita: error: {e}")
        return 2
    worker = [args.plan, "--model", args.model, *to_argv(args, RUN_FLAGS)]  # minus the launcher flags
    die_with_parent()  # a launcher whose own parent (partita run, a batch script) is killed stops its workers
    return agent(worker, nproc, nnodes=nnodes, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                 max_restarts=args.max_restarts, rdzv_timeout=args.rdzv_timeout, losses_out=args.losses_out,
                 rescale_every=args.rescale_every, hang_timeout=args.hang_timeout)
