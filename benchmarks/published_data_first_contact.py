"""Published measurements entered through the first-contact ledger (issue 45): data only, under the conventions of
benchmarks.published_data.

Every source here is priced by `python -m benchmarks.first_contact add SOURCE` -- with the fitted constants in
force and on the stack benchmarks.stack_rule assigns to the facts its Table states (`Table.run`) -- and the
prediction is committed to benchmarks/data/first_contact.jsonl before the source enters the fit. A source
enters the fit's data (ROWS) only once its name is in ADMITTED; tests/benchmarks/test_first_contact.py checks
that every row of an admitted source has its first-contact line, priced at a commit where the fit had not seen
it, and that a row's configuration and measured value are still those its line records.
"""
from __future__ import annotations

from benchmarks.published_data import FULL, NONE, ROWS, SELECTIVE, SKIPPED, TOKENS, Model, Row, Skipped, Table
from benchmarks.stack_rule import RunFacts, stack_for


def ruled_table(run: RunFacts, **kwargs) -> Table:
    """A Table on the stack the written rule assigns to `run` (never chosen by hand)."""
    return Table(stack=stack_for(run), run=run, **kwargs)


# ---------------------------------------------------------------------------------------------------
# InternLM, doc/en/train_performance.md @ c18bec9 (2023-07-08), section "FLOPS Testing": InternLM-7B
# (configs/7B_sft.py: 32 layers, hidden 4096, 32 heads, vocab 103168, SwiGLU MLP of int(4096 x 8/3) rounded up to a
# multiple of 256 = 11008, RMSNorm, rotary positions) on nvidia_a100-sxm4-80gb with 4 x 100 Gb RoCE between nodes,
# bf16, sequence 2048, tp 1, `zero1=8` (the optimizer states sharded over the 8 GPUs of a node), pack_sample_into_one
# True (every 2048-token chunk of a packed micro-batch is its own causal sequence: internlm/data/packed_dataset.py
# PackedDatasetWithoutCuSeqlen sets cu_seqlens at multiples of 2048). "Micro Bsz" sequences per micro-batch, "Micro
# Num" micro-batches per step; "Activation Ckpt" True checkpoints every block (model.checkpoint). Stack facts from
# doc/en/install.md @ c18bec9: PyTorch 1.13.1, flash-attention v1.0.5, apex 23.05 (MixedFusedRMSNorm), flash-attn's
# fused dense, rotary and cross-entropy.
INTERNLM_RUN = RunFacts(framework="InternLM @ c18bec9 (torch 1.13.1, flash-attention 1.0.5, apex 23.05)",
                        elementwise="fused", attention="flash1", torch="1.13")
INTERNLM = ruled_table(
    INTERNLM_RUN, source="internlm",
    citation="InternLM/InternLM doc/en/train_performance.md @ c18bec9 (2023-07-08), section 'FLOPS Testing', column "
             "TGS (tokens per GPU per second); model configs/7B_sft.py, stack doc/en/install.md @ c18bec9",
    metric=TOKENS, framework="InternLM (hybrid ZeRO-1, flash-attention 1.0.5, apex fused RMSNorm)",
    notes="`zero1=8` shards the optimizer states over a node's 8 GPUs (hybrid ZeRO, gradient reduce overlapped "
          "with the backward): priced as partita's ZeRO-1 over all data-parallel ranks; 4 x 100 Gb RoCE per node "
          "priced as published: 6.25 GB/s per GPU across nodes")
INTERNLM_7B = Model(name="internlm-7b", family="llama", layers=32, hidden=4096, heads=32, vocab=103168, ffn=11008,
                    loss="fused", notes="InternLM-7B has biases on the attention projections (partita's llama has "
                                        "none); flash-attn's fused cross-entropy")
_ILM = dict(table=INTERNLM, model=INTERNLM_7B, seq=2048, hardware="A100-80GB", device_overrides=(("inter_node_bw", 6.25e9),),
            tp=1, zero=(1,), sharding="InternLM hybrid ZeRO-1 (zero1=8)")


