"""The options of one training run (`RunOptions`), and with them the flags of `partita run`, the worker entry point
`python -m partita.runtime.train` and the Python API: runtime.launcher.flags generates RUN_FLAGS from these fields
and their metadata (help, metavar, choices), so an option and its flag are one definition. Torch-free: the CLI
reads it to build its parser. runtime.loop.session takes the options; runtime.loop.recipe makes the training
recipe of them (`recipe_of`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from partita.costmodel.fields import flag, no_flag

DEFAULT_LOG_EVERY = 10
"""A progress line after every this many steps, by default (runtime.loop.progress)."""
DATA_DTYPES = ("uint16", "uint32")
"""Token types of a raw --data file (runtime.data.DTYPES' keys; tests/runtime/test_run_flags.py checks)."""
LR_DECAYS = ("none", "cosine", "linear")
"""The learning-rate shapes after the warm-up (runtime.loop.recipe.Recipe.lr_factor)."""
FILE_OR_FACTORY = "FILE|MODULE:FACTORY"


@dataclass
class RunOptions:
    steps: int = field(default=10, metadata=flag("training steps (default 10)", metavar="N"))
    verify: bool = field(default=False, metadata=flag(
        "also train in one process and compare the losses and final parameters"))
    data: object = field(default=None, metadata=flag(
        "token file (.npy, or raw little-endian uint16/uint32 tokens), or package.module:factory returning a dataset "
        "(torch or HuggingFace, map-style or iterable) whose items are one row of a batch, a tuple or a dict keyed by "
        "the model's input names; default: synthetic batches", type=str, metavar=FILE_OR_FACTORY))
    """A token file, a `package.module:factory` of a dataset, or a dataset itself (runtime.data)."""
    data_dtype: str | None = field(default=None, metadata=flag("token type of a raw --data file (default uint16)",
                                                               choices=DATA_DTYPES))
    checkpoint_dir: str | None = field(default=None, metadata=flag("where DCP checkpoints are written and resumed "
                                                                   "from", metavar="DIR"))
    checkpoint_every: int = field(default=0, metadata=flag(
        "save a checkpoint after every N steps and after the last (default 0: never)", metavar="N"))
    resume: bool = field(default=False, metadata=flag(
        "continue from the newest intact checkpoint in DIR (under this plan, whatever plan wrote it); a run without it "
        "refuses a DIR holding checkpoints"))
    keep: int = field(default=0, metadata=flag("keep only the newest N checkpoints of this run (default 0: all)",
                                               metavar="N"))
    """With checkpoint_every: keep only the newest `keep` checkpoints of this run (0: all)."""
    snapshot_every: int = field(default=0, metadata=flag(
        "after every N steps keep a copy of the training state in the nodes' memory (each byte once, and again on "
        "the next node), so that a failure resumes from it when it is newer than the checkpoint on disk (default 0: "
        "none)", metavar="N"))
    """Snapshots in memory (runtime.checkpoint.snapshot) after every N-th step; 0: none."""
    max_restarts: int = field(default=0, metadata=flag(
        "torchrun restarts the job up to K times after a failure; it resumes from the latest checkpoint (default 0)",
        metavar="K"))
    hang_timeout: float | None = field(default=None, metadata=flag(
        "a rank that makes no progress for S seconds during training (paused, stuck, or waiting in a collective a peer "
        "never joins) ends the attempt as a failure naming the rank and where it stopped; --max-restarts restarts it "
        "from the newest checkpoint (default: not watched)", metavar="S"))
    """Seconds without progress after which a rank is a failure (runtime.failure.hang); None: not watched."""
    seed: int = field(default=0, metadata=flag("seed of the model's initialisation and the synthetic batches "
                                               "(default 0)"))
    lr: float = field(default=1e-3, metadata=flag("learning rate (default 1e-3); the peak one with --warmup-steps or "
                                                  "--lr-decay"))
    weight_decay: float = field(default=0.0, metadata=flag(
        "AdamW's decoupled weight decay of the weight matrices; biases and norms are not decayed (default 0.0)",
        metavar="W"))
    warmup_steps: int = field(default=0, metadata=flag(
        "raise the learning rate linearly from lr/(N+1) to lr over the first N steps (default 0)", metavar="N"))
    lr_decay: str = field(default="none", metadata=flag(
        "after the warm-up, decay the learning rate to --min-lr-ratio x lr at the last step (default none)",
        choices=LR_DECAYS))
    min_lr_ratio: float = field(default=0.1, metadata=flag(
        "the learning rate at the last step under --lr-decay, as a fraction of lr (default 0.1)", metavar="R"))
    clip_grad_norm: float | None = field(default=None, metadata=flag(
        "scale the gradients so that the whole model's L2 norm is at most X (default: no clipping)", metavar="X"))
    """With lr .. clip_grad_norm: the training recipe (runtime.loop.recipe.Recipe: the fields of the same names)."""
    eval_data: object = field(default=None, metadata=flag(
        "held-out data (what --data takes): its loss, forward only, after the last step and every --eval-every steps",
        type=str, metavar=FILE_OR_FACTORY))
    """Held-out data, as `data` (runtime.loop.evaluate); None: no evaluation."""
    eval_every: int = field(default=0, metadata=flag(
        "evaluate on --eval-data after every N steps too (default 0: after the last only)", metavar="N"))
    eval_batches: int = field(default=1, metadata=flag(
        "global batches of --eval-data per evaluation, the same ones each time (default 1)", metavar="K"))
    losses_out: str | None = field(default=None, metadata=flag(
        "write losses, learning rates, grad norms, reference, step time and memory as JSON", metavar="FILE"))
    profile_out: str | None = field(default=None, metadata=flag(
        "time the last step's operators with torch.profiler and write rank 0's table as JSON (self time per "
        "operator, the device's on a GPU); that step runs slower by the profiler's overhead", metavar="FILE"))
    """Where rank 0 writes the last step's operator times (runtime.loop.profile)."""
    save_final: str | None = field(default=None, metadata=flag(
        "after the last step, rank 0 saves the trained weights: to a FILE as one state dict of the model's own "
        "parameter names (torch.save; load it with model.load_state_dict); to a DIR/ (a path ending in '/', or an "
        "existing directory) for a transformers model (hf:...) as its save_pretrained output (config and "
        "safetensors weights; load it with AutoModelFor....from_pretrained(DIR))", metavar="FILE|DIR/"))
    """Where rank 0 saves the trained weights: a file gets one plain state dict, a folder (ending in "/" or an
    existing directory) an HF model's save_pretrained output (runtime.checkpoint.final)."""
    sync_batchnorm: bool = field(default=False, metadata=flag(
        "BatchNorm normalises over the whole data-parallel batch (SyncBatchNorm), as one process does"))
    """BatchNorm normalises over the whole data-parallel batch (runtime.parallel.batchnorm)."""
    log_every: int = field(default=DEFAULT_LOG_EVERY, metadata=flag(
        "print a progress line (step, loss, step time, tokens or samples/s, memory, ETA) every N steps (default "
        f"{DEFAULT_LOG_EVERY}; 0: none); on a terminal a progress bar", metavar="N"))
    """A progress line after every N-th step (runtime.loop.progress; 0: none)."""
    tensorboard: str | None = field(default=None, metadata=flag(
        "write the per-step scalars for TensorBoard into DIR (pip install 'partita[tensorboard]')", metavar="DIR"))
    """A directory rank 0 writes TensorBoard scalars into."""
    return_model: bool = field(default=False, metadata=no_flag("the Python API's: a module cannot be printed"))
    """Hand the trained model back in RunResult.model on rank 0: the module the model builder makes, in one
    process, with the consolidated trained weights (runtime.api.run's `return_model`)."""
    print_report: bool = field(default=True, metadata=no_flag("the Python API's: the CLI always reports"))
    memory_trace: bool = field(default=True, metadata=no_flag("tests measure a step's memory either way"))
    """On CPU, measure the peak memory of a training step with the allocator trace (runtime.loop.stepping.measure_step):
    one extra step after the run, whose effects are undone. Off: the tracked figure (runtime/loop/memory.py)."""
