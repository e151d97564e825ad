"""Which checkpoint a run continues from, and taking its checkpoint directory (runtime.loop.session's helpers).

Continuing (--resume, or a torchrun restart with a checkpoint directory) looks at the directory's committed
checkpoints newest first and takes the newest intact one of the run that owns the directory:

1. `candidates` (every rank, before any process group; also `partita run`'s one-process pre-flight): each
   checkpoint's manifest, file sizes and DCP metadata (runtime.checkpoint.validate). A damaged one is
   skipped, one written by another run than the directory's owner is skipped; one that does not fit this
   run (another model, another optimizer, nothing left to train) stops the run in one line.
   `common_candidates` (all ranks together): only the checkpoints every rank found go on, so that every
   rank calls the next step's collectives alike.
2. `choose_intact` (all ranks together, in the process group): the content hashes of the newest candidate's
   files (runtime.checkpoint.integrity), then the next one's if they differ -- so a resume loads only bytes it saved.

Each skipped checkpoint is named in one line beside the one resumed from. With no intact checkpoint left
the run stops (CheckpointError) rather than start again from step 0 in a directory of damaged ones.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field

import torch.distributed as dist

from partita.costmodel import model_fingerprint
from partita.costmodel.models import ModelSpec
from partita.planner.plan import Plan
from partita.runtime import checkpoint as ckpt
from partita.runtime.checkpoint import integrity, ownership
from partita.runtime.launcher.checks import build_meta, optimizer_name
from partita.runtime.loop.console import STDOUT
from partita.runtime.launcher.mesh import Topology, broadcast_text, gather_text


@dataclass
class Candidate:
    checkpoint: ckpt.Checkpoint
    metadata: object
    notes: list[str] = field(default_factory=list)
    """validate's notes (another global batch, other data ...)."""


@dataclass
class Candidates:
    found: list[Candidate] = field(default_factory=list)
    """Checkpoints that passed the cheap checks, newest first."""
    skipped: list[str] = field(default_factory=list)
    """Why each newer checkpoint is not resumed from (one line each, "checkpoint DIR/step-N ...")."""


def candidates(plan: Plan, spec: ModelSpec, root: str, steps: int, data: dict | None) -> Candidates:
    """Step 1 of the module docstring. Raises CheckpointError when checkpoints exist and none is usable."""
    owner = ownership.owner_run_id(root)
    meta = build_meta(spec)
    fingerprint, out = model_fingerprint(meta), Candidates()
    for path in reversed(ckpt.steps(root)):
        try:
            c = ckpt.open_checkpoint(path)
            run = c.manifest.get("run_id")
            if owner is not None and run is not None and run != owner:
                out.skipped.append(f"checkpoint {path} was written by run {run}, not by run {owner}, which owns {root}")
                continue
            md, notes = ckpt.validate(c, meta, fingerprint, spec.name, optimizer_name(plan), steps, plan.train, data)
        except ckpt.DamagedCheckpoint as e:
            out.skipped.append(str(e))
            continue
        out.found.append(Candidate(c, md, notes))
    if out.skipped and not out.found:
        raise ckpt.CheckpointError(f"{out.skipped[0]}; no older intact checkpoint is in {root} to resume from")
    return out