def _internlm(gpus: int, micro_bsz: int, micro_num: int, ckpt: bool, tgs: float) -> Row:
    return Row(**_ILM, gpus=gpus, dp=gpus, micro_batch=micro_bsz, global_batch=gpus * micro_bsz * micro_num,
               recompute=FULL if ckpt else NONE, value=tgs, variant="ckpt" if ckpt else "no-ckpt",
               notes=f"Micro Bsz {micro_bsz}, Micro Num {micro_num}, Activation Ckpt {'TRUE' if ckpt else 'FALSE'}")


INTERNLM_ROWS = [
    _internlm(8, 8, 1, True, 3314), _internlm(16, 8, 1, True, 3268), _internlm(32, 8, 1, True, 3323),
    _internlm(64, 8, 1, True, 3217), _internlm(128, 8, 1, True, 3260), _internlm(256, 8, 1, True, 3215),
    _internlm(512, 8, 1, True, 3199), _internlm(1024, 8, 1, True, 3163), _internlm(512, 4, 1, True, 2963),
    _internlm(1024, 2, 1, True, 2341), _internlm(1024, 4, 1, True, 2796),
    _internlm(8, 2, 4, False, 4103), _internlm(16, 2, 4, False, 3939), _internlm(32, 2, 4, False, 3919),
    _internlm(64, 2, 4, False, 3944), _internlm(128, 2, 4, False, 3928), _internlm(256, 2, 4, False, 3920),
    _internlm(512, 2, 4, False, 3900), _internlm(1024, 2, 4, False, 3625), _internlm(512, 2, 2, False, 3084),
    _internlm(1024, 2, 1, False, 2346), _internlm(1024, 2, 2, False, 2817),
]

# ---------------------------------------------------------------------------------------------------
# NVIDIA NeMo Megatron (BigNLP-Scripts / NeMo-Megatron-Launcher, now NVIDIA/NeMo-Framework-Launcher), README.md
# section 7.1.2 "Training Performance Results": GPT-3 5B and 175B on DGX SuperPOD (DGX A100 80GB, HDR InfiniBand),
# the cluster's "Tokens per Second" by node count. Each table was measured with the repository's predefined config
# of its commit (conf/training/gpt3/{5b,175b}.yaml), which the README names as the configurations to train with:
#   2022-06 (b20f85d4) 5B: TP 2, MBS 2, GBS 1440, no recompute (block method, 0 layers), fused_adam
#   2022-07 (d4317ddd) 175B: TP 8, PP 8, MBS 2, GBS 1536, selective recompute + sequence parallelism, fused_adam
#   2022-09 (a2b2f83a) 5B: TP 1, MBS 2, GBS 2048, no recompute, distributed_fused_adam
#   2022-09 (1f1e6be5) 175B: TP 8, PP 8, MBS 2, GBS 2048, selective + sequence parallelism, distributed_fused_adam
# bf16 with megatron_amp_O2 (bf16 model, fp32 main parameters), seq 2048, GPT-2 BPE (50257) padded to a multiple of
# 128 x TP, learned positions, hidden and attention dropout 0.1, Megatron's fused kernels (persistent LayerNorm,
# masked-softmax, bias-GELU, bias-dropout-add) and unfused attention; support matrix: PyTorch 1.12, NeMo 1.9-1.10.
NEMO_RUN = RunFacts(framework="NeMo Megatron 22.0x (NeMo 1.9-1.10, PyTorch 1.12, apex fused kernels)",
                    elementwise="fused", attention="math", torch="1.12")
_NEMO_CITE = ("NVIDIA/NeMo-Framework-Launcher README.md @ {} ({}), section 7.1.2 'Training Performance Results', "
              "row 'Tokens per Second' (the cluster's); config conf/training/gpt3/{}.yaml @ {}")
_NEMO_NOTES = ("value = the printed cluster throughput / GPUs; the README does not name the config it measured "
               "with: the predefined config of the same commit is taken as it")


