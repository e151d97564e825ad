"""Published measurements of today's training stacks (issue 27), each in its exact published configuration.

Data only, under the conventions of benchmarks.published_data (whose ROWS and SKIPPED end with these):
NVIDIA's current stacks -- Megatron-Core / NeMo with Transformer Engine, TP communication overlap and the
distributed optimizer -- on H100 at 8 to 6,144 GPUs; torchtitan's async TP; NeMo AutoModel's FSDP2 +
context parallelism; and flash-attn's 2022 DDP runs on one node of 8 A100s. A value is what the source
printed; where a conversion was unavoidable (a node's throughput, a scaled FLOP count) the row's `value`
spells the printed figure and the conversion, and its notes say why.

Its rows and skips end benchmarks.published_data's ROWS and SKIPPED: published_data imports this module at its
end, and this module appends to those lists (the order of the two imports does not matter).

Conventions added here:
- Distributed optimizers (Megatron's --use-distributed-optimizer, NeMo's distributed_fused_adam / Apex
  DistributedFusedAdam, mcore_distributed_optim): optimizer states sharded over the data-parallel ranks,
  gradients reduce-scattered and parameters all-gathered: `zero=(1,)`.
- Vocabularies are given as the run padded them: NeMo and Megatron pad to a multiple of
  make_vocab_size_divisible_by (128) x TP, flash-attn to a multiple of 8.
"""
from __future__ import annotations

from benchmarks.published_data import (FULL, HARDWARE_TFLOPS, ITERATION, LLAMA31_8B, MODEL_TFLOPS, NONE, OP, ROWS,
                                       SELECTIVE, SKIPPED, TOKENS, UNSTATED_RECOMPUTE, Model, Row, Skipped, Table,
                                       _H100_96GB)
from benchmarks.stack_rule import RunFacts

DIST_OPT = ("distributed optimizer: optimizer states sharded over the data-parallel ranks, gradient "
            "reduce-scatter and parameter all-gather overlapped with compute (priced as ZeRO-1)")

# ---------------------------------------------------------------------------------------------------
# NVIDIA/Megatron-LM README.md, "Training Speed and Scalability" (since f2e5db402c, 2024-07-15; the same
# text and images/model_table.png at d98e8a64dd, 2026-08-22): GPT models with vocab 131072 at seq 4096 on
# up to 6,144 H100s, Megatron-Core r0.8.0 (the strong-scaling figure's legend). The README names the
# overlaps: --overlap-grad-reduce --overlap-param-gather (Megatron asserts --use-distributed-optimizer for
# the latter), --tp-comm-overlap (Megatron asserts sequence parallelism for it: megatron/training/
# arguments.py @ core_r0.8.0), pipeline sends (on by default). "Per-GPU teraFLOP/s" is Megatron's
# num_floating_point_operations (megatron/training/training.py @ core_r0.8.0): model FLOPs, no recompute,
# the full s x s attention and the logit layer counted, as partita counts its graph. BF16: MFU = TFLOP/s /
# 989 (408.8 / 989 = 41%, as printed). In bf16 Megatron-LM accumulates and reduces gradients in fp32 main_grad
# buffers (megatron/training/arguments.py: accumulate_allreduce_grads_in_fp32 set for bf16).
MEGATRON_H100 = Table(
    stack="te-2024", source="megatron-lm-h100",
    citation="NVIDIA/Megatron-LM README.md and images/model_table.png @ f2e5db402c (2024-07-15), column "
             "'Per-GPU teraFLOP/s'",
    metric=MODEL_TFLOPS, precision="bf16 (MFU printed against the 989 TFLOP/s BF16 peak)",
    framework="Megatron-LM (Megatron-Core r0.8.0, Transformer Engine)", fp32_grads=True,
    notes="micro-batch, activation recompute and virtual pipeline stages not published: chosen by the search; "
          + DIST_OPT + "; TP communication overlapped (--tp-comm-overlap, userbuffers) with sequence parallelism")
_MEG_MODEL_NOTES = ("only heads, hidden size, layers, vocab and sequence are published: priced as Megatron's GPT "
                    "defaults (LayerNorm, GELU, 4h MLP, learned positions); dropout not published (priced without)")


