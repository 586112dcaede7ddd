"""The agent DaemonSet as the chart renders it, against what the agent reads and accepts: every host source it
reads is mounted (read-only where it can be) and named by the flag that reads it, every flag it passes is a
flag of ``remediator agent`` with the value the chart meant, it tolerates every taint the service itself puts
on a node, and its ServiceAccount has no Kubernetes API rights because the agent's code calls no API."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from typing import Any

import click
import helm_python
import pytest

from remediator.cli.agent import agent as agent_command
from remediator.settings import Settings
from tests.deploy.chart import ROOT, container, env, of_kind, only, render

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def _ds(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return only(render(values), "DaemonSet")


def _params(ds: dict[str, Any]) -> dict[str, Any]:
    """The DaemonSet's args as ``remediator agent`` parses them (a usage error fails the test)."""
    args = list(container(ds)["args"])
    assert args[0] == "agent"
    try:
        ctx = agent_command.make_context("agent", args[1:])
    except click.ClickException as e:
        pytest.fail(f"remediator agent refuses the chart's args {args}: {e.format_message()}")
    return dict(ctx.params)


def _mounts(ds: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """host path -> (mount path, read-only) for every hostPath volume of the agent."""
    pod = ds["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    return {host[m["name"]]: (m["mountPath"], bool(m.get("readOnly"))) for m in container(ds)["volumeMounts"]
            if m["name"] in host}


@pytest.mark.parametrize("privileged", [True, False], ids=["privileged", "unprivileged"])
def test_every_source_the_agent_reads_is_mounted_where_its_flag_points(privileged: bool) -> None:
    ds = _ds({"agent": {"privileged": privileged}})
    mounts = _mounts(ds)
    params = _params(ds)
    reads = {"/var/log/journal", "/run/log/journal", "/etc/machine-id", "/var/lib/kubelet/pods",
             "/var/lib/kubelet/pod-resources", "/var/log/pods"} | ({"/dev/kmsg"} if privileged else set())
    assert reads <= set(mounts)
    for path in reads - {"/var/lib/kubelet/pod-resources"}:
        assert mounts[path][1], f"{path} is mounted read-write"
    # connecting to a unix socket needs write access to it: the one source mounted read-write
    assert mounts["/var/lib/kubelet/pod-resources"] == ("/var/lib/kubelet/pod-resources", False)
    assert params["pod_resources"] == SOCKET
    assert Path(SOCKET).parent == Path(mounts["/var/lib/kubelet/pod-resources"][0])
    assert params["pod_logs"] == mounts["/var/log/pods"][0]
    assert params["kubelet_pods_dir"] == mounts["/var/lib/kubelet/pods"][0]
    assert params["nvml"] is True
    if privileged:
        assert params["kmsg_path"] == mounts["/dev/kmsg"][0] and not params["journal"]
    else:
        assert params["journal"] and params["kmsg_path"] is None
        assert "/dev/kmsg" not in mounts
    # its own state (spool, baselines) is the only other writable host path, and nothing else is writable
    writable = {p for p, (_, ro) in mounts.items() if not ro}
    assert writable == {"/var/lib/kubelet/pod-resources", "/var/lib/gpu-remediator"}
    assert params["state_dir"].startswith(mounts["/var/lib/gpu-remediator"][0])
    assert params["spool_dir"].startswith(mounts["/var/lib/gpu-remediator"][0])


def test_every_flag_the_daemonset_passes_is_an_agent_flag() -> None:
    known = {opt for p in agent_command.params for opt in p.opts}
    for values in ({}, {"agent": {"privileged": False}}):
        args = container(_ds(values))["args"][1:]
        flags = [a for a in args if a.startswith("--")]
        assert flags and set(flags) <= known, sorted(set(flags) - known)


def test_the_memory_trend_values_reach_the_agent() -> None:
    assert {k: v for k, v in _params(_ds()).items() if k.startswith("memtrend")} == {
        "memtrend_interval_s": 30.0, "memtrend_window_s": 1200.0, "memtrend_warmup_s": 120.0,
        "memtrend_factor": 1.3, "memtrend_max_processes": 1024}
    tuned = {"intervalS": 10, "windowS": 600, "warmupS": 60, "factor": 1.5, "maxProcesses": 256}
    params = _params(_ds({"agent": {"memoryTrend": tuned}}))
    assert (params["memtrend_interval_s"], params["memtrend_window_s"], params["memtrend_warmup_s"],
            params["memtrend_factor"], params["memtrend_max_processes"]) == (10.0, 600.0, 60.0, 1.5, 256)


def test_the_gpus_come_from_the_nvidia_runtime_or_the_device_env() -> None:
    ds = _ds()
    e = env(container(ds))
    assert e["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert set(e["NVIDIA_DRIVER_CAPABILITIES"].split(",")) == {"compute", "utility"}  # NVML + nvidia-smi: utility
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    plain = _ds({"agent": {"runtimeClassName": "", "driverCapabilities": "utility"}})
    assert "runtimeClassName" not in plain["spec"]["template"]["spec"]
    assert env(container(plain))["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def _tolerated(tolerations: list[dict[str, Any]], key: str, value: str, effect: str) -> bool:
    """Kubernetes' toleration matching (k8s.io/api core/v1 Toleration.ToleratesTaint)."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != effect:
            continue
        if t.get("key") and t["key"] != key:
            continue
        if not t.get("key") and t.get("operator") != "Exists":
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == value:
            return True
    return False


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_the_agent_stays_on_nodes_the_service_quarantines_or_withdraws_a_gpu_from(effect: str) -> None:
    tolerations = _ds()["spec"]["template"]["spec"]["tolerations"]
    s = Settings()
    for key in (s.taint_key, s.gpu_withdrawn_taint_key):
        assert _tolerated(tolerations, key, "incident-1", effect), (key, effect)
    # a broad "tolerate everything" would also keep it on nodes an operator wants it off
    assert not any(t.get("operator") == "Exists" and not t.get("key") for t in tolerations)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_agent_calls_no_kubernetes_api_so_its_account_has_no_rights() -> None:
    files = [*sorted((ROOT / "remediator" / "agent").glob("*.py")), ROOT / "remediator" / "cli" / "agent.py"]
    for f in files:
        bad = {m for m in _imports(f) if m == "kubernetes" or m.startswith(("kubernetes.", "remediator.adapters.kube"))}
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)}: the agent's account would need RBAC"
    objects = render({})
    sa = only(objects, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    for binding in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding"):
        assert all(subject["name"] != sa for subject in binding["subjects"]), binding["metadata"]["name"]
    # the identity exchange: a projected token for the service's audience, no API token
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (identity,) = [v for v in pod["volumes"] if v["name"] == "identity"]
    assert identity["projected"]["sources"][0]["serviceAccountToken"]["audience"] == Settings().identity_audience


def test_the_agent_container_is_as_tight_as_its_job_allows() -> None:
    c = container(_ds())
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]
    assert "cpu" not in c["resources"]["limits"]  # a throttled agent misses kernel lines; memory is the bound
    tight = container(_ds({"agent": {"privileged": False}}))["securityContext"]
    assert tight["privileged"] is False and tight["allowPrivilegeEscalation"] is False
    assert tight["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}


def test_the_image_holds_what_the_agent_runs_and_leaves_the_driver_to_the_runtime() -> None:
    text = (ROOT / "Dockerfile").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "systemd" in code  # journalctl, for --journal
    # nvidia-smi and libnvidia-ml must match the host's kernel module: the NVIDIA runtime mounts them
    assert not any(word in code for word in ("nvidia-smi", "libnvidia", "cuda", "nvidia-utils"))
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip() for d in deps}
    assert {"nvidia-ml-py", "grpcio", "protobuf"} <= names
    assert "utility" in env(container(_ds()))["NVIDIA_DRIVER_CAPABILITIES"].split(",")


@pytest.mark.parametrize("values", [
    {"agent": {"memoryTrend": {"intervalS": 30, "windowS": 1200, "warmupS": 120, "factor": 1, "maxProcesses": 8}}},
    {"agent": {"memoryTrend": {"intervalS": 30, "windowS": 1200, "warmupS": 120, "factor": 1.3,
                               "maxProcesses": 0}}},
    {"agent": {"memoryTrend": {"intervalS": 30, "windowS": 1200, "warmupS": 120, "factor": 1.3,
                               "maxProcesses": 8, "windw": 5}}},
    {"agent": {"driverCapabilities": "all; rm -rf /"}},
], ids=["factor-1-is-no-growth", "no-processes", "typo", "capabilities-not-a-list"])
def test_the_values_schema_refuses_agent_values_the_agent_would_refuse(values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(values)
