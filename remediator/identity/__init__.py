"""Identity on the bus: NATS decentralized auth (operator → account → users, JWTs signed with nkeys).

Where it sits: under the CLI (``remediator bus creds``), the embedded server (``remediator.natsd``),
``bus.connect`` (which connects with a ``.creds`` file) and the service's agent-identity endpoint. Modules:
``keys`` (nkeys and secret files), ``jwt`` (the NATS JWT v2 format), ``roles`` (the permission table),
``creds`` (``.creds`` files), ``issuer`` (user JWTs for roles and agents), ``store`` (the embedded
operator in the data directory), ``tokenreview`` and ``http`` (agents' credentials from their
ServiceAccount token).
"""
