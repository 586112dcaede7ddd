"""Batch schedulers' own reports of a node's GPUs: Slurm's drain and invalid-node reasons, and the GPU checks of
LBNL Node Health Check (NHC), which Slurm runs as its ``HealthCheckProgram``.

Where it sits: one of the stateless families of ``handlers.signatures``, tried by ``classify_line`` on lines
whose skeleton holds ``gresgpucountreportedlower``. Slurm compares the GPUs ``slurmd`` finds on a node
(gres/gpu, from NVML or ``gres.conf``) with the configured count at every registration; when fewer are found it
drains the node (or marks it INVAL) with the reason "gres/gpu count reported lower than configured (F < C)",
which ``scontrol show node`` and ``sinfo -R`` print and ``slurmctld`` logs. In the public threads that is a GPU
that fell off the bus or a driver that lost it, and sometimes a changed MIG layout: a fault to look at, so
kind ``health_check`` with no playbook of its own (the handler escalates to a person, it never resets a GPU
on this evidence). NHC's "Health check failed:  Check check_nv_gpu_count 2 returned 1" is the same kind of
report when the failing check is a GPU one (its name holds ``nv``, ``nvidia``, ``nvsmi``, ``gpu``, ``xid``,
``dcgm``, ``nvlink``, ``ecc`` or ``cuda``): code ``nhc_gpu_check_failed``; NHC failing for any other reason (a
timeout, a signal, a disk check) is not a GPU signal.
"""

from __future__ import annotations

import re

from handlers.signatures.model import Signal, freeze

_GRES_LOW_RE = re.compile(
    r"gres/gpu(?::(?P<type>[\w.\-]+))?\s+count\s+reported\s+lower\s+than\s+configured\s*\(\s*(?P<found>\d+)\s*<\s*"
    r"(?P<configured>\d+)\s*\)", re.IGNORECASE)
_NHC_RE = re.compile(r"health\s+check\s+failed[.:]?\s*check\s+(?P<check>check_\w+)(?P<args>[^\n]*?)\s+returned\s+"
                     r"(?P<rc>\d+)", re.IGNORECASE)
_GPU_CHECK_WORDS = frozenset({"nv", "nvidia", "nvsmi", "gpu", "gpus", "xid", "dcgm", "dcgmi", "nvlink", "ecc", "cuda"})
_NODE_RE = re.compile(r"\b(?:NodeName=|node\s+)(?P<node>[\w.\-\[\],]+)", re.IGNORECASE)


def classify_scheduler(text: str) -> Signal | None:
    """Slurm's "gres/gpu count reported lower than configured (F < C)" or a failed NHC GPU check in one
    unwrapped line, or None."""
    m = _GRES_LOW_RE.search(text)
    if m is None:
        return _nhc(text)
    found, configured = int(m.group("found")), int(m.group("configured"))
    if found >= configured:
        return None
    node = _NODE_RE.search(text[:m.start()])
    return Signal(kind="health_check", code="slurm_gres_gpu_count_low", detail=freeze({
        "reporter": "slurm", "gpus_found": found, "gpus_configured": configured, "gres_type": m.group("type"),
        "slurm_node": node.group("node") if node else None}))


def _nhc(text: str) -> Signal | None:
    m = _NHC_RE.search(text)
    if m is None or int(m.group("rc")) == 0:
        return None
    check = m.group("check")
    if not _GPU_CHECK_WORDS & set(check.lower().split("_")[1:]):
        return None
    return Signal(kind="health_check", code="nhc_gpu_check_failed", detail=freeze({
        "reporter": "nhc", "check": check, "arguments": m.group("args").strip() or None,
        "returned": int(m.group("rc"))}))


__all__ = ["classify_scheduler"]
