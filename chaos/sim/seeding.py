"""The seeded cluster that drills, demos, ``remediator sim`` and benchmarks start from.

Where it sits: ``cluster.seed_cluster`` builds a ``ClusterState`` and has a ``Seeder`` write the
objects straight into its store, pods already bound where they belong (their kubelets start them and
assign their GPUs), then run the controllers once.

The layout: nodes ``gpu-node-0`` … ``gpu-node-(N-1)`` labelled ``nvidia.com/gpu.present=true`` and
``gpu-remediator.io/pool=pool-a`` (``pool-b``, … in contiguous blocks when ``pools > 1``), each with
``nvidia.com/gpu`` capacity and a Ready condition. Nodes come in blocks of ``2 * pytorchjob_ranks``: the
first half of a block runs one PyTorchJob ``pytorch-<k>`` (one rank per node: ``<job>-master-0`` is rank
0, ``<job>-worker-<i>`` is rank ``i + 1``; labels ``training.kubeflow.org/job-name``,
``training.kubeflow.org/replica-type`` (``master``/``worker``) and ``training.kubeflow.org/replica-index``;
env ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``; a memory-backed ``emptyDir`` at ``/dev/shm``), the other half
one single-pod Job ``train-<node index>`` each (label ``job-name``). Leftover nodes get Jobs. Training
pods live in namespace ``training`` and request ``gpus_per_pod`` GPUs (half a node by default, so evicted
pods find room elsewhere). Every node also runs ``gpu-operator/nvidia-dcgm-exporter`` and
``gpu-remediator/gpu-remediator-agent`` DaemonSet pods, and every training job has a PodDisruptionBudget
``<job>-pdb`` that allows one disruption. No Deployments or StatefulSets are seeded, so seeded layouts
stay as they are; ``ClusterState.add_deployment``/``add_statefulset`` add them.

``pods_per_node`` M replaces the training layout: every node runs M single-pod Jobs ``train-<node
index>-<k>`` (k = 0 … M-1), each pod holding ``gpus_per_node / M`` GPUs, so the node is full.

``allocation="dra"`` seeds the cluster as NVIDIA's DRA driver runs it (``chaos.sim.dra``): nodes carry no
``nvidia.com/gpu`` capacity; the driver's DeviceClass ``gpu.nvidia.com`` and one ResourceSlice per node are
published; every training job gets a ResourceClaimTemplate ``<job>-gpus`` (one ``exactly`` request of that
class for its pods' GPU count) which its pods name in ``spec.resourceClaims`` (``gpus``) and their
container in ``resources.claims``; the pods are placed by the scheduler on the node the layout names (their
claims made by the resourceclaim controller and allocated there).
"""

from __future__ import annotations

import copy
import uuid

from chaos.sim.apiserver import ApiServer
from chaos.sim.controllers import Controllers
from chaos.sim.dra import DEVICE_CLASS
from chaos.sim.resources import (
    BY_PLURAL,
    GPU_PRESENT_LABEL,
    GPU_RESOURCE,
    JOB_NAME_LABEL,
    KUBEFLOW_JOB_NAME_LABEL,
    KUBERNETES_VERSION,
    TRAINING_NAMESPACE,
    Obj,
)
from chaos.sim.store import Store
from remediator.contracts import POOL_LABEL


def _pool_name(k: int) -> str:
    return f"pool-{chr(ord('a') + k)}" if k < 26 else f"pool-{k}"


