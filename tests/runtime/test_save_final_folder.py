"""--save-final DIR/ in one process (runtime.checkpoint.final; the 2-rank run is tests/e2e/test_hf_weights_out.py):
which paths name a folder, the folder from_pretrained loads (an untied hf:llama trained in bf16 keeps its dtype), a
folder holding an earlier sharded save, names that are not the model's, and the report's loading line."""
from __future__ import annotations

import pytest
import torch

from partita.costmodel import PartitaError, resolve_model
from partita.runtime.checkpoint.final import _save_pretrained, loader
from partita.runtime.launcher.inputs import names_folder, output_errors
from partita.runtime.loop.recipe import build_model

LLAMA = "hf:llama:num_hidden_layers=1,hidden_size=64,intermediate_size=96,vocab_size=128"


def test_a_folder_ends_in_a_slash_or_is_a_directory(tmp_path):
    assert names_folder(f"{tmp_path}/new/") and names_folder(str(tmp_path)) and names_folder(tmp_path)
    assert not names_folder(str(tmp_path / "w.pt")) and not names_folder(str(tmp_path / "new"))
    assert output_errors(save_final=f"{tmp_path}/a/b/") == []  # made when saving, as --tensorboard's
    (tmp_path / "w.pt").write_text("")
    assert output_errors(save_final=f"{tmp_path}/w.pt/") == [
        f"--save-final '{tmp_path}/w.pt/' cannot be created: '{tmp_path}/w.pt' is a file"]


def test_the_folder_loads_with_from_pretrained_in_the_weights_dtype_and_replaces_an_earlier_save(tmp_path):
    import transformers
    spec = resolve_model(LLAMA)
    state = {k: v.to(torch.bfloat16) for k, v in build_model(spec, seed=3).state_dict().items()}
    folder = tmp_path / "out"
    folder.mkdir()
    for stale in ("model-00001-of-00002.safetensors", "model.safetensors.index.json"):
        (folder / stale).write_text("an earlier, sharded save")
    (folder / "README.md").write_text("the user's")
    _save_pretrained(f"{folder}/", dict(state), spec)
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "generation_config.json",
                                                        "model.safetensors"]
    assert not (tmp_path / "out.partita-tmp").exists()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.bfloat16
    assert not any(info.values()), info
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert loader(f"{folder}/", spec) == "transformers.AutoModelForCausalLM.from_pretrained(PATH)"
    assert loader(str(tmp_path / "w.pt"), spec) == "model.load_state_dict(torch.load(PATH))"


def test_names_that_are_not_the_models_are_one_line(tmp_path):
    spec = resolve_model(LLAMA)
    state = {f"module.{k}": v for k, v in build_model(spec, seed=0).state_dict().items()}
    with pytest.raises(PartitaError, match=r"^--save-final: the trained weights' names do not match "
                                           r"LlamaForCausalLM's \(missing \['lm_head.weight', .*\]\); save to a file"):
        _save_pretrained(f"{tmp_path}/out/", state, spec)
    assert not (tmp_path / "out").exists()
