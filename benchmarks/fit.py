"""Kernel constants by least squares, one set per GPU generation and software stack, and their error on
data the fit did not see (leave-one-source-out).

    python -m benchmarks.fit             # fit; write costmodel/fitted_constants.json and results/fit.json
    python -m benchmarks.fit --check     # fit and print; write nothing

What is fitted to what (every constant in costmodel/fitted_constants.json says which of these made it):

1. Kernel timings (`KERNEL_SETS`: what a lent GPU measured, benchmarks/data/kernels_*.json) give their
   generation and stack everything they measure: the GEMM curve (e_max, h_mn, the split-K slice, the per-launch
   latency), each attention kernel's curve, the achievable HBM bandwidth (costmodel.hardware.kernel_fit).
2. Published training runs (benchmarks.published_data, each with its stack) give the *levels* of the
   other groups: per (generation, stack) the GEMM efficiency e_gemm and the fused-attention efficiency
   e_attn (forward and backward together, the kernel curve's backward/forward ratio kept; stacks that
   share their GEMMs share e_gemm, costmodel.hardware.stacks `gemm`), and per (generation, attention kernel) the
   sequence length h_seq at which attention runs at half of it -- only where one model ran at sequences
   SWEEP (4x) apart (llm-foundry's sweeps over 512-65536 tokens); elsewhere level and curve cannot be told
   apart and the kernel timings' curve holds. No efficiency is fitted above 1. A group with kernel
   timings keeps them, and its whole steps on one GPU fit one number, its `step_efficiency` (memory-bound
   operators inside a training step against a copy timed alone; GEMMs and attention keep their timed
   rate, costmodel.price.kernels.node_time). A stack that runs its memory-bound operators as eager PyTorch
   kernels (costmodel.hardware.stacks `eager_elementwise`) fits its step_efficiency to its published rows too, per
   (generation, GEMM family) beside e_gemm: the models' widths tell them apart (norms, activations and
   residual adds grow with the width h, GEMMs with h^2). A stack that fuses them (apex, Transformer Engine,
   flash-attn's fused MLP) keeps 1: its fusion is not modelled, and a rate fitted to it would stand in for
   something else.
   Published kernel timings (benchmarks.published_kernels: FlashAttention-2's README charts, each bar a
   kernel row of its stack's attention kernel, forward + backward) fit, beside them, the attention level e_attn
   of their (generation, stack) and their kernel's h_seq on that generation, each bar priced exactly
   (costmodel.hardware.kernel_fit.predict, the pricing a training step's attention gets) and weighted by the same rule.
3. Shapes nobody measured are carried by stated rules (`derive`): Ampere's and Volta's GEMM tile curve is
   Hopper's with h_mn scaled by the SM count (108, 80 against 132 SMs: the output tiles that fill the
   GPU); a kernel's head-width and causal-block constants and its backward/forward ratio are the H200
   measurement of that kernel; achievable HBM bandwidth is the H200's measured fraction of the
   datasheet; a (generation, stack) with no data takes log e = a_generation + b_stack (attention: b_kernel,
   after the same kernel on the same GPU where another stack measured it -- where kernel timings measure
   that kernel on that GPU, theirs alone; step_efficiency of an eager stack: b_GEMM family, of a fused one:
   1), the two-way additive model
   fitted over the groups that have data, never above the fastest group measured on that generation
   (Volta, with no data, takes Ampere's a and ceiling).

The published fit minimises sum_rows w_row log(predicted / measured)^2, w = 1 / sqrt(rows of the row's
source in its group), so one large table does not own a group's constants. Pricing a row is a search
(seconds), so the fit is Gauss-Newton-like on a surrogate: around constants c0, a row's step time is

    T(c) = T(c0) * (e_gemm0 / e_gemm)^eps_gemm * (e_attn0 s(S, h0) / (e_attn s(S, h)))^eps_attn
                 * (step0 / step)^eps_step

with each elasticity eps measured by re-pricing the row with that kernel class (memory-bound operators for
eps_step) 10% slower (so overlap,
bubbles and the search's own choices are in it), S the row's sequence length. The surrogate is fitted,
the rows re-priced exactly at the result, and the step repeated until no fitted value moves by more than
`TOLERANCE` (0.5%) in an iteration; every published error is an exact pricing, never the surrogate's.

Physical bounds (`kernel_levels`, `defects`): a fitted efficiency is a kernel's rate inside training steps. Where
kernel timings measure that kernel on that GPU -- a lent GPU's (KERNEL_SETS), or the published charts
(benchmarks.published_kernels, fitted alone) -- the fitted level must lie within `BAND` of what they measured.
The fit does not clamp it there: a level outside the band, or a value at the least-squares bounds, is reported as
a model defect (the constant takes up what the rest of the model misses), in results/fit.json and on the console.

The headline weighs sources equally: beside the median over rows, the median of the per-source medians.

Rows with expert parallelism (MoE) are priced, reported and held out, but fit nothing (`fitted`): their grouped
expert GEMMs are priced on the dense GEMM curve, and a constant fitted to them would stand in for that.

Leave-one-source-out: for each source (training runs or kernel timings), the published fit is redone on the
surrogate (at the final linearisation) without that source's rows, groups left without data are derived as in
3, and that source's rows are priced exactly with the constants fitted without them. Those errors are the
headline of benchmarks.published. Each held-out row records `fold_unseen`: the constants of its pricing that
its source fits in-sample and no other source measures (a kernel or stack only it ran), which its fold could
only derive; benchmarks.published reports the held-out error of the other rows beside the headline.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

from benchmarks.common import commit, p95, write
from benchmarks.published_data import ITERATION, ROWS, Row
from benchmarks.published_kernels import KERNEL_ROWS, KernelRow
from partita.costmodel.hardware import FITTED_CONSTANTS, GPUS, KERNEL_FIELDS, UNALIGNED_FIELDS, gpu_device
from partita.costmodel.hardware.kernel_fit import errors as kernel_errors, fit_kernel_constants
from partita.costmodel.price.kernels import saturation, sdpa_kernel
from partita.costmodel.hardware.stacks import STACKS

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class KernelSet:
    path: str
    preset: str
    """The GPU preset the timings were made on."""
    stack: str


KERNEL_SETS = [KernelSet("benchmarks/data/kernels_h200_torch2.11.json", "H200-141GB", "pytorch")]
GENERATIONS = ("volta", "ampere", "hopper")
SMS = {"volta": 80, "ampere": 108, "hopper": 132}
"""Streaming multiprocessors per GPU (NVIDIA V100, A100 and H100 SXM datasheets): h_mn scales with them."""
SHAPE_FROM = "hopper"
"""The generation whose kernel timings give every generation's curve shapes (the only one measured)."""
TOLERANCE = 0.005
"""The fit has converged when an iteration -- the rows re-priced exactly at the last constants, the elasticities
measured again, the surrogate fitted -- moves no fitted value by more than this fraction."""
MAX_ITERATIONS = 12
"""Iterations before the fit stops unconverged (and says so: `result["converged"]` False, a warning printed)."""
STEP = 1.1
"""Elasticities: each kernel class re-priced this much slower."""
START = {"e_gemm": 0.7, "e_attn": 0.5, "h_seq": 1000.0, "step": 0.9}
"""Where the published fit starts (and the elasticities are first measured): round numbers, not data."""