def _megatron_gpt(name: str, layers: int, hidden: int, heads: int) -> Model:
    return Model(name=name, family="gpt", layers=layers, hidden=hidden, heads=heads, vocab=131072,
                 notes=_MEG_MODEL_NOTES)


_MEG = dict(table=MEGATRON_H100, seq=4096, hardware="H100-80GB", zero=(1,), sharding="Megatron distributed optimizer",
            micro_batch=None, recompute=UNSTATED_RECOMPUTE)
_MEG_TP = dict(_MEG, sequence_parallel=True, tp_comm_overlap=True)
_MEG_PP = dict(_MEG_TP, schedule="auto", virtual_stages=None)
MEGATRON_H100_ROWS = [
    Row(**_MEG, model=_megatron_gpt("megatron-gpt-1.7b", 24, 2048, 16), gpus=48, tp=1, dp=48, global_batch=192,
        tp_comm_overlap=False, value=408.8, notes="TP 1: no tensor-parallel collectives to overlap"),
    Row(**_MEG_TP, model=_megatron_gpt("megatron-gpt-7.1b", 30, 4096, 32), gpus=96, tp=2, dp=48, global_batch=192,
        value=465.9),
    Row(**_MEG_TP, model=_megatron_gpt("megatron-gpt-16b", 32, 6144, 48), gpus=192, tp=4, dp=48, global_batch=192,
        value=489.1),
    Row(**_MEG_TP, model=_megatron_gpt("megatron-gpt-32b", 48, 7168, 56), gpus=384, tp=8, dp=48, global_batch=192,
        value=459.6),
    Row(**_MEG_PP, model=_megatron_gpt("megatron-gpt-70b", 84, 8192, 64), gpus=768, tp=8, pp=2, dp=48,
        global_batch=384, value=419.7),
    Row(**_MEG_PP, model=_megatron_gpt("megatron-gpt-119b", 92, 10240, 80), gpus=1536, tp=8, pp=4, dp=48,
        global_batch=768, value=420.5),
    Row(**_MEG_PP, model=_megatron_gpt("megatron-gpt-177b", 96, 12288, 96), gpus=2304, tp=8, pp=6, dp=48,
        global_batch=1152, value=432.8),
    Row(**_MEG_PP, model=_megatron_gpt("megatron-gpt-314b", 96, 16384, 128), gpus=3072, tp=8, pp=8, dp=48,
        global_batch=1536, value=474.4),
    Row(**_MEG_PP, model=_megatron_gpt("megatron-gpt-462b", 112, 18432, 144), gpus=6144, tp=8, pp=16, dp=48,
        global_batch=3072, value=459.9),
]

# ---------------------------------------------------------------------------------------------------
# NVIDIA/dgxc-benchmarking @ 35a9aec (release v24.11.1): DGX Cloud H100 recipes, NeMo (Megatron-Core +
# Transformer Engine), "Training step time (seconds per step)" of the BF16 tables (the last of 50 steps,
# the READMEs say). Every configuration is in the repo: <workload>/*.yaml, overridden by configure.sh /
# launch.sh (global batch per scale, the 405B proxies' layers and PP, Nemotron's TP/PP/VP/MBS, TP overlap,
# NVTE_FUSED_ATTN). None recomputes activations except Nemotron-4 340B (selective).
_DGXC_NOTES = "the step time is the last of 50 steps; " + DIST_OPT + " (NeMo distributed_fused_adam, bf16 grad sync)"
_CUDNN = "cuDNN fused attention (NVTE_FUSED_ATTN=1)"
_FA2 = "NVTE_FUSED_ATTN=0: Transformer Engine runs FlashAttention-2"


def _dgxc(stack: str, readme: str, table: str, configs: str, nemo: str, notes: str) -> Table:
    return Table(stack=stack, source="dgxc-benchmarking",
                 citation=f"NVIDIA/dgxc-benchmarking @ 35a9aec (v24.11.1) {readme}, table '{table}', row 'Training "
                          f"step time (seconds per step)'; configs {configs}",
                 metric=ITERATION, framework=f"NeMo {nemo} (Megatron-Core, Transformer Engine)",
                 notes=f"{_DGXC_NOTES}; {notes}")


