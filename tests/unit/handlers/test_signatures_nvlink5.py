"""NVLink5 Xid 144-150 decode against NVIDIA's decode table (handlers/data/xid_144_150_decode.csv)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from handlers.signatures import classify_line
from handlers.signatures.nvlink5 import decode_nvlink5, decode_table


def test_the_table_is_the_reference_copy(shared_dir: Path) -> None:
    ours = Path(__file__).resolve().parents[3] / "handlers" / "data" / "xid_144_150_decode.csv"
    assert ours.read_bytes() == (shared_dir / "reference" / "xid-144-150-decode.csv").read_bytes()
    rows = decode_table()
    assert len(rows) == 95
    assert {r.xid for r in rows} == set(range(144, 151))
    assert all(len(r.intr_v1) == 32 and len(r.intr_v2) == 32 for r in rows)


def test_netir_link_event_from_the_catalog_example() -> None:
    sig = classify_line("[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
                        "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert sig is not None and sig.xid == 149 and sig.action == "WORKFLOW_NVLINK5_ERR"
    nv = sig.detail["nvlink"]
    assert isinstance(nv, Mapping)
    assert nv["subcode"] == "NETIR_LINK_EVT"
    assert nv["link"] == 1
    assert nv["severity_text"] == "Fatal"
    assert nv["intr_info"] == "0x021425c6"
    assert nv["error_status"] == "0x00000000"
    # IntrInfo bits [25:20] = 100001: a link-down reason that points at the peer device.
    assert nv["decoded_action"] == "RESET_GPU"
    assert nv["investigatory_action"] == "INVESTIGATE_PEER_DEVICE"
    assert sig.is_fatal and sig.playbook == "nvlink"
    assert sig.detail["nvlink_decoded_action"] == "RESET_GPU" and sig.detail["nvlink_link"] == 1
    assert sig.detail["nvlink_subcode"] == "NETIR_LINK_EVT"


def _intr(v1_pattern: str) -> int:
    return int(v1_pattern.replace("-", "0"), 2)


@pytest.mark.parametrize(
    ("xid", "subcode", "status", "action"),
    [
        (144, "SAW_MVB", 0x1, "IGNORE"),
        (144, "SAW_MVB", 0x2, "RESET_GPU"),
        (144, "SAW_MVB", 0x3, "RESET_GPU"),  # bit by bit, the most severe wins
        (144, "SAW_MVB", 0x24, "IGNORE"),
        (145, "RLW_REMAP", 0x4, "XID_154_EVAL"),
        (145, "RLW_REMAP", 0x44, "RESET_GPU"),
        (145, "RLW_SRC_TRACK", 0x2, "IGNORE"),
        (146, "TLW_CTRL", 0x4, "RESET_GPU"),
        (149, "NETIR_BER_EVENT", 0x3, "IGNORE"),
        (149, "NETIR_MFDE_EVENT", 0x3, "IGNORE"),  # an exact value, not bits 0 and 1
        (149, "NETIR_MFDE_EVENT", 0x5, "RESET_GPU"),
        (150, "MSE_WATCHDOG", 0x0, "RESET_GPU"),
    ],
)
def test_error_status_decode(xid: int, subcode: str, status: int, action: str) -> None:
    row = next(r for r in decode_table() if r.xid == xid and subcode in r.subcodes)
    intr = _intr(row.intr_v1)
    text = f", {subcode}  Nonfatal  XC0 i0 Link 07 (0x{intr:08x} 0x{status:08x} 0x0 0x0 0x0 0x0)"
    decoded = decode_nvlink5(xid, text)
    assert decoded is not None
    assert decoded.action == action
    assert decoded.link == 7 and decoded.subcode == subcode
    assert decoded.is_fatal == (action == "RESET_GPU")


def test_v2_intr_info_layout_is_decoded_too() -> None:
    row = next(r for r in decode_table() if r.xid == 146 and "TLW_CTRL" in r.subcodes)
    intr = _intr(row.intr_v2)
    decoded = decode_nvlink5(146, f", TLW_CTRL Fatal XC1 i0 Link 3 (0x{intr:08x} 0x00000004 0 0 0 0)")
    assert decoded is not None and decoded.action == "RESET_GPU"


def test_promoted_error_takes_action_2() -> None:
    row = next(r for r in decode_table() if r.xid == 145 and r.action2)
    promoted = int(row.promoted_v1.replace("-", "0"), 2)
    plain = _intr(row.intr_v1)
    text = ", RLW_RXPIPE Nonfatal XC0 i0 Link 2 (0x{:08x} 0x00000001 0x0 0x0 0x0 0x0)"
    up = decode_nvlink5(145, text.format(promoted))
    down = decode_nvlink5(145, text.format(plain))
    assert up is not None and up.promoted and up.action == "RESET_GPU"
    assert down is not None and not down.promoted and down.action == "IGNORE"


def test_decode_without_registers_falls_back_to_the_printed_severity() -> None:
    decoded = decode_nvlink5(147, ", TREX Nonfatal")
    assert decoded is not None and decoded.subcode == "TREX" and decoded.intr_info is None
    assert decode_nvlink5(74, "anything") is None


@pytest.mark.parametrize("xid", range(144, 151))
def test_every_nvlink5_code_classifies_with_its_decode(xid: int) -> None:
    sig = classify_line(f"NVRM: Xid (PCI:0019:01:00): {xid}, SOME_UNIT   Fatal   XC0 i0 Link 05 (0x00000000 "
                        "0x00000001 0x0 0x0 0x0 0x0)")
    assert sig is not None and sig.xid == xid and sig.pci_bus_id == "0019:01:00.0"
    assert "nvlink" in sig.detail