# ------------------------------------------------------------------------------------------ groups

def generation(preset: str) -> str:
    return GPUS[preset][0]


def group_of(row: Row) -> str:
    """gen/stack of the constants `row` is priced with: a stack sharing another's constants (`Stack.constants`)
    is fitted as that one."""
    return f"{generation(row.hardware)}/{STACKS[row.table.stack].constants_family}"


def step_row(row: Row, kgroups: dict) -> bool:
    """Whether `row` fits its group's step_efficiency: a whole step of a kernel-timed group on one GPU. The
    multi-GPU runs of such a group (torchtitan's FSDP and TP runs on H100) spend their time in collectives
    as well, and fitted to them the step efficiency of memory-bound operators took up what the link model
    misses (0.11-0.35 of a copy's rate, where the H200's own steps say about half)."""
    return group_of(row) in kgroups and row.gpus == 1


def attention_kernel(gen: str, stack: str) -> str:
    """The fused-attention kernel a (generation, stack) runs for 16-bit training (costmodel.price.kernels)."""
    return sdpa_kernel(SimpleNamespace(name=gen, stack=stack, generation=gen), "bf16", 128)


def kernel_groups() -> dict[str, dict]:
    """Constants of the groups with kernel timings: {group: {"constants", "source", "errors"}}."""
    out = {}
    for ks in KERNEL_SETS:
        data = json.loads((ROOT / ks.path).read_text())
        device = gpu_device(ks.preset, ks.stack)
        constants = fit_kernel_constants(data["rows"], device)
        fitted = dataclasses.replace(device, **constants)
        errs = kernel_errors(data["rows"], fitted, anomalies=True)
        out[f"{generation(ks.preset)}/{ks.stack}"] = {
            "constants": constants, "source": f"fitted (costmodel.hardware.kernel_fit) to {ks.path}: {data['source']}",
            "errors": [{"kind": e["row"]["kind"], "row": {k: v for k, v in e["row"].items() if k != "anomaly"},
                        "key": e["key"], "error": e["error"], "anomaly": e["anomaly"]} for e in errs]}
    return out


# ------------------------------------------------------------------------------------ the parameters

def gemm_group(group: str) -> str:
    """gen/stack -> gen/gemm family: stacks that differ only in attention share their GEMMs (costmodel.hardware.stacks)."""
    gen, stack = group.split("/")
    return f"{gen}/{STACKS[stack].gemm_family}"


SWEEP = 4
"""h_seq is fitted to a kernel's published rows only where one model ran it at sequence lengths at least this
far apart; elsewhere level and curve cannot be told apart (a longer sequence is both 'more saturated' and
'more attention'), and the kernel timings' curve holds."""


def sweeps(rows: list[Row], gen_kernel: str) -> bool:
    """Whether the rows running attention kernel `gen/kernel` hold one model at sequences >= SWEEP apart."""
    seqs = defaultdict(set)
    for r in rows:
        g = group_of(r)
        if r.model.attention == "sdpa" and f"{g.split('/')[0]}/{attention_kernel(*g.split('/'))}" == gen_kernel:
            seqs[r.model.name].add(r.seq)
    return any(max(s) >= SWEEP * min(s) for s in seqs.values())


def row_params(row: Row, kgroups: dict) -> set[tuple[str, str]]:
    """(kind, key) of the published parameters that enter `row`'s pricing: ("e_gemm", gen/gemm family),
    ("e_attn", gen/stack) and ("h_seq", gen/kernel) for a group without kernel timings (the attention ones
    where it runs fused attention), ("step", gen/stack) for a kernel-timed group's one-GPU step."""
    g = group_of(row)
    gen, stack = g.split("/")
    out = {("step", g)} if step_row(row, kgroups) else set()
    if g in kgroups:
        return out
    out.add(("e_gemm", gemm_group(g)))
    if STACKS[stack].eager_elementwise:
        out.add(("step", gemm_group(g)))
    if row.model.attention == "sdpa":
        out |= {("e_attn", g), ("h_seq", f"{gen}/{attention_kernel(gen, stack)}")}
    return out


