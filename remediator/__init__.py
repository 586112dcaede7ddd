"""gpu-remediator: self-healing for GPU clusters on Kubernetes (see DESIGN.md for the flow)."""

__version__ = "0.1.0"
