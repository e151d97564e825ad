"""Whole training steps partita ran on a lent GPU, as measurements in their exact configuration (data only,
under the conventions of benchmarks.published_data, whose ROWS end with these).

shared/GPU-MEASUREMENTS.md, 'Whole training steps: predicted vs measured' (2026-11-26; transcribed in
benchmarks/results/gpu_shared_2026-11-26.json): one NVIDIA H200 (143,771 MiB, 700 W), torch 2.11.0+cu130,
NCCL, one rank, `partita run PLAN --model M1 --steps 6` on plans made at commit 9dda210; the step time is
the mean of steps 2-6, the memory torch.cuda.max_memory_allocated. M1 =
`llama:layers=16,hidden=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256,seq=4096`, bf16 autocast over fp32
master weights, Adam, global batch 8, synthetic tokens. The runs that ran out of memory have no step time
and are not rows (the planner's own choice ran with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, the
default since; its default-allocator run failed; llama3-8b failed).

These are the whole-step data of today's PyTorch on Hopper: benchmarks.fit fits the `step_efficiency` of
hopper/pytorch (kernels inside a step against kernels timed alone) to them, and their held-out error is
what that stack's plans are worth without them.
"""
from __future__ import annotations

from benchmarks.published_data import FULL, ITERATION, NONE, ROWS, Model, Row, Table

GPU_H200 = Table(
    stack="pytorch", source="gpu-h200-2026",
    citation="shared/GPU-MEASUREMENTS.md 'Whole training steps: predicted vs measured' (2026-11-26), "
             "shared/gpu/check.sh; benchmarks/results/gpu_shared_2026-11-26.json",
    metric=ITERATION, framework="partita run (torch 2.11.0+cu130, eager bf16 autocast, one rank)", autocast=True,
    notes="plans made at commit 9dda210 and run unchanged; step time the mean of steps 2-6")
GPU_H200_COMPILED = Table(
    stack="pytorch", source="gpu-h200-2026", citation=GPU_H200.citation, metric=ITERATION, kernels="compiled",
    autocast=True,
    framework="partita run --kernels compiled plan (torch.compile per block, torch 2.11.0+cu130)",
    notes="compile time (~9 s) falls in step 1, outside the mean of steps 2-6")
M1 = Model(name="m1-1.5b", family="llama", layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256)
_ALLOCATED = "torch.cuda.max_memory_allocated (allocated tensors, not the allocator's cache)"
_M1 = dict(model=M1, seq=4096, hardware="H200-141GB", gpus=1, dp=1, zero=(0,), sharding="one rank",
           global_batch=8, memory_reading=_ALLOCATED)

GPU_ROWS = [
    Row(table=GPU_H200, **_M1, micro_batch=8, recompute=NONE, value=0.709, memory_gib=129.78,
        variant="no-recompute", notes="the planner's own choice at 9dda210 (1 micro-batch of 8, no recompute), "
                                      "run with expandable_segments:True"),
    Row(table=GPU_H200, **_M1, micro_batch=2, recompute=NONE, value=0.770, memory_gib=52.36, variant="mb2",
        notes="--micro-batch 2 (4 micro-batches)"),
    Row(table=GPU_H200, **_M1, micro_batch=8, recompute=FULL, value=0.885, memory_gib=68.89, variant="full",
        notes="--recompute full"),
    Row(table=GPU_H200_COMPILED, **_M1, micro_batch=8, recompute=NONE, value=0.570, memory_gib=105.77,
        variant="compiled", notes="--kernels compiled (the planner chose no recompute, 1 micro-batch of 8)"),
]

FITTED_CASES = {"m1-auto": "no-recompute", "m1-no-recompute": "no-recompute", "m1-micro-batch-2": "mb2",
                "m1-full-recompute": "full", "m1-compiled": "compiled"}
"""The cases of benchmarks.gpu_plans whose configuration is a row above (by variant): their measurements on a
GPU are in-sample for the fit; every other case's are not."""

ROWS.extend(GPU_ROWS)
