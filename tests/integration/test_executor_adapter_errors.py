"""What the adapters' errors mean for a run, with no mapping in the executor: a Kubernetes 429 whose
``Retry-After`` outlasts the adapter's retry budget leaves the run to be retried after that delay; a drain
that PodDisruptionBudgets keep refusing fails its step, and the playbook escalates (real nats-server, the
simulated Kubernetes API through the real client)."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediator.adapters.kube import KubeTemporaryError
from remediator.errors import TemporaryError
from remediator.natsd import EmbeddedNats

from .executor_support import decision, rig

pytestmark = pytest.mark.timeout(90)


async def test_a_429_beyond_the_retry_budget_leaves_the_run_for_after_retry_after(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    async with rig(nats_server.url, tmp_path, kube_retry_budget_s=1.0) as r:
        r.sim.inject_error(429, method="PATCH", path="/api/v1/nodes/gpu-node-2$", count=None, retry_after=30)
        d = decision("gpu-node-2", "gpu-lost", gpu=3)
        with pytest.raises(TemporaryError) as err:
            await r.executor.execute(d)
        assert isinstance(err.value, KubeTemporaryError) and err.value.delay == 30  # what settle naks with
        whats = await r.whats("gpu-node-2", d.incident_id)
        assert "step_started" in whats and "step_failed" not in whats and "playbook_finished" not in whats


async def test_a_drain_refused_until_its_timeout_fails_the_step_and_escalates(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    async with rig(nats_server.url, tmp_path, drain_timeout_s=1.0) as r:
        r.sim.inject_error(429, method="POST", path="/pods/[^/]+/eviction$", count=None,
                           message="Cannot evict pod as it would violate the pod's disruption budget.")
        d = decision("gpu-node-2", "gpu-lost", gpu=3)
        result = await r.executor.execute(d)
        assert result.outcome == "escalated"
        statuses = {a.name: a.status for a in result.actions}
        assert statuses["drain"] == "failed" and statuses["escalate"] == "succeeded"
        failed = [rec for rec in await r.audit_records("gpu-node-2")
                  if rec.incident == d.incident_id and rec.what == "step_failed"]
        assert len(failed) == 1 and "did not finish within 1s" in failed[0].why
        assert {p["reason"] for p in failed[0].after["pods_left"]} == {"blocked by PodDisruptionBudget"}
