"""The operator's rules file (``remediation.rulesConfigMap``) as the chart renders it: one ConfigMap, read by
the service through ``REMEDIATOR_RULES_FILE`` and by every agent through ``--rules``, at the path each is told,
and nothing of it rendered when the value is empty."""

from __future__ import annotations

from typing import Any

import helm_python.errors
import pytest

from remediator.cli.agent import agent as agent_command
from remediator.settings import Settings
from tests.deploy.chart import container, env, only, render

RULES = {"remediation": {"rulesConfigMap": "fleet-rules"}}


def _rules_file(workload: dict[str, Any]) -> tuple[str, str]:
    """(mount path, ConfigMap name) of the workload's ``rules`` volume."""
    pod = workload["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "rules")
    mount = next(m for m in container(workload)["volumeMounts"] if m["name"] == "rules")
    assert mount.get("readOnly") is True
    (item,) = volume["configMap"]["items"]
    assert item["key"] == "rules.yaml"
    return f"{mount['mountPath']}/{item['path']}", volume["configMap"]["name"]


def test_the_service_reads_the_rules_configmap_where_its_setting_points() -> None:
    deployment = only(render(RULES), "Deployment")
    path, name = _rules_file(deployment)
    assert name == "fleet-rules"
    variables = env(container(deployment))
    assert variables["REMEDIATOR_RULES_FILE"] == path
    assert Settings(rules_file=variables["REMEDIATOR_RULES_FILE"]).handlers_view().rules_file == path


def test_every_agent_reads_the_same_rules_file_through_its_flag() -> None:
    ds = only(render(RULES), "DaemonSet")
    path, name = _rules_file(ds)
    assert name == "fleet-rules"
    args = list(container(ds)["args"])
    ctx = agent_command.make_context("agent", args[1:])
    assert ctx.params["rules_file"] == path


def test_no_rules_value_renders_no_rules_volume_flag_or_variable() -> None:
    objects = render()
    for kind in ("Deployment", "DaemonSet"):
        w = only(objects, kind)
        assert all(v["name"] != "rules" for v in w["spec"]["template"]["spec"]["volumes"])
        assert "--rules" not in container(w)["args"]
        assert "REMEDIATOR_RULES_FILE" not in env(container(w))


@pytest.mark.parametrize("bad", ["Fleet_Rules", "-x", "a" * 254])
def test_the_schema_refuses_a_configmap_name_kubernetes_would(bad: str) -> None:
    with pytest.raises(helm_python.errors.HelmValuesError, match="/remediation/rulesConfigMap"):
        render({"remediation": {"rulesConfigMap": bad}})
