"""gpumarket: a credit market for shared GPU capacity."""

__version__ = "0.1.0"
