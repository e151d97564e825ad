"""Issue 46, "Data": `partita run --data package.module:factory` from a HuggingFace `datasets.Dataset` of dict rows
(tests/e2e/dict_rows.py) trains an `hf:` model on 2 data-parallel ranks like one process (--verify), its keys
matched by name (the labels mask half of each row, so swapped keys would fail) and the unused ones said once
before training; `--data` given a folder is one line that says so and what --data takes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from partita.costmodel import model_fingerprint, resolve_model
from partita.planner.plan import Plan
from partita.runtime.launcher.checks import build_meta
from test_plans_match_single_process import ROOT, _env, make_plan

E2E = str(ROOT / "tests" / "e2e")
LLAMA = "hf:llama"  # 2 layers, hidden 128, vocabulary 1024, seq 64 (costmodel.models.hf)


def llama_dp2(path) -> None:
    """A data-parallel plan of hf:llama on 2 ranks, global batch 4, as the planner writes it (without running it)."""
    modules = ["model.embed_tokens", "model.rotary_emb", "model.layers.0", "model.layers.1", "model.norm", "lm_head"]
    plan = {"schema": "partita.plan/1",
            "model": {"name": LLAMA, "fingerprint": model_fingerprint(build_meta(resolve_model(LLAMA)))},
            "cluster": {"spec": "2xcpu", "num_devices": 2},
            "train": {"global_batch": 4, "seq_len": 64, "dtype": "fp32"},
            "mesh": {"pp": 1, "dp": 2, "tp": 1},
            "schedule": {"name": "1F1B", "num_microbatches": 1, "micro_batch_size": 2},
            "stages": [{"index": 0, "modules": modules, "split_at": None}],
            "blocks": [{"fqn": m, "stage": 0, "sharding": "replicate"} for m in modules],
            "placements": {}, "predicted": {"step_time_s": 0.01, "peak_memory_bytes": 2_000_000}}
    Plan.from_dict(plan)
    path.write_text(json.dumps(plan))


def partita_run(tmp_path, plan: str, model: str, *flags: str) -> subprocess.CompletedProcess:
    env = _env(PYTHONPATH=os.pathsep.join((str(ROOT), E2E)))  # dict_rows importable, as a user's module would be
    return subprocess.run([sys.executable, "-m", "partita.cli", "run", str(tmp_path / plan), "--model", model,
                           *flags], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_an_hf_model_trains_on_a_huggingface_dict_dataset_under_dp2_with_verify(tmp_path):
    (tmp_path / "gpt.json").write_text(json.dumps(make_plan(dp=2)))
    folder = partita_run(tmp_path, "gpt.json", "tiny-gpt", "--steps", "1", "--data", str(tmp_path))
    assert folder.returncode == 2 and folder.stderr.strip().splitlines() == [
        f"partita: error: --data {tmp_path} is a directory: give one token file (.npy, or raw little-endian "
        "uint16/uint32 token ids) or package.module:factory returning a dataset (a saved HuggingFace dataset "
        "folder: a factory returning datasets.load_from_disk(folder))"]
    llama_dp2(tmp_path / "plan.json")
    ran = partita_run(tmp_path, "plan.json", LLAMA, "--steps", "3", "--verify", "--data", "dict_rows:llama_rows",
                      "--losses-out", str(tmp_path / "losses.json"))
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    out = ran.stdout.splitlines()
    assert out[0].startswith(f"partita run: {LLAMA} on 2 rank(s) (pp=1 dp=2 tp=1")
    assert "(dataset dict_rows:llama_rows)" in out[0]
    note = ("note: dataset 'dict_rows:llama_rows': model 'hf:llama' takes input_ids, labels from each sample by key; "
            "text, attention_mask are not used (the model is planned on its inputs alone)")
    assert out.count(note) == 1 and out.index(note) < next(i for i, ln in enumerate(out) if ln.startswith("step "))
    assert "verify: OK" in out
    losses = json.loads((tmp_path / "losses.json").read_text())["losses"]
    assert len(losses) == 3 and 6.0 < losses[0] < 7.5  # ~ln(1024): the next-token loss of the rows' second halves
