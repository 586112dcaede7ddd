"""The chart renders offline and every object validates (issue 11 deliverable 7).

Rendered with helm-python-sdk's embedded Helm engine for the default values, for the production values
(deploy/chart/values-production.yaml: an existing NATS cluster, acting, three replicas, monitoring) and
for the bundled NATS with an explicit URL; each object is validated with kubernetes-validate (strict)
against Kubernetes ``KUBE_VERSION``. The official NATS chart is declared in Chart.yaml but not vendored
(no registry serves it here), so its own objects are not rendered: ``test_nats_values_are_the_official_
charts_keys`` holds the values we pass it to the keys that chart documents.
"""

from __future__ import annotations

from typing import Any

import click
import helm_python
import kubernetes_validate
import pytest
import yaml

from remediator.cli import main
from remediator.settings import Settings
from tests.deploy.chart import (
    CHART,
    KUBE_VERSION,
    RELEASE,
    container,
    env,
    merge,
    of_kind,
    only,
    production_values,
    render,
    strip,
)

# Custom resources kubernetes-validate has no schema for; their content is checked by the tests named.
CUSTOM_KINDS = {
    "PrometheusRule": "test_prometheus_rules.py (promtool over the same rule files; labels below)",
    "ServiceMonitor": "test_service_monitor_selects_the_service",
}

