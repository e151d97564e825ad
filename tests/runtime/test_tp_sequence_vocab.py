"""The "sequence" (Megatron sequence parallelism) and "vocab" (vocabulary-parallel embedding, LM head and
cross-entropy) placements: shardings, layout rule and communication on a fake process group (one process),
pre-flight refusals, and real gloo runs under torchrun that must train exactly like one process (fp32: 1e-5).

The torchrun cases run several plans per launch (a launch costs 5-15 s on 2 cores): this file is also the
job, `python -m torch.distributed.run --nproc-per-node N tests/runtime/test_tp_sequence_vocab.py OUT PLAN...`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from spawned import teardown

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
LINEARS = {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise",
           "mlp.fc1": "colwise", "mlp.fc2": "rowwise"}


def placements(model: str, sequence: bool = False, vocab: bool = False, blocks=(0, 1)) -> dict[str, str]:
    """Megatron TP on both blocks of tiny-gpt / tiny-llama, plus "sequence" on the norms of `blocks` (and
    ln_f) and/or "vocab" on the token embedding and the head."""
    linears = dict(LINEARS, **({"mlp.gate": "colwise"} if model == "tiny-llama" else {}))
    out = {f"blocks.{i}.{name}": style for i in (0, 1) for name, style in linears.items()}
    if sequence:
        out.update({f"blocks.{i}.{ln}": "sequence" for i in blocks for ln in ("ln1", "ln2")})
        out["ln_f"] = "sequence"
    if vocab:
        out.update({"tok_emb": "vocab", "head": "vocab"})
    return out


def plan_dict(model: str = "tiny-gpt", *, sequence=False, vocab=False, pp=1, dp=1, tp=2, zero=0, micro=1,
              recompute=("none", "none"), dtype="fp32", placed: dict | None = None) -> dict:
    """A hand-made plan (partita.plan/1) for the 2-block tiny models; pp=2 puts one block on each stage."""
    top = ["tok_emb"] + (["pos_emb"] if model == "tiny-gpt" else [])
    if pp == 1:
        stages = [{"index": 0, "modules": top + ["blocks", "ln_f", "head"], "split_at": None}]
    else:
        stages = [{"index": 0, "modules": top + ["blocks.0"], "split_at": None},
                  {"index": 1, "modules": ["blocks.1", "ln_f", "head"], "split_at": "blocks.1"}]
    return {"schema": "partita.plan/1", "model": {"name": model}, "cluster": {},
            "train": {"global_batch": 2 * dp * micro, "seq_len": 32, "dtype": dtype},
            "mesh": {"pp": pp, "dp": dp, "tp": tp},
            "schedule": {"name": "1F1B" if pp > 1 else "GPipe", "num_microbatches": micro, "micro_batch_size": 2},
            "stages": stages, "zero_stage": zero,
            "blocks": [{"fqn": f"blocks.{i}", "stage": i if pp > 1 else 0, "sharding": "tensor",
                        "recompute": recompute[i]} for i in (0, 1)],
            "placements": placed if placed is not None else placements(model, sequence, vocab)}


# ---- one process, fake process group ------------------------------------------------------------
def _model_and_plan(name: str, **kw):
    from partita.costmodel import resolve_model
    from partita.planner.plan import Plan
    from partita.runtime.loop.recipe import build_model

    spec = resolve_model(name)
    return spec, build_model(spec, 0), Plan.from_dict(plan_dict(name, **kw))


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_parameters_are_sharded_as_the_styles_say(topo, name):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from partita.runtime.parallel.apply import parallelize

    spec, model, plan = _model_and_plan(name, sequence=True, vocab=True)
    applied = parallelize(model, plan, topo(1, 2))
    assert applied.tp_layers == len(plan.placements)
    p = dict(model.named_parameters())
    assert p["tok_emb.weight"].placements == (Shard(0),) and p["tok_emb.weight"].to_local().shape == (128, 64)
    assert p["head.weight"].placements == (Shard(0),) and p["head.weight"].to_local().shape == (128, 64)
    norms = [n for n in p if n.startswith(("blocks.0.ln", "blocks.1.ln", "ln_f"))]
    assert len(norms) == (5 if name == "tiny-llama" else 10)
    for n in norms:
        assert p[n].placements == (Replicate(),) and p[n].to_local().shape == (64,), n
    assert p["blocks.0.attn.q.weight"].placements == (Shard(0),)
    if name == "tiny-gpt":
        assert not isinstance(p["pos_emb.weight"], DTensor)  # not placed: a plain replicated parameter
    logits = model(torch.zeros(2, spec.seq_len, dtype=torch.long))
    assert isinstance(logits, DTensor) and logits.shape == (2, 32, 256)  # vocab-sharded, for loss_parallel
    assert logits.placements[0].is_shard(2) and logits.to_local().shape == (2, 32, 128)


def _styles(name: str, **kw):
    from partita.runtime.parallel.tp import styles

    _, model, plan = _model_and_plan(name, **kw)
    return styles(plan.placements, model)


def test_layout_rule_hands_sequence_shards_only_to_modules_that_take_them():
    from torch.distributed.tensor import Replicate, Shard

    from partita.runtime.parallel.tp import GatherSequence, SequenceBlock, SequenceNorm, VocabEmbedding

    gpt = _styles("tiny-gpt", sequence=True, vocab=True)
    llama = _styles("tiny-llama", sequence=True, vocab=True)
    # GPT adds a position embedding to the token embedding: all-reduce; Llama's first block takes Shard(1)
    assert isinstance(gpt["tok_emb"], VocabEmbedding) and gpt["tok_emb"].output_layouts == (Replicate(),)
    assert llama["tok_emb"].output_layouts == (Shard(1),) and not llama["tok_emb"].use_local_output
    for s in (gpt, llama):
        assert isinstance(s["blocks.0"], SequenceBlock) and s["blocks.0"].keep and s["blocks.1"].keep
        assert isinstance(s["blocks.0.ln1"], SequenceNorm) and s["blocks.0.ln1"].keep  # to attn's all-gather
        assert s["ln_f"].keep  # the vocab head all-gathers it
        assert s["blocks.1.attn.proj"].output_layouts == (Shard(1),)  # reduce-scatter, not all-reduce
        assert isinstance(s["blocks.0.attn"], GatherSequence) and isinstance(s["blocks.1.mlp"], GatherSequence)
    assert not _styles("tiny-gpt", sequence=True)["ln_f"].keep  # a replicated head gets a whole tensor
    mixed = _styles("tiny-gpt", placed=placements("tiny-gpt", sequence=True, blocks=(0,)))
    assert not mixed["blocks.0"].keep  # blocks.1 is not sequence-parallel: gather
    assert mixed["blocks.1.attn.proj"].output_layouts == (Replicate(),) and "blocks.1" not in mixed
    plain = _styles("tiny-gpt")
    assert plain["blocks.0.attn.proj"].output_layouts == (Replicate(),) and "blocks.0" not in plain


def test_layout_rule_on_pipeline_stages():
    """Outlined copies (InterpreterModules) are recognised as embeddings and norms; a stage's last block
    gathers what it sends on."""
    from partita.costmodel import resolve_model
    from partita.planner.plan import Plan
    from partita.runtime.parallel import pp as pipeline_parallel
    from partita.runtime.loop.recipe import build_model
    from partita.runtime.parallel.tp import SequenceBlock, SequenceNorm, VocabEmbedding, styles

    spec = resolve_model("tiny-llama")
    plan = Plan.from_dict(plan_dict("tiny-llama", sequence=True, vocab=True, pp=2, micro=2))
    pipe = pipeline_parallel.split(build_model(spec, 0), plan, torch.zeros(2, 32, dtype=torch.long))
    first, last = (styles(plan.placements, pipe.get_stage_module(i)) for i in (0, 1))
    assert isinstance(first["tok_emb"], VocabEmbedding) and first["tok_emb"].use_local_output is False
    assert isinstance(first["blocks.0"], SequenceBlock) and not first["blocks.0"].keep  # the stage ends
    assert isinstance(last["blocks.1.ln2"], SequenceNorm) and last["blocks.1"].keep and last["ln_f"].keep
    assert last["head"].use_local_output is False and "tok_emb" not in last


def _counts(mode) -> dict[str, int]:
    return {str(k).rpartition(".")[2]: v for k, v in mode.get_comm_counts().items()}


def test_sequence_and_vocab_parallelism_communicate_like_megatron(topo):
    """tiny-llama, tp=2, both styles. Per block: forward all-gathers the attention and MLP inputs (one
    each, shared by q/k/v and fc1/gate) and reduce-scatters proj and fc2; backward mirrors it; nothing is
    all-reduced but the loss (row max, sum of exponentials, target logit). Plus the embedding's
    reduce-scatter and the head's all-gather."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    from partita.runtime.parallel.apply import parallelize
    from partita.runtime.loop.recipe import lm_loss
    from partita.runtime.parallel.tp import loss_context, settle_grads

    spec, model, plan = _model_and_plan("tiny-llama", sequence=True, vocab=True)
    parallelize(model, plan, topo(1, 2))
    tokens = torch.zeros(2, spec.seq_len, dtype=torch.long)
    with loss_context(True):
        with CommDebugMode() as fwd:
            loss = lm_loss(model(tokens), tokens)
        with CommDebugMode() as bwd:
            loss.backward()
    assert not isinstance(loss, DTensor)
    assert _counts(fwd) == {"all_gather_into_tensor": 5, "reduce_scatter_tensor": 5, "all_reduce": 3}
    assert _counts(bwd) == {"all_gather_into_tensor": 5, "reduce_scatter_tensor": 5}
    assert model.ln_f.weight.grad.placements[0].is_partial()  # each rank's sum over its tokens
    assert model.tok_emb.weight.grad.placements[0].is_replicate()
    with CommDebugMode() as settle:
        settle_grads(list(model.parameters()))
    assert _counts(settle) == {"allreduce_": 1}  # every norm's gradient in one bucket
    for n, p in model.named_parameters():
        assert p.grad.placements == p.placements, n