def common_candidates(found: Candidates, root: str) -> Candidates:
    """Collective: the candidates every rank found, newest first. Each rank listed and read the directory
    alone (step 1); a checkpoint one rank cannot see (a shared filesystem that shows a new directory to one
    node before another) or cannot read is passed over with a note, and rank 0's skipped notes are kept.
    Without this, ranks with different lists would call `choose_intact`'s collectives a different number
    of times, or pick different checkpoints."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return found
    listed = [[p for p in text.split("\n") if p] for text in
              gather_text("\n".join(str(c.checkpoint.path) for c in found.found))]
    keep = {p for p in listed[0] if all(p in other for other in listed[1:])}
    passed = [f"checkpoint {p}: rank {next(r for r, other in enumerate(listed) if p not in other)} could not read "
              "it" for p in sorted({p for other in listed for p in other} - keep, reverse=True)]
    if passed and not keep:
        raise ckpt.CheckpointError(f"{passed[0]}; no checkpoint every rank can read is in {root} to resume from")
    # every rank orders by step (runtime.checkpoint.steps), so keeping a subset keeps the order
    return Candidates(found=[c for c in found.found if str(c.checkpoint.path) in keep],
                      skipped=[*broadcast_text("\n".join(found.skipped)).splitlines(), *passed])


def choose_intact(found: Candidates, root: str, topo: Topology) -> tuple[Candidate | None, list[str]]:
    """Step 2 (collective): the newest candidate whose files match their content hashes, and one note per
    checkpoint passed over. Every rank returns the same."""
    skipped = list(found.skipped)
    for c in found.found:
        bad = integrity.mismatched(c.checkpoint.path, c.checkpoint.manifest["files"], topo.rank,
                                   dist.get_world_size(), topo.device)
        if not bad:
            return c, [f"{why}: resuming from {c.checkpoint.path}, the newest intact checkpoint" for why in skipped]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        skipped.append(f"checkpoint {c.checkpoint.path}: file {bad[0]}{more} does not match its content hash "
                       "(changed since it was saved)")
    if skipped:
        raise ckpt.CheckpointError(f"{skipped[0]}; no older intact checkpoint is in {root} to resume from")
    return None, []


def claim_directory(root: str, continuing: bool, topo: Topology) -> tuple[str, int | None]:
    """Collective: global rank 0 takes the directory (runtime.checkpoint.ownership.claim) and tells every rank the run
    id, or the one-line refusal every rank then raises. Returns (run id, rank 0's lock descriptor)."""
    text, fd = None, None
    if topo.rank == 0:
        try:
            run_id, fd = ownership.claim(root, continuing)
            text = json.dumps({"run_id": run_id})
        except ckpt.CheckpointError as e:
            text = json.dumps({"error": str(e)})
    answer = json.loads(broadcast_text(text))
    if "error" in answer:
        raise ckpt.CheckpointError(answer["error"])
    return answer["run_id"], fd


def start_checkpoints(opts, prep, topo: Topology) -> tuple[str | None, int | None, list[str]]:
    """Collective, before the model is built: take the checkpoint directory (a run that writes checkpoints),
    clear saves that never finished, and pick the newest intact checkpoint to resume from (runtime.checkpoint.resume).
    `opts`, `prep`: runtime.loop.session's RunOptions and Prepared (`prep.resume` and its notes become the chosen
    checkpoint's). Returns (run id, rank 0's lock descriptor, notes); the notes naming skipped checkpoints are
    printed now."""
    if not opts.checkpoint_dir:
        return None, None, []
    continuing = opts.resume or prep.attempt > 0
    run_id, lock, notes = ownership.owner_run_id(opts.checkpoint_dir), None, []
    try:
        if opts.checkpoint_every:
            run_id, lock = claim_directory(opts.checkpoint_dir, continuing, topo)
            if topo.rank == 0:
                for stale in ckpt.incomplete(opts.checkpoint_dir):
                    shutil.rmtree(stale, ignore_errors=True)
                    notes.append(f"removed {stale}: a checkpoint save that never finished")
        newest = prep.candidates.found[0] if prep.candidates is not None and prep.candidates.found else None
        if prep.candidates is not None:
            prep.candidates = common_candidates(prep.candidates, opts.checkpoint_dir)
        if prep.candidates is not None and prep.candidates.found:
            chosen, skipped = choose_intact(prep.candidates, opts.checkpoint_dir, topo)
            if chosen.checkpoint is not prep.resume:
                prep.notes = [n for n in prep.notes if newest is None or n not in newest.notes] + chosen.notes
            prep.resume, prep.metadata = chosen.checkpoint, chosen.metadata
            notes += skipped
            if topo.rank == 0 and opts.print_report and skipped:
                STDOUT.line(*skipped)
    except BaseException:
        ownership.release(lock)
        raise
    return run_id, lock, notes
