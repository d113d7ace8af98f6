from core.errors import DomainError


class PlanningError(DomainError):
    """A planning input or action refused, with a message that says what to change."""
