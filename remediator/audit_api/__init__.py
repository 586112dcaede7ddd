"""Audit review as a product: the read-only HTTP audit API (``/v1/audit/…``) and web view (``/audit/``).

Where it sits: beside ingest, at the reading end of the AUDIT stream. ``reader`` is the read model (the
stream cached and refreshed from its last sequence, the safety ledger and approvals from KV), ``story``
tells an incident's records as sentences, ``routes`` serves the JSON API and ``views`` the HTML pages; ``serve``
mounts both (``routes.mount``) and ``remediator audit serve`` runs them alone (``routes.create_audit_app``).
Nothing here writes to the bus.
"""