DGXC_LLAMA = _dgxc("te-2024", "llama3.1/README_{8b,70b,405b}.md", "Llama 3.1 {8b,70b,405b} 24.09 BF16 (...)",
                   "llama3.1/llama3.1_{8b,70b,405b}.yaml and configure.sh", "24.09", _CUDNN + ", NVTE_FLASH_ATTN=0")
DGXC_GPT3 = _dgxc("te-2024-flash2", "nemo_megatron/README_175b.md",
                  "NeMo Megatron 24.11 BF16 (TP=4,PP=8, MBS=1, VP=12, SEQ=2048)",
                  "nemo_megatron/gpt3_175b_hydra.yaml and launch.sh", "24.05", _FA2 + "; real data (mmap)")
DGXC_NEMOTRON_15B = _dgxc("te-2024", "nemotron/README_15b.md", "Nemotron4 15b 24.11 BF16 (TP=4, PP=1, MBS=4, GA=4)",
                          "nemotron/nemotron4-15b-synth.yaml and configure.sh", "24.09", _CUDNN + "; synthetic data")
DGXC_NEMOTRON_340B = _dgxc("te-2024-flash2", "nemotron/README_340b.md",
                           "Nemotron4 340b 24.11 BF16 (TP=8, PP=8, MBS=1, GA=16, VP=12)",
                           "nemotron/nemotron4-340b-synth.yaml and configure.sh", "24.09",
                           _FA2 + "; synthetic data; configure.sh overrides the yaml's ub_tp_comm_overlap False "
                                  "to True")

LLAMA31_70B_TP4 = Model(name="llama3.1-70b", family="llama", layers=80, hidden=8192, heads=64, kv_heads=8,
                        vocab=128512, ffn=28672, notes="Llama 3 tokenizer (128256) padded to 128512 (TP 4)")
_405B_NOTES = ("Llama 3.1 405B as the recipe runs it: num_query_groups 16 (the released model has 8) and the GPT-2 "
               "BPE tokenizer (50257) padded to 51200 (128 x TP 8)")


def _llama405b_run(layers: int) -> Model:
    name = "llama3.1-405b-dgxc" if layers == 126 else f"llama3.1-405b-proxy-{layers}l"
    return Model(name=name, family="llama", layers=layers, hidden=16384, heads=128, kv_heads=16, vocab=51200,
                 ffn=53248, notes=_405B_NOTES + ("" if layers == 126 else f"; a {layers}-layer proxy (configure.sh)"))


GPT3_175B_NEMO = Model(name="gpt3-175b-nemo", family="gpt", layers=96, hidden=12288, heads=96, vocab=50688,
                       dropout=0.1, notes="GPT-2 BPE (50257) padded to 50688 (128 x TP 4); hidden and attention "
                                          "dropout 0.1 (the yaml)")
_NEMOTRON_NOTES = ("Nemotron-4: squared-ReLU MLP (4h, no gate), LayerNorm1p, RoPE, no biases, untied embeddings, "
                   "256k SentencePiece vocab: priced as the gpt family (GELU, learned positions, biases)")
NEMOTRON4_15B = Model(name="nemotron4-15b", family="gpt", layers=32, hidden=6144, heads=48, kv_heads=8, vocab=256000,
                      ffn=24576, notes=_NEMOTRON_NOTES)
NEMOTRON4_340B = Model(name="nemotron4-340b", family="gpt", layers=96, hidden=18432, heads=96, kv_heads=8,
                       vocab=256000, ffn=73728, notes=_NEMOTRON_NOTES)

_DG = dict(hardware="H100-80GB", zero=(1,), sharding="NeMo distributed_fused_adam", micro_batch=1)
_L8 = dict(_DG, table=DGXC_LLAMA, model=LLAMA31_8B, seq=8192, tp=1, cp=2, recompute=NONE, tp_comm_overlap=False,
           notes="TP 1, CP 2 (context-parallel all-gather / ring of K and V)")
