"""What the search may choose: the training configuration, the restricted search space, and the
enumeration of meshes (pp x dp x tp, ZeRO stage, micro-batch size) and pipeline schedules it yields.

Meshes are pp x dp x tp = number of devices with tp inside a node (tp | devices per node), pp <= layers,
dp | global batch, a ZeRO stage (0-3, only 0 when dp = 1), and micro-batch sizes b | global_batch / dp
with m = global_batch / (dp b) >= pp micro-batches.
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodel.errors import PartitaError
from costmodel.hardware import Cluster
from planner.options import RECOMPUTE


SCHEDULE_CHOICES = ("auto", "1F1B", "GPipe", "Interleaved1F1B")
VIRTUAL_STAGES = (2, 4)
"""Model chunks per device tried for interleaved 1F1B."""


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """What is trained, and how."""

    global_batch: int
    """Samples per optimizer step, over all data-parallel replicas and micro-batches."""
    seq_len: int | None = None
    """Tokens per sample; None keeps the model's own."""
    dtype: str = "bf16"
    """"bf16" (bf16 parameters and activations, fp32 master weights) or "fp32"."""
    optimizer: str = "adam"
    schedule: str = "auto"
    """Pipeline schedule: "auto" (the planner picks 1F1B or interleaved 1F1B), "1F1B", "GPipe" or
    "Interleaved1F1B"."""
    max_micro_batch: int = 64

    def __post_init__(self):
        if not isinstance(self.global_batch, int) or self.global_batch < 1:
            raise PartitaError(f"global batch must be a positive integer, got {self.global_batch!r}")
        if self.dtype not in ("bf16", "fp32"):
            raise PartitaError(f"dtype {self.dtype!r} not supported; accepted: bf16, fp32 (fp16 would need loss "
                               "scaling, which the runtime does not do)")
        if self.schedule not in SCHEDULE_CHOICES:
            raise PartitaError(f"schedule {self.schedule!r} not supported; accepted: {', '.join(SCHEDULE_CHOICES)}")


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Which choices the search may make (the full space by default)."""

    name: str = "partita"
    tp: tuple[int, ...] | None = None          # None: every divisor of the node size
    pp: tuple[int, ...] | None = None
    zero: tuple[int, ...] = (0, 2, 3)
    """ZeRO stages to consider. Stage 1 is costed (planner.options) but not searched by default: PyTorch
    has no native ZeRO-1 that composes with DTensor tensor parallelism and pipelining, while FSDP2 gives
    stage 3, and stage 2 with reshard_after_forward=False."""
    recompute: tuple[str, ...] = RECOMPUTE
    offload: bool = True
    sequence_parallel: tuple[bool, ...] = (False, True)
    """With tp > 1: plain Megatron tensor parallelism (False) and/or with sequence parallelism (True), a
    choice per candidate (every layer of a candidate has the same activation layout, so no layer pays a
    resharding of its neighbour's output; the embeddings and head pay theirs, planner.strategies)."""
    min_pp: bool = False
    """Keep only the smallest pipeline depth that fits (Megatron practice: as few stages as memory allows)."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _meshes(cluster: Cluster, train: TrainConfig, space: SearchSpace, max_pp: int):
    """Every (pp, dp, tp, ZeRO stage, micro-batch size, micro-batches) the search considers."""
    n = cluster.num_devices
    for tp in divisors(min(n, cluster.devices_per_node)):
        if n % tp or (space.tp is not None and tp not in space.tp):
            continue
        for pp in divisors(n // tp):
            if pp > max_pp or (space.pp is not None and pp not in space.pp):
                continue
            dp = n // (tp * pp)
            if train.global_batch % dp:
                continue
            local = train.global_batch // dp
            for zero in (space.zero if dp > 1 else (0,)):
                for b in divisors(local):
                    m = local // b
                    if b <= train.max_micro_batch and (pp == 1 or m >= pp):
                        yield pp, dp, tp, zero, b, m


def _schedules(requested: str, pp: int, m: int, layers: int) -> list[tuple[str, int]]:
    """(schedule, virtual stages) pairs to try. Interleaving needs m divisible by pp (torch's
    Interleaved1F1B) and at least v layers per device."""
    if pp == 1:
        return [("1F1B", 1)]
    plain = [("GPipe", 1)] if requested == "GPipe" else [("1F1B", 1)]
    inter = [("Interleaved1F1B", v) for v in VIRTUAL_STAGES if m % pp == 0 and layers >= pp * v]
    if requested == "Interleaved1F1B":
        return inter
    return plain + inter if requested == "auto" else plain
