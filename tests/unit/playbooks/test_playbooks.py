"""Playbooks: the schema, the catalog (one valid file per PLAYBOOK_NAMES entry), the step registry, the
ladder plan the executor follows, and ``remediator playbooks list/validate``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from playbooks.catalog import PLAYBOOK_DIR, PlaybookCatalog, PlaybookError, load_file
from playbooks.schema import Playbook
from playbooks.steps import REGISTRY, StepContext, StepRegistry, quarantine_of, step
from remediator.cli.playbooks import playbooks as playbooks_cli
from remediator.contracts import PLAYBOOK_NAMES, Change, StepRecord
from remediator.executor import next_step

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def test_every_playbook_name_has_a_valid_yaml() -> None:
    catalog = PlaybookCatalog.load()
    assert set(PLAYBOOK_NAMES) <= set(catalog.names())
    for name in PLAYBOOK_NAMES:
        assert (PLAYBOOK_DIR / f"{name}.yaml").is_file()
        pb = catalog.get(name)
        assert pb.name == name and pb.description and pb.steps
        for s in pb.steps:
            assert s.name in REGISTRY


@pytest.mark.parametrize(("name", "expected"), [
    ("gpu-lost", ["taint", "cordon", "drain", "escalate"]),
    ("nccl-timeout-no-suspect", ["restart_job"]),
    ("unknown-xid", ["escalate"]),
], ids=["gpu-lost", "nccl-no-suspect", "unknown-xid"])
def test_key_playbooks_say_what_the_issue_asks(name: str, expected: list[str]) -> None:
    assert [s.name for s in PlaybookCatalog.load().get(name).steps] == expected


def test_per_gpu_playbooks_never_touch_the_whole_node() -> None:
    catalog = PlaybookCatalog.load()
    for name in ("gpu-memory-fatal", "row-remap-pending", "memory-retirement-failure", "app-xid-hardware-suspect",
                 "ecc-correctable-rate", "gpu-reset"):
        pb = catalog.get(name)
        assert quarantine_of(pb) == "gpu", name
        assert not {"taint", "cordon", "drain"} & {s.name for s in pb.steps}, name
    assert quarantine_of(catalog.get("gpu-lost")) == "node"
    assert quarantine_of(catalog.get("nccl-timeout-no-suspect")) is None


BASE: dict[str, Any] = {"name": "x", "description": "d", "steps": [{"name": "cordon"}]}


@pytest.mark.parametrize(("change", "problem"), [
    ({"steps": []}, "at least 1"),
    ({"steps": [{"name": "cordon", "on_failure": "explode"}]}, "on_failure"),
    ({"steps": [{"name": "cordon", "timeout_s": 0}]}, "timeout_s"),
    ({"steps": [{"name": "cordon"}, {"name": "cordon"}]}, "unique"),
    ({"steps": [{"name": "reset_gpu", "rung": "reboot"}, {"name": "reset_gpu", "id": "b", "rung": "reset"}]},
     "rungs follow"),
    ({"steps": [{"name": "reset_gpu", "on_failure": "next-rung"}]}, "next-rung needs a repair rung"),
    ({"surprise": 1}, "Extra inputs"),
    ({"name": "Bad Name"}, "pattern"),
], ids=["no-steps", "bad-on-failure", "zero-timeout", "duplicate-ids", "rung-order", "next-rung-without-rung",
        "unknown-field", "bad-name"])
def test_schema_rejects(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Playbook.model_validate({**BASE, **change})


def write(tmp: Path, name: str, body: Mapping[str, Any]) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(dict(body)))
    return p


def test_catalog_rejects_unknown_step_bad_params_name_mismatch_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError, match="step library lacks"):
        load_file(write(tmp_path, "x", {**BASE, "steps": [{"name": "format_disk"}]}))
    with pytest.raises(PlaybookError, match="unknown parameter"):
        load_file(write(tmp_path, "x", {**BASE, "steps": [{"name": "cordon", "params": {"force": True}}]}))
    with pytest.raises(PlaybookError, match="differs from the file name"):
        load_file(write(tmp_path, "y", BASE))
    (tmp_path / "y.yaml").unlink()
    write(tmp_path, "x", BASE)
    with pytest.raises(PlaybookError, match="no playbook file for"):
        PlaybookCatalog.load(tmp_path)
    assert PlaybookCatalog.load(tmp_path, required=("x",)).names() == ["x"]


def test_step_decorator_validates_signature_and_returns_the_function() -> None:
    reg = StepRegistry()

    async def good(ctx: StepContext, params: Mapping[str, Any]) -> Change:
        return Change(False)

    assert step("good", registry=reg)(good) is good
    assert "good" in reg and reg.get("good").fn is good
    with pytest.raises(ValueError, match="twice"):
        step("good", registry=reg)(good)

    async def bad(context: StepContext) -> Change:
        return Change(False)

    with pytest.raises(TypeError, match="must take"):
        step("bad", registry=reg)(bad)  # type: ignore[arg-type]

    def sync(ctx: StepContext, params: Mapping[str, Any]) -> Change:
        return Change(False)

    with pytest.raises(TypeError, match="async"):
        step("sync", registry=reg)(sync)  # type: ignore[arg-type]


def test_every_step_has_a_docstring_and_undo_names_a_step() -> None:
    for name in REGISTRY.names():
        d = REGISTRY.get(name)
        assert d.description, name
        assert d.undo is None or d.undo in REGISTRY, name


# --- the ladder: next_step over step records ---------------------------------------------------------


def rec(name: str, status: str) -> StepRecord:
    return StepRecord(name=name, status=status, started_at=T0, finished_at=T0)  # type: ignore[arg-type]


def plan(pb: Playbook, outcomes: dict[str, str]) -> list[tuple[str, str]]:
    """Walk the plan, applying ``outcomes`` (step key -> status, default succeeded) as steps run."""
    records: dict[str, StepRecord] = {}
    walked: list[tuple[str, str]] = []
    for _ in range(50):
        n = next_step(pb, records)
        if n.spec is None:
            walked.append(("<stop>", n.stop or "done"))
            return walked
        status = "skipped" if n.skip_reason else outcomes.get(n.spec.key, "succeeded")
        records[n.spec.key] = rec(n.spec.name, status)
        walked.append((n.spec.key, status))
    raise AssertionError("plan did not end")


GSP = PlaybookCatalog.load().get("gsp-hang")


def test_ladder_reset_heals_so_reboot_and_replace_are_skipped() -> None:
    walked = dict(plan(GSP, {}))
    assert walked["reset_gpu"] == "succeeded" and walked["verify-after-reset"] == "succeeded"
    assert walked["reboot_node"] == "skipped" and walked["replace"] == "skipped"
    assert walked["return_to_service"] == "succeeded"


def test_ladder_failed_reset_falls_back_to_reboot() -> None:
    walked = dict(plan(GSP, {"verify-after-reset": "failed"}))
    assert walked["reboot_node"] == "succeeded" and walked["verify-after-reboot"] == "succeeded"
    assert walked["replace"] == "skipped"


def test_ladder_failed_reset_skips_the_rest_of_its_rung() -> None:
    walked = dict(plan(GSP, {"reset_gpu": "failed"}))
    assert walked["verify-after-reset"] == "skipped"
    assert walked["reboot_node"] == "succeeded"


def test_ladder_every_repair_rung_failing_ends_in_replacement() -> None:
    walked = plan(GSP, {"reset_gpu": "failed", "reboot_node": "failed"})
    assert ("replace", "succeeded") in walked


def test_ladder_without_a_replace_rung_escalates_when_all_rungs_fail() -> None:
    pb = Playbook.model_validate({"name": "x", "description": "d", "steps": [
        {"name": "isolate_gpu", "rung": "isolate"},
        {"name": "reset_gpu", "rung": "reset", "on_failure": "next-rung"},
        {"name": "return_to_service"}]})
    assert plan(pb, {"reset_gpu": "failed"})[-1] == ("<stop>", "escalate")


def test_escalate_and_rollback_failures_stop_the_run_and_finish_ends_it() -> None:
    lost = PlaybookCatalog.load().get("gpu-lost")
    assert plan(lost, {"drain": "failed"})[-1] == ("<stop>", "escalate")
    leak = PlaybookCatalog.load().get("memory-leak")
    assert plan(leak, {})[-1] == ("<stop>", "finish")
    walked = dict(plan(leak, {"verify-memory": "failed"}))
    assert walked["isolate_gpu"] == "succeeded" and walked["reset_gpu"] == "succeeded"


def test_completed_steps_are_never_planned_again() -> None:
    lost = PlaybookCatalog.load().get("gpu-lost")
    records = {"taint": rec("taint", "succeeded"), "cordon": rec("cordon", "succeeded"),
               "drain": rec("drain", "running")}
    n = next_step(lost, records)
    assert n.spec is not None and n.spec.key == "drain"  # the interrupted step is resumed, the others are not


# --- CLI -------------------------------------------------------------------------------------------


def test_cli_list_json_and_validate() -> None:
    runner = CliRunner()
    out = runner.invoke(playbooks_cli, ["list", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert {r["name"] for r in rows} >= set(PLAYBOOK_NAMES)
    assert all(set(r) == {"name", "description", "serves"} for r in rows)
    out = runner.invoke(playbooks_cli, ["validate"])
    assert out.exit_code == 0 and out.stdout == ""


def test_cli_validate_fails_on_a_bad_directory(tmp_path: Path) -> None:
    write(tmp_path, "x", {**BASE, "steps": [{"name": "format_disk"}]})
    out = CliRunner().invoke(playbooks_cli, ["validate", "--dir", str(tmp_path)])
    assert out.exit_code == 1
    assert "format_disk" in out.stderr
