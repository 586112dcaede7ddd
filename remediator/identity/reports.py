"""An agent's signed report of the commands it refused, so that refusals reach the audit trail without the
agent holding any right beyond its own.

Where it sits: between the node agent (``remediator.agent.refusals`` builds and publishes it) and dispatch
(``remediator.dispatch`` verifies it and audits it). The agent may publish on ``faults.agent.<its node>``
only (``remediator.identity.roles``), so the report travels there — into FAULTS, beside its events — marked
by the header ``Remediator-Report: command-refusals`` and signed with the agent's key (the seed of its
``.creds``, whose public key is announced in KV ``agentkey.<node>``). Dispatch audits a report only when
its subject names its node and that node's announced key signed it: one ``command_refused`` record per
reason. Reports are bounded (at most ``MAX_REASONS`` reasons, strings cut) and batched by the agent (the
first refusal at once, then at most one report per interval), so a flood of forged commands costs the
audit trail a few records per interval, never one per command.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

REPORT_HEADER = "Remediator-Report"
REFUSALS_KIND = "command-refusals"
MAX_REASONS = 32
MAX_REPORT_BYTES = 64 * 1024


class RefusedCommands(BaseModel):
    """The commands refused for one reason since the last report, and the last of them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    count: int = Field(ge=1, le=2**31)
    last_verb: str = Field(default="", max_length=64)
    last_id: str = Field(default="", max_length=512)
    last_detail: str = Field(default="", max_length=512)


class CommandRefusalReport(BaseModel):
    """Version 1 of the report: ``id`` (the ``Nats-Msg-Id``), the node, the window and, by reason (the
    agent's ``CommandVerifier`` codes: ``unsigned``, ``untrusted``, ``bad-signature``, ``wrong-node``,
    ``expired``, ``replayed``, ``malformed``, …), what was refused; ``signer``/``sig`` by the agent's key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    kind: Literal["command-refusals"] = "command-refusals"
    id: str = Field(max_length=256)
    node: str = Field(max_length=253)
    since: datetime
    until: datetime
    refusals: dict[str, RefusedCommands] = Field(max_length=MAX_REASONS)
    signer: str | None = None
    sig: str | None = None


class DocumentSigner(Protocol):
    """What signs a report: ``remediator.signing.Signer`` (identity sits beside signing, never above it)."""

    def sign_document(self, doc: Mapping[str, Any], *, signer_field: str = "signer") -> dict[str, Any]: ...


def build(signer: DocumentSigner, *, report_id: str, node: str, since: datetime, until: datetime,
          refusals: dict[str, RefusedCommands]) -> bytes:
    """The report as sent: signed by ``signer`` (the exact bytes signed)."""
    body = json.loads(CommandRefusalReport(id=report_id, node=node, since=since, until=until,
                                           refusals=refusals).model_dump_json(exclude={"signer", "sig"}))
    return json.dumps(signer.sign_document(body), separators=(",", ":")).encode()


class ReportRefused(ValueError):
    """Why a report is not audited as its node's refusals; ``code`` is the ``event_ignored`` reason."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def verify(data: bytes, agent_key: str | None,
           verify_document: Callable[[Mapping[str, Any]], bool]) -> CommandRefusalReport:
    """The report in ``data`` when ``agent_key`` (the node's announced key) signed it, checked with
    ``verify_document`` (``remediator.signing.verify_document``); else ``ReportRefused``. The caller checks
    the subject against ``report.node``."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportRefused("malformed_report", f"refusal report of {len(data)} bytes is over the limit")
    try:
        raw: Any = json.loads(data)
        report = CommandRefusalReport.model_validate(raw)
    except (ValueError, ValidationError) as e:
        raise ReportRefused("malformed_report", f"not a refusal report: {str(e)[:200]}") from None
    if agent_key is None:
        raise ReportRefused("unverified_report", f"no agent key is announced for {report.node} "
                                                 f"(agentkey.{report.node}): its refusal report cannot be verified")
    if report.signer != agent_key or not isinstance(raw, dict) or not verify_document(raw):
        raise ReportRefused("unverified_report", f"the refusal report of {report.node} is not signed by its "
                                                 "announced agent key")
    return report
