"""A plan in other tools' words: `partita export PLAN --to {slurm,megatron,torchtitan}`.

Pure functions from a loaded Plan to text; nothing here runs, imports the runtime or touches the network.

- `to_slurm`: a bash batch script for `sbatch`. `#SBATCH --nodes` = plan world size / devices per node,
  one task per node; after a one-process pre-flight check (`partita.runtime.train ... --check`), `srun` starts
  `python -m partita.runtime.train PLAN ... --nproc-per-node G --nnodes N --rdzv-endpoint HEAD:PORT --rdzv-id JOB`
  on every node: runtime.train's launcher mode, torchrun's agent for its node with a c10d rendezvous on
  the job's first node (as `partita run --nnodes` does), which reports the first failing rank as one line.
  The plan's path is written into the script, so the plan must be readable at that path on every node
  (a shared filesystem).
- `to_megatron`: Megatron-LM command-line arguments, one per line (names checked against
  megatron/training/arguments.py and the config dataclasses it builds arguments from):
    mesh tp, pp                     --tensor-model-parallel-size, --pipeline-model-parallel-size (dp is
                                    derived by Megatron: world size / (tp pp))
    virtual stages (even layers)    --num-layers-per-virtual-pipeline-stage
    uneven stage layers             --pipeline-model-parallel-layout "Et*5|t*7|...|t*4L" (recent Megatron)
    layers sharded "sequence"       --sequence-parallel
    recompute selective / full      --recompute-granularity selective | full --recompute-method uniform
    (op: as full, noted)
                                    --recompute-num-layers 1; the same count of full layers per stage:
                                    --recompute-method block --recompute-num-layers k
    schedule micro-batch, batch     --micro-batch-size, --global-batch-size; train.seq_len --seq-length
    ZeRO 1 or 2 (and 3, partly)     --use-distributed-optimizer
    overlap tp_comm / p2p           --tp-comm-overlap / --overlap-p2p-communication
    dtype bf16                      --bf16 (fp32 is Megatron's default)
  What has no Megatron-LM equivalent (ZeRO-3 / per-layer ZeRO stages, offload, per-layer mixed recompute
  or tensor sharding, the GPipe schedule) is a line `# partita: ... has no Megatron-LM equivalent: ...`.
- `to_torchtitan`: TOML overrides of torchtitan's job config (the TOML JobConfig of torchtitan up to
  v0.2.2, torchtitan/config/job_config.py; later torchtitan configures in Python with mostly the same
  field names):
    [parallelism] ZeRO 0/1 -> data_parallel_replicate_degree = dp; ZeRO 2 -> data_parallel_shard_degree = dp
                  with fsdp_reshard_after_forward = "never" (parameters stay gathered forward to backward,
                  as partita's ZeRO-2 does with FSDP2); ZeRO 3 -> data_parallel_shard_degree = dp,
                  "always"; tp -> tensor_parallel_degree; pp -> pipeline_parallel_degree, the schedule by
                  name (partita uses torch.distributed.pipelining's names: 1F1B, GPipe, Interleaved1F1B),
                  pipeline_parallel_microbatch_size, module_fqns_per_model_part = the plan's stages
                  enable_async_tensor_parallel = the plan's tensor-parallel overlap (torch's async TP; needs
                  torchtitan's compile)
    [activation_checkpoint] mode none | selective (selective_ac_option "op": partita's op exactly, its
                  selective approximately) | full; full on every n-th
                  layer -> selective with selective_ac_option "n"
    [training]    local_batch_size (per data-parallel rank and optimizer step, or per micro-batch when
                  partita accumulates gradients without a pipeline), global_batch_size, seq_len,
                  mixed_precision_param; offloaded model states on every layer -> enable_cpu_offload
  What has no torchtitan equivalent is a `# partita: ...` comment.
"""
from __future__ import annotations

from partita.export.common import ExportError, layers_per_stage
from partita.export.megatron import to_megatron
from partita.export.slurm import SlurmOptions, to_slurm
from partita.export.torchtitan import to_torchtitan
from partita.planner.plan import Plan

__all__ = ["FORMATS", "ExportError", "SlurmOptions", "export", "layers_per_stage", "to_megatron", "to_slurm",
           "to_torchtitan"]

FORMATS = ("slurm", "megatron", "torchtitan", "torchrec")


def export(plan: Plan, fmt: str, *, plan_path: str = "plan.json", slurm: SlurmOptions | None = None) -> str:
    """The plan as `fmt` (one of FORMATS); `slurm` options are required for, and only for, "slurm"."""
    if fmt == "slurm":
        if slurm is None:
            raise ExportError("--to slurm needs --model MODEL (the model runtime.train builds on every node)")
        return to_slurm(plan, plan_path, slurm)
    if fmt == "megatron":
        return to_megatron(plan)
    if fmt == "torchtitan":
        return to_torchtitan(plan)
    if fmt == "torchrec":
        from partita.export.torchrec import to_torchrec  # a plan's embedding tables
        return to_torchrec(plan)
    raise ExportError(f"unknown export format {fmt!r}; accepted: {', '.join(FORMATS)}")