def _nemo_table(commit: str, date: str, size: str) -> Table:
    return ruled_table(NEMO_RUN, source="nemo-megatron-launcher", citation=_NEMO_CITE.format(commit, date, size, commit),
                       metric=TOKENS, precision="bf16 (megatron_amp_O2)", framework="NeMo Megatron (Megatron-LM GPT, "
                       "PyTorch Lightning DDP)", notes=_NEMO_NOTES)


def _nemo_gpt(name: str, layers: int, hidden: int, heads: int, vocab: int) -> Model:
    return Model(name=name, family="gpt", layers=layers, hidden=hidden, heads=heads, vocab=vocab, attention="math",
                 dropout=0.1, notes=f"GPT-2 BPE (50257) padded to {vocab}; attention dropout 0.1 (NeMo's default)")


NEMO_5B_TP2 = _nemo_gpt("nemo-gpt3-5b", 24, 4096, 32, 50432)
NEMO_5B_TP1 = _nemo_gpt("nemo-gpt3-5b", 24, 4096, 32, 50304)
NEMO_175B = _nemo_gpt("nemo-gpt3-175b", 96, 12288, 96, 51200)
_N = dict(seq=2048, hardware="A100-80GB", micro_batch=2)
_N5_0622 = dict(_N, table=_nemo_table("b20f85d4", "2022-06-03", "5b"), model=NEMO_5B_TP2, tp=2, global_batch=1440,
                zero=(0,), sharding="data parallel (fused_adam)", recompute=NONE, variant="2022-06")
_N175_0722 = dict(_N, table=_nemo_table("d4317ddd", "2022-07-14", "175b"), model=NEMO_175B, tp=8, pp=8,
                  global_batch=1536, zero=(0,), sharding="data parallel (fused_adam)", recompute=SELECTIVE,
                  sequence_parallel=True, variant="2022-07")
_DIST = "NeMo distributed_fused_adam (optimizer states sharded over the data-parallel ranks, priced as ZeRO-1)"
_N5_0922 = dict(_N, table=_nemo_table("a2b2f83a", "2022-09-06", "5b"), model=NEMO_5B_TP1, tp=1, global_batch=2048,
                zero=(1,), sharding=_DIST, recompute=NONE, variant="2022-09")
_N175_0922 = dict(_N, table=_nemo_table("1f1e6be5", "2022-09-07", "175b"), model=NEMO_175B, tp=8, pp=8,
                  global_batch=2048, sharding=_DIST, recompute=SELECTIVE, sequence_parallel=True, variant="2022-09")


def _nemo(base: dict, nodes: int, cluster_tokens: float) -> Row:
    gpus = 8 * nodes
    dp = gpus // (base["tp"] * base.get("pp", 1))
    extra = {} if "zero" in base else {"zero": (1,) if dp > 1 else (0,)}
    return Row(**base, **extra, gpus=gpus, dp=dp, value=cluster_tokens / gpus,
               notes=f"{nodes} nodes: {cluster_tokens:.0f} tokens/s printed for the cluster")


NEMO_ROWS = ([_nemo(_N5_0622, n, v) for n, v in ((1, 39543), (2, 79128), (5, 195047), (9, 344523), (10, 383500),
                                                 (18, 670254), (20, 731791))]
             + [_nemo(_N175_0722, n, v) for n, v in ((16, 20642), (32, 38025), (128, 141306))]
             + [_nemo(_N5_0922, n, v) for n, v in ((1, 40345), (2, 79815), (4, 161754), (8, 312774), (16, 659481),
                                                   (32, 1159288))]
             + [_nemo(_N175_0922, n, v) for n, v in ((8, 7500), (16, 14950), (32, 29537), (64, 58211),
                                                     (128, 109684))])

