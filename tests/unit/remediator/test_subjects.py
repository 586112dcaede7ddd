"""Every KV key and subject is built in ``remediator.subjects``; the strings are the contract of DESIGN.md §4."""

from __future__ import annotations

import pytest

from remediator import subjects as s


@pytest.mark.parametrize(("built", "expected"), [
    (s.node_key("gpu-node-1.example"), "node.gpu-node-1_example"),
    (s.gpu_key("GPU-abc"), "gpu.GPU-abc"),
    (s.job_key("training", "pytorch-0"), "job.training.pytorch-0"),
    (s.job_key(" ", "a.b/c"), "job.default.a_b_c"),
    (s.pod_key("ml", "rank.0"), "pod.ml.rank_0"),
    (s.decision_key("inc-1"), "decision.inc-1"),
    (s.run_key("inc-1"), "run.inc-1"),
    (s.attempts_key("gpu-node-1.example"), "attempts.gpu-node-1_example"),
    (s.approval_key("inc-1"), "approval.inc-1"),
    (s.LEDGER_KEY, "safety.ledger"),
    (s.remediation_subject("n.1"), "remediation.n_1"),
    (s.audit_subject(None), "audit._cluster"),
    (s.agent_cmd_subject("n.1"), "agent.n_1.cmd"),
], ids=lambda v: str(v))
def test_keys_and_subjects_keep_their_contract_strings(built: str, expected: str) -> None:
    assert built == expected
