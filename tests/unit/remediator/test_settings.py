"""Settings: grouped by concern with typed views, every variable and attribute of before still working."""

from __future__ import annotations

import pytest

from remediator.settings import SECTIONS, Settings, section_of

# Every field Settings had before it was grouped: operators set these variables and the code reads these
# attributes, so none may be renamed.
BEFORE = ("nats_url", "data_dir", "http", "api_tokens", "max_body_bytes", "kubeconfig", "dry_run", "replica_id",
    "duplicate_window_s", "max_deliver", "nak_delay_s", "audit_max_age_days", "audit_max_bytes", "lock_ttl_s",
    "drain_timeout_s", "drain_grace_period_s", "kube_qps", "kube_burst", "kube_retry_budget_s", "taint_key",
    "xid_app_window_s", "xid_app_threshold", "executor_concurrency", "lock_wait_s", "cooldown_s", "attempt_window_s",
    "max_node_attempts", "max_gpu_attempts", "budget_max_node_fraction", "budget_max_nodes",
    "budget_max_gpu_fraction", "budget_max_gpus", "breaker_threshold", "breaker_window_s", "guards_enabled",
    "approval_wait_s", "verify_hold_down_s", "verify_interval_s", "reboot_hook_url", "escalation_webhook_url")


def test_every_variable_of_before_still_exists() -> None:
    assert set(BEFORE) <= set(Settings.model_fields)


@pytest.mark.parametrize(("name", "raw", "value"), [
    pytest.param("nats_url", "nats://a:4222,nats://b:4222", "nats://a:4222,nats://b:4222", id="nats"),
    pytest.param("kube_qps", "5", 5.0, id="kube"),
    pytest.param("xid_app_threshold", "4", 4, id="handlers"),
    pytest.param("max_gpu_attempts", "7", 7, id="safety"),
    pytest.param("executor_concurrency", "3", 3, id="executor"),
    pytest.param("dry_run", "true", True, id="bool"),
])
def test_flat_environment_names_and_attributes_keep_working(monkeypatch: pytest.MonkeyPatch, name: str, raw: str,
                                                            value: object) -> None:
    monkeypatch.setenv(f"REMEDIATOR_{name.upper()}", raw)
    assert getattr(Settings(), name) == value


def test_every_field_belongs_to_a_known_section_and_every_section_has_fields() -> None:
    names = [name for name, _ in SECTIONS]
    assert {"nats", "kube", "safety", "handlers", "executor"} <= set(names)
    used = {section_of(f) for f in Settings.model_fields}
    assert used == set(names)


def test_the_typed_views_carry_their_sections_values() -> None:
    s = Settings(nats_url="nats://a:4222, nats://b:4222", kube_qps=5, guards_enabled="lock, budget",
                 executor_concurrency=3, nccl_window_s=30)
    assert s.nats_view().urls == ("nats://a:4222", "nats://b:4222")
    assert Settings().nats_view().urls == ()
    assert s.kube_view().qps == 5 and s.kube_view().taint_key == s.taint_key
    assert s.safety_view().guards_enabled == frozenset({"lock", "budget", "dry_run"})  # dry_run always
    assert s.executor_view().concurrency == 3
    assert s.handlers_view().nccl_window_s == 30


def test_each_view_holds_exactly_its_sections_fields() -> None:
    """A new setting lands in its section's view, so the composition root never reads a flat field."""
    s = Settings()
    renamed = {"nats_url": "urls", "kube_qps": "qps", "kube_burst": "burst", "kube_retry_budget_s": "retry_budget_s",
               "executor_concurrency": "concurrency"}
    views = {"nats": s.nats_view(), "kube": s.kube_view(), "handlers": s.handlers_view(),
             "safety": s.safety_view(), "executor": s.executor_view()}
    for section, view in views.items():
        fields = {renamed.get(f, f) for f in Settings.model_fields if section_of(f) == section}
        assert fields == set(view.__dataclass_fields__), section
