"""What the runtime executes, stated once as data and functions: the planner generates candidates inside
these limits and the runtime's pre-flight checks (runtime/launcher/checks.py) refuse plans outside them, with the
same words, so a plan the planner makes is never one the runtime refuses. The planner cannot import the
runtime (costmodel <- planner <- runtime), so this module lives here and the runtime imports it.

- Schedules: `SCHEDULES`, the names of planner.plan.schedules' registry (torch.distributed.pipelining's
  1F1B, GPipe, interleaved 1F1B); each record's `refusal` says which micro-batch counts and depths run.
- ZeRO: `ZERO_STAGES` -- 0 (DDP or hand-averaged gradients), 1 (torch's ZeroRedundancyOptimizer over
  those gradients, runtime/parallel/zero1.py; `zero_refusal`: not beside tensor, context or expert parallelism),
  2 and 3 (FSDP2).
- Overlaps (`overlap_refusal`): none. The runtime's tensor-parallel collectives (DTensor) complete before
  the operator that reads them, and torch.distributed.pipelining waits for each step's sends and
  receives before the next compute; plans that overlap them (Megatron-Core's --tp-comm-overlap and
  --overlap-p2p-communication, torch's async TP) are priced, exported, and refused by `partita run`.
- Precision (`runs_autocast`): a bf16 plan computes under torch.autocast over fp32 parameters unless FSDP
  (ZeRO-2/3) holds the parameters, whose MixedPrecisionPolicy gathers them in bf16 (runtime/parallel/precision.py);
  a pure-bf16 plan (train.master_weights "none") runs a bf16 model with its optimizer on the bf16 parameters.
- Activation offload (`offload_refusal`): never under full recompute; in a compiled layer only where
  nothing is recomputed.
- Pipelines (`pipeline_refusal`): a pipeline's first stage is fed the batch's token ids and its last stage
  computes the loss from its output and the batch's second tensor. That is possible for
  - token LMs (our presets, gpt:/llama: families; a `package.module:factory` token model: one integer
    input [batch, seq], an nn.Embedding, an LM head as its last nn.Linear): mean token cross-entropy;
  - HuggingFace causal LMs (`hf:gpt2`, `hf:llama`, ...): the last stage outputs the logits and the loss is
    HF's shifted next-token cross-entropy (runtime.loop.recipe.hf_causal_loss); masked LMs (`hf:bert`): cross-entropy at
    every position (the runtime's batches label every position).
  It is not for models with any other `loss_fn(module, *batch)`: such a function calls the module and
  computes the loss in one piece of user code the pipeline cannot cut in two; nor for sequence-to-
  sequence models (t5), whose forward also needs the decoder inputs; nor for HuggingFace classifiers
  (`hf:bert-cls`, `hf:vit`), whose last stage would need a loss over pooled logits (not built yet); nor for our
  CNN classifiers, whose BatchNorm would see micro-batches (`PIPELINE_KINDS`). The planner plans them with pp=1
  and says why (`pipeline_refusal_for`); the runtime refuses a hand-written pp>1 plan for them.
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from partita.costmodel.errors import PartitaError
from partita.planner.plan import schedules
from partita.planner.plan.sync import SYNC_MODES
if TYPE_CHECKING:  # torch loads where a function needs it: `partita explain` and listings start without it
    import torch.nn as nn

    from partita.costmodel.models import ModelSpec

SCHEDULES = tuple(schedules.SCHEDULES)
"""Pipeline schedules the runtime runs: the registry's names (planner.plan.schedules; runtime/parallel/pp/
resolves each record's torch class)."""
ZERO_STAGES = (0, 1, 2, 3)
"""ZeRO stages the runtime executes (runtime/parallel/zero1.py, runtime/parallel/fsdp.py), within `zero_refusal`."""
ZERO1_RUNS_WITH = ("dp", "pp")
"""Axes ZeRO-1 runs beside: torch's ZeroRedundancyOptimizer broadcasts whole parameters over the
data-parallel ranks, so not DTensor (tensor-parallel) parameters, nor expert parameters that differ
between those ranks, nor the dp x cp replicas of context parallelism (not verified)."""


def zero_refusal(zero: int, tp: int = 1, cp: int = 1, ep: int = 1) -> str | None:
    """None when the runtime runs ZeRO stage `zero` on this mesh; else one line saying why not."""
    if zero not in ZERO_STAGES:
        return f"ZeRO stage {zero} does not exist; the runtime runs ZeRO {', '.join(map(str, ZERO_STAGES))}"
    others = [f"{k}={v}" for k, v in (("tp", tp), ("cp", cp), ("ep", ep)) if v > 1]
    if zero == 1 and others:
        return (f"ZeRO-1 with {' and '.join(others)} is not run by partita's runtime: it runs ZeRO-1 as torch's "
                f"ZeroRedundancyOptimizer, beside {' and '.join(ZERO1_RUNS_WITH)} only; use ZeRO 0, 2 or 3 "
                "(--zero 2 also shards the gradients)")
    return None



