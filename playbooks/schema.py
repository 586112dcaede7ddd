"""The playbook schema: what a playbook YAML file may say, checked by pydantic when the catalog loads.

Where it sits: between the YAML files in ``playbooks/`` (reviewed like code) and the executor, which runs
a validated ``Playbook`` step by step. Nothing here runs anything; ``playbooks.catalog`` loads and checks
the files, ``playbooks.steps`` holds the step library the ``name`` of each step must come from.

Execution semantics the schema encodes (the executor implements them):

- ``steps`` run in order. A step may belong to a ``rung`` of the escalation ladder
  (isolate → reset → reboot → replace). The ``isolate`` rung is containment and always runs; the repair
  rungs (``reset``, ``reboot``, ``replace``) are fallbacks of each other: the first one present runs, and
  a later one runs only when an earlier one failed a step whose ``on_failure`` is ``next-rung``. Once a
  repair rung completes, the later repair rungs are skipped.
- ``on_failure``: ``escalate`` (stop and hand over to a person), ``continue`` (record and go on),
  ``rollback`` (undo what this run changed, then escalate), ``next-rung`` (abandon this rung, try the next;
  escalate when none is left).
- ``on_success: finish`` ends the playbook successfully after that step (e.g. memory came back after the
  orphans were killed, so nothing needs isolating).
- ``verification`` configures every ``health_check`` step of the playbook (hold-down time, interval);
  ``return_to_service`` refuses unless the run's last health check passed.
- ``rollback`` lists explicit undo steps; empty means "undo the completed steps in reverse order, each by
  its library undo".
- ``escalation`` says how the hand-over to a person is made.
- ``dry_run`` puts this playbook alone in shadow mode: it records what it would do and touches nothing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

OnFailure = Literal["escalate", "continue", "rollback", "next-rung"]
Rung = Literal["isolate", "reset", "reboot", "replace"]
RUNG_ORDER: tuple[str, ...] = ("isolate", "reset", "reboot", "replace")
REPAIR_RUNGS: frozenset[str] = frozenset({"reset", "reboot", "replace"})


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Serves(_Strict):
    """Which decisions the playbook serves (informative: decisions name their playbook directly)."""

    handlers: tuple[str, ...] = Field(default=(), description="handler families: xid, ecc, nccl, memleak, ...")
    kinds: tuple[str, ...] = Field(default=(), description="FaultEvent kinds")
    codes: tuple[int | str, ...] = Field(default=(), description="Xid numbers or other codes")
    summary: str = Field(default="", description="one line: when this playbook is chosen")


class StepSpec(_Strict):
    """One step of a playbook: a step-library name and its parameters."""

    name: str = Field(description="a step of the step library (playbooks.steps)")
    id: str | None = Field(default=None, description="unique id within the playbook (default: the name)")
    params: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(default=120.0, gt=0, le=7200)
    requires_approval: bool = False
    on_failure: OnFailure = "escalate"
    on_success: Literal["continue", "finish"] = Field(
        default="continue", description="finish: the playbook ends here, successfully (remaining steps skipped)")
    rung: Rung | None = None

    @property
    def key(self) -> str:
        return self.id or self.name


class Verification(_Strict):
    """How a health check verifies a GPU or node before it may return to service."""

    hold_down_s: float = Field(default=60.0, ge=0, description="health must pass continuously this long")
    interval_s: float = Field(default=5.0, gt=0, description="time between health probes")
    checks: tuple[str, ...] = Field(default=("nvml", "ecc", "memory"), description="agent checks to run")


class Escalation(_Strict):
    """The hand-over to a person."""

    severity: Literal["info", "warning", "critical"] = "warning"
    action: str = Field(default="investigate", description="what the person is asked to do")
    annotate: bool = True
    event: bool = True
    webhook: bool = Field(default=False, description="also POST to settings.escalation_webhook_url")


class Playbook(_Strict):
    """A validated playbook (one YAML file)."""

    version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = Field(min_length=1)
    serves: Serves = Field(default_factory=Serves)
    steps: tuple[StepSpec, ...] = Field(min_length=1)
    verification: Verification = Field(default_factory=Verification)
    rollback: tuple[StepSpec, ...] = ()
    escalation: Escalation = Field(default_factory=Escalation)
    dry_run: bool = False

    @field_validator("steps")
    @classmethod
    def _rungs_contiguous_and_ordered(cls, steps: tuple[StepSpec, ...]) -> tuple[StepSpec, ...]:
        seen: list[str] = []
        for s in steps:
            if s.rung is None:
                continue
            if seen and seen[-1] == s.rung:
                continue
            if s.rung in seen:
                raise ValueError(f"rung {s.rung!r} is split: the steps of one rung must be contiguous")
            if seen and RUNG_ORDER.index(s.rung) < RUNG_ORDER.index(seen[-1]):
                raise ValueError(f"rung {s.rung!r} after {seen[-1]!r}: rungs follow {' → '.join(RUNG_ORDER)}")
            seen.append(s.rung)
        return steps

    @model_validator(mode="after")
    def _unique_ids_and_sane_policies(self) -> Playbook:
        keys = [s.key for s in self.steps]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"step ids must be unique within a playbook; give `id:` to repeated {dupes}")
        for s in self.steps:
            if s.on_failure == "next-rung" and s.rung not in REPAIR_RUNGS:
                raise ValueError(f"step {s.key!r}: on_failure next-rung needs a repair rung (reset/reboot/"
                                 f"replace), not {s.rung!r}")
        return self

    def step(self, key: str) -> StepSpec:
        for s in self.steps:
            if s.key == key:
                return s
        raise KeyError(key)
