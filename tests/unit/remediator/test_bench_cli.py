"""``remediator bench``'s output: ``--json`` is one JSON document that any parser reads."""

from __future__ import annotations

import pytest


def test_bench_json_is_json_when_a_figure_is_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    """A percentile of nothing (no node cordoned) is NaN, which ``json.dumps`` writes as ``NaN``: no JSON
    parser but Python's reads it. ``--json`` writes null."""
    import json

    from remediator.cli.bench import _emit

    _emit({"p99_cordon_latency_s": float("nan"), "hops_ms": {"run": {"p50": float("inf")}}, "cordoned": 0,
           "lanes": [1.5, float("nan")]}, as_json=True)
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out
    assert json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the output")) == {
        "p99_cordon_latency_s": None, "hops_ms": {"run": {"p50": None}}, "cordoned": 0, "lanes": [1.5, None]}