_L70 = dict(_DG, table=DGXC_LLAMA, model=LLAMA31_70B_TP4, seq=8192, tp=4, pp=4, cp=2, virtual_stages=5,
            schedule="Interleaved1F1B", recompute=NONE, sequence_parallel=True, tp_comm_overlap=True)
_L405 = dict(_DG, table=DGXC_LLAMA, seq=8192, tp=8, cp=2, recompute=NONE, sequence_parallel=True, tp_comm_overlap=True)
_L405_PP = dict(_L405, virtual_stages=7, schedule="Interleaved1F1B")
_G175 = dict(_DG, table=DGXC_GPT3, model=GPT3_175B_NEMO, seq=2048, tp=4, pp=8, virtual_stages=12,
             schedule="Interleaved1F1B", recompute=NONE, sequence_parallel=True, tp_comm_overlap=True)
_N15 = dict(_DG, table=DGXC_NEMOTRON_15B, model=NEMOTRON4_15B, seq=4096, tp=4, micro_batch=4, recompute=NONE,
            sequence_parallel=True, tp_comm_overlap=True)
# Nemotron-4 340B's optimizer keeps its states in bf16 and no master weights: the yaml's optim section sets
# `dtype: bf16` (and grad_sync_dtype bf16), which NeMo 24.09 reads as the optimizer state's dtype; it equals the model's
# (megatron_amp_O2, bf16), so `store_params` is False (nemo/collections/nlp/models/language_modeling/
# megatron_base_model.py @ NeMo tag 24.09-alpha.rc0, setup_optimization). Pure bf16 in partita's terms
# (master_weights "none"); the word embeddings' fp32 gradients (with_fp32_embedding_grads) are not priced.
_N340 = dict(_DG, table=DGXC_NEMOTRON_340B, model=NEMOTRON4_340B, seq=4096, tp=8, pp=8, virtual_stages=12,
             schedule="Interleaved1F1B", recompute=SELECTIVE, sequence_parallel=True, tp_comm_overlap=True,
             master_weights="none",
             notes="optimizer states in bf16 and no fp32 master (optim dtype bf16 in the yaml: NeMo's "
                   "distributed_fused_adam with store_params False), priced as pure bf16; the word embeddings' "
                   "fp32 gradients (with_fp32_embedding_grads) are not priced")
