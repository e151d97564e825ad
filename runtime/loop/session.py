"""One training run under a plan: shared by the `partita.runtime.train` entry point and the Python API (runtime.api).

`prepare` runs on every rank before any process group exists: the plan's pre-flight checks, the data
source, the fault switch, and the checkpoint to resume from (validated), so a bad plan, data file or
checkpoint stops the run with one line before the first step. `execute` trains inside the process
group, in named steps: build and parallelize the model (`_build`), load the checkpoint (`_resume`), run the
steps (`_train`: runtime.loop.trainer's loop with the run's hooks -- the plan's sync mode, the test faults,
progress lines, checkpoints every `checkpoint_every` N > 0 steps and after the last), measure (`_measure`),
and (--verify) compare with single-process training (runtime.verify.run.check_run), then report (`_report`).

Each step (runtime.loop.trainer): forward and backward of this rank's data-parallel slice
(runtime.parallel.apply), the loss averaged over dp (one all-reduce), a non-finite loss stops the run before
the optimizer step (NonFiniteLoss), then the optimizer step between the sync mode's hooks (runtime.loop.sync).
The training recipe (runtime.loop.recipe.Recipe, `recipe_of`: weight decay, the lr schedule, clipping by the global
gradient norm, runtime.loop.clip) is a hook of the same loop (trainer.RecipeHook), positioned at the resumed step;
--verify's reference and the verification pass train with it too. With `save_final`, the trained weights are
saved after the run as one plain state dict, or an HF model's save_pretrained folder (runtime.checkpoint.final),
before --verify's checks.

--verify (runtime.verify.checks): every rank trains, rank 0 also trains the unpartitioned reference, and the run's
losses and final parameters are compared with it; a bf16 run also gets an fp32 verification pass of the
same layout (runtime.verify.run.verification_pass), which is what is judged tightly. Every rank computes
the same checks (the reference's losses are broadcast, parameter differences all-reduced), so all return the
same code.

Resuming: with `resume`, or on a torchrun restart (TORCHELASTIC_RESTART_COUNT > 0) when a checkpoint
directory is given, training continues from the latest complete checkpoint there (from step 0 if there
is none yet). Batches depend only on (seed, step), so the continued run sees the batches the
uninterrupted one would have, whatever the plan and world size.
"""
from __future__ import annotations

import dataclasses
import gc
import os
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from partita.costmodel import PartitaError, model_fingerprint
from partita.costmodel.models import ModelSpec, with_seq
from partita.planner.plan import Plan
from partita.planner.plan.explain import batch_coupling_warning
from partita.runtime.launcher.flags import RECIPE_FLAGS
from partita.runtime.launcher.inputs import option_errors, output_errors, outputs_of
from partita.runtime import checkpoint as ckpt
from partita.runtime.parallel import ep as expert_parallel
from partita.runtime.parallel import batchnorm
from partita.runtime.loop import memory
from partita.runtime.parallel.apply import make_executor, make_plan_optimizer, settle_ddp_buckets
from partita.runtime.launcher.checks import build_meta, dropout_probability, optimizer_name, preflight  # noqa: F401
from partita.runtime.loop.console import STDOUT, stderr_line
from partita.runtime.data import make_data
from partita.runtime.checkpoint import ownership
from partita.runtime.failure.faults import ENV as FAULT_ENV, Faults, parse as parse_faults
from partita.runtime.launcher.mesh import Topology, backend_for, env_world, init
from partita.runtime.failure.guards import (EXIT_ERROR, EXIT_NONFINITE, EXIT_OK, EXIT_VERIFY, NonFiniteLoss,  # noqa: F401
                                    NonFiniteParameters, Stopped, keep_partial)
from partita.runtime.checkpoint.resume import Candidates, candidates, start_checkpoints
from partita.runtime.checkpoint.recovery import identity, recover, snapshots_off, snapshots_on
from partita.runtime.checkpoint.snapshot import node_dir
from partita.runtime.launcher.sizes import check_sizes
from partita.runtime.failure.stop import StopSignal
from partita.runtime.failure.hang import hang_watch
from partita.runtime.loop.evaluate import EvalHook, refusal as eval_refusal
from partita.runtime.loop.progress import Progress, summary_writer
from partita.runtime.checkpoint.final import consolidated_state, folder_refusal, loader, save_final, trained_module
from partita.runtime.loop.recipe import Recipe, recipe_of
from partita.runtime.loop.sync import make_hook as make_sync_hook
from partita.runtime.loop.trainer import (CheckpointHook, FaultHook, History, ProgressHook, RecipeHook, SnapshotHook,
                                         Trainer)