CASES = {
    "defaults": {},
    "production": production_values(),
    "bundled-nats-explicit-url": {"nats": {"url": "nats://my-nats:4222"}},
    "agent-unprivileged": {"agent": {"privileged": False, "runtimeClassName": "",
                                     "priorityClass": {"create": True}}},
    "everything-on": {"monitoring": {"serviceMonitor": {"enabled": True},
                                     "prometheusRule": {"nonDefaultCounters": True}},
                      "nats": {"clientTls": {"enabled": True, "caSecret": "nats-ca"}}},
}


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_every_rendered_object_validates(values: dict[str, Any]) -> None:
    objects = render(values)
    assert objects
    for obj in objects:
        where = f"{obj['_template']}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CUSTOM_KINDS:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(strip(obj), KUBE_VERSION, strict=True)
            continue
        try:
            kubernetes_validate.validate(strip(obj), KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{where} does not validate against Kubernetes {KUBE_VERSION}: {e}")


def test_helm_lint_is_clean() -> None:
    report = helm_python.lint(str(CHART), {}, strict=True, kube_version=f"v{KUBE_VERSION}")
    errors = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
    # The one finding helm lint makes here: the declared NATS dependency is not vendored under charts/.
    missing = "chart directory is missing these dependencies: nats"
    assert missing in report.get("errors", [])
    errors = [m for m in errors if missing not in str(m)]
    assert not errors, report


def test_production_values_ship_with_the_chart_and_set_what_production_needs() -> None:
    values = production_values()
    assert values["nats"]["enabled"] is False and values["nats"]["url"]
    assert values["service"]["replicas"] >= 2
    assert values["remediation"]["act"] is True


def test_nats_dependency_is_the_official_chart_behind_a_condition() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (dep,) = meta["dependencies"]
    assert dep["name"] == "nats"
    assert dep["repository"] == "https://nats-io.github.io/k8s/helm/charts/"
    assert dep["condition"] == "nats.enabled"
    assert dep["version"].startswith("1.")


def test_existing_nats_needs_a_url() -> None:
    with pytest.raises(helm_python.HelmError, match=r"nats\.url is required"):
        render({"nats": {"enabled": False}})


# The official chart's (nats-io/k8s helm/charts/nats, 1.x) values we set, as that chart documents them
# in its values.yaml and README. Anything else under `nats:` must be one of ours.
OFFICIAL_NATS_KEYS = {
    "enabled",  # the condition: read by Helm, not by the subchart
    "config.cluster.enabled", "config.cluster.replicas",
    "config.jetstream.enabled", "config.jetstream.fileStore.pvc.size",
    "config.resolver.enabled", "config.resolver.pvc.size",
    "config.resolver.merge.type", "config.resolver.merge.interval", "config.resolver.merge.timeout",
    "config.merge",  # its `NN$include` keys become include directives (relative to /etc/nats-config)
    "container.patch", "podTemplate.patch",  # JSON patches of the nats container and the pod template
    "natsBox.enabled", "promExporter.enabled", "podDisruptionBudget.enabled",
}
OUR_NATS_KEYS = {"url", "replicas", "account", "credentials.service", "credentials.admin", "credentials.agentSigner",
                 "clientTls.enabled", "clientTls.caSecret"}


def _leaves(d: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v and path != "config.merge":
            out |= _leaves(v, path + ".")
        else:
            out.add(path)
    return out


def test_nats_values_are_the_official_charts_keys() -> None:
    nats = yaml.safe_load((CHART / "values.yaml").read_text())["nats"]
    leaves = _leaves(nats)
    assert leaves - OUR_NATS_KEYS <= OFFICIAL_NATS_KEYS, leaves - OUR_NATS_KEYS - OFFICIAL_NATS_KEYS
    assert leaves >= OUR_NATS_KEYS
    assert nats["natsBox"]["enabled"] is False  # no nats-box (a shell with credentials) by default
    assert nats["config"]["cluster"]["replicas"] == nats["replicas"] == 3
    assert nats["config"]["resolver"]["enabled"] is True  # decentralized auth: the full account resolver


# --- the service -----------------------------------------------------------------------------------


def _service(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return only(render(values), "Deployment")


def test_dry_run_by_default_and_one_value_to_act() -> None:
    assert env(container(_service()))["REMEDIATOR_DRY_RUN"] == "true"
    assert env(container(_service({"remediation": {"act": True}})))["REMEDIATOR_DRY_RUN"] == "false"
    # service.env cannot carry a second, contradicting switch past the one value
    rendered = env(container(_service({"service": {"env": {"REMEDIATOR_LOG_LEVEL": "DEBUG"}}})))
    assert rendered["REMEDIATOR_DRY_RUN"] == "true"


def test_service_is_hardened_and_probed() -> None:
    for values in ({}, production_values()):
        dep = _service(values)
        pod = dep["spec"]["template"]["spec"]
        c = container(dep)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        assert pod["serviceAccountName"] == RELEASE
    assert production_values()["service"]["replicas"] == _service(production_values())["spec"]["replicas"] >= 2


def test_pdb_keeps_a_replica() -> None:
    objects = render(production_values())
    pdb = only(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] >= 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= \
        only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()


def test_tokens_and_nats_credentials_come_from_secrets_and_none_is_rendered() -> None:
    for values in CASES.values():
        objects = render(values)
        assert not of_kind(objects, "Secret"), "the chart must not create (or embed) a secret"
        c = container(only(objects, "Deployment"))
        assert env(c)["REMEDIATOR_API_TOKENS"] == {
            "secretKeyRef": {"name": "gpu-remediator-api-tokens", "key": "tokens"}}
        volumes = {v["name"]: v for v in only(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
        assert volumes["nats-creds"]["secret"]["secretName"] == "gpu-remediator-nats-service"
        assert volumes["nats-creds"]["secret"]["defaultMode"] == 0o400
        text = yaml.safe_dump([strip(o) for o in objects])
        for marker in ("-----BEGIN", "SUAC", "SUAA", "eyJ0", "NKEY SEED"):  # keys, nkey seeds, JWTs
            assert marker not in text


def test_service_monitor_selects_the_service() -> None:
    objects = render(production_values())
    sm = only(objects, "ServiceMonitor")
    svc = only(objects, "Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert not of_kind(render({}), "ServiceMonitor"), "optional: off by default"


def test_prometheus_rule_is_labelled_for_kube_prometheus_stack() -> None:
    rule = only(render({}), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


# --- the bus-init hook -----------------------------------------------------------------------------


def test_bus_init_hook_runs_bus_init_with_the_replica_count() -> None:
    for values, hook in ((production_values(), "pre-install,pre-upgrade"), ({}, "post-install,pre-upgrade")):
        for replicas in (3, 5):
            objects = render(merge(values, {"nats": {"replicas": replicas}}))
            job = only(objects, "Job")
            assert job["metadata"]["annotations"]["helm.sh/hook"] == hook
            args = container(job)["args"]
            assert args[:2] == ["bus", "init"]
            assert args[args.index("--replicas") + 1] == str(replicas)
            pod = job["spec"]["template"]["spec"]
            assert pod["automountServiceAccountToken"] is False
            assert pod["serviceAccountName"] == f"{RELEASE}-bus-init"
            volumes = {v["name"]: v for v in pod["volumes"]}
            assert volumes["nats-creds"]["secret"]["secretName"] == "gpu-remediator-nats-admin"
    # only the hook holds the admin credentials
    for obj in render({}):
        if obj["kind"] in ("Deployment", "DaemonSet"):
            assert "gpu-remediator-nats-admin" not in yaml.safe_dump(strip(obj))


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_every_container_command_line_parses_with_the_cli(values: dict[str, Any]) -> None:
    """The args each container runs are accepted by the real click commands (no unknown option)."""
    for obj in render(values):
        if obj["kind"] not in ("Deployment", "Job", "DaemonSet"):
            continue
        args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in container(obj)["args"]]
        cmd: click.Command = main
        ctx = main.make_context("remediator", [], resilient_parsing=True)
        while isinstance(cmd, click.Group):
            sub = cmd.get_command(ctx, args[0])
            assert sub is not None, f"{obj['kind']}: no command {args[0]!r}"
            cmd, args = sub, args[1:]
        try:
            cmd.make_context(cmd.name or "", list(args))
        except click.ClickException as e:
            pytest.fail(f"{obj['kind']} {container(obj)['args']}: {e.format_message()}")


# --- the agent -------------------------------------------------------------------------------------


def _agent(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return only(render(values), "DaemonSet")


def test_agent_mounts_what_it_reads() -> None:
    ds = _agent()
    pod = ds["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    expected_ro = {"/dev/kmsg": True, "/var/log/journal": True, "/run/log/journal": True, "/etc/machine-id": True,
                   "/var/lib/kubelet/pods": True, "/var/log/pods": True,
                   "/var/lib/kubelet/pod-resources": False, "/var/lib/gpu-remediator": False}
    by_path = {path: mounts[name] for name, path in host.items()}
    assert set(by_path) == set(expected_ro)
    for path, ro in expected_ro.items():
        assert bool(by_path[path].get("readOnly")) is ro, path
    # the pod-resources socket keeps its kubelet path: the agent's default socket path needs no flag
    assert by_path["/var/lib/kubelet/pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources"
    args = container(ds)["args"]
    assert args[args.index("--kmsg") + 1] == by_path["/dev/kmsg"]["mountPath"]
    assert args[args.index("--pod-logs") + 1] == by_path["/var/log/pods"]["mountPath"]
    assert args[args.index("--kubelet-pods-dir") + 1] == by_path["/var/lib/kubelet/pods"]["mountPath"]


def test_agent_gets_the_gpus_runs_where_they_are_and_stays_on_quarantined_nodes() -> None:
    ds = _agent()
    pod = ds["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert env(container(ds))["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "runtimeClassName" not in _agent({"agent": {"runtimeClassName": ""}})["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["priorityClassName"] == "system-node-critical"
    tolerated = {(t["key"], t.get("effect")) for t in pod["tolerations"]}
    assert (Settings.model_fields["taint_key"].default, None) in tolerated  # our own quarantine taint
    assert ("nvidia.com/gpu", "NoSchedule") in tolerated
    assert not any(t.get("operator") == "Exists" and "key" not in t for t in pod["tolerations"])
    assert container(ds)["resources"]["limits"]["memory"]


def test_agent_has_its_own_account_and_no_api_token() -> None:
    objects = render({})
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    sa = f"{RELEASE}-agent"
    assert pod["serviceAccountName"] == sa
    assert pod["automountServiceAccountToken"] is False
    assert only(objects, "ServiceAccount", sa)["automountServiceAccountToken"] is False
    for binding in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding"):
        assert all(s["name"] != sa for s in binding["subjects"]), binding["metadata"]["name"]
    (identity,) = [v for v in pod["volumes"] if v["name"] == "identity"]
    (source,) = identity["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "gpu-remediator"
    assert source["serviceAccountToken"]["expirationSeconds"] <= 3600


def test_agent_privilege_is_what_it_needs() -> None:
    sc = container(_agent())["securityContext"]
    assert sc["privileged"] is True and sc["readOnlyRootFilesystem"] is True
    unprivileged = _agent({"agent": {"privileged": False}})
    sc = container(unprivileged)["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    args = container(unprivileged)["args"]
    assert "--journal" in args and "--kmsg" not in args
    assert all(v["name"] != "kmsg" for v in unprivileged["spec"]["template"]["spec"]["volumes"])


# --- network policy --------------------------------------------------------------------------------


def test_network_policies_admit_only_the_service_agents_and_prometheus() -> None:
    objects = render({})
    policies = {p["metadata"]["name"]: p for p in of_kind(objects, "NetworkPolicy")}
    service = policies[RELEASE]
    assert service["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "gpu-remediator"
    (rule,) = service["spec"]["ingress"]
    peers = [p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") for p in rule["from"]]
    assert peers == ["alertmanager", "prometheus", "gpu-remediator-agent"]
    nats = policies[f"{RELEASE}-nats"]
    clients = [p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in nats["spec"]["ingress"][0]["from"]]
    assert clients == ["gpu-remediator", "gpu-remediator-agent", "gpu-remediator-bus-init"]
    assert [r["ports"][0]["port"] for r in nats["spec"]["ingress"]] == [4222, 6222, 7777]
    # an existing NATS lives elsewhere: no policy for it here
    assert f"{RELEASE}-nats" not in {p["metadata"]["name"] for p in of_kind(render(production_values()),
                                                                             "NetworkPolicy")}
    # every selector matches a pod this chart renders
    labels = [o["spec"]["template"]["metadata"]["labels"] for o in objects
              if o["kind"] in ("Deployment", "DaemonSet", "Job")]
    for peer in nats["spec"]["ingress"][0]["from"]:
        assert any(peer["podSelector"]["matchLabels"].items() <= lab.items() for lab in labels)


# Settings the chart sets ahead of the code that reads them: none now (the agent-identity exchange of
# issue 9 reads REMEDIATOR_IDENTITY_URL/_TOKEN_FILE/_AUDIENCE and REMEDIATOR_NATS_AGENT_SIGNING_KEY).
AHEAD_OF_THE_CODE: set[str] = set()


def _known_variables(cmd: click.Command) -> set[str]:
    from_settings = {f"REMEDIATOR_{name.upper()}" for name in Settings.model_fields}
    from_flags = {e for p in cmd.params for e in ([p.envvar] if isinstance(p.envvar, str) else p.envvar or [])}
    return from_settings | from_flags


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_every_remediator_variable_is_a_real_setting(values: dict[str, Any]) -> None:
    values = merge(values, {"identity": {"trustKeys": ["UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"]}})
    for obj in render(values):
        if obj["kind"] not in ("Deployment", "Job", "DaemonSet"):
            continue
        c = container(obj)
        args = list(c["args"])
        cmd: click.Command = main
        ctx = main.make_context("remediator", [], resilient_parsing=True)
        while isinstance(cmd, click.Group):
            sub = cmd.get_command(ctx, args[0])
            assert sub is not None
            cmd, args = sub, args[1:]
        unknown = {n for n in env(c) if n.startswith("REMEDIATOR_")} - _known_variables(cmd) - AHEAD_OF_THE_CODE
        assert not unknown, f"{obj['kind']}: {sorted(unknown)} are read by nothing"


def test_trust_keys_reach_the_agent_and_audit_verify() -> None:
    key = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"
    objects = render({"identity": {"trustKeys": [key]}})
    assert env(container(only(objects, "DaemonSet")))["REMEDIATOR_TRUST_KEYS"] == key
    assert env(container(only(objects, "Deployment")))["REMEDIATOR_AUDIT_TRUST_KEYS"] == key
    volumes = {v["name"]: v for v in only(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["signing"]["secret"]["secretName"] == "gpu-remediator-signing-key"


def test_agent_priority_class_of_the_chart() -> None:
    objects = render({"agent": {"priorityClass": {"create": True}}})
    pc = only(objects, "PriorityClass")
    assert only(objects, "DaemonSet")["spec"]["template"]["spec"]["priorityClassName"] == pc["metadata"]["name"]
    assert pc["globalDefault"] is False
    assert not of_kind(render({}), "PriorityClass")


def test_no_pdb_that_would_block_drains_with_one_replica() -> None:
    assert not of_kind(render({"service": {"replicas": 1}}), "PodDisruptionBudget")


def _notes(values: dict[str, Any]) -> str:
    chart = helm_python.Chart.load(str(CHART))
    manifests = chart.render(values, name=RELEASE, namespace="gpu-remediator", is_install=True)
    return next(v for k, v in manifests.items() if k.endswith("NOTES.txt"))


def test_notes_say_dry_run_and_warn_about_a_bundled_nats_without_an_operator() -> None:
    notes = _notes({})
    assert "DRY-RUN" in notes and "WARNING: the bundled NATS has no operator JWT" in notes
    assert "ACTING" in _notes({"remediation": {"act": True}})
    assert "WARNING" not in _notes(production_values())
    assert "WARNING" not in _notes({"nats": {"config": {"merge": {"operator": "eyJ0eXAi.placeholder"}}}})


@pytest.mark.parametrize("values", [
    {"remediation": {"act": "yes"}},                              # a string is not the switch
    {"service": {"env": {"REMEDIATOR_DRY_RUN": "false"}}},        # no second way to act
    {"nats": {"replicas": 7}},                                    # bus init takes 1..5
    {"identity": {"trustKeys": ["not-a-public-nkey"]}},
    {"remediaton": {"act": True}},                                # a typo is an error, not a silent default
], ids=["act-string", "dry-run-via-env", "replicas-7", "bad-trust-key", "typo"])
def test_values_schema_refuses(values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(values)


def test_a_repeated_key_is_refused_as_the_api_server_refuses_it() -> None:
    """``render`` parses with a loader that refuses repeated keys (PyYAML alone keeps the last one)."""
    import yaml as _yaml

    from tests.deploy.chart import _StrictLoader
    with pytest.raises(_yaml.constructor.ConstructorError, match="repeated keys"):
        list(_yaml.load_all("metadata: {labels: {a: '1', a: '2'}}", Loader=_StrictLoader))
