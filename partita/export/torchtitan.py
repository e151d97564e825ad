"""`partita export --to torchtitan`: TOML overrides of torchtitan's job config (partita.export's docstring maps
each plan element to its field)."""
from __future__ import annotations

import json

from partita.planner.plan import RECOMPUTE, Plan, one_line
from partita.export.common import (_Args, _mesh_line, _names, _no_equivalent, _offload_notes, _sync_note, architecture,
                                   layer_blocks, layer_zero, model_shape)


TORCHTITAN_LLAMA3 = {"8B": (4096, 32, 32, 8, 14336), "70B": (8192, 80, 64, 8, 28672),
                     "405B": (16384, 126, 128, 8, 53248)}
"""torchtitan's llama3 flavours (torchtitan/models/llama3/__init__.py): dim, n_layers, n_heads, n_kv_heads, and the
FFN size its ffn_dim_multiplier and multiple_of give; vocabulary 128256, rope_theta 500000."""


TORCHTITAN = "torchtitan"


def _torchtitan_parallelism(plan: Plan, notes: _Args) -> dict:
    m, s = plan.mesh, plan.schedule
    if note := _sync_note(TORCHTITAN, plan):
        notes.note(note)
    zero, differ = layer_zero(plan)
    sharded = zero in (2, 3) and m.dp > 1
    par = {"data_parallel_replicate_degree": 1 if sharded else m.dp,
           "data_parallel_shard_degree": m.dp if sharded else 1}
    if sharded:
        par["fsdp_reshard_after_forward"] = "never" if zero == 2 else "always"
    if zero == 1:
        notes.note(_no_equivalent(TORCHTITAN, "ZeRO-1", "data_parallel_replicate_degree replicates the optimizer "
                                  "state too (more memory than predicted)"))
    if differ:
        notes.note(_no_equivalent(TORCHTITAN, f"per-layer ZeRO stages ({_names(differ)} differ from the layers' "
                                  f"ZeRO-{zero})", "fsdp_reshard_after_forward is one policy for the model"))
    par["tensor_parallel_degree"] = m.tp
    par["enable_async_tensor_parallel"] = bool(plan.overlap.get("tp_comm"))
    if plan.overlap.get("tp_comm"):
        notes.note("enable_async_tensor_parallel needs torchtitan's compile of the model (torch.compile finds the "
                   "all-gather / matmul and matmul / reduce-scatter pairs to overlap)")
    if plan.overlap.get("p2p"):
        notes.note(_no_equivalent(TORCHTITAN, "pipeline sends overlapped with compute", "torch.distributed."
                                  "pipelining waits for each step's sends (slower than predicted)"))
    if m.tp > 1:
        par["disable_loss_parallel"] = not _loss_parallel(plan)
        layers = layer_blocks(plan)
        for kind, why in (("replicate", "torchtitan splits every layer over tensor_parallel_degree"),
                          ("tensor", "torchtitan's tensor parallelism is always sequence-parallel")):
            fqns = [b.fqn for b in layers if b.sharding == kind]
            if fqns:
                what = "replicated (not tensor-parallel) layers" if kind == "replicate" else \
                    "tensor parallelism without sequence parallelism on"
                notes.note(_no_equivalent(TORCHTITAN, f"{what} {_names(fqns)}", why))
    par["pipeline_parallel_degree"] = m.pp
    if m.pp > 1:
        par["pipeline_parallel_schedule"] = s.name
        par["pipeline_parallel_microbatch_size"] = s.micro_batch_size
        par["module_fqns_per_model_part"] = [list(st.modules) for st in plan.stages]
        notes.note("module_fqns_per_model_part holds the plan's module names; torchtitan's own models name them "
                   "differently (tok_embeddings, layers.N, norm, output): rename to the model torchtitan trains")
    par["context_parallel_degree"] = m.cp
    if m.ep > 1:  # torchtitan borrows expert ranks from the data-parallel (shard) ranks, as partita does
        par["expert_parallel_degree"] = m.ep
    return par


def _loss_parallel(plan: Plan) -> bool:
    """The plan splits the LM head by vocabulary (a parallel cross-entropy): a `vocab` placement after the
    last layer."""
    layers = layer_blocks(plan)
    if not layers:
        return False
    last = max(i for i, b in enumerate(plan.blocks) if b is layers[-1])
    after = [b.fqn for b in plan.blocks[last + 1:]]
    return any(style == "vocab" and any(fqn == a or fqn.startswith(a + ".") for a in after)
               for fqn, style in plan.placements.items())


