"""The errors a regeneration run raises before or instead of writing records: bad input to the command (exit 2),
as `regen`'s help says, except NoServerError (exit 3)."""

from eagle3lab.io import InputError


class RegenError(InputError):
    """A run cannot start or continue (existing output without --resume, no server reachable, ...)."""


class NoServerError(RegenError):
    """No server of the openai backend answers."""