def published_params(rows: list[Row], kgroups: dict) -> list[tuple[str, str]]:
    """(kind, key) of each parameter the published rows fit (`row_params`), in a fixed order; a GEMM family
    with kernel timings takes none, and h_seq only a kernel with a sequence sweep (`sweeps`)."""
    every = set().union(*(row_params(r, kgroups) for r in rows))
    of = lambda kind: sorted(key for k, key in every if k == kind)  # noqa: E731
    return ([("e_gemm", f) for f in of("e_gemm") if f not in kgroups] + [("e_attn", g) for g in of("e_attn")]
            + [("h_seq", k) for k in of("h_seq") if sweeps(rows, k)] + [("step", g) for g in of("step")])


# ------------------------------------------------------------------ published kernel timings (charts)

def kernel_group(krow: KernelRow) -> str:
    return f"{generation(krow.chart.hardware)}/{STACKS[krow.chart.stack].constants_family}"


def kernel_params(krows: list[KernelRow], kgroups: dict) -> list[tuple[str, str]]:
    """(kind, key) of the parameters published kernel timings fit: their group's attention level e_attn and
    their kernel's sequence curve h_seq on that generation (the bars sweep 512 to 16k tokens); a group with
    its own kernel timings (KERNEL_SETS) keeps those."""
    out = set()
    for kr in krows:
        g = kernel_group(kr)
        if g not in kgroups:
            gen, stack = g.split("/")
            out |= {("e_attn", g), ("h_seq", f"{gen}/{attention_kernel(gen, stack)}")}
    return sorted(out)


def timed_groups(krows: list[KernelRow]) -> frozenset:
    """The (generation, stack) groups whose attention level published kernel timings measure."""
    return frozenset(kernel_group(kr) for kr in krows)


def kernel_log_errors(krows: list[KernelRow], groups: dict) -> list[float]:
    """log(predicted / measured) forward + backward seconds of each published kernel timing, priced exactly
    (costmodel.hardware.kernel_fit.predict: the same pricing as a training step's attention) with its group's constants."""
    from partita.costmodel.hardware.kernel_fit import predict
    devices, out = {}, []
    for kr in krows:
        g = kernel_group(kr)
        if g not in devices:
            constants = {k: v for k, v in groups[g]["constants"].items() if k in KERNEL_FIELDS}
            devices[g] = dataclasses.replace(gpu_device(kr.chart.hardware, kr.chart.stack), **constants)
        out.append(math.log(predict(kr.row, devices[g])["fwd_bwd_s"] / kr.seconds))
    return out


def derive(values: dict, kgroups: dict, timed: frozenset = frozenset()) -> dict[str, dict]:
    """Every (generation, stack) group's kernel constants: kernel-timed groups as fitted, published-fitted
    levels on the measured shapes, the rest by the module docstring's rules. `values` maps
    ("e_gemm", gen/family), ("e_attn", gen/stack), ("h_seq", gen/kernel) and ("step", gen/family) to fitted
    values; `timed`: the groups whose attention level published kernel timings measure (`timed_groups`).
    Returns {group: {"constants", "source"}}."""
    shape_group = next(k for k in kgroups if k.startswith(SHAPE_FROM + "/"))
    shape = kgroups[shape_group]["constants"]
    unaligned = {k: shape.get(k, 1.0) for k in UNALIGNED_FIELDS}  # cuBLAS's fallback kernels: a generation's own
    curves = shape.get("other_attention") or {}
    e_gemm = {g: v for (k, g), v in values.items() if k == "e_gemm"}
    e_attn = {g: v for (k, g), v in values.items() if k == "e_attn"}
    fitted_gemm, fitted_attn = set(e_gemm), set(e_attn)
    h_seq = {g: v for (k, g), v in values.items() if k == "h_seq"}
    for g, kg in kgroups.items():
        e_gemm.setdefault(g, kg["constants"]["matmul_efficiency"])
        e_attn.setdefault(g, kg["constants"]["attention_efficiency"])
        gen = g.split("/")[0]
        for kernel, c in (kg["constants"].get("other_attention") or {}).items():
            h_seq.setdefault(f"{gen}/{kernel}", c["half_seq"])
    # attention data by the kernel each group ran: a group without its own fit takes its kernel's on its GPU.
    # Where kernel timings measure a kernel on a GPU, its level there is theirs: the level a stack's training
    # rows alone fit also takes up what else their steps miss (hopper/te-2024-flash2's FlashAttention-2 fits
    # 0.11 of peak, FlashAttention-2's own H100 chart 0.40), and would set the generation factor that carries
    # a kernel measured on one GPU to another (the additive model below).
    timed = set(timed) | set(kgroups)
    by_kernel, by_kernel_timed = defaultdict(list), defaultdict(list)
    for g, v in e_attn.items():
        key = f"{g.split('/')[0]}/{attention_kernel(*g.split('/'))}"
        by_kernel[key].append(math.log(v))
        if g in timed:
            by_kernel_timed[key].append(math.log(v))
    e_kernel = {k: math.exp(sum(v) / len(v)) for k, v in {**by_kernel, **by_kernel_timed}.items()}
    gemm_model, attn_model = additive(e_gemm), additive(e_kernel)
    steps = {g: v for (k, g), v in values.items() if k == "step"}
    step_model = additive(steps)
    out = {}
    for gen in GENERATIONS:
        for stack in STACKS:
            if STACKS[stack].constants:
                continue  # priced with the constants of the stack it names (costmodel.hardware.kernel_constants)
            g = f"{gen}/{stack}"
            if g in kgroups:
                step = values.get(("step", g))
                how = "step_efficiency fitted to its whole-step rows (published and GPU runs)"
                if step is None:  # held out, or never run whole: as a group without data (rule 3)
                    step, how = ((capped(step_model, steps, gen, STACKS[stack].gemm_family),
                                  "no whole-step rows: step_efficiency by the additive model of the fitted groups")
                                 if STACKS[stack].eager_elementwise else (1.0, "no whole-step rows: step_efficiency 1"))
                out[g] = {"constants": {**kgroups[g]["constants"], "step_efficiency": step},
                          "source": f"{kgroups[g]['source']}; {how}"}
                continue
            kernel = attention_kernel(gen, stack)
            curve = curves.get(kernel) or curves.get("flash2")
            family = STACKS[stack].gemm_family
            gemm, gemm_how = e_gemm.get(f"{gen}/{family}"), (
                f"e_gemm fitted to the published rows of {gen}/{family}" if f"{gen}/{family}" in fitted_gemm else
                f"e_gemm from {gen}/{family}'s kernel timings")
            if gemm is None:
                gemm, gemm_how = capped(gemm_model, e_gemm, gen, family), \
                    "e_gemm by the additive (generation + stack) model of the fitted groups, capped"
            attn, attn_how = e_attn.get(g), "e_attn fitted to its published rows"
            if attn is None and f"{gen}/{kernel}" in e_kernel:
                attn, attn_how = e_kernel[f"{gen}/{kernel}"], f"e_attn of {kernel} on {gen} where fitted or timed"
            if attn is None:
                attn, attn_how = capped(attn_model, e_kernel, gen, kernel), \
                    "e_attn by the additive (generation + kernel) model of the fitted groups, capped"
            step = values.get(("step", f"{gen}/{family}"))
            step_how = f"step_efficiency fitted to the published rows of {gen}/{family}"
            if not STACKS[stack].eager_elementwise:
                step, step_how = 1.0, "step_efficiency 1 (its memory-bound operators are fused, at the kernel rate)"
            elif step is None:
                step, step_how = capped(step_model, steps, gen, family), \
                    "step_efficiency by the additive (generation + stack) model of the fitted groups, capped"
            hs = h_seq.get(f"{gen}/{kernel}") or h_seq.get(f"ampere/{kernel}") or curve["half_seq"]
            constants = {
                "matmul_efficiency": gemm, "gemm_half_mn": shape["gemm_half_mn"] * SMS[gen] / SMS[SHAPE_FROM],
                "gemm_split_k": shape["gemm_split_k"], "gemm_half_dim": 0.0, "op_latency": shape["op_latency"],
                **{k: v if gen == SHAPE_FROM else 1.0 for k, v in unaligned.items()},
                "mem_efficiency": shape["mem_efficiency"],
                "attention_efficiency": attn, "attention_bwd_efficiency": attn * curve["bwd_efficiency"] / curve["efficiency"],
                "attention_half_seq": hs, "attention_half_dim": curve["half_dim"],
                "attention_causal_block": curve["causal_block"], "other_attention": None, "step_efficiency": step}
            how = [gemm_how, step_how, attn_how if g not in fitted_attn else "e_attn fitted to its published rows",
                   f"h_seq fitted to published sequence sweeps ({gen}/{kernel})" if f"{gen}/{kernel}" in h_seq
                   else f"h_seq borrowed ({'ampere' if f'ampere/{kernel}' in h_seq else SHAPE_FROM}/{kernel})",
                   f"GEMM and {kernel} curve shapes, launch latency and HBM fraction from {shape_group}'s kernel "
                   f"timings (h_mn x {SMS[gen]}/{SMS[SHAPE_FROM]} SMs)",
                   f"unaligned GEMMs from {shape_group}'s kernel timings" if gen == SHAPE_FROM and set(unaligned.values())
                   != {1.0} else f"unaligned GEMMs priced as aligned (not timed on {gen})"]
            out[g] = {"constants": constants, "source": "; ".join(how)}
    return out


