"""The Plan: the one artifact that crosses from planner to runtime.

A plan is versioned JSON (`"schema": "partita.plan/1"`), keyed by module FQNs, holding the mesh, the
stages, per-module placements, the schedule, the predicted costs and the solver facts. A hand-written
plan has the same shape and goes through the same `Plan.from_dict` validation (one step per section, on the
checks of planner.plan.checks); loading never executes code (json only: no pickle, no eval).

Shape (the keys scripts rely on are marked *; see DESIGN.md):

    schema*      "partita.plan/1"
    model        {"name", "fingerprint", "config"}   fingerprint = costmodel.model_fingerprint(module)
    cluster      {"spec", "num_devices", "devices_per_node", "device"}
    train        {"global_batch", "seq_len", "dtype", "optimizer", "master_weights"}   master_weights "none": pure
                 bf16 (bf16 parameters, gradients and optimizer state, no fp32 copy); absent: "fp32", a bf16
                 plan's optimizer on fp32 master weights (plans written before it load unchanged)
    mesh*        {"pp", "dp", "cp", "tp", "ep"}   ranks are laid out pp-major, then dp, then cp, then tp (tp
                 fastest); cp (context parallelism) splits every sequence over cp ranks; ep (expert
                 parallelism) shards each MoE layer's experts over ep consecutive dp ranks (ep divides dp;
                 it adds no ranks). cp and ep are optional and 1 when absent (plans written before them)
    schedule*    {"name", "num_microbatches", "micro_batch_size", "virtual_stages"}
    stages       [{"index", "modules": [fqn ...], "split_at": fqn | null}]   pp x virtual_stages of them,
                 in model order; stage i runs on pipeline rank i % pp (interleaved: rank r holds stages
                 r, r + pp, r + 2 pp, ...)
    blocks       [{"fqn", "stage", "sharding": "replicate" | "tensor" | "sequence", "recompute": "none" | "selective" |
                  "op" | "full", "offload_activations": bool, "offload_states": bool}]
                 offload_states: the block's sharded parameters, gradients and optimizer state live in
                 host memory (FSDP2 CPUOffloadPolicy; needs zero_stage 3); optional "zero_stage": 2 | 3,
                 the block's own stage in a sharded plan (2: parameters stay gathered forward to backward)
    zero_stage   0-3: ZeRO sharding of parameters, gradients and optimizer state over the dp axis
    overlap      {"tp_comm": bool, "p2p": bool}: tensor-parallel collectives pipelined with the GEMMs they feed
                 (Megatron-Core --tp-comm-overlap, torch async TP), pipeline sends overlapped with compute
                 (--overlap-p2p-communication); priced, not run by partita's runtime. Absent: neither
    placements   {module fqn: "colwise" | "rowwise" | "sequence" | "vocab"}   tensor-parallel modules;
                 absent = replicated. colwise/rowwise: Megatron TP on an nn.Linear; sequence: a norm runs
                 sequence-parallel (Korthikanti et al. 2022), its block's residual stream sharded on the
                 sequence; vocab: an nn.Embedding split by vocabulary rows, or the LM head split by
                 vocabulary columns with a parallel cross-entropy (rules: runtime/parallel/tp.py)
    predicted*   {"step_time_s", "tokens_per_s", "tflops_per_device", "mfu", "peak_memory_bytes",
                  "exposed_comm_s", "hidden_comm_s", "breakdown": {...seconds, adding up to the step},
                  "memory_per_stage": [{category: bytes}], "assumptions": [str]}
    solver*      {"status", "wall_time_s", "mip_gap", "fixed": {decision: value}, ...}; fixed "kernels":
                 "compiled" means the plan was priced for torch.compile'd layers, and the runtime compiles them
    baselines    [{"name", "predicted", "mesh", "fits"}]   (with --baselines)
    embeddings   {"schema": "partita.embeddings/1", "tables": [...], ...}   a model's embedding tables: each
                 table's sharding, placement and ranks (planner.sparse.rec_plan); absent for models without tables
                 (plans written before it load unchanged)
    sync         {"mode": "synchronous", "options": {...}}   how the data-parallel replicas agree on the weights
                 (planner.plan.sync: the registry of modes); absent: synchronous, and a synchronous plan is
                 written without it (plans written before it load unchanged)
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field, asdict
from pathlib import Path
from typing import Any

from partita.costmodel.price.memory import MASTER_WEIGHTS  # noqa: F401 -- train.master_weights' values, one source
from partita.planner.plan.checks import (MAX_COUNT, MAX_DEPTH, MAX_DEVICES, MAX_GLOBAL_BATCH,  # noqa: F401 (re-exported)
                                         MAX_PLAN_BYTES, is_control, one_line)
from partita.planner.plan.checks import (_check_blocks_listed, _check_cluster, _check_model, _check_stage_lists,
                                         _check_text, _check_train, _depth, _ints, _list, _obj)
from partita.planner.plan.errors import PlanError
from partita.planner.plan.schedules import SCHEDULES, virtual_schedules
from partita.planner.plan.sections import problems as section_problems
from partita.planner.plan.sync import Sync, from_section as sync_from_section, problems as sync_problems

SCHEMA = "partita.plan/1"
SHARDINGS = ("replicate", "tensor", "sequence")
RECOMPUTE = ("none", "selective", "op", "full")
"""Activation recompute policies, most memory first (planner/enumerate/strategies.py says what each keeps)."""
SPLIT = ("tensor", "sequence")
"""Shardings that split a block over the tensor-parallel ranks (SHARDINGS less replicate)."""
TP_STYLES = ("colwise", "rowwise", "sequence", "vocab")
OVERLAPS = ("tp_comm", "p2p")
"""Keys of a plan's `overlap`: what communication it overlaps with compute (module docstring)."""


