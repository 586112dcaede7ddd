"""The DCGM alerting rules: valid for Prometheus, each with a ``promtool test rules`` case, over what a
stock dcgm-exporter exports, installed verbatim by the chart, and understood by the ingest.

``promtool`` comes from the Debian package ``prometheus``; a missing binary fails the test (never a skip).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from handlers.signatures.dcgm import signal_from_alert
from tests.deploy.chart import CHART, ROOT, only, render

RULES = CHART / "files" / "dcgm-rules.yaml"
NONDEFAULT_RULES = CHART / "files" / "dcgm-rules-nondefault.yaml"
TESTS_DIR = ROOT / "deploy" / "rules-tests"
RULE_TESTS = {RULES: TESTS_DIR / "dcgm-rules.test.yaml",
              NONDEFAULT_RULES: TESTS_DIR / "dcgm-rules-nondefault.test.yaml"}

# The fields dcgm-exporter's etc/default-counters.csv enables (NVIDIA/dcgm-exporter@00d6d344, the lines not
# commented out): the only metrics a stock exporter exports. ECC, retired-page and row-remap-pending
# fields are commented out there.
STOCK_DCGM_EXPORTER_FIELDS = frozenset({
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
})
METRIC = re.compile(r"\bDCGM_[A-Z0-9_]+\b")


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: install the Debian package `prometheus` (apt-get install prometheus)"
    return path


def _rules(path: Path) -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


@pytest.mark.parametrize("path", [RULES, NONDEFAULT_RULES], ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    out = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", [RULES, NONDEFAULT_RULES], ids=lambda p: p.name)
def test_promtool_test_rules(path: Path) -> None:
    test_file = RULE_TESTS[path]
    out = subprocess.run([_promtool(), "test", "rules", test_file.name], cwd=test_file.parent,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.mark.parametrize("path", [RULES, NONDEFAULT_RULES], ids=lambda p: p.name)
def test_every_rule_has_a_firing_and_a_silent_case(path: Path) -> None:
    cases = [c for t in yaml.safe_load(RULE_TESTS[path].read_text())["tests"] for c in t["alert_rule_test"]]
    for rule in _rules(path):
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it stays silent"


def test_an_old_xid_does_not_keep_firing() -> None:
    """The last-Xid gauge keeps its value: the rule looks at its changes, and the test proves silence for
    hours after one Xid while the gauge still holds it."""
    (xid,) = [r for r in _rules(RULES) if r["alert"] == "GPUXidError"]
    assert "changes(DCGM_FI_DEV_XID_ERRORS" in xid["expr"]
    cases = [c for t in yaml.safe_load(RULE_TESTS[RULES].read_text())["tests"] for c in t["alert_rule_test"]
             if c["alertname"] == "GPUXidError"]
    silent_late = [c for c in cases if not c["exp_alerts"] and str(c["eval_time"]).endswith("h")]
    assert {"3h", "6h"} <= {str(c["eval_time"]) for c in silent_late}


def test_default_rules_use_only_what_a_stock_dcgm_exporter_exports() -> None:
    for rule in _rules(RULES):
        used = set(METRIC.findall(rule["expr"]))
        assert used and used <= STOCK_DCGM_EXPORTER_FIELDS, (rule["alert"], used - STOCK_DCGM_EXPORTER_FIELDS)
    # and the optional ones really are optional: each uses a field the stock exporter lacks
    for rule in _rules(NONDEFAULT_RULES):
        assert set(METRIC.findall(rule["expr"])) - STOCK_DCGM_EXPORTER_FIELDS, rule["alert"]


def test_the_chart_installs_the_rule_files_verbatim() -> None:
    default = only(render({}), "PrometheusRule")["spec"]["groups"]
    assert default == yaml.safe_load(RULES.read_text())["groups"]
    both = only(render({"monitoring": {"prometheusRule": {"nonDefaultCounters": True}}}), "PrometheusRule")
    assert both["spec"]["groups"] == (yaml.safe_load(RULES.read_text())["groups"]
                                      + yaml.safe_load(NONDEFAULT_RULES.read_text())["groups"])


EXPECTED_SIGNAL = {
    "GPUXidError": "xid", "GPURowRemapFailure": "ecc", "GPUUncorrectableRowRemap": "ecc",
    "GPUTemperatureHigh": "thermal", "GPUDoubleBitECC": "ecc", "GPURowRemapPending": "ecc",
    "GPURetiredPagesPending": "ecc",
}


@pytest.mark.parametrize("path", [RULES, NONDEFAULT_RULES], ids=lambda p: p.name)
def test_the_ingest_understands_every_alert_the_rules_send(path: Path) -> None:
    """The labels and annotations promtool proved each alert carries are what Alertmanager forwards:
    the ingest's signature matcher turns each into the right kind of fault, on the right GPU."""
    assert {r["alert"] for r in _rules(path)} <= EXPECTED_SIGNAL.keys()
    for test in yaml.safe_load(RULE_TESTS[path].read_text())["tests"]:
        for case in test["alert_rule_test"]:
            for alert in case["exp_alerts"]:
                labels = {**alert["exp_labels"], "alertname": case["alertname"]}
                signal = signal_from_alert(labels, alert["exp_annotations"])
                assert signal is not None, case["alertname"]
                assert signal.kind == EXPECTED_SIGNAL[case["alertname"]]
                assert signal.gpu_index == int(labels["gpu"])
                if signal.kind == "xid":
                    assert signal.xid == int(labels["xid"])