DGXC_ROWS = [
    Row(**_L8, gpus=8, dp=4, global_batch=128, value=12.91),
    Row(**_L8, gpus=16, dp=8, global_batch=256, value=13.00),
    Row(**_L8, gpus=32, dp=16, global_batch=512, value=13.05),
    Row(**_L8, gpus=64, dp=32, global_batch=1024, value=13.08),
    Row(**_L8, gpus=128, dp=64, global_batch=2048, value=13.10),
    Row(**_L70, gpus=64, dp=2, global_batch=128, value=14.72),
    Row(**_L70, gpus=128, dp=4, global_batch=256, value=14.73),
    Row(**_L70, gpus=256, dp=8, global_batch=512, value=14.8),
    Row(**_L70, gpus=512, dp=16, global_batch=1024, value=14.89),
    Row(**_L70, gpus=1024, dp=32, global_batch=2048, value=14.92),
    Row(**_L70, gpus=2048, dp=64, global_batch=4096, value=14.98),
    Row(**_L405, model=_llama405b_run(7), gpus=32, pp=1, dp=2, global_batch=126, value=8.85),
    Row(**_L405_PP, model=_llama405b_run(21), gpus=96, pp=3, dp=2, global_batch=126, value=8.75,
        notes="printed '8.7  5'; its throughput row, 117965 tokens/s = 126 x 8192 / 8.75, reads 8.75"),
    Row(**_L405_PP, model=_llama405b_run(42), gpus=192, pp=3, dp=4, global_batch=252, value=16.93),
    Row(**_L405_PP, model=_llama405b_run(126), gpus=576, pp=9, dp=4, global_batch=252, value=17.20),
    Row(**_L405_PP, model=_llama405b_run(126), gpus=1152, pp=9, dp=8, global_batch=504, value=17.52),
    Row(**_L405_PP, model=_llama405b_run(126), gpus=2304, pp=9, dp=16, global_batch=1008, value=17.62),
    Row(**_G175, gpus=128, dp=4, global_batch=256, value=8.91),
    Row(**_G175, gpus=256, dp=8, global_batch=512, value=8.95),
    Row(**_G175, gpus=512, dp=16, global_batch=1024, value=9.09),
    Row(**_G175, gpus=1024, dp=32, global_batch=2048, value=9.01),
    Row(**_G175, gpus=2048, dp=64, global_batch=4096, value=9.02),
    Row(**_N15, gpus=16, dp=4, global_batch=64, value=2.83),
    Row(**_N15, gpus=32, dp=8, global_batch=128, value=2.86),
    Row(**_N15, gpus=64, dp=16, global_batch=256, value=2.86),
    Row(**_N15, gpus=128, dp=32, global_batch=512, value=2.89),
    Row(**_N15, gpus=256, dp=64, global_batch=1024, value=2.88),
    Row(**_N15, gpus=512, dp=128, global_batch=2048, value=2.92),
    Row(**_N15, gpus=1024, dp=256, global_batch=4096, value=2.92),
    Row(**_N15, gpus=2048, dp=512, global_batch=8192, value=2.96),
    Row(**_N340, gpus=128, dp=2, global_batch=32, value=4.61),
    Row(**_N340, gpus=256, dp=4, global_batch=64, value=4.67),
    Row(**_N340, gpus=512, dp=8, global_batch=128, value=4.7),
    Row(**_N340, gpus=1024, dp=16, global_batch=256, value=4.73),
    Row(**_N340, gpus=2048, dp=32, global_batch=512, value=4.84),
]

# ---------------------------------------------------------------------------------------------------
# Dao-AILab/flash-attention training/ (flash-attn 0.2.2, FlashAttention-1; Dockerfile: nvcr.io pytorch
# 22.11, pytorch-lightning 1.7.7) on one node of 8 x A100 80GB SXM4 (400 W) with NVLink. Results and configs
# added together in 4a6eaa9f (2022-11-29). The configs pick the per-GPU batch by the GPU's memory
# (train.gpu_mem, nvidia-smi's memory.total / 1000, rounded: 82 on an 80 GB A100, so the '>= 80' branch);
# gradient accumulation = global / (8 x per-GPU batch). gpt2/gpt3 s and m run plain DDP, l and xl (and
# 2.7B) torch's ZeroRedundancyOptimizer (src/utils/ddp_zero1.py: ZeRO-1). No activation checkpointing
# (mlp_checkpoint_lvl 0; "we don't need any activation checkpointing"). Models: transformers' GPT2Config
# defaults (dropout 0.1 on embeddings, residuals and attention), vocab 50257 padded to 50264, learned
# positions, tied embeddings (partita unties: the head's FLOPs are the same), flash-attn's fused
# cross-entropy (apex xentropy).
_FA = "Dao-AILab/flash-attention training/README.md @ 4a6eaa9f (2022-11-29), {}; configs training/configs/experiment/{}"
_FA_NOTES = ("per-GPU batch from the configs' rule for 80 GB GPUs; fused dense + GELU MLP, fused dropout-add-LayerNorm "
             "(priced as partita's unfused kernels)")
FLASH1_GPT3 = Table(
    stack="flash1-2022", source="flash-attention",
    citation=_FA.format("table 'GPT3-125M ... GPT3-2.7B' (8 x A100 80GB), column 'Through put (tokens/sec)'",
                        "pile/gpt3{s,m,l,xl}-flash.yaml, gpt3-2.7B-flash-hdim128.yaml"),
    metric=TOKENS, framework="flash-attn 0.2.2 training scripts (PyTorch Lightning 1.7.7 DDP, torch 1.13)",
    notes="the table prints the node's throughput (8 GPUs): value = printed / 8; " + _FA_NOTES)