def capped(model: tuple[dict, dict], data: dict, gen: str, effect: str) -> float:
    """exp(a_gen + b_effect) of an additive model (Volta, unmeasured, takes Ampere's a; an effect with no
    data the mean of the known ones), never above the largest value measured or fitted on that generation
    (a group nobody measured is not assumed faster than the fastest that was), nor above 1."""
    a, b = model
    like = gen if gen in a else "ampere"  # Volta, unmeasured, takes Ampere's a and Ampere's ceiling
    value = math.exp(a.get(like, 0.0) + b.get(effect, sum(b.values()) / len(b) if b else 0.0))
    same_gen = [v for k, v in data.items() if k.split("/")[0] == like]
    return min(value, max(same_gen) if same_gen else 1.0, 1.0)


def additive(values: dict[str, float]) -> tuple[dict, dict]:
    """log e[gen/effect] ~ a_gen + b_effect by least squares over the groups given (effect: a stack, a GEMM
    family or an attention kernel; b of the first effect in sorted order that has data = 0); returns (a, b)."""
    import numpy as np
    if not values:
        return {}, {}
    gens = sorted({g.split("/")[0] for g in values})
    stacks = sorted({g.split("/")[1] for g in values}, key=lambda s: (s != "pytorch", s))
    cols = gens + stacks[1:]
    A = np.zeros((len(values), len(cols)))
    y = np.zeros(len(values))
    for i, (g, v) in enumerate(sorted(values.items())):
        gen, stack = g.split("/")
        A[i, cols.index(gen)] = 1
        if stack != stacks[0]:
            A[i, cols.index(stack)] = 1
        y[i] = math.log(v)
    x = np.linalg.lstsq(A, y, rcond=None)[0]
    return ({gen: x[cols.index(gen)] for gen in gens},
            {stacks[0]: 0.0, **{s: x[cols.index(s)] for s in stacks[1:]}})


# ------------------------------------------------------------------------------------------- pricing

