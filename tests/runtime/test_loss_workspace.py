"""The loss's backward holds what planner.estimate.phases.loss_gradient_bytes charges, measured on the CPU allocator:
PyTorch's cross-entropy on fp32 logits two logit-sized tensors, torch's loss_parallel on vocabulary-sharded
logits three shards (its gradient is one expression, (zeros_like(x) + exp(x)) * grad)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

from partita.planner.estimate.phases import loss_gradient_bytes
from partita.runtime.loop.memory import AllocatorTrace

TOKENS, VOCAB = 512, 1024
SMALL = 64 * 1024
"""Bytes of the per-token tensors beside the logit-sized ones (targets, masks, the loss: 1.6% of a shard)."""


def backward_peak(loss: torch.Tensor) -> int:
    """The most bytes the backward allocates live at once (blocks it frees are not counted after)."""
    with AllocatorTrace() as trace:
        loss.backward()
    return trace.peak_bytes


def test_plain_cross_entropy_backward_holds_two_logit_sized_tensors():
    logits = torch.randn(TOKENS, VOCAB, requires_grad=True)
    target = torch.randint(0, VOCAB, (TOKENS,))
    loss = F.cross_entropy(logits.float() * 1.0, target)
    held = backward_peak(loss)
    expected = loss_gradient_bytes(logits.nbytes, vocab_split=False)
    assert expected <= held <= expected + SMALL


def test_loss_parallel_backward_holds_three_shards():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        logits = distribute_tensor(torch.randn(TOKENS, VOCAB), mesh, [Shard(1)]).requires_grad_()
        target = distribute_tensor(torch.randint(0, VOCAB, (TOKENS,)), mesh, [torch.distributed.tensor.Replicate()])
        with loss_parallel():
            loss = F.cross_entropy(logits * 1.0, target)
            held = backward_peak(loss)
        shard = TOKENS * VOCAB * 4
        expected = loss_gradient_bytes(shard, vocab_split=True)
        assert expected <= held <= expected + SMALL
    finally:
        dist.destroy_process_group()