def sync_refusal(mode: str, pp: int = 1, tp: int = 1, cp: int = 1, ep: int = 1, zero: int = 0) -> str | None:
    """None when the runtime runs sync mode `mode` (planner.plan.sync) on this plan; else one line saying why not.
    DiLoCo's and streaming DiLoCo's hooks (runtime.loop.sync) run on DDP replicas (their inner steps use DDP's
    no_sync), on tensor- and pipeline-parallel replicas at zero 0 (each tp rank's shard, each stage's parameters,
    exchanged with their peers in the other islands), or with FSDP (ZeRO 2/3) over each island's replicas alone; the compressed and powersgd modes are DDP
    communication hooks."""
    if mode not in SYNC_MODES or not SYNC_MODES[mode].ddp_replicas_only:
        return None
    entry = SYNC_MODES[mode]
    tp_runs, pp_runs = entry.tensor_parallel and not zero, entry.pipeline and not zero
    others = [f"{k}={v}" for k, v in (("pp", 1 if pp_runs else pp), ("tp", 1 if tp_runs else tp), ("cp", cp),
                                      ("ep", ep)) if v > 1]
    others += [f"zero={zero}"] if zero and not (entry.shards_in_islands and zero in (2, 3)) else []
    if others:
        runs = ("data-parallel replicas (DDP, tensor- and pipeline-parallel replicas at zero 0, or FSDP with ZeRO 2 "
                "or 3 inside each island without tensor or pipeline parallelism; no context or expert parallelism)"
                if entry.shards_in_islands else "DDP replicas (zero 0, data parallelism only)")
        fix = "--zero 0 (with --tp, --pp), or 2 or 3 with --tp 1 --pp 1" if entry.shards_in_islands else \
            "--zero 0 --tp 1 --pp 1"
        return (f"{mode} with {' and '.join(others)} is not run by partita's runtime: it runs the {mode} sync mode on "
                f"{runs} today; plan with {fix} to run it")
    return None


def runs_autocast(dtype: str, zero: int, autocast: bool = True, master_weights: str = "fp32") -> bool:
    """Whether the runtime trains a plan of this dtype and ZeRO stage under torch.autocast over fp32
    parameters (module docstring); `autocast` False prices a bf16 model instead (TrainConfig.autocast), as
    does a pure-bf16 plan (`master_weights` "none": the runtime builds the model in bf16)."""
    return dtype == "bf16" and autocast and zero < 2 and master_weights != "none"


PIPELINE_KINDS = ("lm", "hf-causal", "hf-mlm")
"""Model kinds a pipeline runs (module docstring); `model_kind` names the others "own-loss", "seq2seq",
"classifier" (our CNNs: a last stage could compute their cross-entropy, but BatchNorm over micro-batches
is not BatchNorm over the batch) and "no-batches"."""


def token_model_shape(spec: ModelSpec, module: nn.Module | None = None) -> tuple[int, int] | None:
    """(vocab, seq_len) of a model without a loss_fn or vocabulary of its own (a `package.module:factory`)
    that is a token LM: one integer example input [batch, seq], a first nn.Embedding of `vocab` rows, and
    a last nn.Linear with `vocab` outputs (the LM head). None otherwise. `module`: the model (built on the
    meta device when not given)."""
    import torch.nn as nn

    from partita.costmodel.models.meta import meta_build
    if spec.loss_fn is not None:
        return None
    inputs = spec.example_inputs(1)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    if len(inputs) != 1 or inputs[0].dtype.is_floating_point or inputs[0].dim() != 2:
        return None
    if module is None:
        module = meta_build(spec.build)
    embeddings = [m for m in module.modules() if isinstance(m, nn.Embedding)]
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    if not embeddings or not linears or linears[-1].out_features != embeddings[0].num_embeddings:
        return None
    return embeddings[0].num_embeddings, int(inputs[0].shape[1])


def model_kind(spec: ModelSpec) -> str:
    """"lm", "hf-causal", "hf-mlm", "hf-classifier", "seq2seq", "classifier", "own-loss" or "no-batches"
    (PIPELINE_KINDS)."""
    if spec.loss_fn is None:
        if spec.vocab and spec.seq_len:
            return "lm"
        return "lm" if token_model_shape(spec) is not None else "no-batches"
    cfg = spec.config if isinstance(spec.config, dict) else {}
    if cfg.get("family") == "hf":
        return {"causal": "hf-causal", "mlm": "hf-mlm", "seq-cls": "hf-classifier", "image-cls": "hf-classifier",
                "contrastive": "own-loss"}.get(cfg.get("task"), "seq2seq")
    from partita.costmodel.models.cnn import classification_loss
    return "classifier" if spec.loss_fn is classification_loss else "own-loss"