@dataclass(kw_only=True)
class Mesh:
    pp: int = 1
    dp: int = 1
    cp: int = 1
    """Context parallelism: each sequence split over cp ranks (attention gathers keys and values)."""
    tp: int = 1
    ep: int = 1
    """Expert parallelism: MoE experts sharded over ep consecutive dp ranks; a divisor of dp, adds no ranks."""

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(pp, dp, cp, tp) coordinates of a global rank; tp varies fastest, then cp, then dp."""
        return (rank // (self.dp * self.cp * self.tp), (rank // (self.cp * self.tp)) % self.dp,
                (rank // self.tp) % self.cp, rank % self.tp)

    def ep_coords(self, rank: int) -> tuple[int, int]:
        """(group, index) of a rank's expert-parallel group: dp ranks 0..ep-1 form group 0, and so on."""
        dp_rank = self.coords(rank)[1]
        return dp_rank // self.ep, dp_rank % self.ep


@dataclass(kw_only=True)
class Schedule:
    name: str = "1F1B"
    num_microbatches: int = 1
    micro_batch_size: int = 1
    virtual_stages: int = 1
    """Model chunks per pipeline rank (Interleaved1F1B: planner.plan.schedules, `virtual`); 1 otherwise."""


@dataclass(kw_only=True)
class Stage:
    index: int
    modules: list[str]
    split_at: str | None = None
    """The module FQN this stage begins at (a pipeline split point); None for the first stage."""


@dataclass(kw_only=True)
class BlockChoice:
    fqn: str
    stage: int
    sharding: str = "replicate"
    recompute: str = "none"
    offload_activations: bool = False
    offload_states: bool = False
    zero_stage: int | None = None
    """This block's own ZeRO stage, 2 or 3, where it differs from the plan's (a sharded plan may keep some
    blocks' parameters gathered from forward to backward); None: the plan's zero_stage."""