FLASH1_GPT2 = Table(
    stack="flash1-2022", source="flash-attention",
    citation=_FA.format("assets/gpt2_training_efficiency.jpg (GPT2, seqlen 1024), FlashAttention bars "
                        "('Training speed TFLOPs/s per A100')", "owt/gpt2{s,m,l,xl}-flash.yaml"),
    metric=HARDWARE_TFLOPS, precision="fp16 (trainer.precision 16; priced as bf16)",
    framework="flash-attn 0.2.2 training scripts (PyTorch Lightning 1.7.7 DDP, torch 1.13)",
    notes="the chart's TFLOP/s are Megatron's formula 96 B s l h^2 (1 + s/6h + V/16lh) scaled by 3/4 (README "
          "'Training speed'); value = printed x 4/3 is that formula's count, the one hardware_tflops_per_gpu "
          "compares (no recompute ran); " + _FA_NOTES)


def _flash_gpt(name: str, layers: int, hidden: int, heads: int) -> Model:
    return Model(name=name, family="gpt", layers=layers, hidden=hidden, heads=heads, vocab=50264, dropout=0.1,
                 loss="fused")


_F3 = dict(table=FLASH1_GPT3, seq=2048, hardware="A100-80GB", gpus=8, dp=8, recompute=NONE)
_F2 = dict(table=FLASH1_GPT2, seq=1024, hardware="A100-80GB", gpus=8, dp=8, recompute=NONE)
_DDP = dict(zero=(0,), sharding="DDP")
_ZERO1 = dict(zero=(1,), sharding="torch ZeroRedundancyOptimizer (DDPStrategyZero1)")
FLASH1_ROWS = [
    Row(**_F3, **_DDP, model=_flash_gpt("gpt3-125m", 12, 768, 12), micro_batch=32, global_batch=256,
        value=1310e3 / 8),
    Row(**_F3, **_DDP, model=_flash_gpt("gpt3-355m", 24, 1024, 16), micro_batch=32, global_batch=256,
        value=503e3 / 8),
    Row(**_F3, **_ZERO1, model=_flash_gpt("gpt3-760m", 24, 1536, 16), micro_batch=16, global_batch=256,
        value=245e3 / 8),
    Row(**_F3, **_ZERO1, model=_flash_gpt("gpt3-1.3b", 24, 2048, 16), micro_batch=8, global_batch=512,
        value=169e3 / 8),
    Row(**_F3, **_ZERO1, model=_flash_gpt("gpt3-2.7b-hdim128", 32, 2560, 20), micro_batch=4, global_batch=512,
        value=85e3 / 8, notes="head dimension 128 (20 heads), as the README says the 2.7B row ran"),
    Row(**_F2, **_DDP, model=_flash_gpt("gpt2-125m", 12, 768, 12), micro_batch=64, global_batch=512,
        value=147 * 4 / 3, notes="the label 147 is partly behind the chart's legend"),
    Row(**_F2, **_DDP, model=_flash_gpt("gpt2-355m", 24, 1024, 16), micro_batch=64, global_batch=512,
        value=159 * 4 / 3),
    Row(**_F2, **_ZERO1, model=_flash_gpt("gpt2-760m", 36, 1280, 20), micro_batch=32, global_batch=512,
        value=170 * 4 / 3),
    Row(**_F2, **_ZERO1, model=_flash_gpt("gpt2-1.6b", 48, 1600, 25), micro_batch=16, global_batch=512,
        value=164 * 4 / 3),
]

