"""GPU withdrawal the scheduler honours, through the real clients against the simulator: the adapter's
``withdraw_gpu``/``restore_gpu`` in both allocation modes (a DRA DeviceTaintRule, found by discovery; the
device plugin's node-taint fallback), the simulated scheduler's TaintToleration and DRA device-taint rules,
the device-taint eviction controller, and ``kubectl`` reading ``resource.k8s.io``.

Where it sits: integration ring, beside ``test_kube_adapter.py``. Cluster: ``seed_cluster(2,
gpu_pods_per_node=4)``: four single-pod Jobs ``train-<node>-<k>`` per node, each holding two GPUs, so
every node is full.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos.sim import TRAINING_NAMESPACE, ClusterState, KubeApiServer, seed_cluster
from chaos.sim.resources import ApiError
from remediator.adapters.kube import WITHDRAWN_GPUS_ANNOTATION, KubeAdapter, KubePermanentError, NotFound
from remediator.contracts import GpuRef

pytestmark = pytest.mark.timeout(120)

NODE = "gpu-node-0"
KEY = "gpu-remediator/gpu-withdrawn"


@dataclass
class Sim:
    state: ClusterState
    kubeconfig: Path
    tmp: Path


def _sim(tmp_path: Path, mode: str) -> Iterator[Sim]:
    state = seed_cluster(2, gpu_allocation=mode, gpu_pods_per_node=4)
    server = KubeApiServer(state).start()
    try:
        home = tmp_path / mode
        home.mkdir()
        yield Sim(state, server.write_kubeconfig(home / "kubeconfig"), home)
    finally:
        server.stop()


@pytest.fixture
def dra(tmp_path: Path) -> Iterator[Sim]:
    yield from _sim(tmp_path, "dra")


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Sim]:
    yield from _sim(tmp_path, "device-plugin")


def adapter(sim: Sim, mode: str = "auto") -> KubeAdapter:
    a = KubeAdapter(str(sim.kubeconfig), retry_budget_s=2.0)
    a.gpu_allocation = mode
    return a


def kubectl(sim: Sim, *args: str) -> str:
    binary = shutil.which("kubectl") or "/usr/bin/kubectl"
    if not Path(binary).exists():
        pytest.fail("kubectl is not installed: these tests need a real kubectl (v1.32)")
    env = {**os.environ, "HOME": str(sim.tmp), "KUBECONFIG": str(sim.kubeconfig)}
    proc = subprocess.run([binary, "--kubeconfig", str(sim.kubeconfig), "--cache-dir", str(sim.tmp / "kcache"),
                           "--request-timeout=30s", *args], capture_output=True, text=True, timeout=90, env=env,
                          check=False)
    assert proc.returncode == 0, f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def holder_of(state: ClusterState, index: int) -> tuple[str, str]:
    name = state.gpus_in_use(NODE)[index].split("/")[1]
    return name, state.pod(TRAINING_NAMESPACE, name)["metadata"]["uid"]


def uids(state: ClusterState, node: str = NODE) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in state.pods_on(node)
            if p["metadata"]["namespace"] == TRAINING_NAMESPACE}


# --- discovery and kubectl --------------------------------------------------------------------------


def test_kubectl_lists_resource_slices_and_device_taint_rules(dra: Sim) -> None:
    with adapter(dra) as a:
        a.withdraw_gpu(NODE, GpuRef(index=3), value="gpu-memory-fatal")
    rows = [line.split() for line in kubectl(dra, "api-resources", "--api-group=resource.k8s.io").splitlines()[1:]]
    assert {r[0]: r[1] for r in rows} == {"deviceclasses": "resource.k8s.io/v1",
                                          "devicetaintrules": "resource.k8s.io/v1beta2",
                                          "resourceclaims": "resource.k8s.io/v1",
                                          "resourceclaimtemplates": "resource.k8s.io/v1",
                                          "resourceslices": "resource.k8s.io/v1"}
    out = kubectl(dra, "get", "resourceslices,devicetaintrules")
    assert "gpu-remediator-gpu-node-0-gpu-3" in out
    slices = [line.split() for line in out.splitlines() if line.startswith("resourceslice")]
    assert sorted(r[1:4] for r in slices) == [["gpu-node-0", "gpu.nvidia.com", "gpu-node-0"],
                                              ["gpu-node-1", "gpu.nvidia.com", "gpu-node-1"]]
    claims = kubectl(dra, "get", "resourceclaims", "-n", TRAINING_NAMESPACE)
    assert claims.count("allocated,reserved") == 8


def test_auto_detection_reads_the_cluster(dra: Sim, plugin: Sim) -> None:
    with adapter(dra) as a, adapter(plugin) as b:
        assert a.gpu_allocation_mode() == "dra"
        assert b.gpu_allocation_mode() == "device-plugin"  # resource.k8s.io served, but no driver slices


# --- DRA ------------------------------------------------------------------------------------------------


def test_dra_withdrawal_taints_exactly_that_device_and_the_scheduler_honours_it(dra: Sim) -> None:
    state = dra.state
    before = uids(state)
    with adapter(dra) as a:
        c = a.withdraw_gpu(NODE, GpuRef(index=1), value="gpu-memory-fatal")
        assert c.changed and c.after["rule"] == "gpu-remediator-gpu-node-0-gpu-1"
        assert c.after["device"] == {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-1"}
        again = a.withdraw_gpu(NODE, GpuRef(index=1), value="gpu-memory-fatal")
        assert not again.changed  # same name: a second call is a no-op
    (rule,) = state.list_objects("devicetaintrules")
    assert rule["apiVersion"] == "resource.k8s.io/v1beta2"  # found by discovery: no v1 on this server
    assert rule["spec"]["taint"]["timeAdded"]
    assert state.device_taints(NODE, 1) and not state.device_taints(NODE, 0)
    assert uids(state) == before  # NoSchedule: nothing running is touched
    assert not state.is_cordoned(NODE) and not state.taints(NODE)  # the node stays schedulable

    name, _ = holder_of(state, 1)  # holds GPUs 0 and 1
    state.evict(TRAINING_NAMESPACE, name)
    (pending,) = state.pending_pods()  # its replacement: GPU 0 is free, GPU 1 is withdrawn
    assert "cannot allocate all claims" in pending["status"]["conditions"][0]["message"]
    assert 1 not in state.gpus_in_use(NODE)

    with adapter(dra) as a:
        r = a.restore_gpu(NODE, GpuRef(index=1))
        assert r.changed and r.after == {"mode": "dra", "rule": None, "withdrawn_gpus": []}
    assert not state.pending_pods() and set(state.gpus_in_use(NODE)) == set(range(8))


def test_dra_noexecute_has_the_control_plane_evict_exactly_the_pod_using_the_device(dra: Sim) -> None:
    state = dra.state
    name, uid = holder_of(state, 5)
    before = uids(state)
    with adapter(dra) as a:
        a.withdraw_gpu(NODE, GpuRef(index=5), effect="NoExecute", value="gpu-memory-fatal")
    after = uids(state)
    assert name not in after
    assert {n: u for n, u in before.items() if n != name} == {n: u for n, u in after.items() if n in before}
    assert uid not in after.values()


def test_dra_matches_the_gpu_by_uuid_and_refuses_a_gpu_it_cannot_find(dra: Sim) -> None:
    (slice_,) = [s for s in dra.state.list_objects("resourceslices") if s["spec"]["nodeName"] == NODE]
    uuid = slice_["spec"]["devices"][6]["attributes"]["uuid"]["string"]
    with adapter(dra) as a:
        assert a.find_gpu_device(NODE, GpuRef(uuid=uuid))["device"] == "gpu-6"  # type: ignore[index]
        with pytest.raises(KubePermanentError, match="REMEDIATOR_GPU_ALLOCATION=device-plugin"):
            a.withdraw_gpu(NODE, GpuRef(uuid="GPU-00000000-0000-0000-0000-000000000000"))


def test_dra_restore_never_deletes_a_rule_it_did_not_create(dra: Sim) -> None:
    dra.state.create("devicetaintrules", {"metadata": {"name": "gpu-remediator-gpu-node-0-gpu-2"}, "spec": {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-2"},
        "taint": {"key": "admin/maintenance", "effect": "NoSchedule"}}})
    with adapter(dra) as a:
        assert not a.withdraw_gpu(NODE, GpuRef(index=2)).changed
        assert not a.restore_gpu(NODE, GpuRef(index=2)).changed
    assert [r["metadata"]["name"] for r in dra.state.list_objects("devicetaintrules")] == [
        "gpu-remediator-gpu-node-0-gpu-2"]


def test_the_simulated_api_validates_device_taint_rules(dra: Sim) -> None:
    with pytest.raises(ApiError) as err:
        dra.state.create("devicetaintrules", {"metadata": {"name": "bad"}, "spec": {
            "deviceSelector": {"device": "gpu-0"}, "taint": {"key": "k", "effect": "PreferNoSchedule"}}})
    assert err.value.code == 422 and "supported values" in err.value.message


# --- device plugin ----------------------------------------------------------------------------------


def test_device_plugin_withdrawal_is_our_node_taint_and_a_partial_withdrawal(plugin: Sim) -> None:
    state = plugin.state
    before = uids(state)
    with adapter(plugin) as a:
        c = a.withdraw_gpu(NODE, GpuRef(index=1), value="gpu-memory-fatal")
        assert c.changed and "no per-device scheduling control exists" in c.detail
        assert c.after["taint"] == {"key": KEY, "value": "gpu-memory-fatal", "effect": "NoSchedule"}
        assert c.after["withdrawn_gpus"] == ["index-1"] and c.after["changed_by_us"]
        a.withdraw_gpu(NODE, GpuRef(index=4), value="gpu-memory-fatal")
    assert [t["key"] for t in state.taints(NODE)] == [KEY] and not state.is_cordoned(NODE)
    assert uids(state) == before  # running pods on the healthy GPUs keep running

    name, _ = holder_of(state, 1)
    state.evict(TRAINING_NAMESPACE, name)
    (pending,) = state.pending_pods()  # the free GPUs of gpu-node-0 are behind our taint
    assert "untolerated taint {gpu-remediator/gpu-withdrawn: gpu-memory-fatal}" in \
        pending["status"]["conditions"][0]["message"]

    with adapter(plugin) as a:
        one = a.restore_gpu(NODE, GpuRef(index=1))
        assert one.changed and one.after["taint"] is not None and one.after["withdrawn_gpus"] == ["index-4"]
        last = a.restore_gpu(NODE, GpuRef(index=4))
        assert last.after["taint"] is None and last.after["withdrawn_gpus"] == []
        assert not a.restore_gpu(NODE, GpuRef(index=4)).changed
    assert not state.taints(NODE)
    assert WITHDRAWN_GPUS_ANNOTATION not in (state.node(NODE)["metadata"].get("annotations") or {})
    assert not state.pending_pods()


def test_device_plugin_unhealthy_device_is_recorded_as_evidence(plugin: Sim) -> None:
    plugin.state.set_gpu_health(NODE, 3, healthy=False)
    with adapter(plugin) as a:
        c = a.withdraw_gpu(NODE, GpuRef(index=3))
    assert c.after["device_plugin"] == {"capacity": 8, "allocatable": 7, "unhealthy": 1}
    assert "device plugin already reports 1 GPU(s) unhealthy" in c.detail


def test_device_plugin_mode_never_puts_noexecute_on_the_node(plugin: Sim) -> None:
    before = uids(plugin.state)
    with adapter(plugin) as a:
        a.withdraw_gpu(NODE, GpuRef(index=0), effect="NoExecute")
    assert [t["effect"] for t in plugin.state.taints(NODE)] == ["NoSchedule"] and uids(plugin.state) == before


def test_node_summary_counts_dra_gpus_from_the_feature_discovery_label_less_those_withdrawn(dra: Sim) -> None:
    with adapter(dra) as a:
        n = a.get_node(NODE)
        assert (n["gpus"], n["gpus_allocatable"]) == (8, 8)
        c = a.withdraw_gpu(NODE, GpuRef(index=2))
        assert c.after["withdrawn_gpus"] == ["index-2"]
        assert a.get_node(NODE)["gpus_allocatable"] == 7  # what the budget guard and the reconciler read
        assert a.restore_gpu(NODE, GpuRef(index=2)).after["withdrawn_gpus"] == []
        assert a.get_node(NODE)["gpus_allocatable"] == 8
    assert WITHDRAWN_GPUS_ANNOTATION not in (dra.state.node(NODE)["metadata"].get("annotations") or {})



def test_dra_noschedule_then_noexecute_changes_the_rule_and_evicts(dra: Sim) -> None:
    name, _ = holder_of(dra.state, 3)
    with adapter(dra) as a:
        a.withdraw_gpu(NODE, GpuRef(index=3))
        (rule,) = dra.state.list_objects("devicetaintrules")
        assert rule["metadata"]["generation"] == 1 and name in uids(dra.state)
        c = a.withdraw_gpu(NODE, GpuRef(index=3), effect="NoExecute")
    assert c.changed and c.before["effect"] == "NoSchedule" and c.after["effect"] == "NoExecute"
    (now,) = dra.state.list_objects("devicetaintrules")
    assert now["spec"]["taint"]["effect"] == "NoExecute" and now["metadata"]["generation"] == 2
    assert name not in uids(dra.state)  # the device-taint eviction controller took it


def test_dra_a_claim_that_tolerates_the_taint_still_gets_the_device(dra: Sim) -> None:
    state = dra.state
    with adapter(dra) as a:
        a.withdraw_gpu(NODE, GpuRef(index=1))
    name, _ = holder_of(state, 1)
    template = state.get("resourceclaimtemplates", "train-0-0-gpus", TRAINING_NAMESPACE)
    request = template["spec"]["spec"]["devices"]["requests"][0]
    request["exactly"]["tolerations"] = [{"key": KEY, "operator": "Exists", "effect": "NoSchedule"}]
    state.replace("resourceclaimtemplates", "train-0-0-gpus", template, TRAINING_NAMESPACE)
    state.evict(TRAINING_NAMESPACE, name)  # its replacement's claim tolerates the withdrawal
    assert not state.pending_pods() and 1 in state.gpus_in_use(NODE)


@pytest.mark.parametrize(("served", "picked"), [
    ({"v1": ["devicetaintrules"], "v1beta2": ["devicetaintrules"]}, "v1"),
    ({"v1": ["resourceslices"], "v1beta2": ["devicetaintrules"]}, "v1beta2"),
    ({"v1alpha3": ["devicetaintrules"]}, "v1alpha3"),
    ({"v1": ["resourceslices"]}, None),
], ids=["v1", "v1beta2", "v1alpha3", "none"])
def test_the_device_taint_rule_version_is_the_newest_the_server_offers(plugin: Sim, served: dict[str, list[str]],
                                                                         picked: str | None) -> None:
    a = adapter(plugin)
    asked: list[str] = []

    def discovery(method: str, path: str, **_kw: object) -> dict[str, object]:
        asked.append(path)
        version = path.rsplit("/", 1)[1]
        if version not in served:
            raise NotFound(f"{path} not found")
        return {"resources": [{"name": r} for r in served[version]] + [{"name": "devicetaintrules/status"}]}

    a._request = discovery  # type: ignore[method-assign]
    try:
        assert a._dra_version("devicetaintrules") == picked
        assert asked == [f"/apis/resource.k8s.io/{v}" for v in ("v1", "v1beta2", "v1alpha3")]
        assert a._dra_version("resourceslices") == ("v1" if "resourceslices" in served.get("v1", []) else None)
        assert len(asked) == 3  # read once
    finally:
        a.close()


def test_the_driver_publishes_the_uuids_and_pci_ids_the_gpu_node_reports(tmp_path: Path) -> None:
    from chaos.sim.gpu_node import SimGpuNode

    state = seed_cluster(1, gpu_allocation="dra", gpu_pods_per_node=2)
    sim = SimGpuNode(tmp_path / "gpu-node-0", name="gpu-node-0", gpus=8)
    try:
        state.attach_gpu_node("gpu-node-0", sim)
        (s,) = state.list_objects("resourceslices")
        attrs = [d["attributes"] for d in s["spec"]["devices"]]
        assert [a["uuid"]["string"] for a in attrs] == sim.device_ids()
        assert [a["pcieBusID"]["string"] for a in attrs] == [sim.gpu_state(i)["pci"] for i in range(8)]
        assert [d["name"] for d in s["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    finally:
        sim.close()


def test_a_deleted_node_takes_its_resource_slices_with_it(dra: Sim) -> None:
    dra.state.delete("nodes", "gpu-node-1")
    assert [s["spec"]["nodeName"] for s in dra.state.list_objects("resourceslices")] == [NODE]


def test_the_kubelet_reports_dra_allocations_as_podresources_dynamic_resources(dra: Sim) -> None:
    name, uid = holder_of(dra.state, 0)
    (pod,) = [p for p in dra.state.pod_resources(NODE) if p["name"] == name]
    (claim,) = dra.state.claims_of(TRAINING_NAMESPACE, name)
    assert pod["uid"] == uid and claim["metadata"]["ownerReferences"][0]["uid"] == uid
    assert pod["containers"] == [{"name": "trainer", "devices": [], "dynamic_resources": [{
        "claim_name": claim["metadata"]["name"], "claim_namespace": TRAINING_NAMESPACE,
        "claim_resources": [{"driver_name": "gpu.nvidia.com", "pool_name": NODE, "device_name": f"gpu-{i}",
                             "cdi_devices": [{"name": f"k8s.gpu.nvidia.com/device=gpu-{i}"}]} for i in (0, 1)]}]}]
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": name, "uid": uid}]
    dra.state.evict(TRAINING_NAMESPACE, name)
    assert claim["metadata"]["name"] not in {c["metadata"]["name"] for c in dra.state.list_objects("resourceclaims")}
