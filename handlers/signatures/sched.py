"""Batch schedulers' own reports of a node's GPUs: Slurm's drain and invalid-node reasons.

Where it sits: one of the stateless families of ``handlers.signatures``, tried by ``classify_line`` on lines
whose skeleton holds ``gresgpucountreportedlower``. Slurm compares the GPUs ``slurmd`` finds on a node
(gres/gpu, from NVML or ``gres.conf``) with the configured count at every registration; when fewer are found it
drains the node (or marks it INVAL) with the reason "gres/gpu count reported lower than configured (F < C)",
which ``scontrol show node`` and ``sinfo -R`` print and ``slurmctld`` logs. In the public threads that is a GPU
that fell off the bus or a driver that lost it, and sometimes a changed MIG layout: a fault to look at, so
kind ``health_check`` with no playbook of its own (the handler escalates to a person, it never resets a GPU
on this evidence).
"""

from __future__ import annotations

import re

from handlers.signatures.model import Signal, freeze

_GRES_LOW_RE = re.compile(
    r"gres/gpu(?::(?P<type>[\w.\-]+))?\s+count\s+reported\s+lower\s+than\s+configured\s*\(\s*(?P<found>\d+)\s*<\s*"
    r"(?P<configured>\d+)\s*\)", re.IGNORECASE)
_NODE_RE = re.compile(r"\b(?:NodeName=|node\s+)(?P<node>[\w.\-\[\],]+)", re.IGNORECASE)


def classify_scheduler(text: str) -> Signal | None:
    """Slurm's "gres/gpu count reported lower than configured (F < C)" in one unwrapped line, or None."""
    m = _GRES_LOW_RE.search(text)
    if m is None:
        return None
    found, configured = int(m.group("found")), int(m.group("configured"))
    if found >= configured:
        return None
    node = _NODE_RE.search(text[:m.start()])
    return Signal(kind="health_check", code="slurm_gres_gpu_count_low", detail=freeze({
        "reporter": "slurm", "gpus_found": found, "gpus_configured": configured, "gres_type": m.group("type"),
        "slurm_node": node.group("node") if node else None}))


__all__ = ["classify_scheduler"]
