"""The step library against fakes of its ports (``playbooks.ports``): steps await the port, never hop threads
themselves, return the ``Change`` the adapter or agent reported, and name a job to restart by the one
resolver (``contracts.resolve_job``) -- never by a Prometheus ``job`` label or a pod's name."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from playbooks import ports, steps
from playbooks.catalog import PlaybookCatalog
from playbooks.steps import (
    Skipped,
    StepContext,
    StepFailed,
    isolate_gpu,
    release_gpu,
    restart_job,
    return_to_service,
    taint_node,
)
from remediator.contracts import AgentReply, Change, Decision, GpuRef, JobRef, Origin
from remediator.settings import Settings

T0 = datetime(2025, 1, 1, tzinfo=UTC)
PYTORCH = JobRef("PyTorchJob", "pytorch-0", "training", "kubeflow.org/v1", "uid-1")


@dataclass
class FakeKube:
    """A ``KubePort`` that records what the steps asked and on which thread."""

    job: JobRef | None = PYTORCH
    asked: list[dict[str, Any]] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)

    def _seen(self) -> None:
        self.threads.add(threading.current_thread().name)

    async def taint(self, node: str, key: str, value: str, effect: str = "NoSchedule") -> Change:
        self._seen()
        return Change(True, {"taints": []}, {"taints": [{"key": key, "value": value, "effect": effect}]},
                      f"tainted {node}")

    async def withdraw_gpu(self, node: str, gpu: GpuRef, *, effect: str = "NoSchedule", value: str = "") -> Change:
        self._seen()
        self.asked.append({"withdraw": gpu.key, "effect": effect, "value": value})
        return Change(True, {"mode": "dra", "rule": None}, {"mode": "dra", "rule": "r"}, "DeviceTaintRule r")

    async def restore_gpu(self, node: str, gpu: GpuRef) -> Change:
        self._seen()
        self.asked.append({"restore": gpu.key})
        return Change(True, {"mode": "dra", "rule": "r"}, {"mode": "dra", "rule": None}, "deleted r")

    async def find_job(self, node: str, *, name: str | None = None, namespace: str | None = None,
                       pod_filter: Callable[[dict[str, Any]], bool] | None = None) -> JobRef | None:
        self._seen()
        self.asked.append({"node": node, "name": name, "namespace": namespace, "pod_filter": pod_filter})
        return self.job

    async def restart_job(self, job: JobRef, *, restart_id: str, grace_period_s: int | None = None) -> Change:
        self._seen()
        return Change(True, {"job": job.key}, {"job": job.key, "restart_id": restart_id}, "")


@dataclass
class FakeAgents:
    reply: dict[str, Any] = field(default_factory=dict)

    async def call(self, node: str, verb: str, *, command_id: str, **_kw: Any) -> AgentReply:
        return AgentReply(id=command_id, ok=True, **self.reply)


def decision(*, job: str | None = None, labels: dict[str, str] | None = None, origin: Origin | None = None,
             gpu: GpuRef | None = None) -> Decision:
    return Decision(incident_id="inc-1", handler="nccl", playbook="nccl-timeout-no-suspect", node="gpu-node-0",
                    gpu=gpu, group="job", reason="NCCL watchdog timeout", event_id="ev-1", kind="nccl_timeout",
                    decided_at=T0, job=job, labels=labels or {}, origin=origin or Origin())


def context(d: Decision, kube: Any, agents: Any = None) -> StepContext:
    return StepContext(decision=d, playbook=PlaybookCatalog.load().get(d.playbook), kube=kube,
                       agents=agents or FakeAgents(), settings=Settings(), clock=lambda: T0,
                       audit=None, step_key="restart")  # type: ignore[arg-type]


def test_the_step_context_has_no_thread_hop_and_the_library_no_adapter() -> None:
    assert not hasattr(StepContext, "kube_call") and "run_sync" not in StepContext.__dataclass_fields__
    assert "remediator.adapters.kube" not in inspect.getsource(steps)
    assert {"KubePort", "AgentPort", "AuditPort"} <= set(ports.__all__)


async def test_steps_await_the_port_on_the_event_loop_and_return_its_change() -> None:
    kube = FakeKube()
    change = await taint_node(context(decision(), kube), {"value": "xid-79"})
    assert change == Change(True, {"taints": []},
                            {"taints": [{"key": "gpu-remediator/quarantine", "value": "xid-79",
                                         "effect": "NoSchedule"}]}, "tainted gpu-node-0")
    assert kube.threads == {threading.current_thread().name}


async def test_restart_job_names_the_job_from_the_owner_reference_first() -> None:
    kube = FakeKube()
    d = decision(labels={"job-name": "other", "job": "dcgm-exporter"},
                 origin=Origin(job="pytorch-0", namespace="training", pod="pytorch-0-worker-1"))
    change = await restart_job(context(d, kube), {})
    assert [(a["name"], a["namespace"]) for a in kube.asked] == [("pytorch-0", "training")]
    assert change.changed and change.detail == "restart_job PyTorchJob/training/pytorch-0"
    assert change.after["restart_id"].startswith("inc-1|restart|restart_job")


@pytest.mark.parametrize(("d", "name", "namespace"), [
    (decision(job="training/pytorch-0"), "pytorch-0", "training"),
    (decision(labels={"training.kubeflow.org/job-name": "pytorch-0", "namespace": "training"}), "pytorch-0",
     "training"),
    (decision(labels={"jobset.sigs.k8s.io/jobset-name": "llm", "batch.kubernetes.io/job-name": "llm-w-0"},
              origin=Origin(namespace="training")), "llm", "training"),
], ids=["ns-slash-name", "kubeflow-label", "jobset-before-batch"])
async def test_restart_job_names_follow_the_one_resolver(d: Decision, name: str, namespace: str) -> None:
    kube = FakeKube()
    await restart_job(context(d, kube), {})
    assert [(a["name"], a["namespace"]) for a in kube.asked] == [(name, namespace)]


async def test_a_prometheus_job_label_never_names_the_job_to_restart() -> None:
    kube = FakeKube()
    d = decision(labels={"job": "dcgm-exporter", "pod": "pytorch-0-worker-1"}, gpu=GpuRef(index=2))
    agents = FakeAgents({"after": {"holders_known": True, "holders": [
        {"namespace": "training", "name": "pytorch-0-worker-1", "uid": "uid-2", "container": "pytorch"}]}})
    await restart_job(context(d, kube, agents), {})
    (asked,) = kube.asked
    assert asked["name"] is None  # neither the scrape job nor a name guessed from the pod
    on_gpu = asked["pod_filter"]  # the job whose pod holds GPU 2, as the node agent names its holders
    assert on_gpu({"uid": "uid-2"}) and not on_gpu({"uid": "uid-0"})


async def test_restart_job_fails_when_the_port_finds_no_job() -> None:
    with pytest.raises(StepFailed, match="no PyTorchJob, Job or JobSet named 'gone'"):
        await restart_job(context(decision(job="gone"), FakeKube(job=None)), {})
    with pytest.raises(StepFailed, match="no single job runs on gpu-node-0"):
        await restart_job(context(decision(), FakeKube(job=None)), {})


async def test_an_agent_step_returns_the_change_the_agent_reported() -> None:
    agents = FakeAgents({"changed": True, "detail": "GPU 2 isolated", "before": {"isolated": False},
                         "after": {"isolated": True}})
    kube = FakeKube()
    change = await isolate_gpu(context(decision(gpu=GpuRef(index=2)), kube, agents), {})
    assert change == Change(True, {"isolated": False, "withdrawal": {"mode": "dra", "rule": None}},
                            {"isolated": True, "withdrawal": {"mode": "dra", "rule": "r"}},
                            "GPU 2 isolated; DeviceTaintRule r")
    assert kube.asked == [{"withdraw": "index-2", "effect": "NoSchedule", "value": "nccl-timeout-no-suspect"}]


async def test_isolate_gpu_asks_for_noexecute_only_when_the_playbook_says_and_refuses_other_effects() -> None:
    agents = FakeAgents({"changed": True, "detail": "GPU 2 isolated"})
    kube = FakeKube()
    await isolate_gpu(context(decision(gpu=GpuRef(index=2)), kube, agents), {"effect": "NoExecute"})
    assert kube.asked[-1]["effect"] == "NoExecute"
    with pytest.raises(StepFailed, match="effect must be NoSchedule or NoExecute"):
        await isolate_gpu(context(decision(gpu=GpuRef(index=2)), kube, agents), {"effect": "PreferNoSchedule"})


async def test_release_gpu_undrains_on_the_node_then_restores_the_gpu_to_the_scheduler() -> None:
    agents = FakeAgents({"changed": True, "detail": "GPU 2 undrained"})
    kube = FakeKube()
    change = await release_gpu(context(decision(gpu=GpuRef(index=2)), kube, agents), {})
    assert kube.asked == [{"restore": "index-2"}]
    assert change.after["withdrawal"] == {"mode": "dra", "rule": None} and change.detail.endswith("deleted r")


async def test_return_to_service_without_a_passing_check_is_a_skipped_change() -> None:
    change = await return_to_service(context(decision(), FakeKube()), {})
    assert isinstance(change, Skipped) and isinstance(change, Change)
    assert not change.changed and change.after == {"returned": False}