@dataclass(kw_only=True)
class Plan:
    model: dict[str, Any]
    cluster: dict[str, Any]
    train: dict[str, Any]
    mesh: Mesh
    schedule: Schedule
    stages: list[Stage]
    blocks: list[BlockChoice]
    placements: dict[str, str] = field(default_factory=dict)
    zero_stage: int = 0
    overlap: dict[str, bool] = field(default_factory=dict)
    """{"tp_comm": bool, "p2p": bool} (module docstring); {} or a missing key: not overlapped."""
    predicted: dict[str, Any] = field(default_factory=dict)
    solver: dict[str, Any] = field(default_factory=dict)
    baselines: list[dict[str, Any]] = field(default_factory=list)
    embeddings: dict[str, Any] | None = None
    """The embedding tables' section (planner.sparse.rec_plan), or None for a model without tables."""
    sync: Sync = field(default_factory=Sync)
    """How the data-parallel replicas agree on the weights (planner.plan.sync); synchronous by default."""
    schema: str = SCHEMA

    @property
    def kernels(self) -> str:
        """How the plan was priced to run its layers (costmodel.price.fusion.KERNELS): "eager" unless fixed."""
        fixed = self.solver.get("fixed")
        return fixed.get("kernels", "eager") if isinstance(fixed, dict) else "eager"

    def explain(self) -> str:
        """The report `partita plan` prints."""
        from partita.planner.plan.explain import explain
        return explain(self)

    # ---- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for b in d["blocks"]:
            if b["zero_stage"] is None:
                del b["zero_stage"]
        out = {"schema": d.pop("schema")}
        out.update(d)
        if not self.baselines:
            out.pop("baselines")
        if self.embeddings is None:
            out.pop("embeddings")
        if self.sync.is_default:  # the default is written as before the section existed
            out.pop("sync")
        else:
            out["sync"] = self.sync.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    MEASURED = ("wall_time_s", "capture_s", "total_s")

    def canonical_json(self) -> str:
        """The plan without the solver's measured wall times: byte-identical for identical inputs."""
        d = self.to_dict()
        d["solver"] = {k: v for k, v in d["solver"].items() if k not in self.MEASURED}
        return json.dumps(d, indent=2) + "\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """Read and validate a plan file: every check of the file itself happens here (what the file is, its size,
        text, JSON, nesting, shape, numbers); the runtime adds the checks against the model (runtime.launcher.checks), all
        before launch."""
        raw = _read_plan_file(path)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PlanError(f"plan {_shown_path(path)} is not a text file (byte 0x{raw[e.start]:02x} at offset {e.start} "
                            "is not UTF-8): a plan is the JSON file `partita plan --out` writes") from None
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan {_shown_path(path)} is not valid JSON ({e.msg} at line {e.lineno})") from None
        except RecursionError:
            raise PlanError(f"plan {_shown_path(path)} nests JSON deeper than Python can read; a plan nests at most "
                            f"{MAX_DEPTH} levels") from None
        except _Constant as e:  # NaN / Infinity literals
            raise PlanError(f"plan {_shown_path(path)}: {e}") from None
        except ValueError:  # an integer literal of thousands of digits (sys.get_int_max_str_digits)
            raise PlanError(f"plan {_shown_path(path)} holds a number of more digits than Python reads; no plan's "
                            "number has more than a few dozen") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> "Plan":
        """Validate a plan (solved or hand-written) and build it. Raises PlanError saying what is wrong."""
        _check_envelope(data)
        mesh = _mesh_of(data["mesh"])
        schedule = _schedule_of(data["schedule"])
        stages = _stages_of(data["stages"], mesh, schedule)
        blocks = _blocks_of(data["blocks"], stages)
        placements = _obj(data.get("placements", {}), "placements")
        for fqn, style in placements.items():
            if style not in TP_STYLES:
                raise PlanError(f"placements[{fqn!r}] is {style!r}; accepted: {list(TP_STYLES)}")
        if placements and mesh.tp == 1:
            raise PlanError("plan has tensor-parallel placements but mesh.tp = 1")
        zero = _zero_stage_of(data, blocks)
        overlap = _obj(data.get("overlap", {}), "overlap")
        for key, value in overlap.items():
            if key not in OVERLAPS or not isinstance(value, bool):
                raise PlanError(f"overlap.{key} is {value!r}; accepted: {', '.join(OVERLAPS)}, each true or false")
        _check_sections(data, mesh)
        train = _train_of(data["train"], mesh, schedule)
        return cls(model=_check_model(_obj(data["model"], "model")),
                   cluster=_check_cluster(_obj(data["cluster"], "cluster")), train=train,
                   mesh=mesh, schedule=schedule, stages=stages, blocks=blocks, placements=dict(placements),
                   zero_stage=zero, overlap=dict(overlap),
                   predicted=_obj(data.get("predicted", {}), "predicted"),
                   solver=_obj(data.get("solver", {}), "solver"),
                   baselines=_list(data.get("baselines", []), "baselines"),
                   embeddings=_embeddings(data.get("embeddings"), mesh.world_size, zero),
                   sync=sync_from_section(data.get("sync")))


def _check_envelope(data: Any) -> None:
    """A JSON object of this schema, of bounded depth, single-line text, with every section a plan needs."""
    if not isinstance(data, dict):
        raise PlanError("a plan must be a JSON object")
    if (depth := _depth(data)) > MAX_DEPTH:
        raise PlanError(f"plan nests {depth} levels deep; a plan nests at most {MAX_DEPTH}")
    if data.get("schema") != SCHEMA:
        raise PlanError(f"plan schema is {one_line(repr(data.get('schema')), 60)}; this partita reads {SCHEMA!r}")
    _check_text(data)
    missing = [k for k in ("model", "cluster", "train", "mesh", "schedule", "stages", "blocks") if k not in data]
    if missing:
        raise PlanError(f"plan is missing {missing}")


def _mesh_of(raw: Any) -> Mesh:
    """The mesh section: whole-number degrees (cp and ep 1 when absent), within MAX_DEVICES ranks, ep | dp."""
    mesh_raw = _obj(raw, "mesh")
    mesh = Mesh(**_ints(mesh_raw, "mesh", ("pp", "dp", "tp")),
                **_ints({k: mesh_raw.get(k, 1) for k in ("cp", "ep")}, "mesh", ("cp", "ep")))
    if mesh.world_size > MAX_DEVICES:
        raise PlanError(f"mesh pp x dp x cp x tp = {mesh.world_size:,} ranks, more than any cluster partita plans "
                        f"or runs: at most {MAX_DEVICES:,} (2^20)")
    if mesh.dp % mesh.ep:
        raise PlanError(f"mesh.ep ({mesh.ep}) must divide mesh.dp ({mesh.dp}): experts are sharded over "
                        f"data-parallel ranks")
    return mesh


def _schedule_of(raw: Any) -> Schedule:
    """The schedule section: a registered schedule, whole-number counts, virtual stages only where it has them."""
    sched_raw = _obj(raw, "schedule")
    if sched_raw.get("name") not in SCHEDULES:
        raise PlanError(f"schedule.name is {sched_raw.get('name')!r}; accepted: {list(SCHEDULES)}")
    schedule = Schedule(name=sched_raw["name"],
                        **_ints(sched_raw, "schedule", ("num_microbatches", "micro_batch_size")),
                        virtual_stages=_ints({"virtual_stages": sched_raw.get("virtual_stages", 1)},
                                             "schedule", ("virtual_stages",))["virtual_stages"])
    if (schedule.virtual_stages > 1) != SCHEDULES[schedule.name].virtual:
        raise PlanError(f"schedule.virtual_stages > 1 goes with {' or '.join(virtual_schedules())}, and only with it")
    return schedule


def _stages_of(raw: Any, mesh: Mesh, schedule: Schedule) -> list[Stage]:
    """The stages section: pp x virtual_stages stages in order, each listing modules no other stage lists."""
    stages = []
    for i, s in enumerate(_list(raw, "stages")):
        s = _obj(s, f"stages[{i}]")
        mods = _list(s.get("modules"), f"stages[{i}].modules")
        if not all(isinstance(m, str) for m in mods) or not mods:
            raise PlanError(f"stages[{i}].modules must be a non-empty list of module names")
        if s.get("index") != i:
            raise PlanError(f"stages[{i}].index must be {i}")
        split_at = s.get("split_at")
        if (i == 0) != (split_at is None) or (split_at is not None and not isinstance(split_at, str)):
            raise PlanError(f"stages[{i}].split_at must be null for the first stage and a module name otherwise")
        stages.append(Stage(index=i, modules=list(mods), split_at=split_at))
    _check_stage_lists(stages)
    if len(stages) != mesh.pp * schedule.virtual_stages:
        raise PlanError(f"plan has {len(stages)} stages but mesh.pp x schedule.virtual_stages = "
                        f"{mesh.pp * schedule.virtual_stages}")
    return stages


def _blocks_of(raw: Any, stages: list[Stage]) -> list[BlockChoice]:
    """The blocks section: each block's choices from the accepted vocabulary, on a stage that lists it."""
    blocks = []
    for i, b in enumerate(_list(raw, "blocks")):
        b = _obj(b, f"blocks[{i}]")
        if b.get("sharding") not in SHARDINGS:
            raise PlanError(f"blocks[{i}].sharding is {b.get('sharding')!r}; accepted: {list(SHARDINGS)}")
        if not isinstance(b.get("fqn"), str) or not isinstance(b.get("stage"), int) \
                or not 0 <= b["stage"] < len(stages):
            raise PlanError(f"blocks[{i}] needs a string fqn and a stage in [0, {len(stages)})")
        recompute = b.get("recompute", "none")
        if recompute not in RECOMPUTE:
            raise PlanError(f"blocks[{i}].recompute is {recompute!r}; accepted: {list(RECOMPUTE)}")
        flags = {k: b.get(k, False) for k in ("offload_activations", "offload_states")}
        if not all(isinstance(v, bool) for v in flags.values()):
            raise PlanError(f"blocks[{i}].offload_activations / offload_states must be true or false")
        own_zero = b.get("zero_stage")
        if own_zero is not None and (own_zero not in (2, 3) or isinstance(own_zero, bool)):
            raise PlanError(f"blocks[{i}].zero_stage is {own_zero!r}; accepted: 2, 3 (or absent: the plan's)")
        blocks.append(BlockChoice(fqn=b["fqn"], stage=b["stage"], sharding=b["sharding"],
                                  recompute=recompute, zero_stage=own_zero, **flags))
    _check_blocks_listed(blocks, stages)
    return blocks


