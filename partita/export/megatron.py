"""`partita export --to megatron`: Megatron-LM command-line arguments, one per line (partita.export's docstring
maps each plan element to its argument)."""
from __future__ import annotations


from partita.planner.plan import Plan
from partita.planner.plan.schedules import schedule
from partita.export.common import (_Args, _mesh_line, _names, _no_equivalent, _offload_notes, _sync_note, architecture,
                                   layer_blocks, layer_zero, layers_per_stage, model_shape)


MEGATRON = "Megatron-LM"


def _megatron_architecture(plan: Plan, out: _Args) -> None:
    """The flags that make Megatron-LM build the plan's architecture rather than its default GPT (LayerNorm,
    GELU, learned absolute positions, linear biases, tied embeddings; megatron/training/arguments.py)."""
    a = architecture(plan)
    if a is None:
        out.note(f"# partita: the architecture of {plan.model.get('name', '?')} is not translated, only its sizes: "
                 f"add the flags that build it ({MEGATRON} builds a GPT by default)")
        return
    if a["llama"]:
        out.arg("--swiglu")
        out.arg("--normalization", "RMSNorm")
        out.arg("--position-embedding-type", "rope")
        out.arg("--rotary-base", int(a["rope_base"]) if float(a["rope_base"]).is_integer() else a["rope_base"])
        out.arg("--disable-bias-linear")
        if a["qkv_bias"]:
            out.arg("--add-qkv-bias")
    if not a["tied"]:
        out.arg("--untie-embeddings-and-output-weights")
    if a["experts"]:
        out.arg("--num-experts", a["experts"])
        out.arg("--moe-router-topk", a["top_k"])


def _megatron_model(plan: Plan, out: _Args) -> None:
    c = model_shape(plan)
    layers = len(layer_blocks(plan)) or c.get("layers")
    if layers:
        out.arg("--num-layers", layers)
    for flag, key in (("--hidden-size", "hidden"), ("--num-attention-heads", "heads"), ("--ffn-hidden-size", "ffn")):
        if c.get(key):
            out.arg(flag, c[key])
    if c.get("kv_heads") and c.get("heads") and c["kv_heads"] != c["heads"]:
        out.arg("--group-query-attention")
        out.arg("--num-query-groups", c["kv_heads"])
    _megatron_architecture(plan, out)
    seq = plan.train.get("seq_len")
    if seq:
        out.arg("--seq-length", seq)
        out.arg("--max-position-embeddings", max(seq, c.get("seq") or 0))
    if not c.get("hidden"):
        out.note("the plan records no model shape: add Megatron-LM's model arguments (--hidden-size ...)")
    elif c.get("vocab"):
        out.note(f"vocabulary {c['vocab']}: Megatron-LM takes it from the tokenizer")


def _megatron_pipeline(plan: Plan, out: _Args) -> None:
    pp, v = plan.mesh.pp, plan.schedule.virtual_stages
    counts = layers_per_stage(plan)
    if pp > 1 and layer_blocks(plan):
        if len(set(counts)) > 1:
            stages = ["E" * (i == 0) + (f"t*{n}" if n > 1 else "t" * n) + "L" * (i == len(counts) - 1)
                      for i, n in enumerate(counts)]
            out.arg("--pipeline-model-parallel-layout", "|".join(stages))
            out.note(f"uneven stages ({counts} layers per stage): --pipeline-model-parallel-layout needs a recent "
                     f"{MEGATRON}; older releases split layers evenly and have no equivalent")
        elif v > 1:
            out.arg("--num-layers-per-virtual-pipeline-stage", counts[0])
    if gap := schedule(plan.schedule.name).megatron_gap:
        out.note(_no_equivalent(MEGATRON, f"the {plan.schedule.name} schedule", gap))


def _megatron_tensor(plan: Plan, out: _Args) -> None:
    if plan.mesh.tp == 1:
        return
    layers = layer_blocks(plan)
    shardings = {b.sharding for b in layers}
    if "sequence" in shardings:
        out.arg("--sequence-parallel")
        if len(shardings) > 1:
            out.note(_no_equivalent(MEGATRON, "sequence parallelism on some layers only",
                                    "--sequence-parallel applies to every layer"))
    unsplit = [b.fqn for b in layers if b.sharding == "replicate"]
    if unsplit:
        out.note(_no_equivalent(MEGATRON, f"replicated (not tensor-parallel) layers {_names(unsplit)}",
                                f"Megatron-LM splits every layer over tp={plan.mesh.tp}"))


def _full_per_stage(plan: Plan, policies: list[str]) -> list[int]:
    """Layers per stage with policy "full" (`policies`: one per layer block, in layer_blocks order)."""
    full = [b for b, p in zip(layer_blocks(plan), policies) if p == "full"]
    return [sum(1 for b in full if b.stage == s) for s in range(len(plan.stages))]


