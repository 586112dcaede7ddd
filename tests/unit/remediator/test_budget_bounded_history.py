"""Bounded state in pure form: a history keeps within its count and byte bounds (oldest sightings dropped,
counted as the marker), open incidents always kept; label bounds cut with a marker."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handlers import base
from handlers.base import HISTORY_MAX_BYTES, SIGHTING_FIELD_MAX, History, Incident, Sighting
from remediator.contracts import LABEL_VALUE_MAX, LABELS_MAX, TRUNCATED_LABEL, TRUNCATED_MARKER, bounded_labels

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def sighting(i: int, detail: str = "") -> Sighting:
    return Sighting(f"ev-{i}", "xid", 13, "GPU-0", T0 + timedelta(seconds=i), "job", detail)


def size(h: History) -> int:
    return len(json.dumps(h.to_json(), separators=(",", ":")).encode())


def test_a_history_of_huge_details_is_cut_and_stays_within_its_bytes() -> None:
    inc = Incident("inc-1", "gpu:n/GPU-0", "gpu-reset", T0, T0)
    h = History(tuple(sighting(i, "d" * 1_000_000) for i in range(15)), (inc,))
    b = h.bounded()
    assert size(b) <= HISTORY_MAX_BYTES and b.incidents == (inc,)
    assert all(len(s.detail) == SIGHTING_FIELD_MAX and s.detail.endswith("[truncated]") for s in b.sightings)


def test_the_oldest_sightings_go_first_and_are_counted() -> None:
    h = History(tuple(sighting(i) for i in range(3000)))
    b = h.bounded(max_sightings=1024)
    assert len(b.sightings) == 1024 and b.sightings[-1].event_id == "ev-2999" and b.dropped == 3000 - 1024
    assert History.from_json(b.to_json()).dropped == b.dropped
    assert b.bounded(max_sightings=1024) == b  # already bounded: unchanged


def test_a_history_within_its_bounds_is_measured_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bounded`` runs on every write: a history that needs nothing cut or dropped costs one measure of the
    whole document, not one per sighting."""
    measured: list[object] = []
    real = base._json_size
    monkeypatch.setattr(base, "_json_size", lambda doc: measured.append(doc) or real(doc))
    h = History(tuple(sighting(i, "NVRM: Xid 13") for i in range(12)))
    assert h.bounded() is h
    assert len(measured) == 1
    measured.clear()
    assert len(h.bounded(max_bytes=size(h) - 1).sightings) < 12  # over its bytes: measured sighting by sighting
    assert len(measured) > 12


@given(st.lists(st.text(max_size=3000), max_size=60), st.integers(min_value=2_000, max_value=50_000))
def test_bounded_never_exceeds_its_bytes(details: list[str], max_bytes: int) -> None:
    b = History(tuple(sighting(i, d) for i, d in enumerate(details))).bounded(max_bytes=max_bytes)
    assert size(b) <= max_bytes


def test_labels_are_cut_with_a_marker_and_named() -> None:
    out = bounded_labels({"a": "x" * 5000, "b": "ok", "k" * 300: "v"})
    assert out["a"].endswith(TRUNCATED_MARKER) and len(out["a"]) == LABEL_VALUE_MAX and out["b"] == "ok"
    assert out[TRUNCATED_LABEL].split(",")[0] == "a" and len(out) == 3
    many = bounded_labels({f"l{i:03d}": "v" for i in range(500)})
    assert len(many) == LABELS_MAX and TRUNCATED_LABEL in many


@given(st.dictionaries(st.text(max_size=300), st.text(max_size=1200), max_size=LABELS_MAX + 2))
def test_labels_within_the_limits_come_back_whole_in_key_order(labels: dict[str, str]) -> None:
    """The common case (nothing to cut) takes one pass; it must say what the cutting pass would."""
    from remediator.contracts import LABEL_KEY_MAX

    out = bounded_labels(labels)
    if len(labels) < LABELS_MAX and all(len(k) <= LABEL_KEY_MAX and len(v) <= LABEL_VALUE_MAX
                                        for k, v in labels.items()):
        assert out == labels and list(out) == sorted(labels) and TRUNCATED_LABEL not in out
    else:
        assert TRUNCATED_LABEL in out and len(out) <= LABELS_MAX
