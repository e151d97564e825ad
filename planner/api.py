"""One call: planner.plan(model, cluster=..., train=TrainConfig(...)) -> Plan."""
from __future__ import annotations

import time

import torch.nn as nn

from costmodel import ModelSpec, model_fingerprint, resolve_model
from costmodel.errors import PartitaError
from costmodel.hardware import Cluster, parse_cluster
from costmodel.models import with_seq
from costmodel.trace import capture
from planner.build import build_plan
from planner.plan import Plan
from planner.search import SearchResult, TrainConfig, search


def _spec_for(model, example_inputs) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return resolve_model(model)
    if isinstance(model, nn.Module):
        if example_inputs is None:
            raise PartitaError("planning an nn.Module needs example_inputs (a tuple of tensors for forward)")
        inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        return ModelSpec(name=type(model).__name__, build=lambda: model,
                         example_inputs=lambda batch: tuple(t[:1].expand(batch, *t.shape[1:]) for t in inputs))
    raise PartitaError(f"model must be a preset name, a ModelSpec or an nn.Module, got {type(model).__name__}")


def plan_search(model, example_inputs=None, *, cluster: str | Cluster, train: TrainConfig,
                progress=None, baselines: bool = False) -> tuple[SearchResult, Plan]:
    """Capture, cost and search; returns the search (every candidate, for notebooks) and the chosen Plan."""
    spec = with_seq(_spec_for(model, example_inputs), train.seq_len)
    cl = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    t0 = time.perf_counter()
    graph = capture(spec, dtype=train.dtype)
    result = search(graph, cl, train, progress=progress)
    fingerprint = _fingerprint(spec)
    p = build_plan(result, spec.name, fingerprint, spec.config)
    if baselines:
        from planner.baselines import run_baselines
        p.baselines = run_baselines(graph, cl, train)
    p.solver["total_s"] = time.perf_counter() - t0
    return result, p


def plan(model, example_inputs=None, *, cluster: str | Cluster, train: TrainConfig, progress=None,
         baselines: bool = False) -> Plan:
    """Capture `model`, cost it for `cluster`, and return the fastest plan that fits (see DESIGN.md)."""
    return plan_search(model, example_inputs, cluster=cluster, train=train, progress=progress,
                       baselines=baselines)[1]


def _fingerprint(spec: ModelSpec) -> str:
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        return model_fingerprint(spec.build())
