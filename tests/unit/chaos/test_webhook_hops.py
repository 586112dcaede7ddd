"""``bench webhook``'s cut of each alert's latency at the spans on its path (``chaos.bench.storm.webhook_hops``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chaos.bench.storm import HOPS, webhook_hops

MS = 1_000_000  # ns


def _span(trace: int, name: str, start_ms: float, node: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(context=SimpleNamespace(trace_id=trace), name=name, start_time=int(start_ms * MS),
                           attributes={"remediator.node": node} if node else {})


def _trace(trace: int, node: str, dispatch: float, run: float, *steps: float) -> list[SimpleNamespace]:
    return [_span(trace, "dispatch", dispatch), _span(trace, "executor.run", run, node),
            *(_span(trace, f"step s{i}", t) for i, t in enumerate(steps))]


def test_each_alert_is_cut_at_its_own_spans_and_the_hops_add_up_to_its_latency() -> None:
    posted = {"a": 1000 * MS, "b": 2000 * MS}
    cordoned = {"a": 1030 * MS, "b": 2050 * MS}
    spans = [*_trace(1, "a", 1004, 1015, 1027, 1026), *_trace(2, "b", 2003, 2020, 2040)]
    hops = webhook_hops(posted, cordoned, spans)
    assert list(hops) == list(HOPS)
    a = [hops[h][0] for h in HOPS]  # the traces in their order: a, then b
    b = [hops[h][1] for h in HOPS]
    assert a == pytest.approx([4, 11, 11, 4])  # the first step span is the earliest: 1026, not 1027
    assert b == pytest.approx([3, 17, 20, 10])
    assert sum(a) == pytest.approx(30) and sum(b) == pytest.approx(50)


def test_an_alert_whose_trace_misses_a_span_or_a_time_is_left_out() -> None:
    posted = {"a": 0, "b": 0, "c": 0}
    cordoned = {"a": 9 * MS, "b": 9 * MS}  # c never cordoned
    spans = [*_trace(1, "a", 1, 2, 3),
             _span(2, "dispatch", 1), _span(2, "executor.run", 2, "b"),  # b: no step span
             *_trace(3, "c", 1, 2, 3),
             *_trace(4, "elsewhere", 1, 2, 3)]  # a node no alert named
    hops = webhook_hops(posted, cordoned, spans)
    assert {h: len(v) for h, v in hops.items()} == dict.fromkeys(HOPS, 1)
    assert [hops[h][0] for h in HOPS] == pytest.approx([1, 1, 1, 6])
