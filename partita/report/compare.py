"""`partita compare a.json b.json`: what differs between two plans and where the time goes in each."""
from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from partita.planner.plan.explain import figure, human_bytes, report_console
from partita.planner.plan import RECOMPUTE
from partita.planner.plan import SPLIT


def _facts(plan) -> dict[str, str]:
    m, s, pred = plan.mesh, plan.schedule, plan.predicted
    rec = {r: sum(b.recompute == r for b in plan.blocks) for r in RECOMPUTE}
    facts = {
        "model": str(plan.model.get("name")),
        "cluster": f"{plan.cluster.get('num_devices')} x {plan.cluster.get('device')}",
        "mesh (pp x dp x tp)": f"{m.pp} x {m.dp} x {m.tp}",
        "ZeRO stage": str(plan.zero_stage),
        "schedule": s.name + (f" (v={s.virtual_stages})" if s.virtual_stages > 1 else ""),
        "micro-batches x size": f"{s.num_microbatches} x {s.micro_batch_size}",
        "tensor-parallel blocks": str(sum(b.sharding in SPLIT for b in plan.blocks)),
        "recompute " + "/".join(RECOMPUTE): "/".join(str(rec[r]) for r in RECOMPUTE),
        "activation-offloaded blocks": str(sum(b.offload_activations for b in plan.blocks)),
        "state-offloaded blocks": str(sum(b.offload_states for b in plan.blocks)),
        "overlapped (TP comm / p2p)": " / ".join("on" if plan.overlap.get(k) else "off" for k in ("tp_comm", "p2p")),
    }
    if pred:
        facts["step time (s)"] = figure(pred, "step_time_s", ".4g")
        facts["TFLOP/s per device"] = figure(pred, "tflops_per_device", ".3g")
        facts["MFU"] = figure(pred, "mfu", ".1f", 100) + "%"
        facts["peak memory"] = human_bytes(pred["peak_memory_bytes"]) if "peak_memory_bytes" in pred else "?"
    return facts


def comparison(a, b, name_a: str = "a", name_b: str = "b") -> Group:
    fa, fb = _facts(a), _facts(b)
    table = Table(title="plans side by side (differences in bold)", title_justify="left", show_edge=False)
    table.add_column("")
    table.add_column(Text(name_a))  # file names and plan text as Text: never read as rich markup
    table.add_column(Text(name_b))
    for key in fa:
        differ = fa[key] != fb.get(key)
        style = "bold" if differ else None
        table.add_row(key, Text(fa[key], style=style), Text(fb.get(key, ""), style=style))
    parts = [table]
    if "step_time_s" in a.predicted and "step_time_s" in b.predicted:
        t = Table(title="where the time goes (seconds per step)", title_justify="left", show_edge=False)
        t.add_column("component")
        t.add_column(Text(name_a), justify="right")
        t.add_column(Text(name_b), justify="right")
        t.add_column("b - a", justify="right")
        ba, bb = a.predicted.get("breakdown", {}), b.predicted.get("breakdown", {})
        for key in dict.fromkeys([*ba, *bb]):
            va, vb = ba.get(key, 0.0), bb.get(key, 0.0)
            if max(abs(va), abs(vb)) > 1e-9 * max(a.predicted["step_time_s"], b.predicted["step_time_s"]):
                t.add_row(Text(key[:-2].replace("_", " ")), f"{va:.4g}", f"{vb:.4g}", f"{vb - va:+.4g}")
        parts += [Text(""), t, Text("\n" + verdict(a, b, name_a, name_b))]
    return Group(*parts)


def _job(plan) -> dict[str, object]:
    """What one step of a plan trains: the same job in two plans makes their step times comparable."""
    model = plan.model or {}
    return {"model": model.get("fingerprint") or model.get("name"), "global batch": plan.train.get("global_batch"),
            "sequence length": plan.train.get("seq_len")}


def verdict(a, b, name_a: str = "a", name_b: str = "b") -> str:
    """Which plan is predicted faster, when a step of one trains what a step of the other does (the same
    model, global batch and sequence length); otherwise what differs, and no ratio."""
    ja, jb = _job(a), _job(b)
    differ = [k for k in ja if ja[k] != jb[k]]
    if differ:
        return (f"not compared: the plans train different jobs ({' and '.join(differ)} "
                f"{'differ' if len(differ) > 1 else 'differs'}), so a step of one is "
                "not a step of the other")
    ra, rb = a.predicted["step_time_s"], b.predicted["step_time_s"]
    faster = name_a if ra < rb else name_b
    return f"{faster} is predicted {max(ra, rb) / min(ra, rb):.2f}x faster"


def print_comparison(a, b, name_a="a", name_b="b", console: Console | None = None) -> None:
    (console or report_console()).print(comparison(a, b, name_a, name_b))
