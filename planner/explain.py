"""The human-readable report of a plan (what `partita plan` and `partita explain` print)."""
from __future__ import annotations



def _ranges(names: list[str]) -> str:
    """['blocks.0', 'blocks.1', 'blocks.2', 'ln_f'] -> 'blocks.0-2, ln_f'."""
    out: list[str] = []
    i = 0
    while i < len(names):
        base, _, idx = names[i].rpartition(".")
        j = i
        if idx.isdigit():
            while j + 1 < len(names):
                b2, _, i2 = names[j + 1].rpartition(".")
                if b2 == base and i2.isdigit() and int(i2) == int(idx) + (j + 1 - i):
                    j += 1
                else:
                    break
        out.append(names[i] if j == i else f"{names[i]}-{names[j].rpartition('.')[2]}")
        i = j + 1
    return ", ".join(out)


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


def _bar(used: float, cap: float, width: int = 30) -> str:
    filled = min(width, int(round(width * used / cap))) if cap > 0 else 0
    return "[" + "#" * filled + "." * (width - filled) + "]"


def explain(plan) -> str:
    mesh, sched, pred = plan.mesh, plan.schedule, plan.predicted
    model = plan.model
    lines = []
    params = model.get("parameters")
    lines.append(f"partita plan  {model.get('name', '?')}"
                 + (f" ({_count(params)} parameters)" if params else "")
                 + f" on {plan.cluster.get('spec') or plan.cluster.get('num_devices')}"
                 + f" ({plan.cluster.get('num_devices')} x {plan.cluster.get('device')})")
    t = plan.train
    lines.append(f"  train        global batch {t['global_batch']}, seq {t.get('seq_len')}, {t.get('dtype')}, "
                 f"{t.get('optimizer')}")
    zero = {0: "replicated model states", 2: "ZeRO-2 (FSDP2, no reshard after forward)",
            3: "ZeRO-3 (FSDP2)"}.get(plan.zero_stage, f"ZeRO-{plan.zero_stage}")
    lines.append(f"  mesh         pp={mesh.pp} x dp={mesh.dp} x tp={mesh.tp}  ({mesh.world_size} ranks; "
                 f"tp fastest, then dp, then pp); data parallel with {zero}")
    chunks = f", {sched.virtual_stages} model chunks per pipeline rank" if sched.virtual_stages > 1 else ""
    lines.append(f"  schedule     {sched.name}, {sched.num_microbatches} micro-batches of {sched.micro_batch_size}{chunks}")
    lines.append("")
    lines.append("  stage  ranks            modules                                  sharding, recompute, offload")
    by_stage: dict[int, list] = {}
    for b in plan.blocks:
        by_stage.setdefault(b.stage, []).append(b)
    per_stage = mesh.dp * mesh.tp
    for st in plan.stages:
        mine = by_stage.get(st.index, [])
        n_tensor = sum(b.sharding == "tensor" for b in mine)
        shard = f"TP x{mesh.tp} on {n_tensor}" if n_tensor else "replicated"
        rec = {r: sum(b.recompute == r for b in mine) for r in ("selective", "full")}
        extras = [f"{k} recompute x{n}" for k, n in rec.items() if n]
        if any(b.offload_activations for b in mine):
            extras.append(f"act. offload x{sum(b.offload_activations for b in mine)}")
        if any(b.offload_states for b in mine):
            extras.append(f"state offload x{sum(b.offload_states for b in mine)}")
        shard = ", ".join([shard, *extras])
        rank = st.index % mesh.pp
        ranks = f"{rank * per_stage}-{(rank + 1) * per_stage - 1}"
        lines.append(f"  {st.index:>5}  {ranks:<15}  {_ranges(st.modules):<40} {shard}")
    if plan.placements:
        styles = sorted({k.split(".")[-2] + "." + k.split(".")[-1] + "=" + v for k, v in plan.placements.items()})
        lines.append(f"  tensor-parallel layers: {', '.join(styles[:8])}{' ...' if len(styles) > 8 else ''}")
    if pred:
        lines.append("")
        step = pred["step_time_s"]
        lines.append(f"  predicted    step {step:.4g} s, {pred['tokens_per_s']:,.0f} tokens/s, "
                     f"{pred['tflops_per_device']:.3g} TFLOP/s per device (model FLOPs), MFU {100 * pred['mfu']:.1f}%")
        parts = pred.get("breakdown", {})
        lines.append("  step time    " + ", ".join(f"{k[:-2].replace('_', ' ')} {v:.3g}s ({100 * v / step:.0f}%)"
                                                   for k, v in parts.items() if v > 0))
        cap = pred.get("memory_capacity_bytes", 0)
        lines.append(f"  memory       per device of each pipeline rank, of {human_bytes(cap)} usable:")
        for i, row in enumerate(pred.get("memory_per_stage", [])):
            cats = ", ".join(f"{k} {human_bytes(v)}" for k, v in row.items() if k != "total" and v > 0)
            lines.append(f"    pp rank {i:<3} {_bar(row['total'], cap)} {human_bytes(row['total']):>10}  ({cats})")
    s = plan.solver
    if s:
        lines.append("")
        gap = s.get("mip_gap")
        gap_txt = f"{100 * gap:.2g}%" if isinstance(gap, (int, float)) else "n/a"
        lines.append(f"  solver       {s.get('status')} (gap {gap_txt}); "
                     f"{s.get('candidates_solved', '?')} of {s.get('candidates', '?')} candidates solved "
                     f"(the rest pruned by a lower bound); search {s.get('wall_time_s', 0):.2f}s, "
                     f"capture {s.get('capture_s', 0):.2f}s ({s.get('graph_nodes', '?')} operators)")
    if plan.baselines:
        lines.append("")
        lines.append("  baselines (same cost model and solver)")
        ours = pred.get("step_time_s") if pred else None
        for b in plan.baselines:
            p = b.get("predicted") or {}
            if not p:
                lines.append(f"    {b['name']:<24} does not fit")
                continue
            m = b["mesh"]
            mesh = f"pp={m['pp']} dp={m['dp']} tp={m['tp']} ZeRO-{m['zero_stage']} mb={m['micro_batch_size']}"
            speed = f"  plan is {p['step_time_s'] / ours:.2f}x faster" if ours else ""
            lines.append(f"    {b['name']:<24} step {p['step_time_s']:.4g}s, {p['tflops_per_device']:.3g} TFLOP/s, "
                         f"MFU {100 * p['mfu']:.1f}%  ({mesh}){speed}")
    return "\n".join(lines)
