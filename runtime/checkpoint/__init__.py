"""Checkpoints with torch.distributed.checkpoint (DCP): saved under one plan, loadable under any other.

Layout of `--checkpoint-dir DIR`:

    DIR/step-00000004/          a complete checkpoint after 4 optimizer steps
        __0_0.distcp ...        DCP shards, one file per rank
        .metadata               DCP's index (global shapes, which file holds which chunk)
        partita.json            manifest: format, step, run id, model fingerprint, train config, seed, data,
                                the plan it was saved under, and the size and SHA-256 of every file above
    DIR/.partita-digests/step-00000004.sha256
                                the SHA-256 of step-00000004/partita.json (`sha256sum -c` reads it in DIR): the
                                manifest is checked against it, so an entry edited or removed in it is seen
    DIR/.step-00000006.tmp/     a save in progress (or one that crashed): never read
    DIR/partita-run.json        the run that owns DIR; DIR/.partita.lock: held while it trains (runtime.checkpoint.ownership)

What is saved: the model state dict under "model.<fqn>" and each parameter's optimizer state under
"optim.<param fqn>.<key>" (AdamW's step, exp_avg, exp_avg_sq), keyed by the user's FQNs whatever the plan
(FSDP2 and tensor-parallel parameters as DTensors, pipeline stages each their own names, data-parallel
replicas once; under ZeRO-1 each by the rank that owns it, runtime.parallel.zero1), so DCP reshards on load: a checkpoint of 4 ranks under one mesh loads into 2 ranks under
another, or into one process. The step is the data position too (batches depend on (seed, step) only).
Hyperparameters (lr, betas, the recipe) come from the run's flags and plan, not from the checkpoint: the lr
schedule is a function of the step (runtime.loop.recipe), so it needs no state of its own.

Each rank's random number generators are saved too, under "rng.rank<R>.cpu" (torch's default CPU
generator) and "rng.rank<R>.cuda" (the current CUDA device's, when there is one), and restored on resume
when the checkpoint was written by as many ranks -- so a model with dropout draws the masks an
uninterrupted run would have drawn, and resumes bit-exactly. Under another world size the ranks' draws
do not correspond, and the generators are left as seeded (`load` says so).

Atomic save: every rank writes into the temporary directory beside the target; once DCP has finished
(all shards and .metadata), rank 0 writes the manifest into it and renames it to `step-<k>`. A crash at
any point before the rename leaves only a `.tmp` directory, which resume ignores (and the next save
removes, whatever is at that name), so the last complete checkpoint stays intact. `latest()` is the complete
checkpoint with the highest step. What rank 0 does to the directory alone (make the temporary directory, write
the manifest, rename, prune) is a collective step (`_rank0_step`): a failure there -- a directory turned
read-only, a full disk, a `step-N` name taken by a file or a symlink -- ends every rank with the same one
line, as DCP's own failures do. DIR must be one directory for all ranks (a shared filesystem across nodes).
With `keep` N, a save then removes the run's older checkpoints beyond the newest N.

Before the first step, `validate` checks a checkpoint against the model and plan -- manifest readable and
equal to its recorded digest (the sidecar in DIR/.partita-digests), fingerprint equal, every file present at its
recorded size and no file the manifest does not list, the data the same (a token file by its content
digest, runtime.data.content_digest), DCP's metadata readable (through a
restricted unpickler that admits only DCP's own metadata classes), every model tensor present with its
shape, the same optimizer -- and raises CheckpointError (one line) otherwise: DamagedCheckpoint when the
checkpoint itself is broken (a resume then falls back to an older one, runtime.loop.session), plain
CheckpointError when it does not fit this run. The content hashes are checked by all ranks together
(runtime.checkpoint.integrity) just before loading. DCP's own failures (a CheckpointException, which derives from
BaseException) become one CheckpointError line that names the checkpoint still intact.
"""
from __future__ import annotations

from partita.runtime.checkpoint.layout import (Checkpoint, CheckpointError, DamagedCheckpoint, DIGESTS, FORMAT,
                                               incomplete, latest, MANIFEST, SIDECAR, step_dir, steps, tmp_dir)
from partita.runtime.checkpoint.reading import (manifest_digest, open_checkpoint, read_metadata, sidecar, validate)
from partita.runtime.checkpoint.saving import (atomic_write, dcp_failure, load, model_state, prune,
                                               rng_state, save, train_state)

__all__ = ["atomic_write", "Checkpoint", "CheckpointError", "DamagedCheckpoint", "dcp_failure", "DIGESTS", "FORMAT",
           "incomplete", "latest", "load", "MANIFEST", "manifest_digest", "model_state", "open_checkpoint", "prune",
           "read_metadata", "rng_state", "save", "SIDECAR", "sidecar", "step_dir", "steps", "tmp_dir", "train_state",
           "validate"]
