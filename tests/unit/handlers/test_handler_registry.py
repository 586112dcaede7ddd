"""The handler registry: built from policies, each spec carrying its own; no module globals, no import effects."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

import handlers
from handlers import HandlerPolicies, build_registry, default_registry, ecc, memleak, nccl, xid
from handlers.base import HandlerDefinition, History
from remediator.settings import Settings
from tests.unit.handlers.helpers import GPU_A, at, ev

GIB = 1 << 30


def _held(used: int) -> dict[str, str]:
    return {"used_bytes": str(used), "pod_gone": "true", "pod": "train-7"}


def test_two_registries_in_one_process_keep_their_own_policies() -> None:
    """Old main kept one memory-leak policy per process (``memleak.configure``), so the second registry's
    configuration changed the first one's decisions."""
    fast = build_registry(HandlerPolicies(memleak=memleak.MemleakPolicy(orphan_for=timedelta(seconds=2))))
    slow = default_registry()
    assert fast.specs["memleak"].policy.orphan_for == timedelta(seconds=2)
    assert slow.specs["memleak"].policy.orphan_for == memleak.ORPHAN_FOR

    def verdicts(registry: handlers.base.HandlerRegistry) -> list[bool]:
        spec = registry.specs["memleak"]
        h = History()
        out = []
        for t in (0, 5):
            v = spec.decide(ev("memory_leak", "orphaned_memory", gpu=GPU_A, labels=_held(12 * GIB)), h, at(t),
                            spec.policy)
            out.append(v.decision is not None)
            h = v.history
        return out

    assert verdicts(fast) == [False, True]  # held 5 s, over the 2 s grace
    assert verdicts(slow) == [False, False]  # under the default 10 min
    assert verdicts(fast) == [False, True]  # building the other one changed nothing


def test_default_registry_is_built_fresh_from_the_defaults() -> None:
    a, b = default_registry(), default_registry()
    assert a is not b and a.specs is not b.specs
    assert list(a.specs) == list(handlers.FAMILIES)
    assert {name: s.policy for name, s in a.specs.items()} == {
        "xid": xid.XidPolicy(), "ecc": ecc.EccPolicy(), "nccl": nccl.NcclPolicy(), "memleak": memleak.MemleakPolicy()}


def test_the_settings_defaults_are_the_handlers_defaults() -> None:
    assert HandlerPolicies.from_settings(Settings().handlers_view()) == HandlerPolicies()


@pytest.mark.parametrize(
    ("env", "value", "family", "attr", "expected"),
    [
        pytest.param("INCIDENT_TTL_S", "60", "nccl", "incident_ttl", timedelta(minutes=1), id="incident-ttl"),
        pytest.param("XID_APP_WINDOW_S", "3600", "xid", "app_window", timedelta(hours=1), id="xid-window"),
        pytest.param("XID_APP_THRESHOLD", "5", "xid", "app_threshold", 5, id="xid-threshold"),
        pytest.param("XID_BURST_QUIET_S", "30", "xid", "burst_quiet", timedelta(seconds=30), id="xid-burst"),
        pytest.param("ECC_SBE_RATE_PER_MIN", "2.5", "ecc", "sbe_rate_per_min", 2.5, id="ecc-rate"),
        pytest.param("ECC_SBE_RATE_WINDOW_S", "600", "ecc", "sbe_rate_window", timedelta(minutes=10), id="ecc-window"),
        pytest.param("ECC_SBE_WATCH_S", "120", "ecc", "sbe_watch", timedelta(minutes=2), id="ecc-watch"),
        pytest.param("ECC_SBE_MIN_SPAN_S", "30", "ecc", "sbe_min_span", timedelta(seconds=30), id="ecc-span"),
        pytest.param("ECC_RETIRED_PAGES_LIMIT", "48", "ecc", "retired_pages_limit", 48, id="ecc-retired"),
        pytest.param("NCCL_WINDOW_S", "300", "nccl", "window", timedelta(minutes=5), id="nccl-window"),
        pytest.param("NCCL_SETTLE_S", "10", "nccl", "settle", timedelta(seconds=10), id="nccl-settle"),
        pytest.param("NCCL_MIN_RANKS", "4", "nccl", "min_ranks", 4, id="nccl-ranks"),
        pytest.param("NCCL_EARLY_SEQ", "3", "nccl", "early_seq", 3, id="nccl-early"),
        pytest.param("NCCL_PEER_THRESHOLD", "3", "nccl", "peer_threshold", 3, id="nccl-peer"),
        pytest.param("MEMLEAK_MIN_USED_BYTES", str(GIB // 2), "memleak", "min_used_bytes", GIB // 2, id="leak-used"),
        pytest.param("MEMLEAK_ORPHAN_FOR_S", "2", "memleak", "orphan_for", timedelta(seconds=2), id="leak-orphan"),
        pytest.param("MEMLEAK_GROWTH_BYTES_PER_MIN", "1048576", "memleak", "growth_bytes_per_min", 1 << 20,
                     id="leak-growth"),
        pytest.param("MEMLEAK_GROWTH_WINDOW_S", "3600", "memleak", "growth_window", timedelta(hours=1),
                     id="leak-window"),
        pytest.param("MEMLEAK_GROWTH_MIN_SPAN_S", "600", "memleak", "growth_min_span", timedelta(minutes=10),
                     id="leak-span"),
        pytest.param("MEMLEAK_GROWTH_RISING_FRACTION", "0.5", "memleak", "growth_rising_fraction", 0.5,
                     id="leak-rising"),
    ],
)
def test_every_threshold_is_configurable_from_the_environment(monkeypatch: pytest.MonkeyPatch, env: str, value: str,
                                                              family: str, attr: str, expected: object) -> None:
    monkeypatch.setenv(f"REMEDIATOR_{env}", value)
    registry = build_registry(HandlerPolicies.from_settings(Settings().handlers_view()))
    assert getattr(registry.specs[family].policy, attr) == expected


def test_the_incident_ttl_reaches_every_family() -> None:
    policies = HandlerPolicies.from_settings(Settings(incident_ttl_s=60).handlers_view())
    assert {p.incident_ttl for p in (policies.xid, policies.ecc, policies.nccl, policies.memleak)} == {
        timedelta(minutes=1)}


def test_inconsistent_growth_thresholds_are_refused_by_the_settings() -> None:
    with pytest.raises(ValueError, match="growth_min_span"):
        Settings(memleak_growth_window_s=60, memleak_growth_min_span_s=120)


def test_no_handler_module_keeps_a_policy_of_its_own() -> None:
    for module in (xid, ecc, nccl, memleak):
        assert not hasattr(module, "configure") and not hasattr(module, "current_policy"), module.__name__
        assert not hasattr(module, "_CONFIGURED"), module.__name__
    assert not hasattr(handlers.base, "REGISTRY")


def test_importing_the_handlers_registers_and_patches_nothing() -> None:
    code = ("import nats.js.client as c; before = c.JetStreamContext.PullSubscription.fetch; "
            "import handlers, remediator.consumers, remediator.service; "
            "assert c.JetStreamContext.PullSubscription.fetch is before, 'fetch patched at import'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_policy_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match="XidPolicy"):
        xid.DEFINITION.bind(ecc.EccPolicy())  # type: ignore[arg-type]


def test_decide_must_take_the_policy() -> None:
    def decide(event, history, now):  # type: ignore[no-untyped-def]
        raise AssertionError

    with pytest.raises(TypeError, match="policy"):
        HandlerDefinition("broken", frozenset({"xid"}), decide, xid.XidPolicy)  # type: ignore[arg-type]