def _zero_stage_of(data: dict, blocks: list[BlockChoice]) -> int:
    """The plan's ZeRO stage (0 when absent), and what the blocks' own choices need of it."""
    zero = data.get("zero_stage", 0)
    if zero not in (0, 1, 2, 3) or isinstance(zero, bool):
        raise PlanError(f"zero_stage is {zero!r}; accepted: 0, 1, 2, 3")
    if zero != 3 and any(b.offload_states for b in blocks):
        raise PlanError("offload_states needs zero_stage 3 (FSDP2 offloads sharded states)")
    if zero not in (2, 3) and any(b.zero_stage is not None for b in blocks):
        raise PlanError(f"a block's own zero_stage needs a sharded plan (zero_stage 2 or 3), not {zero}")
    return zero


def _check_sections(data: dict, mesh: Mesh) -> None:
    """The free-form sections are objects (baselines a list), and what explain, compare, export and reports
    read of them (planner.plan.sections), and the sync section (planner.plan.sync), have their shape."""
    for key in ("model", "cluster", "predicted", "solver"):
        _obj(data.get(key, {}), key)
    _list(data.get("baselines", []), "baselines")
    if found := section_problems(data, mesh.pp):  # what explain, compare, export and reports read
        raise PlanError(found[0])
    if found := sync_problems(data.get("sync")):
        raise PlanError(found[0])


