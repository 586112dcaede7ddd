"""The PodResources messages match the published kubelet API, and the agent's join of a ``List`` reply with
NVML's GPUs names exactly the right holders (remediator.adapters.podresources_api, remediator.agent.holders).

Pure: no socket, no process. The gRPC round trip is in tests/integration/test_podresources_grpc.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from remediator.adapters import podresources_api as api
from remediator.adapters.podresources import (
    ClaimDevice,
    ContainerAllocation,
    DeviceIds,
    PodAllocation,
    check_socket_path,
    from_message,
)
from remediator.agent.holders import PodUids, device_plugin_gpu, dra_gpu_minor, join
from remediator.errors import PermanentError
from remediator.gpu import GpuIdentity

F = descriptor_pb2.FieldDescriptorProto

# kubernetes/kubernetes@95f08499d652a6211121d8af35f470609217c730
# staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto, message by message: (name, number, type, repeated)
PUBLISHED = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [("devices", 1, "ContainerDevices", True), ("cpu_ids", 2, "int64", True),
                                     ("memory", 3, "ContainerMemory", True)],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, "PodResources", True)],
    "PodResources": [("name", 1, "string", False), ("namespace", 2, "string", False),
                     ("containers", 3, "ContainerResources", True)],
    "ContainerResources": [("name", 1, "string", False), ("devices", 2, "ContainerDevices", True),
                           ("cpu_ids", 3, "int64", True), ("memory", 4, "ContainerMemory", True),
                           ("dynamic_resources", 5, "DynamicResource", True)],
    "ContainerMemory": [("memory_type", 1, "string", False), ("size", 2, "uint64", False),
                        ("topology", 3, "TopologyInfo", False)],
    "ContainerDevices": [("resource_name", 1, "string", False), ("device_ids", 2, "string", True),
                         ("topology", 3, "TopologyInfo", False)],
    "TopologyInfo": [("nodes", 1, "NUMANode", True)],
    "NUMANode": [("ID", 1, "int64", False)],
    "DynamicResource": [("claim_name", 2, "string", False), ("claim_namespace", 3, "string", False),
                        ("claim_resources", 4, "ClaimResource", True)],
    "ClaimResource": [("cdi_devices", 1, "CDIDevice", True), ("driver_name", 2, "string", False),
                      ("pool_name", 3, "string", False), ("device_name", 4, "string", False)],
    "CDIDevice": [("name", 1, "string", False)],
    "GetPodResourcesRequest": [("pod_name", 1, "string", False), ("pod_namespace", 2, "string", False)],
    "GetPodResourcesResponse": [("pod_resources", 1, "PodResources", False)],
}
SCALARS = {F.TYPE_STRING: "string", F.TYPE_INT64: "int64", F.TYPE_UINT64: "uint64"}


def test_the_messages_are_the_published_ones_field_for_field() -> None:
    fd = api.FILE_DESCRIPTOR
    assert fd.package == "v1" and api.SERVICE == "v1.PodResourcesLister"
    assert set(fd.message_types_by_name) == set(PUBLISHED)
    proto = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(proto)  # the wire description as protoc would write it
    messages = {m.name: m for m in proto.message_type}
    for name, fields in PUBLISHED.items():
        got = [(f.name, f.number, f.type_name.rsplit(".", 1)[-1] if f.type == F.TYPE_MESSAGE else SCALARS[f.type],
                f.label == F.LABEL_REPEATED) for f in messages[name].field]
        assert got == fields, name
        assert all(f.type_name.startswith(".v1.") for f in messages[name].field if f.type == F.TYPE_MESSAGE)
    service = fd.services_by_name["PodResourcesLister"]
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse")}
    assert api.method_path("List") == "/v1.PodResourcesLister/List"


def test_a_reply_with_a_field_of_a_newer_kubelet_still_parses() -> None:
    # ClaimResource field 5 (a newer kubelet's share id) is unknown here: kept aside, the rest read
    claim = api.message("ClaimResource")(driver_name="gpu.nvidia.com", device_name="gpu-1")
    wire = claim.SerializeToString() + bytes([(5 << 3) | 2, 3]) + b"abc"
    assert api.message("ClaimResource").FromString(wire).device_name == "gpu-1"


def test_from_message_keeps_every_device() -> None:
    pod = api.message("PodResources")(name="p", namespace="ns")
    c = pod.containers.add(name="main")
    c.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-a", "GPU-b"])
    dr = c.dynamic_resources.add(claim_name="gpu-claim", claim_namespace="ns")
    cr = dr.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-3")
    cr.cdi_devices.add(name="k8s.gpu.nvidia.com/device=gpu-3")
    assert from_message(pod) == PodAllocation("ns", "p", (ContainerAllocation(
        "main", (DeviceIds("nvidia.com/gpu", ("GPU-a", "GPU-b")),),
        (ClaimDevice("gpu-claim", "ns", "gpu.nvidia.com", "node-a", "gpu-3", ("k8s.gpu.nvidia.com/device=gpu-3",)),)),))


def test_a_socket_path_over_the_unix_limit_is_refused_with_the_fix(tmp_path: Path) -> None:
    assert check_socket_path("/var/lib/kubelet/pod-resources/kubelet.sock").endswith("kubelet.sock")
    with pytest.raises(PermanentError, match=r"over the 107-byte limit.*shorter directory"):
        check_socket_path("/tmp/" + "d" * 100 + "/kubelet.sock")


# --- the join -----------------------------------------------------------------------------------------

GPUS = [GpuIdentity(i, f"GPU-{i:08x}-0000-0000-0000-000000000000", f"0000:{0x18 + i:02x}:00.0") for i in range(4)]


def pod(name: str, *containers: ContainerAllocation, ns: str = "train") -> PodAllocation:
    return PodAllocation(ns, name, containers)


def plugin(*ids: str, resource: str = "nvidia.com/gpu") -> tuple[DeviceIds, ...]:
    return (DeviceIds(resource, ids),)


def dra(device: str, *cdi: str, driver: str = "gpu.nvidia.com") -> ClaimDevice:
    return ClaimDevice("claim", "train", driver, "node-a", device, cdi)


@pytest.mark.parametrize(("device_id", "index"), [
    (GPUS[2].uuid, 2),
    (f"{GPUS[2].uuid}::3", 2),                 # a time-slicing replica of GPU 2
    (str(GPUS[1].uuid).lower(), 1),
    ("3", 3),                                  # deviceIDStrategy: index
    ("1:0", 1),                                # index strategy, a MIG device of GPU 1
    ("MIG-7a1e2f1c-0000-0000-0000-000000000000", None),  # a MIG UUID: no full GPU NVML lists
    ("GPU-ffffffff-0000-0000-0000-000000000000", None),  # not a GPU of this node
    ("9", None),
], ids=["uuid", "replica", "case", "index", "mig-index", "mig-uuid", "other-node", "no-such-index"])
def test_device_plugin_ids(device_id: str, index: int | None) -> None:
    g = device_plugin_gpu(device_id, GPUS)
    assert (g.index if g else None) == index


@pytest.mark.parametrize(("device", "cdi", "minor"), [
    ("gpu-0", (), 0),
    ("gpu-12", (), 12),
    ("gpu-3-mig-19-0-1", (), 3),                                         # a MIG device of GPU 3
    ("", ("k8s.gpu.nvidia.com/device=gpu-2",), 2),                        # kubelet < 1.31: CDI names only
    ("", ("k8s.gpu.nvidia.com/claim=6f0c1d7e-1111-2222-3333-444455556666-gpu-1",), 1),
    ("gpu-vfio-0", (), None),                                             # passed through to a VM
    ("nic-0", (), None),
], ids=["gpu-0", "gpu-12", "mig", "cdi-device", "cdi-claim", "vfio", "not-a-gpu"])
def test_dra_device_names(device: str, cdi: tuple[str, ...], minor: int | None) -> None:
    assert dra_gpu_minor(device, cdi) == minor


def test_join_device_plugin_with_replicas_and_unknown_devices() -> None:
    pods = [
        pod("a", ContainerAllocation("trainer", plugin(str(GPUS[0].uuid), str(GPUS[1].uuid)))),
        pod("b", ContainerAllocation("infer", plugin(f"{GPUS[2].uuid}::0", f"{GPUS[2].uuid}::1"))),
        pod("c", ContainerAllocation("side", plugin(f"{GPUS[2].uuid}::2"))),
        pod("d", ContainerAllocation("nic", plugin("0000:3b:00.1", resource="rdma/hca"))),  # not a GPU
        pod("e", ContainerAllocation("x", plugin("GPU-ffffffff-0000-0000-0000-000000000000"))),
        pod("idle", ContainerAllocation("app")),
    ]
    uids = {("train", "a"): "uid-a", ("train", "b"): "uid-b"}
    found = join(pods, GPUS, uid=lambda ns, name: uids.get((ns, name)))
    assert [(h.name, h.uid, h.container) for h in found.of(GPUS[0])] == [("a", "uid-a", "trainer")]
    assert [(h.name, h.uid) for h in found.of(GPUS[2])] == [("b", "uid-b"), ("c", None)]  # once per container
    assert found.of(GPUS[3]) == ()
    assert found.unknown == ("nvidia.com/gpu:GPU-ffffffff-0000-0000-0000-000000000000",)
    assert found.pods == 6


def test_join_dra_devices_by_minor_number() -> None:
    pods = [pod("dra-a", ContainerAllocation("main", dynamic=(dra("gpu-1"), dra("gpu-3-mig-19-0-1")))),
            pod("dra-b", ContainerAllocation("main", dynamic=(dra("gpu-vfio-0"),))),
            pod("other", ContainerAllocation("main", dynamic=(dra("channel-0", driver="compute-domain.nvidia.com"),)))]
    found = join(pods, GPUS)
    assert [h.name for h in found.of(GPUS[1])] == ["dra-a"] and [h.name for h in found.of(GPUS[3])] == ["dra-a"]
    assert found.unknown == ("gpu.nvidia.com:node-a/gpu-vfio-0",)
    # where the driver's minor numbers differ from NVML's indices, the minor decides
    swapped = join(pods[:1], GPUS, minor=lambda g: {0: 1, 1: 0}.get(g.index, g.index))
    assert [h.name for h in swapped.of(GPUS[0])] == ["dra-a"] and swapped.of(GPUS[1]) == ()


def test_join_cdi_names_stand_in_for_a_missing_device_name() -> None:
    old = ClaimDevice("c", "train", "", "", "", ("k8s.gpu.nvidia.com/device=gpu-2",))
    found = join([pod("old", ContainerAllocation("main", dynamic=(old,)))], GPUS)
    assert [h.name for h in found.of(GPUS[2])] == ["old"]


def test_pod_uids_from_the_kubelets_directories(tmp_path: Path) -> None:
    logs, kubelet = tmp_path / "log-pods", tmp_path / "kubelet-pods"
    for ns, name, uid in [("train", "a", "u-a"), ("train", "b", "u-b-old"), ("train", "b", "u-b"),
                          ("train", "c", "u-c1"), ("train", "c", "u-c2")]:
        (logs / f"{ns}_{name}_{uid}").mkdir(parents=True)
    for uid in ("u-a", "u-b", "u-c1", "u-c2"):  # b's old pod is gone; c has two pods running (a replacement)
        (kubelet / uid).mkdir(parents=True)
    (logs / "not-a-pod-dir").mkdir()
    lookup = PodUids(logs, kubelet).table()
    assert (lookup("train", "a"), lookup("train", "b"), lookup("train", "c"), lookup("train", "z")) == (
        "u-a", "u-b", None, None)
    assert PodUids(tmp_path / "missing", kubelet).table()("train", "a") is None


def test_process_cgroups_name_a_uid_the_directories_could_not() -> None:
    from remediator.agent.holders import with_process_uids

    pods = [pod("solo", ContainerAllocation("trainer", plugin(str(GPUS[0].uuid), str(GPUS[1].uuid)))),
            pod("shared-a", ContainerAllocation("a", plugin(f"{GPUS[2].uuid}::0"))),
            pod("shared-b", ContainerAllocation("b", plugin(f"{GPUS[2].uuid}::1"))),
            pod("known", ContainerAllocation("k", plugin(str(GPUS[3].uuid))))]
    found = join(pods, GPUS, uid=lambda ns, name: "uid-known" if name == "known" else None)
    filled = with_process_uids(found, {
        GPUS[0].key: {"uid-solo"}, GPUS[1].key: {"uid-solo"},     # one pod, its processes in one cgroup
        GPUS[2].key: {"uid-x"},                                   # two pods share the GPU: cannot tell which
        GPUS[3].key: {"uid-other"}})                              # already known: never overwritten
    assert {h.uid for h in filled.of(GPUS[0]) + filled.of(GPUS[1])} == {"uid-solo"}
    assert [h.uid for h in filled.of(GPUS[2])] == [None, None]
    assert [h.uid for h in filled.of(GPUS[3])] == ["uid-known"]
    # processes of two pods on one GPU, or a UID another holder already has: nothing is filled
    assert with_process_uids(found, {GPUS[0].key: {"u1", "u2"}}).of(GPUS[0])[0].uid is None
    assert with_process_uids(found, {GPUS[0].key: {"uid-known"}}).of(GPUS[0])[0].uid is None
