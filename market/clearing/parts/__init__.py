"""Very large rounds cleared in parts."""
