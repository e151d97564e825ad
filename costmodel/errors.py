"""User-facing errors.

A `PartitaError` is a mistake in what the user asked for (an unknown model, a malformed cluster string,
a model that cannot fit). Its message says what was wrong and what is accepted; the CLI prints it as one
line and exits with code 2. Internal invariants use `assert`; user input never does.
"""


class PartitaError(Exception):
    """A user error with an actionable message."""


class InfeasibleError(PartitaError):
    """No plan fits in memory; the message says what is needed and what would make it fit."""
