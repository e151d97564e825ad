"""Software stacks: how a framework runs a model's kernels and collectives on a GPU generation.

The same GPU runs the same model at different speeds under different software: Megatron-LM 2021
materialised the attention scores; PyTorch 2.0-2.4 ran FlashAttention-2; torch >= 2.11 dispatches
cuDNN's flash kernels on Hopper (GPU-MEASUREMENTS.md: 2-3x FlashAttention-2's rate there); Megatron-Core
with Transformer Engine overlaps tensor-parallel collectives with GEMMs (userbuffers). A published run's
stack is part of its configuration, as its network is, and the kernel constants are fitted per GPU
generation and stack (benchmarks.fit), never per model or per row.

A `Stack` holds the facts of a stack that change *what* is priced (which attention kernel runs, whether
it skips masked blocks, whether TP collectives can hide behind GEMMs); the fitted constants (how *fast*
each kernel kind runs) live in costmodel/fitted_constants.json, keyed by generation and stack, and
costmodel.hardware applies them.

The default stack is "pytorch": current PyTorch as partita's runtime runs it, which is what a user who
installs torch today gets.
"""
from __future__ import annotations

from dataclasses import dataclass

from partita.costmodel.errors import PartitaError


@dataclass(frozen=True, kw_only=True, slots=True)
class Stack:
    name: str
    description: str
    attention: str
    """Fused attention (scaled_dot_product_attention) kernel on a GPU in 16-bit precision: "torch" (what
    torch's SDPA dispatches for the device, dtype and shape: `sdpa_kernel`), "flash1" (FlashAttention, Dao et
    al. 2022: flash-attn < 2.0), "flash2" (FlashAttention-2), "flash_triton" (FlashAttention written in
    Triton: flash-attn's flash_attn_triton, as MPT's attn_impl 'triton' runs it), "cudnn" (cuDNN's fused
    flash attention, as Transformer Engine and torch >= 2.11 on Hopper run it)."""
    tp_comm_overlap: bool = False
    """Tensor-parallel collectives can overlap the GEMMs around them (Megatron-Core `--tp-comm-overlap`
    with userbuffers; torch's async TP under torch.compile). A plan choice where the stack allows it."""
    tp_overlap_backward: bool = True
    """Where the stack overlaps TP collectives (`tp_comm_overlap`), whether the backward's own ones overlap too.
    True: Transformer Engine's userbuffers decompose the forward's all-gather + GEMM and GEMM + reduce-scatter
    and run the backward's as bulk overlaps beside the data- and weight-gradient GEMMs. False: torch's async TP
    (`micro_pipeline_tp`, an inductor pass matching all-gather -> matmul and matmul -> reduce-scatter) fuses
    the forward's patterns -- and a full recompute's re-run forward, the same patterns -- while the backward's
    are priced on the critical path. In torch 2.13's pass a reduce-scatter fuses only when one matmul produces
    its input, and the backward's take the sum of several data gradients (q, k, v; gate and up); an all-gather
    fuses with the matmuls that take it as their left operand, which in the backward is the data-gradient
    matmul alone (the weight gradient takes it transposed). PyTorch's announcement ("[Distributed
    w/ TorchTitan] Introducing Async Tensor Parallelism in PyTorch", 2024) measured up to 29% (Llama 3 8B)
    and 20% (70B) forward-pass speed-ups for about 8% end to end: with a backward twice the forward and as
    much TP traffic, a backward overlapped as well would give about twice that. costmodel.price.streams."""
    p2p_overlap: bool = False
    """An interleaved pipeline's sends and receives can overlap the next model chunk's compute (Megatron-Core's
    --overlap-p2p-communication). A plan choice where the stack allows it."""
    partita_runs: bool = False
    """partita's own runtime runs this stack (plans made for other stacks are priced, not run)."""
    eager_elementwise: bool = False
    """Memory-bound operators (norms, activations, residual adds, casts) run as eager PyTorch's kernels, one
    or more per operator, as partita's graph lists them; False where the stack fuses them into few kernels
    (apex's and Transformer Engine's fused LayerNorm, bias-GELU, dropout-add; flash-attn's fused MLP and
    dropout-add-LayerNorm). benchmarks.fit fits the rate of eager ones inside a training step
    (`Device.step_efficiency`); fused stacks keep the kernel rate (1), their fusion not modelled."""
    sp_saves_shard: bool = False
    """Under sequence parallelism a column-parallel layer saves the sequence shard of its input and all-gathers
    it again in its backward (Korthikanti et al. 2022, section 4.2.2: the sharded input is stored and an extra
    all-gather runs in the backward; Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication and
    Transformer Engine's Linear / LayerNormLinear with sequence_parallel), rather than the all-gathered whole
    tensor PyTorch's ColwiseParallel saves (planner.enumerate.strategies, memory)."""
    sp_batch_first: bool = False
    """Sequence parallelism shards dim 1 of batch-first [batch, seq, hidden] activations, as PyTorch's DTensor layers
    do (SequenceParallel / PrepareModuleInput with Shard(1): torchtitan, partita's runtime). NCCL gathers and
    scatters along dim 0 only, so with more than one sample per micro-batch each all-gather's output and each
    reduce-scatter's input is re-laid by a copy of the whole tensor on the compute stream (torch 2.13
    torch.distributed._functional_collectives: all_gather_single's chunk-and-cat when gather_dim != 0,
    reduce_scatter_single's _chunk_or_narrow_cat when scatter_dim != 0; a single sample is a view). Megatron keeps
    [seq, batch, hidden] and gathers dim 0 in place (Korthikanti et al. 2022). Priced by
    planner.enumerate.strategies.BlockOption.layout_copy_s."""
    fused_saves: tuple[str, ...] = ()
    """Which eager pieces of a layer the stack runs as fused kernels that save only their inputs
    (costmodel.price.fusion.fused_kernel_saves): "norm", an RMSNorm (apex's FusedRMSNorm / MixedFusedRMSNorm,
    Transformer Engine's RMSNorm and LayerNormLinear); "gate", a SwiGLU (Megatron-Core's bias_swiglu_impl, TE's
    swiglu). (): every piece saves what eager autograd saves."""
    gemm: str = ""
    """The stack whose GEMM constants this one shares ("": its own): stacks that differ only in their
    attention kernel call the same GEMMs (benchmarks.fit fits one GEMM efficiency for them)."""
    constants: str = ""
    """The stack whose fitted kernel constants (every field: GEMMs, attention, memory-bound operators) this one
    uses ("": its own): a stack that runs the same kernels as another and differs only in what may overlap.
    benchmarks.fit fits one constant set for both, from the rows of both."""

    @property
    def gemm_family(self) -> str:
        return self.gemm or self.name

    @property
    def constants_family(self) -> str:
        return self.constants or self.name


