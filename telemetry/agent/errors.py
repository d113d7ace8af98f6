"""The agent's one error family: each carries a message an operator can act on."""


class AgentError(Exception):
    """Base for errors that stop the agent from starting."""


class BackendUnavailable(AgentError):
    """The chosen backend cannot read GPUs on this host."""


class ExecutorUnavailable(AgentError):
    """The chosen executor cannot act on this host (no credentials, no tool)."""


class MappingUnavailable(AgentError):
    """A chosen allocation mapping cannot work on this host (no scontrol, no credentials)."""
