"""The one compare-and-set helper (``remediator.kv``) against a real nats-server's KV: revisions, lost races,
retries of a pure update, and the stores built on it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from handlers.base import History, Incident
from remediator import bus
from remediator.errors import Conflict
from remediator.kv import LostRace, json_documents
from remediator.natsd import EmbeddedNats
from remediator.safety import Lease, LockHeld, NodeLocks
from remediator.state import StateConflict, StateStore
from remediator.subjects import LOCKS_BUCKET

from .executor_support import T0, fast_settings


def _count_reads(docs: Any) -> list[bool]:
    """Every ``get`` of ``docs`` from now on, as its ``fresh`` flag, in a list that grows as they happen."""
    reads: list[bool] = []
    real_get = docs.get

    async def counted_get(key: str, *, fresh: bool = False) -> Any:
        reads.append(fresh)
        return await real_get(key, fresh=fresh)

    docs.get = counted_get
    return reads


async def test_put_names_the_revision_it_read_and_a_lost_race_is_a_conflict(kv: KeyValue) -> None:
    docs = json_documents(kv)
    absent = await docs.get("doc.a")
    assert (absent.value, absent.revision) == (None, 0)
    rev = await docs.put("doc.a", {"n": 1}, 0)
    with pytest.raises(LostRace) as created_twice:
        await docs.put("doc.a", {"n": 2}, 0)
    assert isinstance(created_twice.value, Conflict)
    rev2 = await docs.put("doc.a", {"n": 2}, rev)
    with pytest.raises(LostRace):
        await docs.put("doc.a", {"n": 3}, rev)  # stale: someone wrote revision rev2 since
    now = await docs.get("doc.a")
    assert (now.value, now.revision) == ({"n": 2}, rev2)
    assert await docs.delete("doc.a", rev) is False  # not ours any more
    assert await docs.delete("doc.a", rev2) is True
    assert (await docs.get("doc.a")).revision == 0


async def test_update_reapplies_its_pure_function_after_a_lost_race(kv: KeyValue) -> None:
    docs = json_documents(kv)
    await docs.put("doc.b", {"n": 0}, 0)
    seen: list[int] = []

    def bump(doc: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int]:
        n = int((doc or {})["n"])
        seen.append(n)
        return {"n": n + 1}, n + 1

    async def racing_writer() -> None:
        cur = await docs.get("doc.b")
        await docs.put("doc.b", {"n": 10}, cur.revision)

    real_get = docs.get
    raced = False

    async def get_then_race(key: str, *, fresh: bool = False) -> Any:
        nonlocal raced
        entry = await real_get(key, fresh=fresh)
        if not raced:  # another writer lands between our read and our write, once
            raced = True
            await racing_writer()
        return entry

    docs.get = get_then_race  # type: ignore[method-assign]
    assert await docs.update("doc.b", bump) == 11
    assert seen == [0, 10]  # decided again on the value that won
    assert (await real_get("doc.b")).value == {"n": 11}


async def test_update_writes_nothing_for_no_change_and_gives_up_after_max_attempts(kv: KeyValue) -> None:
    docs = json_documents(kv, max_attempts=3)
    rev = await docs.put("doc.c", {"n": 1}, 0)
    assert await docs.update("doc.c", lambda d: (d, "same")) == "same"
    assert (await docs.get("doc.c")).revision == rev

    calls = 0

    def always_raced(doc: dict[str, Any] | None) -> tuple[dict[str, Any] | None, None]:
        nonlocal calls
        calls += 1
        return {"n": 100 + calls}, None

    real_put = docs.put

    async def put_after_someone_else(key: str, value: Any, revision: int) -> int:
        await real_put(key, {"other": True}, (await docs.get(key)).revision)
        return await real_put(key, value, revision)

    docs.put = put_after_someone_else  # type: ignore[method-assign]
    with pytest.raises(LostRace, match="lost 3 times in a row"):
        await docs.update("doc.c", always_raced)
    assert calls == 3


async def test_state_store_keeps_its_api_on_the_helper(kv: KeyValue) -> None:
    store = StateStore(kv, max_attempts=2)
    history, rev = await store.get("node.n1")
    assert (history, rev) == (History(), 0)
    inc = Incident("inc-1", "g", "gpu-lost", T0, T0)
    assert await store.compare_and_set("node.n1", History(incidents=(inc,)), 0) is True
    assert await store.compare_and_set("node.n1", History(), 0) is False  # lost: someone created it first
    await store.close_incident("node.n1", "g")
    assert (await store.get("node.n1"))[0].incidents == ()
    assert issubclass(StateConflict, Conflict)


async def test_a_node_lock_taken_over_is_lost_on_renew_and_never_released_by_its_old_holder(
        nats_server: EmbeddedNats) -> None:
    nc, js = await bus.connect(nats_server.url)
    try:
        await bus.provision(js, fast_settings(nats_server.url))
        locks = NodeLocks(await js.key_value(LOCKS_BUCKET), lambda: T0)
        old = await locks.take("gpu-node-1", "a|inc-1|x", "inc-1", wait_s=0, retry_s=5)
        with pytest.raises(LockHeld) as held:
            await locks.take("gpu-node-1", "b|inc-2|y", "inc-2", wait_s=0.2, retry_s=5, poll_s=0.1)
        assert (held.value.holder, held.value.delay) == ("a|inc-1|x", 5)
        assert await locks.renew(old) and not old.lost.is_set()
        # The lease expired in the meantime (the TTL) and another replica took the node.
        await (await js.key_value(LOCKS_BUCKET)).purge("node.gpu-node-1")
        new = await locks.take("gpu-node-1", "b|inc-2|y", "inc-2", wait_s=0, retry_s=5)
        assert await locks.renew(old) is False and old.lost.is_set()
        await locks.release(old)  # a no-op: the lease is b's now
        got = await locks.try_take("gpu-node-1", "c|inc-3|z", "inc-3")
        assert got == "b|inc-2|y"
        await locks.release(new)
        assert isinstance(await locks.try_take("gpu-node-1", "c|inc-3|z", "inc-3"), Lease)
    finally:
        await nc.drain()


class LaggingReplica(KeyValue):
    """The bucket as a follower that has applied none of its writes answers direct gets (a replica right
    after an election, or under load, on a bucket declared ``allow_direct``); leader reads are real."""

    async def _get(self, key: str, revision: int | None = None) -> KeyValue.Entry:
        if self._direct:
            raise KeyNotFoundError
        return await super()._get(key, revision)


def _lagging(kv: KeyValue) -> KeyValue:
    return LaggingReplica(name=kv._name, stream=kv._stream, pre=kv._pre, js=kv._js, direct=True)


async def test_reads_from_a_lagging_replica_cost_one_lost_race_not_the_attempts(kv: KeyValue) -> None:
    await json_documents(kv).put("doc.lag", {"n": 1}, 0)
    docs = json_documents(_lagging(kv), max_attempts=2)
    stale = await docs.get("doc.lag")
    assert stale.revision == 0  # what the follower says: no such key
    assert (await docs.get("doc.lag", fresh=True)).value == {"n": 1}  # the leader has it
    with pytest.raises(LostRace, match="a replica had not seen it"):  # not nats-py's KeyNotFoundError
        await docs.put("doc.lag", {"n": 9}, 0)
    seen: list[dict[str, Any] | None] = []

    def bump(doc: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int]:
        seen.append(doc)
        n = int((doc or {"n": 0})["n"]) + 1
        return {"n": n}, n

    assert await docs.update("doc.lag", bump) == 2  # second try reads the leader: {"n": 1}, not nothing
    assert seen == [None, {"n": 1}]
    assert (await json_documents(kv).get("doc.lag")).value == {"n": 2}


async def test_a_lock_held_is_named_even_when_a_lagging_replica_has_not_seen_it(nats_server: EmbeddedNats) -> None:
    nc, js = await bus.connect(nats_server.url)
    try:
        await bus.provision(js, fast_settings(nats_server.url))
        real = await js.key_value(LOCKS_BUCKET)
        await NodeLocks(real, lambda: T0).take("gpu-node-2", "a|inc-1|x", "inc-1", wait_s=0, retry_s=5)
        # the follower says "free", the leader refuses the create: asked again, the leader names the holder
        got = await NodeLocks(_lagging(real), lambda: T0).try_take("gpu-node-2", "b|inc-2|y", "inc-2")
        assert got == "a|inc-1|x"
    finally:
        await nc.drain()


async def test_overlapping_updates_of_one_key_are_combined_into_few_writes_and_lose_none(kv: KeyValue) -> None:
    docs = json_documents(kv)
    await docs.put("doc.hot", {"items": []}, 0)
    puts = 0
    real_put = docs.put

    async def counted_put(key: str, value: Any, revision: int) -> int:
        nonlocal puts
        puts += 1
        return await real_put(key, value, revision)

    docs.put = counted_put  # type: ignore[method-assign]

    def add(i: int) -> Any:
        def fn(doc: dict[str, Any] | None) -> tuple[dict[str, Any], int]:
            items = list((doc or {})["items"])
            return {"items": [*items, i]}, len(items) + 1
        return fn

    def refuse(doc: dict[str, Any] | None) -> tuple[dict[str, Any], int]:
        raise ValueError("not this one")

    calls = [docs.update("doc.hot", add(i)) for i in range(50)]
    calls.insert(25, docs.update("doc.hot", refuse))
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, Exception)]
    assert [str(e) for e in errors] == ["not this one"]  # only the raising fn fails, and only its caller
    counts = sorted(r for r in results if isinstance(r, int))
    assert counts == list(range(1, 51))  # each saw the value its predecessors made: none lost, none twice
    stored = (await docs.get("doc.hot")).value or {}
    assert sorted(stored["items"]) == list(range(50))
    assert puts < 10, puts  # one write per batch, not one (and a lost race) per caller
    assert docs._turns == {}  # nothing left behind once every update returned


async def test_an_update_cancelled_before_its_turn_never_applies_and_strands_no_one(kv: KeyValue) -> None:
    docs = json_documents(kv)
    await docs.put("doc.cancel", {"n": 0}, 0)
    real_put = docs.put
    gate = asyncio.Event()

    async def slow_put(key: str, value: Any, revision: int) -> int:
        await gate.wait()
        return await real_put(key, value, revision)

    docs.put = slow_put  # type: ignore[method-assign]

    def bump(doc: dict[str, Any] | None) -> tuple[dict[str, Any], int]:
        n = int((doc or {})["n"]) + 1
        return {"n": n}, n

    first = asyncio.ensure_future(docs.update("doc.cancel", bump))  # holds the turn, its write waits on the gate
    await asyncio.sleep(0.05)
    waiting = asyncio.ensure_future(docs.update("doc.cancel", bump))  # queued behind it
    third = asyncio.ensure_future(docs.update("doc.cancel", bump))
    await asyncio.sleep(0.05)
    waiting.cancel()
    first.cancel()  # cancelled mid-write: its write still lands, and the queue behind it goes on
    await asyncio.sleep(0.05)
    gate.set()
    assert await third == 2
    with pytest.raises(asyncio.CancelledError):
        await first
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (await docs.get("doc.cancel")).value == {"n": 2}  # first and third; the cancelled waiter never applied
    assert docs._turns == {}


async def test_an_update_on_the_callers_own_read_saves_its_read_and_a_stale_one_loses_nothing(kv: KeyValue) -> None:
    docs = json_documents(kv)
    await docs.put("doc.r", {"n": 1}, 0)
    real_get = docs.get
    reads = _count_reads(docs)

    def bump(doc: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int]:
        n = int((doc or {})["n"]) + 1
        return {"n": n}, n

    read = await real_get("doc.r")
    assert await docs.update("doc.r", bump, read=read) == 2
    assert reads == []  # the caller's read was the update's read: one compare-and-set, no get
    # stale: someone wrote since the caller read; the compare-and-set fails and the update re-reads
    assert await docs.update("doc.r", bump, read=read) == 3
    assert reads == [True]
    assert (await real_get("doc.r")).value == {"n": 3}

    # unchanged on the caller's read: believed only once the server's own read says so
    def keep(doc: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int]:
        return doc, int((doc or {})["n"])

    assert await docs.update("doc.r", keep, read=read) == 3  # read said 2: the server's value wins
    assert reads == [True, True]


async def test_a_remembered_document_is_updated_without_a_read_and_another_writer_loses_nothing(
        kv: KeyValue) -> None:
    from remediator.kv import Documents

    def ident(doc: Any) -> Any:
        return doc

    mine = Documents(kv, ident, ident, remember=True)  # this replica: the safety ledger's way
    other = json_documents(kv)  # another replica (or the CLI) writing the same key
    reads = _count_reads(mine)

    def add(item: str) -> Any:
        def fn(doc: dict[str, Any] | None) -> tuple[dict[str, Any], None]:
            return {**(doc or {}), item: True}, None
        return fn

    await mine.update("doc.m", add("a"))
    assert reads == [False]  # nothing remembered yet: one read
    await mine.update("doc.m", add("b"))
    await mine.update("doc.m", add("c"))
    assert reads == [False]  # what it wrote last was the read of the next update: no get
    # another writer changes the key: the remembered value is stale, its compare-and-set fails, a fresh read wins
    cur = await other.get("doc.m")
    await other.put("doc.m", {**(cur.value or {}), "x": True}, cur.revision)
    await mine.update("doc.m", add("d"))
    assert reads == [False, True]
    assert (await other.get("doc.m")).value == {"a": True, "b": True, "c": True, "x": True, "d": True}
    # deleted elsewhere: the next update finds out by its compare-and-set, and starts from nothing
    cur = await other.get("doc.m")
    assert await other.delete("doc.m", cur.revision)
    await mine.update("doc.m", add("e"))
    assert (await other.get("doc.m")).value == {"e": True}
    # a document updated with nothing to change is believed only on the server's own read
    await mine.update("doc.m", lambda doc: (doc, None))
    assert reads[-1] is True
    # and remembers what that read said: the next update reads nothing
    before = len(reads)
    await mine.update("doc.m", add("f"))
    assert len(reads) == before


async def test_a_remembered_revision_read_again_is_not_decoded_again_and_a_new_one_is(kv: KeyValue) -> None:
    """The guards read the safety ledger's 16 handover shards at every decision; a shard unchanged since this
    replica last read or wrote it is the value it holds (one revision of a key is one value), not a decode."""
    from remediator.kv import Documents

    decoded: list[Any] = []

    def decode(doc: Any) -> Any:
        decoded.append(doc)
        return doc

    mine = Documents(kv, decode, lambda doc: doc, remember=True)
    other = json_documents(kv)
    await other.put("doc.r", {"n": 1}, 0)
    first = await mine.get("doc.r")
    again = await mine.get("doc.r")
    assert again is first and decoded == [{"n": 1}]  # fetched twice, decoded once
    await other.put("doc.r", {"n": 2}, first.revision)  # another writer: a new revision is decoded
    assert (await mine.get("doc.r")).value == {"n": 2} and decoded == [{"n": 1}, {"n": 2}]
    rev = await mine.put("doc.r", {"n": 3}, first.revision + 1)  # what this replica wrote is what it holds
    assert (await mine.get("doc.r", fresh=True)).revision == rev and decoded[-1] == {"n": 2}
    forgetful = Documents(kv, decode, lambda doc: doc)  # without ``remember`` every read is decoded
    await forgetful.get("doc.r")
    await forgetful.get("doc.r")
    assert decoded[-2:] == [{"n": 3}, {"n": 3}]
