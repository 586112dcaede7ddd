"""Adapters: the edges where the service touches the outside world.

Where it sits: at the bottom, under the executor's step library and the safety rails. ``kube`` is the only
module in the project that imports ``kubernetes`` (``ratelimit`` is its client-side token bucket); ``nvml``
is the only one that imports ``pynvml``. Everything above receives plain dicts and frozen dataclasses,
never a client library's model objects or exceptions (import-linter enforces the imports).
"""
