"""Recompute and activation offload really happen (one process, no process group).

The backward pass is watched by a dispatch mode that counts the aten ops actually executed: a forward op
seen during the backward was recomputed. Saved tensors are watched through the saved-tensor hooks.
Every choice must leave the gradients bit-identical to plain training.
"""
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import partita.runtime.parallel.offload  # noqa: F401  (loads the submodule read as runtime.parallel.offload)
from partita import runtime
from partita.costmodel import resolve_model
from partita.costmodel.models.gpt import GPT as GPTModel, GPTConfig
from partita.planner.plan import Plan
from partita.runtime.parallel.blocks import apply_block_choices, blocks_in
from partita.runtime.data import SyntheticTokens
from partita.runtime.loop.memory import SavedActivations
from partita.runtime.loop.recipe import build_model, lm_loss
from partita.runtime.parallel.recompute import SelectivePolicy

GPT = resolve_model("tiny-gpt")
BLOCKS = ("blocks.0", "blocks.1")
FORWARD_OPS = ("addmm", "_scaled_dot_product_flash_attention_for_cpu", "gelu", "native_layer_norm")


def plan_with(**choices) -> Plan:
    """A one-rank plan whose two transformer blocks both take `choices`."""
    return Plan.from_dict({
        "schema": "partita.plan/1", "model": {"name": "tiny-gpt"}, "cluster": {}, "train": {"global_batch": 2},
        "mesh": {"pp": 1, "dp": 1, "tp": 1}, "schedule": {"name": "GPipe", "num_microbatches": 1, "micro_batch_size": 2},
        "stages": [{"index": 0, "modules": ["tok_emb", "pos_emb", "blocks", "ln_f", "head"], "split_at": None}],
        "blocks": [{"fqn": f, "stage": 0, "sharding": "replicate", **choices} for f in BLOCKS]})


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def train_step(hooks_during_forward=None, config: GPTConfig | None = None, **choices):
    """One forward/backward of tiny-gpt (or a GPT of `config`, same size) under the choices:
    (grads, ops run in backward, saved peak bytes)."""
    torch.manual_seed(0)
    model = GPTModel(config) if config else build_model(GPT, 0)
    plan = plan_with(**choices)
    apply_block_choices(model, blocks_in(model, plan))
    inputs, targets = SyntheticTokens(GPT, 2, seed=0).batch(0)
    with SavedActivations(model.parameters()) as saved:
        loss = lm_loss(model(inputs), targets)
    if hooks_during_forward:
        hooks_during_forward()
    torch.manual_seed(1)  # dropout's random numbers in the re-run come from checkpointing, not from here
    with OpCounter() as ops:
        loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, ops.counts, saved.peak


@pytest.fixture(scope="module")
def plain():
    return train_step()


