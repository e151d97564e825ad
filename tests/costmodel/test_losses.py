"""partita.costmodel.models.losses: the fused cross-entropy equals PyTorch's (loss and gradient) and is captured with
the fused kernel's memory: the logits kept, not fp32 copies of them."""
import pytest
import torch
import torch.nn.functional as F

from partita.costmodel.models import losses
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_fused_cross_entropy_equals_pytorch(dtype, tol, monkeypatch):
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 7 * 50)  # several chunks, the last one short
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(23, 50, generator=g)).to(dtype)
    targets = torch.randint(0, 50, (23,), generator=g)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    fused = losses.cross_entropy(a, targets)
    plain = F.cross_entropy(b.float(), targets)
    fused.backward()
    plain.backward()
    assert fused.item() == pytest.approx(plain.item(), rel=1e-6)
    assert a.grad.dtype == dtype
    torch.testing.assert_close(a.grad.float(), b.grad.float(), rtol=tol, atol=tol)


def test_a_fused_loss_keeps_the_logits_not_fp32_copies():
    """Saved activations drop by what PyTorch's loss keeps beyond the logits: its fp32 log-softmax (4 bytes
    per logit) against the bf16 logits themselves (2 bytes), and the loss is one node."""
    base = "gpt:layers=2,hidden=64,heads=4,vocab=4096,seq=32"
    plain, fused = capture(resolve_model(base), "bf16"), capture(resolve_model(base + ",loss=fused"), "bf16")
    logits = 32 * 4096
    saved = (plain.totals()["saved_bytes"] - fused.totals()["saved_bytes"])
    assert saved == pytest.approx(2 * logits, rel=0.05)
    kinds = [d["kind"] for _, d in fused.g.nodes(data=True)]
    assert kinds.count("cross_entropy") == 1 and "log_softmax" not in kinds
    assert plain.totals()["fwd_flops"] == fused.totals()["fwd_flops"]


def test_an_unknown_loss_is_one_line_naming_the_choices():
    from partita.costmodel.errors import PartitaError
    with pytest.raises(PartitaError, match="plain.*fused"):
        resolve_model("gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32,loss=chunked")
