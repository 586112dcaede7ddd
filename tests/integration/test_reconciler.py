"""The reconciler against a real nats-server and the simulated Kubernetes API: a deleted node settles its
handover, its reservation and its open incident; two replicas reconciling at once settle each thing once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from handlers.base import History, Incident
from remediator.natsd import EmbeddedNats
from remediator.reconciler import Reconciler
from remediator.safety import LedgerStore, reservation_key
from remediator.state import StateStore
from remediator.subjects import LEDGER_KEY, STATE_BUCKET, node_key

from .executor_support import T0, decision, rig

pytestmark = pytest.mark.timeout(90)


async def test_a_deleted_node_settles_its_handover_reservation_and_incident_once_across_two_replicas(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        kv = await r.js.key_value(STATE_BUCKET)
        store = LedgerStore(kv)
        escalated = await r.executor.execute(decision("gpu-node-1", "gpu-lost", incident="inc-esc"))
        assert escalated.outcome == "escalated"
        stuck = decision("gpu-node-1", "gpu-lost", gpu=4, incident="inc-stuck")
        await store.docs.update(LEDGER_KEY, lambda led: (led.reserved(stuck, "default", "gpu", T0), None))
        await StateStore(kv).update(node_key("gpu-node-1"), lambda h: (History(h.sightings, (
            Incident("inc-open", "gpu:gpu-node-1/GPU-7", "gpu-reset", T0, T0),)), None))
        run, _ = await r.executor._rails[2].get("inc-stuck") if r.executor._rails else (None, 0)
        assert run is None

        a = Reconciler(kv, r.executor.kube, r.audit, taint_key=r.settings.taint_key)  # type: ignore[arg-type]
        b = Reconciler(kv, r.executor.kube, r.audit, taint_key=r.settings.taint_key)  # type: ignore[arg-type]
        r.sim.delete("nodes", "gpu-node-1")
        got = await asyncio.gather(a.reconcile(incidents=True), b.reconcile(incidents=True))
        settled = sorted((s.subject, s.incident) for s in (*got[0], *got[1]))
        led = await store.read()
        assert led.handovers == {} and led.reservations == {}
        trail = [x for x in await r.audit_records("gpu-node-1") if x.what == "settled"]
        whats = sorted((x.after["subject"], x.incident) for x in trail)
        assert whats == [("handover", "inc-esc"), ("incident", "inc-open"), ("reservation", "inc-stuck")]
        assert settled == whats  # each settled by exactly one of the two replicas
        history, _ = await StateStore(kv).get(node_key("gpu-node-1"))
        assert history.incidents == ()
        assert reservation_key(stuck) not in led.reservations
