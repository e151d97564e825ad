"""Issue 46, "weights out": `--save-final DIR/` of an `hf:` model writes HuggingFace save_pretrained output that a
fresh process loads with `AutoModelForCausalLM.from_pretrained(DIR)`.

One 2-rank run: hf:gpt2 (its lm_head tied to wte) split into pp=2 stages, so the head and the embedding it is tied
to live on different ranks and the weights are gathered from both stages. It trains on 4 rows (one global batch,
tests/e2e/dict_rows.py) and evaluates on them after its last step (--eval-data); a fresh Python process loads the
folder, with no missing or unexpected key and the head tied again, and its loss on those rows equals the run's
(1e-5), while the untrained initialisation's is 0.8 higher -- so the folder holds the trained weights. A folder
for a model that is not a transformers model is one line before training.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rank_pool import run_plan

from partita.costmodel import model_fingerprint, resolve_model
from partita.planner.plan import Plan
from partita.runtime.launcher.checks import build_meta
from test_plans_match_single_process import ROOT, _env, make_plan

E2E = ROOT / "tests" / "e2e"
GPT2 = "hf:gpt2:n_layer=2,n_embd=64,n_head=4,vocab_size=128"  # seq 64; dict_rows.gpt2_rows' vocabulary

LOAD = """
import json, sys, torch, transformers
from partita.costmodel import resolve_model
from partita.runtime.loop.recipe import build_model
from dict_rows import gpt2_rows
folder, name = sys.argv[1:]
model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
rows = gpt2_rows()
ids, labels = torch.tensor(rows["input_ids"]), torch.tensor(rows["labels"])
with torch.no_grad():
    loss = float(model(input_ids=ids, labels=labels).loss)
    init = float(build_model(resolve_model(name), seed=0)(input_ids=ids, labels=labels).loss)
print(json.dumps({"class": type(model).__name__, "info": {k: sorted(map(str, v)) for k, v in info.items()},
                  "tied": model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(),
                  "dtype": str(model.dtype), "loss": loss, "init_loss": init}))
"""


def gpt2_pp2(path) -> None:
    """A 2-stage pipeline plan of GPT2 (wte on stage 0, the lm_head tied to it on stage 1), as the planner writes it."""
    first = ["transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h.0"]
    last = ["transformer.h.1", "transformer.ln_f", "lm_head"]
    plan = {"schema": "partita.plan/1",
            "model": {"name": GPT2, "fingerprint": model_fingerprint(build_meta(resolve_model(GPT2)))},
            "cluster": {"spec": "2xcpu", "num_devices": 2},
            "train": {"global_batch": 4, "seq_len": 64, "dtype": "fp32"},
            "mesh": {"pp": 2, "dp": 1, "tp": 1},
            "schedule": {"name": "1F1B", "num_microbatches": 2, "micro_batch_size": 2},
            "stages": [{"index": 0, "modules": first, "split_at": None},
                       {"index": 1, "modules": last, "split_at": "transformer.h.1"}],
            "blocks": [{"fqn": m, "stage": i, "sharding": "replicate"}
                       for i, ms in enumerate((first, last)) for m in ms],
            "placements": {}, "predicted": {"step_time_s": 0.01, "peak_memory_bytes": 2_000_000}}
    Plan.from_dict(plan)
    path.write_text(json.dumps(plan))


def test_a_pipelined_hf_model_saves_a_folder_that_from_pretrained_loads_trained(tmp_path):
    gpt2_pp2(tmp_path / "plan.json")
    folder, out = tmp_path / "gpt2-out", tmp_path / "losses.json"
    # trained and evaluated on the rows of dict_rows, importable from the working directory as a user's module is
    done = run_plan(tmp_path / "plan.json", GPT2, "--steps", "3", "--lr", "1e-2", "--log-every", "0",
                    "--data", "dict_rows:gpt2_rows", "--eval-data", "dict_rows:gpt2_rows", "--losses-out", str(out),
                    "--save-final", f"{folder}/", cwd=E2E)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["saved_final"] == f"{folder}/" and "Writing model shards" not in done.stderr
    how = "transformers.AutoModelForCausalLM.from_pretrained(PATH)"
    assert f"final weights: {folder}/ (one process loads them: {how})" in done.stdout
    assert {"config.json", "model.safetensors"} <= {p.name for p in folder.iterdir()}
    assert not (tmp_path / "gpt2-out.partita-tmp").exists()
    loaded = subprocess.run([sys.executable, "-c", LOAD, str(folder), GPT2], cwd=E2E, env=_env(PYTHONPATH=str(ROOT)),
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    got = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert got["class"] == "GPT2LMHeadModel" and got["tied"] and got["dtype"] == "torch.float32", got
    assert not any(got["info"].values()), got["info"]  # no missing, unexpected or mismatched key
    assert "newly initialized" not in loaded.stderr and "MISSING" not in loaded.stderr.upper(), loaded.stderr
    (step, evaluated), = r["eval_losses"]
    print(f"eval loss after step {step}: run {evaluated!r}, loaded {got['loss']!r}, untrained {got['init_loss']!r}")
    assert step == 3 and got["loss"] == pytest.approx(evaluated, abs=1e-5)
    assert got["init_loss"] - evaluated > 0.1  # trained on these rows: the untrained weights would not pass


def test_a_folder_for_a_model_that_is_not_a_transformers_model_is_one_line_before_training(tmp_path):
    from partita.costmodel import PartitaError
    from partita.runtime.checkpoint.final import folder_refusal
    from partita.runtime.loop.session import RunOptions, prepare
    tiny = resolve_model("tiny-gpt")
    assert folder_refusal(str(tmp_path / "w.pt"), tiny) is None  # a file: the state dict, as before
    assert folder_refusal(f"{tmp_path}/out/", resolve_model(GPT2)) is None
    with pytest.raises(PartitaError) as e:
        prepare(Plan.from_dict(make_plan(dp=2)), tiny, RunOptions(save_final=str(tmp_path)), world=2,
                look_at_devices=False)
    assert str(e.value) == (f"--save-final {tmp_path} names a folder (it ends in '/' or is a directory), which gets "
                            "HuggingFace save_pretrained output, but model 'tiny-gpt' is not a transformers "
                            f"PreTrainedModel: give a file path (e.g. {tmp_path}/model.pt) for one state dict")