def _megatron_recompute(plan: Plan, out: _Args) -> None:
    policies = [b.recompute for b in layer_blocks(plan)]
    if "op" in policies:  # Megatron's selective keeps more than "op" would: full is the choice that fits
        out.note(_no_equivalent(MEGATRON, f"per-op selective recompute ({policies.count('op')} layers)",
                                "those layers recompute in full (fits, more recompute than planned)"))
        policies = ["full" if p == "op" else p for p in policies]
    kinds = set(policies)
    if "full" in kinds:
        per_stage = _full_per_stage(plan, policies)
        out.arg("--recompute-granularity", "full")
        if kinds == {"full"}:
            out.arg("--recompute-method", "uniform")
            out.arg("--recompute-num-layers", 1)
            return
        out.arg("--recompute-method", "block")
        out.arg("--recompute-num-layers", max(per_stage))
        if len(set(per_stage)) > 1 or "selective" in kinds:
            out.note(_no_equivalent(MEGATRON, f"per-layer mixed recompute (full layers per stage {per_stage}"
                                    + (f", {policies.count('selective')} selective layers" if "selective" in kinds
                                       else "") + ")",
                                    f"block recompute takes the same count in every stage: {max(per_stage)}, the "
                                    "largest, so every stage fits (more recompute than planned)"))
        else:
            out.note(f"full recompute on {per_stage[0]} layer(s) of each stage: Megatron-LM recomputes the first "
                     "ones, the plan any; the cost is the same for identical layers")
    elif "selective" in kinds:
        out.arg("--recompute-granularity", "selective")
        if kinds != {"selective"}:
            out.note(_no_equivalent(MEGATRON, "selective recompute on some layers only",
                                    "Megatron-LM's selective recompute applies to every layer"))


def _megatron_states(plan: Plan, out: _Args) -> None:
    if note := _sync_note(MEGATRON, plan):
        out.note(note)
    zero, differ = layer_zero(plan)
    if zero in (1, 2, 3):
        out.arg("--use-distributed-optimizer")
    if zero == 2:
        out.note(_no_equivalent(MEGATRON, "ZeRO-2 gradient sharding", "the distributed optimizer shards optimizer "
                                "state but keeps each rank's whole gradient buffer (more memory than predicted)"))
    if zero == 3:
        out.note(_no_equivalent(MEGATRON, "ZeRO-3 / FSDP (parameters sharded, gathered layer by layer)",
                                "the distributed optimizer shards optimizer state only (more memory than "
                                "predicted); the nearest is Megatron-FSDP (--use-megatron-fsdp "
                                "--data-parallel-sharding-strategy optim_grads_params), not emitted"))
    if differ:
        out.note(_no_equivalent(MEGATRON, f"per-layer ZeRO stages ({_names(differ)} differ from the layers' "
                                f"ZeRO-{zero})", "data-parallel sharding is one choice for the whole model"))
    _offload_notes(plan, MEGATRON, out)


def to_megatron(plan: Plan) -> str:
    """Megatron-LM arguments for the plan, one per line; `#` lines are comments
    (use: `ARGS=$(grep -v '^#' megatron.args)`, then `pretrain_gpt.py $ARGS ...`)."""
    out = _Args()
    out.note(f"{MEGATRON} arguments for partita plan of {plan.model.get('name', '?')} on "
             f"{plan.cluster.get('spec', '?')}")
    out.note(_mesh_line(plan))
    out.note(f"data parallel {plan.mesh.dp} = world size / (tp pp cp): {MEGATRON} derives it from the ranks it "
             "is started on")
    _megatron_model(plan, out)
    out.arg("--tensor-model-parallel-size", plan.mesh.tp)
    out.arg("--pipeline-model-parallel-size", plan.mesh.pp)
    if plan.mesh.cp > 1:
        out.arg("--context-parallel-size", plan.mesh.cp)
    if plan.mesh.ep > 1:
        out.arg("--expert-model-parallel-size", plan.mesh.ep)
    _megatron_pipeline(plan, out)
    _megatron_tensor(plan, out)
    if plan.overlap.get("tp_comm"):
        out.arg("--tp-comm-overlap")
    if plan.overlap.get("p2p"):
        out.arg("--overlap-p2p-communication")
    out.arg("--micro-batch-size", plan.schedule.micro_batch_size)
    out.arg("--global-batch-size", plan.train["global_batch"])
    if plan.train.get("dtype") == "bf16":
        out.arg("--bf16")
    if plan.train.get("optimizer"):
        out.arg("--optimizer", plan.train["optimizer"])
    _megatron_recompute(plan, out)
    _megatron_states(plan, out)
    return "\n".join(out.lines) + "\n"
