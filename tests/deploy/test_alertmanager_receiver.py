"""The Alertmanager receiver snippet (deploy/alertmanager-receiver.yaml) is valid Alertmanager
configuration, checked by ``amtool check-config`` (Debian package ``prometheus-alertmanager``; a missing
binary fails the test) inside a minimal full configuration, and it points at the chart's Service.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import yaml

from tests.deploy.chart import NAMESPACE, ROOT, only, render

SNIPPET = ROOT / "deploy" / "alertmanager-receiver.yaml"


def _amtool() -> str:
    path = shutil.which("amtool")
    assert path, "amtool not found: install the Debian package `prometheus-alertmanager`"
    return path


def _full_config() -> dict[str, object]:
    snippet = yaml.safe_load(SNIPPET.read_text())
    return {
        "route": {"receiver": "default", "group_by": ["alertname"], "routes": snippet["route"]["routes"]},
        "receivers": [{"name": "default"}, *snippet["receivers"]],
    }


def test_amtool_check_config(tmp_path: Path) -> None:
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(_full_config()))
    out = subprocess.run([_amtool(), "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    assert "1 receivers" not in out.stdout  # both receivers were read


def test_amtool_refuses_a_broken_snippet(tmp_path: Path) -> None:
    """The check is real: the same wrapping with a receiver the route does not define fails."""
    broken = _full_config()
    broken["receivers"] = [{"name": "default"}]
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(broken))
    out = subprocess.run([_amtool(), "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_the_receiver_points_at_the_charts_service_and_sends_a_token() -> None:
    (receiver,) = yaml.safe_load(SNIPPET.read_text())["receivers"]
    (webhook,) = receiver["webhook_configs"]
    url = urlparse(webhook["url"])
    svc = only(render({}), "Service")
    assert url.hostname == f"{svc['metadata']['name']}.{NAMESPACE}.svc"
    assert url.port == svc["spec"]["ports"][0]["port"]
    assert url.path == "/v1/alertmanager"
    assert webhook["http_config"]["authorization"]["type"] == "Bearer"
    assert "credentials" not in webhook["http_config"]["authorization"]  # from a file, never inline
    route = yaml.safe_load(SNIPPET.read_text())["route"]["routes"][0]
    assert route["continue"] is True  # the fleet's own receivers still get the alerts
