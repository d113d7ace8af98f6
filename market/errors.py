from core.errors import DomainError


class MarketError(DomainError):
    """A market operation was refused or could not complete. The message says what to fix."""


class RoundBusy(MarketError):
    """Another worker holds the round (it is clearing or settling it); try again later."""


class RoundMissing(MarketError):
    """There is no round with the id given."""