class Seeder:
    """Writes the seeded objects straight into the store, pods already bound where they belong."""

    def __init__(self, store: Store, controllers: Controllers, api: ApiServer, gpus_per_node: int,
                 gpus_per_pod: int, *, allocation: str = "device-plugin", pods_per_node: int | None = None) -> None:
        self.s = store
        self.c = controllers
        self.api = api
        self.gpus = gpus_per_node
        self.per_pod = gpus_per_pod
        self.dra = allocation == "dra"
        self.pods_per_node = pods_per_node
        if pods_per_node is not None:
            self.per_pod = gpus_per_node // pods_per_node

    def seed(self, nodes: int, pools: int, ranks: int) -> None:
        s = self.s
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease", "gpu-operator", "gpu-remediator",
                   TRAINING_NAMESPACE):
            self.api.create(BY_PLURAL["namespaces"], None, {"metadata": {"name": ns,
                                                                      "labels": {"kubernetes.io/metadata.name": ns}}})
        for i in range(nodes):
            pool = _pool_name(min(pools - 1, i * pools // max(nodes, 1)))
            s.commit(BY_PLURAL["nodes"], self.node(i, pool), "ADDED")
        if self.dra:
            self.c.scheduler.dra.install()
            for name in s.node_order:
                self.c.scheduler.dra.publish(name, self.gpus)
        self.daemonset("gpu-operator", "nvidia-dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1",
                              {"app": "nvidia-dcgm-exporter"},
                              [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}])
        self.daemonset("gpu-remediator", "gpu-remediator-agent", "ghcr.io/gpu-remediator/agent:0.1.0",
                               {"app.kubernetes.io/name": "gpu-remediator-agent"}, [{"operator": "Exists"}])
        names = list(s.node_order)
        block = 2 * ranks
        i = 0
        if self.pods_per_node is not None:
            for i, node in enumerate(names):
                for k in range(self.pods_per_node):
                    self.job(f"train-{i}-{k}", node)
            i = len(names)
        while i < len(names):
            if i % block == 0 and i + ranks <= len(names):
                self.pytorchjob(f"pytorch-{i // block}", names[i:i + ranks])
                i += ranks
            else:
                self.job(f"train-{i}", names[i])
                i += 1
        s.dirty.owners.clear()
        self.c.reconcile()

    def node(self, i: int, pool: str) -> Obj:
        name = f"gpu-node-{i}"
        ip = f"10.0.{(i >> 8) & 255}.{i & 255}"
        gpus = str(self.gpus)
        resources = {"cpu": "192", "memory": "2113546Mi", "pods": "110", "ephemeral-storage": "3750000000Ki",
                     "hugepages-1Gi": "0", "hugepages-2Mi": "0", GPU_RESOURCE: gpus}
        if self.dra:  # no device plugin: the GPUs are DRA devices in the node's ResourceSlice
            del resources[GPU_RESOURCE]
        now = self.s.ts()
        conds = [{"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": now,
                  "lastTransitionTime": now}
                 for t, r, m in (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                                 ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                                 ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID"))]
        conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                      "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                      "lastTransitionTime": now})
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                  "node.kubernetes.io/instance-type": "gpu-8x-h100", GPU_PRESENT_LABEL: "true",
                  "nvidia.com/gpu.count": gpus, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                  POOL_LABEL: pool}
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": self.s.new_meta(name, labels=labels,
                                         annotations={"node.alpha.kubernetes.io/ttl": "0",
                                                      "volumes.kubernetes.io/controller-managed-attach-detach":
                                                          "true"}),
            "spec": {"podCIDR": f"10.{128 + ((i >> 8) & 63)}.{i & 255}.0/24",
                     "providerID": f"sim://gpu-remediator/{name}"},
            "status": {
                "capacity": resources, "allocatable": dict(resources), "conditions": conds,
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"architecture": "amd64", "bootID": str(uuid.UUID(int=i + 1)),
                             "containerRuntimeVersion": "containerd://1.7.22",
                             "kernelVersion": "5.15.0-125-generic", "kubeProxyVersion": KUBERNETES_VERSION,
                             "kubeletVersion": KUBERNETES_VERSION, "machineID": f"{i + 1:032x}",
                             "operatingSystem": "linux", "osImage": "Ubuntu 22.04.5 LTS",
                             "systemUUID": str(uuid.UUID(int=(1 << 64) + i))},
            },
        }

    def daemonset(self, ns: str, name: str, image: str, labels: dict[str, str], tolerations: list[Obj]) -> Obj:
        s = self.s
        template = {"metadata": {"labels": dict(labels)},
                    "spec": {"nodeSelector": {GPU_PRESENT_LABEL: "true"}, "tolerations": tolerations,
                             "containers": [{"name": name.rsplit("-", 1)[0] if name.endswith("exporter") else name,
                                             "image": image, "resources": {}}]}}
        ds = {"apiVersion": "apps/v1", "kind": "DaemonSet",
              "metadata": s.new_meta(name, ns, labels=dict(labels), generation=1),
              "spec": {"selector": {"matchLabels": dict(labels)}, "template": template,
                       "updateStrategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                       "revisionHistoryLimit": 10},
              "status": {"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0,
                         "numberReady": 0}}
        return s.commit(BY_PLURAL["daemonsets"], ds, "ADDED")

    def container(self, name: str, emptydir: bool) -> tuple[Obj, list[Obj]]:
        gpus = str(self.per_pod)
        c: Obj = {"name": name, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                  "command": ["torchrun", "train.py"],
                  "resources": {"limits": {GPU_RESOURCE: gpus}, "requests": {GPU_RESOURCE: gpus}}}
        if self.dra:
            c["resources"] = {"claims": [{"name": "gpus"}]}
        volumes: list[Obj] = []
        if emptydir:
            c["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
            volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
        return c, volumes

    def claim_template(self, job: str) -> list[Obj]:
        """DRA: the job's ResourceClaimTemplate ``<job>-gpus`` and the pod's ``spec.resourceClaims``."""
        if not self.dra:
            return []
        self.s.commit(BY_PLURAL["resourceclaimtemplates"], {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": self.s.new_meta(f"{job}-gpus", TRAINING_NAMESPACE),
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": self.per_pod}}]}}}},
            "ADDED")
        return [{"name": "gpus", "resourceClaimTemplateName": f"{job}-gpus"}]

    def place(self, pod: Obj, node: str) -> None:
        """DRA: the pending pod goes where the layout wants it, through the scheduler (claims allocated)."""
        if not self.c.scheduler.bind_to(pod, node):
            raise ValueError(f"seeding: {pod['metadata']['name']} does not fit {node}")

    def job(self, name: str, node: str) -> None:
        s = self.s
        c, _ = self.container("trainer", emptydir=False)
        meta = s.new_meta(name, TRAINING_NAMESPACE, generation=1, labels={"app.kubernetes.io/part-of": "training"})
        pod_spec: Obj = {"containers": [c], "restartPolicy": "Never"}
        claims = self.claim_template(name)
        if claims:
            pod_spec["resourceClaims"] = claims
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
               "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 6, "completionMode": "NonIndexed",
                        "suspend": False, "manualSelector": False,
                        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": meta["uid"]}},
                        "template": {"metadata": {"labels": {"app.kubernetes.io/part-of": "training"}},
                                     "spec": pod_spec}},
               "status": {}}
        job = s.commit(BY_PLURAL["jobs"], job, "ADDED")
        if self.dra:
            self.place(self.c.create_job_pod(job), node)
        else:
            self.c.create_job_pod(job, node=node)
        self.pdb(f"{name}-pdb", {JOB_NAME_LABEL: name}, max_unavailable=1)

    def pytorchjob(self, name: str, nodes: list[str]) -> None:
        s = self.s
        c, volumes = self.container("pytorch", emptydir=True)
        template: Obj = {"metadata": {"labels": {"app.kubernetes.io/part-of": "training"}},
                         "spec": {"containers": [c], "volumes": volumes}}
        claims = self.claim_template(name)
        if claims:
            template["spec"]["resourceClaims"] = claims
        specs: Obj = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(template)}}
        if len(nodes) > 1:
            specs["Worker"] = {"replicas": len(nodes) - 1, "restartPolicy": "OnFailure",
                               "template": copy.deepcopy(template)}
        ptj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
               "metadata": s.new_meta(name, TRAINING_NAMESPACE, generation=1),
               "spec": {"runPolicy": {"cleanPodPolicy": "None", "suspend": False}, "pytorchReplicaSpecs": specs},
               "status": {}}
        ptj = s.commit(BY_PLURAL["pytorchjobs"], ptj, "ADDED")
        world = len(nodes)
        for (rtype, index, rank), node in zip(self.c.ranks(ptj), nodes, strict=True):
            if self.dra:
                self.place(self.c.create_pytorch_pod(ptj, rtype, index, rank, world), node)
            else:
                self.c.create_pytorch_pod(ptj, rtype, index, rank, world, node=node)
        self.pdb(f"{name}-pdb", {KUBEFLOW_JOB_NAME_LABEL: name}, min_available=max(0, world - 1))

    def pdb(self, name: str, match: dict[str, str], *, min_available: int | None = None,
            max_unavailable: int | None = None) -> None:
        s = self.s
        spec: Obj = {"selector": {"matchLabels": match}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        s.commit(BY_PLURAL["poddisruptionbudgets"],
                  {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                   "metadata": s.new_meta(name, TRAINING_NAMESPACE, generation=1), "spec": spec}, "ADDED")
