"""``remediator classify`` (DESIGN.md §10): JSON lines shape, stdin, Alertmanager payloads, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from remediator.cli import main
from remediator.cli.classify import ROW_KEYS

KEYS = {"line", "kind", "xid", "pci_bus_id", "gpu_index", "action", "playbook"}
UUID = "GPU-265c9814-6156-355b-e589-ff2064894f16"

LOG = "\n".join([
    "2024-01-01T00:00:00.000000000Z stdout F iteration 100/1000 | lm loss: 2.1 |",
    "[  219.470994] NVRM: GPU at PCI:0000:07:00: GPU-509665ad-1d57-2e8f-6c2b-9f0e1a2b3c4d",
    "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', "
    "name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer",
    "gpu-node-3:1234:1290 [3] NCCL INFO Channel 05/0 : 3[3] -> 4[4] via P2P/IPC/read",
    "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and "
    "Reset)",
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="' + UUID + '",device="nvidia0",Hostname="h"} 0',
    "[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600060 "
    "milliseconds before timing out.",
    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 162, pid=7194, power smoothing",
]) + "\n"


def _rows(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def test_json_rows_have_exactly_the_contract_keys(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(LOG)
    result = CliRunner().invoke(main, ["classify", "--json", str(log)])
    assert result.exit_code == 0, result.output
    rows = _rows(result.stdout)
    assert all(set(r) == KEYS for r in rows)
    assert set(ROW_KEYS) == KEYS
    assert [(r["line"], r["kind"], r["xid"]) for r in rows] == [
        (3, "xid", 48), (5, "xid", 154), (7, "nccl_timeout", None), (8, "xid", 162)]
    dbe, x154, nccl, x162 = rows
    assert dbe == {"line": 3, "kind": "xid", "xid": 48, "pci_bus_id": "0000:07:00.0", "gpu_index": None,
                   "action": "WORKFLOW_XID_48", "playbook": "gpu-memory-fatal"}
    assert x154["action"] == "XID_154" and x154["pci_bus_id"] == "0009:01:00.0" and x154["playbook"] == "gpu-reset"
    assert nccl["action"] is None and nccl["pci_bus_id"] is None
    assert x162["action"] is None  # the catalog has no bucket for 162 yet
    assert x162["playbook"] == "unknown-xid"


def test_stdin_when_no_file() -> None:
    result = CliRunner().invoke(main, ["classify", "--json"], input=LOG)
    assert result.exit_code == 0
    assert [r["line"] for r in _rows(result.stdout)] == [3, 5, 7, 8]


def test_clean_logs_print_nothing_and_exit_zero(tmp_path: Path) -> None:
    clean = tmp_path / "clean.log"
    clean.write_text("\n".join(LOG.splitlines()[i] for i in (0, 1, 3, 5)) + "\n")
    result = CliRunner().invoke(main, ["classify", "--json", str(clean)])
    assert result.exit_code == 0 and result.stdout == ""
    empty = CliRunner().invoke(main, ["classify", "--json"], input="")
    assert empty.exit_code == 0 and empty.stdout == ""


def test_unreadable_file_exits_2_with_a_message(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["classify", "--json", str(tmp_path / "missing.log")])
    assert result.exit_code == 2
    assert "missing.log" in result.stderr and result.stdout == ""


def test_table_goes_to_stderr_without_json(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(LOG)
    result = CliRunner().invoke(main, ["classify", str(log)])
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "WORKFLOW_XID_48" in result.stderr and "4 signals" in result.stderr


def _payload(alerts: list[dict[str, object]]) -> dict[str, object]:
    return {"version": "4", "status": "firing", "receiver": "r", "groupLabels": {}, "commonLabels": {},
            "commonAnnotations": {}, "externalURL": "", "groupKey": "{}:{}", "truncatedAlerts": 0, "alerts": alerts}


GPU_ALERT: dict[str, object] = {
    "status": "firing",
    "labels": {"alertname": "GPUXidError", "Hostname": "node-1", "gpu": "3", "UUID": UUID,
               "pci_bus_id": "00000000:97:00.0", "err_code": "79"},
    "annotations": {}, "startsAt": "2024-01-01T00:00:00Z", "fingerprint": "a",
}
ECC_ALERT: dict[str, object] = {
    "status": "firing",
    "labels": {"alertname": "GPURowRemapPending", "hostname": "node-2", "device": "nvidia5"},
    "annotations": {"description": "DCGM_FI_DEV_ROW_REMAP_PENDING is 1"},
    "startsAt": "2024-01-01T00:00:00Z", "fingerprint": "b",
}
CPU_ALERT: dict[str, object] = {
    "status": "firing", "labels": {"alertname": "HighCPU", "instance": "x:9100"}, "annotations": {},
    "startsAt": "2024-01-01T00:00:00Z", "fingerprint": "c",
}


def test_pretty_printed_payload_among_log_lines(tmp_path: Path) -> None:
    doc = json.dumps(_payload([GPU_ALERT, CPU_ALERT, ECC_ALERT]), indent=2)
    text = "noise\n" + doc + "\n" + LOG.splitlines()[2] + "\n"
    path = tmp_path / "mixed.txt"
    path.write_text(text)
    rows = _rows(CliRunner().invoke(main, ["classify", "--json", str(path)]).stdout)
    payload_lines = doc.count("\n") + 1
    assert rows == [
        {"line": 2, "kind": "xid", "xid": 79, "pci_bus_id": "0000:97:00.0", "gpu_index": 3, "action": "RESTART_BM",
         "playbook": "gpu-lost"},
        {"line": 2, "kind": "ecc", "xid": None, "pci_bus_id": None, "gpu_index": 5, "action": None,
         "playbook": "row-remap-pending"},
        {"line": 2 + payload_lines, "kind": "xid", "xid": 48, "pci_bus_id": "0000:07:00.0", "gpu_index": None,
         "action": "WORKFLOW_XID_48", "playbook": "gpu-memory-fatal"},
    ]


def test_one_payload_per_line(tmp_path: Path) -> None:
    lines = [json.dumps(_payload([CPU_ALERT])), json.dumps(_payload([GPU_ALERT])), json.dumps(_payload([ECC_ALERT]))]
    path = tmp_path / "payloads.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rows = _rows(CliRunner().invoke(main, ["classify", "--json", str(path)]).stdout)
    assert [(r["line"], r["kind"]) for r in rows] == [(2, "xid"), (3, "ecc")]


def test_non_gpu_payload_prints_nothing(shared_dir: Path, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (shared_dir / "samples" / "signals.jsonl").read_text().splitlines()]
    sample = next(r for r in rows if '"alerts"' in r["text"])
    path = tmp_path / "am.json"
    path.write_text(sample["text"])
    result = CliRunner().invoke(main, ["classify", "--json", str(path)])
    assert result.exit_code == 0 and result.stdout == ""


def test_zero_valued_alert_prints_nothing() -> None:
    alert = {**GPU_ALERT, "labels": {**GPU_ALERT["labels"], "err_code": "0"}}  # type: ignore[dict-item]
    result = CliRunner().invoke(main, ["classify", "--json"], input=json.dumps(_payload([alert])))
    assert result.exit_code == 0 and result.stdout == ""


def test_docker_json_log_lines_are_log_lines_not_payloads() -> None:
    line = json.dumps({"log": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n", "stream": "stdout"})
    rows = _rows(CliRunner().invoke(main, ["classify", "--json"], input=line + "\n").stdout)
    assert [(r["line"], r["xid"], r["pci_bus_id"]) for r in rows] == [(1, 79, "0000:3b:00.0")]


def test_several_files_number_lines_per_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text(LOG)
    b.write_text("x\n" + LOG.splitlines()[2] + "\n")
    rows = _rows(CliRunner().invoke(main, ["classify", "--json", str(a), str(b)]).stdout)
    assert [r["line"] for r in rows] == [3, 5, 7, 8, 2]


def test_crlf_and_undecodable_bytes(tmp_path: Path) -> None:
    path = tmp_path / "crlf.log"
    path.write_bytes(b"\xff\xfe junk\r\n" + LOG.splitlines()[2].encode() + b"\r\n")
    rows = _rows(CliRunner().invoke(main, ["classify", "--json", str(path)]).stdout)
    assert [(r["line"], r["xid"]) for r in rows] == [(2, 48)]


def test_installed_entry_point_end_to_end(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(LOG)
    proc = subprocess.run([sys.executable, "-c", "from remediator.cli import main; main()", "classify", "--json"],
                          input=LOG, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [r["xid"] for r in _rows(proc.stdout)] == [48, 154, None, 162]
    missing = subprocess.run([sys.executable, "-c", "from remediator.cli import main; main()", "classify",
                              str(tmp_path / "nope")], capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
