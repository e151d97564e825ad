"""The fixed set of plans `python -m benchmarks.gpu` runs on one GPU, made by the planner for that GPU's preset.

The set (CASES, then `largest_case`), bf16 with Adam, each planned for one GPU (cluster "1x<PRESET>"):

- M1 of GPU-MEASUREMENTS.md, a 1.50B Llama at global batch 8: the planner's own choice, and four variants
  that each fix one choice and leave the rest searched -- no recompute, full recompute, micro-batch 2,
  compiled layers (`--kernels compiled`);
- M1 at 32,768 tokens and global batch 2, the planner's own choice: a step where attention is about half of
  the FLOPs, beside the published long-sequence runs (llm-foundry, 16K-64K tokens) the held-out fit prices
  25-35% fast;
- llama3-8b at global batch 4 and 4096 tokens: the planner's own choice for a second, larger size. Trained
  under autocast over fp32 parameters it needs 120 GiB of model states: it fits no 80 GB GPU (recorded as the
  planner's one-line refusal, not run), and one H200 only beside the allocator headroom by offloading
  activations to host memory (the plan once chosen without the headroom ran out of memory there,
  GPU-MEASUREMENTS.md);
- UNSEEN: shapes no fitted row has (a GPT-family 1.3B and 350M with LayerNorm, GELU and learned positions, a
  Llama 3.2 3B-shaped and a 16-layer llama3-8b-wide model), the planner's own choice: planned and committed
  before they first ran, so their error is first contact, not a fit;
- "largest": the llama3-8b shape with the most layers the planner still fits on the GPU (found by bisection,
  up to LARGEST_MAX_LAYERS): the plan that fills memory.

Every plan is made for the lent machine's torch (LENT_TORCH): where its checkpoint policies do not see op
outputs (torch 2.11), no layer offloads what a selective or op recompute keeps (planner.plan.executable). And for
its host memory (LENT_HOST_MEMORY): a plan offloads no more than that machine holds.

Planning needs the solver (cvxpy, HiGHS). The lent GPU machines have neither and reach no package index
(TORCH-NOTES.md), so the set is planned beforehand on a CPU machine and shipped in benchmarks/gpu_plans/PRESET/
(`python -m benchmarks.gpu --plan-only`: a plan file per case and index.json with the commit it was planned
at); benchmarks.gpu plans afresh where the solver imports and reads the shipped plans where it does not.
"""
from __future__ import annotations

import importlib.util
from contextlib import contextmanager
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import common

PLANS_DIR = Path(__file__).resolve().parent / "gpu_plans"
M1 = "llama:layers=16,hidden=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256,seq=4096"
LLAMA3_8B_SHAPE = "llama:layers={layers},hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256,seq=4096"
"""llama3-8b's dimensions (costmodel.models PRESETS) at 4096 tokens, with the layer count left open."""
LARGEST_MAX_LAYERS = 64
PRESETS = ("H100-80GB", "H200-141GB")
"""The presets of the GPUs lent to this project's sessions (nvidia-h100-x1, nvidia-h200): plans shipped for each."""


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    model: str
    global_batch: int
    seq: int | None = None
    fixed: dict = field(default_factory=dict)
    """SearchSpace restrictions (planner.api.plan keywords); empty: the planner's own choice."""


CASES = (
    Case("m1-auto", "M1 (1.50B Llama), the planner's own choice", M1, 8),
    Case("m1-no-recompute", "M1, no recompute", M1, 8, fixed={"recompute": ("none",)}),
    Case("m1-full-recompute", "M1, full recompute", M1, 8, fixed={"recompute": ("full",)}),
    Case("m1-micro-batch-2", "M1, micro-batch 2", M1, 8, fixed={"micro_batch": (2,)}),
    Case("m1-compiled", "M1, compiled layers", M1, 8, fixed={"kernels": "compiled"}),
    Case("m1-seq-32k",
         "M1 at 32,768 tokens (attention about half of its FLOPs on the causal count), the planner's own choice",
         M1.replace("seq=4096", "seq=32768"), 2, seq=32768),
    Case("llama3-8b-auto", "llama3-8b at 4096 tokens, the planner's own choice", "llama3-8b", 4, seq=4096),
)

UNSEEN = (
    Case("gpt-1.3b", "GPT-3 XL shape (1.3B; LayerNorm, GELU, learned positions), the planner's own choice",
         "gpt:layers=24,hidden=2048,heads=16,vocab=50257,seq=2048", 16),
    Case("gpt-350m", "GPT-3 Medium shape (350M), the planner's own choice",
         "gpt:layers=24,hidden=1024,heads=16,vocab=50257,seq=2048", 32),
    Case("llama-3b", "Llama 3.2 3B shape (untied head), the planner's own choice",
         "llama:layers=28,hidden=3072,heads=24,kv_heads=8,ffn=8192,vocab=128256,seq=4096", 4),
    Case("llama-8b-16l", "llama3-8b's width at 16 layers and 2048 tokens, the planner's own choice",
         "llama:layers=16,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256,seq=2048", 8),
)
"""Cases whose model shapes no row of the fit has (benchmarks.published_data_gpu holds M1 only)."""

