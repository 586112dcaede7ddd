"""Playbooks: remediation procedures as reviewed YAML data, and the step library they name.

Where it sits: above the adapters, below the executor. ``schema`` says what a playbook file may say,
``catalog`` loads and validates the files, ``steps`` holds the idempotent steps (``REGISTRY``) the executor
runs, and ``ports`` declares, as protocols, the Kubernetes port, the node-agent client and the audit log
the steps talk to, so nothing here imports a concrete adapter or a handler.
"""
