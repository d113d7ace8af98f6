"""The mechanisms (welfare, fisher, maxmin), the market rules every one obeys, and the registry."""
