"""Operator rules against a real nats-server: an override named in the decision's evidence and audit record,
and a rules file changed while the dispatcher runs takes effect without a restart (``remediator.rules_watch``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from handlers.registry import default_registry
from handlers.rules import RulesSource
from remediator import bus
from remediator.audit import AuditLog, iter_records
from remediator.dispatch import Dispatcher
from remediator.natsd import EmbeddedNats
from remediator.rules_watch import watch_rules
from remediator.settings import Settings
from tests.integration.test_dispatch import Clock, _decisions, xid

ROUTE = """\
overrides:
  - name: xid79-to-reboot
    match: {kind: xid, code: 79}
    playbook: node-reboot
"""
SUPPRESS = """\
overrides:
  - name: quiet-node-2
    match: {kind: xid, node: gpu-node-2}
    suppress: true
"""


async def test_override_is_in_evidence_and_audit_and_a_changed_file_applies_without_restart(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(ROUTE)
    source = RulesSource(path)
    source.load()
    clock = Clock()
    settings = Settings(nats_url=nats_server.url, nak_delay_s=0.1)
    nc, js = await bus.connect(nats_server.url)
    await bus.provision(js, settings)
    audit = AuditLog(js, "test", clock=clock)
    d = await Dispatcher.create(nc, js, settings, audit, registry=default_registry(), clock=clock,
                                rules=source.current)
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_rules(source, stop, interval_s=0.05))
    try:
        (decision,) = await d.handle(xid("gpu-node-1", 79, "agent|gpu-node-1|boot|1"))
        assert decision.playbook == "node-reboot"
        assert decision.evidence[-1].kind == "operator_override" and decision.evidence[-1].code == "xid79-to-reboot"
        records = [r async for r in iter_records(js, "gpu-node-1")]
        audited = next(r for r in records if r.what == "decision")
        assert any(e.get("code") == "xid79-to-reboot" for e in audited.after["evidence"])
        assert "operator rule xid79-to-reboot" in audited.why

        path.write_text(SUPPRESS)  # the service keeps running
        for _ in range(100):
            if source.generation >= 2:
                break
            await asyncio.sleep(0.05)
        assert source.generation == 2
        assert await d.handle(xid("gpu-node-2", 79, "agent|gpu-node-2|boot|1")) == []
        ignored = [r async for r in iter_records(js, "gpu-node-2") if r.what == "event_ignored"]
        assert ignored and "quiet-node-2" in ignored[-1].why
        (again,) = await d.handle(xid("gpu-node-3", 79, "agent|gpu-node-3|boot|1"))
        assert again.playbook == "gpu-lost"  # the route rule is gone with the old file

        path.write_text("overrides:\n  - name: bad\n    match: {kind: xid}\n    guards: []\n")
        await asyncio.sleep(0.3)
        assert source.last_error is not None and "cannot change safety guards" in source.last_error
        assert [o.name for o in source.current().overrides] == ["quiet-node-2"]  # last good rules stay
        assert [x.playbook for x in await _decisions(js)] == ["node-reboot", "gpu-lost"]
    finally:
        stop.set()
        await watcher
        await nc.close()