_WHY = {
    "own-loss": "computes its own loss (loss_fn), which a pipeline cannot split: the function calls the model "
                "and computes the loss in one piece, while a pipeline's last stage must compute the loss from "
                "its output and the targets (done for token LMs and HuggingFace causal/masked LMs)",
    "seq2seq": "is a sequence-to-sequence model, whose forward takes the decoder inputs besides the token ids, "
               "while a pipeline's first stage is fed the token ids alone",
    "hf-classifier": "is a HuggingFace classifier, whose loss is the cross-entropy of one label per sample (logits "
                     "pooled from its tokens or patches); a pipeline's last stage computes token losses only "
                     "(HuggingFace causal and masked LMs)",
    "classifier": "is an image classifier whose BatchNorm layers normalise over each micro-batch a pipeline "
                  "runs, so it would not train as one process does (measured: losses 0.15 apart at step 2)",
    "no-batches": "has neither a vocabulary and sequence length nor a loss_fn, so the runtime cannot make its "
                  "batches (a model factory may return (module, example_inputs, loss_fn))",
}


def pipeline_refusal(spec: ModelSpec) -> str | None:
    """None when a pipeline (pp > 1) runs `spec`; else one line saying why not."""
    return _refusal(spec.name, model_kind(spec))


def _refusal(name: str, kind: str) -> str | None:
    return None if kind in PIPELINE_KINDS else f"model {name!r} {_WHY[kind]}: use a plan with pp=1"


def _gpt_config_of(name: str):
    """The GPTConfig of a MODEL string naming one of partita's GPT or Llama models (resolve_model gives it a
    token-LM ModelSpec: gpt_spec, no loss_fn), or None; read without importing torch, so a plan whose capture is
    cached (costmodel.capture.cache) runs without it."""
    from partita.costmodel.models.configs import gpt_config_of
    return gpt_config_of(name) if isinstance(name, str) else None


def _kind_without_torch(name: str) -> str | None:
    """`model_kind` of partita's own presets and gpt:/llama: strings, read without torch: a token LM ("lm"), or one
    of its CNN presets ("classifier": models.cnn's classification_loss); None for any other name."""
    from partita.costmodel.models.configs import CNN_PRESETS
    if _gpt_config_of(name) is not None:
        return "lm"
    return "classifier" if name in CNN_PRESETS else None


@functools.lru_cache(maxsize=64)
def pipeline_refusal_for(name: str) -> str | None:
    """`pipeline_refusal` of the model a plan names (the runtime rebuilds it from that MODEL string). A name
    that is no MODEL string (a module or ModelSpec given to planner.plan as an object) is run with the
    module and loss_fn the user passes to runtime.run, which a pipeline cannot split: refused too."""
    try:
        if (kind := _kind_without_torch(name)) is not None:
            return _refusal(name, kind)
        from partita.costmodel.models import resolve_model
        spec = resolve_model(name)
    except PartitaError:
        return (f"model {name!r} is not a MODEL string the runtime can rebuild, so it runs with the loss_fn "
                "given at run time, which a pipeline cannot split: use a plan with pp=1")
    return pipeline_refusal(spec)


def overlap_refusal(tp_comm: bool, p2p: bool) -> str | None:
    """None when the plan overlaps nothing the runtime cannot (module docstring); else one line."""
    if tp_comm:
        return ("tensor-parallel collectives overlapped with GEMMs (Megatron-Core --tp-comm-overlap, torch's async "
                "TP) are not run by partita's runtime, whose DTensor collectives finish before the next operator: "
                "re-plan with --tp-comm-overlap off, or run the plan with Megatron-LM (partita export --to megatron)")
    if p2p:
        return ("pipeline sends overlapped with compute (Megatron-Core --overlap-p2p-communication) are not run by "
                "partita's runtime, whose pipeline (torch.distributed.pipelining) waits for each step's sends: "
                "re-plan with --p2p-overlap off, or run the plan with Megatron-LM (partita export --to megatron)")
    return None


# Activation offload (runtime/parallel/offload.py) beside recompute, and in compiled layers (runtime/parallel/blocks.py).
COMPILED_OFFLOAD_RECOMPUTE = ("none",)
"""Recompute modes under which a compiled layer may offload its activations: a selective ("selective",
"op") checkpoint offloading what its policy keeps adds a second context to the checkpoint, and a compiled
checkpoint takes only its policy's (torch.compile refuses it)."""


def _torch_version() -> str:
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    return importlib.metadata.version("torch")


