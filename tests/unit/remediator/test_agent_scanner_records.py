"""The agent's log scanners take the path ``remediator classify`` takes: framing of records split over lines
and the operator's added signatures, in the kernel-log watcher and the container-log scanner alike."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from handlers.rules import RulesSource, parse_rules
from remediator.agent.events import GpuDirectory
from remediator.agent.kmsg import KernelLogWatcher, TextFileSource
from remediator.agent.podlogs import PodLogScanner
from remediator.agent.state import StateStore
from remediator.cli.agent import agent
from remediator.cli.classify import classify_text
from remediator.contracts import FaultEvent

NOW = datetime(2025, 1, 1, tzinfo=UTC)
BOOT = "0d5b9a3e-1111-2222-3333-444444444444"
UID = "5f2c9a10-1111-2222-3333-444444444444"
RULES = """\
version: 1
signatures:
  - {name: ib-port-down, pattern: 'mlx5_(?P<hca>\\d+): Port (?P<port>\\d+) link down', kind: nccl_error,
     code: ib_port_down}
  - {name: trainer-nan, pattern: 'found NaN in local grad norm', kind: job_failure, code: nan_grad_norm}
"""
# A watchdog report wrapped by a terminal (the key phrase over two lines), as the issue describes it.
WRAPPED = [
    "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] ProcessGroupNCCL's",
    "watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.",
]


class Sink:
    async def submit(self, events: Sequence[FaultEvent]) -> None:  # pragma: no cover - called directly
        raise AssertionError


def _kernel(tmp: Path, text: str, rules: str | None = None) -> list[FaultEvent]:
    tmp.mkdir(parents=True, exist_ok=True)
    p = tmp / "kmsg"
    p.write_text(text)
    source = RulesSource(None)
    provider = (lambda: parse_rules(rules)) if rules else source.current
    w = KernelLogWatcher(TextFileSource(p, boot_id=lambda: BOOT), node="node-a", sink=Sink(), gpus=GpuDirectory(),
                         state=StateStore(tmp / "state"), clock=lambda: NOW, rules=provider)
    return w.to_events(w.source.read())


def _pod(tmp: Path, lines: list[str], rules: str | None = None) -> list[FaultEvent]:
    root = tmp / "pods"
    log = root / f"ml_train-0_{UID}" / "trainer" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"2025-01-01T00:00:0{i}.000000000Z stderr F {m}\n" for i, m in enumerate(lines)))
    s = PodLogScanner(root, node="node-a", sink=Sink(), state=StateStore(tmp / "state"), clock=lambda: NOW,
                      rules=(lambda: parse_rules(rules)) if rules else (lambda: None))
    s.restore()
    s.discover()
    return s.scan_once()


def test_kernel_watcher_adds_the_operators_signatures(tmp_path: Path) -> None:
    text = "6,5,100,-;mlx5_0: Port 1 link down\n"
    assert _kernel(tmp_path / "a", text) == []
    (event,) = _kernel(tmp_path / "b", text, RULES)
    assert (event.kind, event.code, event.id) == ("nccl_error", "ib_port_down", f"agent|node-a|{BOOT}|5")


def test_pod_log_scanner_frames_a_wrapped_record_as_one_event_at_its_first_line(tmp_path: Path) -> None:
    (event,) = _pod(tmp_path, [*WRAPPED, "step 10 loss 1.2"])
    assert event.kind == "nccl_timeout"
    assert event.id.endswith("@0")  # the record's first line names the event
    assert "watchdog got stuck" in event.message and "ProcessGroupNCCL's" in event.message
    # the same lines through classify: one signal, at the same line
    assert [(f.line, f.signal.kind) for f in classify_text("\n".join(WRAPPED) + "\n")] == [(1, "nccl_timeout")]


def test_pod_log_scanner_adds_the_operators_signatures(tmp_path: Path) -> None:
    line = "[Rank 3] found NaN in local grad norm in backward pass, skipping"
    assert _pod(tmp_path / "a", [line]) == []
    (event,) = _pod(tmp_path / "b", [line], RULES)
    assert (event.kind, event.code) == ("job_failure", "nan_grad_norm")


def test_pod_log_partial_lines_are_joined_then_framed(tmp_path: Path) -> None:
    root = tmp_path / "pods"
    log = root / f"ml_train-0_{UID}" / "trainer" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"2025-01-01T00:00:00.1Z stderr P {WRAPPED[0][:30]}\n"
                   f"2025-01-01T00:00:00.2Z stderr F {WRAPPED[0][30:]}\n"
                   f"2025-01-01T00:00:00.3Z stderr F {WRAPPED[1]}\n")
    s = PodLogScanner(root, node="node-a", sink=Sink(), state=StateStore(tmp_path / "state"), clock=lambda: NOW)
    s.restore()
    s.discover()
    (event,) = s.scan_once()
    assert event.kind == "nccl_timeout" and event.id.endswith("@0")


def test_agent_refuses_a_broken_rules_file_naming_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "rules.yaml"
    bad.write_text("version: 1\nsignatures:\n  - {name: x, pattern: '(', kind: xid}\n")
    out = CliRunner().invoke(agent, ["--node", "n", "--check", "--rules", str(bad)])
    assert out.exit_code == 2
    assert f"{bad}:3:" in out.output and "Traceback" not in out.output