def _train_of(raw: Any, mesh: Mesh, schedule: Schedule) -> dict:
    """The train section, whose global batch the mesh and schedule make up, with a schedule that runs."""
    train = _check_train(_obj(raw, "train"))
    gb = train.get("global_batch")
    if not isinstance(gb, int) or gb != mesh.dp * schedule.num_microbatches * schedule.micro_batch_size:
        raise PlanError(f"train.global_batch ({gb}) must equal mesh.dp x num_microbatches x micro_batch_size "
                        f"({mesh.dp} x {schedule.num_microbatches} x {schedule.micro_batch_size})")
    if why := SCHEDULES[schedule.name].refusal(schedule.num_microbatches, mesh.pp, schedule.virtual_stages):
        raise PlanError(why)  # the runtime's pre-flight says the same (runtime/parallel/pp.check_schedule)
    return train


def _embeddings(data: Any, world_size: int, zero_stage: int) -> dict | None:
    if data is None:  # a model without tables, or a plan written before them
        return None
    from partita.planner.plan.embeddings import DENSE_ZERO, validate_section  # the section's own module
    if zero_stage not in DENSE_ZERO:
        raise PlanError(f"a plan with embedding tables runs its dense part replicated or sharded: zero_stage must be "
                        f"one of {', '.join(map(str, DENSE_ZERO))}, not {zero_stage}")
    return validate_section(data, world_size)