# ---------------------------------------------------------------------------------------------------
# TinyLlama, jzhang38/TinyLlama README.md @ 09baa9e (2023-09-04): "a throughput of 24k tokens per second per A100-40G
# GPU ... without activation checkpointing", "per-gpu batch size of 16k tokens", 16 A100-40G GPUs, batch 2 million
# tokens (2048 x 1024). pretrain/tinyllama.py @ 09baa9e: micro_batch_size 8, 64 sequences per device per step
# (global_batch_size 512 / num_of_devices 8, per node), Lightning Fabric FSDPStrategy wrapping each Block with no
# activation checkpointing and no sharding strategy set (FULL_SHARD, the default); lit_gpt/config.py tiny_LLaMA_1b:
# 22 layers, hidden 2048, 32 heads, 4 query groups, MLP 5632, vocab 32000, FusedRMSNorm; PRETRAIN.md: torch 2.1
# nightly, flash-attention 2 with its fused layernorm, rotary and cross-entropy, xformers' fused SwiGLU.
TINYLLAMA_RUN = RunFacts(framework="TinyLlama @ 09baa9e (lit-gpt + Lightning Fabric FSDP, torch 2.1 nightly, "
                                   "flash-attention 2, xformers SwiGLU)",
                         elementwise="fused", attention="flash2", torch="2.1")
TINYLLAMA = ruled_table(
    TINYLLAMA_RUN, source="tinyllama",
    citation="jzhang38/TinyLlama README.md @ 09baa9e (2023-09-04), 'Blazingly Fast' and 'Training Details'; "
             "pretrain/tinyllama.py, lit_gpt/config.py and PRETRAIN.md @ 09baa9e",
    metric=TOKENS, framework="lit-gpt + Lightning Fabric FSDP (FULL_SHARD), flash-attention 2",
    notes="'24k' as printed (rounded); the network between the two nodes is not published (the preset's); Fabric's "
          "bf16-mixed precision under FSDP priced as bf16 parameters")
TINYLLAMA_11B = Model(name="tinyllama-1.1b", family="llama", layers=22, hidden=2048, heads=32, kv_heads=4, ffn=5632,
                      vocab=32000, loss="fused")
TINYLLAMA_ROWS = [
    Row(table=TINYLLAMA, model=TINYLLAMA_11B, seq=2048, hardware="A100-40GB", gpus=16, dp=16, zero=(3,),
        sharding="FSDP FULL_SHARD (Fabric's default)", micro_batch=8, global_batch=1024, recompute=NONE, value=24000),
]

# ---------------------------------------------------------------------------------------------------
# Zero Bubble Pipeline Parallelism (Qi, Wan, Huang, Lin; arXiv:2401.10241v1, 2023-11-30; ICLR 2024), its 1F1B
# baselines, "implementation from Megatron-LM", in samples per GPU per second at sequence 1024 on "up to 32 NVIDIA A100
# SXM 80G GPUs distributed across 4 nodes interconnected by a RoCE RDMA network" (bandwidth not stated): pipeline
# parallelism alone (Table 3: GPUs = pipeline stages; the script's TP_SIZE=1, so dp 1), no recomputation. Table 3's
# models: 1.5B (22 layers, hidden 2304, 24 heads), 6.2B (30, 4096, 32), 14.6B (46, 5120, 40), 28.3B (62, 6144, 48).
# The paper's script (sail-sg/zero-bubble-pipeline-parallelism examples/pretrain_zero_bubble.sh @ f68d3879, branch
# 'arxiv', a Megatron-LM fork of 9290c730, megatron-core 0.4.0rc0): legacy GPTModel (--transformer-impl local, no
# Transformer Engine), Megatron's fused kernels on by default (masked softmax, bias-GELU, bias-dropout-add, apex
# LayerNorm, gradient-accumulation fusion), no --use-flash-attn (unfused attention; the flag enters the script on
# 2024-08-19), dropout 0.1 (Megatron's default), --fp16, Adam, --allow-padding-num-layers: layers = k x stages - 2,
# padded to k per stage, "both the initial and final pipeline stages possess one fewer transformer layer"
# (megatron/model/transformer.py get_offset). The vocabulary is not stated (a SentencePiece tokenizer.model shipped
# with the sample data): Megatron's tied-embedding GPT has L (12h^2 + 13h) + (V + 2048) h + 2h parameters, and the
# four stated sizes, each read as +-0.05B, bound V to 24,464-32,440 together (50,304 would make 14.6B 14.7B); the
# LLaMA SentencePiece vocabulary, 32,000 (a multiple of Megatron's 128 padding), is taken. torch's release is not
# stated. Table 6's 16- and 24-GPU runs are the same models (the repository's efficiency.py lists their padded layer
# counts 32 / 48 / 64, i.e. 30 / 46 / 62 layers).
ZB_RUN = RunFacts(framework="Zero Bubble PP @ f68d3879 (Megatron-LM fork of 9290c730, legacy GPTModel, apex fused "
                            "kernels, unfused attention)", elementwise="fused", attention="math")
