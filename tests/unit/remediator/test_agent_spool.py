"""Spool: durable order, restart, torn records, size bound with a counter, compaction."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from remediator.agent.events import SpoolFull
from remediator.agent.spool import Spool
from remediator.contracts import FaultEvent

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def ev(i: int) -> FaultEvent:
    return FaultEvent(id=f"agent|n|b|{i}", source="agent", node="n", kind="xid", code=79, observed_at=NOW,
                      received_at=NOW, message="x" * 50)


def test_append_peek_advance_in_order(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    s.append([ev(1), ev(2)])
    s.append([ev(3)])
    assert s.pending == 3
    batch = s.peek(2)
    assert [e.id for e, _ in batch] == ["agent|n|b|1", "agent|n|b|2"]
    s.advance(batch[-1][1], count=2)
    assert s.pending == 1
    assert [e.id for e, _ in s.peek()] == ["agent|n|b|3"]


def test_survives_a_restart_with_its_head(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    s.append([ev(i) for i in range(5)])
    first = s.peek(2)
    s.advance(first[-1][1], count=2)
    again = Spool(tmp_path)
    assert again.pending == 3
    assert [e.id for e, _ in again.peek()] == [f"agent|n|b|{i}" for i in (2, 3, 4)]


def test_drained_spool_resets_its_files(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    s.append([ev(1)])
    (_, end), = s.peek()
    s.advance(end, count=1)
    assert s.pending == 0 and not s.data_path.exists() and not s.head_path.exists()


def test_a_torn_last_record_is_cut_off(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    s.append([ev(1)])
    with open(s.data_path, "ab") as f:
        f.write(b'{"version":1,"id":"agent|n|b|2"')  # crash in the middle of an append
    again = Spool(tmp_path)
    assert again.pending == 1
    assert [e.id for e, _ in again.peek()] == ["agent|n|b|1"]
    again.append([ev(3)])
    assert [e.id for e, _ in again.peek()] == ["agent|n|b|1", "agent|n|b|3"]


def test_full_spool_refuses_with_a_log_line_and_a_counter(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    one = len(ev(1).model_dump_json()) + 1
    s = Spool(tmp_path, max_bytes=one * 3)
    s.append([ev(1), ev(2), ev(3)])
    with caplog.at_level(logging.ERROR), pytest.raises(SpoolFull):
        s.append([ev(4)])
    with pytest.raises(SpoolFull):
        s.append([ev(5)])
    assert s.full_rejections == 2
    assert sum("spool full" in r.message for r in caplog.records) == 1
    # replaying part of it makes room: the acked prefix is compacted away
    batch = s.peek(2)
    s.advance(batch[-1][1], count=2)
    s.append([ev(4), ev(5)])
    assert [e.id for e, _ in s.peek()] == [f"agent|n|b|{i}" for i in (3, 4, 5)]
    assert s.stats()["full_rejections"] == 2
