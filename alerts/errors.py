from core.errors import DomainError


class AlertError(DomainError):
    """A refusal of the alerts app, with a message that says what to fix."""
