"""The one exception type raydra raises for mistakes a user can fix."""


class RaydraError(Exception):
    """A user-facing error: its message is one sentence naming the key or path and the fix."""
