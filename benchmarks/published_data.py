"""Published LLM-training measurements, each in its exact published configuration (data only).

One `Row` per measurement; `Table` holds what a whole published table shares (its source and citation,
the metric, the precision, the framework); `Model` the architecture. `benchmarks.published` prices every
row under partita's cost model. No logic here, and nothing tuned: a value is what the source printed.

Conventions:
- `zero`, `recompute`: the ZeRO stages / recompute policies the published run used -- one value when the
  source states it; several when it does not (the search picks among them, and the row's notes say so).
  FSDP FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2; HYBRID_SHARD (HSDP) has no partita equivalent and is
  priced as ZeRO-3 over all ranks (noted per row).
- `micro_batch` / `virtual_stages` / `sequence_parallel` None: not published, chosen by the search (noted).
- `schedule`: "1F1B", "Interleaved1F1B", or "auto" when the source does not say (the search picks).
- attention "sdpa": fused / flash kernels (scores never stored); "math": Megatron-LM's 2021-22 attention
  with the s x s scores, softmax and dropout materialised.
- 16-bit precision: fp16 and bf16 have the same tensor-core peak and bytes, so fp16 rows are priced as
  bf16 (noted). FP8 rows are skipped (`SKIPPED`).

Metrics (`Table.metric`), exactly as published:
  tokens_per_s_per_gpu     global batch x sequence / step time / GPUs
  model_tflops_per_gpu     model FLOPs (no recomputation counted) / step time / GPUs
  hardware_tflops_per_gpu  FLOPs with the full-recompute forward counted (Megatron's 96 B s l h^2 (...)
                           formula, REFERENCE.md) / step time / GPUs
  iteration_s              seconds per optimizer step
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from benchmarks.stack_rule import RunFacts

TOKENS = "tokens_per_s_per_gpu"
MODEL_TFLOPS = "model_tflops_per_gpu"
HARDWARE_TFLOPS = "hardware_tflops_per_gpu"
ITERATION = "iteration_s"
METRICS = (TOKENS, MODEL_TFLOPS, HARDWARE_TFLOPS, ITERATION)

NONE, SELECTIVE, OP, FULL = ("none",), ("selective",), ("op",), ("full",)
UNSTATED_RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True, slots=True)
class Model:
    """A decoder's dimensions, as the source gives them."""

    name: str
    family: str
    """"gpt" (LayerNorm, GELU, learned positions, biases) or "llama" (RMSNorm, SwiGLU, RoPE, GQA)."""
    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int = 0
    """MLP inner size; 0: 4 x hidden."""
    kv_heads: int = 0
    """0: heads (multi-head attention)."""
    attention: str = "sdpa"
    dropout: float = 0.0
    loss: str = "plain"
    """"fused": a fused cross-entropy kernel (keeps the logits, no fp32 copies); costmodel.models.losses."""
    notes: str = ""
    """Where the published architecture differs from the partita family it is priced as."""
    string: str = ""
    """A MODEL string used as given (with `,seq=N` appended) for an architecture the gpt/llama families
    cannot express, e.g. `hf:qwen3_moe:...` (built from its transformers config, never downloaded); "": the
    family string from the fields above."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Table:
    """One published table (or one statement of a paper/log): what its rows share."""

    source: str
    """Short name of the independent source (one publication or repository)."""
    citation: str
    """Repository + path + commit, or paper + table/section."""
    metric: str
    precision: str = "bf16"
    framework: str = ""
    stack: str
    """The software stack the run used (costmodel.hardware.stacks.STACKS): which kernels ran, and the kernel constants
    (fitted per GPU generation and stack by benchmarks.fit) it is priced with."""
    kernels: str = "eager"
    """How the run executed its operators: "eager", or "compiled" (torch.compile; costmodel.price.fusion)."""
    autocast: bool = False
    """The run computed bf16 under torch.autocast over fp32 parameters, as partita's runtime does (its own
    runs); False: a bf16 model (Megatron-LM) or an FSDP policy's bf16 parameters."""
    fp32_grads: bool = False
    """The run kept its bf16 model's gradients in an fp32 buffer (Megatron-LM's default in bf16, costmodel.price.memory):
    priced with TrainConfig.fp32_grads; False: in the parameters' dtype, or not stated."""
    notes: str = ""
    run: RunFacts | None = None
    """What the run used (benchmarks.stack_rule): where given, `stack` is the one the written rule assigns to
    these facts (tests check it); every source entered through the first-contact ledger states them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One published measurement and the configuration it was measured in."""

    table: Table
    model: Model
    seq: int
    hardware: str
    """partita.costmodel.hardware preset the GPU is priced as: A100-40GB, A100-80GB, H100-80GB."""
    device_overrides: tuple[tuple[str, float], ...] = ()
    """(Device field, value) pairs the source publishes for its GPU where they differ from the preset
    (e.g. a 96 GB H100 variant); empty: the preset as it is."""
    gpus: int
    tp: int = 1
    pp: int = 1
    dp: int
    cp: int = 1
    """Context-parallel ranks per sequence (each sequence split over them)."""
    ep: int = 1
    """Expert-parallel ranks (a MoE layer's experts sharded over them, among the dp ranks)."""
    virtual_stages: int | None = 1
    """Model chunks per device (1: no interleaving); None: not published."""
    zero: tuple[int, ...]
    sharding: str = ""
    """The framework's own name for the data-parallel sharding (FULL_SHARD, HSDP, ZeRO-1, ...)."""
    micro_batch: int | None
    global_batch: int
    recompute: tuple[str, ...]
    full_recompute_layers: int | None = None
    """How many layers recompute in full, the rest taking the other policies of `recompute` (None: the
    source does not say, or every layer takes the one policy given)."""
    sequence_parallel: bool | None = False
    """None: the source does not say; the search chooses."""
    master_weights: str = "fp32"
    """Where the optimizer keeps the weights (TrainConfig.master_weights): an fp32 master copy beside 16-bit
    parameters, or "none" (pure bf16: the model cast to bf16, its optimizer's states in bf16)."""
    schedule: str = "1F1B"
    stage_layers: tuple[int, ...] | None = None
    """The repeated layers each pipeline stage held, first stage first, where the source fixes the split
    (SearchSpace.stage_layers); None: the search splits the layers."""
    tp_comm_overlap: bool | None = None
    """Whether the run overlapped tensor-parallel collectives with GEMMs (Megatron-Core --tp-comm-overlap,
    torch async TP); None: not stated (the search chooses where the stack allows it)."""
    value: float
    """The measurement, in `table.metric` units."""
    memory_gib: float | None = None
    """Peak device memory the source publishes for the run, GiB (None: not published)."""
    memory_reading: str = ""
    """What that figure reads, e.g. the caching allocator's peak reserved bytes (allocated plus its cache)."""
    memory_kind: str = "allocated"
    """Which of partita's predictions that figure is set against (benchmarks.published.MEMORY_KINDS): "allocated" (the
    peak of allocated bytes, torch.cuda.max_memory_allocated), "reserved" (allocated plus the caching allocator's
    predicted cache, torch.cuda's peak reserved bytes: planner.estimate.terms.stage_terms) or "device" (reserved plus
    the device's reserve for the CUDA context and NCCL: nvidia-smi's used memory)."""
    notes: str = ""
    variant: str = ""
    """Which of a table's configurations of the same run this row is, where it lists more than one (e.g.
    Korthikanti's "full" and "sp-selective"): part of the row's key, which must be unique."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Skipped:
    """A published measurement not priced, and why."""

    source: str
    what: str
    reason: str


# ---------------------------------------------------------------------------------------------------
# Megatron-LM, Narayanan et al. SC'21, Table 1 (REFERENCE.md). Selene, A100-80GB (8 HDR HCAs per node),
# seq 2048, vocab 51200, interleaved 1F1B, full activation recomputation, fp16, no ZeRO, no SP.
MEGATRON_T1 = Table(
    stack="megatron-2021",
    source="megatron-sc21",
    citation="Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using "
             "Megatron-LM, SC'21, Table 1 (REFERENCE.md)",
    metric=HARDWARE_TFLOPS, precision="fp16 (priced as bf16)", framework="Megatron-LM (2021)",
    notes="micro-batch and virtual stages per device not published: chosen by the search; TFLOP/s count "
          "the recomputed forward (hardware FLOPs)")


M_1_7B = Model(name="megatron-1.7b", family="gpt", layers=24, hidden=2304, heads=24, vocab=51200, attention="math", dropout=0.1)
M_3_6B = Model(name="megatron-3.6b", family="gpt", layers=30, hidden=3072, heads=32, vocab=51200, attention="math", dropout=0.1)
M_7_5B = Model(name="megatron-7.5b", family="gpt", layers=36, hidden=4096, heads=32, vocab=51200, attention="math", dropout=0.1)
M_18B = Model(name="megatron-18b", family="gpt", layers=40, hidden=6144, heads=48, vocab=51200, attention="math", dropout=0.1)
M_39B = Model(name="megatron-39b", family="gpt", layers=48, hidden=8192, heads=64, vocab=51200, attention="math", dropout=0.1)
M_76B = Model(name="megatron-76b", family="gpt", layers=60, hidden=10240, heads=80, vocab=51200, attention="math", dropout=0.1)
M_146B = Model(name="megatron-146b", family="gpt", layers=80, hidden=12288, heads=96, vocab=51200, attention="math", dropout=0.1)
M_310B = Model(name="megatron-310b", family="gpt", layers=96, hidden=16384, heads=128, vocab=51200, attention="math", dropout=0.1)
M_530B = Model(name="megatron-530b", family="gpt", layers=105, hidden=20480, heads=128, vocab=51200, attention="math", dropout=0.1)
M_1T = Model(name="megatron-1t", family="gpt", layers=128, hidden=25600, heads=160, vocab=51200, attention="math", dropout=0.1)

_T1 = dict(table=MEGATRON_T1, seq=2048, hardware="A100-80GB", zero=(0,), sharding="none (data-parallel all-reduce)",
           micro_batch=None, recompute=FULL)
MEGATRON_T1_ROWS = [
    Row(**_T1, model=M_1_7B, gpus=32, tp=1, pp=1, dp=32, global_batch=512, value=137),
    Row(**_T1, model=M_3_6B, gpus=64, tp=2, pp=1, dp=32, global_batch=512, value=138),
    Row(**_T1, model=M_7_5B, gpus=128, tp=4, pp=1, dp=32, global_batch=512, value=142),
    Row(**_T1, model=M_18B, gpus=256, tp=8, pp=1, dp=32, global_batch=1024, value=135),
    Row(**_T1, model=M_39B, gpus=512, tp=8, pp=2, dp=32, global_batch=1536, value=138, schedule="Interleaved1F1B",
        virtual_stages=None),
    Row(**_T1, model=M_76B, gpus=1024, tp=8, pp=4, dp=32, global_batch=1792, value=140, schedule="Interleaved1F1B",
        virtual_stages=None),
    Row(**_T1, model=M_146B, gpus=1536, tp=8, pp=8, dp=24, global_batch=2304, value=148, schedule="Interleaved1F1B",
        virtual_stages=None),
    Row(**_T1, model=M_310B, gpus=1920, tp=8, pp=16, dp=15, global_batch=2160, value=155, schedule="Interleaved1F1B",
        virtual_stages=None),
    Row(**_T1, model=M_530B, gpus=2520, tp=8, pp=35, dp=9, global_batch=2520, value=163, schedule="Interleaved1F1B",
        virtual_stages=None),
    Row(**_T1, model=M_1T, gpus=3072, tp=8, pp=64, dp=6, global_batch=3072, value=163, schedule="Interleaved1F1B",
        virtual_stages=None),
]

# ---------------------------------------------------------------------------------------------------
# Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models (2022), Table 5
# (REFERENCE.md): end-to-end iteration time, Selene A100-80GB, seq 2048, vocab 51200, no data
# parallelism; "full recompute" (TP, no SP) against "SP + selective recompute".
KORTHIKANTI_T5 = Table(
    stack="megatron-2021",
    source="korthikanti-2022",
    citation="Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models, 2022, "
             "Table 5 (REFERENCE.md)",
    metric=ITERATION, precision="16-bit mixed precision (priced as bf16)", framework="Megatron-LM (2022)",
    notes="pipeline schedule (plain or interleaved 1F1B) not stated in the table: the search picks it")
K_22B = Model(name="gpt-22b", family="gpt", layers=48, hidden=6144, heads=64, vocab=51200, attention="math", dropout=0.1)
K_175B = Model(name="gpt-175b", family="gpt", layers=96, hidden=12288, heads=96, vocab=51200, attention="math", dropout=0.1)
K_530B = Model(name="gpt-530b", family="gpt", layers=105, hidden=20480, heads=128, vocab=51200, attention="math", dropout=0.1)
K_1T = Model(name="gpt-1t", family="gpt", layers=128, hidden=25600, heads=160, vocab=51200, attention="math", dropout=0.1)

_T5 = dict(table=KORTHIKANTI_T5, seq=2048, hardware="A100-80GB", zero=(0,), sharding="none (dp = 1)")
_FULL = dict(recompute=FULL, sequence_parallel=False, variant="full")
_SPSEL = dict(recompute=SELECTIVE, sequence_parallel=True, variant="sp-selective")
KORTHIKANTI_T5_ROWS = [
    Row(**_T5, **_FULL, model=K_22B, gpus=8, tp=8, pp=1, dp=1, global_batch=4, micro_batch=4, value=1.42),
    Row(**_T5, **_SPSEL, model=K_22B, gpus=8, tp=8, pp=1, dp=1, global_batch=4, micro_batch=4, value=1.10),
    Row(**_T5, **_FULL, model=K_175B, gpus=64, tp=8, pp=8, dp=1, global_batch=64, micro_batch=1, value=18.13,
        schedule="auto", virtual_stages=None),
    Row(**_T5, **_SPSEL, model=K_175B, gpus=64, tp=8, pp=8, dp=1, global_batch=64, micro_batch=1, value=13.75,
        schedule="auto", virtual_stages=None),
    Row(**_T5, **_FULL, model=K_530B, gpus=280, tp=8, pp=35, dp=1, global_batch=280, micro_batch=1, value=49.05,
        schedule="auto", virtual_stages=None),
    Row(**_T5, **_SPSEL, model=K_530B, gpus=280, tp=8, pp=35, dp=1, global_batch=280, micro_batch=1, value=37.83,
        schedule="auto", virtual_stages=None),
    Row(**_T5, **_FULL, model=K_1T, gpus=512, tp=8, pp=64, dp=1, global_batch=512, micro_batch=1, value=94.42,
        schedule="auto", virtual_stages=None),
    Row(**_T5, **_SPSEL, model=K_1T, gpus=512, tp=8, pp=64, dp=1, global_batch=512, micro_batch=1, value=71.49,
        schedule="auto", virtual_stages=None),
]

# ---------------------------------------------------------------------------------------------------
# MosaicML llm-foundry, scripts/train/benchmarking/README.md (file at commit 495218376, 2024-04-22;
# tables added in 300cc5c58 (A100, 2023-05-03, before torch 2.0 per the README's TODO), b2a43a147 (H100,
# 2023-10-19, setup.py torch >=1.13.1,<2.1.1) and 5e85bd62d (H100 >= 128 GPUs, 2024-01-06, torch 2.1)).
# MPT models of scripts/train/yamls/pretrain/mpt-*.yaml: d_model, n_heads, n_layers, expansion_ratio 4,
# vocab 50368, flash/triton attention; Composer FSDP, every GPU one data-parallel shard (no TP/PP);
# "Activation Checkpointing True" wraps every block (full recompute); global = micro x accum x GPUs.
# The FP8 table is skipped (SKIPPED).
_LLMF = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md @ 495218376 (2024-04-22), table "
         "'{}', column Throughput (T/s/GPU)")
# The A100 and H100 (< 128 GPUs) benchmarks ran `attn_impl: triton`: submit_benchmarks.py's --attn_impl
# defaults to 'triton' at all three table commits and their sweep.sh never passes it (it became 'flash' in
# 7f0fdae66, 2024-03-26, after them). That is FlashAttention written in Triton -- flash-attn 1.0.3's
# flash_attn_triton on the A100 tables, llmfoundry/models/layers/flash_attn_triton.py on triton-pre-mlir on the
# H100 one -- not the CUDA FlashAttention-2 of the flash-2023 stack: these tables run costmodel.hardware.stacks'
# "triton-2023". The large-scale H100 table was made by the sweep.py its commit adds (5e85bd62d: 128/256/512
# H100s, each model's micro-batch, sharding and checkpointing as the table prints them; its MP mode flag is
# not passed on by submit_benchmarks.py, so DEFAULT, as printed): it passes `--attn_impl flash` (flash-attn
# 2.4.2, the commit's pip_install '.[gpu-flash2]') for 1b, 3b, 7b and 70b, and `--attn_impl triton` for 13b
# and 30b. Its rows are split by that flag into a flash-2023 and a triton-2023 table. ALiBi is off
# and positions are learned: the README's NumParams grows by d_model per extra position (mpt-30b:
# 30019254272 at 8192 tokens, 29989894144 at 4096).
_LLMF_NOTES = ("MPT priced as the gpt family (learned positions, as benchmarked: the yamls leave ALiBi off); MPT "
               "has no biases, tied embeddings, low-precision LayerNorm and Triton flash attention; partita's "
               "gpt has biases and an untied head (the head's FLOPs are the same)")
LLMF_H100_LARGE = Table(stack="triton-2023", source="llm-foundry", citation=_LLMF.format("H100 80GB BF16 (Large Scale, >= 128 GPUs)"),
                        metric=TOKENS, framework="Composer FSDP, torch 2.1", notes=_LLMF_NOTES)
LLMF_H100_LARGE_FLASH = Table(
    stack="flash-2023", source="llm-foundry",
    citation=_LLMF.format("H100 80GB BF16 (Large Scale, >= 128 GPUs)") + "; attn_impl from scripts/train/benchmarking/"
    "sweep.py @ 5e85bd62d", metric=TOKENS, framework="Composer FSDP, torch 2.1, flash-attn 2.4.2",
    notes=_LLMF_NOTES.replace("Triton flash attention", "FlashAttention-2 (sweep.py's --attn_impl flash)"))
LLMF_H100 = Table(stack="triton-2023", source="llm-foundry", citation=_LLMF.format("H100 80GB BF16"), metric=TOKENS,
                  framework="Composer FSDP, torch < 2.1.1", notes=_LLMF_NOTES)
LLMF_A100_80 = Table(stack="triton-2023", source="llm-foundry", citation=_LLMF.format("A100 80GB with 1600 Gbps node-node interconnect (RoCE)"),
                     metric=TOKENS, framework="Composer FSDP, torch 1.13", notes=_LLMF_NOTES)
LLMF_A100_40 = Table(stack="triton-2023", source="llm-foundry", citation=_LLMF.format("A100 40GB with 1600 Gbps node-node interconnect (RoCE)"),
                     metric=TOKENS, framework="Composer FSDP, torch 1.13", notes=_LLMF_NOTES)
MP_DEFAULT = "Composer MP mode DEFAULT: bf16 parameters, fp32 gradient reduce-scatter (as partita prices it)"
MP_PURE = "Composer MP mode PURE: bf16 parameters, gradients and buffers (partita prices an fp32 reduce-scatter)"

# llm-foundry's ComposerMPTCausalLM takes `loss_fn: fused_crossentropy` unless told otherwise
# (llmfoundry/models/mpt/modeling_mpt.py: flash-attn's xentropy CrossEntropyLoss): loss="fused".
MPT_125M = Model(name="mpt-125m", family="gpt", layers=12, hidden=768, heads=12, vocab=50368, loss="fused")
MPT_350M = Model(name="mpt-350m", family="gpt", layers=24, hidden=1024, heads=16, vocab=50368, loss="fused")
MPT_760M = Model(name="mpt-760m", family="gpt", layers=24, hidden=1536, heads=12, vocab=50368, loss="fused")
MPT_1B = Model(name="mpt-1b", family="gpt", layers=24, hidden=2048, heads=16, vocab=50368, loss="fused")
MPT_3B = Model(name="mpt-3b", family="gpt", layers=32, hidden=2560, heads=20, vocab=50368, loss="fused")
MPT_7B = Model(name="mpt-7b", family="gpt", layers=32, hidden=4096, heads=32, vocab=50368, loss="fused")
MPT_13B = Model(name="mpt-13b", family="gpt", layers=40, hidden=5120, heads=40, vocab=50368, loss="fused")
MPT_30B = Model(name="mpt-30b", family="gpt", layers=48, hidden=7168, heads=56, vocab=50368, loss="fused")
MPT_70B = Model(name="mpt-70b", family="gpt", layers=80, hidden=8192, heads=64, vocab=50368, loss="fused")

LLMF_ROWS = [
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_70B, seq=2048, hardware="H100-80GB", gpus=512, dp=512, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=4096, recompute=FULL, value=1007, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_70B, seq=2048, hardware="H100-80GB", gpus=256, dp=256, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=2048, recompute=FULL, value=1035, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_70B, seq=2048, hardware="H100-80GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=1024, recompute=FULL, value=1058, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE, model=MPT_30B, seq=2048, hardware="H100-80GB", gpus=512, dp=512, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=4096, recompute=FULL, value=2115, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE, model=MPT_30B, seq=2048, hardware="H100-80GB", gpus=256, dp=256, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=2048, recompute=FULL, value=2148, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE, model=MPT_30B, seq=2048, hardware="H100-80GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=1024, recompute=FULL, value=2199, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE, model=MPT_13B, seq=2048, hardware="H100-80GB", gpus=512, dp=512, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=8192, recompute=FULL, value=4952, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE, model=MPT_13B, seq=2048, hardware="H100-80GB", gpus=256, dp=256, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=4096, recompute=FULL, value=4989, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE, model=MPT_13B, seq=2048, hardware="H100-80GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=2048, recompute=FULL, value=5080, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_7B, seq=2048, hardware="H100-80GB", gpus=512, dp=512, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=3072, recompute=NONE, value=9670, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_7B, seq=2048, hardware="H100-80GB", gpus=256, dp=256, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=1536, recompute=NONE, value=10119, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_7B, seq=2048, hardware="H100-80GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=768, recompute=NONE, value=10475, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_3B, seq=2048, hardware="H100-80GB", gpus=512, dp=512, zero=(2,), sharding="SHARD_GRAD_OP", micro_batch=8, global_batch=4096, recompute=NONE, value=21664, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_3B, seq=2048, hardware="H100-80GB", gpus=256, dp=256, zero=(2,), sharding="SHARD_GRAD_OP", micro_batch=8, global_batch=2048, recompute=NONE, value=22772, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_3B, seq=2048, hardware="H100-80GB", gpus=128, dp=128, zero=(2,), sharding="SHARD_GRAD_OP", micro_batch=8, global_batch=1024, recompute=NONE, value=23422, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_1B, seq=2048, hardware="H100-80GB", gpus=512, dp=512, zero=(2,), sharding="SHARD_GRAD_OP", micro_batch=12, global_batch=6144, recompute=NONE, value=39837, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_1B, seq=2048, hardware="H100-80GB", gpus=256, dp=256, zero=(2,), sharding="SHARD_GRAD_OP", micro_batch=12, global_batch=3072, recompute=NONE, value=42555, notes=MP_DEFAULT),
    Row(table=LLMF_H100_LARGE_FLASH, model=MPT_1B, seq=2048, hardware="H100-80GB", gpus=128, dp=128, zero=(2,), sharding="SHARD_GRAD_OP", micro_batch=12, global_batch=1536, recompute=NONE, value=44123, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_70B, seq=2048, hardware="H100-80GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=2048, recompute=FULL, value=1039, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_70B, seq=2048, hardware="H100-80GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=1024, recompute=FULL, value=882, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_30B, seq=8192, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=168, recompute=FULL, value=1384, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_30B, seq=4096, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=168, recompute=FULL, value=1802, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_30B, seq=2048, hardware="H100-80GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=14, global_batch=1344, recompute=FULL, value=2308, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_30B, seq=2048, hardware="H100-80GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=480, recompute=FULL, value=2263, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_30B, seq=2048, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=504, recompute=FULL, value=2002, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_30B, seq=1024, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=1008, recompute=FULL, value=2084, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_13B, seq=32768, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=24, recompute=FULL, value=1976, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_13B, seq=16384, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=72, recompute=FULL, value=2985, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_13B, seq=4096, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=240, recompute=FULL, value=4717, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_13B, seq=2048, hardware="H100-80GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=128, recompute=NONE, value=4800, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_13B, seq=2048, hardware="H100-80GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=64, recompute=NONE, value=4811, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_13B, seq=2048, hardware="H100-80GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=32, recompute=NONE, value=4767, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_13B, seq=2048, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=16, recompute=NONE, value=4792, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_13B, seq=1024, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=40, global_batch=960, recompute=FULL, value=5502, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_7B, seq=65536, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=FULL, value=1956, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_7B, seq=32768, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=32, recompute=FULL, value=3318, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_7B, seq=8192, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=128, recompute=FULL, value=6935, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_7B, seq=4096, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=256, recompute=FULL, value=8611, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_7B, seq=2048, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=48, recompute=NONE, value=10643, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_7B, seq=1024, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=64, global_batch=1024, recompute=FULL, value=10203, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=65536, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=FULL, value=3262, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=32768, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=144, recompute=FULL, value=5873, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=16384, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=48, recompute=NONE, value=11152, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=8192, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=144, recompute=NONE, value=16578, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=4096, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=5, global_batch=240, recompute=NONE, value=20964, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=2048, hardware="H100-80GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=1152, recompute=NONE, value=22525, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=2048, hardware="H100-80GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=576, recompute=NONE, value=23021, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=2048, hardware="H100-80GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=480, recompute=NONE, value=24142, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=1024, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=20, global_batch=960, recompute=NONE, value=27046, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_3B, seq=512, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=40, global_batch=1920, recompute=NONE, value=27965, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=65536, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=FULL, value=5506, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=32768, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=32, recompute=NONE, value=12025, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=16384, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=64, recompute=NONE, value=19649, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=8192, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=96, recompute=NONE, value=29157, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=4096, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=7, global_batch=224, recompute=NONE, value=38535, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=2048, hardware="H100-80GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=20, global_batch=1280, recompute=NONE, value=44402, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=2048, hardware="H100-80GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=20, global_batch=640, recompute=NONE, value=45130, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=2048, hardware="H100-80GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=20, global_batch=320, recompute=NONE, value=46037, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=2048, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=14, global_batch=112, recompute=NONE, value=45455, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=1024, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=18, global_batch=576, recompute=NONE, value=48910, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_1B, seq=512, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=56, global_batch=1792, recompute=NONE, value=52275, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_760M, seq=32768, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=NONE, value=16291, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_760M, seq=16384, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=48, recompute=NONE, value=27815, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_760M, seq=8192, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=96, recompute=NONE, value=41825, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_760M, seq=4096, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=12, global_batch=192, recompute=NONE, value=55459, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_760M, seq=2048, hardware="H100-80GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=24, global_batch=768, recompute=NONE, value=67971, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_760M, seq=2048, hardware="H100-80GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=24, global_batch=384, recompute=NONE, value=68551, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_760M, seq=2048, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=24, global_batch=384, recompute=NONE, value=63147, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_760M, seq=1024, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=48, global_batch=768, recompute=NONE, value=78581, notes=MP_DEFAULT),
    Row(table=LLMF_H100, model=MPT_760M, seq=512, hardware="H100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=96, global_batch=1536, recompute=NONE, value=83749, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_70B, seq=2048, hardware="A100-80GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=2048, recompute=FULL, value=410, notes=MP_PURE),
    Row(table=LLMF_A100_80, model=MPT_70B, seq=2048, hardware="A100-80GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=1024, recompute=FULL, value=373, notes=MP_PURE),
    Row(table=LLMF_A100_80, model=MPT_30B, seq=8192, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=168, recompute=FULL, value=574, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_30B, seq=4096, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=168, recompute=FULL, value=814, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_30B, seq=2048, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=504, recompute=FULL, value=916, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_30B, seq=1024, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=1008, recompute=FULL, value=946, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_30B, seq=512, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=12, global_batch=2016, recompute=FULL, value=967, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_13B, seq=32768, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=24, recompute=FULL, value=1016, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_13B, seq=16384, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=72, recompute=FULL, value=1431, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_13B, seq=8192, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=5, global_batch=120, recompute=FULL, value=1795, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_13B, seq=4096, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=240, recompute=FULL, value=2060, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_13B, seq=2048, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=48, recompute=NONE, value=2262, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_13B, seq=1024, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=40, global_batch=960, recompute=FULL, value=2330, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_7B, seq=65536, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=FULL, value=1013, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_7B, seq=32768, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=32, recompute=FULL, value=1672, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_7B, seq=16384, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=4, global_batch=64, recompute=FULL, value=2453, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_7B, seq=8192, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=128, recompute=FULL, value=3206, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_7B, seq=4096, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=256, recompute=FULL, value=3684, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_7B, seq=2048, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=96, recompute=NONE, value=4641, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_7B, seq=1024, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=64, global_batch=1024, recompute=FULL, value=4357, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_3B, seq=65536, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=FULL, value=1767, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_3B, seq=32768, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=144, recompute=FULL, value=3029, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_3B, seq=16384, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=48, recompute=NONE, value=5529, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_3B, seq=8192, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=144, recompute=NONE, value=7695, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_3B, seq=4096, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=5, global_batch=240, recompute=NONE, value=9457, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_3B, seq=2048, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=160, recompute=NONE, value=10811, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_3B, seq=1024, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=20, global_batch=960, recompute=NONE, value=11580, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_3B, seq=512, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=40, global_batch=1920, recompute=NONE, value=12127, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_1B, seq=65536, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=FULL, value=3044, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_1B, seq=32768, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=32, recompute=NONE, value=6275, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_1B, seq=16384, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=64, recompute=NONE, value=9956, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_1B, seq=8192, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=96, recompute=NONE, value=13814, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_1B, seq=4096, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=7, global_batch=224, recompute=NONE, value=17807, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_1B, seq=2048, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=14, global_batch=448, recompute=NONE, value=20513, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_1B, seq=1024, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=18, global_batch=576, recompute=NONE, value=22112, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_1B, seq=512, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=56, global_batch=1792, recompute=NONE, value=23148, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_760M, seq=65536, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=FULL, value=4143, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_760M, seq=32768, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=NONE, value=8802, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_760M, seq=16384, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=48, recompute=NONE, value=14274, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_760M, seq=8192, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=96, recompute=NONE, value=20933, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_760M, seq=4096, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=12, global_batch=192, recompute=NONE, value=27351, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_760M, seq=2048, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=24, global_batch=384, recompute=NONE, value=32434, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_760M, seq=1024, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=48, global_batch=768, recompute=NONE, value=29765, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_760M, seq=512, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=96, global_batch=1536, recompute=NONE, value=29446, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_350M, seq=65536, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=NONE, value=7524, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_350M, seq=32768, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=32, recompute=NONE, value=13652, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_350M, seq=16384, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=4, global_batch=64, recompute=NONE, value=23559, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_350M, seq=8192, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=128, recompute=NONE, value=36569, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_350M, seq=4096, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=256, recompute=NONE, value=49555, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_350M, seq=2048, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=32, global_batch=512, recompute=NONE, value=58782, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_350M, seq=1024, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=64, global_batch=1024, recompute=NONE, value=64813, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_350M, seq=512, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=128, global_batch=2048, recompute=NONE, value=69330, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_125M, seq=65536, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=16, recompute=NONE, value=20368, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_125M, seq=32768, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=32, recompute=NONE, value=36407, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_125M, seq=16384, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=4, global_batch=64, recompute=NONE, value=60040, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_125M, seq=8192, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=128, recompute=NONE, value=90392, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_125M, seq=4096, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=256, recompute=NONE, value=118396, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_125M, seq=2048, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=40, global_batch=640, recompute=NONE, value=142830, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_125M, seq=2048, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=32, global_batch=512, recompute=NONE, value=141737, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_125M, seq=1024, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=64, global_batch=1024, recompute=NONE, value=156468, notes=MP_DEFAULT),
    Row(table=LLMF_A100_80, model=MPT_125M, seq=512, hardware="A100-80GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=128, global_batch=2048, recompute=NONE, value=165681, notes=MP_DEFAULT),
    Row(table=LLMF_A100_40, model=MPT_70B, seq=2048, hardware="A100-40GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=4, global_batch=512, recompute=FULL, value=376, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_70B, seq=2048, hardware="A100-40GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=128, recompute=FULL, value=276, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_30B, seq=2048, hardware="A100-40GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=768, recompute=FULL, value=865, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_30B, seq=2048, hardware="A100-40GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=4, global_batch=128, recompute=FULL, value=857, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_13B, seq=8192, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=128, recompute=FULL, value=1407, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_13B, seq=4096, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=256, recompute=FULL, value=1603, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_13B, seq=2048, hardware="A100-40GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=2048, recompute=FULL, value=1972, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_13B, seq=2048, hardware="A100-40GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=1024, recompute=FULL, value=1976, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_13B, seq=2048, hardware="A100-40GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=14, global_batch=448, recompute=FULL, value=1998, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_13B, seq=2048, hardware="A100-40GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=160, recompute=FULL, value=1993, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_13B, seq=2048, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=4, global_batch=512, recompute=FULL, value=1668, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_13B, seq=1024, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=1024, recompute=FULL, value=1727, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_13B, seq=512, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=2048, recompute=FULL, value=1763, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=16384, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=32, recompute=FULL, value=2249, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=8192, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=96, recompute=FULL, value=2887, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=4096, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=192, recompute=FULL, value=3366, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=2048, hardware="A100-40GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=18, global_batch=2304, recompute=FULL, value=3623, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=2048, hardware="A100-40GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=18, global_batch=1152, recompute=FULL, value=3665, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=2048, hardware="A100-40GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=18, global_batch=576, recompute=FULL, value=3725, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=2048, hardware="A100-40GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=256, recompute=FULL, value=3645, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=2048, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=12, global_batch=384, recompute=FULL, value=3679, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=1024, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=24, global_batch=768, recompute=FULL, value=3854, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_7B, seq=512, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=48, global_batch=1536, recompute=FULL, value=3895, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=32768, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=32, recompute=FULL, value=2955, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=16384, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=128, recompute=FULL, value=4465, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=8192, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=64, recompute=NONE, value=7149, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=4096, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=128, recompute=NONE, value=8777, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=2048, hardware="A100-40GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=768, recompute=NONE, value=9538, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=2048, hardware="A100-40GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=384, recompute=NONE, value=9736, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=2048, hardware="A100-40GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=192, recompute=NONE, value=9914, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=2048, hardware="A100-40GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=5, global_batch=80, recompute=NONE, value=9750, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=2048, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=5, global_batch=320, recompute=NONE, value=10065, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=1024, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=640, recompute=NONE, value=10731, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_3B, seq=512, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=20, global_batch=1280, recompute=NONE, value=11324, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=32768, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=32, recompute=FULL, value=5095, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=16384, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=64, recompute=NONE, value=9715, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=8192, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=128, recompute=NONE, value=13474, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=4096, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=4, global_batch=256, recompute=NONE, value=16856, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=2048, hardware="A100-40GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=1280, recompute=NONE, value=18647, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=2048, hardware="A100-40GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=640, recompute=NONE, value=19001, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=2048, hardware="A100-40GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=10, global_batch=320, recompute=NONE, value=15555, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=2048, hardware="A100-40GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=128, recompute=NONE, value=19085, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=2048, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=512, recompute=NONE, value=19271, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=1024, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=1024, recompute=NONE, value=20959, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_1B, seq=512, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=32, global_batch=2048, recompute=NONE, value=21782, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=32768, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=32, recompute=FULL, value=7183, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=16384, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=32, recompute=NONE, value=13914, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=8192, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=3, global_batch=96, recompute=NONE, value=20106, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=4096, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=6, global_batch=192, recompute=NONE, value=25863, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=2048, hardware="A100-40GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=12, global_batch=1536, recompute=NONE, value=28940, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=2048, hardware="A100-40GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=12, global_batch=768, recompute=NONE, value=29344, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=2048, hardware="A100-40GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=12, global_batch=384, recompute=NONE, value=29648, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=2048, hardware="A100-40GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=12, global_batch=192, recompute=NONE, value=29607, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=2048, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=12, global_batch=384, recompute=NONE, value=30173, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=1024, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=24, global_batch=768, recompute=NONE, value=33422, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_760M, seq=512, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=48, global_batch=1536, recompute=NONE, value=34938, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=32768, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=32, recompute=NONE, value=13416, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=16384, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=64, recompute=NONE, value=22896, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=8192, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=4, global_batch=128, recompute=NONE, value=34933, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=4096, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=8, global_batch=256, recompute=NONE, value=46833, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=2048, hardware="A100-40GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=18, global_batch=2304, recompute=NONE, value=51934, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=2048, hardware="A100-40GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=18, global_batch=1152, recompute=NONE, value=52689, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=2048, hardware="A100-40GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=18, global_batch=576, recompute=NONE, value=53811, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=2048, hardware="A100-40GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=18, global_batch=288, recompute=NONE, value=55413, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=2048, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=16, global_batch=512, recompute=NONE, value=55995, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=1024, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=32, global_batch=1024, recompute=NONE, value=62523, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_350M, seq=512, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=64, global_batch=2048, recompute=NONE, value=66284, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=32768, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=1, global_batch=32, recompute=NONE, value=32651, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=16384, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=2, global_batch=48, recompute=NONE, value=55484, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=8192, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=5, global_batch=120, recompute=NONE, value=86858, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=4096, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=13, global_batch=312, recompute=NONE, value=115162, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=2048, hardware="A100-40GB", gpus=128, dp=128, zero=(3,), sharding="FULL_SHARD", micro_batch=26, global_batch=3328, recompute=NONE, value=123936, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=2048, hardware="A100-40GB", gpus=64, dp=64, zero=(3,), sharding="FULL_SHARD", micro_batch=26, global_batch=1664, recompute=NONE, value=125234, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=2048, hardware="A100-40GB", gpus=32, dp=32, zero=(3,), sharding="FULL_SHARD", micro_batch=26, global_batch=832, recompute=NONE, value=127122, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=2048, hardware="A100-40GB", gpus=16, dp=16, zero=(3,), sharding="FULL_SHARD", micro_batch=26, global_batch=416, recompute=NONE, value=130535, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=2048, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=26, global_batch=624, recompute=NONE, value=136334, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=1024, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=52, global_batch=1248, recompute=NONE, value=148289, notes=MP_PURE),
    Row(table=LLMF_A100_40, model=MPT_125M, seq=512, hardware="A100-40GB", gpus=8, dp=8, zero=(3,), sharding="FULL_SHARD", micro_batch=104, global_batch=2496, recompute=NONE, value=156735, notes=MP_PURE),
]

# ---------------------------------------------------------------------------------------------------
# IBM foundation-model-stack/fms-fsdp README.md @ 5e522b4 (2024-03-13), the last table measured without
# torch.compile (fms_fsdp/config/training.py at that commit: use_torch_compile False, seq_length 4096,
# batch_size 2 per GPU, bf16 mixed precision for parameters, gradient reduction and buffers). Llama 2
# dimensions from fms_fsdp/utils/config_utils.py (vocab 32000). PyTorch FSDP + SDPA (flash v2).
_FMS = ("foundation-model-stack/fms-fsdp README.md @ 5e522b4 (2024-03-13), training throughput table, "
        "column '{}'")
FMS_A100 = Table(stack="flash-2023", source="fms-fsdp", citation=_FMS.format("tokens/sec/GPU A100 80G 128 GPUs with 400Gbps"),
                 metric=TOKENS, framework="PyTorch FSDP (eager)",
                 notes="network stated as 400 Gbps (per node or per GPU not said); priced with the preset's "
                       "25 GB/s per GPU off-node")
FMS_H100 = Table(stack="flash-2023", source="fms-fsdp", citation=_FMS.format("tokens/sec/GPU H100 96 GPUs with 800 Gbps"),
                 metric=TOKENS, framework="PyTorch FSDP (eager)",
                 notes="network stated as 800 Gbps (per node or per GPU not said); priced with the preset's "
                       "50 GB/s per GPU off-node")
LLAMA2_7B = Model(name="llama2-7b", family="llama", layers=32, hidden=4096, heads=32, vocab=32000, ffn=11008)
LLAMA2_13B = Model(name="llama2-13b", family="llama", layers=40, hidden=5120, heads=40, vocab=32000, ffn=13824)
LLAMA2_34B = Model(name="llama2-34b", family="llama", layers=48, hidden=8192, heads=64, kv_heads=8, vocab=32000,
                   ffn=22016)
LLAMA2_70B = Model(name="llama2-70b", family="llama", layers=80, hidden=8192, heads=64, kv_heads=8, vocab=32000,
                   ffn=28672)
# The README @ ed74fd5 (2024-05-09) re-measured the same runs with torch.compile (use_torch_compile True
# at that commit: `torch.compile(model)` after FSDP wrapping). Its 7B row keeps the configuration of the
# eager table (HSDP, no AC, batch 2, seq 4096); its 13B/34B/70B rows are SKIPPED (below).
_FMS_C = ("foundation-model-stack/fms-fsdp README.md @ ed74fd5 (2024-05-09), training throughput table "
          "(Compile Y), column '{}'")
FMS_A100_COMPILED = Table(stack="flash-2023", source="fms-fsdp", citation=_FMS_C.format("tokens/sec/GPU A100 80G 128 GPUs with 400Gbps"),
                          metric=TOKENS, framework="PyTorch FSDP + torch.compile", kernels="compiled",
                          notes=FMS_A100.notes)
FMS_H100_COMPILED = Table(stack="flash-2023", source="fms-fsdp", citation=_FMS_C.format("tokens/sec/GPU H100 96 GPUs with 800 Gbps"),
                          metric=TOKENS, framework="PyTorch FSDP + torch.compile", kernels="compiled",
                          notes=FMS_H100.notes)
HSDP = ("HSDP (sharded within a node, replicated across nodes) has no partita equivalent: priced as ZeRO-3 "
        "over all GPUs, whose parameter all-gathers cross the network")
# The same README's MFU/HFU table says how many blocks 13B recomputed. HFU counts the re-run forward, so
# HFU / MFU = 1 + f / 3 when a share f of the blocks is checkpointed (forward = 1/3 of a step's FLOPs):
# 13B 0.59 / 0.51 on A100 (f = 0.41-0.53 within the table's rounding), 0.40 / 0.35 on H100 (f = 0.34-0.52):
# every second block (selective_checkpointing=2, f = 1/2); the same reading gives f = 0 for 7B (0.57/0.57)
# and about 1 for 34B and 70B (0.64/0.47, 0.67/0.50), the runs the first table marks No AC and Full AC.
FMS_SELECTIVE = ("fms-fsdp 'Selective AC' checkpoints every k-th block (selective_checkpointing=k): k = 2, 20 of "
                 "40 blocks, read from the same README's HFU / MFU = 1 + f / 3 (0.59 / 0.51 on A100, 0.40 / 0.35 "
                 "on H100)")
FMS_ROWS = [
    Row(table=FMS_A100, model=LLAMA2_7B, seq=4096, hardware="A100-80GB", gpus=128, dp=128, zero=(3,), sharding="HSDP",
        micro_batch=2, global_batch=256, recompute=NONE, value=3700, notes=HSDP),
    Row(table=FMS_A100, model=LLAMA2_13B, seq=4096, hardware="A100-80GB", gpus=128, dp=128, zero=(3,),
        sharding="FULL_SHARD", micro_batch=2, global_batch=256, recompute=("none", "full"), full_recompute_layers=20,
        value=1800,
        notes=FMS_SELECTIVE),
    Row(table=FMS_A100, model=LLAMA2_34B, seq=4096, hardware="A100-80GB", gpus=128, dp=128, zero=(3,),
        sharding="FULL_SHARD", micro_batch=2, global_batch=256, recompute=FULL, value=700),
    Row(table=FMS_A100, model=LLAMA2_70B, seq=4096, hardware="A100-80GB", gpus=128, dp=128, zero=(3,),
        sharding="FULL_SHARD", micro_batch=2, global_batch=256, recompute=FULL, value=370),
    Row(table=FMS_H100, model=LLAMA2_7B, seq=4096, hardware="H100-80GB", gpus=96, dp=96, zero=(3,), sharding="HSDP",
        micro_batch=2, global_batch=192, recompute=NONE, value=7500, notes=HSDP),
    Row(table=FMS_H100, model=LLAMA2_13B, seq=4096, hardware="H100-80GB", gpus=96, dp=96, zero=(3,),
        sharding="FULL_SHARD", micro_batch=2, global_batch=192, recompute=("none", "full"), full_recompute_layers=20,
        value=3800,
        notes=FMS_SELECTIVE),
    Row(table=FMS_H100, model=LLAMA2_34B, seq=4096, hardware="H100-80GB", gpus=96, dp=96, zero=(3,),
        sharding="FULL_SHARD", micro_batch=2, global_batch=192, recompute=FULL, value=1550),
    Row(table=FMS_H100, model=LLAMA2_70B, seq=4096, hardware="H100-80GB", gpus=96, dp=96, zero=(3,),
        sharding="FULL_SHARD", micro_batch=2, global_batch=192, recompute=FULL, value=800),
    Row(table=FMS_A100_COMPILED, model=LLAMA2_7B, seq=4096, hardware="A100-80GB", gpus=128, dp=128, zero=(3,),
        sharding="HSDP", micro_batch=2, global_batch=256, recompute=NONE, value=4550, notes=HSDP),
    Row(table=FMS_H100_COMPILED, model=LLAMA2_7B, seq=4096, hardware="H100-80GB", gpus=96, dp=96, zero=(3,),
        sharding="HSDP", micro_batch=2, global_batch=192, recompute=NONE, value=9600, notes=HSDP),
]

# ---------------------------------------------------------------------------------------------------
# pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3, row "FSDP" (eager,
# bf16; torch 1963fc8, torchtitan 9dec370, 2024-12). Llama 3.1 8B, seq 8192 (train_configs/llama3_8b.toml
# at 9dec370), FSDP2 over all GPUs, local batch 2, selective AC with selective_ac_option = 'op'.
# Hardware as published: Grand Teton H100 with 96 GB HBM2e at 2.4 TB/s, 500 W power limit, 400 Gb/s
# RDMA per GPU.
TORCHTITAN_2412 = Table(
    stack="pytorch-fa2",
    run=RunFacts(framework="torchtitan 9dec370, torch nightly 1963fc8 (2024-12-23, 2.6 pre-release)",
                 elementwise="eager", attention="sdpa", torch="2.6"),
    source="torchtitan",
    citation="pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3, row 'FSDP', "
             "column TPS/GPU",
    metric=TOKENS, framework="torchtitan FSDP2 (eager), torch nightly 1963fc8 (2024-12-23)",
    notes="500 W H100 (96 GB HBM2e): its peak lies between SXM and NVL (the source's footnote) and is not "
          "published, so the SXM preset's 989 TFLOP/s is kept; memory and HBM bandwidth as published")
LLAMA31_8B = Model(name="llama3.1-8b", family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, vocab=128256,
                   ffn=14336)
_H100_96GB = (("memory_bytes", 96e9), ("mem_bandwidth", 2.4e12))
OP_SAC = ("torchtitan's op-level selective AC (selective_ac_option 'op': saves every other matmul output and "
          "attention's, recomputing the rest), priced as partita's 'op', the same policy; FSDP2 reduces "
          "gradients in fp32 (mixed_precision_reduce default)")
# Rows "FSDP + torch.compile" of the same tables: torchtitan's apply_compile (torchtitan/parallelisms/
# parallelize_llama.py at 9dec370) compiles each TransformerBlock (fullgraph=True); everything else as above.
TORCHTITAN_2412_COMPILED = dataclasses.replace(
    TORCHTITAN_2412, citation=TORCHTITAN_2412.citation.replace("row 'FSDP'", "row 'FSDP + torch.compile'"),
    framework="torchtitan FSDP2 + torch.compile per block, torch nightly 1963fc8 (2024-12-23)", kernels="compiled")
# Its "Memory(GiB)" column is torchtitan's logged `max_reserved_gib` (torchtitan/components/metrics.py:
# torch.cuda.memory_stats()["reserved_bytes.all.peak"]), the maximum over GPUs.
_TT_MEMORY = "torch.cuda peak reserved bytes (allocated tensors plus the caching allocator's cache), max over GPUs"
TORCHTITAN_ROWS = [
    Row(table=TORCHTITAN_2412, model=LLAMA31_8B, seq=8192, hardware="H100-80GB", device_overrides=_H100_96GB, gpus=8,
        dp=8, zero=(3,), sharding="FSDP2 fully_shard", micro_batch=2, global_batch=16, recompute=OP,
        value=5762, memory_gib=82.4, memory_reading=_TT_MEMORY, memory_kind="reserved", notes="Table 1. " + OP_SAC),
    Row(table=TORCHTITAN_2412, model=LLAMA31_8B, seq=8192, hardware="H100-80GB", device_overrides=_H100_96GB,
        gpus=128, dp=128, zero=(3,), sharding="FSDP2 fully_shard", micro_batch=2, global_batch=256,
        recompute=OP, value=5605, memory_gib=67.0, memory_reading=_TT_MEMORY, memory_kind="reserved", notes="Table 3. " + OP_SAC),
    Row(table=TORCHTITAN_2412_COMPILED, model=LLAMA31_8B, seq=8192, hardware="H100-80GB", device_overrides=_H100_96GB,
        gpus=8, dp=8, zero=(3,), sharding="FSDP2 fully_shard", micro_batch=2, global_batch=16, recompute=OP,
        value=6667, memory_gib=77.0, memory_reading=_TT_MEMORY, memory_kind="reserved", notes="Table 1. " + OP_SAC),
    Row(table=TORCHTITAN_2412_COMPILED, model=LLAMA31_8B, seq=8192, hardware="H100-80GB", device_overrides=_H100_96GB,
        gpus=128, dp=128, zero=(3,), sharding="FSDP2 fully_shard", micro_batch=2, global_batch=256,
        recompute=OP, value=6514, memory_gib=62.0, memory_reading=_TT_MEMORY, memory_kind="reserved", notes="Table 3. " + OP_SAC),
]

# ---------------------------------------------------------------------------------------------------
# Llama Team, The Llama 3 Herd of Models (arXiv 2407.21783), Table 4: Llama 3 405B pre-training on
# H100-80GB SXM (700 W, HBM3), 400 Gb/s RoCE per GPU; seq 8192, 16M tokens per batch (2048 sequences),
# BF16; "TFLOPs/GPU" = model FLOPs (BF16 MFU 43% / 41% against 989 TFLOP/s).
LLAMA3_T4 = Table(
    stack="flash-2023",
    source="llama3-paper",
    citation="Llama Team, The Llama 3 Herd of Models, arXiv 2407.21783, Table 4",
    metric=MODEL_TFLOPS, framework="Meta's 4D parallelism (FSDP + TP + PP, and CP at 128k tokens)",
    notes="micro-batch, virtual stages and sequence parallelism not published: chosen by the search; the "
          "paper's interleaved schedule puts one layer fewer on the first and last stages")
LLAMA31_405B = Model(name="llama3.1-405b", family="llama", layers=126, hidden=16384, heads=128, kv_heads=8,
                     vocab=128256, ffn=53248)
_L3 = dict(table=LLAMA3_T4, model=LLAMA31_405B, seq=8192, hardware="H100-80GB", tp=8, pp=16, zero=(2,),
           sharding="FSDP without resharding parameters after forward (optimizer states and gradients sharded)",
           micro_batch=None, global_batch=2048, recompute=UNSTATED_RECOMPUTE, schedule="Interleaved1F1B",
           virtual_stages=None, sequence_parallel=None)
# Section 3.3.2: "With these optimizations, we could pre-train Llama 3 on sequences of 8K tokens without
# activation checkpointing" -- so the 8K rows are priced with no recompute. At 128K tokens (the row
# below) the paper does not say, but context parallelism 16 leaves each rank 131072 / 16 = 8192 tokens of
# each of its 16 sequences: the same per-rank activations as the 8K row on 16,384 GPUs (16 sequences per
# DP rank), so that row is priced with no recompute too.
_L3_8K_NO_AC = ("no activation checkpointing at 8K tokens (section 3.3.2, after deallocating each stage's "
                "input and output tensors and one layer fewer on the first and last stages)")
LLAMA3_ROWS = [
    Row(**{**_L3, "recompute": NONE}, gpus=8192, dp=64, value=430,
        notes="batch size per DP rank 32; " + _L3_8K_NO_AC),
    Row(**{**_L3, "recompute": NONE}, gpus=16384, dp=128, value=400,
        notes="batch size per DP rank 16; " + _L3_8K_NO_AC),
]

# ---------------------------------------------------------------------------------------------------
# BigScience BLOOM-176B: bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm (config) and
# chronicles.md, 2022-03-18 ("full throttle of GBS=2048 and at 149-150 TFLOPs per GPU", "a single train
# iteration is about 105 secs"). Megatron-DeepSpeed, TFLOP/s by its full-recompute formula (hardware FLOPs).
BLOOM = Table(
    stack="megatron-2021",
    source="bloom-176b",
    citation="bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm and chronicles.md "
             "(2022-03-18)",
    metric=HARDWARE_TFLOPS, framework="Megatron-DeepSpeed, pytorch 1.11",
    notes="Jean Zay: 4 x 100 Gb/s Omni-Path per node of 8 GPUs, priced as published: 6.25 GB/s per GPU across "
          "nodes (the preset's 25 GB/s is a DGX's 8 x 200 Gb/s HDR); the launch script sets CUDA_LAUNCH_BLOCKING=1")
BLOOM_176B = Model(name="bloom-176b", family="gpt", layers=70, hidden=14336, heads=112, vocab=250880,
                   attention="math", dropout=0.1,
                   notes="ALiBi instead of learned positions and a LayerNorm after the embedding; vocab padded to "
                         "250880; dropout not set in the script, so Megatron's default 0.1")
BLOOM_ROWS = [
    Row(table=BLOOM, model=BLOOM_176B, seq=2048, hardware="A100-80GB", device_overrides=(("inter_node_bw", 6.25e9),),
        gpus=384, tp=4, pp=12, dp=8, zero=(1,),
        sharding="DeepSpeed BF16_Optimizer (ZERO_STAGE=0; 'implements its own zero stage 1 equivalent')",
        micro_batch=2, global_batch=2048, recompute=FULL, schedule="1F1B", value=150,
        notes="149-150 TFLOP/s in the chronicles; DeepSpeed pipeline engine (no interleaving)"),
]

# ---------------------------------------------------------------------------------------------------
# Megatron-Turing NLG 530B: Smith et al., arXiv 2201.11990, Section 2.4: global batch 1920, seq 2048, on
# 280 / 350 / 420 DGX A100 (Selene, A100-80GB, HDR InfiniBand), 8-way tensor and 35-way pipeline
# parallelism, iteration time 60.1 / 50.2 / 44.4 s (126 / 121 / 113 TFLOP/s per GPU by the full-recompute
# formula). DeepSpeed pipeline engine + Megatron tensor slicing, activation checkpointing.
MTNLG = Table(
    stack="megatron-2021",
    source="mt-nlg-530b",
    citation="Smith et al., Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B, arXiv 2201.11990, "
             "Section 2.4",
    metric=ITERATION, precision="16-bit mixed precision (priced as bf16)", framework="DeepSpeed + Megatron-LM",
    notes="micro-batch and ZeRO stage (DeepSpeed's pipeline engine allows 0 or 1) not given in the section: "
          "chosen by the search")
MTNLG_530B = Model(name="mt-nlg-530b", family="gpt", layers=105, hidden=20480, heads=128, vocab=51200,
                   attention="math", dropout=0.1, notes="GPT-2 BPE vocabulary (50257) padded to 51200")
_MT = dict(table=MTNLG, model=MTNLG_530B, seq=2048, hardware="A100-80GB", tp=8, pp=35, zero=(0, 1),
           sharding="DeepSpeed data parallelism", micro_batch=None, global_batch=1920, recompute=FULL,
           schedule="1F1B")
MTNLG_ROWS = [
    Row(**_MT, gpus=2240, dp=8, value=60.1, notes="126 TFLOP/s per GPU"),
    Row(**_MT, gpus=2800, dp=10, value=50.2, notes="121 TFLOP/s per GPU"),
    Row(**_MT, gpus=3360, dp=12, value=44.4, notes="113 TFLOP/s per GPU"),
]

# ---------------------------------------------------------------------------------------------------
# Llama 3, Table 4 row 3: the 128k-token stage with context parallelism (all-gather K/V, 2 x cp chunks).
# The row as transcribed: "16,384 | 8 | 16 | 16 | 8 | 131,072 | 16 | 16M | 380 | 38%" (GPUs, TP, CP, PP, DP,
# sequence, batch size per DP, tokens per batch, TFLOP/s per GPU, BF16 MFU); one transcription prints DP 4,
# but only DP 8 fits 16,384 GPUs and 16M tokens (8 x 16 x 131,072).
LLAMA3_CP_ROWS = [
    Row(**{**_L3, "seq": 131072, "global_batch": 128, "recompute": NONE}, gpus=16384, cp=16, dp=8, value=380,
        notes="Table 4 row 3 (context parallelism 16, seq 131072, 16 sequences per DP rank); whether the run "
              "used document masks is not stated (priced as plain causal attention); activation recompute at "
              "128K tokens is not stated: priced with none, as the 8K rows, because each rank holds 8192 tokens "
              "of each of its 16 sequences, as on the 8K row with 16,384 GPUs"),
]

# ---------------------------------------------------------------------------------------------------
# NeMo AutoModel, docs/performance-summary.md @ 8d9bfb90e (2025-10-08, unchanged since), "System: DGX-H100,
# Precision: BF16": "| Qwen3 MoE 30B | 8 | 512 | 4 | 4 | 16 | 4096 | 1 | 1 | 1 | 8 | - | 8 | TE + DeepEP |
# 21.773 | 277 | 12,040 |" (GPUs, GBS, MBS, LBS, GA, seq, TP, PP, CP, EP, VP, FSDP, kernels, step s, model
# TFLOP/s, tokens/s per GPU). Config examples/benchmark/configs/qwen3_moe_30b_te_deepep.yaml: FSDP2 with
# reshard_after_forward False (ZeRO-2 by this file's convention), experts sharded by EP 8 (outside FSDP),
# every decoder block activation-checkpointed, mixed precision reducing in fp32, fake_balanced_gate on.
AUTOMODEL = Table(
    stack="te-2024",
    source="nemo-automodel",
    citation="NVIDIA-NeMo/Automodel docs/performance-summary.md @ 8d9bfb90e and "
             "examples/benchmark/configs/qwen3_moe_30b_te_deepep.yaml",
    metric=TOKENS, framework="NeMo AutoModel (FSDP2 + expert parallelism, DeepEP, Transformer Engine kernels)",
    notes="routing forced to balance (fake_balanced_gate): the load-imbalance factor still applies as "
          "stated; DeepEP and TE kernels priced as the preset's all-to-all and kernels")
QWEN3_30B_A3B = Model(name="qwen3-30b-a3b", family="hf", layers=48, hidden=2048, heads=32, vocab=151936,
                      kv_heads=4,
                      string="hf:qwen3_moe:num_hidden_layers=48,hidden_size=2048,num_attention_heads=32,"
                             "num_key_value_heads=4,head_dim=128,num_experts=128,num_experts_per_tok=8,"
                             "moe_intermediate_size=768,vocab_size=151936,norm_topk_prob=true",
                      notes="128 experts, top-8, expert ffn 768, QK-norm, head_dim 128 (heads x head_dim = 2 x "
                            "hidden): transformers' Qwen3-MoE built from its config")
AUTOMODEL_ROWS = [
    Row(table=AUTOMODEL, model=QWEN3_30B_A3B, seq=4096, hardware="H100-80GB", gpus=8, tp=1, pp=1, dp=8, ep=8,
        zero=(2,), sharding="FSDP2, reshard_after_forward False; experts by EP", micro_batch=4, global_batch=512,
        recompute=FULL, master_weights="none", value=12040,
        notes="21.773 s per step, 277 model TFLOP/s per GPU; pure bf16: the model is cast to bf16 when its meta "
              "weights are initialised (nemo_automodel/components/models/qwen3_moe/model.py @ 8d9bfb90e, "
              "Qwen3MoeForCausalLM.initialize_weights: self.to(dtype), dtype bfloat16, called by "
              "components/checkpoint/checkpointing.py), and torch.optim.Adam keeps its moments in the "
              "parameters' dtype; the loss's bf16 logits (MaskedCrossEntropy fp32_upcast false) are priced as "
              "transformers' fp32 ones"),
]

ROWS: list[Row] = (MEGATRON_T1_ROWS + KORTHIKANTI_T5_ROWS + LLMF_ROWS + FMS_ROWS + TORCHTITAN_ROWS + LLAMA3_ROWS
                   + BLOOM_ROWS + MTNLG_ROWS + LLAMA3_CP_ROWS + AUTOMODEL_ROWS)

# ---------------------------------------------------------------------------------------------------
SKIPPED = [
    Skipped(source="llm-foundry", what="README table 'H100 80GB FP8' (10 rows)", reason="FP8 (amp_fp8)"),
    Skipped(source="fms-fsdp", what="README.md @ ed74fd5 (2024-05-09) throughput table, 13b/34b/70b (6 rows)",
            reason="their recompute is not recoverable: the table says 'Selective AC' for all three, but the "
                   "same README's HFU / MFU = 1 + f / 3 gives f = 0.39 for 13B and about 1 (every block) for "
                   "34B and 70B, and its text quotes 13B at 0.48 MFU where the table has 0.61"),
    Skipped(source="torchtitan", what="llama3_h100_202412: Tables 1 and 3 rows with Float8; Tables 2, 4, 5, 6",
            reason="Float8 (and context parallelism in Tables 2 and 6) is not priced"),
    Skipped(source="torchtitan", what="llama3-8b_h200_202506_trainy-whitefiber", reason="Float8 + torch.compile"),
    Skipped(source="NVIDIA/NeMo", what="docs/source/performance/performance_summary.md (24.07, all versions "
                                       "stored) and performance_long_sequence.md",
            reason="every pre-training and fine-tuning row is FP8"),
    Skipped(source="megatron-moe-modelzoo",
            what="yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md: Qwen3-235B-A22B BF16 rows (256 H100, "
                 "TP 2-4 with EP 8-32, expert TP 1) and the long-context rows (CP 2-8 with EP 8)",
            reason="Megatron's MoE parallel folding runs the experts without tensor parallelism (ETP 1) over EP x "
                   "EDP ranks that span dp x tp, which partita's mesh (ep inside dp, tp on every layer) cannot "
                   "express; cp and ep together are not planned"),
    Skipped(source="megatron-lm-moe",
            what="megatron/core/transformer/moe/README.md: Mixtral 8x7B 438 / 468 TFLOP/s (MCore v0.8 / v0.9)",
            reason="the README does not tie the figure to a parallel configuration (its mapping table is a "
                   "reference, not the measured run)"),
    Skipped(source="nemo-automodel", what="DeepSeek V3 671B and Kimi K2 (256 / 1024 H100, EP 32-64)",
            reason="their first layers are dense and the rest MoE, so the planner's block program (irregular "
                   "layers) prices them, which does not price expert parallelism yet"),
    Skipped(source="opt-175b", what="OPT-175B, 147 TFLOP/s per GPU on 992 A100-80GB (FSDP + Megatron TP 8)",
            reason="the FLOP count behind 147 TFLOP/s (model or hardware) and the micro-batch are not stated, "
                   "and a 2M-token batch does not split evenly over 124 data-parallel replicas: the exact "
                   "configuration is not recoverable"),
    Skipped(source="megascale", what="MegaScale (NSDI'24) Tables 2-3, 175B / 530B on 256-12,288 A100s",
            reason="the tables' values could not be read from the stored sources here; MegaScale's own rows "
                   "also change the model (parallel block, sliding-window attention, LAMB)"),
]

# Issue 27: today's stacks (Megatron-Core / NeMo with TE, torchtitan async TP, NeMo AutoModel, flash-attn DDP). The
# module appends its CURRENT_ROWS and CURRENT_SKIPPED to ROWS and SKIPPED, whichever of the two is imported first.
import benchmarks.published_data_current  # noqa: E402,F401
# Whole training steps partita ran on a lent GPU (shared/GPU-MEASUREMENTS.md): today's PyTorch on Hopper.
import benchmarks.published_data_gpu  # noqa: E402,F401
# Sources entered through the first-contact ledger (issue 45): their rows join ROWS once ADMITTED.
import benchmarks.published_data_first_contact  # noqa: E402,F401