ZERO_BUBBLE = ruled_table(
    ZB_RUN, source="zero-bubble-pp",
    citation="Qi et al., Zero Bubble Pipeline Parallelism, arXiv:2401.10241v1, Tables 3, 4, 6, 7, 11 and 12 (column "
             "1F1B); script examples/pretrain_zero_bubble.sh and megatron/model/transformer.py @ f68d3879 of "
             "sail-sg/zero-bubble-pipeline-parallelism",
    metric=TOKENS, precision="fp16 (priced as bf16)", framework="Megatron-LM fork (Zero Bubble PP), 1F1B baseline",
    notes="value = the printed samples per GPU per second x 1024 tokens; the vocabulary (32,000) is derived from the "
          "stated parameter counts, not printed; the inter-node RoCE bandwidth is the preset's")
_ZB_SHAPES = {"1.5B": (22, 2304, 24), "6.2B": (30, 4096, 32), "14.6B": (46, 5120, 40), "28.3B": (62, 6144, 48)}


def _zb_model(size: str) -> Model:
    layers, hidden, heads = _ZB_SHAPES[size]
    return Model(name=f"zb-{size.lower()}", family="gpt", layers=layers, hidden=hidden, heads=heads, vocab=32000,
                 attention="math", dropout=0.1, notes="vocabulary derived from the stated sizes (32,000)")


def _zb(table: str, size: str, stages: int, b: int, m: int, samples: float) -> Row:
    """One 1F1B measurement: `stages` GPUs, one stage each, micro-batch `b`, `m` micro-batches per step."""
    layers = _ZB_SHAPES[size][0]
    k = (layers + 2) // stages  # per stage with the padding; the first and the last stage hold one fewer
    return Row(table=ZERO_BUBBLE, model=_zb_model(size), seq=1024, hardware="A100-80GB", gpus=stages, pp=stages, dp=1,
               zero=(0,), sharding="none (one pipeline)", micro_batch=b, global_batch=b * m, recompute=NONE,
               stage_layers=(k - 1,) + (k,) * (stages - 2) + (k - 1,), value=samples * 1024, variant=f"b{b}-m{m}",
               notes=f"Table {table}: {samples} samples per GPU per second")


ZERO_BUBBLE_ROWS = (
    [_zb("4", "1.5B", 8, 6, m, v) for m, v in ((24, 11.8), (32, 12.5), (64, 13.6))]
    + [_zb("4", "6.2B", 8, 3, m, v) for m, v in ((24, 3.50), (32, 3.70), (64, 4.03))]
    + [_zb("4", "14.6B", 16, 1, m, v) for m, v in ((48, 1.40), (64, 1.49), (128, 1.64))]
    + [_zb("4", "28.3B", 32, 1, m, v) for m, v in ((96, 0.76), (128, 0.80), (256, 0.88))]
    + [_zb("11", "1.5B", 8, 12, m, v) for m, v in ((24, 12.0), (32, 12.6), (64, 13.8))]
    + [_zb("11", "6.2B", 8, 6, m, v) for m, v in ((24, 3.56), (32, 3.76), (64, 4.09))]
    + [_zb("11", "14.6B", 16, 2, m, v) for m, v in ((48, 1.53), (128, 1.78))]
    + [_zb("12", "1.5B", 8, 6, m, v) for m, v in ((2, 3.56), (4, 5.74), (8, 8.26))]
    + [_zb("12", "6.2B", 8, 3, m, v) for m, v in ((2, 1.04), (4, 1.69), (8, 2.45))]
    + [_zb("12", "14.6B", 16, 1, m, v) for m, v in ((4, 0.39), (8, 0.65), (16, 0.95))]
    + [_zb("6", "6.2B", 16, 6, m, v) for m, v in ((48, 3.38), (64, 3.57), (128, 3.91))]
    + [_zb("6", "14.6B", 24, 2, m, v) for m, v in ((72, 1.52), (96, 1.61), (192, 1.76))]
    + [_zb("6", "28.3B", 32, 2, m, v) for m, v in ((96, 0.82), (128, 0.87), (256, 0.95))]
    + [_zb("7", "6.2B", 16, 3, 64, 3.48), _zb("7", "14.6B", 24, 1, 96, 1.47)]
)