def assert_same_grads(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_plain_backward_reruns_no_forward_op(plain):
    _, ops, _ = plain
    assert all(ops[op] == 0 for op in FORWARD_OPS), ops


def test_full_recompute_reruns_the_whole_forward(plain):
    grads, ops, peak = train_step(recompute="full")
    assert ops["addmm"] >= 10  # q, k, v, proj, fc1 of both blocks again (fc2's output is needed by nothing:
    #                           non-reentrant checkpointing stops the re-run once it has what it needs)
    assert ops["_scaled_dot_product_flash_attention_for_cpu"] == 2
    assert ops["gelu"] == 2 and ops["native_layer_norm"] == 4
    assert peak < plain[2] / 2  # the blocks' activations are no longer held
    assert_same_grads(grads, plain[0])


def test_selective_recompute_keeps_parametric_ops_and_attention_and_reruns_the_rest(plain):
    grads, ops, peak = train_step(recompute="selective")
    assert ops["addmm"] == 0 and ops["native_layer_norm"] == 0  # linear layers and norms: kept
    assert ops["_scaled_dot_product_flash_attention_for_cpu"] == 0  # fused attention: kept
    assert ops["gelu"] == 2 and ops["add"] >= 4  # activations and residual adds: re-run
    assert peak < plain[2] / 2
    assert_same_grads(grads, plain[0])


def test_op_recompute_keeps_every_other_product_and_attention_and_reruns_norms(plain):
    """torchtitan's per-op policy: of q k v proj fc1 fc2 it keeps q, v, fc1 and re-runs k and proj (fc2's
    output is needed by nothing in the backward, so the re-run stops before it)."""
    grads, ops, _ = train_step(recompute="op")  # its bytes: tests/costmodel/test_saved_bytes_by_recompute.py
    assert ops["addmm"] == 4  # k and proj of both blocks
    assert ops["native_layer_norm"] == 4 and ops["gelu"] == 2  # norms too, unlike selective
    assert ops["_scaled_dot_product_flash_attention_for_cpu"] == 0  # fused attention: kept
    assert_same_grads(grads, plain[0])


MATH = GPTConfig(layers=2, hidden=64, heads=4, vocab=256, seq=32, attention="math", dropout=0.1)


def test_selective_recompute_reruns_a_materialised_attention_core_with_the_same_dropout():
    """Explicit attention (q k^T, softmax, dropout, x v): nothing there has parameters, so all of it is
    re-run -- with the forward's dropout masks, or the gradients would differ."""
    plain_grads, plain_ops, _ = train_step(config=MATH)
    grads, ops, _ = train_step(config=MATH, recompute="selective")
    assert ops["addmm"] == 0 and ops["_softmax"] == 2
    assert ops["bmm"] - plain_ops["bmm"] == 4  # q k^T and probs v of both blocks, again
    assert ops["bernoulli_"] - plain_ops["bernoulli_"] == 6  # all three dropouts of both blocks, again
    assert_same_grads(grads, plain_grads)


def test_selective_recompute_reruns_fused_attention_that_draws_dropout():
    """A saved random op would shift the random numbers of every later op in the re-run."""
    q = torch.zeros(1, 2, 4, 8)
    for op in (torch.ops.aten._scaled_dot_product_flash_attention.default,
               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default):
        assert SelectivePolicy().saves(op, (q, q, q, 0.0), {}, None)
        assert not SelectivePolicy().saves(op, (q, q, q, 0.1), {}, None)
        assert not SelectivePolicy().saves(op, (q, q, q), {"dropout_p": 0.1}, None)
    config = GPTConfig(layers=2, hidden=64, heads=4, vocab=256, seq=32, dropout=0.1)  # CPU: SDPA's math path
    plain_grads, _, _ = train_step(config=config)
    grads, _, _ = train_step(config=config, recompute="selective")
    assert_same_grads(grads, plain_grads)


def test_activation_offload_packs_saved_tensors_into_host_copies(plain, monkeypatch):
    real = torch.autograd.graph.save_on_cpu
    packed = []

    class Spy(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pack = self.pack_hook
            self.pack_hook = lambda t: packed.append((t, pack(t))) or packed[-1][1]

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", Spy)
    grads, ops, peak = train_step(offload_activations=True)
    assert len(packed) > 10
    for original, (device, host) in packed:  # on CPU the host tensor is the original itself: nothing to copy
        assert device == original.device and host.device.type == "cpu"
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t, _ in packed
                if not isinstance(t, torch.nn.Parameter) and not isinstance(t._base, torch.nn.Parameter)}
    assert sum(storages.values()) == plain[2] - peak  # what the outer hooks no longer see went to the offload
    assert peak < plain[2] / 2  # what the outer hooks still see: the rest of the model
    assert all(ops[op] == 0 for op in FORWARD_OPS)  # offload alone recomputes nothing
    assert_same_grads(grads, plain[0])


@pytest.mark.parametrize("policy,reruns", [("selective", 0), ("op", 4)])
def test_selective_offload_moves_kept_outputs_to_host_until_recompute(plain, monkeypatch, policy, reruns):
    stashes = []

    class Spy(runtime.parallel.offload.HostStash):
        def __init__(self):
            super().__init__()
            stashes.append(self)

    def after_forward():
        assert len(stashes) == 2  # one per block
        for stash in stashes:
            assert stash.stashed, "nothing was offloaded"
            for dev, host in stash.stashed:
                assert dev.nbytes() == 0 and host.nbytes() > 0 and host.device.type == "cpu"

    monkeypatch.setattr(runtime.parallel.offload, "HostStash", Spy)
    grads, ops, _ = train_step(after_forward, recompute=policy, offload_activations=True)
    assert all(not s.stashed for s in stashes)  # brought back for the recompute
    assert ops["addmm"] == reruns and ops["_scaled_dot_product_flash_attention_for_cpu"] == 0 and ops["gelu"] == 2
    assert_same_grads(grads, plain[0])
