"""The Python API (DESIGN.md): train under a plan from a script, or launch torchrun on the entry point.

    # in a script started by torchrun (or a plain `python` for a one-rank plan):
    result = runtime.run(plan, model_fn, dataset=None, steps=100, verify=True)
    result = runtime.plan_and_run("hf:llama", "2xcpu", {"global_batch": 4, "dtype": "fp32"}, steps=10)
    # from anywhere: spawn torchrun on runtime.train and wait for it
    code = runtime.launch("plan.json", "tiny-gpt", steps=100, verify=True, checkpoint_dir="ckpt")

`run` and `plan_and_run` initialise the default process group from the torchrun environment if none
exists (and destroy it again at the end); a group the caller created is used and left alone, so one
script can run several plans. They raise PartitaError (one line) where the entry point exits 2 or 3,
print the run report on rank 0, and return the RunResult on every rank (`result.verified` says whether
--verify's comparison passed).
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from costmodel import PartitaError, resolve_model
from costmodel.models import ModelSpec
from planner.plan import Plan
from runtime.mesh import env_world, init_default
from runtime.report import RunResult
from runtime.session import RunOptions, execute, prepare

ModelArg = str | ModelSpec | Callable[[], nn.Module]


def _plan(plan: Plan | dict | str | os.PathLike) -> Plan:
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return Plan.from_dict(plan)
    return Plan.load(plan)


def model_spec(model: ModelArg, name: str | None = None, *, example_inputs=None, loss_fn=None,
               vocab: int | None = None, seq_len: int | None = None) -> ModelSpec:
    """The ModelSpec for a MODEL string, a ModelSpec, or a `model_fn` building the user's module.

    A `model_fn` keeps what the model called `name` (a MODEL string, e.g. the plan's model name) says
    about batches and loss -- only the module comes from `model_fn` -- unless `example_inputs`
    (batch -> tuple of tensors) and `loss_fn` (module, *batch -> loss) are given; `vocab` bounds token
    ids in the example batch."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return resolve_model(model)
    if isinstance(model, nn.Module) or not callable(model):
        raise PartitaError("model_fn must build the module (a callable returning an nn.Module), or be a MODEL "
                           f"string or ModelSpec; got {type(model).__name__}")
    base = None
    if name is not None and (example_inputs is None or loss_fn is None):
        try:
            base = resolve_model(name)
        except PartitaError:
            base = None
    if base is not None:
        return dataclasses.replace(base, build=model)
    if example_inputs is None or loss_fn is None:
        raise PartitaError(f"model {name!r} is not a MODEL string the runtime knows: pass example_inputs "
                           "(batch -> tuple of tensors) and loss_fn (module, *batch -> scalar loss)")
    return ModelSpec(name=name or getattr(model, "__name__", "model"), build=model, example_inputs=example_inputs,
                     loss_fn=loss_fn, seq_len=seq_len, vocab=vocab)


def run(plan: Plan | dict | str | os.PathLike, model_fn: ModelArg, dataset: str | os.PathLike | None = None,
        steps: int = 100, *, seed: int = 0, lr: float = 1e-3, verify: bool = False,
        checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0, resume: bool = False,
        max_restarts: int = 0, data_dtype: str | None = None, losses_out: str | None = None,
        print_report: bool = True, example_inputs=None, loss_fn=None, vocab: int | None = None) -> RunResult:
    """Train `steps` steps of the model `model_fn` builds under `plan`, on every rank of the job.

    `dataset`: None for the model's synthetic batches, or a token file (runtime.data). The other keywords
    are runtime.train's flags. Raises PartitaError for a plan, data file or checkpoint that does not fit
    (before any step) and session.NonFiniteLoss for a NaN/inf loss."""
    p = _plan(plan)
    spec = model_spec(model_fn, p.model.get("name"), example_inputs=example_inputs, loss_fn=loss_fn, vocab=vocab,
                      seq_len=p.train.get("seq_len"))
    opts = RunOptions(steps=steps, seed=seed, lr=lr, verify=verify,
                      checkpoint_dir=str(checkpoint_dir) if checkpoint_dir is not None else None,
                      checkpoint_every=checkpoint_every, resume=resume, max_restarts=max_restarts,
                      data=str(dataset) if dataset is not None else None, data_dtype=data_dtype,
                      losses_out=losses_out, print_report=print_report)
    world = dist.get_world_size() if dist.is_initialized() else env_world()[2]
    prep = prepare(p, spec, opts, world)
    own = not dist.is_initialized()
    try:
        result, _ = execute(p, spec, opts, prep)
        return result
    finally:
        if own:
            gc.collect()  # free FSDP state (reference cycles) while its process groups still exist
            if dist.is_initialized():
                dist.destroy_process_group()


def _broadcast_text(text: str | None) -> str:
    """Rank 0's text on every rank, as UTF-8 bytes in two tensor broadcasts (no pickle)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    raw = text.encode() if text is not None else b""
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device) if raw else \
        torch.empty(0, dtype=torch.uint8, device=device)
    n = torch.tensor([data.numel()], dtype=torch.long, device=device)
    dist.broadcast(n, src=0)
    if data.numel() != n.item():
        data = torch.empty(int(n.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    return data.cpu().numpy().tobytes().decode()


def plan_and_run(model: ModelArg, cluster: Any = None, train: Any = None, steps: int = 100, *,
                 example_inputs=None, loss_fn=None, dataset=None, plan_out: str | os.PathLike | None = None,
                 **run_kwargs) -> RunResult:
    """Plan on rank 0 and train under that plan on every rank of a torchrun job.

    `cluster`: a CLUSTER string or planner Cluster (default "<world size>xcpu"; name the real cluster on
    GPUs); `train`: a planner.TrainConfig or a dict of its fields. The plan travels to
    the other ranks as JSON text; `plan_out` also writes it (rank 0). Other keywords go to `run`."""
    own = not dist.is_initialized()
    init_default()
    try:
        text = None
        if dist.get_rank() == 0:
            try:
                import planner  # lazily: only rank 0 loads the solver stack
                from planner.search import TrainConfig
                cfg = train if isinstance(train, TrainConfig) else TrainConfig(**(train or {}))
                spec = model_spec(model, model if isinstance(model, str) else None,
                                  example_inputs=example_inputs, loss_fn=loss_fn)
                plan = planner.plan(spec, cluster=cluster or f"{dist.get_world_size()}xcpu", train=cfg)
                text = plan.to_json()
                if plan_out is not None:
                    Path(plan_out).write_text(text)
            except PartitaError as e:
                text = json.dumps({"error": str(e)})
            except TypeError as e:  # bad TrainConfig fields
                text = json.dumps({"error": f"train: {e}"})
        data = json.loads(_broadcast_text(text))
        if "error" in data and "schema" not in data:
            raise PartitaError(f"planning failed: {data['error']}")
        return run(Plan.from_dict(data), model, dataset, steps, example_inputs=example_inputs, loss_fn=loss_fn,
                   **run_kwargs)
    finally:
        if own and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def launch(plan_path: str | os.PathLike, model: str, steps: int, nproc: int | None = None, *,
           max_restarts: int = 0, env: dict | None = None, **flags) -> int:
    """Spawn `torchrun --standalone` on runtime.train for the plan at `plan_path` and wait; returns its exit
    code. `nproc` defaults to the plan's world size; `max_restarts` goes to torchrun and runtime.train;
    other keywords are runtime.train flags (verify=True, checkpoint_dir="ckpt", checkpoint_every=2,
    resume=True, data="tokens.bin", losses_out="out.json", seed=..., lr=...)."""
    from runtime.train import build_parser
    known = {a.dest for a in build_parser()._actions}
    unknown = sorted(k for k in flags if k not in known or k in ("plan", "model", "steps", "help"))
    if unknown:
        raise TypeError(f"launch() got flags runtime.train does not take: {', '.join(unknown)}")
    nproc = nproc or Plan.load(plan_path).mesh.world_size
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    if max_restarts:
        cmd.append(f"--max-restarts={max_restarts}")
    cmd += ["-m", "runtime.train", str(plan_path), "--model", model, "--steps", str(steps)]
    if max_restarts:
        cmd += ["--max-restarts", str(max_restarts)]
    for key, value in flags.items():
        if value is True:
            cmd.append(_flag(key))
        elif value is not None and value is not False:
            cmd += [_flag(key), str(value)]
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # a fresh store per attempt (runtime.mesh)
    root = str(Path(__file__).resolve().parents[1])  # so `-m runtime.train` resolves from a source checkout
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, full_env.get("PYTHONPATH")]))
    return subprocess.call(cmd, env=full_env)
