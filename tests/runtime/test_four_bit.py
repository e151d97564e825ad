"""The 4-bit outer exchange of DiLoCo and streaming DiLoCo (runtime.loop.sync.four_bit, sync option bits 4).

- The code: every element comes back within half its block's step (absmax / 7), a block of zeros exactly, the
  largest magnitude of each block exactly, two codes per byte.
- The exchange, on 3 real gloo ranks (tests/rank_pool.py; vectors of 1, 192, 1000 and 5000 elements: chunks padded
  to whole blocks): every rank ends with the same mean, bit for bit; it is the two-phase algorithm's (each rank's
  chunk quantized, the copies summed in rank order, the sum's mean quantized again), recomputed here in one process;
  and it is within the two roundings of the exact mean.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
import rank_pool  # noqa: E402
from four_bit_job import vector  # noqa: E402

from partita.planner.plan.sync import FOUR_BIT_BLOCK, wire_bits  # noqa: E402
from partita.runtime.loop.sync.four_bit import LEVELS, dequantize, quantize  # noqa: E402

JOB = str(ROOT / "tests" / "runtime" / "four_bit_job.py")
LENGTHS = (1, 3 * FOUR_BIT_BLOCK, 1000, 5000)
RANKS = 3


def test_each_element_comes_back_within_half_a_step_and_zeros_and_extremes_exactly():
    x = torch.randn(16 * FOUR_BIT_BLOCK, generator=torch.Generator().manual_seed(0)) * 3
    x[:FOUR_BIT_BLOCK] = 0.0
    codes, scales = quantize(x)
    assert codes.dtype == torch.uint8 and codes.numel() == x.numel() // 2 and scales.numel() == 16
    back = dequantize(codes, scales)
    step = scales.repeat_interleave(FOUR_BIT_BLOCK)
    assert torch.all((back - x).abs() <= step / 2 * (1 + 1e-6))
    assert torch.equal(back[:FOUR_BIT_BLOCK], x[:FOUR_BIT_BLOCK])
    blocks, got = x.view(-1, FOUR_BIT_BLOCK), back.view(-1, FOUR_BIT_BLOCK)
    at = blocks.abs().argmax(dim=1)
    assert torch.allclose(got.gather(1, at[:, None]), blocks.gather(1, at[:, None]), rtol=1e-6, atol=0)
    # two codes per byte, the first element in the low nibble: 7 steps up is 15, 7 down is 1
    one = torch.zeros(FOUR_BIT_BLOCK)
    one[0], one[1] = 1.0, -1.0
    codes, scales = quantize(one)
    assert codes[0].item() == 15 | (1 << 4) and scales[0].item() == pytest.approx(1 / LEVELS)
    assert wire_bits(4) == 4 + 32 / FOUR_BIT_BLOCK and wire_bits(16) == 16


def _reference(inputs: list[torch.Tensor]) -> torch.Tensor:
    """The two-phase mean, in one process."""
    n, islands = inputs[0].numel(), len(inputs)
    chunk = -(-n // (FOUR_BIT_BLOCK * islands)) * FOUR_BIT_BLOCK
    padded = [torch.cat([x, torch.zeros(chunk * islands - n)]) for x in inputs]
    sent = [dequantize(*quantize(p)).view(islands, chunk) for p in padded]
    means = []
    for j in range(islands):
        total = sent[0][j].clone()
        for k in range(1, islands):
            total += sent[k][j]
        means.append(dequantize(*quantize(total / islands)))
    return torch.cat(means)[:n]


def test_three_ranks_agree_bit_for_bit_on_the_two_phase_mean(tmp_path):
    out = tmp_path / "mean"
    done = rank_pool.shared().run(RANKS, [str(out), *map(str, LENGTHS)], cwd=ROOT, timeout=300, script=JOB)
    assert done.returncode == 0, done.stderr[-3000:]
    got = [torch.load(f"{out}.rank{r}.pt") for r in range(RANKS)]
    for i, n in enumerate(LENGTHS):
        inputs = [vector(r, n) for r in range(RANKS)]
        assert all(torch.equal(g["inputs"][i], inputs[r]) for r, g in enumerate(got))
        means = [g["means"][i] for g in got]
        assert all(torch.equal(m, means[0]) for m in means[1:]), n
        assert torch.equal(means[0], _reference(inputs)), n
        exact = torch.stack(inputs).mean(0)
        # first rounding: each rank's block step / 2, averaged; second: the mean's block step / 2
        first = sum(x.abs().max() for x in inputs) / LEVELS / 2 / RANKS
        second = exact.abs().max() / LEVELS / 2 + first
        assert (means[0] - exact).abs().max() <= first + second + 1e-6, n
        if n >= FOUR_BIT_BLOCK:
            assert not torch.equal(means[0], exact)  # it is quantized