@functools.cache
def checkpoint_policies_see_outputs() -> bool:
    """Whether this torch's selective-checkpoint policies are handed each op's output (SelectiveCheckpointContext
    .op_output): what runtime.parallel.offload needs to move the outputs a selective or op policy keeps to host memory.
    torch 2.13 has it; 2.11 (a lent H200's) has not, and a plan offloading under those policies failed there.

    Where torch is not imported yet (a plan from a cached capture needs no torch: ~2 s of import) the answer is
    read from the source of torch.utils.checkpoint: whether the context's __init__ takes op_output."""
    if "torch" in sys.modules:
        import inspect

        from torch.utils.checkpoint import SelectiveCheckpointContext
        return "op_output" in inspect.signature(SelectiveCheckpointContext).parameters
    spec = importlib.util.find_spec("torch")
    source = Path(spec.origin).parent / "utils" / "checkpoint.py"
    text = source.read_text(encoding="utf-8")
    start = text.find("class SelectiveCheckpointContext")
    init = text.find("def __init__", start)
    return start >= 0 and init >= 0 and "op_output" in text[init:text.find(")", init)]


def offload_refusal(recompute: str, offload_activations: bool, kernels: str, fqn: str = "a layer") -> str | None:
    """None when a block with this recompute and activation offload runs under `kernels`; else one line
    saying why not. Under full recompute nothing is offloaded (the checkpoint keeps only the block's input,
    still in use); a compiled layer offloads only under COMPILED_OFFLOAD_RECOMPUTE. The planner leaves such
    variants out of its search (options.variants); the runtime refuses a plan that has one."""
    if not offload_activations:
        return None
    if recompute in ("selective", "op") and not checkpoint_policies_see_outputs():
        return (f"{fqn} offloads what {recompute} recompute keeps, which needs a torch whose checkpoint policies "
                f"see op outputs; torch {_torch_version()} does not: use recompute none with offload, or a newer "
                "torch")
    if recompute == "full":
        return (f"{fqn} offloads activations under full recompute, which keeps only the block's input (still "
                "in use): nothing to offload; use recompute none or selective")
    if kernels != "compiled" or recompute in COMPILED_OFFLOAD_RECOMPUTE:
        return None
    return (f"compiled plan offloads what {fqn} keeps under {recompute} recompute, which torch.compile cannot "
            "run (the offload adds a context to the checkpoint, and a compiled checkpoint takes only its "
            "policy's): re-plan with --offload off, or without --kernels compiled")


# Context and expert parallelism (runtime/parallel/cp.py, runtime/parallel/ep.py): what composes with what.
CP_RUNS_WITH = ("dp", "tp")
"""Axes context parallelism runs beside (with ZeRO 0/2/3): not pipelines (a stage is a traced graph, which
has no cp attention), not expert parallelism."""
EP_RUNS_WITH = ("dp",)
"""Axes expert parallelism runs beside (with ZeRO 0/2/3): not tp, pp or cp (a pipeline stage is a traced
graph, so the experts' dispatch would not apply)."""


def composition_refusal(pp: int, tp: int, cp: int, ep: int) -> str | None:
    """One line when the runtime does not run this combination of cp / ep with the other axes; else None."""
    sizes = {"pp": pp, "tp": tp, "cp": cp, "ep": ep}
    for axis, runs_with in (("cp", CP_RUNS_WITH), ("ep", EP_RUNS_WITH)):
        if sizes[axis] > 1:
            other = [f"{k}={v}" for k, v in sizes.items() if k != axis and k not in runs_with and v > 1]
            if other:
                return (f"{axis}={sizes[axis]} with {' and '.join(other)} is not run by partita's runtime: "
                        f"{'context' if axis == 'cp' else 'expert'} parallelism runs beside "
                        f"{' and '.join(runs_with)} (and ZeRO) only")
    return None


@functools.lru_cache(maxsize=64)
def cp_refusal_for(name: str) -> str | None:
    """None when the runtime runs context parallelism for the model a plan names: partita's own GPT and
    Llama models (presets, gpt:/llama: families), whose attention it splits; else one line."""
    try:
        kind = _kind_without_torch(name)  # partita's own models: known without torch
        if kind == "lm":
            return None
        from partita.costmodel.models import resolve_model
        spec = None if kind is not None else resolve_model(name)
    except PartitaError:
        spec = None
    cfg = spec.config if spec is not None and isinstance(spec.config, dict) else {}
    if cfg.get("family") in ("gpt", "llama") and spec.loss_fn is None:
        return None
    return (f"context parallelism runs for partita's GPT and Llama models (presets such as tiny-gpt and "
            f"tiny-llama, gpt:... and llama:... families); model {name!r} is not one")
