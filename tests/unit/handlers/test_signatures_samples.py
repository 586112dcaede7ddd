"""The published samples (../shared/samples/signals.jsonl) through classify_line and remediator classify."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from handlers.signatures import Signal, classify_line
from remediator.cli.classify import classify_text
from remediator.contracts import normalize_pci_bus_id


def _rows(shared: Path) -> list[dict[str, Any]]:
    path = shared / "samples" / "signals.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _signals(row: dict[str, Any]) -> list[Signal]:
    if row.get("multiline"):
        return [f.signal for f in classify_text(row["text"])]
    sig = classify_line(row["text"])
    return [] if sig is None else [sig]


def _check(expect: dict[str, Any], signals: list[Signal]) -> None:
    if expect.get("none"):
        assert signals == []
        return
    assert signals, "expected a signal, found none"
    first = signals[0]
    if "xid" in expect:
        assert first.kind == "xid"
        assert first.xid == expect["xid"]
        assert first.code == expect["xid"]
        want = expect.get("pci")
        assert first.pci_bus_id == (None if want is None else normalize_pci_bus_id(want))
    if "kind" in expect:
        assert first.kind == expect["kind"]
    if "kind_prefix" in expect:
        assert first.kind.startswith(expect["kind_prefix"])
    if "kind_in" in expect:
        assert first.kind in expect["kind_in"]


def test_every_sample_is_judged_as_expected(shared_dir: Path) -> None:
    rows = _rows(shared_dir)
    assert len(rows) >= 10
    failures = []
    for row in rows:
        try:
            _check(row["expect"], _signals(row))
        except AssertionError as exc:
            failures.append(f"{row['text'][:80]!r}: {exc}")
    assert not failures, "\n".join(failures)


def test_sample_kinds_cover_the_families(shared_dir: Path) -> None:
    kinds = {s.kind for row in _rows(shared_dir) for s in _signals(row)}
    assert {"xid", "gpu_lost", "nccl_timeout", "nccl_error", "cuda_oom"} <= kinds


_WRAPPERS: dict[str, Callable[[str], str]] = {
    "cri": lambda t: "2024-01-01T00:00:00.000000000Z stdout F " + t,
    "docker-json": lambda t: json.dumps({"log": t + "\n", "stream": "stderr", "time": "2024-01-01T00:00:00Z"}),
    "journald-json": lambda t: json.dumps({"MESSAGE": t, "_HOSTNAME": "gpu-node-1", "PRIORITY": "4"}),
    "syslog": lambda t: "Mar  1 12:00:01 gpu-node-1 kernel: " + t,
    "iso-timestamp": lambda t: "2025-01-21T04:41:44.283575+00:00 gpu-node-1 " + t,
    "json-string": lambda t: json.dumps(t),
    "extra-spaces": lambda t: "   " + t.replace(", ", ",   ") + "   ",
}


@pytest.mark.parametrize("wrapper", sorted(_WRAPPERS))
def test_single_line_samples_survive_prefixes_and_envelopes(shared_dir: Path, wrapper: str) -> None:
    wrap = _WRAPPERS[wrapper]
    rows = [r for r in _rows(shared_dir) if not r.get("multiline")]
    failures = []
    for row in rows:
        sig = classify_line(wrap(row["text"]))
        try:
            _check(row["expect"], [] if sig is None else [sig])
        except AssertionError as exc:
            failures.append(f"{row['text'][:80]!r}: {exc}")
    assert not failures, "\n".join(failures)