def price_rows(rows: list[Row], groups: dict, graphs: dict, scale: dict | None = None, label: str = "") -> dict:
    """{row key: priced row (benchmarks.published.price)} with each row's group constants; `scale`
    {"gemm"|"attn": factor} slows that kernel class by it (for elasticities)."""
    from benchmarks.published import price, row_key
    out, t0 = {}, time.perf_counter()
    for i, row in enumerate(rows):
        kernels = dict(groups[group_of(row)]["constants"])
        if scale and "gemm" in scale:
            kernels["matmul_efficiency"] /= scale["gemm"]
        if scale and "attn" in scale:
            kernels["attention_efficiency"] /= scale["attn"]
            kernels["attention_bwd_efficiency"] /= scale["attn"]
        if scale and "step" in scale:
            kernels["step_efficiency"] = kernels.get("step_efficiency", 1.0) / scale["step"]
        out[row_key(row)] = price(row, graphs, kernels)
        if label and (i + 1) % 50 == 0:
            print(f"  {label}: {i + 1}/{len(rows)} rows, {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def step_ratio(row: Row, base: dict, other: dict) -> float | None:
    """T_other / T_base of a row from its predicted metric (throughputs go as 1 / T)."""
    if base.get("predicted") is None or other.get("predicted") is None:
        return None
    v0, v1 = base["predicted"]["value"], other["predicted"]["value"]
    return v1 / v0 if row.table.metric == ITERATION else v0 / v1


@dataclasses.dataclass
class Linearisation:
    """Each priced row at constants c0: its predicted metric and elasticities (module docstring)."""

    groups: dict
    priced: dict
    eps_gemm: dict
    eps_attn: dict
    eps_step: dict = dataclasses.field(default_factory=dict)


def linearise(rows: list[Row], groups: dict, graphs: dict, kgroups: dict) -> Linearisation:
    from benchmarks.published import row_key
    base = price_rows(rows, groups, graphs, label="price")
    slow_s = price_rows([r for r in rows if any(k == "step" for k, _ in row_params(r, kgroups))], groups, graphs,
                        {"step": STEP}, label="memory-bound operators 10% slower")
    slow_g = price_rows(rows, groups, graphs, {"gemm": STEP}, label="GEMMs 10% slower")
    slow_a = price_rows([r for r in rows if r.model.attention == "sdpa"], groups, graphs, {"attn": STEP},
                        label="attention 10% slower")
    eps_g, eps_a, eps_s = {}, {}, {}
    for r in rows:
        k = row_key(r)
        rs = step_ratio(r, base[k], slow_s[k]) if k in slow_s else None
        eps_s[k] = math.log(rs) / math.log(STEP) if rs else 0.0
        rg = step_ratio(r, base[k], slow_g[k])
        eps_g[k] = math.log(rg) / math.log(STEP) if rg else 0.0
        ra = step_ratio(r, base[k], slow_a[k]) if k in slow_a else None
        eps_a[k] = math.log(ra) / math.log(STEP) if ra else 0.0
    return Linearisation(groups, base, eps_g, eps_a, eps_s)


def surrogate_log_error(row: Row, lin: Linearisation, groups: dict) -> float | None:
    """log(predicted / measured) of `row` under `groups`' constants, by the surrogate around `lin`."""
    from benchmarks.published import row_key
    k = row_key(row)
    base = lin.priced[k]
    if base.get("predicted") is None:
        return None
    g = group_of(row)
    c0, c1 = lin.groups[g]["constants"], groups[g]["constants"]
    log_t = lin.eps_gemm[k] * math.log(c0["matmul_efficiency"] / c1["matmul_efficiency"])
    if lin.eps_attn[k]:
        s0 = saturation(row.seq, c0["attention_half_seq"])
        s1 = saturation(row.seq, c1["attention_half_seq"])
        log_t += lin.eps_attn[k] * math.log(c0["attention_efficiency"] * s0 / (c1["attention_efficiency"] * s1))
    if lin.eps_step.get(k):
        log_t += lin.eps_step[k] * math.log(c0.get("step_efficiency", 1.0) / c1.get("step_efficiency", 1.0))
    sign = 1 if row.table.metric == ITERATION else -1
    return math.log(base["predicted"]["value"] / row.value) + sign * log_t


def weights(rows: list[Row]) -> dict:
    from benchmarks.published import row_key
    n = defaultdict(int)
    for r in rows:
        n[(r.table.source, group_of(r))] += 1
    return {row_key(r): 1 / math.sqrt(n[(r.table.source, group_of(r))]) for r in rows}


def fitted(row: Row) -> bool:
    """Whether `row` fits the kernel constants: every row but those with expert parallelism, which are priced,
    reported and held out like any other. An MoE step is mostly grouped expert GEMMs (DeepEP, Transformer Engine's
    grouped GEMM) and their all-to-alls, which partita prices as one dense GEMM per expert on the dense GEMM curve;
    a level fitted to them is the dense GEMMs' and attention's level bent to cover that (Qwen3-30B-A3B, priced 37%
    slow, took hopper/te-2024's attention efficiency to the bound 1.0 when it first entered the fit)."""
    return row.ep == 1


def fit_published(rows: list[Row], lin: Linearisation, kgroups: dict, start: dict | None = None,
                  krows: list[KernelRow] = (), levels: dict | None = None) -> dict:
    """Fitted values {(kind, key): value} of the published parameters, on the surrogate around `lin` for the
    training rows and exactly for the published kernel timings `krows`; with `levels` (kernel_levels), each
    efficiency a kernel timing measures kept within BAND of it (`physical_bounds`)."""
    from scipy.optimize import least_squares
    from benchmarks.published import row_key
    priced = [r for r in rows if lin.priced[row_key(r)].get("predicted") is not None and fitted(r)]
    params = list(dict.fromkeys(published_params(priced, kgroups) + kernel_params(krows, kgroups)))
    if not params:
        return {}
    w = weights(priced)
    n = defaultdict(int)
    for kr in krows:
        n[(kr.source, kernel_group(kr))] += 1
    wk = [1 / math.sqrt(n[(kr.source, kernel_group(kr))]) for kr in krows]  # weights()'s rule
    x0 = [math.log((start or {}).get(p, START[p[0]])) for p in params]

    def groups_of(x):
        return derive({p: math.exp(v) for p, v in zip(params, x)}, kgroups, timed_groups(krows))

    def residuals(x):
        groups = groups_of(x)
        return ([w[row_key(r)] * surrogate_log_error(r, lin, groups) for r in priced]
                + [a * e for a, e in zip(wk, kernel_log_errors(krows, groups))])
    box = [physical_bounds(p, levels) for p in params]
    lower, upper = [math.log(lo) for lo, _ in box], [math.log(hi) for _, hi in box]
    x0 = [min(max(v, lo + 1e-9), hi - 1e-9) for v, lo, hi in zip(x0, lower, upper)]
    x = least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac").x
    return {p: math.exp(v) for p, v in zip(params, x)}


# ------------------------------------------------------------------------------- physical bounds

BAND = (0.5, 1.2)
"""A fitted efficiency may lie from half to 1.2x of what kernel timings measured for that kernel on that GPU (the
lowest to the highest measurement where several exist). A kernel does not run faster inside a training step than
timed alone (1.2: the curve a fit puts through the timings' shapes against the training runs'); at less than half
of its timed rate the constant is taking up time the rest of the model misses."""
LS_BOUNDS = {"e_gemm": (0.05, 1.0), "e_attn": (0.05, 1.0), "step": (0.05, 1.0), "h_seq": (1.0, 1e5)}
"""The least-squares bounds of each kind of published parameter (fit_published): no efficiency above peak."""


def physical_bounds(param: tuple[str, str], levels: dict | None) -> tuple[float, float]:
    """The least-squares box of `param`: LS_BOUNDS, narrowed for an efficiency that kernel timings measure to BAND
    of what they measured (issue 45: no efficiency outside its kernel-measured bounds; one the fit presses
    against such a bound is a model defect, reported by `defects`, not a constant taking up other misses)."""
    lo, hi = LS_BOUNDS[param[0]]
    kernel = measured_kernel(param) if levels else None
    measured = levels.get(kernel) if kernel else None
    if measured:
        lo, hi = max(lo, BAND[0] * measured[0][0]), min(hi, BAND[1] * measured[-1][0])
    return lo, hi


def kernel_levels(kgroups: dict, krows: list[KernelRow]) -> dict[str, list[tuple[float, str]]]:
    """{"gen/gemm" or "gen/kernel": [(level, what measured it)]}: the GEMM and attention-kernel levels that kernel
    timings measure -- a lent GPU's (KERNEL_SETS) and the published charts (fitted alone)."""
    out = defaultdict(dict)
    for g, kg in kgroups.items():
        gen, stack = g.split("/")
        c, where = kg["constants"], kg["source"].split(":")[0]
        out[f"{gen}/gemm"][where] = c["matmul_efficiency"]
        out[f"{gen}/{attention_kernel(gen, stack)}"][where] = c["attention_efficiency"]
        for kernel, cc in (c.get("other_attention") or {}).items():
            out[f"{gen}/{kernel}"][where] = cc["efficiency"]
    if krows:
        start = {p: START[p[0]] for p in kernel_params(krows, kgroups)}
        charts = fit_published([], Linearisation(derive(start, kgroups), {}, {}, {}), kgroups, start=start,
                               krows=krows)
        for (kind, key), v in charts.items():
            if kind == "e_attn":
                gen, stack = key.split("/")
                out[f"{gen}/{attention_kernel(gen, stack)}"][f"published kernel charts ({kernel_group_sources(krows)})"] = v
    return {k: sorted((v, w) for w, v in m.items()) for k, m in out.items()}


def kernel_group_sources(krows: list[KernelRow]) -> str:
    return ", ".join(sorted({kr.source for kr in krows}))


def measured_kernel(param: tuple[str, str]) -> str | None:
    """The "gen/gemm" or "gen/kernel" a published efficiency parameter is the in-step level of (None: not an
    efficiency of one kernel)."""
    kind, key = param
    gen, rest = key.split("/")
    if kind == "e_gemm":
        return f"{gen}/gemm"
    if kind == "e_attn":
        return f"{gen}/{attention_kernel(gen, rest)}"
    return None


def defects(values: dict, levels: dict, rows: list[Row], kgroups: dict, krows: list[KernelRow] = ()) -> dict:
    """Fitted values the kernel measurements do not allow (`BAND`), values at their least-squares bounds, and the
    efficiencies no kernel timing bounds: {"band", "defects": [...], "unbounded": [...]}; each names the sources
    whose rows (or published kernel timings) enter its residuals."""
    fitted_by = defaultdict(set)
    for r in rows:
        for p in row_params(r, kgroups):
            fitted_by[p].add(r.table.source)
    for p in kernel_params(list(krows), kgroups):
        fitted_by[p] |= {kr.source for kr in krows}
    out, unbounded = [], []
    for p, v in values.items():
        name, sources = f"{p[0]}:{p[1]}", sorted(fitted_by.get(p, set()))
        lo_ls, hi_ls = LS_BOUNDS[p[0]]
        if min(abs(v / lo_ls - 1), abs(v / hi_ls - 1)) < 1e-6:
            out.append({"param": name, "value": v, "kind": "at the fit's bound", "bound": lo_ls if
                        abs(v / lo_ls - 1) < 1e-6 else hi_ls, "fitted_by": sources})
            continue
        kernel = measured_kernel(p)
        if kernel is None:
            continue
        measured = levels.get(kernel)
        if not measured:
            unbounded.append({"param": name, "value": v, "kernel": kernel, "fitted_by": sources})
            continue
        lo, hi = BAND[0] * measured[0][0], BAND[1] * measured[-1][0]
        if min(abs(v / lo - 1), abs(v / hi - 1)) < 1e-6:
            out.append({"param": name, "value": v, "kind": "at what kernel timings allow", "kernel": kernel,
                        "measured": [{"level": m, "measured_by": w} for m, w in measured], "allowed": [lo, hi],
                        "fitted_by": sources})
        elif not lo <= v <= hi:
            out.append({"param": name, "value": v, "kind": "outside what kernel timings allow", "kernel": kernel,
                        "measured": [{"level": m, "measured_by": w} for m, w in measured], "allowed": [lo, hi],
                        "fitted_by": sources})
    return {"band": list(BAND), "defects": out, "unbounded": unbounded}


# ------------------------------------------------------------------------------------------- the fit

def largest_move(before: dict, after: dict) -> tuple[float, str]:
    """(largest |after / before - 1| over the fitted values, its parameter) between two iterations."""
    moves = [(abs(after[p] / before[p] - 1), f"{p[0]}:{p[1]}") for p in after if p in before]
    moves += [(math.inf, f"{p[0]}:{p[1]}") for p in after if p not in before]
    return max(moves) if moves else (0.0, "")


def fit(rows: list[Row] | None = None, tolerance: float = TOLERANCE, max_iterations: int = MAX_ITERATIONS,
        loso: bool = True, krows: list[KernelRow] | None = None) -> dict:
    """The whole fit (module docstring): constants for every group, iterated until no fitted value moves by more
    than `tolerance`, in-sample and leave-one-source-out errors of the published rows and of the published kernel
    timings, kernel-row errors, and the constants' defects against the kernel measurements."""
    from benchmarks.published import row_key
    rows = list(ROWS if rows is None else rows)
    krows = list(KERNEL_ROWS if krows is None else krows)
    graphs: dict = {}
    kgroups = kernel_groups()
    values = {p: START[p[0]] for p in dict.fromkeys(published_params(rows, kgroups) + kernel_params(krows, kgroups))}
    groups = derive(values, kgroups, timed_groups(krows))
    levels = kernel_levels(kgroups, krows)
    history, converged = [], False
    for it in range(max_iterations):
        print(f"iteration {it + 1}: linearising {len(rows)} rows", flush=True)
        lin = linearise(rows, groups, graphs, kgroups)
        before, values = values, fit_published(rows, lin, kgroups, start=values, krows=krows, levels=levels)
        groups = derive(values, kgroups, timed_groups(krows))
        move, moved = largest_move(before, values)
        history.append({"iteration": it + 1, "values": _named(values), "largest_move": move, "moved": moved})
        print(f"  fitted: {_named(values)}\n  largest move {100 * move:.2f}% ({moved})", flush=True)
        if it > 0 and move <= tolerance:
            converged = True
            break
    if not converged:
        print(f"WARNING: the fit did not converge in {max_iterations} iterations (last move {100 * move:.2f}% of "
              f"{moved}, tolerance {100 * tolerance:.2f}%)", flush=True)
    final = price_rows(rows, groups, graphs, label="in-sample")
    out = {"groups": groups, "values": _named(values), "history": history, "kernel_groups": kgroups,
           "convergence": {"converged": converged, "iterations": len(history), "tolerance": tolerance,
                           "largest_move": move, "moved": moved},
           "linearisation": {k: [lin.eps_gemm[k], lin.eps_attn[k], lin.eps_step.get(k, 0.0)] for k in lin.priced},
           "kernel_levels": {k: [{"level": v, "measured_by": w} for v, w in m] for k, m in sorted(levels.items())},
           "defects": defects(values, levels, rows, kgroups, krows),
           "in_sample": {row_key(r): _err(final[row_key(r)]) for r in rows},
           "kernels_in_sample": _kernel_errs(krows, groups)}
    if loso:
        # the surrogate re-based on the exact in-sample pricing at the fitted constants
        lin = Linearisation(groups, final, lin.eps_gemm, lin.eps_attn, lin.eps_step)
        out["loso"], out["kernels_loso"] = leave_one_source_out(rows, lin, kgroups, values, graphs, krows, levels)
    return out


def leave_one_source_out(rows: list[Row], lin: Linearisation, kgroups: dict, values: dict, graphs: dict,
                         krows: list[KernelRow] = (), levels: dict | None = None) -> tuple[dict, dict]:
    """({row key: held-out error}, {kernel row key: held-out error}): each source, training runs or kernel
    timings, priced with the constants fitted without it."""
    from benchmarks.published import row_key
    out, kout = {}, {}
    for source in dict.fromkeys([r.table.source for r in rows] + [kr.source for kr in krows]):
        held = [r for r in rows if r.table.source == source]
        kheld = [kr for kr in krows if kr.source == source]
        fold_krows = [kr for kr in krows if kr.source != source]
        # the kernel bounds as the fold's own timings draw them (a held-out chart bounds nothing)
        fold_levels = levels if not kheld else kernel_levels(kgroups, fold_krows)
        fold = fit_published([r for r in rows if r.table.source != source], lin, kgroups, start=values,
                             krows=fold_krows, levels=fold_levels)
        groups = derive(fold, kgroups, timed_groups([kr for kr in krows if kr.source != source]))
        priced = price_rows(held, groups, graphs)
        # what the source's own rows fit in-sample that no other source measures: derived in the fold
        unseen = set(published_params(held, kgroups)) - set(fold)
        for r in held:
            mine = sorted(_named({p: 0 for p in unseen if concerns(p, r, kgroups)}))
            out[row_key(r)] = {**_err(priced[row_key(r)]), "fold_values": _named(fold), "fold_unseen": mine}
        kout.update(_kernel_errs(kheld, groups))
        errs = ([abs(out[row_key(r)]["error"]) for r in held if out[row_key(r)]["error"] is not None]
                + [abs(kout[kr.key]["error"]) for kr in kheld])
        print(f"  held out {source:<18} {len(held) + len(kheld):>4} rows: median |error| "
              f"{statistics.median(errs) if errs else float('nan'):.3f}", flush=True)
    return out, kout


def _kernel_errs(krows: list[KernelRow], groups: dict) -> dict:
    return {kr.key: {"group": kernel_group(kr), "error": math.exp(e) - 1}
            for kr, e in zip(krows, kernel_log_errors(krows, groups))}


def concerns(param: tuple[str, str], row: Row, kgroups: dict) -> bool:
    """Whether the published parameter (kind, key) enters `row`'s pricing."""
    return param in row_params(row, kgroups)


def _err(priced: dict) -> dict:
    return {"error": priced.get("error"), "speed_error": priced.get("speed_error"),
            "predicted": (priced.get("predicted") or {}).get("value"), "plan": priced.get("plan")}


def _named(values: dict) -> dict:
    return {f"{k}:{g}": v for (k, g), v in values.items()}


def constants_digest(groups: dict) -> str:
    """A short hash of every group's constants: results carry it so a stale file is detected."""
    text = json.dumps({g: v["constants"] for g, v in sorted(groups.items())}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_constants(groups: dict) -> None:
    payload = {"written_by": "python -m benchmarks.fit", "commit": commit(), "date": time.strftime("%Y-%m-%d"),
               "digest": constants_digest(groups),
               "groups": {g: {"constants": {k: v for k, v in c["constants"].items() if k in KERNEL_FIELDS},
                              "source": c["source"]} for g, c in sorted(groups.items())}}
    Path(FITTED_CONSTANTS).write_text(json.dumps(payload, indent=1) + "\n")


def summary(result: dict) -> dict:
    """Median, p95 and max |error| in-sample and leave-one-source-out, overall and per source."""
    from benchmarks.published import row_key
    by_source = defaultdict(list)
    for r in ROWS:
        by_source[r.table.source].append(row_key(r))

    def stats(keys, part):
        a = sorted(abs(result[part][k]["error"]) for k in keys if k in result.get(part, {})
                   and result[part][k]["error"] is not None)
        if not a:
            return {"priced": 0}
        unseen = sorted({u for k in keys for u in result[part].get(k, {}).get("fold_unseen", [])})
        return {"priced": len(a), "median_abs_error": statistics.median(a), "p95_abs_error": p95(a),
                "max_abs_error": a[-1], **({"unseen": unseen} if unseen else {})}
    everything = [k for keys in by_source.values() for k in keys]
    out = {}
    for part in ("in_sample", "loso"):
        if part not in result:
            continue
        per_source = {s: stats(k, part) for s, k in by_source.items()}
        medians = [v["median_abs_error"] for v in per_source.values() if v.get("priced")]
        out[part] = {"all": {**stats(everything, part),
                             "median_of_source_medians": statistics.median(medians) if medians else None},
                     "per_source": per_source}
    return out


def kernel_summary(result: dict) -> dict:
    """Median, p95 and max |error| of the published kernel timings, in-sample and held out, overall and per
    (generation, stack) group."""
    out = {}
    for part in ("kernels_in_sample", "kernels_loso"):
        errs = result.get(part) or {}
        by_group = defaultdict(list)
        for v in errs.values():
            by_group[v["group"]].append(abs(v["error"]))

        def stats(a):
            a = sorted(a)
            return {"priced": len(a), "median_abs_error": statistics.median(a), "p95_abs_error": p95(a),
                    "max_abs_error": a[-1]}
        if errs:
            out[part.removeprefix("kernels_")] = {"all": stats([e for a in by_group.values() for e in a]),
                                                  "per_group": {g: stats(a) for g, a in sorted(by_group.items())}}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fit", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fit and print; write nothing")
    ap.add_argument("--no-loso", action="store_true", help="skip leave-one-source-out")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    result = fit(loso=not args.no_loso)
    s = summary(result)
    for g, c in sorted(result["groups"].items()):
        k = c["constants"]
        print(f"{g:<22} e_gemm {k['matmul_efficiency']:.3f}  h_mn {k['gemm_half_mn']:.3g}  e_attn "
              f"{k['attention_efficiency']:.3f}/{k['attention_bwd_efficiency']:.3f}  h_seq {k['attention_half_seq']:.0f}"
              f"  <- {c['source'][:90]}")
    ks = kernel_summary(result)
    for label, part in [(p, v) for p, v in s.items()] + [(f"kernel timings {p}", v) for p, v in ks.items()]:
        a = part["all"]
        weighed = (f"; median of per-source medians {a['median_of_source_medians']:.3f}"
                   if a.get("median_of_source_medians") is not None else "")
        print(f"{label}: {a['priced']} rows, median |error| {a['median_abs_error']:.3f}, p95 {a['p95_abs_error']:.3f}, "
              f"max {a['max_abs_error']:.3f}{weighed}")
    c = result["convergence"]
    print(f"convergence: {'converged' if c['converged'] else 'NOT converged'} after {c['iterations']} iterations "
          f"(last move {100 * c['largest_move']:.2f}% of {c['moved']}, tolerance {100 * c['tolerance']:.2f}%)")
    for d in result["defects"]["defects"]:
        print(f"MODEL DEFECT {d['param']} = {d['value']:.4g}: {d['kind']}"
              + (f" (allowed {d['allowed'][0]:.3g}-{d['allowed'][1]:.3g} from {d['kernel']})" if "allowed" in d else "")
              + f"; fitted by {', '.join(d['fitted_by'])}")
    if args.check:
        return 0
    write_constants(result["groups"])
    path = write("fit", {"digest": constants_digest(result["groups"]), "summary": s, "values": result["values"],
                         "convergence": result["convergence"], "defects": result["defects"],
                         "kernel_levels": result["kernel_levels"], "linearisation": result["linearisation"],
                         "history": result["history"], "in_sample": result["in_sample"], "loso": result.get("loso"),
                         "kernel_rows": {g: v["errors"] for g, v in result["kernel_groups"].items()},
                         "published_kernels": {"summary": ks, "in_sample": result["kernels_in_sample"],
                                               "loso": result.get("kernels_loso")},
                         "wall_s": time.perf_counter() - t0})
    print(f"wrote {FITTED_CONSTANTS} and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
