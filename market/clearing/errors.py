"""The one domain error of the clearing package."""


class ClearingError(ValueError):
    """An instance cannot be cleared; the message names the field and says what to fix."""


class SolverError(ClearingError):
    """The solver ended without a proven result (infeasible, unbounded, numerical trouble)."""
