"""Plausibility bounds on a run's sizes, from what the machine it starts on can hold: checked before launch
(session.prepare, which `partita run`'s pre-flight runs), so a plan whose numbers are each in range but absurd
together is one line naming the field and the bound -- not an allocator traceback in every worker, or a step
that never ends.

- The batch drawn per step: synthetic data builds each step's whole global batch on every rank (the samples
  depend on (seed, step) alone, not on the world size: runtime.data), and a token file draws every sample's
  start offset; every rank of this host holds that at once, so global_batch x its bytes per sample x the
  ranks of this host must fit in this host's memory.
- One micro-batch on one rank: its input tensors, and for a token model its logits (micro_batch_size x
  seq_len / cp x vocabulary / tp for a vocabulary-parallel head, in the plan's dtype), must fit in one
  device's memory (the GPU's; on CPU this host's memory shared by its ranks). Both are lower bounds on what
  a step needs (activations and model states come on top), so a plan that passes may still run out of memory,
  but none that fails could run.
- Micro-batches per step: at most MAX_MICROBATCHES.
- Host memory: what the plan offloads to host memory per rank (`predicted.host_memory_per_stage`, the solver's
  bound against its device's host_memory_bytes) times the ranks of this host must fit in this host's memory. A
  preset's host memory is a datacentre node's share (256 GB per H200); a smaller machine pins what it can and
  then pages: the H200 plan that offloaded 135 GiB of activations on a 128 GiB host ran 4 steps of a predicted
  13 s each in more than 250 s (benchmarks/results/gpu.json, 'largest').
"""
from __future__ import annotations

import math
import os

import torch

from partita.costmodel import ModelSpec
from partita.planner.plan import Plan, PlanError
from partita.runtime.loop.allocator import configure_allocator
from partita.runtime.data import Layout, SyntheticTokens, TokenFile
from partita.runtime.parallel.precision import train_dtype

MAX_MICROBATCHES = 2**16
"""The most micro-batches partita runs in one step. Each is a forward and a backward pass that the ranks run one
after another, so a step costs at least this many times a pass's fixed cost (kernel launches, the schedule's
bookkeeping): 2^20 of them on tiny-gpt took longer than an hour for one step. Published training runs use at
most a few thousand (Megatron-LM's GPT-3 175B: global batch 1,536 over 8 data-parallel ranks, 192)."""


def host_memory() -> int:
    """This host's physical memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_memory(local_ranks: int) -> tuple[int, str]:
    """(bytes, description) of the memory one rank computes in: its GPU's, or on CPU this host's share per rank.
    Asking for a GPU's properties initialises CUDA, so the allocator's configuration is set first, as
    runtime.launcher.mesh.select_device sets it (runtime.loop.allocator: it is read once, when CUDA initialises)."""
    if torch.cuda.is_available():
        configure_allocator(cuda=True)
        props = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        return props.total_memory, f"a {props.name}'s {_gib(props.total_memory)}"
    share = host_memory() // max(1, local_ranks)
    return share, f"this host's {_gib(host_memory())} shared by {local_ranks} rank(s)"


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else "-"


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def sample_bytes(spec: ModelSpec) -> int:
    """Bytes of one sample's input tensors (a token model: its inputs and targets, int64)."""
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in Layout(spec).sample())


def drawn_bytes(data, global_batch: int, spec: ModelSpec) -> int:
    """Bytes each rank draws for a step before taking its own rows (runtime.data): the whole global batch for
    synthetic data, every sample's start offset for a token file, nothing beyond its rows for a dataset."""
    if isinstance(data, SyntheticTokens):
        return global_batch * sample_bytes(spec)
    if isinstance(data, TokenFile):
        return global_batch * 8
    return 0


def check_sizes(plan: Plan, spec: ModelSpec, data, local_ranks: int) -> None:
    """PlanError, one line naming the plan's field and the bound, for sizes this machine cannot run."""
    s, gb = plan.schedule, plan.train["global_batch"]
    per_sample = sample_bytes(spec)
    drawn = drawn_bytes(data, gb, spec)
    if drawn * local_ranks > host_memory():
        fits = host_memory() // (local_ranks * max(1, drawn // gb))
        raise PlanError(f"train.global_batch {gb:,} x train.seq_len {_count(plan.train.get('seq_len'))}: every rank draws "
                        f"a step's {_gib(drawn)} of samples (runtime.data) and {local_ranks} rank(s) share this host's "
                        f"{_gib(host_memory())}: " + (f"a global batch of at most {fits:,} fits" if fits else
                                                      "not one sample fits; lower seq_len"))
    host = max(plan.predicted.get("host_memory_per_stage") or [0])
    if host * local_ranks > host_memory():
        raise PlanError(f"predicted.host_memory_per_stage: a rank keeps up to {_gib(host)} in host memory (its "
                        f"offloaded activations and model states) and {local_ranks} rank(s) share this host's "
                        f"{_gib(host_memory())}: re-plan for this machine (`partita calibrate` writes a resource list "
                        "with its host memory) or with less offload")
    memory, where = device_memory(local_ranks)
    inputs = s.micro_batch_size * per_sample
    logits = logit_bytes(plan, spec)
    if inputs + logits > memory:
        what = f"{_gib(inputs)} of inputs" + (f" and {_gib(logits)} of logits" if logits else "")
        raise PlanError(f"schedule.micro_batch_size {s.micro_batch_size:,} x train.seq_len "
                        f"{_count(plan.train.get('seq_len'))}: one micro-batch holds {what} on a rank, more than "
                        f"{where}: lower micro_batch_size or seq_len, or re-plan")
    if s.num_microbatches > MAX_MICROBATCHES:
        raise PlanError(f"schedule.num_microbatches is {s.num_microbatches:,}, more than the {MAX_MICROBATCHES:,} "
                        "micro-batches partita runs in a step (each a forward and backward pass, one after another): "
                        "raise micro_batch_size, or re-plan")


def logit_bytes(plan: Plan, spec: ModelSpec) -> int:
    """The logits of one micro-batch on a rank for a token model (its output, which the runtime's loss reads:
    runtime.data's "lm" layout); 0 for a model with its own loss."""
    layout = Layout(spec)
    if layout.kind != "lm":
        return 0
    m = plan.mesh
    vocab = -(-layout.vocab // (m.tp if "vocab" in plan.placements.values() else 1))
    tokens = plan.schedule.micro_batch_size * -(-(layout.window - 1) // m.cp)
    return tokens * vocab * train_dtype(plan).itemsize
