"""The what-if simulator: replay a job trace under a policy with the market's own clearing.

Pure Python (no Django): ``trace_load`` reads a trace and assigns jobs to tenants,
``simulate`` runs the rounds (``policies`` plan, ``realise`` turns plans into gangs),
``summarise`` computes the metrics, ``markdown_table`` and ``goals`` compare policies and
``report_write`` writes the table and the offline plotly report. ``gpumarket simulate`` is
the command line.
"""

from market.simulator.engine import (
    JOB_MODELS,
    JobOutcome,
    RoundRecord,
    SimConfig,
    SimResult,
    simulate,
)
from market.simulator.errors import SimulationError
from market.simulator.metrics import Summary, job_fairness, summarise
from market.simulator.policies import BASELINES, MARKET, POLICIES
from market.simulator.report import report_write
from market.simulator.table import goals, markdown_table
from market.simulator.trace import Job, throughputs_load, trace_load

__all__ = [
    "BASELINES",
    "JOB_MODELS",
    "MARKET",
    "POLICIES",
    "Job",
    "JobOutcome",
    "RoundRecord",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "Summary",
    "goals",
    "job_fairness",
    "markdown_table",
    "report_write",
    "simulate",
    "summarise",
    "throughputs_load",
    "trace_load",
]
