"""User-facing errors.

A `PartitaError` is a mistake in what the user asked for (an unknown model, a malformed cluster string,
a model that cannot fit). Its message says what was wrong and what is accepted; the CLI prints it as one
line and exits with code 2. Internal invariants use `assert`; user input never does.
"""


class PartitaError(Exception):
    """A user error with an actionable message."""


class InfeasibleError(PartitaError):
    """No plan fits in memory; the message says what is needed and what would make it fit."""


def did_you_mean(given: str, names) -> str:
    """" (did you mean 'llama3-8b'?)" when `given` is a near miss of one of `names` (difflib's ratio >= 0.75,
    case ignored), else "": the start of an unknown-name message, before the list of what is accepted."""
    import difflib
    names = list(names)
    lowered = {n.lower(): n for n in names}
    close = difflib.get_close_matches(given.lower(), list(lowered), n=1, cutoff=0.75)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""