# ---------------------------------------------------------------------------------------------------
# FlagPerf (BAAI's vendor benchmark suite), FlagOpen/FlagPerf @ 1b5a0303 (2025-11-11): the NVIDIA Megatron-Core
# Llama 3 cases. training/nvidia/llama3_8B-megatron/README.md (93730d18, 2024-05-15) and llama3_70B-megatron/README.md
# (ddd8f62a, 2024-06-14), tables "性能指标" (token/p/s, mem) and "A100单机8卡 消融实验". What ran:
# training/benchmarks/llama3_{8B,70B}/megatron/pretrain_llama3.sh -- Megatron-LM core_v0.6.0 pretrain_gpt.py with
# --use-mcore-models --transformer-impl transformer_engine --use-flash-attn --use-distributed-optimizer
# --sequence-parallel --bf16, --micro-batch-size 1 (config_*.py localbs), --global-batch-size 512, --seq-length 8192,
# --num-layers 32 / 80, --hidden-size 4096 / 8192, --ffn-hidden-size 14336 / 28672, --num-attention-heads 32 / 64,
# --num-query-groups 8, --swiglu, --normalization RMSNorm; no recompute flag (the vendor adapter training_adapter.sh is
# empty; the README's "recompute-activations" bullet is not in what the script passes), no --tp-comm-overlap, no
# virtual stages (1F1B); the docker image training/nvidia/docker_image/megatron_core060/Dockerfile is
# nvcr.io/nvidia/pytorch:24.02-py3 (torch 2.3 pre-release, Transformer Engine). Megatron's defaults the script leaves
# in place, where the model differs from Llama 3: learned absolute positions (no --position-embedding-type rope),
# biases on the linear layers (no --disable-bias-linear), input and output embeddings tied (no
# --untie-embeddings-and-output-weights). The vocabulary: the patched Llama3Tokenizer (tokenizer.patch) reports
# 128000 + 256, padded by Megatron to a multiple of 128 x TP (128256; 128512 at TP 4; 129024 at TP 8).
# run_pretraining.py: token/p/s = 512 x 8192 / the last logged "elapsed time per iteration" of 300 / GPUs. "mem" is
# FlagPerf's monitor (training/nvidia/nvidia_monitor.py: nvidia-smi's used memory, in GiB per the README). The 8B
# "A100" rows ran on the README's hardware, "NVIDIA_A800-SXM4-80GB" (DGX A800, InfiniBand 200 Gb/s): an A100 whose
# NVLink carries 400 GB/s (200 each way) instead of 600; the H100 rows' environment is the 70B README's
# ("NVIDIA_H100-SXM4-80GB", "InfiniBand，400Gb/s", read as each GPU's NIC, the preset's).
FLAGPERF_RUN = RunFacts(framework="Megatron-LM core_v0.6.0 (mcore GPT, Transformer Engine, flash-attn 2; NGC PyTorch "
                                  "24.02)", elementwise="te", attention="flash2", torch="2.3")
