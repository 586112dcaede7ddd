"""The simulated cluster: an in-memory Kubernetes (``ClusterState``) behind an HTTP API server.

Where it sits: chaos; drills, demos, ``remediator sim`` and benchmarks build a cluster with
``seed_cluster``, serve it with ``KubeApiServer`` and point the service (or kubectl) at the kubeconfig it
writes. Nothing on the service's path imports this package.

The package by role: ``cluster`` (the ``ClusterState`` facade and ``seed_cluster``) over ``store``,
``apiserver``, ``controllers``/``workloads``, ``scheduler``, ``kubelet`` (pod start-up and the GPU device
allocation), ``disruption``, ``faults`` and ``seeding``, with ``resources`` their shared vocabulary;
``kube_api`` (with ``kube_select``, ``kube_patch``, ``kube_tables``) is the HTTP front; ``gpu_node`` is the
simulated GPU node the node agent runs on.
"""

from chaos.sim.cluster import (
    GPU_PRESENT_LABEL,
    GPU_RESOURCE,
    JOB_NAME_LABEL,
    KUBEFLOW_JOB_NAME_LABEL,
    KUBEFLOW_REPLICA_INDEX_LABEL,
    KUBEFLOW_REPLICA_TYPE_LABEL,
    RESOURCES,
    RESTARTS_ANNOTATION,
    TRAINING_NAMESPACE,
    ApiError,
    ClusterState,
    DeviceHolder,
    InjectedFault,
    ResourceType,
    freeze_heap,
    seed_cluster,
)
from chaos.sim.kube_api import KubeApiServer

__all__ = [
    "GPU_PRESENT_LABEL",
    "GPU_RESOURCE",
    "JOB_NAME_LABEL",
    "KUBEFLOW_JOB_NAME_LABEL",
    "KUBEFLOW_REPLICA_INDEX_LABEL",
    "KUBEFLOW_REPLICA_TYPE_LABEL",
    "RESOURCES",
    "RESTARTS_ANNOTATION",
    "TRAINING_NAMESPACE",
    "ApiError",
    "ClusterState",
    "DeviceHolder",
    "InjectedFault",
    "KubeApiServer",
    "ResourceType",
    "freeze_heap",
    "seed_cluster",
]
