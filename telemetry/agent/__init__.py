"""The gpumarket node agent: samples GPUs, posts them, carries out directives.

Pure Python with no Django import, so it runs on GPU nodes that have only the agent's own
dependencies. `main` is what `gpumarket agent` calls.
"""

from telemetry.agent.cli import main
from telemetry.agent.protocol import AGENT_VERSION

__all__ = ["AGENT_VERSION", "main"]
