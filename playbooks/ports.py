"""The ports of the step library: what a playbook step may talk to, declared as protocols.

Where it sits: beside ``playbooks.steps``, which types its ``StepContext`` against these, so the step library
depends on no concrete adapter. The composition root (``remediator.service``) hands the executor the real
ones -- ``remediator.adapters.kube.AsyncKube`` for ``KubePort``, ``remediator.adapters.agent.AgentClient``
for ``AgentPort``, ``remediator.audit.AuditLog`` for ``AuditPort`` -- and tests may hand fakes.

Every call is awaited: the one thread hop between the event loop and the Kubernetes client happens inside
the adapter. Mutations answer with a ``contracts.Change``; errors are the ``remediator.errors`` vocabulary
(a ``TemporaryError`` propagates to ``bus.settle``, which naks with its delay; a ``PermanentError`` fails the
step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from remediator.contracts import AgentReply, AgentVerb, AuditRecord, AuditWhat, Change, GpuRef, JobRef
from remediator.pools import PoolView

__all__ = ["AgentPort", "AuditPort", "KubePort"]


class KubePort(Protocol):
    """The Kubernetes API as the steps and the executor's guards use it (``AsyncKube``)."""

    async def get_node(self, name: str) -> dict[str, Any]:
        """The node summary; raises a ``PermanentError`` (404) when there is no such node."""
        ...

    async def find_node(self, name: str) -> dict[str, Any] | None:
        """The node summary, or None when there is no such node."""
        ...

    async def list_gpu_nodes(self, pool: str | None = ...) -> list[dict[str, Any]]: ...

    async def pool_view(self, pool: str) -> PoolView:
        """The pool as the budget guard reads it (``remediator.pools``)."""
        ...

    async def taint(self, node: str, key: str, value: str, effect: str = ...) -> Change: ...

    async def untaint(self, node: str, key: str, effect: str | None = ..., *,
                      only_if_value: str | None = ...) -> Change: ...

    async def cordon(self, node: str) -> Change: ...

    async def uncordon(self, node: str, *, only_if_ours: bool = ...) -> Change: ...

    async def drain(self, node: str, *, timeout_s: float | None = ..., grace_period_s: int | None = ...) -> Change:
        """Evict the node's pods; a drain that does not finish raises a ``PermanentError`` whose
        ``before``/``after`` name the pods left."""
        ...

    async def evict_pods(self, node: str, pods: Iterable[Mapping[str, Any]], *, timeout_s: float | None = ...,
                         grace_period_s: int | None = ...) -> Change:
        """Evict exactly ``pods`` (``{namespace, name, uid}`` each, as the node agent names a GPU's holders)
        by UID, with the drain's rules."""
        ...

    async def find_job(self, node: str, *, name: str | None = ..., namespace: str | None = ...,
                       pod_filter: Callable[[dict[str, Any]], bool] | None = ...) -> JobRef | None:
        """The controller of the named job (or of the one job on the node), found through owner references."""
        ...

    async def restart_job(self, job: JobRef, *, restart_id: str, grace_period_s: int | None = ...) -> Change: ...

    async def escalate(self, node: str, reason: str, incident: str) -> Change: ...

    async def withdraw_gpu(self, node: str, gpu: GpuRef, *, effect: str = ..., value: str = ...) -> Change:
        """Keep the scheduler off one GPU: a DRA DeviceTaintRule on that device (``NoSchedule``, or
        ``NoExecute`` to have the control plane evict its pods), or with the device plugin our NoSchedule node
        taint and the node recorded as partially withdrawn. Idempotent."""
        ...

    async def restore_gpu(self, node: str, gpu: GpuRef) -> Change:
        """Undo ``withdraw_gpu``, touching only what it created."""
        ...

    async def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to ``node`` (summaries: name, namespace, uid, owner, daemonset, ...)."""
        ...

    async def annotate(self, node: str, annotations: Mapping[str, str | None]) -> Change:
        """Set (None: remove) node annotations."""
        ...

    async def label(self, node: str, labels: Mapping[str, str | None]) -> Change:
        """Set (None: remove) node labels; only the keys given are touched."""
        ...

    async def pods_selecting(self, node: str, label_keys: Sequence[str]) -> list[dict[str, Any]]:
        """The pods on ``node`` whose ``spec.nodeSelector`` names one of ``label_keys`` (DaemonSet pods that
        follow node labels, as the GPU Operator's operands do), with ``node_selector``."""
        ...

    async def create_job(self, namespace: str, manifest: Mapping[str, Any]) -> Change:
        """Create a batch/v1 Job (unchanged when one of that name exists)."""
        ...

    async def delete_job(self, namespace: str, name: str) -> Change:
        """Delete a batch/v1 Job with its pods (unchanged when it is gone)."""
        ...


class AgentPort(Protocol):
    """The node agents' command subject (``AgentClient``); no answer raises a ``TemporaryError``."""

    async def call(self, node: str, verb: AgentVerb, *, command_id: str, gpu: GpuRef | None = None,
                   params: dict[str, Any] | None = None, timeout_s: float | None = None) -> AgentReply: ...


class AuditPort(Protocol):
    """The audit trail (``AuditLog``)."""

    async def append(self, node: str | None, what: AuditWhat, why: str = "", *, incident: str | None = None,
                     gpu: str | None = None, before: dict[str, Any] | None = None,
                     after: dict[str, Any] | None = None, event_id: str | None = None, job: str | None = None,
                     fingerprint: str | None = None, trace_id: str | None = None) -> AuditRecord: ...
