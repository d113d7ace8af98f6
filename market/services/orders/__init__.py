"""Standing orders, one module per concern: ``terms`` (an order's fields checked), ``lifecycle``
(create, edit, pause, resume, cancel), ``opening`` (the round opener's bulk bids,
``orders_bid``, drawing on each team's ``purses``), ``settling`` (settlement's progress,
``orders_settle``, and a voided round's, ``orders_unsettle``) and ``notices`` (what an order
tells its team). Import each name from its module. The arithmetic of an order's bid and of
incumbency is market/orders.py, shared with the simulator.

Money on an order's bid moves exactly as on a hand-placed bid (available -> escrow when the
round opens, charged or released at settlement) and the same budgets admit it; the ceiling
adds one more bound: what it has spent plus what its bids hold never passes it.
"""
