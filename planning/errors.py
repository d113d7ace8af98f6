class PlanningError(Exception):
    """A planning input or action refused, with a message that says what to change."""
