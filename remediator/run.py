"""A run: one incident's playbook in progress, as the executor persists it, and the ladder that says what is next.

Where it sits: beside the executor, which owns the run while it holds the node lock. ``RunRecord`` is the
progress stored under ``run.<incident>`` in ``remediator-state`` (compare-and-set through ``remediator.kv``:
every save names the revision of the previous one, so a replica that lost the node lock cannot overwrite the
run of the one that took it); ``StoredRun`` is a record and its revision. ``next_step`` is the playbook
ladder as a pure function of the step records so far. ``RunResult`` is what a run came to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nats.js.kv import KeyValue

from playbooks.schema import REPAIR_RUNGS, Playbook, StepSpec
from remediator.contracts import Decision, StepRecord
from remediator.kv import Documents
from remediator.safety import GuardVerdict
from remediator.subjects import run_key

__all__ = ["Next", "RunLog", "RunRecord", "RunResult", "StepAction", "StoredRun", "handover_of", "left_by_run",
           "next_step"]


@dataclass(frozen=True)
class StepAction:
    """One line of a run's story: the step (its id), the library step, what happened."""

    step: str
    name: str
    status: str
    detail: str = ""


@dataclass(frozen=True)
class RunResult:
    """What a decision's run came to.

    ``outcome``: ``completed`` (every step ran or was skipped by the ladder), ``escalated`` (handed to a
    person: a step failed, or a guard said so), ``rolled-back``, ``dry-run`` (shadow: nothing touched),
    ``blocked`` (opt-out, breaker), ``cancelled`` (a person's override), ``node-gone``.
    ``actions`` lists the steps in the order they ran, with their status; ``verdicts`` the guard verdicts.
    """

    incident: str
    node: str
    playbook: str
    outcome: str
    actions: tuple[StepAction, ...] = ()
    verdicts: tuple[GuardVerdict, ...] = ()
    detail: str = ""

    def done(self) -> list[str]:
        """Names of the steps that succeeded, in order (what the demo prints as the actions)."""
        return [a.name for a in self.actions if a.status == "succeeded"]


@dataclass
class RunRecord:
    """The progress of one incident's run, stored under ``run.<incident>`` (compare-and-set)."""

    incident: str
    node: str
    playbook: str
    owner: str
    status: str = "running"  # running | finished
    outcome: str = ""
    detail: str = ""
    guards_passed: bool = False
    shadow: bool = False
    reserved: bool = False
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, StepRecord] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"incident": self.incident, "node": self.node, "playbook": self.playbook, "owner": self.owner,
                "status": self.status, "outcome": self.outcome, "detail": self.detail,
                "guards_passed": self.guards_passed, "shadow": self.shadow, "reserved": self.reserved,
                "verdicts": self.verdicts, "order": self.order,
                "records": {k: r.model_dump(mode="json") for k, r in self.records.items()}}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> RunRecord:
        return RunRecord(d["incident"], d["node"], d["playbook"], d.get("owner", ""), d.get("status", "running"),
                         d.get("outcome", ""), d.get("detail", ""), bool(d.get("guards_passed")),
                         bool(d.get("shadow")), bool(d.get("reserved")), list(d.get("verdicts", [])),
                         {k: StepRecord.model_validate(v) for k, v in d.get("records", {}).items()},
                         list(d.get("order", [])))

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    def put(self, key: str, rec: StepRecord) -> None:
        if key not in self.records:
            self.order.append(key)
        self.records[key] = rec

    def result(self) -> RunResult:
        actions = tuple(StepAction(k, self.records[k].name, self.records[k].status, self.records[k].detail)
                        for k in self.order)
        verdicts = tuple(GuardVerdict(v["guard"], v["allowed"], v["reason"], v.get("effect", "proceed"))
                         for v in self.verdicts)
        return RunResult(self.incident, self.node, self.playbook, self.outcome or self.status, actions, verdicts,
                         self.detail)


def _decode(raw: dict[str, Any] | None) -> RunRecord | None:
    return RunRecord.from_json(raw) if raw else None


def _encode(run: RunRecord | None) -> dict[str, Any]:
    return run.to_json() if run is not None else {}


@dataclass
class StoredRun:
    """A run record and the revision it was last stored at; ``save`` writes it on that revision."""

    log: RunLog
    run: RunRecord
    revision: int
    unsaved: bool = False  # a change ``defer`` left for the next write

    async def save(self) -> None:
        """Store the record; ``kv.LostRace`` when someone else wrote it since (another replica owns the run)."""
        self.revision = await self.log.docs.put(run_key(self.run.incident), self.run, self.revision)
        self.unsaved = False

    def defer(self) -> None:
        """Leave the change just made to the next ``save``, which follows before anything acts (the guards'
        outcome rides on the first step's ``running`` write: one compare-and-set, not two); ``flush`` writes
        it where no step follows."""
        self.unsaved = True

    async def flush(self) -> None:
        """Write what ``defer`` left, if anything."""
        if self.unsaved:
            await self.save()


