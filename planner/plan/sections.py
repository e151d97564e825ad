"""The sections of a plan that describe it rather than run it -- model, cluster, predicted, solver, baselines --
checked as the commands that show them read them (explain, compare, export, the run report).

A plan file is untrusted input. planner.plan's loader checks what the runtime executes (mesh, schedule, stages,
blocks); this module checks the rest, so a plan whose `predicted.step_time_s` is a string, whose baseline has no
mesh or whose model config names a layer count of `[]` is one line when it is loaded, never a traceback in the
command that formats it. Each field is checked only where it is present (hand-written plans and plans written
before a field existed leave fields out; the commands show what is there), and fields no command reads are
left alone (their strings are still single printable lines: planner.plan.checks._check_text).

A figure (seconds, bytes, rates, counts) is a finite number from 0 to MAX_FIGURE; a step time is more than 0
(reports divide by it).
"""
from __future__ import annotations

import math
from typing import Any

MAX_FIGURE = 1e30
"""The largest figure a plan reports: far beyond any cluster's bytes (a million 141 GB devices hold 1.4e17),
seconds or FLOP/s, and small enough that every format of it (a float, `.4g`) stays a number."""


class _Spec:
    """What a value may be; `check` returns a description of what is wrong, or None."""

    def check(self, value: Any) -> str | None:
        raise NotImplementedError


class _Figure(_Spec):
    def __init__(self, *, whole: bool = False, positive: bool = False):
        self.whole, self.positive = whole, positive

    def check(self, value):
        ok_type = isinstance(value, int) if self.whole else isinstance(value, (int, float))
        if not ok_type or isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)) \
                or not (0 < value if self.positive else 0 <= value) or value > MAX_FIGURE:
            kind = "a whole number" if self.whole else "a number"
            low = "more than 0" if self.positive else "from 0"
            return f"must be {kind} {low} to {MAX_FIGURE:g}"
        return None


class _Type(_Spec):
    def __init__(self, kind: type, name: str):
        self.kind, self.name = kind, name

    def check(self, value):
        return None if isinstance(value, self.kind) else f"must be {self.name}"


class _Any(_Spec):
    def check(self, value):
        return None


class _Optional(_Spec):
    """null, or what `spec` allows."""

    def __init__(self, spec: _Spec):
        self.spec = spec

    def check(self, value):
        return None if value is None else self.spec.check(value)


class _Scalar(_Spec):
    def check(self, value):
        return None if value is None or isinstance(value, (str, bool, int, float)) else \
            "must be a name, a number, true/false or null"


NUMBER, POSITIVE, COUNT = _Figure(), _Figure(positive=True), _Figure(whole=True)
TEXT, FLAG, ANY, SCALAR = _Type(str, "a string"), _Type(bool, "true or false"), _Any(), _Scalar()


def checked(value: Any, spec, where: str) -> list[str]:
    """Problems of `value` against `spec`, each "where: what"; [] when it fits. `spec` is a _Spec, a list
    [item_spec] (or [item_spec, length]), or an object spec (see _object)."""
    if isinstance(spec, _Spec):
        why = spec.check(value)
        return [f"{where} {why}, got {_show(value)}"] if why else []
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{where} must be a JSON list, got {_show(value)}"]
        if len(spec) > 1 and len(value) != spec[1]:
            return [f"{where} must list {spec[1]} items, got {len(value)}"]
        return [p for i, x in enumerate(value) for p in checked(x, spec[0], f"{where}[{i}]")]
    return _object(value, spec, where)


def _object(value: Any, spec: dict, where: str) -> list[str]:
    """An object spec: {key: spec} for the keys it may have ("key!" for one it must have), and optionally
    "*": the spec of every other key's value (absent: other keys are anything)."""
    if not isinstance(value, dict):
        return [f"{where} must be a JSON object, got {_show(value)}"]
    problems = []
    for key, sub in spec.items():
        if key == "*":
            continue
        name, required = key.rstrip("!"), key.endswith("!")
        if name in value:
            problems += checked(value[name], sub, f"{where}.{name}")
        elif required:
            problems.append(f"{where} has no {name}")
    rest = spec.get("*")
    if rest is not None:
        named = {k.rstrip("!") for k in spec}
        problems += [p for k, v in value.items() if k not in named for p in checked(v, rest, f"{where}.{k}")]
    return problems


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _figures(*keys: str, spec=NUMBER) -> dict:
    return {k: spec for k in keys}


