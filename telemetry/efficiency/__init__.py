"""Efficiency: GPU-hours paid against GPU-hours used, per team, campaign and day (issue 39).

``selectors`` does the reads; ``views`` the team page and the staff ranking; ``charts`` is
pure (plain data in, plotly figures out)."""