def test_executor_runs_the_loss_vocab_parallel_and_settles_gradients(topo):
    """The training step itself: loss_parallel around forward and backward (else the logits would be
    all-gathered over the vocabulary), a plain loss, gradients placed as their parameters."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    from partita.runtime.parallel.apply import LocalExecutor
    from partita.runtime.data import SyntheticTokens
    from partita.runtime.loop.recipe import loss_for

    spec, model, plan = _model_and_plan("tiny-llama", sequence=True, vocab=True)
    executor = LocalExecutor(model, plan, topo(1, 2), loss_for(spec))
    with CommDebugMode() as step:
        loss = executor.step(SyntheticTokens(spec, 2, seed=0).batch(0))
    assert not isinstance(loss, DTensor) and loss.shape == ()
    assert _counts(step) == {"all_gather_into_tensor": 10, "reduce_scatter_tensor": 10, "all_reduce": 3,
                             "allreduce_": 1}
    assert all(p.grad.placements == p.placements for p in executor.params)


@pytest.mark.parametrize("placed,msg", [
    ({"blocks.0.attn.q": "sequence"}, r"placements\['blocks.0.attn.q'\] = sequence needs a norm .* found Linear"),
    ({"blocks.0.ln1": "vocab"}, r"placements\['blocks.0.ln1'\] = vocab needs an nn.Embedding or the LM head .* "
                                r"found LayerNorm"),
    ({"blocks.0.mlp.fc1": "vocab"}, r"placements\['blocks.0.mlp.fc1'\] = vocab is for the LM head.* is 'head'"),
    ({"blocks.0.ln1": "sequence", "blocks.0.attn.proj": "rowwise"},
     r"'blocks.0' sequence-parallel .* its norm 'blocks.0.ln2' must be 'sequence' too"),
    ({"blocks.0.ln1": "sequence", "blocks.0.ln2": "sequence"}, r"'blocks.0' sequence-parallel, but no rowwise"),
])
def test_preflight_refuses_bad_placements(placed, msg):
    from partita.costmodel import resolve_model
    from partita.planner.plan import Plan, PlanError
    from partita.runtime.launcher.checks import preflight

    with pytest.raises(PlanError, match=msg) as e:
        preflight(Plan.from_dict(plan_dict(placed=placed)), resolve_model("tiny-gpt"), 2)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("placed,msg", [({"ln_f": "sequence"}, "splits the sequence of 32 over tp=3"),
                                        ({"tok_emb": "vocab"}, "splits the vocabulary of 256 over tp=3")])
def test_preflight_refuses_what_tp_does_not_divide(placed, msg):
    from partita.costmodel import resolve_model
    from partita.planner.plan import Plan, PlanError
    from partita.runtime.launcher.checks import preflight

    with pytest.raises(PlanError, match=msg):
        preflight(Plan.from_dict(plan_dict(placed=placed, tp=3)), resolve_model("tiny-gpt"), 3)


def test_plan_accepts_the_new_styles_only_with_tp():
    from partita.planner.plan import Plan, PlanError

    assert Plan.from_dict(plan_dict(sequence=True, vocab=True)).placements["ln_f"] == "sequence"
    with pytest.raises(PlanError, match="tensor-parallel placements but mesh.tp = 1"):
        Plan.from_dict(plan_dict(placed={"tok_emb": "vocab"}, tp=1))
    with pytest.raises(PlanError, match=r"'seq'; accepted: \['colwise', 'rowwise', 'sequence', 'vocab'\]"):
        Plan.from_dict(plan_dict(placed={"ln_f": "seq"}))


# ---- real gloo process groups under torchrun ---------------------------------------------------
def _launch(tmp_path: Path, ranks: int, plans: dict[str, dict]) -> dict:
    """One torchrun launch of this file running every plan with --verify; {case: summary}."""
    files = []
    for case, plan in plans.items():
        files.append(tmp_path / f"{case}.json")
        files[-1].write_text(json.dumps(plan))
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           __file__, str(out), *map(str, files)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return {Path(k).stem: v for k, v in json.loads(out.read_text()).items()}


def _assert_matches(results: dict, want: set[str]) -> None:
    assert set(results) == want
    for case, r in results.items():
        print(f"{case}: max |loss diff| = {r['max_abs_diff']:.2e} in {r['seconds']:.1f} s ({r['applied']})")
    for case, r in results.items():
        tol = 1e-2 if case.endswith("bf16") else 1e-5  # runtime.verify.checks's tolerances
        assert r["verified"] and len(r["losses"]) == STEPS, (case, r)
        assert r["max_abs_diff"] <= tol, (case, r)
        assert max(abs(a - b) for a, b in zip(r["losses"], r["reference_losses"])) <= tol, (case, r)


def test_tp2_sequence_and_vocab_train_like_one_process(tmp_path):
    """tiny-gpt (learned positions added to the token embedding) and tiny-llama (RoPE), tp=2: "sequence" on
    every norm, "vocab" on the token embedding and head, and both, each beside Megatron colwise/rowwise;
    and both in bf16 (autocast; tolerance 1e-2)."""
    plans = {f"{m.removeprefix('tiny-')}-{what}": plan_dict(m, sequence="seq" in what, vocab="vocab" in what)
             for m in ("tiny-gpt", "tiny-llama") for what in ("seq", "vocab", "seq+vocab")}
    plans["llama-seq+vocab-bf16"] = plan_dict("tiny-llama", sequence=True, vocab=True, dtype="bf16")
    _assert_matches(_launch(tmp_path, 2, plans), set(plans))


def test_sequence_and_vocab_compose_with_zero3_and_pipelining(tmp_path):
    """4 ranks: dp=2 x tp=2 with ZeRO-3 (FSDP2 on the dp axis, 2-D parameter shards) and gradient
    accumulation; pp=2 x tp=2 (1F1B, the stages' outlined embedding, norms and vocab head) with selective
    and full recompute."""
    plans = {"gpt-dp2xtp2-zero3": plan_dict("tiny-gpt", sequence=True, vocab=True, dp=2, zero=3, micro=2),
             "llama-pp2xtp2-recompute": plan_dict("tiny-llama", sequence=True, vocab=True, pp=2, micro=2,
                                                  recompute=("selective", "full"))}
    _assert_matches(_launch(tmp_path, 4, plans), set(plans))


def main(out: str, plans: list[str]) -> None:
    """The torchrun job: run each plan with --verify in this one process group; rank 0 writes summaries."""
    import partita.runtime as runtime
    from partita.runtime.launcher.mesh import init_default

    init_default()
    results = {}
    for path in plans:
        name = json.loads(Path(path).read_text())["model"]["name"]
        t0 = time.perf_counter()
        r = runtime.run(path, name, steps=STEPS, verify=True, print_report=False)
        results[path] = {"verified": r.verified, "max_abs_diff": r.max_abs_diff, "losses": r.losses,
                         "reference_losses": r.reference_losses, "applied": r.applied["summary"],
                         "seconds": time.perf_counter() - t0}
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results, indent=2))
    teardown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
