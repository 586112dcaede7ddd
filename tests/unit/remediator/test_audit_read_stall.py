"""A read of the audit stream never ends short in silence: a fetch that times out ends it only when the
consumer has nothing pending (``remediator.audit._iter_stream``); with records still pending (a NATS cluster
electing a new leader) it fetches again, and after ``STALLED_FETCHES`` timeouts in a row it raises a
``TemporaryError`` naming the stream. The double below has the shape of nats-py's stream info and pull
subscription; the behaviour against a real cluster is exercised by ``tests/integration/test_nats_cluster.py``."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest

from remediator.audit import STALLED_FETCHES, _iter_stream
from remediator.errors import TemporaryError


class _Msg:
    def __init__(self, seq: int, pending: int) -> None:
        self.subject = "audit.n0"
        self.data = b"{}"
        self.metadata = SimpleNamespace(sequence=SimpleNamespace(stream=seq), num_pending=pending)


class _PullSub:
    """Answers ``script`` in order: a list of messages, or ``"timeout"``; ``pending`` is what consumer_info says."""

    def __init__(self, script: list[Any], pending: int) -> None:
        self.script: Iterator[Any] = iter(script)
        self.pending = pending
        self.fetches = 0

    async def fetch(self, batch: int, timeout: float) -> list[_Msg]:  # noqa: ASYNC109 (nats-py's signature)
        self.fetches += 1
        step = next(self.script, "timeout")
        if step == "timeout":
            raise nats.errors.TimeoutError
        return list(step)

    async def consumer_info(self) -> Any:
        return SimpleNamespace(num_pending=self.pending)

    async def unsubscribe(self) -> None:
        return None


class _Js:
    def __init__(self, sub: _PullSub, last: int) -> None:
        self.sub = sub
        self.last = last

    async def stream_info(self, stream: str) -> Any:
        return SimpleNamespace(state=SimpleNamespace(last_seq=self.last, messages=self.last))

    async def pull_subscribe(self, subject: str, **kw: Any) -> _PullSub:
        return self.sub


async def _read(js: _Js) -> list[int]:
    return [seq async for _, seq, _ in _iter_stream(js, "AUDIT", "audit.n0", 10, 0.01)]  # type: ignore[arg-type]


async def test_a_timeout_with_records_pending_fetches_again_and_reads_them_all() -> None:
    sub = _PullSub(["timeout", "timeout", [_Msg(1, 1), _Msg(2, 0)]], pending=2)
    assert await _read(_Js(sub, last=2)) == [1, 2]
    assert sub.fetches == 3


async def test_a_timeout_with_nothing_pending_ends_the_read() -> None:
    sub = _PullSub(["timeout"], pending=0)
    assert await _read(_Js(sub, last=5)) == []  # nothing on this node's subject
    assert sub.fetches == 1


async def test_a_read_that_stays_stalled_is_a_temporary_error_not_a_short_chain() -> None:
    sub = _PullSub([[_Msg(1, 3)]], pending=3)
    with pytest.raises(TemporaryError, match="AUDIT: 3 message"):
        await _read(_Js(sub, last=4))
    assert sub.fetches == 1 + STALLED_FETCHES


class _LeaderlessAudit:
    """nats-py's JetStream as the appender sees it while AUDIT elects a leader: the head request times out
    ``timeouts`` times (nobody answers), then the empty chain is reported; publishes are acked."""

    def __init__(self, timeouts: int) -> None:
        self.timeouts = timeouts
        self.asked = 0
        self.published: list[dict[str, str]] = []
        self.direct: list[bool] = []

    async def get_last_msg(self, stream_name: str, subject: str, direct: bool | None = False) -> Any:
        from nats.js.errors import NotFoundError

        self.asked += 1
        self.direct.append(bool(direct))
        if self.asked <= self.timeouts:
            raise nats.errors.TimeoutError
        raise NotFoundError

    async def publish(self, subject: str, payload: bytes, stream: str, headers: dict[str, str]) -> Any:
        self.published.append(headers)
        return SimpleNamespace(seq=len(self.published), duplicate=None)


async def test_the_appender_asks_again_for_a_chain_head_nobody_answered() -> None:
    from remediator.audit import AuditLog

    js = _LeaderlessAudit(timeouts=2)
    log = AuditLog(js, "test", checkpoint_every=0)  # type: ignore[arg-type]
    record = await log.append("gpu-node-1", "event_accepted", "xid 79", once="accepted|e1")
    assert js.asked == 3 and record.seq == 1
    assert js.direct == [True] * 3  # a direct get each time: a timeout is not a stream that answers none
    assert js.published[0]["Nats-Msg-Id"] == "audit|accepted|e1"
