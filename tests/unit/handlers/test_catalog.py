"""The Xid catalog shipped as package data agrees with the reference CSV and routes to known playbooks."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from handlers.catalog import CATALOG, XidCatalog, playbook_for_xid, route
from remediator.contracts import PLAYBOOK_NAMES


def _reference_rows(shared_dir: Path) -> list[dict[str, str]]:
    with (shared_dir / "reference" / "xid-catalog.csv").open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def test_every_reference_code_is_present_with_the_same_immediate_action(shared_dir: Path) -> None:
    rows = _reference_rows(shared_dir)
    assert len(rows) == 172
    assert len(CATALOG) == 172
    for row in rows:
        info = CATALOG.get(int(row["xid"]))
        assert info is not None, row["xid"]
        assert info.immediate_action == (row["immediate_action"].strip() or None), row["xid"]
        assert info.investigatory_action == (row["investigatory_action"].strip() or None), row["xid"]
        assert info.mnemonic == row["mnemonic"]
        assert info.category == row["category"]


def test_every_playbook_is_in_the_vocabulary() -> None:
    assert {info.playbook for info in CATALOG} <= set(PLAYBOOK_NAMES)


def test_catalog_carries_source_and_version() -> None:
    assert CATALOG.version.startswith("nv-cat-7f70ce96")
    assert "7f70ce9684be0c9d98a367770341ccc1d8bca4465cebe42dab7e23d57df5d5a5" in CATALOG.source


@pytest.mark.parametrize(
    ("code", "playbook"),
    [
        pytest.param(79, "gpu-lost", id="79-fallen-off-bus"),
        pytest.param(48, "gpu-memory-fatal", id="48-dbe"),
        pytest.param(95, "gpu-memory-fatal", id="95-uncontained"),
        pytest.param(140, "gpu-memory-fatal", id="140-ecc-escape"),
        pytest.param(63, "row-remap-pending", id="63-remap-event"),
        pytest.param(64, "memory-retirement-failure", id="64-remap-failure"),
        pytest.param(74, "nvlink", id="74-nvlink"),
        pytest.param(136, "nvlink", id="136-link-training"),
        pytest.param(144, "nvlink", id="144-nvlink5"),
        pytest.param(150, "nvlink", id="150-nvlink5"),
        pytest.param(155, "nvlink", id="155-nvlink-sw"),
        pytest.param(119, "gsp-hang", id="119-gsp-timeout"),
        pytest.param(120, "gsp-hang", id="120-gsp-error"),
        pytest.param(62, "gsp-hang", id="62-uc-halt"),
        pytest.param(46, "gsp-hang", id="46-timeout"),
        pytest.param(109, "gsp-hang", id="109-ctxsw-timeout"),
        pytest.param(143, "gsp-hang", id="143-init"),
        pytest.param(158, "gsp-hang", id="158-fatal-timeout"),
        pytest.param(110, "gpu-reset", id="110-reset-bucket"),
        pytest.param(156, "gpu-reset", id="156-reset-bucket"),
        pytest.param(151, "node-reboot", id="151-restart-vm"),
        pytest.param(13, "app-xid-hardware-suspect", id="13-app"),
        pytest.param(31, "app-xid-hardware-suspect", id="31-app"),
        pytest.param(43, "app-xid-hardware-suspect", id="43-app"),
        pytest.param(45, "app-xid-hardware-suspect", id="45-sympathetic"),
        pytest.param(92, "ecc-correctable-rate", id="92-sbe-rate"),
        pytest.param(1, "unknown-xid", id="1-unused"),
        pytest.param(142, "unknown-xid", id="142-contact-support"),
        pytest.param(54, "unknown-xid", id="54-check-mechanicals"),
        pytest.param(159, "unknown-xid", id="159-check-uvm"),
        pytest.param(167, "unknown-xid", id="167-empty-bucket"),
        pytest.param(154, "unknown-xid", id="154-read-from-text"),
        pytest.param(9999, "unknown-xid", id="not-in-catalog"),
    ],
)
def test_playbook_for_xid(code: int, playbook: str) -> None:
    assert playbook_for_xid(code) == playbook


@pytest.mark.parametrize(
    ("code", "actionable", "escalates", "fatal"),
    [
        pytest.param(13, False, True, False, id="13-recorded-escalates-on-repeat"),
        pytest.param(8, False, True, False, id="8-restart-app"),
        pytest.param(94, False, True, False, id="94-contained"),
        pytest.param(43, False, True, False, id="43-ignore-but-application"),
        pytest.param(106, False, False, False, id="106-ignore"),
        pytest.param(63, True, False, False, id="63-remap-pending"),
        pytest.param(48, True, False, True, id="48-fatal"),
        pytest.param(79, True, False, True, id="79-fatal"),
        pytest.param(1, True, False, False, id="1-escalate-to-person"),
    ],
)
def test_actionability(code: int, actionable: bool, escalates: bool, fatal: bool) -> None:
    info = CATALOG.get(code)
    assert info is not None
    assert (info.actionable, info.escalates_on_repeat, info.is_fatal) == (actionable, escalates, fatal)


def test_unknown_code_is_absent_not_invented() -> None:
    assert CATALOG.get(9999) is None
    assert 9999 not in CATALOG


def test_route_of_code_outside_catalog_by_bucket() -> None:
    assert route(500, "RESET_GPU") == ("gpu-reset", True, False)
    assert route(500, None) == ("unknown-xid", True, False)


def test_from_text_rejects_duplicate_codes() -> None:
    text = ("xid,mnemonic,description,applies_to,category,immediate_action,investigatory_action\n"
            "13,A,a,all,app,RESTART_APP,\n13,A,a,all,app,RESTART_APP,\n")
    with pytest.raises(ValueError, match="twice"):
        XidCatalog.from_text(text)


def test_from_text_without_header_is_unversioned() -> None:
    cat = XidCatalog.from_text("xid,mnemonic,immediate_action\n79,LOST,RESTART_BM\n")
    assert cat.version == "unversioned"
    info = cat.get(79)
    assert info is not None and info.playbook == "gpu-lost" and info.investigatory_action is None
