"""partita: plans and runs parallel training for PyTorch -- one import name.

    import partita
    plan = partita.plan("gpt3-175b", cluster="128x8xA100-80GB",
                        train=partita.TrainConfig(global_batch=1536, seq_len=2048))
    print(plan.explain())
    plan.save("plan.json"); plan = partita.Plan.load("plan.json")
    partita.run(plan, model_fn, dataset, steps=100)     # inside torchrun; partita.launch(...) spawns it

The three layers are subpackages: partita.costmodel (capture and costs), partita.planner (the search
and the Plan) and partita.runtime (execution with torch.distributed). In the source tree they are the
top-level folders costmodel/, planner/ and runtime/, linked here; the packaging installs them under
partita/ only, so nothing named `planner` or `runtime` lands in site-packages.

Names load on first use, so `import partita` stays cheap and a training rank never loads the solver.
"""
import importlib

__version__ = "0.1.0"

_NAMES = {
    "plan": "partita.planner.api", "plan_search": "partita.planner.api", "plan_set": "partita.planner.api",
    "TrainConfig": "partita.planner.search", "SearchSpace": "partita.planner.search",
    "Plan": "partita.planner.plan", "PlanError": "partita.planner.plan",
    "run": "partita.runtime.api", "launch": "partita.runtime.api", "plan_and_run": "partita.api",
    "VerifyFailed": "partita.runtime.api",
    "PartitaError": "partita.costmodel.errors", "resolve_model": "partita.costmodel.models",
    "ModelSpec": "partita.costmodel.models",
}
__all__ = sorted(_NAMES)


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    if name in ("costmodel", "planner", "runtime"):
        return importlib.import_module(f"partita.{name}")
    raise AttributeError(f"module 'partita' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_NAMES, "costmodel", "planner", "runtime"])
