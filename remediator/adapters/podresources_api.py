"""The kubelet's PodResources API, ``v1.PodResourcesLister``: its messages and method paths, built in Python.

Where it sits: under the PodResources client (``remediator.adapters.podresources``) and the simulated kubelet
that serves the same API (``chaos.sim.podresources_server``); it imports protobuf only (no grpc, no protoc
at build time). The file descriptor below is written field for field from the published proto:

    kubernetes/kubernetes@95f08499d652a6211121d8af35f470609217c730
    staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto
    (go package ``k8s.io/kubelet/pkg/apis/podresources/v1``; proto3, package ``v1``)

the same names, numbers, types and labels, including ``DynamicResource`` (its field 1, ``class_name``, was
removed in Kubernetes 1.31 and stays unused), ``ClaimResource`` with ``driver_name``/``pool_name``/
``device_name`` and ``CDIDevice``, ``TopologyInfo``/``NUMANode`` and ``GetPodResourcesRequest``'s
``pod_name``/``pod_namespace``. Fields a newer kubelet adds are kept as unknown fields by protobuf and ignored.
``tests/unit/remediator/test_podresources.py`` pins the wire format (names, numbers, types) to that file.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = [
    "FILE_NAME",
    "METHODS",
    "PACKAGE",
    "SERVICE",
    "message",
]

PACKAGE = "v1"
SERVICE = f"{PACKAGE}.PodResourcesLister"
FILE_NAME = "k8s.io/kubelet/pkg/apis/podresources/v1/api.proto"

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _INT64, _UINT64, _MESSAGE = _F.TYPE_STRING, _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_MESSAGE
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# message -> [(field name, number, type, label, message type)], in the proto's order
_MESSAGES: dict[str, list[tuple[str, int, int, int, str | None]]] = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [
        ("devices", 1, _MESSAGE, _MANY, "ContainerDevices"),
        ("cpu_ids", 2, _INT64, _MANY, None),
        ("memory", 3, _MESSAGE, _MANY, "ContainerMemory"),
    ],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _MANY, "PodResources")],
    "PodResources": [
        ("name", 1, _STRING, _ONE, None),
        ("namespace", 2, _STRING, _ONE, None),
        ("containers", 3, _MESSAGE, _MANY, "ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, _STRING, _ONE, None),
        ("devices", 2, _MESSAGE, _MANY, "ContainerDevices"),
        ("cpu_ids", 3, _INT64, _MANY, None),
        ("memory", 4, _MESSAGE, _MANY, "ContainerMemory"),
        ("dynamic_resources", 5, _MESSAGE, _MANY, "DynamicResource"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, _STRING, _ONE, None),
        ("size", 2, _UINT64, _ONE, None),
        ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _STRING, _ONE, None),
        ("device_ids", 2, _STRING, _MANY, None),
        ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, _MESSAGE, _MANY, "NUMANode")],
    "NUMANode": [("ID", 1, _INT64, _ONE, None)],
    "DynamicResource": [
        # tombstone: ``string class_name = 1`` was removed in 1.31 (claims no longer have one class)
        ("claim_name", 2, _STRING, _ONE, None),
        ("claim_namespace", 3, _STRING, _ONE, None),
        ("claim_resources", 4, _MESSAGE, _MANY, "ClaimResource"),
    ],
    "ClaimResource": [
        ("cdi_devices", 1, _MESSAGE, _MANY, "CDIDevice"),
        ("driver_name", 2, _STRING, _ONE, None),
        ("pool_name", 3, _STRING, _ONE, None),
        ("device_name", 4, _STRING, _ONE, None),
    ],
    "CDIDevice": [("name", 1, _STRING, _ONE, None)],
    "GetPodResourcesRequest": [
        ("pod_name", 1, _STRING, _ONE, None),
        ("pod_namespace", 2, _STRING, _ONE, None),
    ],
    "GetPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _ONE, "PodResources")],
}

# rpc name -> (request message, response message); all unary
METHODS: dict[str, tuple[str, str]] = {
    "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
    "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
    "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package=PACKAGE, syntax="proto3")
    f.options.go_package = "k8s.io/kubelet/pkg/apis/podresources/v1"
    for name, fields in _MESSAGES.items():
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            field = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name is not None:
                field.type_name = f".{PACKAGE}.{type_name}"
    service = f.service.add(name="PodResourcesLister")
    for rpc, (req, resp) in METHODS.items():
        service.method.add(name=rpc, input_type=f".{PACKAGE}.{req}", output_type=f".{PACKAGE}.{resp}")
    return f


# A pool of our own: the default pool may hold another package "v1" (any generated module of that name).
_POOL = descriptor_pool.DescriptorPool()
FILE_DESCRIPTOR = _POOL.Add(_file())
_CLASSES: dict[str, Any] = {
    name: message_factory.GetMessageClass(FILE_DESCRIPTOR.message_types_by_name[name]) for name in _MESSAGES}


def message(name: str) -> Any:
    """The generated class of message ``name`` (e.g. ``message("ListPodResourcesResponse")``)."""
    return _CLASSES[name]


def method_path(rpc: str) -> str:
    """The gRPC path of ``rpc``: ``/v1.PodResourcesLister/List``."""
    return f"/{SERVICE}/{rpc}"
