"""Issue 46: HuggingFace classifiers as `hf:` strings -- `hf:bert-cls` (BertForSequenceClassification) and `hf:vit`
(ViTForImageClassification) -- are planned by `partita plan` with their own head and train on 2 data-parallel ranks
like one process (--verify) from a HuggingFace dataset of dict rows (tests/e2e/dict_rows.py: input_ids / labels,
pixel_values / labels), matched by the models' input names; a misspelt task is one line naming the right one.

One plan and one 2-rank run per model (tiny configs: 2 layers, hidden 128; 3 steps).
"""
from __future__ import annotations

import json

import pytest
from rank_pool import run_plan

from partita.costmodel import PartitaError, resolve_model
from test_plans_match_single_process import ROOT

E2E = ROOT / "tests" / "e2e"
MODELS = {
    "hf:bert-cls": ("BertForSequenceClassification", "dict_rows:bert_cls_rows", "input_ids, labels",
                    "token_type_ids, attention_mask are not used"),
    "hf:vit": ("ViTForImageClassification", "dict_rows:vit_rows", "pixel_values, labels", None),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Each model planned through the CLI (2 CPUs, global batch 4) and its plan run on 2 ranks with --verify."""
    from partita import cli
    tmp = tmp_path_factory.mktemp("classifiers")
    out = {}
    for model, (_, data, _, _) in MODELS.items():
        plan = tmp / f"{model[3:]}.json"
        argv = ["plan", "--model", model, "--cluster", "2xcpu", "--global-batch", "4", "--out", str(plan)]
        assert cli.main(argv) == 0
        losses = tmp / f"{model[3:]}.losses.json"
        done = run_plan(plan, model, "--steps", "3", "--lr", "1e-3", "--verify", "--data", data, "--log-every", "0",
                        "--losses-out", str(losses), cwd=E2E)  # dict_rows importable from the working directory
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out[model] = {"plan": json.loads(plan.read_text()), "losses": json.loads(losses.read_text()),
                      "stdout": done.stdout}
    return out


@pytest.mark.parametrize("model", MODELS)
def test_the_classifier_plans_with_its_head_and_trains_on_dp2_like_one_process(runs, model):
    head, data, names, unused = MODELS[model]
    r = runs[model]
    config = r["plan"]["model"]["config"]
    assert config["model"] == head and config["task"] in ("seq-cls", "image-cls"), config
    assert r["plan"]["mesh"]["dp"] == 2 and r["plan"]["mesh"]["pp"] == 1
    assert r["losses"]["verified"] is True and all(c["passed"] for c in r["losses"]["checks"]), r["losses"]["checks"]
    assert len(r["losses"]["losses"]) == 3
    out = r["stdout"].splitlines()
    assert f"(dataset {data})" in out[0]
    said = f"note: dataset '{data}': model '{model}' takes {names} from each sample"
    note = [ln for ln in out if ln.startswith(said)]
    assert len(note) == (1 if unused else 0) and (not unused or note[0].endswith(
        f"{unused} (the model is planned on its inputs alone)")), out
    assert "verify: OK" in out


def test_the_image_classifier_counts_samples_and_takes_no_seq(runs):
    assert runs["hf:vit"]["plan"]["train"]["seq_len"] is None and runs["hf:vit"]["losses"]["unit"] == "samples"
    assert runs["hf:bert-cls"]["losses"]["unit"] == "tokens"
    with pytest.raises(PartitaError, match=r"^model 'hf:vit:seq=16' is an image classifier, whose sequence is its "
                                           r"image's patches: drop seq"):
        resolve_model("hf:vit:seq=16")


@pytest.mark.parametrize("model, needle", [
    ("hf:bert-clss", "unknown task 'clss' in 'hf:bert-clss' (did you mean 'cls'?); the tasks are -cls, a "
                     "classification head"),
    ("hf:vit-clas", "unknown task 'clas' in 'hf:vit-clas' (did you mean 'cls'?)"),
    ("hf:bertcls", "unknown HuggingFace model type 'bertcls' in 'hf:bertcls' (did you mean 'bert-cls'?)"),
    ("hf:mamba-cls", "HuggingFace model type 'mamba' ('hf:mamba-cls') has no sequence- or image-classification head"),
    ("hf:llama-cls", "add pad_token_id=ID"),
    ("hf:bert-cls:num_labels=1", "`num_labels > 1`"),
])
def test_a_misspelt_or_impossible_task_is_one_line_before_planning(capsys, model, needle):
    from partita import cli
    assert cli.main(["plan", "--model", model, "--cluster", "2xcpu", "--global-batch", "4"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_other_families_take_the_task_at_their_small_defaults():
    """-cls on any model type with a classification head: a family with small defaults keeps them."""
    llama = resolve_model("hf:llama-cls:pad_token_id=0,num_labels=3")
    deit = resolve_model("hf:deit-cls:num_hidden_layers=1,image_size=64")
    assert (llama.config["model"], llama.config["num_hidden_layers"], llama.config["num_labels"]) == (
        "LlamaForSequenceClassification", 2, 3)
    assert deit.config["model"] == "DeiTForImageClassification" and deit.named_inputs() == ("pixel_values", "labels")
    assert [tuple(t.shape) for t in deit.example_inputs(2)] == [(2, 3, 64, 64), (2,)]
