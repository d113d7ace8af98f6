from core.errors import DomainError


class GovernanceError(DomainError):
    """A change request, approval or rejection was refused. The message says why."""
