"""Context parallelism's pieces (runtime/parallel/cp.py, runtime.data.context_positions): the causal load-balanced
chunks and their global positions, the mask, and -- in one 2-process gloo job -- the gathered attention of
partita's GPT / Llama models against the full sequence in one process, forward and gradients. Runs of
whole plans under --verify: tests/e2e/test_cp_runs.py."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from spawned import spawned_json, teardown

from partita.costmodel.models.gpt import GPT, GPTConfig
from partita.runtime.parallel import cp as context_parallel
from partita.runtime.data import context_positions, context_shard
from partita.runtime.loop.recipe import lm_loss


def test_chunks_are_head_and_tail_and_cover_the_sequence_once():
    assert context_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert context_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert context_positions(12, 3, 1).tolist() == [2, 3, 8, 9]
    for seq, cp in ((32, 2), (48, 4), (8, 1)):
        held = torch.cat([context_positions(seq, cp, r) for r in range(cp)])
        assert sorted(held.tolist()) == list(range(seq))
        # causal balance: every rank attends to the same number of (query, key) pairs
        work = {int((context_positions(seq, cp, r) + 1).sum()) for r in range(cp)}
        assert len(work) == 1, work
    with pytest.raises(ValueError, match="not divisible into 2 x cp = 4 chunks"):
        context_positions(10, 2, 0)


def test_shard_keeps_inputs_and_shifted_targets_aligned():
    window = torch.arange(2 * 17).view(2, 17) * 10  # seq 16 + 1 tokens
    inputs, targets = window[:, :-1], window[:, 1:]
    for r in range(2):
        x, y = context_shard((inputs, targets), 2, r)
        pos = context_positions(16, 2, r)
        assert torch.equal(x, window[:, pos]) and torch.equal(y, window[:, pos + 1])
    assert context_shard((inputs, targets), 1, 0)[0] is inputs


def test_mask_is_the_global_causal_mask_and_order_sorts_the_gathered_keys():
    seq, cp = 16, 2
    full = torch.ones(seq, seq, dtype=torch.bool).tril()
    gathered = torch.cat([context_positions(seq, cp, r) for r in range(cp)])
    for r in range(cp):
        ctx = context_parallel.ContextParallel(seq, cp, r, None, torch.device("cpu"))
        assert torch.equal(ctx.allowed, full[ctx.positions])
        assert torch.equal(gathered[ctx.order], torch.arange(seq))
    assert ctx.allowed.sum() < ctx.allowed.numel()  # rank 1 holds early queries that see no late keys


def test_another_sequence_length_reconfigures_positions_and_mask():
    model = SimpleNamespace(positions=None)
    ctx = context_parallel.ContextParallel(16, 2, 1, None, torch.device("cpu"), model)
    assert model.positions.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    x, y = ctx.shard((torch.arange(8)[None], torch.arange(1, 9)[None]))
    assert x.tolist() == [[2, 3, 4, 5]] and y.tolist() == [[3, 4, 5, 6]]
    assert model.positions.tolist() == [2, 3, 4, 5] and ctx.allowed.shape == (4, 8)


def test_default_model_path_is_unchanged():
    """Without the runtime's context the model ignores cp entirely (class attributes None)."""
    for family in ("gpt", "llama"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(layers=1, hidden=32, heads=4, vocab=64, seq=16, family=family))
        assert model.positions is None and model.blocks[0].attn.context is None
        tokens = torch.randint(0, 64, (2, 16))
        model.positions = torch.arange(16)
        same = model(tokens)
        model.positions = None
        assert torch.equal(same, model(tokens))


CONFIGS = {
    "llama-sdpa-gqa": dict(family="llama", kv_heads=2),
    "llama-math-gqa": dict(family="llama", kv_heads=2, attention="math"),
    "gpt-sdpa": dict(family="gpt"),
    "gpt-math": dict(family="gpt", attention="math"),
}
SEQ = 16


def _worker(rank: int, world: int, store_path: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    topo = SimpleNamespace(cp=world, cp_rank=rank, device=torch.device("cpu"), group=lambda dim: dist.group.WORLD)
    results = {}
    for name, kw in CONFIGS.items():
        cfg = GPTConfig(layers=2, hidden=32, heads=4, vocab=64, seq=SEQ, **kw)
        gen = torch.Generator().manual_seed(1)
        window = torch.randint(0, 64, (2, SEQ + 1), generator=gen)
        inputs, targets = window[:, :-1], window[:, 1:]
        torch.manual_seed(0)
        full = GPT(cfg)
        logits = full(inputs)
        lm_loss(logits, targets).backward()
        torch.manual_seed(0)
        model = GPT(cfg)
        ctx = context_parallel.install(model, topo)
        x, y = ctx.shard((inputs, targets))

        def run(variant):
            model.zero_grad(set_to_none=True)
            out = model(x)
            loss = lm_loss(out, y)
            loss.backward()
            total = loss.detach().clone()
            dist.all_reduce(total)
            grads = {}
            for n, p in model.named_parameters():
                g = p.grad.clone()
                dist.all_reduce(g)  # the mean over cp of the ranks' gradients: the gradient sync's average
                grads[n] = g / world
            ref = dict(full.named_parameters())
            res = {"logits": (out - logits[:, ctx.positions]).abs().max().item(),
                   "loss": abs(total.item() / world - lm_loss(logits, targets).item()),
                   "grads": max((grads[n] - ref[n].grad).abs().max().item() for n in grads),
                   "grad_scale": max(ref[n].grad.abs().max().item() for n in grads)}
            results[f"{name}/{variant}"] = res

        run("right")
        allowed, order = ctx.allowed, ctx.order
        ctx.allowed = torch.ones_like(allowed)
        run("no-mask")
        ctx.allowed, ctx.order = allowed, torch.arange(SEQ)
        run("keys-in-rank-order")
        ctx.order, positions = order, model.positions
        model.positions = None
        run("local-positions")
        model.positions = positions
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    teardown()  # every rank's collectives done before any tears down (spawned.teardown)


@pytest.fixture(scope="module")
def gathered_attention() -> dict:
    return spawned_json(_worker)


@pytest.mark.parametrize("name", CONFIGS)
def test_gathered_attention_equals_full_attention(gathered_attention, name):
    r = gathered_attention[f"{name}/right"]
    assert r["logits"] < 1e-5 and r["loss"] < 1e-6, r
    assert r["grads"] < 1e-6 and r["grad_scale"] > 1e-3, r


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("bug", ["no-mask", "keys-in-rank-order", "local-positions"])
def test_each_piece_matters(gathered_attention, name, bug):
    """The mask, the reordering of the gathered keys and the global positions each change the result."""
    r = gathered_attention[f"{name}/{bug}"]
    assert r["logits"] > 1e-4 and r["grads"] > 1e-4, r  # 100x what a right run shows (< 1e-6)
