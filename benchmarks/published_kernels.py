"""Published attention-kernel timings: what fused-attention kernels measured on their own, by sequence length,
on the GPUs of the published training runs. benchmarks.fit fits them beside the training runs (a declared
source like any other, held out like any other), so an attention kernel's level and sequence curve on a GPU
come from timings of that kernel where such timings were published, not only from whole training steps.

Dao-AILab/flash-attention's FlashAttention-2 release (4f285b35, 2023-07-17) added two charts to its README,
'Attention forward + backward speed' on A100 80GB SXM4 (assets/flash2_a100_fwd_bwd_benchmark.png) and on H100
80GB SXM5 (assets/flash2_h100_fwd_bwd_benchmark.png), printing each bar's TFLOP/s. The script that measures
them was committed 11 days later (60499abc, benchmarks/benchmark_flash_attention.py):
- fp16, dropout 0, model width 2048, so heads = 2048 / head dim;
- (batch, sequence) = (32, 512), (16, 1k), (8, 2k), (4, 4k), (2, 8k), (1, 16k): 16k tokens per bar;
- FLOPs = 4 b s^2 h d, halved when causal, times 3.5 for forward + backward (backward 2.5x forward);
- TFLOP/s = those FLOPs / the measured forward + backward seconds. So seconds = FLOPs / printed.

What the bars ran, and the stack partita prices each one with (costmodel.hardware.stacks; a stack names its kernel):
- 'FlashAttention-2': flash-attn 2.0, the CUDA kernel -> flash-2023 (kernel flash2).
- 'FlashAttention': FlashAttention-1, flash-attn < 2.0 -> flash1-2022 (kernel flash1).
- 'FlashAttention Triton' (A100 only): triton.ops.flash_attention, OpenAI Triton's FlashAttention, the
  tutorial kernel that flash-attn's flash_attn_triton (what llm-foundry's tables ran) is based on (its
  docstring says so) -> triton-2023 (kernel flash_triton). Same algorithm and compiler family, a different
  Triton release and copy of it: this pairing is a stated assumption, and the held-out errors test it.
- 'Pytorch' (unfused, scores materialised) and 'xformers' are not priced: partita's fused-attention kernels
  do not include them.
fp16 is priced as bf16: the same tensor-core peak on both GPUs.
"""
from __future__ import annotations

import dataclasses

SOURCE = "flash-attention-kernels"
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
BATCH = {512: 32, 1024: 16, 2048: 8, 4096: 4, 8192: 2, 16384: 1}
WIDTH = 2048
FWD_BWD_OVER_FWD = 3.5
"""benchmark_flash_attention.py's count: the backward does 2.5x the forward's FLOPs."""

_CITE = ("Dao-AILab/flash-attention README @ 4f285b35 (2023-07-17), {}, bars '{}' panel ({}); conventions from "
         "benchmarks/benchmark_flash_attention.py @ 60499abc")
_FILES = {"A100-80GB": "assets/flash2_a100_fwd_bwd_benchmark.png",
          "H100-80GB": "assets/flash2_h100_fwd_bwd_benchmark.png"}
PANELS = {(False, 64): "a", (False, 128): "b", (True, 64): "c", (True, 128): "d"}
"""(causal, head dim) -> the chart's panel letter."""


@dataclasses.dataclass(frozen=True)
class Chart:
    hardware: str
    label: str
    """The bars' legend entry."""
    stack: str
    values: dict
    """(causal, head dim) -> TFLOP/s printed per sequence length (SEQS); None where a label cannot be read."""
    notes: str = ""


@dataclasses.dataclass(frozen=True)
class KernelRow:
    """One bar: a kernel_fit row (costmodel.hardware.kernel_fit's format, `backend` "default": the stack's own kernel)
    with the seconds the printed TFLOP/s imply."""
    chart: Chart
    causal: bool
    head_dim: int
    seq: int
    tflops: float

    source = SOURCE

    @property
    def shape(self) -> list[int]:
        return [BATCH[self.seq], WIDTH // self.head_dim, self.seq, self.head_dim]

    @property
    def seconds(self) -> float:
        b, h, s, d = self.shape
        flops = 4 * b * s * s * h * d / (2 if self.causal else 1)
        return FWD_BWD_OVER_FWD * flops / (self.tflops * 1e12)

    @property
    def row(self) -> dict:
        return {"kind": "sdpa", "backend": "default", "shape": self.shape, "causal": self.causal,
                "fwd_bwd_s": self.seconds}

    @property
    def key(self) -> str:
        return (f"{self.chart.hardware} {self.chart.label} {'causal' if self.causal else 'full'} d{self.head_dim} "
                f"s{self.seq}")

    @property
    def citation(self) -> str:
        return _CITE.format(_FILES[self.chart.hardware], self.chart.label, PANELS[(self.causal, self.head_dim)])


CHARTS = [
    Chart("A100-80GB", "FlashAttention-2", "flash-2023", {
        (False, 64): (132, 153, 162, 171, 175, 176),
        (False, 128): (None, 173, 187, 196, 201, 203),
        (True, 64): (88, 119, 140, 156, 165, 171),
        (True, 128): (99, 133, 155, 173, 182, 189)},
        notes="the legend hides the label of panel (b) at 512 (left out) and partly those of (a) and (b) at 1k "
              "(read as 153 and 173: the bars' heights agree)"),
    Chart("A100-80GB", "FlashAttention", "flash1-2022", {
        (False, 64): (91, 92, 104, 108, 110, 110),
        (False, 128): (76, 72, 76, 80, 82, 83),
        (True, 64): (58, 70, 77, 87, 92, 97),
        (True, 128): (55, 62, 69, 76, 80, 83)}),
    Chart("A100-80GB", "FlashAttention Triton", "triton-2023", {
        (False, 64): (90, 102, 98, 98, 100, 100),
        (False, 128): (78, 85, 90, 93, 95, 95),
        (True, 64): (59, 75, 79, 76, 79, 80),
        (True, 128): (50, 61, 68, 74, 78, 80)}),
    Chart("H100-80GB", "FlashAttention-2", "flash-2023", {
        (False, 64): (215, 254, 274, 288, 294, 296),
        (False, 128): (248, 294, 320, 326, 335, 338),
        (True, 64): (141, 192, 232, 257, 273, 284),
        (True, 128): (163, 221, 265, 294, 308, 328)},
        notes="the legend partly hides panel (b)'s label at 1k (read as 294: the bar's height agrees)"),
    Chart("H100-80GB", "FlashAttention", "flash1-2022", {
        (False, 64): (157, 159, 161, 161, 166, 168),
        (False, 128): (127, 127, 128, 131, 137, 139),
        (True, 64): (104, 123, 136, 138, 149, 156),
        (True, 128): (98, 109, 108, 126, 135, 137)}),
]


def kernel_rows(charts: list[Chart] = CHARTS) -> list[KernelRow]:
    return [KernelRow(c, causal, d, s, v) for c in charts for (causal, d), vals in c.values.items()
            for s, v in zip(SEQS, vals) if v is not None]


KERNEL_ROWS = kernel_rows()