def _torchtitan_checkpointing(plan: Plan, notes: _Args) -> dict:
    policies = [b.recompute for b in layer_blocks(plan)]
    kinds = set(policies)
    if kinds <= {"none"}:
        return {"mode": "none"}
    if kinds == {"full"}:
        return {"mode": "full"}
    if kinds == {"op"}:
        return {"mode": "selective", "selective_ac_option": "op"}
    if kinds == {"selective"}:
        notes.note("selective recompute -> per-op selective checkpointing (\"op\"): torchtitan saves matmul "
                   "outputs and recomputes the rest, close to, not the same as, partita's selective")
        return {"mode": "selective", "selective_ac_option": "op"}
    full = policies.count("full")
    if kinds == {"full", "none"} and len(policies) % full == 0:
        every = len(policies) // full
        notes.note(f"full recompute on {full} of {len(policies)} layers -> every {every}-th layer (torchtitan "
                   "picks which; the cost is the same for identical layers)")
        return {"mode": "selective", "selective_ac_option": str(every)}
    strongest = max(kinds, key=RECOMPUTE.index)
    notes.note(_no_equivalent(TORCHTITAN, "per-layer mixed recompute ("
                              + ", ".join(f"{policies.count(k)} {k}" for k in RECOMPUTE if k in kinds) + ")",
                              f"every layer takes {strongest}, the most memory-saving of them"
                              + (" (as per-op selective checkpointing)" if strongest == "selective" else "")))
    if strongest == "full":
        return {"mode": "full"}
    return {"mode": "selective", "selective_ac_option": "op"}


def _torchtitan_training(plan: Plan, notes: _Args) -> dict:
    s, dp, gb = plan.schedule, plan.mesh.dp, plan.train["global_batch"]
    # with a pipeline, a rank's batch is split into micro-batches; without one, partita accumulates
    # gradients over micro-batches, which torchtitan does when global > local x dp
    local = gb // dp if plan.mesh.pp > 1 else s.micro_batch_size
    train = {"local_batch_size": local, "global_batch_size": gb}
    if plan.train.get("seq_len"):
        train["seq_len"] = plan.train["seq_len"]
    train["mixed_precision_param"] = "bfloat16" if plan.train.get("dtype") == "bf16" else "float32"
    train["mixed_precision_reduce"] = "float32"
    layers = layer_blocks(plan) or plan.blocks
    states = [b.offload_states for b in layers]
    if states and all(states):
        train["enable_cpu_offload"] = True
    elif any(states):
        notes.note(_no_equivalent(TORCHTITAN, "model-state offload on some layers only",
                                  "enable_cpu_offload is for the whole model; left off"))
    _offload_notes(plan, TORCHTITAN, notes, states_mapped=True)
    return train


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: the same escapes as JSON
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def _torchtitan_model(plan: Plan, notes: _Args) -> dict:
    """The model torchtitan trains: its llama3 model and the flavour with the plan's shape."""
    a, c = architecture(plan), model_shape(plan)
    if a is None or not a["llama"] or a["experts"]:
        notes.note(_no_equivalent(TORCHTITAN, f"the model {plan.model.get('name', '?')}", "torchtitan trains its own "
                                  "model definitions (llama3, deepseek_v3 ...); name one with these sizes in [model]"))
        return {}
    shape = (c.get("hidden"), len(layer_blocks(plan)) or c.get("layers"), c.get("heads"), c.get("kv_heads"), c.get("ffn"))
    flavor = next((f for f, s in TORCHTITAN_LLAMA3.items() if s == shape), None)
    if flavor is None:
        dims = ", ".join(f"{k}={v}" for k, v in zip(("dim", "n_layers", "n_heads", "n_kv_heads", "ffn"), shape))
        notes.note(_no_equivalent(TORCHTITAN, f"a llama3 flavour with {dims}",
                                  "add one to torchtitan's llama3 flavours and name it here"))
        return {"name": "llama3"}
    differ = ([f"rotary base {a['rope_base']:g} (torchtitan's: 500000)"] if a["rope_base"] != 500000.0 else []) + (
        [f"vocabulary {c['vocab']} (torchtitan's: its tokenizer's, 128256)"] if c.get("vocab") not in (None, 128256) else [])
    if differ:
        notes.note(f"torchtitan's llama3 {flavor} has the plan's shapes; the plan's model differs in {', '.join(differ)}, "
                   "which changes no cost")
    return {"name": "llama3", "flavor": flavor}


def to_torchtitan(plan: Plan) -> str:
    """torchtitan job-config overrides (TOML) for the plan: merge into a torchtitan train config."""
    sections = []
    for name, build in (("model", _torchtitan_model), ("parallelism", _torchtitan_parallelism),
                        ("activation_checkpoint", _torchtitan_checkpointing), ("training", _torchtitan_training)):
        notes = _Args()
        values = build(plan, notes)
        sections.append("\n".join([f"[{name}]", *notes.lines, *(f"{k} = {_toml_value(v)}" for k, v in values.items())]))
    head = [one_line(f"# {TORCHTITAN} job-config overrides for partita plan of {plan.model.get('name', '?')} on "
                     f"{plan.cluster.get('spec', '?')} (TOML JobConfig fields, torchtitan <= v0.2.2)", 1000),
            one_line(_mesh_line(plan), 1000)]
    return "\n".join(head) + "\n\n" + "\n\n".join(sections) + "\n"
