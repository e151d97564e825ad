"""The 4-bit outer exchange of DiLoCo and streaming DiLoCo (sync option `bits` 4).

Douillard et al. 2025 (arXiv:2501.18512, section 2.3) send the outer gradients in 4 bits with no loss of quality.
Neither gloo nor NCCL reduces 4-bit numbers, so the mean goes in two phases, the two halves of a ring all-reduce:

1. each island cuts its flat parameter change into I chunks (I islands), quantizes them
   (`quantize`: blocks of FOUR_BIT_BLOCK elements, each an absmax scale in fp32 and 4-bit integers in -7..7, two
   per byte) and sends chunk j to island j (all_to_all_single, asynchronous);
2. island j dequantizes the I copies of its chunk, adds them in island order in fp32, divides by I, quantizes the
   mean again and all-gathers it, so that every island dequantizes the same mean, bit for bit.

Each phase moves (I - 1) / I of the quantized bytes per island, as each half of a ring all-reduce does: the wire
costs P x planner.plan.sync.wire_bits(4) / 8 bytes where a 16-bit one costs P x 2. The mean carries two
roundings, each at most half a step (scale / 2) of its block.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from partita.planner.plan.sync import FOUR_BIT_BLOCK

LEVELS = 7
"""The largest 4-bit magnitude: values -7..7 (stored + 8, in 1..15), symmetric, so zero is exact."""


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of a flat fp32 tensor whose length is a multiple of FOUR_BIT_BLOCK: the codes two per
    uint8 (the first element in the low nibble), one fp32 scale (the block's absmax / LEVELS) per block."""
    blocks = x.reshape(-1, FOUR_BIT_BLOCK)
    scales = blocks.abs().amax(dim=1) / LEVELS
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = (torch.round(blocks / safe[:, None]).clamp_(-LEVELS, LEVELS) + 8).to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The flat fp32 tensor `quantize` encoded."""
    pairs = codes.reshape(scales.numel(), FOUR_BIT_BLOCK // 2)
    q = torch.stack([pairs & 15, pairs >> 4], dim=-1).reshape(scales.numel(), FOUR_BIT_BLOCK)
    return ((q.to(torch.float32) - 8) * scales[:, None]).reshape(-1)


class FourBitMean:
    """The mean of `wire` (flat fp32) across `group`'s ranks, in 4 bits (module docstring). Phase 1 starts here;
    `wait()` finishes it, runs phase 2 (blocking) and writes the mean into `wire` -- the interface of an
    async all-reduce's work, so the DiLoCo hooks wait on either alike."""

    def __init__(self, wire: torch.Tensor, group):
        self.wire, self.group = wire, group
        self.islands = dist.get_world_size(group)
        n = wire.numel()
        per = FOUR_BIT_BLOCK * self.islands
        self.chunk = -(-n // per) * FOUR_BIT_BLOCK  # elements of each island's chunk, whole blocks
        padded = torch.zeros(self.chunk * self.islands, dtype=torch.float32, device=wire.device)
        padded[:n] = wire
        codes, scales = quantize(padded)
        self.codes, self.scales = torch.empty_like(codes), torch.empty_like(scales)
        self.works = [dist.all_to_all_single(self.codes, codes, group=group, async_op=True),
                      dist.all_to_all_single(self.scales, scales, group=group, async_op=True)]

    def wait(self) -> bool:
        if self.works is None:
            return True
        for work in self.works:
            work.wait()
        self.works = None
        parts = dequantize(self.codes, self.scales).view(self.islands, self.chunk)
        mean = parts[0].clone()
        for k in range(1, self.islands):  # island order, the same on every rank
            mean += parts[k]
        codes, scales = quantize(mean / self.islands)
        all_codes = torch.empty(codes.numel() * self.islands, dtype=codes.dtype, device=codes.device)
        all_scales = torch.empty(scales.numel() * self.islands, dtype=scales.dtype, device=scales.device)
        dist.all_gather_into_tensor(all_codes, codes, group=self.group)
        dist.all_gather_into_tensor(all_scales, scales, group=self.group)
        self.wire.copy_(dequantize(all_codes, all_scales)[:self.wire.numel()])
        self.codes = self.scales = None
        return True
