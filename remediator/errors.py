"""The error vocabulary: what went wrong, and what retrying means for it.

Where it sits: at the bottom, beside ``contracts`` and ``subjects``. Adapters (Kubernetes, the node agent's
client, NVML), the state and audit stores and the executor raise subclasses of these; ``bus.settle`` is the
one place that maps them onto a message:

- ``Conflict``: lost a race to another writer (KV revision, audit chain head, Kubernetes 409) -- nak after
  ``delay`` (or the configured delay), logged in one line;
- ``TemporaryError``: not now (an API, the bus or an agent is unavailable) -- the same;
- ``PermanentError``: retrying cannot help (bad input, forbidden, an unknown name) -- dead letter at once;
- anything else is a bug -- nak with a traceback, dead letter after ``max_deliver``.

Nothing here imports anything of the project.
"""

from __future__ import annotations

__all__ = ["Conflict", "PermanentError", "RemediatorError", "SetupError", "TemporaryError"]


class RemediatorError(Exception):
    """Base of every error the project raises on purpose."""


class TemporaryError(RemediatorError):
    """Retry later: ``delay`` seconds from now (None: the consumer's configured delay)."""

    def __init__(self, message: str = "", *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class Conflict(TemporaryError):
    """Another writer won a compare-and-set (KV revision, audit chain head, Kubernetes 409) too often in a row;
    a redelivery re-reads and decides again."""


class PermanentError(RemediatorError):
    """Retrying cannot help: the message goes to the dead-letter subject and is terminated."""


class SetupError(RemediatorError):
    """A process cannot start, or a command cannot do its work, because of how it was set up: a missing
    kubeconfig, an unprovisioned bus, an unreachable server. The message is one line that names the flag or
    setting that fixes it; the command line prints just that (the traceback only with ``--debug``)."""
