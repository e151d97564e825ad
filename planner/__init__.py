"""Decisions: which devices, stages, shardings and schedule a model trains with.

    import partita.planner as planner
    plan = planner.plan("gpt3-175b", cluster="128x8xA100-80GB",
                        train=planner.TrainConfig(global_batch=1536, seq_len=2048))
    print(plan.explain())
"""
from partita.planner.plan import SCHEMA, Plan, PlanError

# The solver stack (cvxpy, HiGHS) loads on first use, so the runtime's ranks, which only read Plans,
# do not pay for it.
_LAZY = {"TrainConfig": "partita.planner.search", "SearchSpace": "partita.planner.search", "plan_search": "partita.planner.api"}
__all__ = ["SCHEMA", "Plan", "PlanError", "plan", *_LAZY]


def plan(*args, **kwargs):
    """Capture a model, cost it for a cluster, and return the fastest plan that fits (planner.api.plan)."""
    from partita.planner.api import plan as _plan
    return _plan(*args, **kwargs)


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
