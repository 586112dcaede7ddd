"""Bounded state (real nats-server, the real ingest app and dispatcher): labels and messages are cut at ingest
with a marker, a node's history stays within its bounds whatever arrives, and an alert that could never be
stored is never answered 503 (which Alertmanager would retry forever)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from handlers import default_registry
from handlers.base import HISTORY_MAX_BYTES
from remediator import bus
from remediator.audit import AuditLog
from remediator.contracts import LABEL_VALUE_MAX, TRUNCATED_LABEL, TRUNCATED_MARKER
from remediator.dispatch import Dispatcher
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings
from remediator.subjects import STATE_BUCKET, node_key

from .test_ingest import NODE, Ingest, gpu_alert, payload

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def ingest(nats_server: EmbeddedNats) -> AsyncIterator[Ingest]:
    settings = Settings(nats_url=nats_server.url)
    nc, js = await bus.connect(nats_server.url, name="test-bounded")
    await bus.provision(js, settings)
    ing = Ingest(nats_server, nc, js, settings, {})
    try:
        yield ing
    finally:
        await ing.client.aclose()
        await nc.close()


async def test_fifteen_alerts_with_a_1mb_label_do_not_disable_the_node(ingest: Ingest) -> None:
    huge = "x" * 1_000_000
    for i in range(15):
        alert = gpu_alert(f"{i:016x}", xid="13", blob=huge)
        r = await ingest.post("/v1/alertmanager", payload(alert))
        assert r.status_code == 200, r.text
    stored = await ingest.stored()
    assert len(stored) == 15
    for _subject, _headers, ev in stored:
        assert len(ev.labels["blob"]) == LABEL_VALUE_MAX and ev.labels["blob"].endswith(TRUNCATED_MARKER)
        assert ev.labels[TRUNCATED_LABEL] == "blob"

    d = await Dispatcher.create(ingest.nc, ingest.js, ingest.settings, AuditLog(ingest.js, "test"),
                                registry=default_registry())
    for _subject, _headers, ev in stored:
        await d.handle(ev)
    kv = await ingest.js.key_value(STATE_BUCKET)
    entry = await kv.get(node_key(NODE))
    assert entry.value is not None and len(entry.value) < HISTORY_MAX_BYTES

    # A real Xid 79 on the node is still decided on (its history is writable).
    r = await ingest.post("/v1/alertmanager", payload(gpu_alert("00000000000000ff", xid="79")))
    assert r.status_code == 200
    last = (await ingest.stored())[-1][2]
    decisions = await d.handle(last)
    assert [x.playbook for x in decisions] == ["gpu-lost"]


async def test_three_340kb_labels_are_accepted_cut_not_an_eternal_503(ingest: Ingest) -> None:
    big = "y" * 340_000
    alert = gpu_alert("0000000000000abc", a=big, b=big, c=big)
    r = await ingest.post("/v1/alertmanager", payload(alert))
    assert r.status_code == 200, r.text
    (_subject, _headers, ev), = await ingest.stored()
    assert {k: len(v) for k, v in ev.labels.items() if k in "abc"} == dict.fromkeys("abc", LABEL_VALUE_MAX)
    assert len(json.dumps(ev.model_dump(mode="json"))) < 64 * 1024


async def test_v1_events_with_oversized_fields_are_cut_with_a_marker(ingest: Ingest) -> None:
    body = [{"id": "api|big-1", "node": NODE, "kind": "xid", "code": 13, "message": "m" * 100_000,
             "labels": {"note": "n" * 200_000}}]
    r = await ingest.post("/v1/events", body)
    assert r.status_code == 200, r.text
    (_subject, _headers, ev), = await ingest.stored()
    assert ev.message.endswith(TRUNCATED_MARKER) and len(ev.message) == 8192
    assert ev.labels["note"].endswith(TRUNCATED_MARKER)