# ---------------------------------------------------------------------------------------------------
# pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md @ 2887250bb (2025-06-16), rows
# "None (bfloat16)": Grand Teton H100s (96 GB HBM2e, 500 W), torch 38410cf9 (2025-06-14), torchtitan
# 820504e, torch.compile, FSDP2 x TP 8 with TP's sequence sharding, vanilla TP against async TP. The file's
# "local batch size" is per data-parallel rank (no gradient accumulation); seq_len 8192 is the model's
# train_configs/llama3_{70b,8b}.toml at 820504e, which the file does not override. "tokens/sec" is per GPU
# (torchtitan logs tokens per second per device; 597 tokens/s for a 70B model cannot be a cluster's).
TORCHTITAN_ASYNC_TP = Table(
    stack="pytorch-fa2", source="torchtitan",
    run=RunFacts(framework="torchtitan 820504e, torch nightly 38410cf9 (2025-06-14, 2.8 pre-release)",
                 elementwise="eager", attention="sdpa", torch="2.8", tp_overlap="async-tp"),
    citation="pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md @ 2887250bb, rows "
             "'None (bfloat16)', columns 'Vanilla TP tokens/sec' and 'Async TP tokens/sec'; seq_len from "
             "torchtitan/models/llama3/train_configs/llama3_{70b,8b}.toml @ 820504e",
    metric=TOKENS, framework="torchtitan 820504e FSDP2 + TP + torch.compile, torch nightly 38410cf9 (2025-06-14)",
    kernels="compiled",
    notes="500 W H100 (96 GB HBM2e): memory and HBM bandwidth as published, peak FLOP/s the SXM preset's (the "
          "2024-12 file's footnote: its peak lies between SXM and NVL, not published); FSDP2 reduces gradients "
          "in fp32")
LLAMA31_70B = Model(name="llama3.1-70b", family="llama", layers=80, hidden=8192, heads=64, kv_heads=8, vocab=128256,
                    ffn=28672)
_TT = dict(table=TORCHTITAN_ASYNC_TP, seq=8192, hardware="H100-80GB", device_overrides=_H100_96GB, tp=8, zero=(3,),
           sharding="FSDP2 fully_shard", sequence_parallel=True)
_TT70 = dict(_TT, model=LLAMA31_70B, gpus=256, dp=32, micro_batch=16, global_batch=512, recompute=FULL)
_TT8 = dict(_TT, model=LLAMA31_8B, gpus=64, dp=8, micro_batch=12, global_batch=96, recompute=OP,
            notes="per-op selective AC (torchtitan's 'op'), priced as partita's 'op'")
TORCHTITAN_ASYNC_TP_ROWS = [
    Row(**_TT70, tp_comm_overlap=False, variant="vanilla-tp", value=597.3),
    Row(**_TT70, tp_comm_overlap=True, variant="async-tp", value=652.4),
    Row(**_TT8, tp_comm_overlap=False, variant="vanilla-tp", value=4378),
    Row(**_TT8, tp_comm_overlap=True, variant="async-tp", value=4809.4),
]

# ---------------------------------------------------------------------------------------------------
# NVIDIA-NeMo/Automodel docs/performance-summary.md @ 2013a4dd6 (2026-04-10), "System: DGX-H100, Precision:
# BF16": "| Llama3 70B | 64 | 128 | 1 | 1 | 4 | 8192 | 1 | 1 | 2 | - | - | 32 | TE + fsdp2_prefetch | 18.90 |
# 389 | 866.77 |" (GPUs, GBS, MBS, LBS, GA, seq, TP, PP, CP, EP, VP, FSDP, kernels, step s, model TFLOP/s,
# tokens/s per GPU). Config examples/llm_pretrain/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml at that
# commit: FSDP2 (every decoder layer but the last resharded after forward: components/distributed/
# parallelizer.py), CP 2 through torch SDPA, activation checkpointing of every decoder layer, torch.compile,
# fp32 gradient reduction.
AUTOMODEL_DENSE = Table(
    stack="pytorch", source="nemo-automodel",
    citation="NVIDIA-NeMo/Automodel docs/performance-summary.md @ 2013a4dd6, row 'Llama3 70B' (pre-training); config "
             "examples/llm_pretrain/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml @ 2013a4dd6",
    metric=TOKENS, framework="NeMo AutoModel (FSDP2 + torch context parallelism, torch.compile)", kernels="compiled",
    notes="FSDP shards over the 64 ranks of dp x cp (partita shards over dp); Transformer Engine linear layers "
          "priced as the stack's GEMMs")
