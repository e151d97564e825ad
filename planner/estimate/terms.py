"""A stage's predicted peak split into the terms a framework allocates: parameters, gradients, optimizer state,
activations, transients, and the allocator cache a plan leaves free beside them.

planner.estimate.phases.stage_memory gives a stage's peak as model states + activations + workspace, at the
phase where it peaks. Model states are split here as ZeRO counts them (costmodel.price.memory, planner.enumerate.
options.zero_state_bytes): for n parameters on the rank under ZeRO stage z over d data-parallel ranks,

    parameters  = p n          (/ d under ZeRO-3, except in a pipelined FSDP stage, which keeps them gathered)
    gradients   = what the options' `grad` holds; none at a peak that comes before the stage's first backward
                  (phases.grads_absent)
    optimizer   = the rest of the model states: K n (/ d from ZeRO-1 on), with FSDP's sharded copy beside a
                  gathered parameter and ZeRO-1's uneven partition

with p, K the state bytes per parameter of the precision policy (expert parameters over the d / ep ranks that
hold the same experts). The allocator cache is the caching allocator's predicted cache at the stage
(costmodel.hardware.Device.allocator_cache_bytes of the stage's largest transient and re-run layer), whether or
not the device charges it against its capacity: predicted reserved = allocated + that cache.
"""
from __future__ import annotations

import numpy as np

from partita.planner.enumerate.candidates import Candidate, model_state_bytes
from partita.planner.enumerate.options import _expert_split, pipelined_fsdp
from partita.planner.estimate.build import cache_terms
from partita.planner.estimate.phases import stage_memory


WITH_GRADIENTS = ("second backward", "optimizer step", "recompute")
"""The phases of planner.estimate.phases that hold every gradient; the others hold them only once the stage's first
backward has run (phases.grads_absent)."""


def parameter_bytes(numel_dense: float, numel_expert: float, edp: int, sb, zero: int, dp: int, whole: bool) -> float:
    """Bytes of parameters a rank holds (module docstring): sharded over the data-parallel ranks only under ZeRO-3
    outside a pipelined FSDP stage (`whole`)."""
    if zero == 3 and not whole:
        return sb.param * (numel_dense / dp + numel_expert / max(1, edp))
    return sb.param * (numel_dense + numel_expert)


def stage_parameters(c: Candidate, train, prefix: list[str], suffix: list[str], s: int) -> float:
    """Parameter bytes stage s holds under the candidate's solution: its layers, and the prefix groups
    (embeddings) on the first stage, the suffix groups (head) on the last."""
    sb = model_state_bytes(train, c.zero)
    dp = c.dp * c.cp  # context-parallel ranks shard and reduce as data-parallel ones (planner.enumerate.cp_ep)
    whole = pipelined_fsdp(c.pp > 1, c.zero, dp)
    total = 0.0
    for v, n in zip(c.options, c.solution.counts[s]):
        if n > 0:
            dense, expert, edp = _expert_split(v.base, dp, c.ep)
            total += n * parameter_bytes(dense, expert, edp, sb, c.zero if v.zero is None else v.zero, dp, whole)
    extra = c.parts.get("extra_options", {})
    groups = (prefix if s == 0 else []) + (suffix if s == c.pp - 1 else [])
    for name in groups:
        if name in extra:
            total += parameter_bytes(extra[name].param_numel, 0.0, dp, sb, c.zero, dp, whole)
    return total


def stage_terms(result, c: Candidate | None = None, s: int | None = None) -> dict:
    """Stage s's (default: the stage with the largest peak) predicted peak by term, in bytes, with the phase it
    peaks at and the allocator's predicted cache beside it (module docstring). `result`: the SearchResult
    `c` (default: its best) came from."""
    c = result.best if c is None else c
    rows = [stage_memory(c, i) for i in range(c.pp)]
    s = int(np.argmax([r["total"] for r in rows])) if s is None else s
    row = rows[s]
    params = stage_parameters(c, result.train, result.prefix, result.suffix, s)
    held = float(c.solution.counts[s] @ np.array([v.grad for v in c.options] or [0.0]) + c.parts["e_grad"][s])
    absent = getattr(c.problem, "grads_absent", None)
    before_backward = (row["phase"] not in WITH_GRADIENTS and absent is not None and bool(np.asarray(absent)[s]))
    grads = 0.0 if before_backward else held
    states = float(row["model_states"])
    transient, rebuilt = cache_terms(c)
    cache = float(result.cluster.device.allocator_cache_bytes(float(transient[s]), float(rebuilt[s])))
    allocated = float(row["total"])
    return {"stage": s, "phase": row["phase"], "parameters": params, "gradients": grads,
            "optimizer_state": states - params - grads, "activations": float(row["activations"]),
            "in_flight": float(np.asarray(c.problem.in_flight)[s]), "transients": float(row["workspace"]),
            "allocated": allocated, "allocator_cache": cache, "reserved": allocated + cache}
