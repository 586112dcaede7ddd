"""``contracts.Change``: the one value type of what an action changed, and the agent reply that carries it
with today's wire keys."""

from __future__ import annotations

import dataclasses
import json

import pytest

from playbooks.steps import Skipped
from remediator.contracts import AgentReply, Change


def test_a_change_is_frozen_and_defaults_to_nothing() -> None:
    c = Change(False)
    assert (c.before, c.after, c.detail) == ({}, {}, "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.changed = True  # type: ignore[misc]


def test_an_agent_reply_carries_a_change_on_the_wire_keys_agents_send_today() -> None:
    change = Change(True, {"isolated": False}, {"isolated": True}, "GPU 2 isolated")
    reply = AgentReply.of("cmd-1", True, change)
    wire = json.loads(reply.model_dump_json())
    # the change's keys, plus the envelope the agent fills in and signs as it sends (node, nonce, signer, sig)
    assert wire == {"version": 1, "id": "cmd-1", "ok": True, "changed": True, "detail": "GPU 2 isolated",
                    "before": {"isolated": False}, "after": {"isolated": True},
                    "node": None, "nonce": None, "signer": None, "sig": None}
    assert AgentReply.model_validate_json(reply.model_dump_json()).change == change


def test_a_reply_from_an_agent_of_before_reads_as_a_change() -> None:
    old = b'{"version": 1, "id": "cmd-2", "ok": false, "detail": "GPU 0 is held by pid 42"}'
    assert AgentReply.model_validate_json(old).change == Change(False, {}, {}, "GPU 0 is held by pid 42")


def test_a_skipped_step_is_still_a_change() -> None:
    s = Skipped(False, {}, {"returned": False}, "left out of service")
    assert isinstance(s, Change) and s != Change(False, {}, {"returned": False}, "left out of service")
