"""--save-final: the trained weights as one process would have them, as a state dict or as HuggingFace's folder.

PATH names a file or a folder (runtime.launcher.inputs.names_folder: a folder ends in "/" or is an existing
directory):
- a file: `torch.save` of {name: tensor} with the model's own parameter and buffer names -- no FSDP, DTensor or
  pipeline wrappers -- so that the model built by the same MODEL string loads it in one process with
  `model.load_state_dict(torch.load(PATH))`. The file is written beside its name and renamed into place, so a
  run killed while saving leaves no half-written file under PATH.
- a folder, for a model that is a transformers `PreTrainedModel` (`hf:` strings, or a factory returning one;
  `folder_refusal` says otherwise before training): the model's `save_pretrained` output -- config.json and
  the weights (model.safetensors) -- which `transformers.AutoModelFor....from_pretrained(PATH)` loads into the
  head class the run trained (`loader`). The same consolidated state dict is handed to `save_pretrained`
  (its `state_dict=` argument) by a copy of the model on the meta device, which holds no weights: the names
  are the HF model's own (checked), tied weights (GPT-2's lm_head and wte) are one tensor again, so transformers
  writes them once and loads them without missing keys. The folder is written beside PATH and its files are
  then moved in, each replaced whole; weight files of an earlier save there that this one does not write
  (other shards) are removed, so from_pretrained cannot mix two saves.

Either way, rank 0 writes and the weights are gathered once: each stage's pieces come from torch's
`torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True)`, which gathers DTensor
shards (FSDP2, tensor parallelism) into whole tensors; expert shards (runtime.parallel.ep) are gathered over
their ep group. Without pipeline parallelism rank 0 holds every parameter, and `cpu_offload=True` keeps the
whole tensors on rank 0 alone; with it, each stage's first data/tensor-parallel rank sends its stage's dict to
rank 0 (`gather_object`).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil

import torch
import torch.distributed as dist

from partita.costmodel.errors import PartitaError
from partita.runtime.launcher.inputs import names_folder
from partita.runtime.parallel.ep import EP_ATTR, full_tensor

AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq",
                "AutoModelForSequenceClassification", "AutoModelForImageClassification")
"""The transformers Auto classes a saved folder's loading line names, the first whose mapping holds the model's
class for its model type (`loader`)."""
WEIGHT_FILES = re.compile(r"^(model(-\d+-of-\d+)?\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?)$")
"""The weight files save_pretrained writes (one file, or shards and their index): those of an earlier save in the
folder that this one does not write are removed."""


def _stage_state(module: torch.nn.Module, offload: bool) -> dict[str, torch.Tensor]:
    """Collective over the module's meshes: its whole tensors (on rank 0 only when `offload`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    for name, p in module.named_parameters():
        if getattr(p, EP_ATTR, None) is not None:  # a plain tensor holding this rank's experts only
            whole = full_tensor(p)
            if name in state:
                state[name] = whole.detach().cpu()
    return state


def consolidated_state(executor, topo) -> dict[str, torch.Tensor] | None:
    """Collective over all ranks: the whole model's state dict on rank 0 (CPU tensors), None elsewhere."""
    pipelined = topo.pp > 1
    state: dict[str, torch.Tensor] = {}
    for module in executor.modules:
        state.update(_stage_state(module, offload=not pipelined))
    state = {k: v.detach().cpu() for k, v in state.items()}
    if pipelined:
        leader = topo.dp_rank == 0 and topo.tp_rank == 0 and topo.cp_rank == 0
        parts = [None] * dist.get_world_size() if topo.rank == 0 else None
        dist.gather_object(state if leader else {}, parts, dst=0)
        if topo.rank == 0:
            state = {k: v for part in parts for k, v in part.items()}
    return state if topo.rank == 0 else None


def trained_module(state: dict[str, torch.Tensor] | None, spec) -> torch.nn.Module | None:
    """Given `consolidated_state`'s result: on rank 0, the model `spec` builds (one process, CPU) with the trained
    weights loaded strictly; None on the other ranks. It holds a second whole copy of the model in rank 0's host
    memory."""
    if state is None:
        return None
    with torch.random.fork_rng(devices=[]):  # its initial weights are overwritten: leave the run's RNG as it was
        model = spec.build()
    model.load_state_dict(state)
    return model


