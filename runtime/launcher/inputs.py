"""What a run checks of its own inputs before anything launches: numbers torch can take (--lr, --seed), the
paths it will write (--losses-out, --tensorboard), and the environment it is started in.

`partita run` (partita.cli) checks them before it starts its pre-flight; runtime.train (its launcher and its
pre-flight `--check`) and the Python API (runtime.loop.session.prepare) check the same, so every way of starting a
run refuses the same input with the same line -- before the first step, not after the last one.
"""
from __future__ import annotations

import math
import os
import socket
import stat

from partita.planner.plan import one_line

SEED_RANGE = (-2**63, 2**64 - 1)
"""What torch.manual_seed accepts (a negative seed counts modulo 2^64); the data sources derive the seeds of
their generators from it modulo 2^64 too (runtime.data), so every seed in this range trains."""


def _show(value) -> str:
    try:
        text = one_line(repr(value), 200)
    except ValueError:  # an int of more digits than Python converts (sys.get_int_max_str_digits)
        return "a number of thousands of digits"
    return text if len(text) <= 40 else text[:37] + "..."


def _path(path) -> str:
    """A path for an error line: quoted, escaped, whole (up to 300 characters)."""
    return one_line(repr(str(path)), 300)


def _number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def recipe_errors(*, weight_decay=None, warmup_steps=None, lr_decay=None, min_lr_ratio=None,
                  clip_grad_norm=None) -> list[str]:
    """The training recipe's values (runtime.loop.recipe.Recipe) that make no schedule; None: not given. A warm-up
    as long as the run or longer is allowed (the lr then only rises; the run's notes say so)."""
    errors = []
    if weight_decay is not None and not (_number(weight_decay) and weight_decay >= 0):
        errors.append(f"--weight-decay must be a finite number >= 0, got {_show(weight_decay)}")
    if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int)
                                     or warmup_steps < 0):
        errors.append(f"--warmup-steps must be a whole number >= 0, got {_show(warmup_steps)}")
    if lr_decay is not None and lr_decay not in ("none", "cosine", "linear"):
        errors.append(f"--lr-decay must be none, cosine or linear, got {_show(lr_decay)}")
    if min_lr_ratio is not None and not (_number(min_lr_ratio) and 0 <= min_lr_ratio <= 1):
        errors.append(f"--min-lr-ratio must be a number from 0 to 1, got {_show(min_lr_ratio)}")
    if clip_grad_norm is not None and not (_number(clip_grad_norm) and clip_grad_norm > 0):
        errors.append(f"--clip-grad-norm must be a finite number above 0, got {_show(clip_grad_norm)}")
    return errors


def option_errors(*, lr, seed, **recipe) -> list[str]:
    """--lr and --seed values that would only fail in the workers (a NaN learning rate, a seed torch refuses), and
    the recipe's (`recipe_errors`, by its keywords)."""
    errors = []
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        errors.append(f"--lr must be a finite number above 0, got {_show(lr)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        errors.append(f"--seed must be a whole number from -2^63 to 2^64-1 (what torch.manual_seed takes), got "
                      f"{_show(seed)}")
    return errors + recipe_errors(**recipe)


# ---- outputs -----------------------------------------------------------------------------------------------

OUTPUTS = ("losses_out", "tensorboard", "save_final", "profile_out")
"""The run's output options (RunOptions' fields, the flags' dests), which `output_errors` checks."""


def outputs_of(options) -> dict:
    """The OUTPUTS of a RunOptions or of parsed flags, as output_errors' keywords."""
    return {name: getattr(options, name, None) for name in OUTPUTS}


def output_errors(*, losses_out: str | None = None, tensorboard: str | None = None, save_final: str | None = None,
                  profile_out: str | None = None, inputs: dict[str, str | None] | None = None) -> list[str]:
    """What is wrong with the run's output paths, checked before training: --losses-out, --profile-out and a --save-final file
    are files in a writable directory (not the same one), --tensorboard and a --save-final folder
    (`names_folder`) directories that are or can be made writable, and none is one of the run's own inputs
    (`inputs`: {how the line names it: path}, e.g. {"the plan": PLAN, "--data": FILE})."""
    errors = []
    own = {name: path for name, path in (inputs or {}).items() if path and os.path.exists(path)}
    if losses_out:
        errors += _same_as_input("--losses-out", losses_out, own) or _file_errors("--losses-out", losses_out)
    if profile_out:
        errors += _same_as_input("--profile-out", profile_out, own) or _file_errors("--profile-out", profile_out)
    if profile_out and losses_out and os.path.abspath(profile_out) == os.path.abspath(losses_out):
        errors.append(f"--losses-out and --profile-out name the same file {_path(losses_out)}: give each its own")
    if save_final:
        where = _directory_errors if names_folder(save_final) else _file_errors
        errors += _same_as_input("--save-final", save_final, own) or where("--save-final", save_final)
    if save_final and losses_out and os.path.abspath(save_final) == os.path.abspath(losses_out):
        errors.append(f"--losses-out and --save-final name the same file {_path(save_final)}: give each its own")
    if tensorboard:
        errors += _same_as_input("--tensorboard", tensorboard, own) or _directory_errors("--tensorboard", tensorboard)
    if losses_out and tensorboard and os.path.abspath(losses_out) == os.path.abspath(tensorboard):
        errors.append(f"--losses-out and --tensorboard name the same path {_path(losses_out)}: give each its own")
    return errors


