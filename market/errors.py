class MarketError(Exception):
    """A market operation was refused or could not complete. The message says what to fix."""