AUTOMODEL_DENSE_ROWS = [
    Row(table=AUTOMODEL_DENSE, model=LLAMA31_70B, seq=8192, hardware="H100-80GB", gpus=64, tp=1, pp=1, cp=2, dp=32,
        zero=(3,), sharding="FSDP2 fully_shard (reshard after forward)", micro_batch=1, global_batch=128,
        recompute=FULL, value=866.77, notes="18.90 s per step, 389 model TFLOP/s per GPU"),
]

CURRENT_ROWS: list[Row] = (MEGATRON_H100_ROWS + DGXC_ROWS + FLASH1_ROWS + TORCHTITAN_ASYNC_TP_ROWS
                           + AUTOMODEL_DENSE_ROWS)

# ---------------------------------------------------------------------------------------------------
_FP8 = "FP8 (priced only in 16-bit precision)"
CURRENT_SKIPPED = [
    Skipped(source="dgxc-benchmarking", what="v24.11.1 FP8 tables: Llama 3.1 8B/70B/405B, GPT-3 175B, Nemotron-4 "
                                             "15B/340B (35 rows)", reason=_FP8),
    Skipped(source="dgxc-benchmarking",
            what="later releases' BF16 tables of the same workloads (v25.01 to v26.02: NeMo 24.12, NeMo 2.0 recipes)",
            reason="one release is transcribed per workload; in v25.02 the GPT-3 175B yaml says VP 6 where its "
                   "README says VP=12, and Nemotron-4 340B's configure.sh sets CP 2 for BF16 while the README's "
                   "GA=16 implies CP 1 (its numbers are v24.11.1's); from v25.04 the configurations live in the "
                   "NeMo container's recipes, not in the repository"),
    Skipped(source="dgxc-benchmarking", what="Grok-1 314B, DeepSeek-V3, Llama 4, Nemotron-H; MaxText and PaxML recipes",
            reason="MoE and hybrid Mamba models whose expert/Mamba layers partita's families do not express, and "
                   "JAX stacks (no costmodel.hardware.stacks entry)"),
    Skipped(source="megatron-lm-h100", what="README weak- and strong-scaling figures (GPT-3 175B on 96 to 4,608 H100s)",
            reason="plotted without printed values (the model table's rows are transcribed)"),
    Skipped(source="flash-attention", what="Huggingface and Megatron-LM bars of gpt2/gpt3_training_efficiency.jpg",
            reason="baselines: the Megatron-LM runs' configuration is not published; the Huggingface runs used "
                   "transformers 4.24's eager GPT-2, a stack costmodel.hardware.stacks does not describe"),
    Skipped(source="flash-attention", what="FlashAttention-2 paper (arXiv 2307.08691) Table 1: GPT3-1.3B/2.7B at 2k "
                                           "and 8k on 8 x A100",
            reason="the table's values could not be read from the stored sources here"),
    Skipped(source="torchtitan", what="asyncTP_llama3_h100_2025-06: float8 tensorwise and rowwise rows (8 values)",
            reason=_FP8),
    Skipped(source="nemo-automodel",
            what="performance-summary.md fine-tuning (LoRA) rows: Llama3 8B/70B, Qwen2.5 7B/32B",
            reason="LoRA (frozen base weights, adapter gradients only) is not priced"),
    Skipped(source="nemo-automodel", what="Nemotron V3 Nano/Super/Ultra and GPT-OSS 20B/120B pre-training rows",
            reason="hybrid Mamba-MoE and attention-sink / sliding-window MoE models with expert parallelism: not "
                   "expressible by partita's families and not planned with EP by the block program"),
    Skipped(source="megatron-bridge",
            what="NVIDIA-NeMo/Megatron-Bridge docs/performance-summary*.md @ 067f987df (25.09 to 26.08), DGX-H100 rows",
            reason="the dense H100 rows are FP8; the BF16 H100 rows are GPT-OSS 120B (MoE with attention sinks, EP 8), "
                   "not expressible"),
    Skipped(source="NVIDIA/NeMo", what="docs.nvidia.com NeMo Framework performance summary 24.12 to 25.07",
            reason="every pre-training table states FP8 precision (per-tensor current scaling)"),
]

ROWS.extend(CURRENT_ROWS)
SKIPPED.extend(CURRENT_SKIPPED)
