"""Hot reload of the operator rules file while ``serve`` runs: poll, reload, keep the last good rules.

Where it sits: started by the composition root (``remediator.service``) beside the consumers when the setting
``rules_file`` names a file. Every ``rules_poll_s`` it asks the ``handlers.rules.RulesSource`` to reload if the
file changed (modification time or size); dispatch reads ``RulesSource.current()`` for each decision, so new
rules apply from the next event on, without a restart. A file that stops loading is logged with every
``FILE:LINE`` problem and the rules in force stay as they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from handlers.rules import RulesSource

log = logging.getLogger(__name__)


async def watch_rules(source: RulesSource, stop: asyncio.Event, interval_s: float = 5.0) -> None:
    """Reload ``source`` whenever its file changes, until ``stop`` is set."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
        if stop.is_set():
            return
        reloaded = await asyncio.to_thread(source.reload_if_changed)
        rules = source.current()
        if reloaded:
            log.info("rules file %s reloaded: %d signatures, %d overrides", source.path, len(rules.signatures),
                     len(rules.overrides))
        elif source.last_error:
            log.warning("rules file %s not reloaded, the rules in force stay: %s", source.path, source.last_error)
