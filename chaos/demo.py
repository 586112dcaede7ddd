"""``remediator demo``: the whole system on one machine, with the standard faults injected and checked.

Where it sits: chaos tooling on top of everything. This module holds the demo's fault list and its run;
the machinery (the environment, injectors, checks, following the audit trail) is ``chaos.scenario``'s,
which the drills (``chaos.drill``) share. It starts an embedded ``nats-server``, the Kubernetes API
simulator with 8 GPU nodes (training pods of PyTorchJobs and batch Jobs, DaemonSet pods), one simulated
GPU node and its real agent per Kubernetes node, and the service (HTTP ingest, handlers, executor)
pointed at the simulator. Then it injects faults the two ways they arrive in production:

* as Alertmanager webhook payloads (version 4, as dcgm-exporter alerts look), POSTed over HTTP with a bearer
  token — Xid 79 three times (HA pair and retries), a single Xid 13, Xid 13 in three jobs, Xid 48, an Xid
  the catalog does not know;
* through the simulated nodes, which the agents read like a real node — kernel-log Xids (119, 64, 74),
  NVML ECC counters (double-bit error, row-remap pending), an orphaned process holding GPU memory, and
  PyTorch NCCL watchdog lines in the training pods' container logs.

For each fault it follows the audit trail to the decision and the playbook's outcome, checks the cluster
and the GPU state against what should have happened (and what must not have), prints each incident's
audit timeline, and passes only if every fault was handled as expected.

Demo-only settings, said on screen: an 8-node pool may have half its nodes out of service (the default
budget of 10 % would keep all but one node-level playbook waiting, which is the guard doing its job), the
breaker threshold is above the number of faults, health hold-downs are one second, and an orphan is acted
on after two seconds instead of ten minutes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from chaos.scenario import (
    Fault,
    FaultResult,
    Progress,
    agent_ecc,
    agent_orphan,
    agent_xid,
    drained_then_returned,
    environment,
    escalated_only,
    gpu_isolated_and_escalated,
    gpu_reset_and_returned,
    gpu_untouched,
    inject_and_follow,
    job_restarted,
    nccl_ranks,
    node_drained,
    only_that_gpu,
    orphan_killed,
    webhook_xid,
)

NODES = 8
# Demo-only guard settings (said in the module docstring): half the pool may be out, the breaker stays shut.
DEMO_SETTINGS: dict[str, Any] = {"budget_max_node_fraction": 0.5, "budget_max_gpu_fraction": 0.5,
                                 "breaker_threshold": 50}


def standard_faults() -> list[Fault]:
    """The demo's faults: every playbook family, through webhooks and through the agents."""
    ok = ("completed",)
    return [
        Fault("xid79-gpu-lost", "webhook", "xid", 79, "gpu-node-2", 1, "gpu-lost", ("escalated",),
              webhook_xid(times=3), node_drained),
        Fault("xid13-single", "webhook", "xid", 13, "gpu-node-3", 0, None, (), webhook_xid(), gpu_untouched),
        Fault("xid48-dbe", "webhook", "xid", 48, "gpu-node-3", 5, "gpu-memory-fatal", ok, webhook_xid(),
              gpu_reset_and_returned),
        Fault("xid13-three-jobs", "webhook", "xid", 13, "gpu-node-3", 6, "app-xid-hardware-suspect",
              (*ok, "escalated"), webhook_xid(pods=("train-a-0", "train-b-0", "train-c-0")),
              only_that_gpu),
        Fault("xid-unknown", "webhook", "xid", 999, "gpu-node-7", 3, "unknown-xid", ("escalated",),
              webhook_xid(), escalated_only),
        Fault("xid119-gsp-hang", "agent", "xid", 119, "gpu-node-4", 6, "gsp-hang", ok,
              agent_xid("Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
                        "(GSP_RM_CONTROL) (0x20802a02 0x8)."), gpu_reset_and_returned),
        Fault("ecc-dbe", "agent", "ecc", "dbe_volatile", "gpu-node-7", 5, "gpu-memory-fatal", ok,
              agent_ecc(dbe=2), gpu_reset_and_returned),
        Fault("row-remap-pending", "agent", "ecc", "row_remap_pending", "gpu-node-5", 7, "row-remap-pending", ok,
              agent_ecc(remap_pending=True), gpu_reset_and_returned),
        Fault("xid64-remap-failure", "agent", "xid", 64, "gpu-node-5", 4, "memory-retirement-failure",
              ("escalated",), agent_xid(), gpu_isolated_and_escalated),
        Fault("xid74-nvlink", "agent", "xid", 74, "gpu-node-6", 4, "nvlink", (*ok, "escalated"),
              agent_xid("NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
              drained_then_returned),
        Fault("orphaned-memory", "agent", "memory_leak", "orphaned_memory", "gpu-node-0", 6, "memory-leak", ok,
              agent_orphan, orphan_killed),
        Fault("nccl-timeout-no-suspect", "agent", "nccl_timeout", "watchdog_timeout", "gpu-node-4", None,
              "nccl-timeout-no-suspect", ok, nccl_ranks("pytorch-1", lagging=None), job_restarted("pytorch-1", None)),
        Fault("nccl-timeout-suspect", "agent", "nccl_timeout", "watchdog_timeout", "gpu-node-1", None,
              "nccl-timeout-suspect", (*ok, "escalated"), nccl_ranks("pytorch-0", lagging=1),
              job_restarted("pytorch-0", "gpu-node-1")),
    ]


@dataclass
class DemoReport:
    results: list[FaultResult]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "faults": [r.to_json() for r in self.results]}


async def run(progress: Progress, *, timeout_s: float = 75.0, faults: list[Fault] | None = None) -> DemoReport:
    t0 = time.monotonic()
    faults = faults if faults is not None else standard_faults()
    async with environment(progress, nodes=NODES, settings=DEMO_SETTINGS, label="demo") as world:
        world.faults = faults
        results = await inject_and_follow(world, faults, progress, timeout_s)
    return DemoReport(results, time.monotonic() - t0)