def names_folder(path: str | os.PathLike) -> bool:
    """Whether --save-final `path` names a folder -- it ends in a path separator ("out/") or is an existing
    directory -- which gets HuggingFace `save_pretrained` output (runtime.checkpoint.final); else it names a
    file, which gets one torch.save state dict."""
    text = os.fspath(path)
    return text.endswith(("/", os.sep)) or os.path.isdir(text)


def _same_as_input(flag: str, path: str, inputs: dict[str, str]) -> list[str]:
    if not os.path.exists(path):
        return []
    for name, given in inputs.items():
        try:
            same = os.path.samefile(path, given)
        except OSError:
            same = False
        if same:
            return [f"{flag} {_path(path)} is {name} this run reads ({_path(given)}): writing it would overwrite "
                    "it; give another path"]
    return []


def _file_errors(flag: str, path: str) -> list[str]:
    """A file the run writes at its end: not a directory, in a directory that exists and takes a new file; an
    existing regular file opens for writing (a device such as /dev/null is the user's choice)."""
    if os.path.isdir(path):
        return [f"{flag} {_path(path)} is a directory; give a file path, e.g. {_path(os.path.join(path, 'losses.json'))}"]
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        return [f"{flag} {_path(path)}: its directory {_path(parent)} {what}; create it first or give another path"]
    if why := _probe(parent):
        return [f"{flag} {_path(path)}: cannot write in {_path(parent)} ({why}); give a writable path"]
    if os.path.exists(path) and stat.S_ISREG(os.stat(path).st_mode):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # opens without changing it
        except OSError as e:
            return [f"{flag} {_path(path)} cannot be written ({e.strerror}); give a writable path"]
    return []


def _directory_errors(flag: str, path: str) -> list[str]:
    """A directory the run writes into: an existing one takes a new file; one that does not exist yet can be
    made (its nearest existing ancestor is a writable directory)."""
    if os.path.exists(path) and not os.path.isdir(path):
        return [f"{flag} {_path(path)} is a file, not a directory; give a directory (it is created if needed)"]
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return [f"{flag} {_path(path)} cannot be created: {_path(ancestor)} is a file"]
    if why := _probe(ancestor):
        return [f"{flag} {_path(path)}: cannot write in {_path(ancestor)} ({why}); give a writable directory"]
    return []


def _probe(directory: str) -> str | None:
    """Why a new file cannot be made in `directory` (by making and removing one; permission bits do not say
    for root or on a read-only filesystem), or None."""
    probe = os.path.join(directory, f".partita-probe-{socket.gethostname()}-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    return None


# ---- the environment -----------------------------------------------------------------------------------------

WORKER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
"""What torchrun (and deepspeed, accelerate, a Kubeflow PyTorchJob ...) sets for each process it starts: the
environment of a worker, which runtime.launcher.mesh reads to find its place in the job."""


def job_environment_error(environ) -> str | None:
    """A launcher (`partita run`, runtime.train with launcher flags) started with a worker's variables: it would
    take them for its own place in a job it is not part of, and its pre-flight, run as that rank, said
    nothing (only rank 0 reports). One line saying what to do, or None."""
    found = [name for name in WORKER_VARIABLES if name in environ]
    if not found:
        return None
    shown = ", ".join(f"{name}={one_line(environ[name], 40)}" for name in found)
    return (f"{shown} {'is' if len(found) == 1 else 'are'} set, as for one worker of another launcher's job "
            "(torchrun, deepspeed, a PyTorchJob): partita run is itself the launcher and starts the plan's ranks; "
            f"run it outside another launcher, once per node (several nodes: --nnodes N --rdzv-endpoint HOST:PORT), "
            f"or unset {' and '.join(found)}")
