"""What a plan's JSON must be before it is a Plan (planner.plan.Plan.from_dict; Plan.load checks the file itself):
bounded nesting, single printable lines of text, whole numbers in range, and the shape of the sections the
runtime and the exporters read. A plan is untrusted input: every check here walks it iteratively and fails
with one line (PlanError) saying what is wrong."""
from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING, Any

from partita.costmodel.price.memory import MASTER_WEIGHTS
from partita.planner.plan.errors import PlanError

if TYPE_CHECKING:
    from partita.planner.plan import BlockChoice, Stage


def is_control(ch: str) -> bool:
    """A character that moves, colours or reorders text rather than showing it: newlines, terminal escapes,
    bidirectional overrides (Unicode categories Cc and Cf, and the line and paragraph separators); and a lone
    surrogate (Cs: JSON's "\\ud800" escape reads as one), which no UTF-8 stream can write."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def one_line(text, limit: int = 200) -> str:
    """Free text as one printable line for a comment, a script or a terminal: every control character shown as
    its escape (a newline cannot end a comment and start a command; an ANSI escape does not reach a
    terminal), cut at `limit` characters."""
    shown = "".join(ch.encode("unicode_escape").decode("ascii") if is_control(ch) else ch for ch in str(text))
    return shown if len(shown) <= limit else shown[:limit - 3] + "..."


MAX_COUNT = 2**31 - 1
"""The largest count a plan may hold (degrees, micro-batches, batch, sequence length): beyond it a number is a
typo, and it would overflow the runtime's int32 indices long before it trained."""
MAX_GLOBAL_BATCH = 2**30
"""The largest global batch planned (planner.enumerate.space.TrainConfig) and held by a plan (samples per step): beyond
~1e12 the step program's coefficients (micro-batch counts times seconds) are too large for HiGHS, which then
returns no solution (measured at 1e20); 2^30 = 1,073,741,824 is far above any published training run's batch
(thousands of sequences)."""
MAX_DEVICES = 2**20
"""The largest cluster planned (devices), and the most ranks a plan's mesh may have: 1,048,576, above the largest
training clusters reported."""
MAX_DEPTH = 32
"""The deepest JSON nesting a plan may have (a solved plan nests 5 levels)."""
MAX_PLAN_BYTES = 256 * 2**20
"""The largest plan file read (a 1,024-layer model's plan is a few MB)."""


def _depth(data: Any) -> int:
    """How deeply `data` nests lists and objects (iteratively: a hostile plan must not exhaust the stack)."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            todo += [(x, d + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


def _check_text(data: Any) -> None:
    """No string of the plan, key or value, holds a control character (is_control): a plan is untrusted input,
    and its names reach scripts (partita export), terminals (explain) and logs. Walked iteratively."""
    todo = [(data, "plan")]
    while todo:
        v, where = todo.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                todo += [(k, f"a key of {where}"), (x, f"{where}.{k}" if isinstance(k, str) else where)]
        elif isinstance(v, list):
            todo += [(x, f"{where}[{i}]") for i, x in enumerate(v)]
        elif isinstance(v, str) and any(is_control(ch) for ch in v):
            raise PlanError(f"{one_line(where, 80)} holds a control character ({one_line(v, 60)}): names and text in "
                            "a plan are single printable lines")


def _check_model(model: dict) -> dict:
    for key in ("name", "fingerprint"):
        if model.get(key) is not None and not isinstance(model[key], str):
            raise PlanError(f"model.{key} must be a string, got {_show(model[key])}")
    return model


def _check_cluster(cluster: dict) -> dict:
    """cluster's fields the exporters and the runtime read: names as strings, counts as whole numbers."""
    for key in ("spec", "device"):
        if cluster.get(key) is not None and not isinstance(cluster[key], str):
            raise PlanError(f"cluster.{key} must be a string, got {_show(cluster[key])}")
    for key in ("num_devices", "devices_per_node"):
        v = cluster.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_DEVICES):
            raise PlanError(f"cluster.{key} must be a whole number from 1 to {MAX_DEVICES:,}, got {_show(v)}")
    return cluster


def _check_train(train: dict) -> dict:
    """train's fields the runtime reads: counts in range, names as strings."""
    for key, most in (("global_batch", MAX_GLOBAL_BATCH), ("seq_len", MAX_COUNT)):
        v = train.get(key)
        if v is None and key == "seq_len":
            continue
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= most:
            raise PlanError(f"train.{key} must be a whole number from 1 to {most:,}, got {_show(v)}")
    for key in ("dtype", "optimizer", "master_weights"):
        if train.get(key) is not None and not isinstance(train[key], str):
            raise PlanError(f"train.{key} must be a name (a string), got {_show(train[key])}")
    master = train.get("master_weights", "fp32")
    if master not in MASTER_WEIGHTS:
        raise PlanError(f"train.master_weights must be one of {', '.join(MASTER_WEIGHTS)}, got {_show(master)}")
    if master == "none" and train.get("dtype") != "bf16":
        raise PlanError(f"train.master_weights none (pure bf16) needs train.dtype bf16, got {_show(train.get('dtype'))}")
    return train


def _show(v: Any) -> str:
    """A value for an error line: short, whatever it is."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_stage_lists(stages: list[Stage]) -> None:
    """No module listed twice: not twice in one stage, not in two stages, not beside one of its ancestors."""
    where: dict[str, int] = {}
    for s in stages:
        for fqn in s.modules:
            if fqn in where:
                again = "a second time" if where[fqn] == s.index else f"already on stages[{where[fqn]}]"
                raise PlanError(f"stages[{s.index}] lists module {fqn!r} {again}: a module runs on one stage, once")
            where[fqn] = s.index
    for fqn, i in where.items():
        parts = fqn.split(".") if fqn else []
        for k in range(len(parts)):
            parent = ".".join(parts[:k])
            if parent in where:
                raise PlanError(f"stages[{i}] lists module {fqn!r}, which stages[{where[parent]}] already holds "
                                f"as part of {parent or 'the whole model'!r}")


def _check_blocks_listed(blocks: list[BlockChoice], stages: list[Stage]) -> None:
    """Each block lies in the modules its stage lists (itself, an ancestor, or all of its listed parts)."""
    listed = {fqn: s.index for s in stages for fqn in s.modules}
    for i, b in enumerate(blocks):
        parts = b.fqn.split(".") if b.fqn else []
        owner = next((listed[a] for a in (".".join(parts[:k]) for k in range(len(parts), -1, -1)) if a in listed),
                     None)
        inside = {s for fqn, s in listed.items() if not b.fqn or fqn.startswith(b.fqn + ".")}
        if owner is None and not inside:
            raise PlanError(f"blocks[{i}] names module {b.fqn!r}, which no stage lists: list it in "
                            f"stages[{b.stage}].modules")


def _obj(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise PlanError(f"{where} must be a JSON object")
    return v


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise PlanError(f"{where} must be a JSON list")
    return v


def _ints(d: Any, where: str, keys: tuple[str, ...]) -> dict[str, int]:
    d = _obj(d, where)
    out = {}
    for k in keys:
        v = d.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_COUNT:
            raise PlanError(f"{where}.{k} must be a whole number from 1 to {MAX_COUNT:,}, got {_show(v)}")
        out[k] = v
    return out