FLAGPERF = ruled_table(
    FLAGPERF_RUN, source="flagperf",
    citation="FlagOpen/FlagPerf @ 1b5a0303: training/nvidia/llama3_8B-megatron/README.md (93730d18) and "
             "llama3_70B-megatron/README.md (ddd8f62a), column token/p/s; training/benchmarks/llama3_{8B,70B}/megatron/"
             "pretrain_llama3.sh and run_pretraining.py, config/config_*.py, docker_image/megatron_core060/Dockerfile",
    metric=TOKENS, framework="Megatron-LM core_v0.6.0 (distributed optimizer, sequence parallelism, 1F1B)",
    fp32_grads=True,  # bf16: Megatron's fp32 main_grad buffers (megatron/training/arguments.py @ core_v0.6.0)
    notes="token/p/s = 512 x 8192 / the last step's time / GPUs (run_pretraining.py); the model is Megatron's GPT with "
          "Llama 3's shape: learned positions, biased linears and tied embeddings (Megatron's defaults the script "
          "keeps), priced as partita's llama (rotary, no biases, untied: the head's FLOPs are the same)")
_FP_MEMORY = ("FlagPerf's monitor: nvidia-smi's used memory (CUDA context and NCCL included), the README's 'mem' in "
              "GiB; which GPU of the run is not stated (set against the largest rank)")


