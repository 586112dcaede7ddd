"""Container-log scanner: CRI parsing, partial lines, labels (line, labels.json, pod name), rotation."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from remediator.agent.podlogs import PodLogScanner, job_and_rank_from_pod, pod_labels
from remediator.agent.state import StateStore
from remediator.contracts import Origin

NOW = datetime(2025, 1, 1, tzinfo=UTC)
UID = "5f2c9a10-1111-2222-3333-444444444444"
TS = "2025-01-01T00:00:00.123456789Z"
WATCHDOG = ("[rank3]:[E1120 10:22:33.123456 2161 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=182, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
            "Timeout(ms)=600000) ran for 600015 milliseconds before timing out.")
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.11 GiB memory in "
       "use.")


class Sink:
    async def submit(self, events: object) -> None:  # pragma: no cover - scan_once is called directly
        raise AssertionError


def log_file(root: Path, pod: str = "llama-worker-2", container: str = "trainer", ns: str = "ml") -> Path:
    p = root / f"{ns}_{pod}_{UID}" / container / "0.log"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.touch()
    return p


def cri(msg: str, tag: str = "F", stream: str = "stderr") -> str:
    return f"{TS} {stream} {tag} {msg}\n"


def scanner(root: Path, tmp: Path) -> PodLogScanner:
    s = PodLogScanner(root, node="node-a", sink=Sink(), state=StateStore(tmp / "state"),
                      clock=lambda: NOW)
    s.restore()
    s.discover()
    return s


@pytest.mark.parametrize(("pod", "expected"), [
    ("llama-master-0", {"job": "llama", "rank": "0"}),
    ("llama-worker-2", {"job": "llama", "rank": "3"}),
    ("train-7-x8k2q", {"job": "train", "rank": "7"}),
    ("trainer-4", {"job": "trainer", "rank": "4"}),
    ("nginx", {}),
], ids=["pytorchjob-master", "pytorchjob-worker", "indexed-job", "ordinal", "none"])
def test_job_and_rank_from_pod_name(pod: str, expected: dict[str, str]) -> None:
    assert job_and_rank_from_pod(pod) == expected


def test_labels_json_overrides_the_pod_name(tmp_path: Path) -> None:
    p = log_file(tmp_path)
    assert pod_labels(p) == {"namespace": "ml", "pod": "llama-worker-2", "pod_uid": UID, "container": "trainer",
                             "job": "llama", "rank": "3"}
    (p.parent.parent / "labels.json").write_text('{"job": "pretrain-70b", "rank": 12}')
    assert pod_labels(p) is not None
    assert (pod_labels(p) or {})["job"] == "pretrain-70b" and (pod_labels(p) or {})["rank"] == "12"


def test_nccl_timeout_carries_pod_and_the_rank_the_line_names(tmp_path: Path) -> None:
    root = tmp_path / "pods"
    p = log_file(root)
    p.write_text(cri("step 100 loss 2.3", stream="stdout") + cri(WATCHDOG) + cri(OOM) + cri("NCCL INFO Channel 00/32"))
    s = scanner(root, tmp_path)
    events = s.scan_once()
    assert [(e.kind, e.code) for e in events] == [("nccl_timeout", "watchdog_timeout"), ("cuda_oom", events[1].code)]
    t = events[0]
    assert t.labels["pod"] == "llama-worker-2" and t.labels["namespace"] == "ml" and t.labels["container"] == "trainer"
    assert t.labels["rank"] == "3" and t.labels["job"] == "llama" and t.labels["seq"] == "182"
    assert t.labels["pod_uid"] == UID
    # the pod the path names is typed provenance; the job guessed from its name is not
    assert t.origin == Origin(pod="llama-worker-2", namespace="ml", pod_uid=UID, container="trainer")
    offset = len(cri("step 100 loss 2.3", stream="stdout").encode())
    assert t.id.startswith(f"agent|node-a|pod|{UID}|trainer|") and t.id.endswith(f"@{offset}")
    assert s.scan_once() == []


def test_partial_lines_are_joined(tmp_path: Path) -> None:
    root = tmp_path / "pods"
    p = log_file(root)
    a, b, c = WATCHDOG[:40], WATCHDOG[40:120], WATCHDOG[120:]
    p.write_text(cri("hello") + cri(a, "P") + cri(b, "P"))
    s = scanner(root, tmp_path)
    assert s.scan_once() == []
    # the position held back to the first part, so a restart here would re-read and join them again
    cur = s.positions()[str(p)]["current"]
    assert cur["offset"] == len(cri("hello").encode())
    with open(p, "a") as f:
        f.write(cri(c, "F"))
    events = s.scan_once()
    assert len(events) == 1 and events[0].kind == "nccl_timeout"
    assert events[0].message == WATCHDOG
    assert events[0].id.endswith(f"@{len(cri('hello').encode())}")


def test_restart_resumes_after_the_saved_position(tmp_path: Path) -> None:
    root = tmp_path / "pods"
    p = log_file(root)
    p.write_text(cri(WATCHDOG))
    s = scanner(root, tmp_path)
    assert len(s.scan_once()) == 1
    s.save()
    with open(p, "a") as f:
        f.write(cri(WATCHDOG.replace("SeqNum=182", "SeqNum=183")))
    s2 = scanner(root, tmp_path)
    events = s2.scan_once()
    assert [e.labels["seq"] for e in events] == ["183"]


def test_kubelet_rotation_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "pods"
    p = log_file(root)
    p.write_text(cri("hello"))
    s = scanner(root, tmp_path)
    assert s.scan_once() == []
    with open(p, "a") as f:
        f.write(cri(WATCHDOG))
    os.rename(p, p.with_name("0.log.20250101-000000"))
    p.write_text(cri(WATCHDOG.replace("SeqNum=182", "SeqNum=200")))
    s.discover()
    events = s.scan_once()
    assert [e.labels["seq"] for e in events] == ["182", "200"]


def test_a_new_pod_is_discovered_and_a_deleted_one_forgotten(tmp_path: Path) -> None:
    root = tmp_path / "pods"
    root.mkdir()
    s = scanner(root, tmp_path)
    assert s.scan_once() == []
    p = log_file(root, pod="bert-master-0")
    p.write_text(cri(WATCHDOG))
    s.discover()
    assert [e.labels["pod"] for e in s.scan_once()] == ["bert-master-0"]
    for f in p.parent.iterdir():
        f.unlink()
    p.parent.rmdir()
    p.parent.parent.rmdir()
    s.scan_once()
    s.discover()
    assert s.positions() == {}