class _Constant(ValueError):
    """A NaN or Infinity literal in a plan file (json reads them as floats unless told not to)."""


def _no_constant(name: str):
    raise _Constant(f"{name} is not a number a plan may hold")


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _shown_path(path) -> str:
    """A plan's path for an error line: quoted, escaped, short (the path is the user's text)."""
    return one_line(repr(str(path)), 200)


def _read_plan_file(path) -> bytes:
    """The bytes of a plan file, read only once it is known to be a regular file of at most MAX_PLAN_BYTES: a
    device (/dev/zero), a FIFO or a directory is refused before a byte is read, and at most MAX_PLAN_BYTES + 1
    bytes are read whatever size the file claims (a /proc file says 0; a file may grow while it is read).
    The file is opened without blocking (a FIFO without a writer would wait forever) and checked through
    the descriptor it was read from, so it cannot be swapped between the check and the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise PlanError(f"cannot read plan {_shown_path(path)}: {e.strerror}") from None
    try:
        mode, size = (st := os.fstat(fd)).st_mode, st.st_size
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
            raise PlanError(f"plan {_shown_path(path)} is {kind}, not a file: give the plan file `partita plan "
                            "--out` wrote")
        raw = b""
        if size <= MAX_PLAN_BYTES:
            with os.fdopen(os.dup(fd), "rb") as f:
                raw = f.read(MAX_PLAN_BYTES + 1)
            size = len(raw)
    except OSError as e:
        raise PlanError(f"cannot read plan {_shown_path(path)}: {e.strerror}") from None
    finally:
        os.close(fd)
    if size > MAX_PLAN_BYTES:  # checked again after the read: the file may have grown
        raise PlanError(f"plan {_shown_path(path)} is larger than any plan (more than {MAX_PLAN_BYTES:,} bytes): is "
                        "it the plan file `partita plan --out` wrote?")
    return raw


def fixed_text(fixed: dict) -> str:
    """Fixed choices {field: value or values} (SearchSpace.fixed, or a plan's solver.fixed with lists) as
    the flags that fix them: "tp=2, recompute=none|full, offload=off"."""
    show = lambda v: "on" if v is True else "off" if v is False else str(v)
    sep = lambda name: "," if name == "stage_layers" else "|"  # one count per stage, not alternatives
    return ", ".join(f"{name.replace('_', '-')}={sep(name).join(map(show, v)) if isinstance(v, (tuple, list)) else show(v)}"
                     for name, v in fixed.items())
