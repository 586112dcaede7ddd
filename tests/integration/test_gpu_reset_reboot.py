"""The reset and reboot steps against the simulated cluster through the real Kubernetes adapter and the real
command responder on a simulated GPU node (no NATS: the agent port calls the responder directly).

Reset: the GPU Operator's operands leave by their ``nvidia.com/gpu.deploy.*`` labels and come back; only
labels the step changed are restored, an interrupted attempt's labels too; an operand outside the operator
refuses the reset with its pod named. Reboot: each provider (agent, hook, annotation, job) reboots the node
in the simulator as its real counterpart would, and the step succeeds only on a new boot id with the node
Ready; a reboot that never happens, or a Job without the privileges to reboot, fails for want of proof.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.kubelet import Kubelet, mirror_pods
from chaos.sim import ClusterState, KubeApiServer, gpu_operator, seed_cluster
from chaos.sim.gpu_node import SimGpuNode
from playbooks.catalog import PlaybookCatalog
from playbooks.gpu_reset import OPERANDS_ANNOTATION, reset_gpu
from playbooks.reboot import REBOOT_ANNOTATION, job_name, reboot_node
from playbooks.steps import StepContext, StepFailed
from remediator.adapters.kube import AsyncKube, KubeAdapter
from remediator.agent.commands import CommandResponder
from remediator.agent.state import StateStore
from remediator.contracts import AgentCommand, AgentReply, Decision, GpuRef
from remediator.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-node-0"
DEPLOY = "nvidia.com/gpu.deploy."


class ResponderPort:
    def __init__(self, responder: CommandResponder) -> None:
        self.responder = responder
        self.verbs: list[str] = []

    async def call(self, node: str, verb: Any, *, command_id: str, gpu: GpuRef | None = None,
                   params: dict[str, Any] | None = None, timeout_s: float | None = None) -> AgentReply:
        self.verbs.append(verb)
        return await self.responder.handle(AgentCommand(id=command_id, verb=verb, gpu=gpu, params=params or {}))


@dataclass
class Rig:
    cluster: ClusterState
    sim: SimGpuNode
    kube: AsyncKube
    agents: ResponderPort
    kubelet: Kubelet
    root: Path

    def ctx(self, playbook: str = "gpu-memory-fatal", *, timeout_s: float = 30.0, **settings: Any) -> StepContext:
        async def sleep(seconds: float) -> None:  # the node's kubelet follows the API server meanwhile
            self.kubelet.sync()
            await asyncio.sleep(min(seconds, 0.05))

        d = Decision(incident_id="inc-reset-1", handler="xid", playbook=playbook, node=NODE, gpu=GpuRef(index=1),
                     group="gpu", reason="test", event_id="ev-1", kind="xid", decided_at=datetime.now(UTC))
        return StepContext(decision=d, playbook=PlaybookCatalog.load().get(playbook), kube=self.kube,
                           agents=self.agents, settings=Settings(**{"gpu_operand_timeout_s": 5, "reboot_poll_s": 0.1,
                                                                    "reboot_timeout_s": 5, **settings}),
                           clock=lambda: datetime.now(UTC), audit=None,  # type: ignore[arg-type]
                           sleep=sleep, step_key="reset", timeout_s=timeout_s)

    def labels(self) -> dict[str, str]:
        return {k: v for k, v in self.cluster.node(NODE)["metadata"]["labels"].items() if k.startswith(DEPLOY)}

    def operand_pods(self) -> list[str]:
        return sorted(p["metadata"]["name"].rsplit("-", 1)[0] for p in self.cluster.pods_on(NODE)
                      if p["metadata"]["namespace"] == "gpu-operator")


async def make_rig(tmp_path: Path, **install: Any) -> AsyncIterator[Rig]:
    cluster = seed_cluster(1, gpus_per_pod=4)
    cluster.delete("jobs", "train-0", "training", propagation="Background")
    gpu_operator.install(cluster, **install)
    cluster.reboot_down_s = 0.3
    sim = SimGpuNode(tmp_path / NODE, name=NODE, gpus=2)
    mirror_pods(cluster, {NODE: sim})  # attaches the node; the operands hold both GPUs open
    fleet = type("Fleet", (), {"nodes": {NODE: sim}})()
    kubelet = Kubelet(cluster, fleet, cluster.resource_version)
    responder = CommandResponder(node=NODE, gpus=sim, host=sim, pods=sim, state=StateStore(tmp_path / "agent"))
    with KubeApiServer(cluster) as server:
        adapter = KubeAdapter(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            yield Rig(cluster, sim, AsyncKube(adapter), ResponderPort(responder), kubelet, tmp_path)
        finally:
            adapter.close()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async for r in make_rig(tmp_path):
        yield r


async def test_the_operands_leave_for_the_reset_and_only_the_labels_it_changed_come_back(rig: Rig) -> None:
    # A person turned DCGM off on this node before the fault: that label is not ours to change back.
    rig.cluster.patch("nodes", NODE, {"metadata": {"labels": {DEPLOY + "dcgm": "false"}}})
    rig.kubelet.sync()
    assert rig.sim.gpu_state(1)["processes"]  # the operands hold the GPU: a reset now would fail "in use"
    change = await reset_gpu(rig.ctx(), {"interval_s": 0.1})
    assert change.changed and rig.sim.gpu_state(1)["reset_count"] == 1
    assert change.after["operands_withdrawn"] == sorted(DEPLOY + o for o in (
        "device-plugin", "gpu-feature-discovery", "dcgm-exporter"))
    assert change.after["operands_restored"] == {k: "true" for k in change.after["operands_withdrawn"]}
    assert change.after["persistence"]["restored"] is True and change.after["verification"]["passed"] is True
    assert rig.labels() == {DEPLOY + "device-plugin": "true", DEPLOY + "gpu-feature-discovery": "true",
                            DEPLOY + "dcgm-exporter": "true", DEPLOY + "dcgm": "false"}
    assert OPERANDS_ANNOTATION not in rig.cluster.node(NODE)["metadata"].get("annotations", {})
    assert rig.operand_pods() == ["gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-device-plugin-daemonset"]


async def test_a_resumed_reset_restores_what_an_interrupted_attempt_changed(rig: Rig) -> None:
    # The previous attempt set device-plugin=false, wrote what it found, and its replica died.
    rig.cluster.patch("nodes", NODE, {"metadata": {
        "labels": {DEPLOY + "device-plugin": "false"},
        "annotations": {OPERANDS_ANNOTATION: json.dumps({"incident": "inc-reset-1",
                                                         "labels": {DEPLOY + "device-plugin": "true"}})}}})
    change = await reset_gpu(rig.ctx(), {"interval_s": 0.1})
    assert change.changed and rig.labels()[DEPLOY + "device-plugin"] == "true"
    assert DEPLOY + "device-plugin" in change.after["operands_withdrawn"]


async def test_an_operand_outside_the_operator_refuses_the_reset_with_its_pod_named(tmp_path: Path) -> None:
    async for rig in make_rig(tmp_path, unmanaged=("dcgm-exporter",)):
        with pytest.raises(StepFailed) as failed:
            await reset_gpu(rig.ctx(), {"interval_s": 0.1, "wait_idle_s": 5})
        e = failed.value
        assert "held by DaemonSet pod(s) that do not leave" in e.detail
        assert "gpu-operator/nvidia-dcgm-exporter-standalone-" in e.detail
        assert e.after["refused"] == "in_use"
        assert {h["pod"].rsplit("-", 1)[0] for h in e.after["holders"] if h["daemonset"]} == {
            "gpu-operator/nvidia-dcgm-exporter-standalone"}
        assert rig.sim.gpu_state(1)["reset_count"] == 0
        assert set(rig.labels().values()) == {"true"}  # restored on the way out
        assert rig.operand_pods() == ["gpu-feature-discovery", "nvidia-dcgm", "nvidia-dcgm-exporter-standalone",
                                      "nvidia-device-plugin-daemonset"]


def boot(rig: Rig) -> str:
    return str(rig.cluster.node(NODE)["status"]["nodeInfo"]["bootID"])


async def test_the_agent_provider_is_proven_by_a_new_boot_id(rig: Rig) -> None:
    before = boot(rig)
    assert before == rig.sim.boot_id
    change = await reboot_node(rig.ctx("gsp-hang", reboot_provider="agent"), {})
    assert change.after["rebooted"] and change.after["was_not_ready"] is True
    assert change.before["boot_id"] == before and change.after["boot_id"] == boot(rig) == rig.sim.boot_id != before
    assert rig.agents.verbs == ["reboot_node"] and rig.sim.reboots == 1
    assert REBOOT_ANNOTATION not in rig.cluster.node(NODE)["metadata"].get("annotations", {})


async def test_a_reboot_that_never_happens_fails_for_want_of_proof(rig: Rig) -> None:
    rig.sim.set_reboot_outcome("ignored")
    with pytest.raises(StepFailed, match="the boot id never changed") as failed:
        await reboot_node(rig.ctx("gsp-hang", reboot_provider="agent", reboot_timeout_s=1.5), {})
    assert failed.value.after["rebooted"] is False and rig.cluster.reboots(NODE) == 0


async def test_the_annotation_provider_hands_the_reboot_to_a_node_repair_controller(rig: Rig) -> None:
    before = boot(rig)
    change = await reboot_node(rig.ctx("gsp-hang", reboot_provider="annotation"), {})
    assert change.after["provider"] == "annotation" and boot(rig) != before and rig.sim.reboots == 1
    annotations = rig.cluster.node(NODE)["metadata"].get("annotations", {})
    assert "gpu-remediator.io/reboot-requested" not in annotations and REBOOT_ANNOTATION not in annotations


async def test_the_hook_provider_posts_and_waits_for_the_proof(rig: Rig) -> None:
    posted: list[dict[str, Any]] = []

    async def power_controller(url: str, body: dict[str, Any]) -> None:
        posted.append(body)
        rig.cluster.reboot_node(body["node"])

    ctx = rig.ctx("gsp-hang", reboot_provider="hook", reboot_hook_url="https://power.example/reboot")
    from dataclasses import replace
    change = await reboot_node(replace(ctx, http=power_controller), {})
    assert change.after["rebooted"] and posted[0]["node"] == NODE and posted[0]["incident"] == "inc-reset-1"


async def test_the_job_provider_runs_the_configured_job_on_the_node(rig: Rig) -> None:
    manifest = str(ROOT / "deploy" / "reboot-job.yaml")
    rig.cluster.create("namespaces", {"metadata": {"name": "ops"}})
    before = boot(rig)
    change = await reboot_node(rig.ctx("gsp-hang", reboot_provider="job", reboot_job_manifest=manifest,
                                       reboot_job_namespace="ops"), {})
    assert change.after["job"] == f"ops/{job_name('inc-reset-1')}" and boot(rig) != before
    assert rig.cluster.list_objects("jobs", "ops") == []  # deleted once the reboot was proven


async def test_a_job_without_the_privileges_to_reboot_reboots_nothing(rig: Rig, tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "deploy" / "reboot-job.yaml").read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": False}
    weak = tmp_path / "weak.yaml"
    weak.write_text(yaml.safe_dump(doc))
    rig.cluster.create("namespaces", {"metadata": {"name": "ops"}})
    with pytest.raises(StepFailed, match="no proof of a reboot"):
        await reboot_node(rig.ctx("gsp-hang", reboot_provider="job", reboot_job_manifest=str(weak),
                                  reboot_job_namespace="ops", reboot_timeout_s=1.5), {})
    assert rig.cluster.reboots(NODE) == 0
