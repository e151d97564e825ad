"""The options of one training run (`RunOptions`: the worker's flags, runtime.launcher.flags) and the training
recipe they make (`recipe_of`); runtime.loop.session takes them."""
from __future__ import annotations

from dataclasses import dataclass

from partita.runtime.loop.progress import DEFAULT_EVERY
from partita.runtime.loop.recipe import Recipe


@dataclass
class RunOptions:
    steps: int = 10
    seed: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_decay: str = "none"
    min_lr_ratio: float = 0.1
    clip_grad_norm: float | None = None
    """The training recipe (runtime.loop.recipe.Recipe: the fields of the same names)."""
    save_final: str | None = None
    """Where rank 0 saves the trained weights: a file gets one plain state dict, a folder (ending in "/" or an
    existing directory) an HF model's save_pretrained output (runtime.checkpoint.final)."""
    return_model: bool = False
    """Hand the trained model back in RunResult.model on rank 0: the module the model builder makes, in one
    process, with the consolidated trained weights (runtime.api.run's `return_model`)."""
    verify: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    max_restarts: int = 0
    data: object = None
    """A token file, a `package.module:factory` of a dataset, or a dataset itself (runtime.data)."""
    data_dtype: str | None = None
    losses_out: str | None = None
    sync_batchnorm: bool = False
    """BatchNorm normalises over the whole data-parallel batch (runtime.parallel.batchnorm)."""
    log_every: int = DEFAULT_EVERY
    """A progress line after every N-th step (runtime.loop.progress; 0: none)."""
    tensorboard: str | None = None
    """A directory rank 0 writes TensorBoard scalars into."""
    keep: int = 0
    """With checkpoint_every: keep only the newest `keep` checkpoints of this run (0: all)."""
    eval_data: object = None
    """Held-out data, as `data` (runtime.loop.evaluate); None: no evaluation."""
    eval_every: int = 0
    eval_batches: int = 1
    hang_timeout: float | None = None
    """Seconds without progress after which a rank is a failure (runtime.failure.hang); None: not watched."""
    print_report: bool = True
    memory_trace: bool = True
    """On CPU, measure the peak memory of a training step with the allocator trace (runtime.loop.stepping.measure_step):
    one extra step after the run, whose effects are undone. Off: the tracked figure (runtime/loop/memory.py)."""


def recipe_of(opts: RunOptions) -> Recipe:
    """The run's training recipe (runtime.loop.recipe), from its options."""
    return Recipe(lr=opts.lr, steps=opts.steps, weight_decay=opts.weight_decay, warmup_steps=opts.warmup_steps,
                  lr_decay=opts.lr_decay, min_lr_ratio=opts.min_lr_ratio, clip_grad_norm=opts.clip_grad_norm)
