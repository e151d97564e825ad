"""The flags of a run, defined once: `partita run` (partita/cli.py), the launcher and worker entry point
`python -m partita.runtime.train`, and the Python API's `runtime.launch` all read RUN_FLAGS, generated from
RunOptions' fields (runtime.loop.options: each field's default, help, metavar and choices).

`partita run` parses them with no defaults (None: not given), so it forwards only what the user gave, and
the worker's defaults -- RunOptions' -- apply once, in one place. The launcher turns
parsed values back into a worker's argv with `to_argv`, from this table, never from argparse's internals.
Torch-free: the CLI imports it to build its parser.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from partita.runtime.launcher.elastic import DEFAULT_RESCALE_EVERY, node_count

from partita.runtime.loop.options import RunOptions


@dataclass(frozen=True)
class Flag:
    dest: str
    help: str
    type: type | None = None
    """int, float or str: takes a value; None: a switch (store_true)."""
    default: object = None
    """The worker's default, as RunOptions has it (a switch's is False)."""

    def __post_init__(self):
        if self.type is None:
            object.__setattr__(self, "default", False)
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    required: bool = False
    name: str | None = None
    """The option's name when it is not the dest's (TrainConfig.seq_len is --seq)."""

    @property
    def option(self) -> str:
        return "--" + (self.name or self.dest).replace("_", "-")


MODEL = Flag("model", "model preset or MODEL string, e.g. tiny-gpt", str, None, "MODEL", required=True)
"""The model a run trains: `partita run`, the worker entry point and `partita export --to slurm` take it."""

RECIPE_FLAGS = ("weight_decay", "warmup_steps", "lr_decay", "min_lr_ratio", "clip_grad_norm")
"""The flags of the training recipe (runtime.loop.recipe.Recipe's fields but lr and steps)."""

NODE_FLAGS = (
    Flag("nnodes", "number of nodes, each running this same command (default 1); MIN:MAX with a plan set "
         "(`partita plan --nnodes MIN:MAX --out DIR`): an elastic job that re-plans and goes on when nodes are lost "
         "or join (runtime.launcher.elastic)", node_count, None, "N|MIN:MAX"),
    Flag("rdzv_endpoint", "c10d rendezvous endpoint: a free port on one of the nodes, the same on every node",
         str, None, "HOST:PORT"),
    Flag("rdzv_id", "job id, the same on every node (default: partita)", str, None, "ID"),
    Flag("rdzv_timeout", "seconds to wait for every node to join, printing progress meanwhile (default 300)",
         float, None, "S"),
    Flag("rescale_every", "elastic jobs: a node that joins is taken in at most once per S seconds, so that a "
         f"flapping node does not restart the job again and again (default {DEFAULT_RESCALE_EVERY:g})", float, None,
         "S"),
)


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flags: tuple[Flag, ...],
              given_only: bool) -> None:
    """Add `flags` to `parser`. `given_only`: every default None (a switch False), so what was not given is
    not forwarded and the worker's default applies."""
    for f in flags:
        if f.type is None:
            parser.add_argument(f.option, dest=f.dest, action="store_true", help=f.help)
        else:
            parser.add_argument(f.option, dest=f.dest, type=f.type, default=None if given_only else f.default,
                                metavar=f.metavar, choices=f.choices, help=f.help,
                                **({"required": True} if f.required else {}))


def to_argv(values, flags: tuple[Flag, ...]) -> list[str]:
    """The command-line form of `values` (a parsed namespace, or a dict) for `flags`: a switch when True, a
    value when not None."""
    get = values.get if isinstance(values, dict) else (lambda name: getattr(values, name, None))
    argv: list[str] = []
    for f in flags:
        value = get(f.dest)
        if f.type is None:
            argv += [f.option] if value else []
        elif value is not None:
            argv += [f.option, str(value)]
    return argv


def names(flags: tuple[Flag, ...]) -> set[str]:
    return {f.dest for f in flags}


def select(flags: tuple[Flag, ...], *dests: str) -> tuple[Flag, ...]:
    """The flags of `flags` named `dests`, in that order (a command that takes some of a table's flags)."""
    by_dest = {f.dest: f for f in flags}
    return tuple(by_dest[d] for d in dests)


def dataclass_flags(cls, *, skip: tuple[str, ...] = (), group: str | None = None) -> tuple[Flag, ...]:
    """One flag per field of the dataclass `cls` in `group` (its metadata's "group"; None: the fields without
    one), but `skip` and fields marked as having none ("no_flag" in their metadata), generated from the field:
    its default, and from its metadata its help, and where given its option name ("option"), the name it is
    parsed into ("dest", where the field's name is another flag's: SparseInputs.optimizer), parser ("type"),
    metavar, choices and whether it is required. Without a parser the type is the choices' or the annotation's
    (int, float or str, optional or not; a bool without choices is a switch). A field without help is refused,
    so a new option cannot reach the command line undocumented, nor be left off it unsaid."""
    import dataclasses
    import typing
    hints = typing.get_type_hints(cls)
    flags = []
    for field in dataclasses.fields(cls):
        meta = field.metadata
        if field.name in skip or "no_flag" in meta or meta.get("group") != group:
            continue
        if "help" not in meta:
            raise TypeError(f"{cls.__name__}.{field.name} has no help in its metadata: say what the flag does "
                            "(or why there is none)")
        kind = meta.get("type") or (type(meta["choices"][0]) if meta.get("choices") else None) or next(
            (t for t in (bool, int, float, str) if hints[field.name] in (t, t | None)), None)
        if kind is None:
            raise TypeError(f"{cls.__name__}.{field.name}: a {hints[field.name]} field has no flag form "
                            "(give its metadata a type that parses the text)")
        default = None if field.default is dataclasses.MISSING else field.default
        flags.append(Flag(meta.get("dest", field.name), meta["help"], None if kind is bool else kind, default,
                          meta.get("metavar"), tuple(meta["choices"]) if meta.get("choices") else None,
                          bool(meta.get("required")), meta.get("option")))
    return tuple(flags)


def given_fields(cls, values, *, group: str | None = ...) -> dict:
    """The fields of `cls` whose flags (`dataclass_flags`) were given in `values` (a parsed namespace), each as
    the field holds it (the metadata's "form" applied: a tuple of one, on/off as a bool): the keyword arguments
    that build `cls` from a command line. `group`: only that group's fields (default: every group)."""
    import dataclasses
    found = {}
    for field in dataclasses.fields(cls):
        meta = field.metadata
        if "help" not in meta or (group is not ... and meta.get("group") != group):
            continue
        value = getattr(values, meta.get("dest", field.name), None)
        if value is None or value is False:
            continue
        found[field.name] = meta["form"](value) if "form" in meta else value
    return found


RUN_FLAGS = dataclass_flags(RunOptions)
"""`partita run`'s and the worker's flags: one per RunOptions field but the Python API's own (no_flag)."""
