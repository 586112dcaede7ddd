"""The registry of handlers, built from their policies: where each family's configuration joins it.

Where it sits: between the settings and dispatch. The composition root (``remediator.service``) turns the
settings' handler section into ``HandlerPolicies`` (``HandlerPolicies.from_settings``) and builds the
registry it gives the ``Dispatcher`` with ``build_registry``; every ``HandlerSpec`` in it carries its own
policy, which dispatch passes to ``decide``. Tests and tools that do not care about thresholds use
``default_registry()``, the same build from the defaults. Nothing is registered or configured at import,
and two registries with different policies live side by side in one process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from handlers import ecc, memleak, nccl, xid
from handlers.base import HandlerRegistry
from remediator.settings import HandlerSettings

FAMILIES = ("xid", "ecc", "nccl", "memleak")
"""The handler families, in the order the registry lists them (and dispatch calls them)."""


@dataclass(frozen=True)
class HandlerPolicies:
    """One policy per handler family; the defaults are each family's module constants."""

    xid: xid.XidPolicy = field(default_factory=xid.XidPolicy)
    ecc: ecc.EccPolicy = field(default_factory=ecc.EccPolicy)
    nccl: nccl.NcclPolicy = field(default_factory=nccl.NcclPolicy)
    memleak: memleak.MemleakPolicy = field(default_factory=memleak.MemleakPolicy)

    @classmethod
    def from_settings(cls, s: HandlerSettings) -> HandlerPolicies:
        """The policies the settings' ``handlers`` section asks for (``Settings.handlers_view()``)."""
        ttl = timedelta(seconds=s.incident_ttl_s)
        return cls(
            xid=xid.XidPolicy.from_settings(s.xid_app_window_s, s.xid_app_threshold, s.xid_burst_quiet_s,
                                            s.incident_ttl_s),
            ecc=ecc.EccPolicy(
                sbe_rate_per_min=s.ecc_sbe_rate_per_min, sbe_rate_window=timedelta(seconds=s.ecc_sbe_rate_window_s),
                sbe_watch=timedelta(seconds=s.ecc_sbe_watch_s), sbe_min_span=timedelta(seconds=s.ecc_sbe_min_span_s),
                retired_pages_limit=s.ecc_retired_pages_limit, incident_ttl=ttl),
            nccl=nccl.NcclPolicy(
                window=timedelta(seconds=s.nccl_window_s), settle=timedelta(seconds=s.nccl_settle_s),
                min_ranks=s.nccl_min_ranks, early_seq=s.nccl_early_seq, peer_threshold=s.nccl_peer_threshold,
                incident_ttl=ttl),
            memleak=memleak.MemleakPolicy(
                min_used_bytes=s.memleak_min_used_bytes, orphan_for=timedelta(seconds=s.memleak_orphan_for_s),
                growth_bytes_per_min=s.memleak_growth_bytes_per_min,
                growth_window=timedelta(seconds=s.memleak_growth_window_s),
                growth_min_span=timedelta(seconds=s.memleak_growth_min_span_s),
                growth_rising_fraction=s.memleak_growth_rising_fraction, growth_factor=s.memleak_growth_factor,
                incident_ttl=ttl),
        )


def build_registry(policies: HandlerPolicies) -> HandlerRegistry:
    """A new registry of every handler family, each bound to its policy from ``policies``."""
    registry = HandlerRegistry()
    registry.register(xid.DEFINITION.bind(policies.xid))
    registry.register(ecc.DEFINITION.bind(policies.ecc))
    registry.register(nccl.DEFINITION.bind(policies.nccl))
    registry.register(memleak.DEFINITION.bind(policies.memleak))
    return registry


def default_registry() -> HandlerRegistry:
    """A new registry built from the default policies (for tests and tools that do not configure any)."""
    return build_registry(HandlerPolicies())


__all__ = ["FAMILIES", "HandlerPolicies", "build_registry", "default_registry"]
