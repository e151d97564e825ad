"""The human-readable report of a plan: what `partita plan` and `partita explain` print.

Built from rich tables; `explain(plan)` renders them to plain text (for files, tests and notebooks) and
`print_plan(plan, console)` prints them with colour on a terminal.
"""
from __future__ import annotations

import io

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from partita.planner.plan import RECOMPUTE, SPLIT, fixed_text, one_line
from partita.planner.plan.sync import SYNC_MODES

CATEGORY_STYLE = {"model_states": "cyan", "activations": "magenta", "workspace": "yellow", "embeddings": "green"}


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _count(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _ranges(names: list[str]) -> str:
    """['blocks.0', 'blocks.1', 'blocks.2', 'ln_f'] -> 'blocks.0-2, ln_f'."""
    out: list[str] = []
    i = 0
    while i < len(names):
        base, _, idx = names[i].rpartition(".")
        j = i
        if idx.isdecimal():  # (not isdigit: a superscript digit is one, and int() refuses it)
            while j + 1 < len(names):
                b2, _, i2 = names[j + 1].rpartition(".")
                if b2 == base and i2.isdecimal() and int(i2) == int(idx) + (j + 1 - i):
                    j += 1
                else:
                    break
        out.append(names[i] if j == i else f"{names[i]}-{names[j].rpartition('.')[2]}")
        i = j + 1
    return ", ".join(out)


def figure(pred: dict, key: str, fmt: str, scale: float = 1) -> str:
    """A predicted figure as text, "?" where the plan does not record it (a hand-written plan, an older one)."""
    return format(scale * pred[key], fmt) if key in pred else "?"


def _bar(row: dict, cap: float, width: int = 32) -> Text:
    """A bar of the row's memory by category against the capacity."""
    text = Text("[")
    used = 0
    for cat, style in CATEGORY_STYLE.items():
        n = int(round(width * row.get(cat, 0) / cap)) if cap > 0 else 0
        n = min(n, width - used)
        text.append("#" * n, style=style)
        used += n
    text.append("." * (width - used) + "]")
    return text


def _header(plan) -> Text:
    mesh, sched, model, t = plan.mesh, plan.schedule, plan.model, plan.train
    params = model.get("parameters")
    zero = {0: "replicated model states", 1: "ZeRO-1 (optimizer state sharded)",
            2: "ZeRO-2 (FSDP2, no reshard after forward)", 3: "ZeRO-3 (FSDP2)"}.get(plan.zero_stage,
                                                                                  f"ZeRO-{plan.zero_stage}")
    overlaps = [what for key, what in (("tp_comm", "tensor-parallel collectives with the GEMMs they feed"),
                                       ("p2p", "pipeline sends with compute")) if plan.overlap.get(key)]
    chunks = f", {sched.virtual_stages} model chunks per pipeline rank" if sched.virtual_stages > 1 else ""
    lines = [
        one_line(f"partita plan  {model.get('name', '?')}" + (f" ({_count(params)} parameters)" if params else "")
                 + f" on {plan.cluster.get('spec') or plan.cluster.get('num_devices')} ({_devices(plan.cluster)})", 1000),
        f"  train        global batch {t['global_batch']}"
        + (f", seq {t['seq_len']}" if t.get("seq_len") else " samples") + f", {_precision(t)}, {t.get('optimizer')}",
        (f"  mesh         pp={mesh.pp} x dp={mesh.dp} x tp={mesh.tp}  ({mesh.world_size} ranks; tp fastest, then dp, "
         f"then pp); data parallel with {zero}" if mesh.cp == 1 else
         f"  mesh         pp={mesh.pp} x dp={mesh.dp} x cp={mesh.cp} x tp={mesh.tp}  ({mesh.world_size} ranks; tp "
         f"fastest, then cp, then dp, then pp); each sequence split over {mesh.cp} context-parallel ranks; data "
         f"parallel over dp x cp with {zero}"),
        *([f"  experts      each MoE layer's experts sharded over ep={mesh.ep} of the data-parallel ranks "
           f"(all-to-all dispatch and combine)"] if mesh.ep > 1 else []),
        f"  schedule     {sched.name}, {sched.num_microbatches} micro-batch{'es' if sched.num_microbatches != 1 else ''} "
        f"of {sched.micro_batch_size}{chunks}",
        *([f"  overlap      {'; '.join(overlaps)}"] if overlaps else []),
    ]
    return Text("\n".join(lines))


def _precision(train: dict) -> str:
    """'fp32', 'bf16' (on fp32 master weights) or 'pure bf16 (no fp32 master weights)'."""
    if train.get("master_weights") == "none":
        return f"pure {train.get('dtype')} (no fp32 master weights)"
    return str(train.get("dtype"))


def _devices(cluster: dict) -> str:
    """'8 x A100-80GB', or each group's for a heterogeneous cluster: '8 x A100-80GB + 8 x V100-32GB'."""
    groups = cluster.get("groups") or [cluster]
    return " + ".join(f"{g.get('num_devices', '?')} x {g.get('device', '?')}" for g in groups)


def _stages(plan) -> Table:
    mesh = plan.mesh
    table = Table(title="stages", title_justify="left", show_edge=False, pad_edge=False)
    groups = plan.cluster.get("stage_groups")
    for col in ("stage", "ranks", *(("devices",) if groups else ()), "modules", "sharding, recompute, offload"):
        table.add_column(col, overflow="fold")
    by_stage: dict[int, list] = {}
    for b in plan.blocks:
        by_stage.setdefault(b.stage, []).append(b)
    per_stage = mesh.dp * mesh.cp * mesh.tp
    for st in plan.stages:
        mine = by_stage.get(st.index, [])
        n_tensor = sum(b.sharding in SPLIT for b in mine)
        n_seq = sum(b.sharding == "sequence" for b in mine)
        parts = [f"TP x{mesh.tp} on {n_tensor}" + (" (sequence parallel)" if n_seq else "") if n_tensor
                 else "replicated"]
        for r in RECOMPUTE[1:]:
            n = sum(b.recompute == r for b in mine)
            if n:
                parts.append(f"{r} recompute x{n}")
        for flag, label in (("offload_activations", "act. offload"), ("offload_states", "state offload")):
            n = sum(getattr(b, flag) for b in mine)
            if n:
                parts.append(f"{label} x{n}")
        n = sum(b.zero_stage == 2 for b in mine)
        if n:
            parts.append(f"kept gathered (ZeRO-2) x{n}")
        rank = st.index % mesh.pp
        where = (Text(groups[rank]),) if groups else ()  # plan text as Text: never read as rich markup
        table.add_row(str(st.index), f"{rank * per_stage}-{(rank + 1) * per_stage - 1}", *where,
                      Text(_ranges(st.modules)), ", ".join(parts))
    return table


def _time(pred: dict) -> Table:
    step = pred["step_time_s"]
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("where the time goes")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    hidden = pred.get("hidden_comm_s", 0.0)
    for key, v in pred.get("breakdown", {}).items():
        if v > 1e-9 * step:
            table.add_row(Text(_TIME_LABELS.get(key, key[:-2].replace("_", " "))), f"{v:.4g}",
                          f"{100 * v / step:.0f}%")
    if "exposed_comm_s" in pred:
        table.add_section()
        table.add_row("exposed communication", f"{pred['exposed_comm_s']:.4g}", f"{100 * pred['exposed_comm_s'] / step:.0f}%")
        table.add_row("hidden behind compute", f"{hidden:.4g}", "(not in the step)")
    return table


PUBLISHED_MFU = 0.60
"""Above this MFU on a GPU the report says where the prediction's extra comes from: the best published LLM
training runs on A100/H100 reach 51-58% (Korthikanti et al. 2022, Table 5; REFERENCE.md)."""


def above_published(plan) -> str:
    """For a GPU plan predicted above PUBLISHED_MFU: one sentence naming what the prediction rests on
    (the shares of the step that published runs at this scale spend elsewhere); else ""."""
    pred = plan.predicted
    if "step_time_s" not in pred or pred.get("mfu", 0) <= PUBLISHED_MFU or plan.cluster.get("device") == "cpu":
        return ""
    step, bd = pred["step_time_s"], pred.get("breakdown", {})
    share = lambda *keys: 100 * sum(bd.get(k, 0.0) for k in keys) / step
    recomputed = sum(b.recompute == "full" for b in plan.blocks)
    reasons = [f"compute is {share('compute_s'):.0f}% of the step (kernels at the device's calibrated rates)",
               f"exposed communication only "
               f"{share('tp_comm_s', 'cp_comm_s', 'ep_comm_s', 'zero_comm_s', 'offload_s', 'p2p_s', 'dp_comm_s'):.0f}%"
               + (f" ({pred.get('hidden_comm_s', 0):.3g} s hidden behind compute)" if pred.get("hidden_comm_s") else ""),
               f"pipeline bubble {share('bubble_s'):.0f}%" if plan.mesh.pp > 1 else "no pipeline bubble (pp=1)",
               f"tensor parallelism {plan.mesh.tp}-way" + (" (its collectives inside one node)" if plan.mesh.tp > 1 else ""),
               f"{recomputed} of {len(plan.blocks)} blocks fully recomputed"]
    return (f"MFU {100 * pred['mfu']:.1f}% is above the {100 * PUBLISHED_MFU:.0f}% no published A100/H100 LLM run "
            f"exceeds (51-58%); it rests on: " + "; ".join(reasons) + " -- a prediction, not a measurement.")


_TIME_LABELS = {"compute_s": "compute", "contention_s": "compute slowed by overlapped comm",
                "tp_comm_s": "tp comm (exposed)", "cp_comm_s": "cp K/V gathers (exposed)",
                "ep_comm_s": "ep all-to-all (exposed)", "zero_comm_s": "zero comm (exposed)",
                "offload_s": "offload copies (exposed)", "p2p_s": "pipeline p2p (exposed)",
                "bubble_s": "pipeline bubble", "dp_comm_s": "dp all-reduce (exposed)", "optimizer_s": "optimizer",
                "cross_island_s": "cross-island sync (exposed)",
                "embeddings_s": "embedding tables (slowest rank)"}


def _memory(pred: dict) -> Table:
    cap = pred.get("memory_capacity_bytes", 0)
    caps = pred.get("memory_capacity_per_stage") or [cap] * len(pred.get("memory_per_stage", []))
    usable = human_bytes(cap) if len(set(caps)) <= 1 else "per stage: " + ", ".join(human_bytes(c) for c in caps)
    reserve = f" usable, after a {human_bytes(pred.get('memory_reserved_bytes', 0))} reserve (CUDA context, NCCL)"
    if "memory_allocator_cache_per_stage" in pred:
        cache = pred["memory_allocator_cache_per_stage"]
        usable += (f"{reserve} and the caching allocator's predicted cache ("
                   + (human_bytes(cache[0]) if len(set(cache)) <= 1 else "per stage: " + ", ".join(map(human_bytes, cache)))
                   + ", from each stage's largest transient: on the last stage the logits)")
    elif "memory_headroom_bytes" in pred:  # (plans written before the headroom existed do not say)
        usable += (f"{reserve} and a {100 * pred.get('memory_headroom', 0):.3g}% allocator headroom "
                   f"({human_bytes(pred['memory_headroom_bytes'])})")
    else:
        usable += " usable"
    table = Table(title=f"memory per device of each pipeline rank ({usable}; "
                        "[cyan]model states[/] [magenta]activations[/] [yellow]workspace[/])",
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("pp rank", "", "total", "by category"):
        table.add_column(col)
    for i, row in enumerate(pred.get("memory_per_stage", [])):
        cats = ", ".join(f"{k.replace('_', ' ')} {human_bytes(row[k])}" for k in CATEGORY_STYLE if row.get(k, 0) > 0)
        if row.get("phase") and row["phase"] != "forward/backward":
            cats += f" (peak at the {row['phase']})"
        if host := (pred.get("host_memory_per_stage") or [])[i:i + 1]:
            cats += f"; {human_bytes(host[0])} offloaded to host memory"
        table.add_row(str(i), _bar(row, caps[i] if i < len(caps) else cap), human_bytes(row["total"]), Text(cats))
    return table


def _solver(plan) -> Text:
    s = plan.solver
    gap = s.get("mip_gap")
    gap_txt = f"{100 * gap:.2g}%" if isinstance(gap, (int, float)) else "n/a"
    return Text(f"solver  {s.get('status')} (gap {gap_txt}); {s.get('candidates_solved', '?')} of "
                f"{s.get('candidates', '?')} candidates solved (the rest pruned by a lower bound); search "
                f"{s.get('wall_time_s', 0):.2f}s, capture {s.get('capture_s', 0):.2f}s ({s.get('graph_nodes', '?')} operators)"
                + _fixed(s.get("fixed")))


def _fixed(fixed) -> str:
    """The what-if choices the user fixed (the rest were searched), as the flags that fix them."""
    if not isinstance(fixed, dict) or not fixed:
        return ""
    return "\nfixed   " + fixed_text(fixed) + " (the rest searched)"


def _baselines(plan) -> Table:
    ours = plan.predicted.get("step_time_s")
    table = Table(title="baselines (same cost model and solver)", title_justify="left", show_edge=False,
                  pad_edge=False)
    for col in ("baseline", "step s", "TFLOP/s", "MFU", "mesh", "plan speed-up"):
        table.add_column(col)
    for b in plan.baselines:
        p = b.get("predicted") or {}
        if not p:
            table.add_row(Text(b["name"]), Text(b.get("why", "does not fit")), "", "", "", "")
            continue
        m = b["mesh"]
        table.add_row(Text(b["name"]), f"{p['step_time_s']:.4g}", f"{p['tflops_per_device']:.3g}", f"{100 * p['mfu']:.1f}%",
                      f"pp={m['pp']} dp={m['dp']} tp={m['tp']} ZeRO-{m['zero_stage']} mb={m['micro_batch_size']}",
                      f"{p['step_time_s'] / ours:.2f}x" if ours else "")
    return table


def placement_summary(placements: dict[str, str]) -> str:
    """'attn.q=colwise, ..., ln1=sequence (x96); head=vocab, tok_emb=vocab': modules of repeated blocks
    named once with the count of blocks, by their path below the block's index."""
    per_block: dict[str, set] = {}
    single: list[str] = []
    for fqn, style in sorted(placements.items()):
        parts = fqn.split(".")
        idx = next((i for i, p in enumerate(parts) if p.isdigit()), None)
        if idx is None:
            single.append(f"{fqn}={style}")
        else:
            rest = ".".join(parts[idx + 1:]) or parts[idx - 1]
            per_block.setdefault(f"{rest}={style}", set()).add(".".join(parts[:idx + 1]))
    counts = {len(v) for v in per_block.values()}
    inner = ", ".join(per_block)
    if per_block:
        inner += f" (x{counts.pop()} blocks)" if len(counts) == 1 else ""
    return "; ".join(x for x in (inner, ", ".join(single)) if x)


def renderables(plan) -> Group:
    parts = [_header(plan), Text(""), _stages(plan)]
    if plan.placements:
        parts.append(Text(f"tensor-parallel layers: {placement_summary(plan.placements)}"))
    if plan.predicted:
        pred = plan.predicted
        unit = "tokens/s" if plan.train.get("seq_len") else "samples/s"
        headline = Text(f"predicted step {figure(pred, 'step_time_s', '.4g')} s: {figure(pred, 'tokens_per_s', ',.0f')} "
                        f"{unit}, {figure(pred, 'tflops_per_device', '.3g')} TFLOP/s per device (model FLOPs), MFU "
                        f"{figure(pred, 'mfu', '.1f', 100)}%", style="bold")
        parts += [Text(""), headline]
        why = above_published(plan)
        if why:
            parts.append(Text(why, style="yellow"))
        parts += [*([_time(pred)] if "step_time_s" in pred else []), *sync_lines(plan), Text(""), _memory(pred)]
        if pred.get("uncosted_ops"):
            parts += [Text(""), uncosted_line(pred["uncosted_ops"])]
        parts += executable_lines(plan)
        if (coupled := batch_coupling_warning(plan)) is not None:
            parts += [Text(""), Text(coupled, style="yellow")]
        if pred.get("assumptions"):
            parts += [Text(""), Text("assumptions in force (costmodel.price.kernels, costmodel.price.streams, costmodel.price.comm):")]
            parts += [Text(f"  - {a}") for a in pred["assumptions"]]
    if plan.embeddings:
        from partita.planner.plan.embeddings import renderables as embedding_renderables
        parts += [Text(""), *embedding_renderables(plan)]
    if plan.solver:
        parts += [Text(""), _solver(plan)]
    if plan.baselines:
        parts += [Text(""), _baselines(plan)]
    return Group(*parts)


def sync_lines(plan) -> list[Text]:
    """The sync mode on a cluster with islands (planner.estimate.sync): what crosses the slow link, how often, its
    exposed seconds per step, and the other modes' predicted steps (or why they were not taken)."""
    s = plan.predicted.get("sync")
    if not isinstance(s, dict):
        return []
    every = s.get("every", 1)
    entry = SYNC_MODES.get(s["mode"])
    mode = f"{s['mode']}" + (f", H = {every}" if entry is not None and "every" in entry.options else "")
    what = entry.crosses if entry is not None else "the gradients"
    if s["islands"] < 2:  # a mode asked for by name on one island: no slow link
        out = [Text(f"sync: {mode} -- {what} all-reduced every step on one island", style="bold")]
    else:
        held = (f"; +{human_bytes(s['extra_memory_bytes'])} per rank ({entry.holds if entry else 'its state'})"
                if s.get("extra_memory_bytes") else "")
        how_often = f"every {every} step(s)"
        if "fragments" in s:  # streaming: one fragment at a time, overlapped with the next inner steps
            mode += f", {s['fragments']} fragments, delay {s['delay']}"
            how_often = (f"every {max(1, every // s['fragments'])} step(s), overlapped with the next {s['delay']} "
                         f"step(s) ({s.get('hidden_s', 0.0):.4g} s of each hidden)")
        if "rank" in s:
            mode += f", rank {s['rank']} after {s['start']} plain steps"
        bits = (plan.sync.options or {}).get("bits") if plan.sync is not None else None
        if bits in (4, 16):
            mode += f", {bits}-bit" + (" (all-to-all, then all-gather at the merge)" if bits == 4 and "fragments" in s
                                      else " (all-to-all, then all-gather)" if bits == 4 else "")
        out = [Text(f"sync: {mode} across {s['islands']} islands -- {what} ({human_bytes(s['cross_island_bytes'])} "
                    f"per island) all-reduced over the island link {how_often}: {s['cross_island_s']:.4g} s exposed "
                    f"per step{held}", style="bold")]
    for other, v in s.get("priced", {}).items():
        out.append(Text(f"  {other}: " + (f"predicted step {v:.4g} s" if isinstance(v, (int, float)) else str(v))))
    return [Text(""), *out]


def uncosted_line(ops: dict[str, int]) -> Text:
    """The operators the cost model ran without a FLOP count (their compute is missing from the step)."""
    listed = ", ".join(f"{op} ({n} node{'s' if n != 1 else ''})" for op, n in ops.items())
    return Text(f"uncosted operators: {listed} -- no FLOP formula, priced by the bytes they move only; "
                "the predicted step time is a lower bound", style="yellow")


def executable_lines(plan) -> list[Text]:
    """Tied weights held on two pipeline stages with their charged gradient all-reduce, and why a model was
    planned without a pipeline (planner.plan.executable)."""
    out = []
    for t in plan.predicted.get("tied_weights") or []:
        a, b = t["params"]
        first, last = t["pp_ranks"]
        out.append(Text(f"tied weight {a} = {b} on pipeline ranks {first} and {last}: each holds a copy "
                        f"(+{human_bytes(t['state_bytes'])} model states); gradient all-reduce of "
                        f"{human_bytes(t['grad_bytes'])} between them, {t['allreduce_s']:.4g} s per step, "
                        "charged to the last stage"))
    if plan.solver.get("pipeline"):
        out.append(Text(f"pipeline {plan.solver['pipeline']}", style="yellow"))
    if plan.solver.get("not_executed"):
        out.append(Text(plan.solver["not_executed"], style="yellow"))
    return [Text(""), *out] if out else []


def batch_coupling_warning(plan) -> str | None:
    """One line when the model's loss couples the samples of a batch (costmodel.capture.coupling) and the plan
    computes it over fewer samples than the global batch: each data-parallel rank and each micro-batch sees only
    its own samples. None otherwise."""
    why = plan.model.get("batch_coupled")
    samples, batch = plan.schedule.micro_batch_size, plan.train.get("global_batch")
    if not why or not isinstance(batch, int) or samples >= batch:
        return None
    parts = [f"--dp {plan.mesh.dp}: each rank's loss sees only its own samples" if plan.mesh.dp > 1 else "",
             f"{plan.schedule.num_microbatches} micro-batches per step" if plan.schedule.num_microbatches > 1 else ""]
    return (f"warning: the loss couples the samples of a batch ({why}); this plan computes it over {samples} "
            f"samples at a time, not the global batch of {batch} ({'; '.join(p for p in parts if p)}), so e.g. "
            "in-batch negatives are only those of each micro-batch: training differs from one device, and --verify "
            "will show the difference")


def explain(plan, width: int = 120) -> str:
    """The report as plain text."""
    buf = io.StringIO()
    Console(file=buf, width=width, no_color=True, color_system=None, highlight=False,
            force_jupyter=False).print(renderables(plan))
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines())


def report_console() -> Console:
    """A console for reports: the terminal's width, or 120 columns when writing to a file or pipe."""
    c = Console(highlight=False)
    return c if c.is_terminal else Console(highlight=False, width=120)


def print_plan(plan, console: Console | None = None) -> None:
    (console or report_console()).print(renderables(plan))
