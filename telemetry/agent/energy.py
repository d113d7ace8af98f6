"""A cumulative energy counter integrated from power readings.

Used where the hardware has no energy counter of its own (the simulated backend, and GPUs
where NVML reports the energy counter as not supported), so `energy_j` always means the
same thing on the wire: joules since the counter started.
"""

from __future__ import annotations


class EnergyMeter:
    def __init__(self) -> None:
        self._joules = 0.0
        self._last: tuple[float, float] | None = None

    def add(self, *, power_w: float, at_monotonic: float) -> float:
        """Record a power reading; return the cumulative energy in joules.

        Trapezoidal between readings; the first reading only starts the clock.
        """
        if self._last is not None:
            last_power, last_at = self._last
            elapsed = max(at_monotonic - last_at, 0.0)
            self._joules += (last_power + power_w) / 2 * elapsed
        self._last = (power_w, at_monotonic)
        return self._joules
