"""The simulator's one error type."""


class SimulationError(Exception):
    """A simulation could not run as asked; the message says what to change."""
