"""The what-if simulator: replay a job trace under a policy with the market's own clearing.

Pure Python (no Django): ``trace_load`` reads a trace and assigns jobs to tenants,
``simulate`` runs the rounds, ``summarise`` computes the metrics, ``report_write`` writes the
table and the offline plotly report. ``gpumarket simulate`` is the command line.
"""

from market.simulator.engine import JobOutcome, RoundRecord, SimConfig, SimResult, simulate
from market.simulator.errors import SimulationError
from market.simulator.metrics import Summary, markdown_table, summarise
from market.simulator.policies import POLICIES
from market.simulator.report import report_write
from market.simulator.trace import Job, throughputs_load, trace_load

__all__ = [
    "POLICIES",
    "Job",
    "JobOutcome",
    "RoundRecord",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "Summary",
    "markdown_table",
    "report_write",
    "simulate",
    "summarise",
    "throughputs_load",
    "trace_load",
]