class RunLog:
    """The run records of the state bucket."""

    def __init__(self, kv: KeyValue) -> None:
        self.docs: Documents[RunRecord | None] = Documents(kv, _decode, _encode)

    async def get(self, incident: str) -> tuple[RunRecord | None, int]:
        entry = await self.docs.get(run_key(incident))
        return entry.value, entry.revision


# --- the plan: which step is next -------------------------------------------------------------------


@dataclass(frozen=True)
class Next:
    """What the run does next: run ``spec``, or skip it with ``skip_reason``, or stop (``spec`` None)."""

    spec: StepSpec | None
    skip_reason: str = ""
    stop: str = ""  # "escalate" | "rollback" | "finish" when the run ends here


def next_step(pb: Playbook, records: Mapping[str, StepRecord]) -> Next:
    """The next step of ``pb`` given the step records so far: a pure function of the ladder semantics
    (playbooks.schema): repair rungs are fallbacks of each other; ``next-rung`` abandons a rung;
    ``on_success: finish`` ends the run; ``escalate``/``rollback`` failures stop it."""
    failed_rungs: set[str] = set()
    healed_by: str | None = None
    for s in pb.steps:
        rec = records.get(s.key)
        if rec is None or rec.status in ("pending", "running"):
            if s.rung in failed_rungs:
                return Next(s, skip_reason=f"rung {s.rung} abandoned after a failed step")
            if s.rung in REPAIR_RUNGS and healed_by is not None and healed_by != s.rung:
                return Next(s, skip_reason=f"rung {healed_by} already healed the fault")
            return Next(s)
        if rec.status == "failed":
            if s.on_failure == "next-rung":
                assert s.rung is not None
                failed_rungs.add(s.rung)
                continue
            if s.on_failure in ("escalate", "rollback"):
                return Next(None, stop=s.on_failure)
            continue  # continue
        if rec.status == "succeeded" and s.on_success == "finish":
            return Next(None, stop="finish")
        if s.rung in REPAIR_RUNGS and rec.status == "succeeded" and s.rung not in failed_rungs:
            # a repair rung whose steps all succeeded heals; remember it once its last step is through
            last_of_rung = [x for x in pb.steps if x.rung == s.rung][-1]
            if last_of_rung.key == s.key and s.rung != "replace":
                healed_by = s.rung
    repair = [r for r in dict.fromkeys(x.rung for x in pb.steps) if r in REPAIR_RUNGS]
    if repair and healed_by is None and all(r in failed_rungs for r in repair):
        return Next(None, stop="escalate")
    return Next(None)


# --- what a run leaves behind -----------------------------------------------------------------------

_PLACES = ("taint", "cordon", "isolate_gpu")
_UNDOES = {"untaint": "taint", "uncordon": "cordon", "release_gpu": "isolate_gpu"}


def left_by_run(run: RunRecord) -> list[str]:
    """What of ours the run leaves in place, from its step records in order: a ``taint``, ``cordon`` or
    ``isolate_gpu`` that changed the node, less what a later ``return_to_service`` (that returned) or a
    rollback's undo step took back."""
    left: list[str] = []
    for key in run.order:
        rec = run.records[key]
        if rec.status != "succeeded":
            continue
        if rec.name in _PLACES and rec.after.get("changed_by_us") and rec.name not in left:
            left.append(rec.name)
        elif rec.name in _UNDOES and _UNDOES[rec.name] in left:
            left.remove(_UNDOES[rec.name])
        elif rec.name == "return_to_service" and rec.after.get("returned"):
            left.clear()
    return left


def handover_of(d: Decision, outcome: str, left: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The ledger's handover entry for a run that ended (``outcome``) leaving its target out of service:
    ``kind`` is ``node`` when our taint or cordon stays, else ``gpu`` (an isolation stays)."""
    ours = list(left.get("ours") or [])
    kind = "node" if ("taint" in ours or "cordon" in ours) else "gpu"
    return {"incident": d.incident_id, "node": d.node, "gpu": d.gpu.key if d.gpu else None,
            "pool": left.get("pool") or "default", "kind": kind, "outcome": outcome, "left": ours,
            "at": now.isoformat()}
