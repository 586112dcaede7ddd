"""``remediator demo``: the whole system on one machine, with the standard faults injected and checked.

Where it sits: chaos tooling on top of everything, under ``remediator.cli.demo``. The demo is a drill
file, ``chaos/demo.yaml`` (its faults, its expected outcomes and its demo-only settings), played by the
drill runner (``chaos.runner``) like any drill: an embedded ``nats-server``, the Kubernetes API simulator
with 8 GPU nodes, one simulated GPU node and its real agent per Kubernetes node, and the service, then the
faults through Alertmanager webhooks and through the agents. This module adds only what the demo says of
it: the report document of DESIGN.md §10 (``{"passed", "faults": [...]}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.catalog import demo_drill
from chaos.expectations import Verdict
from chaos.faults import FaultResult, Progress
from chaos.runner import DrillReport, run_drill


@dataclass
class DemoReport:
    """The demo's drill report, as the demo shows it."""

    drill: DrillReport

    @property
    def results(self) -> list[FaultResult]:
        return self.drill.results

    @property
    def seconds(self) -> float:
        return self.drill.seconds

    @property
    def passed(self) -> bool:
        return self.drill.passed

    def other_verdicts(self) -> list[Verdict]:
        """The verdicts that are not one fault's own (audit chains, the harness itself)."""
        names = {f"fault {r.fault.name}: " for r in self.results}
        return [v for v in self.drill.expectations if not any(v.what.startswith(n) for n in names)]

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "faults": [r.to_json() for r in self.results]}


async def run(progress: Progress, *, timeout_s: float | None = None, data_dir: Path | None = None,
              nats_port: int | None = None) -> DemoReport:
    """Play ``chaos/demo.yaml``; ``timeout_s`` replaces its deadline; ``data_dir`` keeps the JetStream store
    (the audit trail included) for ``remediator audit … --data-dir`` afterwards."""
    drill = demo_drill()
    if timeout_s is not None:
        drill = drill.model_copy(update={"expect": drill.expect.model_copy(update={"deadline_s": timeout_s})})
    return DemoReport(await run_drill(drill, progress, label="demo", data_dir=data_dir, nats_port=nats_port))
