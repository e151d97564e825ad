"""Field metadata that makes a dataclass field a command-line flag: the help the front door shows and how it
parses the text (runtime.launcher.flags.dataclass_flags generates the flag from the field and this). It lives in
the lowest layer so that every layer's option dataclasses -- the planner's TrainConfig and SearchSpace, the
runtime's RunOptions -- say it the one same way."""
from __future__ import annotations


def flag(help: str, **how) -> dict:
    """A field's flag, as field metadata. `how`: option (default --the-field-name), dest (the parsed name,
    default the field's), type (parses the text), metavar, choices, required, group (WHAT_IF, or none: the
    main group), form (turns the parsed value into the field's: a tuple of one, on/off into a bool)."""
    return {"help": help, **how}


def no_flag(why: str) -> dict:
    """Metadata of a field that has no flag (the Python API's alone), and why."""
    return {"no_flag": why}
