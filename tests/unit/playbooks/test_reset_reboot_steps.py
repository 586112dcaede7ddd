"""The reset and reboot steps' pure parts: every playbook that resets collects a bug report first in the rung
that follows the reset; the reboot provider is chosen from the settings; the reboot Job is the configured one,
named after the incident and pinned to the node; the operand labels come from the setting."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from playbooks.catalog import PlaybookCatalog
from playbooks.gpu_reset import collect_bug_report, operand_labels
from playbooks.reboot import job_manifest, job_name, provider_of
from playbooks.schema import RUNG_ORDER
from playbooks.steps import Skipped, StepContext, StepFailed
from remediator.contracts import AgentReply, Decision, GpuRef, StepRecord
from remediator.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_every_playbook_that_resets_collects_a_bug_report_first_in_the_next_rung() -> None:
    catalog = PlaybookCatalog.load()
    resetting = [pb for pb in (catalog.get(n) for n in catalog.names()) if any(s.name == "reset_gpu" for s in pb.steps)]
    assert len(resetting) >= 6
    for pb in resetting:
        reset = next(s for s in pb.steps if s.name == "reset_gpu")
        assert reset.rung == "reset" and reset.on_failure == "next-rung", pb.name
        later = [s for s in pb.steps if s.rung and RUNG_ORDER.index(s.rung) > RUNG_ORDER.index("reset")]
        assert later and later[0].name == "collect_bug_report" and later[0].on_failure == "continue", pb.name


def test_operand_labels_from_the_setting() -> None:
    assert operand_labels(Settings().gpu_operands) == [
        "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.gpu-feature-discovery",
        "nvidia.com/gpu.deploy.dcgm-exporter", "nvidia.com/gpu.deploy.dcgm", "nvidia.com/gpu.deploy.mig-manager"]
    assert operand_labels(" dcgm , ,") == ["nvidia.com/gpu.deploy.dcgm"] and operand_labels("") == []


class Agents:
    def __init__(self) -> None:
        self.verbs: list[str] = []

    async def call(self, node: str, verb: Any, *, command_id: str, gpu: GpuRef | None = None,
                   params: dict[str, Any] | None = None, timeout_s: float | None = None) -> AgentReply:
        self.verbs.append(verb)
        return AgentReply(id=command_id, ok=True, detail="wrote nvidia-bug-report.log.gz",
                          after={"output": "wrote nvidia-bug-report.log.gz"})


def ctx(records: dict[str, StepRecord], agents: Agents, **settings: Any) -> StepContext:
    d = Decision(incident_id="inc-42", handler="xid", playbook="gsp-hang", node="gpu-node-7", gpu=GpuRef(index=1),
                 group="g", reason="r", event_id="e", kind="xid", decided_at=T0)
    return StepContext(decision=d, playbook=PlaybookCatalog.load().get("gsp-hang"), kube=None,  # type: ignore[arg-type]
                       agents=agents, settings=Settings(**settings), clock=lambda: T0, audit=None,  # type: ignore[arg-type]
                       records=records, step_key="collect_bug_report", timeout_s=60.0)


def _reset(status: str, after: dict[str, Any]) -> StepRecord:
    return StepRecord(name="reset_gpu", status=status, after=after)


@pytest.mark.parametrize(("records", "runs"), [
    pytest.param({"reset_gpu": _reset("failed", {"reset_failed": True})}, True, id="the-reset-failed"),
    pytest.param({"reset_gpu": _reset("failed", {"refused": "in_use"})}, False, id="the-reset-was-refused"),
    pytest.param({"reset_gpu": _reset("succeeded", {})}, False, id="the-reset-worked"),
    pytest.param({}, False, id="no-reset"),
])
async def test_the_bug_report_follows_a_failed_reset_only(records: dict[str, StepRecord], runs: bool) -> None:
    agents = Agents()
    change = await collect_bug_report(ctx(records, agents), {})
    assert agents.verbs == (["collect_bug_report"] if runs else [])
    assert isinstance(change, Skipped) is not runs
    if runs:
        assert change.after["output"] == "wrote nvidia-bug-report.log.gz"


@pytest.mark.parametrize(("settings", "params", "chosen"), [
    pytest.param({}, {}, "agent", id="default-agent"),
    pytest.param({"reboot_hook_url": "https://p.example/r"}, {}, "hook", id="a-hook-url-means-hook"),
    pytest.param({"reboot_hook_url": "https://p.example/r", "reboot_provider": "annotation"}, {}, "annotation",
                 id="the-setting-wins"),
    pytest.param({"reboot_provider": "job"}, {"provider": "agent"}, "agent", id="the-step-parameter-wins"),
])
def test_the_reboot_provider(settings: dict[str, Any], params: dict[str, Any], chosen: str) -> None:
    assert provider_of(ctx({}, Agents(), **settings), params) == chosen
    with pytest.raises(StepFailed, match="unknown reboot provider"):
        provider_of(ctx({}, Agents()), {"provider": "ipmi"})


def test_the_reboot_job_is_the_configured_one_named_and_pinned(tmp_path: Path) -> None:
    name = job_name("inc-42")
    assert name == job_name("inc-42") != job_name("inc-43") and len(name) <= 63
    job = job_manifest(str(ROOT / "deploy" / "reboot-job.yaml"), name=name, namespace="ops", node="gpu-node-7",
                       incident="inc-42")
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"], job["metadata"]["namespace"]) == (
        "batch/v1", "Job", name, "ops")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeName"] == "gpu-node-7" and pod["hostPID"] is True
    assert pod["containers"][0]["command"][-2:] == ["systemctl", "reboot"]
    assert job["metadata"]["labels"]["gpu-remediator.io/reboot-for"] == "gpu-node-7"
    bad = tmp_path / "pod.yaml"
    bad.write_text("kind: Pod\nspec: {}\n")
    with pytest.raises(StepFailed, match="not a batch/v1 Job"):
        job_manifest(str(bad), name=name, namespace="ops", node="n", incident="i")
    with pytest.raises(StepFailed, match="cannot read"):
        job_manifest(str(tmp_path / "missing.yaml"), name=name, namespace="ops", node="n", incident="i")
