"""Hypothesis: under any interleaving of two executors (and crashes), no node runs two playbooks at once, the
blast-radius budget is never exceeded, and no completed step runs again.

The executor's coordination is modelled purely, one atomic operation per yield, over a model KV with the
same compare-and-set semantics as NATS KV (create fails when the key exists; update fails when the revision
moved). The decisions use the real pure parts: the gate's ``decide`` (the budget, breaker and lock guards over the
ledger, and the reservation they book) and the ``next_step`` plan over the real ``gpu-lost`` playbook.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from playbooks.catalog import PlaybookCatalog
from remediator.contracts import Decision, GpuRef, StepRecord
from remediator.run import next_step
from remediator.safety import Facts, Ledger, SafetyPolicy, reservation_key
from remediator.safety.gate import decide

T0 = datetime(2025, 1, 1, tzinfo=UTC)
PB = PlaybookCatalog.load().get("gpu-lost")
NODES = [f"n{i}" for i in range(6)]
POLICY = SafetyPolicy(enabled=frozenset({"lock", "budget", "breaker"}), budget_max_node_fraction=0.34,
                      budget_max_nodes=10, budget_max_gpu_fraction=1.0, budget_max_gpus=1000,
                      breaker_threshold=100)
LIMIT = POLICY.node_limit(len(NODES))


class Conflict(Exception):
    pass


@dataclass
class KV:
    data: dict[str, tuple[Any, int]] = field(default_factory=dict)
    seq: int = 0

    def get(self, key: str) -> tuple[Any, int]:
        return self.data.get(key, (None, 0))

    def cas(self, key: str, value: Any, rev: int) -> int:
        if self.get(key)[1] != rev:
            raise Conflict(key)
        self.seq += 1
        self.data[key] = (value, self.seq)
        return self.seq

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


@dataclass
class World:
    kv: KV = field(default_factory=KV)
    out: set[str] = field(default_factory=set)  # nodes tainted/cordoned in the model cluster
    running: dict[str, str] = field(default_factory=dict)  # node -> incident executing a step right now
    executed: list[tuple[str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def check_budget(self) -> None:
        if len(self.out) > LIMIT:
            self.violations.append(f"budget exceeded: {sorted(self.out)} > {LIMIT}")


def decision(node: str, n: int) -> Decision:
    return Decision(incident_id=f"inc-{n}", handler="t", playbook="gpu-lost", node=node, gpu=GpuRef(index=0),
                    group="g", reason="r", event_id=f"e{n}", kind="xid", code=79, decided_at=T0)


def run_decision(w: World, d: Decision, me: str) -> Generator[None, None, str]:
    """One delivery of ``d`` by replica ``me``, as the executor does it; yields between atomic operations."""
    lock_key = f"lock.{d.node}"
    run_key = f"run.{d.incident_id}"
    run, _ = w.kv.get(run_key)
    if run is not None and run["status"] == "finished":
        return "finished-before"
    try:
        w.kv.cas(lock_key, me, 0)  # create-if-absent
    except Conflict:
        return "locked"  # nak: redelivered later
    yield
    try:
        run, rrev = w.kv.get(run_key)
        if run is not None and run["status"] == "finished":
            return "finished-before"
        run = dict(run or {"status": "running", "records": {}, "guards": False, "outcome": ""})
        run["records"] = dict(run["records"])
        if not run["guards"]:
            while True:
                raw, lrev = w.kv.get("ledger")
                ledger: Ledger = raw or Ledger()
                pool = [{"name": n, "gpus": 8, "unschedulable": n in w.out, "taints": []} for n in NODES]
                facts = Facts(node={"name": d.node, "pool": "p", "gpus": 8}, quarantine="node",
                              playbook_dry_run=False, me=me, lock_holder=me, taint_key="t", pool_nodes=pool)
                new, gate = decide(d, POLICY, facts, ledger, T0)  # the executor's gate, pure
                yield
                if gate.stop is not None:
                    run.update(status="finished", outcome=f"blocked:{gate.stop.name}")
                    w.kv.cas(run_key, run, rrev)
                    return str(run["outcome"])
                try:
                    w.kv.cas("ledger", new, lrev)
                except Conflict:
                    continue  # re-read and re-decide
                break
            yield
            run["guards"] = True
            rrev = w.kv.cas(run_key, dict(run), rrev)
            yield
        while True:
            nxt = next_step(PB, run["records"])
            if nxt.spec is None:
                break
            key = nxt.spec.key
            run["records"][key] = StepRecord(name=nxt.spec.name, status="running")
            rrev = w.kv.cas(run_key, {**run, "records": dict(run["records"])}, rrev)
            yield
            holder = w.running.get(d.node)
            if holder is not None and holder != d.incident_id:
                w.violations.append(f"{d.node} runs {holder} and {d.incident_id} at once")
            w.running[d.node] = d.incident_id
            if nxt.spec.name in ("taint", "cordon"):
                w.out.add(d.node)
                w.check_budget()
            w.executed.append((d.incident_id, key))
            yield
            w.running.pop(d.node, None)
            run["records"][key] = StepRecord(name=nxt.spec.name, status="succeeded")
            rrev = w.kv.cas(run_key, {**run, "records": dict(run["records"])}, rrev)
            yield
        run.update(status="finished", outcome="done")
        w.kv.cas(run_key, {**run, "records": dict(run["records"])}, rrev)
        return "done"
    finally:
        if w.kv.get(lock_key)[0] == me:
            w.kv.delete(lock_key)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(st.sampled_from(NODES), min_size=1, max_size=8),
       schedule=st.lists(st.integers(0, 5), min_size=1, max_size=400))
def test_two_executors_never_share_a_node_exceed_the_budget_or_repeat_a_step(
        nodes: list[str], schedule: list[int]) -> None:
    w = World()
    queue = [decision(n, i) for i, n in enumerate(nodes)]
    pending = list(queue)
    workers: list[tuple[Generator[None, None, str], Decision, str] | None] = [None, None]
    lives = [0, 0]
    finished: set[str] = set()
    choices = iter(schedule)
    for _tick in range(5000):
        if not pending and all(x is None for x in workers):
            break
        c = next(choices, 0)
        i = c % 2
        if workers[i] is None:
            if not pending:
                i = 1 - i
                if workers[i] is None:
                    continue
            else:
                d = pending.pop(0)
                lives[i] += 1
                workers[i] = (run_decision(w, d, f"r{i}.{lives[i]}"), d, f"r{i}.{lives[i]}")
        cur = workers[i]
        assert cur is not None
        gen, d, _me = cur
        if c == 5:  # crash: the replica dies mid-way; its lock expires (TTL) and the message is redelivered
            gen.close()  # runs the generator's finally, which models the lock TTL expiry
            if w.running.get(d.node) == d.incident_id:
                w.running.pop(d.node)
            workers[i] = None
            pending.append(d)
            continue
        try:
            next(gen)
        except StopIteration as stop:
            workers[i] = None
            if stop.value == "locked":
                pending.append(d)
            else:
                finished.add(d.incident_id)
    assert not w.violations, w.violations
    assert len(w.out) <= LIMIT
    # No completed step ran again: each (incident, step) ran once, or again only after an interrupted run.
    runs: dict[tuple[str, str], int] = {}
    for k in w.executed:
        runs[k] = runs.get(k, 0) + 1
    for (inc, key), n in runs.items():
        if n > 1:
            rec = w.kv.get(f"run.{inc}")[0]["records"][key]
            assert rec.status in ("running", "succeeded")
    for inc in finished:
        run = w.kv.get(f"run.{inc}")[0]
        if run["outcome"] == "done":
            assert set(run["records"]) == {s.key for s in PB.steps}
            assert all(r.status == "succeeded" for r in run["records"].values())


def test_a_completed_step_is_never_executed_again_after_a_crash() -> None:
    w = World()
    d = decision("n0", 0)
    gen = run_decision(w, d, "a")
    for _ in range(8):  # through the guards and the taint step
        next(gen)
    gen.close()
    done_before = list(w.executed)
    assert ("inc-0", "taint") in done_before
    gen = run_decision(w, d, "b")
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        assert stop.value == "done"
    assert [k for _, k in w.executed].count("taint") == 1
    assert [k for _, k in w.executed] == [s.key for s in PB.steps]
    assert w.kv.get("ledger")[0].reservations[reservation_key(d)]["incident"] == "inc-0"
