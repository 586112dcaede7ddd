"""The chart ships a working reboot rung: the service asks the node agent (``REMEDIATOR_REBOOT_PROVIDER=agent``)
and the privileged agent, which shares the host's PID namespace, runs a reboot command that enters PID 1's
namespaces; the bug report after a failed reset runs the same way. Unprivileged agents get neither."""

from __future__ import annotations

import shlex
from typing import Any

from remediator.cli.agent import agent as agent_command
from remediator.settings import Settings
from tests.deploy.chart import container, env, of_kind, only, render


def _agent_params(objects: list[dict[str, Any]]) -> dict[str, Any]:
    args = list(container(only(objects, "DaemonSet"))["args"])
    return dict(agent_command.make_context("agent", args[1:]).params)


def _service_env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(d for d in of_kind(objects, "Deployment") if "agent" not in d["metadata"]["name"])
    return env(container(deployment))


def test_the_default_reboot_provider_is_the_privileged_agent_with_a_host_reboot_command() -> None:
    objects = render()
    e = _service_env(objects)
    assert e["REMEDIATOR_REBOOT_PROVIDER"] == "agent"
    settings = Settings(reboot_provider=e["REMEDIATOR_REBOOT_PROVIDER"],
                        reboot_timeout_s=float(e["REMEDIATOR_REBOOT_TIMEOUT_S"]))
    assert settings.reboot_provider == "agent" and settings.reboot_timeout_s == 900
    ds = only(objects, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert container(ds)["securityContext"]["privileged"] is True
    params = _agent_params(objects)
    reboot = shlex.split(params["reboot_command"])
    assert reboot[:3] == ["nsenter", "--target", "1"] and reboot[-2:] == ["systemctl", "reboot"]
    bug = shlex.split(params["bug_report_command"])
    assert bug[:3] == ["nsenter", "--target", "1"] and "nvidia-bug-report.sh" in bug


def test_an_unprivileged_agent_has_no_reboot_command() -> None:
    params = _agent_params(render({"agent": {"privileged": False}}))
    assert params["reboot_command"] is None
    assert params["bug_report_command"] == "nvidia-bug-report.sh"  # the flag's default: fails where it is absent
