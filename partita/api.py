"""The front door's one call that plans and trains: `partita.plan_and_run(model, cluster, train, steps)` inside a
torchrun job plans on rank 0 (the planner) and trains under that plan on every rank (the runtime). It stands
above both layers: the runtime itself never imports the planner, only its Plan.

    result = partita.plan_and_run("hf:llama", "2xcpu", {"global_batch": 4, "dtype": "fp32"}, steps=10)
"""
from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from partita.costmodel.errors import PartitaError
from partita.planner.plan import Plan
from partita.runtime.api import ModelArg, model_spec, run
from partita.runtime.launcher.mesh import broadcast_text, init_default, teardown
from partita.runtime.loop.report import RunResult


def plan_and_run(model: ModelArg, cluster: Any = None, train: Any = None, steps: int = 100, *,
                 example_inputs=None, loss_fn=None, dataset=None, plan_out: str | os.PathLike | None = None,
                 **run_kwargs) -> RunResult:
    """Plan on rank 0 and train under that plan on every rank of a torchrun job.

    `cluster`: a CLUSTER string or planner Cluster (default "<world size>xcpu"; name the real cluster on
    GPUs); `train`: a planner.TrainConfig or a dict of its fields. The plan travels to
    the other ranks as JSON text; `plan_out` also writes it (rank 0). Other keywords go to `run`."""
    own = not dist.is_initialized()
    ok = False
    init_default()
    try:
        text = None
        if dist.get_rank() == 0:
            try:
                import partita.planner as planner  # lazily: only rank 0 loads the solver stack
                from partita.planner.search import TrainConfig
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
        data = json.loads(broadcast_text(text))
        if "error" in data and "schema" not in data:
            raise PartitaError(f"planning failed: {data['error']}")
        result = run(Plan.from_dict(data), model, dataset, steps, example_inputs=example_inputs, loss_fn=loss_fn,
                     **run_kwargs)
        ok = True
        return result
    finally:
        if own:
            gc.collect()
            teardown(ok)
