"""Adapters: the edges where the service touches the outside world.

Where it sits: at the bottom, under the executor, its step library and the safety rails, which reach them
through the protocols of ``playbooks.ports``. ``kube`` is the only module in the project that imports
``kubernetes`` (``ratelimit`` is its client-side token bucket); its ``AsyncKube`` is the async port the
service awaits, hopping once onto its own thread pool. ``agent`` is the request side of the node agents'
command subject, beside it. ``nvml`` is the only module that imports ``pynvml`` (the node agent's).
Everything above receives plain dicts, ``contracts.Change`` and ``contracts.JobRef``, never a client
library's model objects or exceptions; what they raise subclasses ``remediator.errors``, so ``bus.settle``
knows whether to retry (import-linter enforces the imports).
"""