PREDICTED = {
    "step_time_s": POSITIVE,
    **_figures("tokens_per_s", "samples_per_s", "tflops_per_device", "mfu", "hfu", "peak_memory_bytes",
               "memory_capacity_bytes", "memory_reserved_bytes", "memory_headroom", "memory_headroom_bytes",
               "exposed_comm_s", "hidden_comm_s"),
    "breakdown": {"*": NUMBER},
    "memory_per_stage": [{"total!": NUMBER, "phase": TEXT, "*": NUMBER}],
    "memory_capacity_per_stage": [NUMBER],
    "host_memory_per_stage": [NUMBER],
    "memory_allocator_cache_per_stage": [NUMBER],
    "memory_allocator_cache_factors": [NUMBER, 2],
    "assumptions": [TEXT],
    "uncosted_ops": {"*": COUNT},
    "tied_weights": [{"params!": [TEXT, 2], "pp_ranks!": [COUNT, 2], "numel": COUNT,
                      **_figures("state_bytes!", "grad_bytes!", "allreduce_s!")}],
}
"""planner.estimate.build.predicted's fields (explain, compare and the run report show them)."""

BASELINE_MESH = {**_figures("pp!", "dp!", "tp!", "zero_stage!", "micro_batch_size!", "num_microbatches", spec=COUNT)}
BASELINE = {"name!": TEXT, "fits": FLAG, "why": TEXT, "mesh": _Optional(ANY), "predicted": _Optional(ANY)}
"""planner.estimate.baselines.run_baselines's rows; a row with a prediction has a mesh (explain's table shows both)."""
BASELINE_PREDICTED = {**PREDICTED, "step_time_s!": POSITIVE, "tflops_per_device!": NUMBER, "mfu!": NUMBER}

SOLVER = {
    "status": TEXT, "backend": TEXT, "formulation": TEXT, "pipeline": TEXT, "not_executed": TEXT,
    **_figures("wall_time_s", "capture_s", "total_s"), "mip_gap": _Optional(NUMBER),
    **_figures("candidates", "candidates_solved", "graph_nodes", spec=COUNT),
    "fixed": {"kernels": TEXT, "*": _Optional(ANY)},
}
"""planner.estimate.build's solver facts; `fixed` (planner.api): each fixed choice, a value or a list of them."""

MODEL_CONFIG = {
    "family": TEXT, "arch": TEXT, "task": TEXT, "rope_theta": POSITIVE,
    **_figures("layers", "hidden", "heads", "ffn", "kv_heads", "vocab", "seq", "experts", "top_k", "hidden_size",
               "num_attention_heads", "intermediate_size", "num_key_value_heads", "num_hidden_layers", "vocab_size",
               spec=_Optional(COUNT)),
}
"""The model config keys the exporters read (partita.export: model_shape, architecture): sizes as whole numbers."""
MODEL = {"parameters": COUNT, "config": MODEL_CONFIG, "batch_coupled": TEXT}
"""`batch_coupled`: why the model's loss couples the samples of a batch (costmodel.capture.coupling), when it does."""
CLUSTER = {"groups": [{"name": TEXT, "num_devices": _Figure(whole=True, positive=True), "device": TEXT}],
           "stage_groups": [TEXT]}
"""A heterogeneous cluster's groups and the group each pipeline rank runs on (planner.estimate.build)."""


def problems(data: dict, pp: int) -> list[str]:
    """What is wrong with the descriptive sections of a plan dict (already known to be an object whose mesh
    has `pp` pipeline ranks); [] when nothing is."""
    out = []
    for key, spec in (("model", MODEL), ("cluster", CLUSTER), ("predicted", PREDICTED), ("solver", SOLVER)):
        if isinstance(data.get(key), dict):  # planner.plan refuses one that is not an object
            out += checked(data[key], spec, key)
    stage_groups = (data.get("cluster") or {}).get("stage_groups")
    if isinstance(stage_groups, list) and len(stage_groups) < pp:
        out.append(f"cluster.stage_groups names {len(stage_groups)} group(s) for {pp} pipeline ranks")
    baselines = data.get("baselines")
    for i, row in enumerate(baselines if isinstance(baselines, list) else []):
        out += _baseline(row, f"baselines[{i}]")
    return out


def _baseline(row: Any, where: str) -> list[str]:
    found = checked(row, BASELINE, where)
    if found or not row.get("predicted"):
        return found
    return checked(row["predicted"], BASELINE_PREDICTED, f"{where}.predicted") + \
        checked(row.get("mesh"), BASELINE_MESH, f"{where}.mesh")
