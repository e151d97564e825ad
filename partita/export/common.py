"""What the export formats share: the plan's repeated layers and their ZeRO stage, the model's shape and building
blocks, and the `# partita: ...` notes for what a tool cannot express (partita.export)."""
from __future__ import annotations

import re
import shlex

from partita.costmodel.errors import PartitaError
from partita.planner.plan import BlockChoice, Plan, one_line
from partita.planner.plan.sync import SYNC_MODES


class ExportError(PartitaError):
    """A plan or an option that the asked-for export cannot express."""


_NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def layer_blocks(plan: Plan) -> list[BlockChoice]:
    """The repeated transformer layers: the largest family of blocks named `<prefix>.<n>` (blocks.0,
    model.layers.3, ...); embeddings, final norm and head are not layers. Empty when nothing repeats."""
    families: dict[str, list[BlockChoice]] = {}
    for b in plan.blocks:
        m = _NUMBERED.match(b.fqn)
        if m:
            families.setdefault(m.group(1), []).append(b)
    return max(families.values(), key=len) if families else []


def layers_per_stage(plan: Plan) -> list[int]:
    """Layers in each (virtual) pipeline stage, in model order (stage i runs on pipeline rank i % pp)."""
    layers = layer_blocks(plan)
    return [sum(1 for b in layers if b.stage == s) for s in range(len(plan.stages))]


def layer_zero(plan: Plan) -> tuple[int, list[str]]:
    """The ZeRO stage the layers run at (their own stage where all layers agree, else the plan's) and the
    blocks whose stage differs from it (a sharded plan may keep some blocks gathered: ZeRO-2 in a ZeRO-3
    plan)."""
    def stage(b: BlockChoice) -> int:
        return b.zero_stage if b.zero_stage is not None else plan.zero_stage
    stages = {stage(b) for b in layer_blocks(plan)}
    zero = stages.pop() if len(stages) == 1 else plan.zero_stage
    return zero, [b.fqn for b in plan.blocks if stage(b) != zero]


def _no_equivalent(tool: str, what: str, why: str) -> str:
    return f"# partita: {what} has no {tool} equivalent: {why}"


def _mesh_line(plan: Plan) -> str:
    m, s = plan.mesh, plan.schedule
    cp = f" x cp={m.cp}" if m.cp > 1 else ""
    ep = f" (ep={m.ep} of the dp ranks)" if m.ep > 1 else ""
    return (f"# mesh pp={m.pp} x dp={m.dp}{cp} x tp={m.tp} = {m.world_size} ranks{ep}; schedule {s.name}, "
            f"{s.num_microbatches} micro-batch(es) of {s.micro_batch_size}"
            + (f", {s.virtual_stages} virtual stages per rank" if s.virtual_stages > 1 else ""))


class _Args:
    """Lines of `--flag value` and comments."""

    def __init__(self):
        self.lines: list[str] = []

    def arg(self, flag: str, value=None) -> None:
        self.lines.append(flag if value is None else f"{flag} {shlex.quote(str(value))}")

    def note(self, text: str) -> None:
        text = one_line(text, 1000)  # plan text inside: a newline must not end the comment
        self.lines.append(text if text.startswith("#") else "# " + text)


_HF_KEYS = {"hidden": "hidden_size", "heads": "num_attention_heads", "ffn": "intermediate_size",
            "kv_heads": "num_key_value_heads", "layers": "num_hidden_layers", "vocab": "vocab_size"}
"""partita's model config keys (GPTConfig) and the HuggingFace config attributes a plan of an hf: model records."""


LLAMA_LIKE = {"llama": False, "mistral": False, "qwen2": True}
"""HuggingFace model types built as Llama is (RMSNorm, SwiGLU, rotary positions, no linear biases), and
whether their q, k, v projections have biases (Qwen2)."""


ROPE_BASE = 10000.0
"""The rotary base of partita's llama family (costmodel.models.gpt), and Megatron-LM's default --rotary-base."""


def model_shape(plan: Plan) -> dict:
    """The plan's model sizes under GPTConfig's names (layers, hidden, heads, ffn, kv_heads, vocab), for
    partita's own models and hf: ones alike."""
    c = plan.model.get("config") or {}
    if c.get("family") != "hf":
        return dict(c)
    return {**c, **{k: c[hf] for k, hf in _HF_KEYS.items() if c.get(hf)}}


def architecture(plan: Plan) -> dict | None:
    """The decoder's building blocks -- llama: RMSNorm, SwiGLU, rotary positions (base), no linear biases;
    gpt: LayerNorm, GELU, learned positions, biases -- and whether the embeddings are tied; None when the plan's
    model is neither (an hf: model of another type, a factory)."""
    c = plan.model.get("config") or {}
    if c.get("family") in ("gpt", "llama"):  # GPTConfig: input and output embeddings never tied
        return {"llama": c["family"] == "llama", "rope_base": ROPE_BASE, "qkv_bias": False, "tied": False,
                "experts": c.get("experts") or 0, "top_k": c.get("top_k")}
    if c.get("family") == "hf" and c.get("arch") in LLAMA_LIKE and c.get("task") == "causal":
        return {"llama": True, "rope_base": c.get("rope_theta", ROPE_BASE), "qkv_bias": LLAMA_LIKE[c["arch"]],
                "tied": bool(c.get("tie_word_embeddings")), "experts": 0, "top_k": None}
    return None


def _names(fqns: list[str], most: int = 4) -> str:
    return ", ".join(fqns[:most]) + (f" and {len(fqns) - most} more" if len(fqns) > most else "")


def _sync_note(tool: str, plan: Plan) -> str | None:
    """The note for a plan whose sync mode (planner.plan.sync) the tool's arguments do not carry; None: synchronous."""
    if SYNC_MODES[plan.sync.mode].as_synchronous:
        return None
    options = ", ".join(f"{'H' if k == 'every' else k} = {v}" for k, v in plan.sync.options.items())
    return _no_equivalent(tool, f"the {plan.sync.mode} sync mode" + (f" ({options})" if options else ""),
                          "these arguments train synchronous data parallelism; the prediction assumed the plan's mode")


def _offload_notes(plan: Plan, tool: str, out: _Args, *, states_mapped: bool = False) -> None:
    acts = [b.fqn for b in plan.blocks if b.offload_activations]
    states = [b.fqn for b in plan.blocks if b.offload_states]
    if acts:
        out.note(_no_equivalent(tool, f"activation offload to host memory ({_names(acts)})",
                                "the activations stay on the device (more memory than predicted)"))
    if states and not states_mapped:
        out.note(_no_equivalent(tool, f"model-state offload to host memory ({_names(states)})",
                                "parameters, gradients and optimizer state stay on the device"))
