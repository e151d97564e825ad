"""Execution of a Plan with torch.distributed: mesh, tensor/pipeline (1F1B, GPipe, interleaved 1F1B)/data
parallelism, ZeRO 2/3 (FSDP2), recompute, offload, bf16, train loop, DCP checkpoints and restarts, token-file
data, verify.

Entry point: `python -m torch.distributed.run ... -m partita.runtime.train PLAN.json --model MODEL --steps N`.
Python API (runtime.api): `run(plan, model_fn, dataset=None, steps=100, ...)` inside a torchrun job,
and `launch(plan_path, model, steps, nproc=None, **flags)` to spawn one (`partita.plan_and_run`, above the
runtime, also plans on rank 0).

Names load on first use (as in partita/__init__.py): a worker started as `-m partita.runtime.train` installs
its signal handlers (runtime.failure.stop) before torch is imported.
"""
import importlib

__all__ = ["run", "launch", "VerifyFailed"]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module("partita.runtime.api"), name)
    try:
        return importlib.import_module(f"partita.runtime.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module 'partita.runtime' has no attribute {name!r}") from None