STACKS: dict[str, Stack] = {s.name: s for s in [
    Stack(name="pytorch", eager_elementwise=True, sp_batch_first=True, attention="torch", tp_comm_overlap=True,
          tp_overlap_backward=False, partita_runs=True,
          description="current PyTorch (torch >= 2.11) eager, as partita's runtime runs it: SDPA dispatches "
                      "cuDNN flash attention on Hopper, FlashAttention-2 on Ampere (16-bit); async TP "
                      "(torch.compile + symmetric memory) overlaps TP collectives, priced but not run by partita"),
    Stack(name="megatron-2021", sp_saves_shard=True, fused_saves=("norm",), attention="flash2",
          description="Megatron-LM / Megatron-DeepSpeed 2021-22 (PyTorch 1.x, apex fused kernels): attention "
                      "unfused, its scores materialised (the models say attention='math')"),
    Stack(name="flash-2023", eager_elementwise=True, sp_batch_first=True, attention="flash2",
          description="PyTorch 2.0-2.4 with FlashAttention-2 (the flash-attn package or SDPA's flash backend): "
                      "fms-fsdp, torchtitan 2024, Meta's Llama 3 training"),
    Stack(name="pytorch-fa2", eager_elementwise=True, sp_batch_first=True, attention="flash2", tp_comm_overlap=True,
          tp_overlap_backward=False, constants="flash-2023",
          description="PyTorch 2.5-2.10 eager: SDPA runs FlashAttention-2 on every GPU (cuDNN attention was opt-in "
                      "from 2.5.1, pytorch#138522, and SDPA's first choice again only with cuDNN >= 9.15, torch "
                      ">= 2.11), or the flash-attn 2 package; async TP (torch.compile + symmetric memory) where the "
                      "run used it: torchtitan 2025. The same kernels as flash-2023, and its fitted constants"),
    Stack(name="triton-2023", eager_elementwise=True, sp_batch_first=True, attention="flash_triton", gemm="flash-2023",
          description="MosaicML Composer + llm-foundry 2023 (torch 1.13-2.1), MPT with attn_impl 'triton', the "
                      "default of llm-foundry's benchmark scripts: FlashAttention written in Triton (flash-attn's "
                      "flash_attn_triton, or llm-foundry's copy of it), not the CUDA FlashAttention-2; GEMMs as "
                      "flash-2023 (PyTorch's cuBLAS)"),
    Stack(name="te-2024", sp_saves_shard=True, fused_saves=("norm", "gate"), attention="cudnn", tp_comm_overlap=True,
          p2p_overlap=True,
          description="NVIDIA's Transformer Engine kernels (Megatron-Core, NeMo, NeMo AutoModel; 2024-25): "
                      "cuDNN fused attention, TP communication overlap (userbuffers), overlapped pipeline "
                      "sends, distributed optimizer"),
    Stack(name="te-2024-flash2", sp_saves_shard=True, fused_saves=("norm", "gate"), attention="flash2",
          tp_comm_overlap=True, p2p_overlap=True, gemm="te-2024",
          description="te-2024 with cuDNN's fused attention turned off (NVTE_FUSED_ATTN=0), as NVIDIA's "
                      "dgxc-benchmarking GPT-3 175B and Nemotron-4 340B recipes run: Transformer Engine calls "
                      "the flash-attn package's FlashAttention-2; overlaps and distributed optimizer as te-2024"),
    Stack(name="flash1-2022", fused_saves=("norm",), attention="flash1",
          description="flash-attn 0.2's training scripts (2022; Dao-AILab/flash-attention training/): "
                      "FlashAttention-1, fused dense + GELU MLP, fused dropout-add-LayerNorm, fused cross-entropy; "
                      "PyTorch Lightning DDP or torch's ZeroRedundancyOptimizer"),
]}
KERNELS = ("eager", "compiled")
"""How the training program runs its operators: eager PyTorch (partita's runtime), or torch.compile'd
(costmodel.price.fusion prices the fused kernels). Here, beside the stacks, so that what reads the names (the
command line's flags) does not import the fusion pricing and its graph library."""
DEFAULT_STACK = "pytorch"


def get_stack(name: str | None) -> Stack:
    try:
        return STACKS[name or DEFAULT_STACK]
    except KeyError:
        raise PartitaError(f"unknown software stack {name!r}; stacks: {', '.join(STACKS)}") from None
