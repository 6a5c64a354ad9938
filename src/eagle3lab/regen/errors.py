"""The errors a regeneration run raises before or instead of writing records."""


class RegenError(RuntimeError):
    """A run cannot start or continue (existing output without --resume, no server reachable, ...)."""


class NoServerError(RegenError):
    """No server of the openai backend answers."""
