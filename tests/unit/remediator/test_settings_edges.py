"""Settings that no other setting may defeat: ``--dry-run`` always shadows, unknown guard names are refused,
and the settings' guard names are the safety package's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from remediator.contracts import Decision, GpuRef
from remediator.errors import SetupError
from remediator.safety.guards import GUARD_NAMES, SafetyPolicy, SafetySnapshot, evaluate, shadow
from remediator.settings import KNOWN_GUARDS, Settings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DECISION = Decision(incident_id="inc-1", handler="xid", playbook="gpu-lost", node="gpu-node-1",
                    gpu=GpuRef(index=0, uuid="GPU-0"), group="g", reason="test", event_id="ev-1", kind="xid",
                    code=79, decided_at=NOW)


def test_the_settings_know_the_safety_packages_guards() -> None:
    assert KNOWN_GUARDS == GUARD_NAMES


@pytest.mark.parametrize("guards", [
    pytest.param("lock", id="only-the-lock"),
    pytest.param("opt_out,cooldown,lock,budget,breaker,approval", id="all-but-dry-run"),
    pytest.param("", id="none"),
])
@pytest.mark.parametrize("where", ["global", "playbook"])
def test_dry_run_cannot_be_defeated_by_a_guard_list(guards: str, where: str) -> None:
    s = Settings(dry_run=where == "global", guards_enabled=guards)
    policy = SafetyPolicy.of(s.safety_view())
    snap = SafetySnapshot(policy=policy, lock_holder="me", me="me", playbook_dry_run=where == "playbook")
    verdicts = evaluate(DECISION, snap, NOW)
    assert shadow(verdicts), verdicts


def test_unknown_guard_names_are_refused_naming_the_variable() -> None:
    with pytest.raises(ValidationError, match=r"unknown guard name.*budgett.*REMEDIATOR_GUARDS_ENABLED"):
        Settings(guards_enabled="lock,budgett")


def test_the_cli_turns_invalid_settings_into_one_line() -> None:
    from remediator.cli.edges import load_settings, one_line

    with pytest.raises(SetupError) as info:
        load_settings(guards_enabled="lock,budgett", max_deliver=0)
    line = one_line(info.value)
    assert "\n" not in line and "REMEDIATOR_GUARDS_ENABLED" in line and "REMEDIATOR_MAX_DELIVER" in line, line