def save_final(path: str, state: dict[str, torch.Tensor] | None, spec=None) -> tuple[int, int] | None:
    """Given `consolidated_state`'s result: rank 0 writes the weights to `path` (module docstring; a folder needs
    `spec`, the run's ModelSpec); returns (tensors, bytes) on rank 0, None elsewhere."""
    if state is None:
        return None
    state = dict(state)  # save_pretrained may drop tied names from the dict it is handed: the caller's stays whole
    size = len(state), sum(t.numel() * t.element_size() for t in state.values())
    if names_folder(path):
        _save_pretrained(path, state, spec)
        return size
    tmp = f"{path}.partita-tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    return size


def _pretrained(spec):
    """The model `spec` builds, on the meta device (no weights), if it is a transformers PreTrainedModel; else None."""
    from partita.costmodel.models.meta import meta_build
    model = meta_build(spec.build)
    return model if callable(getattr(model, "save_pretrained", None)) and hasattr(model, "config") else None


def folder_refusal(path: str, spec) -> str | None:
    """None when --save-final `path` is a file, or a folder for a transformers model; else one line saying why
    and what to give (checked before training, runtime.loop.session.prepare)."""
    if not names_folder(path) or _pretrained(spec) is not None:
        return None
    file = os.path.join(os.fspath(path), "model.pt")
    return (f"--save-final {path} names a folder (it ends in '/' or is a directory), which gets HuggingFace "
            f"save_pretrained output, but model {spec.name!r} is not a transformers PreTrainedModel: give a file "
            f"path (e.g. {file}) for one state dict")


def loader(path: str, spec) -> str:
    """How one process loads what --save-final wrote to `path`, as a line of Python for the run's report."""
    if not names_folder(path):
        return "model.load_state_dict(torch.load(PATH))"
    model = _pretrained(spec)
    name = type(model).__name__
    import transformers
    for auto in AUTO_CLASSES:
        names = getattr(getattr(getattr(transformers, auto, None), "_model_mapping", None), "_model_mapping", {})
        if names.get(getattr(model.config, "model_type", None)) == name:
            return f"transformers.{auto}.from_pretrained(PATH)"
    return f"transformers.{name}.from_pretrained(PATH)"


def _save_pretrained(path: str, state: dict[str, torch.Tensor], spec) -> None:
    """Rank 0: `state` as the transformers model's save_pretrained output in folder `path` (module docstring)."""
    model = _pretrained(spec)
    if model is None:  # folder_refusal said so before training
        raise PartitaError(folder_refusal(path, spec))
    state = _tied_once(model, _matched(model, state))
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        model.to(dtypes.pop())  # config.json records the weights' dtype, which from_pretrained loads them in
    final = os.path.abspath(path)
    tmp = f"{final}.partita-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with _quiet_transformers():
        model.save_pretrained(tmp, state_dict=dict(state))  # it empties the dict it is given
    os.makedirs(final, exist_ok=True)
    written = set(os.listdir(tmp))
    for name in sorted(written, key=lambda n: bool(WEIGHT_FILES.match(n))):  # config first, the weights after
        os.replace(os.path.join(tmp, name), os.path.join(final, name))
    os.rmdir(tmp)
    for name in os.listdir(final):
        if WEIGHT_FILES.match(name) and name not in written:
            os.remove(os.path.join(final, name))


def _matched(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state`, checked to hold exactly the model's own persistent names (what from_pretrained loads)."""
    own = set(model.state_dict())
    missing, extra = sorted(own - set(state)), sorted(set(state) - own)
    if missing or extra:
        raise PartitaError(f"--save-final: the trained weights' names do not match {type(model).__name__}'s "
                           f"(missing {missing[:3]}, extra {extra[:3]}); save to a file instead and report this")
    return state


def _tied_once(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with the names of one tied parameter (e.g. lm_head.weight and the input embedding's) holding one
    tensor, the first name's, as the model's own state dict does: a pipeline sends each stage's copy, and
    save_pretrained writes a tied weight once only when its names share the tensor."""
    first: dict[int, str] = {}
    out = dict(state)
    for name, p in model.named_parameters(remove_duplicate=False):
        if name in out:
            out[name] = out[first.setdefault(id(p), name)]
    return out


@contextlib.contextmanager
def _quiet_transformers():
    """No progress bar from save_pretrained: rank 0's output is the run's progress lines and report."""
    from transformers.utils import logging as hf_logging
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