from partita.runtime.loop.report import RunResult, preamble, render
from partita.runtime.verify.checks import Check, failures
from partita.runtime.loop.options import RunOptions
from partita.runtime.loop.profile import profile_hooks
from partita.runtime.loop.stepping import allreduce, build, measure_step, pp_group
from partita.runtime.verify.run import check_run


@dataclass
class CheckedResult(RunResult):
    """A RunResult with --verify's checks (runtime.verify.checks.Check): `verified` is whether all of them passed."""

    checks: list[Check] = field(default_factory=list)

    @property
    def verified(self) -> bool | None:
        if self.reference_losses is None:
            return None
        return all(c.passed for c in self.checks) if self.checks else super().verified

    def to_json(self) -> dict:
        return {**super().to_json(), "checks": [c.as_dict() for c in self.checks]}

    @property
    def failure(self) -> str:
        """One line naming what diverged ("verify FAILED: ..."), or "" when every check passed."""
        return failures(self.checks)

    def report_lines(self) -> list[str]:
        """The checks beyond the run's losses (which `render` prints) and the verdict, naming what diverged."""
        if self.reference_losses is None:
            return []
        elementwise = ([f"verify: max |parameter - reference| = {self.param_max_abs_diff:.2e} (elementwise, "
                        "reported, not judged)"] if self.param_max_abs_diff is not None else [])
        return elementwise + [c.line() for c in self.checks[1:]] + [failures(self.checks) or "verify: OK"]

    def for_render(self) -> RunResult:
        """The plain RunResult `render` takes: its verify line is the run's loss check alone, and the
        parameter differences are printed by `report_lines`."""
        plain = RunResult(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RunResult)})
        plain.param_max_abs_diff = None
        return plain


@dataclass
class Prepared:
    notes: list[str] = field(default_factory=list)
    data: object = None
    eval_data: object = None
    resume: ckpt.Checkpoint | None = None
    """The newest checkpoint that passed the pre-flight checks; execute then takes the newest intact one."""
    metadata: object = None
    candidates: Candidates | None = None
    """Checkpoints a continuing run may resume from (runtime.checkpoint.resume), newest first; None: not continuing."""
    attempt: int = 0
    device_note: str | None = None
    """The plan was priced for another kind of device (`device_note`): printed by rank 0 before training,
    and kept in the report's notes."""
    elastic: object = None
    """runtime.launcher.elastic.Choice: the plan set's plan for this round's size (an elastic job), else None."""


def attempt_number() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def at_seq_len(spec: ModelSpec, seq: int | None) -> ModelSpec:
    """The model at the plan's sequence length `seq` (its `train.seq_len`), the one source of it: a MODEL
    string names a model whose default length may differ from the `--seq` it was planned at (presets,
    gpt:/llama: families, hf: models). A model of fixed shape is returned as it is; the pre-flight check
    then names the mismatch."""
    if seq is None or spec.seq_len is None or seq == spec.seq_len:
        return spec
    try:
        return with_seq(spec, seq)
    except PartitaError:
        return spec


def device_note(plan: Plan, world: int, device: torch.device | None = None) -> str | None:
    """One line when the plan was priced for another kind of device than the one this run uses (a GPU
    plan on CPU processes, or a CPU plan on GPUs): its predicted step time and memory are of that device."""
    planned = plan.cluster.get("device")
    if not planned:
        return None
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if (planned == "cpu") == (device.type == "cpu"):
        return None
    count = plan.cluster.get("num_devices") or plan.mesh.world_size
    here = (f"{world} CPU process(es) ({backend_for(device)})" if device.type == "cpu"
            else f"{world} GPU(s) ({torch.cuda.get_device_name(device)}, {backend_for(device)})")
    return (f"note: this plan was made for {count} x {planned}; running it on {here}: its predicted step time "
            "does not apply here")