LENT_HOST_MEMORY = {"H200-141GB": 128 * 2**30}
"""The host memory of the lent machine of each preset (the device tool's KINDS.md: the H200 machine has 128 GiB
for its one GPU), where it is less than the preset's datacentre share (256 GB per H200): plans offload no more than
the machine holds, less LENT_HOST_RESERVE. The 'largest' plan made for 256 GB offloaded 135 GiB there and did not
finish 4 steps in 250 s (gpu.json, 2026-11-30)."""
LENT_HOST_RESERVE = 16 * 2**30
"""Host memory the plans leave to the rest of the machine: the operating system, the run's own process (torch, the
CUDA context's host side) and the pinned allocator's rounding of each buffer up to a power of two. Stated, not
measured."""
LENT_TORCH = {"version": "2.11.0+cu130", "policies_see_outputs": False}
"""The torch of the lent GPU machines (gpu.json's "torch"), which the plans must run on: its selective-checkpoint
policies are not handed op outputs (planner.plan.executable.checkpoint_policies_see_outputs)."""


@contextmanager
def for_lent_torch():
    """Plan as the planner would on the lent machine's torch (LENT_TORCH), whatever torch plans here."""
    from partita.planner.plan import executable
    saved = executable.checkpoint_policies_see_outputs
    executable.checkpoint_policies_see_outputs = lambda: LENT_TORCH["policies_see_outputs"]
    try:
        yield
    finally:
        executable.checkpoint_policies_see_outputs = saved


@dataclass
class Planned:
    """A case and what the planner made of it: a plan, or the line saying why none fits."""

    case: Case
    plan: object | None
    infeasible: str | None = None


def solver_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("cvxpy", "highspy"))


def plan_case(case: Case, preset: str):
    """The planner's plan for `case` on one `preset` GPU (InfeasibleError when none fits)."""
    from partita.planner.api import plan
    from partita.planner.search import TrainConfig
    with for_lent_torch():
        return plan(case.model, cluster=lent_cluster(preset),
                    train=TrainConfig(global_batch=case.global_batch, seq_len=case.seq), **case.fixed)


def lent_cluster(preset: str):
    """One `preset` GPU with the lent machine's host memory (LENT_HOST_MEMORY), less LENT_HOST_RESERVE."""
    from dataclasses import replace

    from partita.costmodel.hardware import parse_cluster
    cluster = parse_cluster(f"1x{preset}")
    if preset not in LENT_HOST_MEMORY:
        return cluster
    room = min(cluster.device.host_memory_bytes, LENT_HOST_MEMORY[preset] - LENT_HOST_RESERVE)
    return replace(cluster, device=replace(cluster.device, host_memory_bytes=float(room)))


def largest_case(preset: str) -> Case | None:
    """The llama3-8b shape at the most layers (<= LARGEST_MAX_LAYERS) the planner fits on one `preset` GPU,
    by bisection (memory grows with the layers); None when not even one layer fits."""
    from partita.costmodel.errors import InfeasibleError

    def case(layers: int) -> Case:
        return Case("largest", f"the llama3-8b shape at {layers} layers, the most the planner fits (fills memory)",
                    LLAMA3_8B_SHAPE.format(layers=layers), 4)

    def fits(layers: int) -> bool:
        try:
            plan_case(case(layers), preset)
            return True
        except InfeasibleError:
            return False
    if not fits(1):
        return None
    if fits(LARGEST_MAX_LAYERS):
        return case(LARGEST_MAX_LAYERS)
    lo, hi = 1, LARGEST_MAX_LAYERS  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return case(lo)


def plan_set(preset: str, cases=CASES + UNSEEN, largest: bool = True) -> list[Planned]:
    """Every case planned for one `preset` GPU, the largest that fits last."""
    from partita.costmodel.errors import InfeasibleError
    out = []
    for case in [*cases, *([c] if largest and (c := largest_case(preset)) else [])]:
        try:
            out.append(Planned(case, plan_case(case, preset)))
        except InfeasibleError as e:
            out.append(Planned(case, None, str(e)))
    return out


def write_plans(preset: str, planned: list[Planned], directory: Path = PLANS_DIR) -> Path:
    """The set as shipped plans: directory/PRESET/<case>.json and index.json (cases, commit, date)."""
    folder = Path(directory) / preset
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.json"):
        stale.unlink()
    for p in planned:
        if p.plan is not None:
            p.plan.save(folder / f"{p.case.name}.json")
    index = {"preset": preset, "commit": common.commit(), "date": time.strftime("%Y-%m-%d"),
             "cases": [{**asdict(p.case), "infeasible": p.infeasible} for p in planned]}
    (folder / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return folder


def read_plans(preset: str, directory: Path = PLANS_DIR) -> tuple[list[Planned], dict]:
    """The shipped set for `preset` and its index ({} and [] when none was shipped)."""
    from partita.planner.plan import Plan
    folder = Path(directory) / preset
    if not (folder / "index.json").exists():
        return [], {}
    index = json.loads((folder / "index.json").read_text())
    planned = []
    for c in index["cases"]:
        infeasible = c.pop("infeasible")
        case = Case(**{**c, "fixed": {k: tuple(v) if isinstance(v, list) else v for k, v in c["fixed"].items()}})
        planned.append(Planned(case, None if infeasible else Plan.load(folder / f"{case.name}.json"), infeasible))
    return planned, index