def _flagperf_llama(size: str, tp: int) -> Model:
    """Megatron's Llama 3 shape at `size` ("8b", "70b"), its vocabulary padded to 128 x tp."""
    layers, hidden, heads, ffn = {"8b": (32, 4096, 32, 14336), "70b": (80, 8192, 64, 28672)}[size]
    vocab = -(-128256 // (128 * tp)) * 128 * tp
    return Model(name=f"llama3-{size}-megatron", family="llama", layers=layers, hidden=hidden, heads=heads, kv_heads=8,
                 ffn=ffn, vocab=vocab, notes=f"Llama 3 tokenizer (128256) padded to {vocab} (128 x TP {tp})")


def _flagperf(size: str, hardware: str, nodes: int, pp: int, dp: int, tp: int, tokens: float, mem: float) -> Row:
    a800 = hardware == "A800"
    return Row(table=FLAGPERF, model=_flagperf_llama(size, tp), seq=8192, hardware="A100-80GB" if a800 else hardware,
               device_overrides=(("intra_node_bw", 200e9),) if a800 else (), gpus=8 * nodes, tp=tp, pp=pp, dp=dp,
               zero=(1,), sharding="Megatron distributed optimizer (priced as ZeRO-1)", micro_batch=1, global_batch=512,
               recompute=NONE, sequence_parallel=tp > 1, tp_comm_overlap=False, value=tokens, memory_gib=mem,
               memory_reading=_FP_MEMORY, memory_kind="device", variant=f"pp{pp}-dp{dp}-tp{tp}",
               notes=f"PP{pp}DP{dp}TP{tp} on {nodes}x8 {'A800-SXM4-80GB' if a800 else hardware}, mem {mem:g}/80"
                     + ("; A800: NVLink 400 GB/s (200 each way), the A100 preset's other figures" if a800 else ""))


FLAGPERF_ROWS = [
    _flagperf("8b", "A800", 1, 2, 4, 1, 3698.7, 76), _flagperf("8b", "A800", 1, 4, 2, 1, 3306.5, 59),
    _flagperf("8b", "A800", 1, 2, 2, 2, 3409.2, 51), _flagperf("8b", "A800", 1, 2, 1, 4, 3006.1, 35),
    _flagperf("8b", "A800", 1, 8, 1, 1, 2690.3, 55), _flagperf("8b", "A800", 1, 1, 1, 8, 2451.2, 30),
    _flagperf("8b", "A800", 1, 4, 1, 2, 3042.7, 45),
    _flagperf("8b", "H100-80GB", 1, 1, 4, 2, 8103, 71), _flagperf("8b", "H100-80GB", 2, 1, 8, 2, 7914, 62),
    _flagperf("70b", "H100-80GB", 8, 4, 2, 8, 851, 55),
]

FIRST_CONTACT_ROWS: list[Row] = INTERNLM_ROWS + NEMO_ROWS + TINYLLAMA_ROWS + ZERO_BUBBLE_ROWS + FLAGPERF_ROWS
"""Every row entered through the ledger, admitted to the fit or not."""

ADMITTED: tuple[str, ...] = ("internlm", "nemo-megatron-launcher", "tinyllama", "zero-bubble-pp", "flagperf")
"""Sources whose first-contact pricing is committed to the ledger and that the fit's data (ROWS) now holds."""

FIRST_CONTACT_SKIPPED = [
    Skipped(source="internlm", what="train_performance.md 'Throughput Measurement' table (tp 1/2, zero1 -1/8/4; 32 "
                                    "values)",
            reason="measured with pack_sample_into_one=False: attention runs over each packed sample's own length, "
                   "which the data decides and the table does not state; the FLOPS tables (pack_sample_into_one "
                   "True) are priced"),
    Skipped(source="zero-bubble-pp", what="the ZB-1p, ZB-2p, ZB-V and interleaved 1F1B columns of Tables 4, 6, 7, 11 "
                                          "and 12, and Table 10",
            reason="zero-bubble schedules (the weight gradient split from the input gradient) are not among "
                   "planner.plan.schedules; the interleaved runs put one layer in each chunk with the padding's "
                   "two empty chunks, which --stage-layers (one chunk per stage) cannot pin"),
    Skipped(source="zero-bubble-pp", what="Table 11's 1F1B rows at 28.3B (b 2) and its two rows printed with m '32'",
            reason="m '32' is a misprint (their ZB-2p values are Table 4's at m 64 and 128); the 28.3B b 2 runs are "
                   "Table 6's configurations, taken from Table 6 (one row per configuration); Table 7's 28.3B b 1 m 128 "
                   "is Table 4's"),
    Skipped(source="zero-bubble-pp", what="the peak-memory columns (GB) of Tables 4, 6, 11 and 12",
            reason="which stage, and whether allocated or reserved bytes (or GB or GiB), is not stated"),
    Skipped(source="yafsdp", what="yandex/YaFSDP README.md 'Benchmarks' @ a61a4a6e: YaFSDP and PyTorch FSDP iteration "
                                  "times, Llama 2 7B-70B and Llama 3 8B/70B on 64-256 A100 80GB (16 rows each)",
            reason="the README states the model, GPU count, sequence, checkpointed layers and 'per-device batch size "
                   "1', but not the trainer (the repository's example uses transformers + accelerate, which the "
                   "benchmark is not said to have run), the precision, the network between hosts, gradient "
                   "accumulation, or the shape of its 'Llama 2 34B' (never released): the stack rule has no facts "
                   "to apply, and the FSDP rows are communication-bound on a network that is not published"),
    Skipped(source="flagperf", what="llama3_8B-megatron: the H100 55x8 row (PP1DP220TP2, 'gbs=1760*', 7047), the "
                                    "row of '*单机8卡' (2260) and the A800 PP1DP8TP1 row ('OOM')",
            reason="run_pretraining.py computes token/p/s with the global batch fixed at 512 while the 55-node row ran "
                   "1760, and which of the two its 7047 used is not stated; the '*' row names no hardware; the OOM row "
                   "did not run (no measurement)"),
    Skipped(source="flagperf", what="the bf16+fp8 rows of llama3_8B-megatron and llama3_70B-megatron",
            reason="FP8 (priced only in 16-bit precision)"),
    Skipped(source="flagperf", what="llama2_70B-megatron (FlagScale @ 26cd664 on 4 x 8 H800)",
            reason="the README's rows state their global batch only in the fourth (GAS 1024); the case's config "
                   "(TP 8, PP 4, GAS 44) is none of them; and whether FlagScale at that commit ran Transformer "
                   "Engine or apex kernels is not stated, so the stack rule has no facts to apply"),
    Skipped(source="flagperf", what="llama1_7B/13B-paddle and gpt3_6.7B/13B-paddle (20 rows)",
            reason="PaddlePaddle 2.5.1 with PaddleNLP: not a PyTorch stack benchmarks.stack_rule describes"),
    Skipped(source="nemo-megatron-launcher", what="T5, mT5 and BERT training-performance tables",
            reason="encoder-decoder and encoder models: not expressible by partita's decoder families"),
]

ROWS.extend(r for r in FIRST_CONTACT_ROWS if r.table.source in ADMITTED)
SKIPPED.extend(FIRST_CONTACT_SKIPPED)
