"""Every write in the market, one module per concern (see docs/market.md): import a service
from its module, e.g. ``from market.services.bids import bid_place``; there is no second
name for it here.

Services are keyword-only, typed, run in one transaction each and record their audit event
in it. Refusals raise ``market.errors.MarketError`` with a message a user can act on; a bid
that belongs to another tenant is a 404 (``django.http.Http404``), exactly like a missing one.
"""