def _batchnorm_notes(plan: Plan, spec: ModelSpec, opts: RunOptions) -> list[str]:
    model = build_meta(spec)
    if opts.sync_batchnorm and not batchnorm.batchnorm_layers(model):
        return ["note: --sync-batchnorm: the model has no BatchNorm layer"]
    line = batchnorm.note(model, plan.mesh.dp * plan.mesh.cp, plan.schedule.num_microbatches, opts.sync_batchnorm)
    return [line] if line else []


def prepare(plan: Plan, spec: ModelSpec, opts: RunOptions, world: int, local_ranks: int | None = None,
            look_at_devices: bool = True) -> Prepared:
    """Every check that can fail before training (PartitaError, one line). No process group needed.
    `local_ranks`: the ranks on this host (default: torchrun's LOCAL_WORLD_SIZE, else `world`);
    `look_at_devices`: False in the launcher, which must not initialise CUDA (no `device_note`)."""
    _check_options(spec, opts)
    prep = Prepared(notes=preflight(plan, spec, world) + recipe_of(opts).notes(), attempt=attempt_number())
    prep.notes += expert_parallel.check_run(plan, spec, opts.checkpoint_dir, opts.verify)
    prep.device_note = device_note(plan, world) if look_at_devices else None
    _make_data(plan, spec, opts, prep)
    check_sizes(plan, spec, prep.data, local_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    parse_faults(os.environ.get(FAULT_ENV))
    prep.notes += _run_notes(plan, spec, opts)
    continuing = opts.resume or (prep.attempt > 0 and bool(opts.checkpoint_dir))
    if opts.checkpoint_dir and opts.checkpoint_every:  # a run that writes checkpoints (runtime.checkpoint.ownership)
        ownership.refuse_foreign(opts.checkpoint_dir, continuing)
        ownership.check_writable(opts.checkpoint_dir)
    if continuing:
        _find_resume(plan, spec, opts, prep)
    return prep


def _check_options(spec: ModelSpec, opts: RunOptions) -> None:
    """The run's options and output paths, each refused with one line (PartitaError)."""
    data_file = opts.data if isinstance(opts.data, (str, os.PathLike)) else None
    errors = option_errors(lr=opts.lr, seed=opts.seed, **{name: getattr(opts, name) for name in RECIPE_FLAGS}) + \
        output_errors(**outputs_of(opts), inputs={"the --data file": data_file})
    if errors:
        raise PartitaError(errors[0])
    if opts.save_final and (why := folder_refusal(opts.save_final, spec)):
        raise PartitaError(why)
    if opts.steps < 1:
        raise PartitaError("--steps must be at least 1")
    if opts.checkpoint_every < 0:
        raise PartitaError("--checkpoint-every must be >= 0")
    if opts.keep < 0:
        raise PartitaError("--keep must be >= 0")
    if (opts.checkpoint_every or opts.resume) and not opts.checkpoint_dir:
        raise PartitaError(f"{'--resume' if opts.resume else '--checkpoint-every'} needs --checkpoint-dir")


def _make_data(plan: Plan, spec: ModelSpec, opts: RunOptions, prep: Prepared) -> None:
    """The training data and the held-out data into `prep`, and their notes."""
    # a token file's content digest (checkpoints record it, resumes and the nodes compare it): one rank per node
    prep.data = make_data(spec, plan.train["global_batch"], opts.seed, opts.data, opts.data_dtype,
                          hash_content=env_world()[1] == 0)
    if why := eval_refusal(opts):
        raise PartitaError(why)
    if opts.eval_data is not None:
        prep.eval_data = make_data(spec, plan.train["global_batch"], opts.seed, opts.eval_data, opts.data_dtype,
                                   hash_content=False)
    prep.notes += [*prep.data.notes, *(prep.eval_data.notes if prep.eval_data is not None else ())]


def _run_notes(plan: Plan, spec: ModelSpec, opts: RunOptions) -> list[str]:
    """What the run should know before it starts: dropout under --verify, BatchNorm, a coupled batch, restarts."""
    notes = []
    if opts.verify and (p := dropout_probability(spec)):
        notes.append(f"note: the model has dropout (p={p:g}): a parallel layout draws its random masks in "
                     "another order than one process, so --verify can fail on a correct plan; verify with "
                     "dropout off")
    notes += _batchnorm_notes(plan, spec, opts)
    if (coupled := batch_coupling_warning(plan)) is not None:  # a contrastive loss split across ranks
        notes.append(coupled)
    if opts.tensorboard:
        summary_writer()  # one line now if tensorboard is missing, not after the first step
    if opts.max_restarts and not opts.checkpoint_dir:
        notes.append("note: --max-restarts without --checkpoint-dir: a restarted attempt trains from step 0")
    elastic = os.environ.get("TORCHELASTIC_MAX_RESTARTS")
    if opts.max_restarts and elastic is not None and int(elastic) != opts.max_restarts:
        notes.append(f"note: --max-restarts {opts.max_restarts}, but torchrun allows {elastic} restarts")
    return notes


def _find_resume(plan: Plan, spec: ModelSpec, opts: RunOptions, prep: Prepared) -> None:
    """A continuing run's checkpoints into `prep`: the candidates, and the newest as the one to resume from."""
    prep.candidates = candidates(plan, spec, opts.checkpoint_dir, opts.steps, prep.data.describe())
    if not prep.candidates.found:
        prep.notes.append(f"no checkpoint in {opts.checkpoint_dir} yet: training from step 0")
        return
    newest = prep.candidates.found[0]
    prep.resume, prep.metadata = newest.checkpoint, newest.metadata
    prep.notes += newest.notes
    if changed := recipe_of(opts).changes_since(newest.checkpoint.manifest.get("recipe")):
        prep.notes.append(f"note: the training recipe differs from the one checkpoint {newest.checkpoint.path} "
                          f"trained with ({', '.join(changed)}): from its step on the run follows this one")


def _manifest(plan: Plan, spec: ModelSpec, opts: RunOptions, data, fingerprint: str) -> dict:
    return {"model": {"name": spec.name, "fingerprint": fingerprint},
            "train": {"global_batch": plan.train["global_batch"], "seq_len": spec.seq_len,
                      "optimizer": optimizer_name(plan), "dtype": plan.train.get("dtype") or "fp32", "lr": opts.lr},
            "seed": opts.seed, "data": data.describe(), "recipe": recipe_of(opts).record(),
            "world_size": plan.mesh.world_size,
            "plan": {"mesh": asdict(plan.mesh), "zero_stage": plan.zero_stage, "schedule": asdict(plan.schedule)}}


def throughput_unit(plan: Plan, spec: ModelSpec) -> tuple[str, int]:
    """("tokens", tokens per step) for a model with a sequence length, else ("samples", the global batch): the
    plan's unit too (planner.plan.explain)."""
    if spec.seq_len:
        return "tokens", plan.train["global_batch"] * spec.seq_len
    return "samples", plan.train["global_batch"]


def _header(plan: Plan, spec: ModelSpec, opts: RunOptions, topo: Topology, data) -> str:
    m, s = plan.mesh, plan.schedule
    micro = f"{s.num_microbatches} micro-batch{'es' if s.num_microbatches > 1 else ''} of {s.micro_batch_size}"
    # one pipeline rank runs no schedule: its micro-batches are gradient accumulation
    sched = (f"{s.name}{f' v={s.virtual_stages}' if s.virtual_stages > 1 else ''}, {micro}" if m.pp > 1 else
             micro + (" (gradient accumulation)" if s.num_microbatches > 1 else ""))
    src = data.describe()
    where = {"file": f"tokens of {src.get('path')}", "dataset": f"dataset {src.get('factory')}"}.get(src["kind"],
                                                                                                 "synthetic data")
    batch = f"{plan.train['global_batch']} x {spec.seq_len} tokens" if spec.seq_len else f"{plan.train['global_batch']} samples"
    return (f"partita run: {spec.name} on {m.world_size} rank(s) (pp={m.pp} dp={m.dp}{f' ep={m.ep}' if m.ep > 1 else ''}{f' cp={m.cp}' if m.cp > 1 else ''} tp={m.tp}, "
            f"{sched}, zero_stage {plan.zero_stage}, "
            f"{plan.train.get('dtype') or 'fp32'}, {optimizer_name(plan)}), {dist.get_backend()}/{topo.device.type}, "
            f"global batch {batch} ({where}), {opts.steps} steps" + _recipe_line(recipe_of(opts), optimizer_name(plan))
            + _COMPILING * (plan.kernels == "compiled"))


_COMPILING = ("\ncompiling the plan's layers with torch.compile: the first step includes it (a minute or more on a CPU), "
              "and the time left is estimated without it")
"""Said under the header of a plan with compiled kernels: the first progress line comes only after compiling."""


def _recipe_line(recipe: Recipe, optimizer: str) -> str:
    """The recipe's line under the header when it is more than one learning rate (--losses-out records it always)."""
    return "" if recipe.plain else "\n" + recipe.describe(optimizer)


def execute(plan: Plan, spec: ModelSpec, opts: RunOptions, prep: Prepared) -> tuple[RunResult, int]:
    """Train under the plan on this rank (every rank calls it); returns (result, exit code: 0, or 1 when
    --verify found a difference). Raises NonFiniteLoss, Stopped (a signal asked to stop), or PartitaError
    raised alike on every rank. Holds the checkpoint directory's lock (rank 0) while it trains, and the stop
    signals' handlers unless the entry point installed them (runtime.failure.stop)."""
    topo = init(plan)
    stop, lock = StopSignal.current, None
    own_stop = stop is None
    if own_stop:
        stop = StopSignal().install()
    try:
        run_id, lock, notes = start_checkpoints(opts, prep, topo)
        return _execute(plan, spec, opts, prep, topo, stop, run_id, notes)
    finally:
        ownership.release(lock)
        if own_stop:
            stop.restore()


@dataclass
class _Built:
    """What `_execute`'s steps hand each other: the parallelized model, its optimizer, the parameter names of the
    unpartitioned model (--verify compares by them) and its fingerprint (checkpoints record it)."""

    executor: object
    opt: torch.optim.Optimizer
    names: list
    fingerprint: str
    saved: memory.SavedActivations | None = None

    def release(self) -> None:
        """Drop the run's model and optimizer (a bf16 run's verification pass builds its own copy)."""
        self.executor = self.opt = self.saved = None
        gc.collect()


def _execute(plan: Plan, spec: ModelSpec, opts: RunOptions, prep: Prepared, topo: Topology, stop: StopSignal,
             run_id: str | None, notes: list[str]) -> tuple[RunResult, int]:
    """The run's named steps: build, resume, train (the step loop), measure, verify, report."""
    notes = list(prep.notes) + ([prep.device_note] if prep.device_note else []) + notes
    built = _build(plan, spec, opts, topo)
    manifest = {**_manifest(plan, spec, opts, prep.data, built.fingerprint), "run_id": run_id}
    notes += [f"note: --snapshot-every is off: {why}"] if (why := snapshots_off(plan, opts)) else []
    history, before = _resume(plan, opts, built, prep, notes, manifest, topo)
    if prep.elastic is not None and before is not None and topo.rank == 0:
        from partita.runtime.launcher.elastic import replanned_line
        per_node, in_memory = int(os.environ.get("LOCAL_WORLD_SIZE") or plan.mesh.world_size), \
            prep.resume is None or history.start != prep.resume.step
        if line := replanned_line(prep.elastic, before, history.start, per_node, in_memory):
            stderr_line(line)
    faults = Faults(topo.rank, opts.checkpoint_dir)
    if history.start:
        settle_ddp_buckets(built.executor, prep.data, topo, history.start)
    built.saved = memory.SavedActivations(built.executor.params)
    if topo.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(topo.device)
    if topo.rank == 0 and opts.print_report:  # before training: the progress lines and the report come after
        first = [prep.device_note] if prep.device_note else []  # first of all, as the run's own preamble
        STDOUT.line(preamble(_header(plan, spec, opts, topo, prep.data), [n for n in notes if n not in first], first))
    _train(plan, spec, opts, prep, topo, stop, manifest, built, history, faults)
    result = _measure(plan, spec, opts, prep, topo, run_id, notes, built, history)
    if opts.save_final or opts.return_model:  # before check_run, which may release the model (a bf16 run's verify)
        state = consolidated_state(built.executor, topo)  # gathered once (a collective): whole on rank 0, else None
        if opts.save_final:
            written = save_final(opts.save_final, state, spec)  # (tensors, bytes) on rank 0
            result.saved_final = opts.save_final
            result.final_loader = loader(opts.save_final, spec) if written is not None else None
        if opts.return_model:
            result.model = trained_module(state, spec)
    code = check_run(result, plan, spec, opts, prep.data, topo, built)
    _report(result, plan, opts, topo)
    return result, code


def _build(plan: Plan, spec: ModelSpec, opts: RunOptions, topo: Topology) -> _Built:
    """The model built as on every rank, parallelized under the plan (runtime.parallel.apply), and its optimizer."""
    model = build(spec, opts, topo)
    fingerprint = model_fingerprint(model)
    names = [(n, p.shape) for n, p in model.named_parameters()]
    executor = make_executor(model, plan, topo, spec)
    del model
    opt = make_plan_optimizer(executor, plan, opts.lr, optimizer_name(plan), opts.weight_decay)
    return _Built(executor=executor, opt=opt, names=names, fingerprint=fingerprint)


def _resume(plan: Plan, opts: RunOptions, built: _Built, prep: Prepared, notes: list[str], manifest: dict,
            topo: Topology) -> tuple[History, int | None]:
    """Load the state the run continues from, if any: the nodes' snapshots in memory where they are newer than the
    checkpoint on disk (runtime.checkpoint.recovery), else the checkpoint. The loop's history starts at its step,
    standing on the checkpoint. Returns it and the size of the world that wrote the state (None: a fresh start)."""
    disk = prep.resume
    history = History(start=disk.step, kept=[(disk.step, str(disk.path))], resumed_from=str(disk.path)) if disk \
        else History()
    if (opts.resume or prep.attempt > 0) and snapshots_on(plan, opts):
        got, why = recover(built.executor.modules, built.executor.params, built.opt, history.start, manifest,
                           topo.device)
        notes += [n for n in (why, got and got.note) if n]
        if got is not None:
            history.start, history.resumed_from = got.step, f"the snapshot of step {got.step} in the nodes' memory"
            return history, got.world_size
    if disk is not None and (note := ckpt.load(disk, prep.metadata, built.executor.modules, built.executor.params,
                                                built.opt)):
        notes.append(note)
    return history, disk.manifest.get("world_size") if disk is not None else None


def _train(plan: Plan, spec: ModelSpec, opts: RunOptions, prep: Prepared, topo: Topology, stop: StopSignal,
           manifest: dict, built: _Built, history: History, faults: Faults) -> None:
    """The step loop (runtime.loop.trainer) with the run's hooks: the plan's sync mode, the test faults, the
    progress lines, the checkpoints. A run that fails after training began keeps its losses (keep_partial)."""
    executor, opt = built.executor, built.opt
    unit, per_step = throughput_unit(plan, spec)
    progress = Progress(opts.steps, history.start, per_step, unit, console=topo.rank == 0 and opts.print_report,
                        every=opts.log_every, tensorboard=opts.tensorboard if topo.rank == 0 else None)
    watch = hang_watch(opts.hang_timeout, topo.rank)
    sync = make_sync_hook(plan.sync, executor, topo, opt)
    if prep.resume is not None:
        sync.load_state(prep.resume.path)
    hooks = [*([watch] if watch else []),
             sync,
             RecipeHook(opt, recipe_of(opts), history.start, executor, pp_group(topo), history),
             FaultHook(faults, executor.params),
             *([watch.after_loss()] if watch else []),
             ProgressHook(progress, topo.device), *profile_hooks(opts.profile_out, opts.steps, topo),
             *([EvalHook(executor, prep.eval_data, topo, opts.steps, opts.eval_every, opts.eval_batches,
                         history.evals, topo.rank == 0 and opts.print_report)] if prep.eval_data is not None else []),
             CheckpointHook(history, opts.checkpoint_every, opts.steps, opts.checkpoint_dir, executor, opt, manifest,
                            topo, faults, opts.keep, sync),
             *([SnapshotHook(opts.snapshot_every, opts.steps, node_dir(), executor, opt, {**identity(manifest),
                 "world_size": plan.mesh.world_size}, topo)] if snapshots_on(plan, opts) else [])]
    trainer = Trainer(executor=executor, opt=opt, data=prep.data, topo=topo, steps=opts.steps, stop=stop,
                      saved=built.saved, hooks=hooks, checkpointing=bool(opts.checkpoint_every),
                      checkpoint_root=opts.checkpoint_dir if opts.checkpoint_every else None)
    try:
        trainer.run(history)
        sync.close()  # its communication in flight done before the process groups go
    except Exception as e:
        if isinstance(e, (Stopped, NonFiniteLoss, NonFiniteParameters)):  # raised on every rank at one point: the
            sync.close()                                                   # same collectives in flight, landed
        keep_partial(opts, prep, topo, history, manifest["run_id"], e)
        raise
    finally:
        progress.close()
        if watch:
            watch.close()


def _measure(plan: Plan, spec: ModelSpec, opts: RunOptions, prep: Prepared, topo: Topology, run_id: str | None,
             notes: list[str], built: _Built, history: History) -> CheckedResult:
    """The run's result: step times and peak memory, the largest over the ranks (on CPU, the peak of one more
    step under the allocator trace, runtime.loop.stepping.measure_step)."""
    executor, times = built.executor, history.times
    n, unit, per_step = len(times), *throughput_unit(plan, spec)
    # RSS before the extra step
    tracked, step_memory, rss = history.state_bytes + built.saved.peak, None, memory.peak_rss_bytes()
    reserved = torch.cuda.max_memory_reserved(topo.device) if topo.device.type == "cuda" else 0
    if topo.device.type == "cuda":
        peak, method = torch.cuda.max_memory_allocated(topo.device), memory.GPU_METHOD
    elif opts.memory_trace and n:
        step_memory = measure_step(executor, built.opt, prep.data, topo, opts.steps - 1, warm=n < 2)
        step_memory.tracked_bytes = tracked
        peak, method = step_memory.peak_bytes, memory.ALLOCATOR_METHOD
    else:
        peak, method = tracked, memory.CPU_METHOD
    maxed = allreduce(times + [peak, rss, tracked, reserved], dist.ReduceOp.MAX, topo.device)
    result = CheckedResult(losses=history.losses, step_times=maxed[:n], peak_memory_bytes=int(maxed[n]),
                           memory_method=method, peak_rss_bytes=int(maxed[n + 1]), tokens_per_step=per_step,
                           unit=unit, peak_reserved_bytes=int(maxed[n + 3]) if topo.device.type == "cuda" else None,
                           applied={**asdict(executor.applied), "summary": executor.applied.summary()},
                           notes=notes, first_step=history.start,
                           resumed_from=history.resumed_from, attempt=prep.attempt,
                           checkpoints=history.saves, checkpoint_time_s=history.save_time, run_id=run_id,
                           recipe=recipe_of(opts).describe(optimizer_name(plan)),
                           learning_rates=history.learning_rates, eval_losses=history.evals,
                           grad_norms=history.grad_norms if opts.clip_grad_norm is not None else None)
    # beside RunResult's fields (runtime/loop/report.py): the tracked figure (largest rank), and this rank's
    # allocator breakdown of the traced step (None when the figure is not the allocator's)
    result.tracked_memory_bytes = int(maxed[n + 2])
    result.memory_detail = step_memory.as_dict() if step_memory is not None else None
    return result


def _report(result: CheckedResult, plan: Plan, opts: RunOptions, topo: Topology) -> None:
    """Rank 0 prints the report and writes --losses-out."""
    if topo.rank != 0:
        return
    if opts.print_report:
        STDOUT.line(render(result.for_render(), None, plan.predicted), *result.report_lines())
    if opts.losses_out:
        import json
        with open(opts.losses_out, "w") as f:
            json.dump({**result.to_json(), "tracked_memory_bytes": result.tracked_memory_bytes,
                       "memory_detail": result.memory_detail}, f, indent=2)
